#!/usr/bin/env bash
# Benchmarks tessera against DuckDB (see scripts/bench.py); extra arguments go to bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
PY=$(scripts/python-env.sh | tail -1)
exec "$PY" scripts/bench.py --tessera target/release/tessera "$@"
