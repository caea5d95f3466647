#!/usr/bin/env bash
# Fan-out benchmark: one publisher against N real `dws event consume`
# processes (N = 1, 4, 16) with 256 B and 4 KiB events, a fixed-rate latency
# run, and busd's peak RSS with one stalled consumer. Builds in release mode,
# then runs target/release/dws-bench against target/release/{dws,busd}; each
# scenario runs in its own temp dir with its own bus, stopped at the end.
# With --peers it also runs Redis pub/sub in the same run and prints ours vs
# Redis; that needs python3 and redis-server on PATH (apt-get install
# redis-server python3), the peer scripts redis_fanout.py and
# redis_latency.py in --peers-dir DIR (default bench/peers, from the repo
# root) and their compiled client redis_client in $PEERS_BIN (default
# DIR/bin); docs/benchmark.md ("Comparing with Redis") says more:
#   scripts/bench.sh --peers --peers-dir DIR --store memory
# Usage: scripts/bench.sh [dws-bench options]   (scripts/bench.sh --help)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins --quiet
exec target/release/dws-bench --bin-dir "$PWD/target/release" "$@"
