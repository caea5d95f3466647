#!/usr/bin/env bash
# The walking demo: a consumer spawns the bus on demand, two events are
# published, the consumer prints them as NDJSON and exits (reason: limit).
# Runs in a private temp config/runtime dir and stops its bus at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/target-dir.sh
bin="$(cargo_target_dir)/debug"
if [ ! -x "$bin/dws" ] || [ ! -x "$bin/busd" ]; then
  echo "demo.sh: building dws and busd (debug); the first build takes a few minutes" >&2
fi
cargo build --workspace --bins
demo=$(mktemp -d /tmp/dws-demo.XXXXXX)
export DWS_CONFIG_DIR="$demo/cfg" XDG_RUNTIME_DIR="$demo/run"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
trap '"$bin/dws" event stop >/dev/null 2>&1 || true; rm -rf "$demo"' EXIT

echo "\$ dws event consume 'demo.*' --max-events 2 &"
"$bin/dws" event consume 'demo.*' --max-events 2 >"$demo/out" 2>"$demo/err" &
consumer=$!
# Wait for the bus the consumer spawned to accept the subscription.
for _ in $(seq 100); do
  "$bin/dws" event status --format json 2>/dev/null | grep -q '"attached_pid": [0-9]' && break
  sleep 0.05
done
echo "\$ dws event publish demo.hello '{\"n\":1}'"
"$bin/dws" event publish demo.hello '{"n":1}'
echo "\$ dws event publish demo.hello '{\"n\":2}' --id ev-2"
"$bin/dws" event publish demo.hello '{"n":2}' --id ev-2
code=0
wait "$consumer" || code=$?
echo "--- consumer stdout"
cat "$demo/out"
echo "--- consumer stderr"
cat "$demo/err"
echo "--- consumer exit code: $code"
exit "$code"
