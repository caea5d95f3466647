//! Habits that keep the repository readable, checked on every run: every
//! Rust source file says what it owns in a `//!` header, no product
//! source file grows past the size one person holds in their head unless
//! ARCHITECTURE.md says why, no harness file (`tests/src`) grows past 800
//! lines, busd's modules keep their boundaries, and the docs hold
//! together — every relative link and anchor resolves, the exit-code table
//! matches `exit.rs`, the tests ARCHITECTURE.md cites exist, and no text
//! points outside the repository.

use std::path::{Path, PathBuf};

/// Product files (busd, dws, proto) longer than this need a reason in
/// ARCHITECTURE.md ("Large files").
const MAX_LINES: usize = 650;

pub(crate) fn workspace() -> PathBuf {
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

pub(crate) fn files(dirs: &[&str]) -> Vec<PathBuf> {
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

/// Files of the test harness (`tests/src`) longer than this are split, no
/// exception by reason: a harness file holds one concern.
const MAX_HARNESS_LINES: usize = 800;

#[test]
fn no_harness_file_is_over_800_lines() {
    let root = workspace();
    let mut over = vec![];
    for f in files(&["tests/src"]) {
        let rel = f.strip_prefix(&root).unwrap_or(&f).display().to_string();
        let lines = std::fs::read_to_string(&f)
            .unwrap_or_default()
            .lines()
            .count();
        if lines > MAX_HARNESS_LINES {
            over.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(
        over.is_empty(),
        "split these harness files (at most {MAX_HARNESS_LINES} lines each):\n{}",
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
pub(crate) fn crate_refs(text: &str) -> std::collections::BTreeSet<String> {
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
    if let Some(circle) = super::structure::circle(&edges) {
        panic!(
            "busd's modules import each other in a circle: {}\n(edges: {edges:?})",
            circle.join(" -> ")
        );
    }
}

// ------------------------------------------------------------------ the docs

/// The Markdown documents whose links must resolve.
fn markdown_docs() -> Vec<PathBuf> {
    let root = workspace();
    let mut out = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        docs.sort();
        out.extend(docs);
    }
    out
}

/// The lines of `text` outside fenced code blocks (a `#` there is a shell
/// comment, a `[x](y)` an example), with their line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = vec![];
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((n + 1, line));
        }
    }
    out
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped (letters,
/// digits, `-`, `_` and spaces kept), each space a `-`.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a Markdown file has, a repeated heading numbered as GitHub
/// does (`x`, `x-1`, …).
fn anchors(text: &str) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut out = std::collections::BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor_of(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` in `line`.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].trim();
        // `[x](url "title")`: the title is not part of the target.
        let target = target.split_whitespace().next().unwrap_or_default();
        out.push(target.to_owned());
        rest = &rest[end..];
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = workspace();
    let mut broken = vec![];
    for doc in markdown_docs() {
        let Ok(text) = std::fs::read_to_string(&doc) else {
            broken.push(format!("{}: cannot be read", doc.display()));
            continue;
        };
        let rel = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().unwrap_or(&root).join(path)
                };
                if !file.exists() {
                    broken.push(format!("{rel}:{n}: {target}: no such file"));
                    continue;
                }
                if anchor.is_empty() {
                    continue;
                }
                let target_text = if file.is_file() {
                    std::fs::read_to_string(&file).unwrap_or_default()
                } else {
                    String::new()
                };
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{rel}:{n}: {target}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links in the docs that do not resolve:\n{}",
        broken.join("\n")
    );
}

#[test]
fn anchors_follow_githubs_rule() {
    assert_eq!(
        anchor_of(" Running the bus as a user service (systemd)"),
        "running-the-bus-as-a-user-service-systemd"
    );
    assert_eq!(anchor_of(" Bus → client frames"), "bus--client-frames");
    assert_eq!(
        anchor_of(" `dws event consume`, in brief"),
        "dws-event-consume-in-brief"
    );
    let a = anchors("# A\n```sh\n# not a heading\n```\n## A\n#nospace\n");
    assert_eq!(a.into_iter().collect::<Vec<_>>(), ["a", "a-1"]);
    assert_eq!(
        link_targets("see [x](a.md#b) and [y](c.md \"t\"), `[z](d)`"),
        ["a.md#b", "c.md", "d"]
    );
}

/// The codes in the first column of every table in `text` whose header's
/// first cell is `exit`.
fn exit_code_tables(text: &str) -> Vec<std::collections::BTreeSet<u8>> {
    let mut tables = vec![];
    let mut current: Option<std::collections::BTreeSet<u8>> = None;
    for (_, line) in prose_lines(text) {
        let cells: Vec<&str> = line.trim().split('|').map(str::trim).collect();
        let first = if line.trim_start().starts_with('|') {
            cells.get(1).copied()
        } else {
            None
        };
        match (first, current.as_mut()) {
            (Some("exit"), _) => {
                if let Some(t) = current.take() {
                    tables.push(t);
                }
                current = Some(Default::default());
            }
            (Some(cell), Some(t)) => {
                if let Ok(code) = cell.parse::<u8>() {
                    t.insert(code);
                }
            }
            (None, Some(_)) => tables.extend(current.take()),
            _ => {}
        }
    }
    tables.extend(current);
    tables
}

/// The exit codes `dws-client/src/exit.rs` defines (`pub const NAME: u8 =
/// N;`), and 0, which is success.
fn exit_rs_codes() -> std::collections::BTreeSet<u8> {
    let exit_rs = std::fs::read_to_string(workspace().join("dws-client/src/exit.rs"))
        .expect("dws-client/src/exit.rs");
    let mut codes: std::collections::BTreeSet<u8> = exit_rs
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("pub const ")?;
            let (_, value) = rest.split_once(": u8 =")?;
            value.trim().trim_end_matches(';').trim().parse().ok()
        })
        .collect();
    assert!(
        codes.len() >= 3,
        "exit.rs defines its codes as `pub const NAME: u8 = N;`: found {codes:?}"
    );
    codes.insert(0);
    codes
}

/// docs/consume-contract.md holds the one full exit-code table: exactly the
/// codes `exit.rs` defines. The README's summary lists the same codes, and
/// the guide's table of actions no other.
#[test]
fn the_exit_code_table_lists_exactly_the_codes_exit_rs_defines() {
    let expected = exit_rs_codes();
    let read = |rel: &str| std::fs::read_to_string(workspace().join(rel)).unwrap_or_default();
    let contract = exit_code_tables(&read("docs/consume-contract.md"));
    assert_eq!(
        contract,
        std::slice::from_ref(&expected),
        "docs/consume-contract.md must have one exit-code table listing exactly {expected:?}"
    );
    let readme = exit_code_tables(&read("README.md"));
    assert_eq!(
        readme,
        std::slice::from_ref(&expected),
        "README.md's exit-code summary must list exactly {expected:?}"
    );
    for table in exit_code_tables(&read("docs/guide.md")) {
        assert!(
            table.is_subset(&expected),
            "docs/guide.md names exit codes {table:?}; exit.rs has {expected:?}"
        );
    }
}

/// Every text file under `dir`, `target/` and `.git` left out.
fn text_files(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        if p.is_dir() {
            text_files(&p, out);
        } else if let Ok(text) = std::fs::read_to_string(&p) {
            out.push((p, text));
        }
    }
}

/// The repository stands alone: no text in it names a sibling checkout or
/// the machine it was written on. (The needles are assembled here so this
/// file does not contain them.)
#[test]
fn no_committed_text_points_outside_the_repository() {
    let root = workspace();
    let needles = [format!("..{}shared", '/'), format!("/{}/", "work")];
    let mut files = vec![];
    // What git tracks, when git can say; else every file but `target/`.
    let tracked = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty());
    match tracked {
        Some(out) => {
            for rel in out.stdout.split(|&b| b == 0).filter(|r| !r.is_empty()) {
                let path = root.join(String::from_utf8_lossy(rel).as_ref());
                if let Ok(text) = std::fs::read_to_string(&path) {
                    files.push((path, text));
                }
            }
        }
        None => text_files(&root, &mut files),
    }
    assert!(
        files.iter().any(|(p, _)| p.ends_with("README.md")),
        "no text files found under {root:?}"
    );
    let mut hits = vec![];
    for (path, text) in files {
        for (n, line) in text.lines().enumerate() {
            if let Some(needle) = needles.iter().find(|x| line.contains(x.as_str())) {
                let rel = path
                    .strip_prefix(&root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                hits.push(format!("{rel}:{}: {needle}", n + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "these files point outside the repository:\n{}",
        hits.join("\n")
    );
}

/// The names of every `#[test]` function in the workspace's Rust sources.
fn test_names() -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for f in files(&["busd/src", "dws-client/src", "proto/src", "tests"]) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let mut is_test = false;
        for line in text.lines() {
            let t = line.trim();
            if t.starts_with("#[test]") || t.starts_with("#[tokio::test") {
                is_test = true;
                continue;
            }
            // Other attributes and comments may stand between `#[test]`
            // and its function.
            if t.starts_with("#[") || t.starts_with("//") {
                continue;
            }
            if let (true, Some(at)) = (is_test, t.find("fn ")) {
                let name: String = t[at + 3..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
                is_test = false;
            } else {
                is_test = false;
            }
        }
    }
    names
}

/// Every test ARCHITECTURE.md's invariants cite (a backticked lowercase
/// path such as `module::a_test_named_by_what_it_shows`) exists.
#[test]
fn architecture_cites_only_tests_that_exist() {
    let arch = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap_or_default();
    let invariants = arch
        .split("\n## Invariants")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("ARCHITECTURE.md has an Invariants section");
    let tests = test_names();
    let mut cited = 0;
    let mut missing = vec![];
    for (i, quoted) in invariants.split('`').enumerate() {
        let is_path = i % 2 == 1
            && quoted.contains("::")
            && quoted.split("::").all(|s| {
                s.starts_with(|c: char| c.is_ascii_lowercase())
                    && s.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            });
        let name = quoted.rsplit("::").next().unwrap_or_default();
        // A test is named by what it shows: several words.
        if !is_path || name.matches('_').count() < 2 {
            continue;
        }
        cited += 1;
        if !tests.contains(name) {
            missing.push(quoted.to_owned());
        }
    }
    assert!(
        cited >= 10,
        "ARCHITECTURE.md's invariants cite only {cited} tests"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md cites tests that do not exist:\n{}",
        missing.join("\n")
    );
}

/// ARCHITECTURE.md's boundary: the hub depends on `upstream`, never on a
/// source.
#[test]
fn busd_hub_never_imports_a_source() {
    let mut offenders = vec![];
    for f in files(&["busd/src/hub"]) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let joined = text.replace("::{\n", "::{").replace(",\n", ",");
        if crate_refs(&joined).contains("source") {
            offenders.push(f.display().to_string());
        }
    }
    assert!(
        offenders.is_empty(),
        "the hub imports crate::source in:\n{}",
        offenders.join("\n")
    );
}

/// ARCHITECTURE.md's boundary: `dws` never connects upstream — it has no
/// HTTP, WebSocket, TLS or database client to do it with.
#[test]
fn dws_has_no_upstream_client() {
    let manifest = std::fs::read_to_string(workspace().join("dws-client/Cargo.toml"))
        .expect("dws-client/Cargo.toml");
    let upstream_crates = [
        "reqwest",
        "tokio-tungstenite",
        "tungstenite",
        "hyper",
        "rustls",
        "tokio-postgres",
    ];
    let found: Vec<&str> = manifest
        .lines()
        .filter_map(|l| {
            let key = l.trim().split(['=', '.', ' ']).next().unwrap_or_default();
            upstream_crates.iter().copied().find(|c| *c == key)
        })
        .collect();
    assert!(found.is_empty(), "dws-client depends on {found:?}");
}

#[test]
fn installed_binaries_carry_no_debug_info() {
    // `cargo install` builds the release profile: with debug info busd was
    // 74 MB and dws 30 MB.
    let toml: toml::Table = std::fs::read_to_string(workspace().join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml parses");
    let release = &toml["profile"]["release"];
    let debug = release.get("debug").and_then(toml::Value::as_integer);
    assert!(
        debug.unwrap_or(0) == 0,
        "[profile.release] must not set debug info: {release:?}"
    );
    assert_eq!(
        release.get("strip").and_then(toml::Value::as_str),
        Some("debuginfo"),
        "[profile.release] strips the debug info of dependencies too"
    );
}

#[test]
fn the_test_script_prints_its_usage_on_help_instead_of_running() {
    // Before, `--help` started the whole suite (issue 44 item 8).
    let env = dws_tests::TestEnv::new();
    let out = env
        .command(
            "bash",
            [
                workspace().join("scripts/test.sh").as_os_str(),
                "--help".as_ref(),
            ],
        )
        .run_with_timeout(std::time::Duration::from_secs(20));
    out.assert_code(0);
    assert!(out.stdout.contains("Usage: scripts/test.sh"), "{out}");
}

/// Issue 44, item 8: a script finds the binaries where cargo built them
/// (`scripts/target-dir.sh`: CARGO_TARGET_DIR, a config's build.target-dir,
/// or ./target). demo.sh ran `./target/debug/dws` after building elsewhere
/// (exit 127).
#[test]
fn no_script_assumes_the_target_directory_is_dot_target() {
    let scripts = workspace().join("scripts");
    let mut offenders = vec![];
    for entry in std::fs::read_dir(&scripts).expect("scripts/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "sh") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a script");
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if !code.starts_with('#')
                && (code.contains("target/debug") || code.contains("target/release"))
            {
                offenders.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// ARCHITECTURE.md stays short: at most 20,000 characters (file-level
/// detail lives in each module's `//!` header; the cluster's invariants in
/// docs/cluster.md).
#[test]
fn architecture_stays_within_20k_characters() {
    let arch =
        std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let n = arch.chars().count();
    assert!(
        n <= 20_000,
        "ARCHITECTURE.md has {n} characters (at most 20,000)"
    );
}
