#!/usr/bin/env bash
# Creates (once) the Python virtualenv that the DuckDB differential test runs in, at
# $REPO/.venv, and installs the pinned DuckDB into it when it cannot be imported there.
# Quiet when everything is already in place; the last line of stdout is the venv's python:
#   PY=$(scripts/python-env.sh | tail -1)
set -euo pipefail

DUCKDB_VERSION=2.0.1

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
PY="$VENV/bin/python"

if ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    # Missing, or left behind by a Python that is gone: make it anew.
    python3 -m venv --clear "$VENV" >&2
fi

if ! "$PY" -c 'import duckdb' >/dev/null 2>&1; then
    echo "python-env: installing duckdb==$DUCKDB_VERSION into $VENV" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check "duckdb==$DUCKDB_VERSION" >&2
    "$PY" -c 'import duckdb' >&2
fi

echo "$PY"
