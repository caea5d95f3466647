#!/usr/bin/env bash
# Runs every check CI runs: formatting, clippy (warnings are errors), the
# binaries the black-box tests drive, then the whole workspace's tests.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo build --workspace --bins
cargo test --workspace "$@"
