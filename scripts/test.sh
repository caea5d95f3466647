#!/usr/bin/env bash
# Runs every check CI runs: formatting, clippy (warnings are errors), the
# binaries the black-box tests drive, the whole workspace's tests, then the
# client libraries' tests (python/ with pytest, node/ with node --test)
# against the dws just built.
# The cluster store's tests start a private PostgreSQL server
# (tests/src/pg.rs); when its binaries are missing, this installs them
# (as root with apt-get) or stops with how to get them.
# Usage: scripts/test.sh [extra cargo test args]   (--help: this text)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    -h|--help)
        # This header, without its `#`s.
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
        exit 0
        ;;
esac

have_postgres() {
  [ -n "${PG_BINDIR:-}" ] && [ -x "$PG_BINDIR/initdb" ] && return 0
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && return 0
  command -v initdb >/dev/null && command -v postgres >/dev/null
}
if ! have_postgres; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing the PostgreSQL server (apt-get install postgresql) for the cluster store's tests" >&2
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
  else
    echo "scripts/test.sh: the tests need the PostgreSQL server binaries (initdb, postgres), and none were found" >&2
    echo "  (looked for /usr/lib/postgresql/*/bin/initdb, \$PG_BINDIR and PATH)." >&2
    echo "  Install them, e.g. 'sudo apt-get install -y postgresql', or set PG_BINDIR to the directory holding initdb." >&2
    exit 1
  fi
fi

cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo build --workspace --bins
cargo test --workspace "$@"

# The client libraries, each test against a private bus of the dws just built.
. scripts/target-dir.sh
export DWS_BIN="$(cargo_target_dir)/debug/dws"
if ! python3 -m pytest --version >/dev/null 2>&1; then
  echo "scripts/test.sh: installing pytest for the Python library's tests" >&2
  python3 -m pip install --quiet pytest || {
    echo "scripts/test.sh: could not install pytest; install it (python3 -m pip install pytest) and run again" >&2
    exit 1
  }
fi
python3 -m pytest -q python/tests
if command -v node >/dev/null; then
  node --test node/test
elif [ -n "${CI:-}" ]; then
  echo "scripts/test.sh: node is not on PATH, and CI must not skip the Node library's tests" >&2
  exit 1
else
  echo "scripts/test.sh: node is not on PATH: skipping the Node library's tests (node/test)" >&2
fi
