//! Where the binaries under test are: located next to the running test
//! executable, never built from inside a test (that would race with the
//! build running the test).

use std::path::PathBuf;

/// The directory holding `dws` and `busd`: the parent of the directory of the
/// running test executable (`target/debug/deps/blackbox-…` → `target/debug`).
/// `DWS_BIN` and `BUSD_BIN` override the two paths one by one.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe of the test binary");
    let deps = exe.parent().expect("test executable has a parent dir");
    match deps.file_name() {
        Some(n) if n == "deps" => deps.parent().expect("deps has a parent").to_path_buf(),
        _ => deps.to_path_buf(),
    }
}

fn locate(var: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{var}={} does not name a file", p.display());
        return p;
    }
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "binary `{name}` not found at {}.\nBuild the binaries first:\n\n    cargo build --workspace --bins\n\n\
         (or point {var} at it)",
        p.display()
    );
    p
}

/// Path of the `dws` binary (env `DWS_BIN` overrides).
pub fn dws_bin() -> PathBuf {
    locate("DWS_BIN", "dws")
}

/// Path of the `busd` binary (env `BUSD_BIN` overrides).
pub fn busd_bin() -> PathBuf {
    locate("BUSD_BIN", "busd")
}
