//! The structure the types and the imports should show, checked on every
//! run: no crate's top-level modules (busd, dws, proto, the harness) nor
//! the Python package's modules import each other in a circle, and no
//! busd room keeps process-wide mutable state (a `static` or
//! `thread_local!` is allowed only with a `// process-wide:` reason right
//! above it, for a constant set once or a per-thread scratch buffer),
//! and no busd file outside `hub/` names the `Hub`: each caller holds the
//! handle of its role; and only `busd/src/pg/` names the PostgreSQL driver
//! (`tokio_postgres`): the rest of busd reaches PostgreSQL through it.
//! Each checker is a function, itself tested on text that breaks its rule.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use super::repo::{crate_refs, files, workspace};

/// The first circle in `edges`, if any (also `repo`'s busd check).
pub(crate) fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut vec![], &mut done))
}

/// The top-level module of `file` in the crate whose sources are `src`.
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap_or(file);
    rel.components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default()
        .trim_end_matches(".rs")
        .to_owned()
}

/// The import edges between the top-level modules of the crate at `src`
/// (`crate::X` names; test files and `#[cfg(test)]` code left out).
fn rust_edges(src: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = workspace().join(src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files(&[src]) {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("tests") || name == "model.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let from = top_module(&root, &f);
        if from == "lib" || from == "main" || from == "bin" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let joined = text.replace("::{\n", "::{").replace(",\n", ",");
        for to in crate_refs(&joined) {
            if to != from && to != "lib" {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

#[test]
fn no_crates_modules_import_each_other_in_a_circle() {
    for src in ["busd/src", "dws-client/src", "proto/src", "tests/src"] {
        let edges = rust_edges(src);
        if let Some(c) = circle(&edges) {
            panic!(
                "{src}: modules import each other in a circle: {}",
                c.join(" -> ")
            );
        }
    }
}

/// The modules of the Python package in `dir` that each one imports
/// (`from .x import`, `from . import x`, `import dws_bus.x`).
fn python_edges(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return edges;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "py") {
            continue;
        }
        let from = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        edges.entry(from.clone()).or_default();
        for to in python_imports(&text) {
            if to != from && to != "__init__" {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    // The package's `__init__` imports everything; nothing imports it.
    edges.remove("__init__");
    edges
}

/// The sibling modules `text` imports.
fn python_imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("from .") {
            let module: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if module.is_empty() {
                // `from . import a, b`
                if let Some(names) = rest.trim_start().strip_prefix("import ") {
                    out.extend(
                        names
                            .split(',')
                            .map(|n| n.split_whitespace().next().unwrap_or("").to_owned()),
                    );
                }
            } else {
                out.insert(module);
            }
        } else if let Some(rest) = l.strip_prefix("import dws_bus.") {
            out.insert(rest.split(['.', ' ', ',']).next().unwrap_or("").to_owned());
        }
    }
    out.retain(|m| !m.is_empty() && m != "(");
    out
}

#[test]
fn the_python_packages_modules_import_each_other_without_a_circle() {
    let edges = python_edges(&workspace().join("python/dws_bus"));
    assert!(
        edges.len() > 3,
        "the package's modules were found: {edges:?}"
    );
    if let Some(c) = circle(&edges) {
        panic!("python/dws_bus imports in a circle: {}", c.join(" -> "));
    }
}

/// Every `static` or `thread_local!` of `text` (its test code left out)
/// without a `// process-wide: <why>` line right above it: its line.
fn unexplained_statics(text: &str) -> Vec<String> {
    let product = text.split("#[cfg(test)]").next().unwrap_or_default();
    let lines: Vec<&str> = product.lines().collect();
    let mut out = vec![];
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or_default().trim_start();
        let declares = code.starts_with("static ")
            || code.starts_with("pub static ")
            || code.starts_with("pub(crate) static ")
            || code.starts_with("thread_local!");
        if !declares {
            continue;
        }
        // The comment block right above names the reason; a `static`
        // inside `thread_local!` is explained above the macro.
        let above = lines[..i].iter().rev().map(|l| l.trim_start());
        let mut explained = false;
        for l in above {
            if l.starts_with("// process-wide:") || l.starts_with("thread_local!") {
                explained = true;
                break;
            }
            if !l.starts_with("//") {
                break;
            }
        }
        if !explained {
            out.push(line.trim().to_owned());
        }
    }
    out
}

#[test]
fn no_busd_room_keeps_process_wide_mutable_state() {
    let mut found = vec![];
    for f in files(&["busd/src"]) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for s in unexplained_statics(&text) {
            found.push(format!("{}: {s}", f.display()));
        }
    }
    assert!(
        found.is_empty(),
        "state a room should own (or a `// process-wide:` reason above it):\n{}",
        found.join("\n")
    );
}

/// The lines of `text` that name the `Hub` type itself (not `HubConfig`,
/// `HubOwner` or the `hub` module), comments included.
fn names_the_hub(text: &str) -> Vec<String> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    text.lines()
        .filter(|line| {
            line.match_indices("Hub").any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + 3..].chars().next();
                !before.is_some_and(is_word) && !after.is_some_and(is_word)
            })
        })
        .map(|l| l.trim().to_owned())
        .collect()
}

