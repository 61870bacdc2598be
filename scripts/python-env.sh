#!/usr/bin/env bash
# Creates (once) a Python virtualenv for the differential tests and installs a pinned package
# into it when its module cannot be imported there. Quiet when everything is in place; the last
# line of stdout is the venv's python:
#   PY=$(scripts/python-env.sh | tail -1)                                        # DuckDB, .venv
#   PY=$(scripts/python-env.sh .venv-flink apache-flink==1.20.1 pyflink | tail -1) # PyFlink
set -euo pipefail

VENV_NAME="${1:-.venv}"
PACKAGE="${2:-duckdb==2.0.1}"
MODULE="${3:-duckdb}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/$VENV_NAME"
PY="$VENV/bin/python"

if ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    # Missing, or left behind by a Python that is gone: make it anew.
    python3 -m venv --clear "$VENV" >&2
fi

if ! "$PY" -c "import $MODULE" >/dev/null 2>&1; then
    echo "python-env: installing $PACKAGE into $VENV" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check "$PACKAGE" >&2
    "$PY" -c "import $MODULE" >&2
fi

echo "$PY"
