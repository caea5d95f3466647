#!/usr/bin/env bash
# Runs every test: builds the binaries the black-box tests drive, then the
# whole workspace's tests. Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
cargo test --workspace "$@"
