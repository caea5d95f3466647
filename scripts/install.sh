#!/usr/bin/env bash
# Installs dws and busd side by side (dws finds busd next to itself), plus
# their man pages and shell completions under the same root.
#
# Usage: scripts/install.sh [--root DIR] [--debug] [--no-docs]
#                           [--systemd [--profile NAME] [--unit-dir DIR] [--no-enable]]
#
#   --root DIR   install into DIR/bin (default: cargo's, i.e. $CARGO_INSTALL_ROOT
#                or ~/.cargo; make sure DIR/bin is on PATH)
#   --debug      build without optimisations (faster to build, slower to run)
#   --no-docs    binaries only
#   --systemd    then install the bus as a socket-activated systemd user
#                service for --profile NAME (default: default), through
#                scripts/install-systemd.sh (see it for what it writes);
#                --profile, --unit-dir and --no-enable (write the units,
#                run no systemctl) are passed on to it
#
# Both binaries come from one `cargo build --locked [--release] -p busd
# -p dws-client` in the workspace's target directory and are copied into
# DIR/bin (so `cargo install --list` does not list them; to remove them,
# delete DIR/bin/dws, DIR/bin/busd and the docs below).
#
# Docs go to DIR/share: man/man1/{dws,dws-event-*,busd}.1,
# bash-completion/completions/dws, zsh/site-functions/_dws and
# fish/vendor_completions.d/dws.fish. The script prints how to enable them.
# Needs a Rust toolchain. $CARGO names the cargo to run (default: cargo).
set -euo pipefail
cd "$(dirname "$0")/.."

root=""
debug=""
docs=1
systemd=0
systemd_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --root) root="${2:?--root needs a directory}"; shift 2 ;;
        --root=*) root="${1#--root=}"; shift ;;
        --debug) debug=1; shift ;;
        --no-docs) docs=0; shift ;;
        --systemd) systemd=1; shift ;;
        --profile) systemd_args+=(--profile "${2:?--profile needs a name}"); shift 2 ;;
        --unit-dir) systemd_args+=(--unit-dir "${2:?--unit-dir needs a directory}"); shift 2 ;;
        --no-enable) systemd_args+=(--no-enable); shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

cargo="${CARGO:-cargo}"
if [ -n "$root" ]; then
    mkdir -p "$root"
    root="$(cd "$root" && pwd)"
else
    root="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}"
fi

# One build of both packages: their shared dependencies are compiled once,
# with one set of features (two `cargo install`s compiled them twice).
# The profiles are cargo install's: release, or dev with --debug.
if [ -z "$debug" ]; then
    profile_args=(--release)
    out_dir=release
    echo "install.sh: building busd and dws optimised; the first build takes about 4 minutes on 2 cores (--debug: about 3)" >&2
else
    profile_args=()
    out_dir=debug
    echo "install.sh: building busd and dws without optimisations; the first build takes about 3 minutes on 2 cores" >&2
fi
echo "install.sh: $cargo build --locked ${profile_args[*]:+${profile_args[*]} }-p busd -p dws-client" >&2
"$cargo" build --locked "${profile_args[@]}" -p busd -p dws-client
target_dir="$("$cargo" metadata --locked --no-deps --format-version 1 |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
[ -n "$target_dir" ] || { echo "install.sh: cargo metadata named no target directory" >&2; exit 1; }

bin="$root/bin"
mkdir -p "$bin"
for b in busd dws; do
    built="$target_dir/$out_dir/$b"
    [ -x "$built" ] || { echo "install.sh: $built is missing after cargo build" >&2; exit 1; }
    # A copy beside it, then a rename: a running busd keeps its old file.
    install -m 0755 "$built" "$bin/.$b.install.tmp"
    mv -f "$bin/.$b.install.tmp" "$bin/$b"
done
version="$("$bin/dws" --version)"
if [ "$("$bin/busd" --version | sed 's/^busd //')" != "${version#dws }" ]; then
    echo "install.sh: dws and busd versions differ: $version / $("$bin/busd" --version)" >&2
    exit 1
fi

if [ "$docs" = 1 ]; then
    share="$root/share"
    man1="$share/man/man1"
    "$bin/dws" manpages "$man1" >/dev/null
    "$bin/busd" --generate-man "$man1" >/dev/null
    mkdir -p "$share/bash-completion/completions" "$share/zsh/site-functions" \
        "$share/fish/vendor_completions.d"
    "$bin/dws" completions bash >"$share/bash-completion/completions/dws"
    "$bin/dws" completions zsh >"$share/zsh/site-functions/_dws"
    "$bin/dws" completions fish >"$share/fish/vendor_completions.d/dws.fish"
fi

echo "installed $version into $bin"
case ":$PATH:" in
    *":$bin:"*) ;;
    *) echo "  add it to PATH:  export PATH=\"$bin:\$PATH\"" ;;
esac
if [ "$docs" = 1 ]; then
    cat <<EOF
  man pages:    MANPATH="$share/man:\$(manpath 2>/dev/null)" man dws-event-consume
  bash:         source "$share/bash-completion/completions/dws"   (e.g. in ~/.bashrc)
  zsh:          fpath=("$share/zsh/site-functions" \$fpath); autoload -U compinit; compinit
  fish:         source "$share/fish/vendor_completions.d/dws.fish"
EOF
fi
if [ "$systemd" = 1 ]; then
    scripts/install-systemd.sh --bin "$bin" "${systemd_args[@]}"
fi
