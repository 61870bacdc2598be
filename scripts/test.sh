#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests (property, sqllogictest,
# CLI and fuzz-smoke suites), then the differential tests against DuckDB of windowed aggregates,
# of continuous temporal queries (as batch self-joins) and of tables, statements and views
# (DuckDB installed from PyPI into .venv by scripts/python-env.sh) and of the Flink SQL emitter against a local Flink
# (PyFlink from PyPI, into .venv-flink by scripts/python-env.sh; it runs on the machine's Java 17),
# and of the Spark SQL of samples and estimates against tessera's answers on a local PySpark
# (from PyPI, into .venv-spark, on the same Java).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tessera-target}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
cargo build --quiet
PY=$(scripts/python-env.sh | tail -1)
"$PY" scripts/duckdb_diff.py --tessera "$CARGO_TARGET_DIR/debug/tessera"
"$PY" scripts/duckdb_tables_diff.py --tessera "$CARGO_TARGET_DIR/debug/tessera"
"$PY" scripts/duckdb_temporal_diff.py --tessera "$CARGO_TARGET_DIR/debug/tessera"
FLINK_PY=$(scripts/python-env.sh .venv-flink apache-flink==1.20.1 pyflink | tail -1)
"$FLINK_PY" scripts/flink_diff.py --tessera "$CARGO_TARGET_DIR/debug/tessera"
SPARK_PY=$(scripts/python-env.sh .venv-spark pyspark==4.0.1 pyspark | tail -1)
"$SPARK_PY" scripts/spark_diff.py --tessera "$CARGO_TARGET_DIR/debug/tessera"
