#!/usr/bin/env bash
# Installs the bus of one profile as a socket-activated systemd user service:
# renders contrib/systemd/dws-bus@.{socket,service} into
# UNIT_DIR/dws-bus@PROFILE.{socket,service} with the real paths, reloads
# the user's systemd instance, stops a bus `dws` started on demand, and
# enables and starts the socket (the service starts on the first client).
#
# Usage: scripts/install-systemd.sh [--bin DIR] [--profile NAME] [--unit-dir DIR] [--no-enable]
#
#   --bin DIR        where busd and dws are installed (default: the directory
#                    of `busd` on PATH)
#   --profile NAME   the profile to serve (default: $DWS_PROFILE, else default)
#   --unit-dir DIR   default: ${XDG_CONFIG_HOME:-~/.config}/systemd/user
#   --no-enable      only write the units (no systemctl)
#
# The config root is $DWS_CONFIG_DIR, else ~/.dws, as for dws itself; the
# socket path is the one dws looks for (`busd --print-socket-path`), computed
# with the user manager's XDG_RUNTIME_DIR (/run/user/UID unless set).
# Documentation= names the man pages installed beside the binaries
# (BIN/../share/man/man1/{busd,dws}.1, as install.sh writes them) by their
# absolute paths, so `systemctl --user help` and `systemd-analyze verify`
# find them whatever MANPATH says; without them the line is left out.
# Placeholders are replaced only on lines that are not comments.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"

bin=""
profile="${DWS_PROFILE:-default}"
unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
enable=1
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin="${2:?--bin needs a directory}"; shift 2 ;;
        --profile) profile="${2:?--profile needs a name}"; shift 2 ;;
        --unit-dir) unit_dir="${2:?--unit-dir needs a directory}"; shift 2 ;;
        --no-enable) enable=0; shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "install-systemd.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$bin" ]; then
    busd_on_path="$(command -v busd || true)"
    [ -n "$busd_on_path" ] || { echo "install-systemd.sh: busd is not on PATH: pass --bin DIR" >&2; exit 1; }
    bin="$(dirname "$busd_on_path")"
fi
bin="$(cd "$bin" && pwd)"
busd="$bin/busd"
[ -x "$busd" ] || { echo "install-systemd.sh: $busd is missing" >&2; exit 1; }

root="${DWS_CONFIG_DIR:-$HOME/.dws}"
mkdir -p "$root"
root="$(cd "$root" && pwd)"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}"
socket="$(DWS_CONFIG_DIR="$root" "$busd" --print-socket-path --profile "$profile")"

man1="$(dirname "$bin")/share/man/man1"
docs=""
if [ -f "$man1/busd.1" ] && [ -f "$man1/dws.1" ]; then
    docs="man:$man1/busd.1 man:$man1/dws.1"
else
    echo "install-systemd.sh: no man pages in $man1: the units get no Documentation= line" >&2
fi

for p in "$busd" "$root" "$socket" $docs; do
    case "$p" in
        *[[:space:]\\%]*) echo "install-systemd.sh: $p: a path with spaces, backslashes or % cannot go into a unit" >&2; exit 1 ;;
    esac
done

# sed's replacement text: escape \, & and the | delimiter.
esc() { printf '%s' "$1" | sed -e 's/[\\&|]/\\&/g'; }
mkdir -p "$unit_dir"
for kind in socket service; do
    out="$unit_dir/dws-bus@$profile.$kind"
    # Comments ([#;] first) are copied as they are; an empty
    # @DOCUMENTATION@ drops its line.
    sed -e '/^[#;]/b' \
        -e '/^Documentation=@DOCUMENTATION@$/{' -e "s|@DOCUMENTATION@|$(esc "$docs")|" -e '/^Documentation=$/d' -e '}' \
        -e "s|@BUSD@|$(esc "$busd")|g" \
        -e "s|@CONFIG_ROOT@|$(esc "$root")|g" \
        -e "s|@SOCKET@|$(esc "$socket")|g" \
        "$here/contrib/systemd/dws-bus@.$kind" >"$out.tmp"
    mv "$out.tmp" "$out"
    echo "install-systemd.sh: wrote $out" >&2
done

if [ "$enable" = 1 ]; then
    systemctl --user daemon-reload
    # Only one bus serves a profile: stop one `dws` started on demand first.
    if [ -x "$bin/dws" ]; then
        DWS_CONFIG_DIR="$root" "$bin/dws" event stop --profile "$profile" >&2 || true
    fi
    systemctl --user enable --now "dws-bus@$profile.socket"
    echo "install-systemd.sh: dws-bus@$profile.socket listens on $socket; the bus starts on the first dws command" >&2
    echo "  status: systemctl --user status dws-bus@$profile.socket dws-bus@$profile.service" >&2
fi