/// `file: line` for each line `check` finds in a busd file outside the
/// folder `inside` (under busd/src).
fn busd_lines_outside(inside: &str, check: fn(&str) -> Vec<String>) -> Vec<String> {
    let inside = workspace().join("busd/src").join(inside);
    let mut found = vec![];
    for f in files(&["busd/src"]) {
        if f.starts_with(&inside) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for l in check(&text) {
            found.push(format!("{}: {l}", f.display()));
        }
    }
    found
}

#[test]
fn no_busd_file_outside_the_hub_names_the_hub() {
    let found = busd_lines_outside("hub", names_the_hub);
    assert!(
        found.is_empty(),
        "hold the handle of the role (Session, CommitPort, ReplicaPort, SourceHandle, \
         FilterHandle, StatusReader, HubOwner), not the Hub:\n{}",
        found.join("\n")
    );
}

/// The lines of `text` that name the PostgreSQL driver's crate.
fn names_the_driver(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.contains("tokio_postgres"))
        .map(|l| l.trim().to_owned())
        .collect()
}

#[test]
fn only_the_pg_folder_names_the_postgres_driver() {
    let found = busd_lines_outside("pg", names_the_driver);
    assert!(
        found.is_empty(),
        "reach PostgreSQL through busd/src/pg (its Client, Row, Type, its typed calls), \
         not the driver:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checkers_find_what_breaks_their_rules() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    assert!(circle(&edges).is_none());
    edges.entry("c".into()).or_default().insert("a".into());
    assert_eq!(circle(&edges).expect("a circle"), ["a", "b", "c", "a"]);
    assert_eq!(
        python_imports("from .errors import X\nfrom . import aio, cli\nimport dws_bus.x as y\n"),
        ["aio", "cli", "errors", "x"].map(String::from).into()
    );
    let bad = "use x;\nstatic COUNT: AtomicU64 = AtomicU64::new(0);\n";
    assert_eq!(unexplained_statics(bad).len(), 1);
    let ok = "// process-wide: a constant set once\nstatic ORIGIN: OnceLock<Instant> = OnceLock::new();\n";
    assert!(unexplained_statics(ok).is_empty());
    let long = "// process-wide: a scratch buffer,\n// per thread\nthread_local! {\n    static S: u8 = 0;\n}\n";
    assert!(unexplained_statics(long).is_empty());
    let far = "// process-wide: for g\nfn g() {}\nstatic N: AtomicU64 = AtomicU64::new(0);\n";
    assert_eq!(unexplained_statics(far).len(), 1);
    let in_tests =
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    static X: Mutex<u8> = Mutex::new(0);\n}\n";
    assert!(unexplained_statics(in_tests).is_empty());
    assert_eq!(
        names_the_hub("use crate::hub::Hub;\n// the [`Hub`]\nfn f(h: HubOwner, c: HubConfig) {}\n"),
        ["use crate::hub::Hub;", "// the [`Hub`]"]
    );
    assert!(names_the_hub("let hub = Hubs; // ThisHub hub::Session").is_empty());
    assert_eq!(
        names_the_driver("use tokio_postgres::Client;\nuse crate::pg::{Client, Row};\n"),
        ["use tokio_postgres::Client;"]
    );
}
