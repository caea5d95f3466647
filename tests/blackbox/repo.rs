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

/// busd's top-level module of `file` (`hub` for `busd/src/hub/mod.rs`,
/// `lib` for `busd/src/lib.rs`).
fn busd_module(file: &Path) -> String {
    let rel = file
        .strip_prefix(workspace().join("busd/src"))
        .expect("a busd source file");
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// The busd modules `text` (a file, its test code left out) names with
/// `crate::X`.
fn crate_refs(text: &str) -> std::collections::BTreeSet<String> {
    let product = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut refs = std::collections::BTreeSet::new();
    for line in product.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(inner) = rest.strip_prefix('{') {
                // `use crate::{a::X, b, c::{..}}`: the first name of each part
                // at the top level of the braces.
                let mut depth = 0;
                let mut part = String::new();
                for ch in inner.chars() {
                    match ch {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            refs.insert(part.trim().split("::").next().unwrap_or("").to_owned());
                            part.clear();
                            continue;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        part.push(ch);
                    }
                }
                refs.insert(part.trim().split("::").next().unwrap_or("").to_owned());
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                refs.insert(name);
            }
        }
    }
    refs.retain(|r| !r.is_empty());
    refs
}

/// ARCHITECTURE.md's boundary: busd's top-level modules import each other
/// without a circle (multi-line `use crate::{…}` blocks are joined first).
#[test]
fn busd_modules_import_each_other_without_a_circle() {
    use std::collections::{BTreeMap, BTreeSet};
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files(&["busd/src"]) {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("tests") || name == "model.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let from = busd_module(&f);
        if from == "lib" || from == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        // Join `use crate::{` blocks onto one line.
        let joined = text.replace("::{\n", "::{").replace(",\n", ",");
        for to in crate_refs(&joined) {
            if to != from && to != "lib" {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    // Depth-first search for a back edge; report the circle it closes.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut c = path[at..].to_vec();
            c.push(n.to_owned());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(circle) = visit(n, &edges, &mut vec![], &mut done) {
            panic!(
                "busd's modules import each other in a circle: {}\n(edges: {edges:?})",
                circle.join(" -> ")
            );
        }
    }
}
