//! Habits that keep the repository readable, checked on every run: every
//! Rust source file says what it owns in a `//!` header, and no product
//! source file grows past the size one person holds in their head unless
//! ARCHITECTURE.md says why.

use std::path::{Path, PathBuf};

/// Product files (busd, dws, proto) longer than this need a reason in
/// ARCHITECTURE.md ("Large files").
const MAX_LINES: usize = 650;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn files(dirs: &[&str]) -> Vec<PathBuf> {
    let root = workspace();
    let mut out = vec![];
    for d in dirs {
        rust_files(&root.join(d), &mut out);
    }
    out.sort();
    assert!(!out.is_empty(), "no Rust files found under {root:?}");
    out
}

#[test]
fn every_source_file_starts_with_a_module_doc() {
    let mut missing = vec![];
    for f in files(&[
        "busd/src",
        "dws-client/src",
        "proto/src",
        "tests/src",
        "tests/blackbox",
    ]) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        if !first.starts_with("//!") {
            missing.push(f.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "these files lack a `//!` line saying what they own:\n{}",
        missing.join("\n")
    );
}

#[test]
fn no_product_file_is_too_large_without_a_reason() {
    let arch = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap_or_default();
    let root = workspace();
    let mut over = vec![];
    for f in files(&["busd/src", "dws-client/src", "proto/src"]) {
        let lines = std::fs::read_to_string(&f)
            .unwrap_or_default()
            .lines()
            .count();
        let rel = f.strip_prefix(&root).unwrap_or(&f).display().to_string();
        if lines > MAX_LINES && !arch.contains(&format!("`{rel}`")) {
            over.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(
        over.is_empty(),
        "split these files, or say in ARCHITECTURE.md (naming them in backticks) why not:\n{}",
        over.join("\n")
    );
}
