#!/usr/bin/env bash
# Creates (once) the Python virtualenv that the Flink differential test runs in, at
# $REPO/.venv-flink, and installs the pinned PyFlink (a local Flink, run on the machine's Java
# 17) into it when it cannot be imported there. The last line of stdout is the venv's python:
#   PY=$(scripts/flink-env.sh | tail -1)
set -euo pipefail

PYFLINK_VERSION=1.20.1

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv-flink"
PY="$VENV/bin/python"

if ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    python3 -m venv --clear "$VENV" >&2
fi

if ! "$PY" -c 'import pyflink' >/dev/null 2>&1; then
    echo "flink-env: installing apache-flink==$PYFLINK_VERSION into $VENV" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check "apache-flink==$PYFLINK_VERSION" >&2
    "$PY" -c 'import pyflink' >&2
fi

echo "$PY"
