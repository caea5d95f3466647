# Sourced by the scripts: `cargo_target_dir` prints where cargo builds —
# CARGO_TARGET_DIR, a config's build.target-dir, or ./target — as
# `cargo metadata` says, so no script assumes ./target.
cargo_target_dir() {
    local dir
    dir="$(cargo metadata --no-deps --format-version 1 |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
    [ -n "$dir" ] || { echo "cargo metadata named no target directory" >&2; return 1; }
    printf '%s\n' "$dir"
}
