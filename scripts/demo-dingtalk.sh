#!/usr/bin/env bash
# The DingTalk demo, all on loopback: a fake DingTalk Stream gateway
# (target/debug/fake-dingtalk), a bus configured for the `dingtalk` source
# pointing at it, and two consumers sharing the bus's ONE upstream
# connection. Events are pushed through the fake's control endpoint; in the
# middle the server sends `disconnect` and then drops the TCP connection,
# and both consumers still receive every event exactly once.
#
# Runs in a private temp config/runtime dir; stops everything it started
# (consumers, bus, fake) and removes the dir on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/target-dir.sh
cargo build --workspace --bins --quiet
bin="$(cargo_target_dir)/debug"
demo=$(mktemp -d /tmp/dws-dingtalk-demo.XXXXXX)
export DWS_CONFIG_DIR="$demo/cfg" XDG_RUNTIME_DIR="$demo/run"
# Short reconnect backoff for the demo (default 1 s doubling to 60 s).
export DWS_DINGTALK_BACKOFF_MIN_MS=200 DWS_DINGTALK_BACKOFF_MAX_MS=2000
mkdir -p "$DWS_CONFIG_DIR" "$XDG_RUNTIME_DIR"
chmod 700 "$XDG_RUNTIME_DIR"

fake_pid="" consumers=()
cleanup() {
  set +e
  exec 3>&- 2>/dev/null                       # consumers see stdin EOF
  for p in "${consumers[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${consumers[@]}"; do wait "$p" 2>/dev/null; done
  "$bin/dws" event stop >/dev/null 2>&1
  [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null && wait "$fake_pid" 2>/dev/null
  rm -rf "$demo"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. The fake gateway. Its secret comes from the environment, never argv.
secret="demo-secret-$RANDOM$RANDOM"
FAKE_DINGTALK_CLIENT_SECRET="$secret" "$bin/fake-dingtalk" --client-id demo-app \
  --disconnect-close-after-ms 2000 >"$demo/fake.out" 2>"$demo/fake.log" &
fake_pid=$!
for _ in $(seq 100); do [ -s "$demo/fake.out" ] && break; sleep 0.05; done
base=$(head -1 "$demo/fake.out")
echo "fake DingTalk gateway at $base"

# POST <path> <json> to the fake's control endpoint (bash /dev/tcp, no curl).
post() {
  local hostport=${base#http://}
  exec 5<>"/dev/tcp/${hostport%:*}/${hostport##*:}"
  printf 'POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
    "$1" "$hostport" "${#2}" "$2" >&5
  cat <&5 >/dev/null
  exec 5<&-
}

# 2. The profile: source = dingtalk, secret in a 0600 config file.
(umask 077 && cat >"$DWS_CONFIG_DIR/config.toml" <<EOF
[profiles.default]
source = "dingtalk"
client_id = "demo-app"
client_secret = "$secret"
open_api = "$base"
keepalive = "5s"
EOF
)
echo "--- $DWS_CONFIG_DIR/config.toml (secret elided)"
sed 's/^client_secret = .*/client_secret = "…"/' "$DWS_CONFIG_DIR/config.toml"

# 3. Two resident consumers; their stdin is a FIFO we hold open (fd 3), so
#    closing fd 3 later ends them cleanly (stdin EOF, reason: signal).
mkfifo "$demo/hold"
exec 3<>"$demo/hold"
for name in a b; do
  echo "\$ dws event consume '*' > $name.out &"
  "$bin/dws" event consume '*' <"$demo/hold" 3>&- >"$demo/$name.out" 2>"$demo/$name.err" &
  consumers+=($!)
done
for name in a b; do
  for _ in $(seq 200); do grep -q '^\[event\] ready' "$demo/$name.err" 2>/dev/null && break; sleep 0.05; done
done
"$bin/dws" event status | sed -n '1,12p'

# 4. Events, a server disconnect, a dropped TCP connection, more events.
push() { post /_fake/push "{\"eventType\":\"user_add_org\",\"eventId\":\"demo-$1\",\"data\":{\"n\":$1}}"; }
echo "--- pushing 3 events"
for i in 1 2 3; do push "$i"; done
echo "--- the server sends disconnect, then 2 more events"
post /_fake/disconnect '{"reason":"connection is expired"}'
for i in 4 5; do push "$i"; done
sleep 1
echo "--- the server drops the TCP connection, then 2 more events"
post /_fake/drop '{}'
for i in 6 7; do push "$i"; done

want=7
for name in a b; do
  for _ in $(seq 300); do [ "$(wc -l <"$demo/$name.out")" -ge "$want" ] && break; sleep 0.05; done
done

# 5. Both consumers end (stdin EOF); show what they printed.
exec 3>&-
for p in "${consumers[@]}"; do wait "$p" || true; done
consumers=()
for name in a b; do
  echo "--- consumer $name stdout (event_id, event_type, data)"
  sed -E 's/.*"event_id":"([^"]*)".*"event_type":"([^"]*)".*"data":"(([^"\\]|\\.)*)".*/\1 \2 \3/; s/\\"/"/g' "$demo/$name.out"
  echo "--- consumer $name stderr"
  cat "$demo/$name.err"
done
echo "--- the fake gateway's log"
cat "$demo/fake.log"

status=0
for name in a b; do
  n=$(sort -u "$demo/$name.out" | grep -c '"event_id":"demo-' || true)
  d=$(grep -o '"event_id":"demo-[0-9]*"' "$demo/$name.out" | sort | uniq -d | wc -l)
  echo "consumer $name: $n distinct event(s) of $want, $d duplicate(s)"
  [ "$n" -eq "$want" ] && [ "$d" -eq 0 ] || status=1
done
if grep -rq "$secret" "$demo/a.out" "$demo/a.err" "$demo/b.out" "$demo/b.err" "$DWS_CONFIG_DIR/events" 2>/dev/null; then
  echo "the client secret leaked into output or bus files"; status=1
fi
exit "$status"
