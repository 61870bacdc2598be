#!/usr/bin/env bash
# Benchmarks tessera against DuckDB (see scripts/bench.py); extra arguments go to bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
PY=$(scripts/python-env.sh | tail -1)
scripts/python-env.sh .venv pyarrow==22.0.0 pyarrow >/dev/null  # writes the pyarrow input
exec "$PY" scripts/bench.py --tessera target/release/tessera "$@"
