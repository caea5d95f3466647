#!/usr/bin/env bash
# Fan-out benchmark: one publisher against N real `dws event consume`
# processes (N = 1, 4, 16) with 256 B and 4 KiB events, a fixed-rate latency
# run, and busd's peak RSS with one stalled consumer. Builds in release mode,
# then runs target/release/dws-bench against target/release/{dws,busd}; each
# scenario runs in its own temp dir with its own bus, stopped at the end.
# With --peers it also runs the peers in the same run (Redis pub/sub, NATS
# core, Redis Streams with appendfsync always, JetStream on its file store,
# and a raw fdatasync) through the repository's own peer benchmark dws-peers
# (tests/src/bin/dws-peers, built next to dws-bench), and prints the
# comparison table with every goal's ratio, met or missed; that needs redis-server and
# nats-server on PATH (docs/benchmark.md, "Comparing with the peers"):
#   apt-get install redis-server nats-server
#   scripts/bench.sh --peers --runs 3
# One section alone:
#   --only-durable, --only-store-compare, --only-latency, --only-lines,
#   --only-where (with --where EXPR), and --only-queue: the work-queue row
#   (a --delivery shared subscription, 4 workers acking every job; with
#   --peers also Redis Streams and JetStream as work queues; --skip-queue
#   leaves it out of a --peers run).
# Usage: scripts/bench.sh [dws-bench options]   (scripts/bench.sh --help:
# this text, then every flag of dws-bench once it is built)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/target-dir.sh
release="$(cargo_target_dir)/release"
case "${1:-}" in
    -h|--help)
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
        if [ -x "$release/dws-bench" ]; then
            echo
            exec "$release/dws-bench" --help
        fi
        echo
        echo "(dws-bench is not built yet: scripts/bench.sh builds it first; its flags: dws-bench --help in cargo's release dir)"
        exit 0
        ;;
esac
cargo build --release --workspace --bins --features dws-tests/peers --quiet
exec "$release/dws-bench" --bin-dir "$release" "$@"
