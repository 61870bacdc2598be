#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests (with the property,
# sqllogictest and fuzz-smoke suites), and the DuckDB differential test.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tessera-target}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
