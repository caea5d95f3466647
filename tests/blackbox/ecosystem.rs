//! Fitting the ecosystem (issue 13), each step a user follows:
//!
//! - **install**: `scripts/install.sh` (run with a stub `cargo` that copies
//!   the built binaries, so no build happens inside a test) puts `dws` and
//!   `busd` side by side with their man pages and completions; the installed
//!   `dws`, with no other `busd` on PATH, spawns the installed `busd`;
//!   `dws --version` and `busd --version` agree on build and protocol.
//! - **completions and man pages**: every shell's script; bash's completes
//!   `dws event co` to `consume`; every page renders through groff without a
//!   warning.
//! - **schemas**: every file in `schemas/` is a valid JSON Schema, and real
//!   output of every `--format json` command validates against it — in a
//!   strict variant (no undescribed field anywhere), so a field added to the
//!   output without its schema fails here.
//! - **systemd**: `busd --foreground` with `NOTIFY_SOCKET` sends `STATUS=`
//!   lines, `READY=1` once its socket accepts connections, `STOPPING=1` on
//!   SIGTERM, runs without an idle timeout unless one is given, and serves
//!   `dws` like a spawned bus; a spawned bus never notifies (socket
//!   activation, the watchdog and the units: `service.rs`).
//! - **examples**: `examples/python/consume.py` and `examples/node/consume.mjs`
//!   against a real bus: ready, events, stop by SIGTERM and by closing stdin,
//!   and the action for each exit (limit, timeout, signal, bus_shutdown,
//!   a crashed bus with a restart, source_lost, a usage error).
//! - **operators**: `status --watch` (plain reports, NDJSON, in place on a
//!   terminal) and `bus.log` as JSON lines.
//!
//! Tools from the machine image (node, groff, systemd-analyze, script) are
//! looked up on PATH; a missing one skips its check with a note on stderr,
//! except under CI (`CI` set), where it fails: CI never skips silently.

use std::{
    os::unix::{fs::PermissionsExt, net::UnixDatagram},
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use dws_tests::common::{repo, tool};
use dws_tests::{
    dws_bin,
    fake_dingtalk::{dingtalk_env, FakeDingTalk},
    Child, Ready, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::{json, Value};

/// Bound of the waits in this module.
const T: Duration = Duration::from_secs(30);

/// The real python3 executable (not a version-manager shim, which would
/// look for its config under the test's HOME).
fn python() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs (it is part of the machine image)");
    assert!(out.status.success(), "python3 -c failed: {out:?}");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

// ------------------------------------------------------------------ schemas

/// `schemas/<name>.schema.json`, checked against its meta-schema.
fn schema(name: &str) -> Value {
    let path = repo().join("schemas").join(format!("{name}.schema.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    if let Err(e) = jsonschema::meta::validate(&v) {
        panic!("{} is not a valid JSON Schema: {e}", path.display());
    }
    v
}

/// The schema with `additionalProperties: false` wherever it lists
/// `properties`: real output may carry no field the schema does not describe.
fn strict(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out: serde_json::Map<String, Value> =
                m.iter().map(|(k, v)| (k.clone(), strict(v))).collect();
            if out.contains_key("properties") && !out.contains_key("additionalProperties") {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(strict).collect()),
        other => other.clone(),
    }
}

/// Asserts `instance` satisfies `schemas/<name>.schema.json`, strictly.
pub(crate) fn assert_valid(name: &str, instance: &Value) {
    let validator = jsonschema::validator_for(&strict(&schema(name)))
        .unwrap_or_else(|e| panic!("schema {name} does not compile: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("  at {}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "output does not match schemas/{name}.schema.json:\n{}\n{instance:#}",
        errors.join("\n")
    );
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// `dws ARGS` that must succeed; its stdout as JSON.
fn dws_json(env: &TestEnv, args: &[&str]) -> Value {
    let out = env.dws(args).run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    json_of(&out.stdout)
}

#[test]
fn every_schema_is_a_valid_json_schema() {
    let mut n = 0;
    for entry in std::fs::read_dir(repo().join("schemas")).expect("schemas/") {
        let name = entry.expect("dir entry").file_name();
        let name = name.to_string_lossy();
        let stem = name
            .strip_suffix(".schema.json")
            .unwrap_or_else(|| panic!("schemas/{name}: expected NAME.schema.json"));
        jsonschema::validator_for(&strict(&schema(stem)))
            .unwrap_or_else(|e| panic!("schemas/{name} does not compile: {e}"));
        n += 1;
    }
    assert!(
        n >= 6,
        "event, status, publish, subscribe, unsubscribe, stop"
    );
    // The strict variant really rejects an undescribed field.
    let mut line = json!({"type": "event", "seq": 1, "event_type": "a.b",
        "received_at_unix_ms": 1, "redelivered": false});
    assert_valid("event", &line);
    line["surprise"] = json!(1);
    let v = jsonschema::validator_for(&strict(&schema("event"))).expect("compiles");
    assert!(!v.is_valid(&line), "an undescribed field must fail");
}

#[test]
fn real_output_of_every_json_command_matches_its_schema() {
    let env = TestEnv::new();
    // Nothing running: status and stop say so.
    assert_valid(
        "status",
        &dws_json(&env, &["event", "status", "--format", "json"]),
    );
    assert_valid(
        "stop",
        &dws_json(&env, &["event", "stop", "--format", "json"]),
    );

    // A durable subscription with a filter, and a consumer on it.
    let sub = dws_json(
        &env,
        &[
            "event",
            "subscribe",
            "sch.*",
            "--id",
            "s1",
            "--filter",
            "^sch\\.",
            "--format",
            "json",
        ],
    );
    assert_valid("subscribe", &sub);
    assert_eq!(sub["created"], true, "{sub}");
    let again = dws_json(
        &env,
        &[
            "event",
            "subscribe",
            "sch.*",
            "--id",
            "s1",
            "--filter",
            "^sch\\.",
            "--format",
            "json",
        ],
    );
    assert_valid("subscribe", &again);
    assert_eq!(again["created"], false, "{again}");
    assert_valid(
        "subscribe",
        &dws_json(&env, &["event", "subscribe", "other.k", "--format", "json"]),
    );

    let mut c = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .stdin_hold()
        .spawn();
    c.wait_ready();
    let p1 = dws_json(
        &env,
        &["event", "publish", "sch.a", "{\"n\":1}", "--id", "e-1"],
    );
    assert_valid("publish", &p1);
    let dup = dws_json(
        &env,
        &[
            "event",
            "publish",
            "sch.a",
            "{\"n\":1}",
            "--id",
            "e-1",
            "--format",
            "json",
        ],
    );
    assert_valid("publish", &dup);
    assert_eq!(dup["duplicate"], true, "{dup}");
    assert_valid("publish", &dws_json(&env, &["event", "publish", "sch.b"]));
    for line in c.wait_stdout_lines(2, T) {
        assert_valid("event", &json_of(&line));
    }

    // Status with a consumer, subscriptions, event types and a disk store.
    let st = dws_json(&env, &["event", "status", "--format", "json"]);
    assert_valid("status", &st);
    assert_eq!(st["consumers"].as_array().map(Vec::len), Some(1), "{st:#}");

    // stop: a dry run, one subscription's consumers, unknown ids.
    let dry = dws_json(&env, &["event", "stop", "--dry-run", "--format", "json"]);
    assert_valid("stop", &dry);
    assert_eq!(dry["consumer_pids"], json!([c.pid()]), "{dry}");
    let one = dws_json(
        &env,
        &["event", "stop", "--subscribe-id", "s1", "--format", "json"],
    );
    assert_valid("stop", &one);
    assert_eq!(one["scope"], "subscriptions", "{one}");
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("stopped", 2);
    let missing = env
        .dws([
            "event",
            "stop",
            "--subscribe-id",
            "nope",
            "--format",
            "json",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    missing.assert_error(1);
    let missing = json_of(&missing.stdout);
    assert_valid("stop", &missing);
    assert_eq!(missing["not_found"], json!(["nope"]), "{missing}");

    // unsubscribe, then one that is gone (exit 1, JSON all the same).
    let un = dws_json(&env, &["event", "unsubscribe", "s1", "--format", "json"]);
    assert_valid("unsubscribe", &un);
    assert_eq!(un["removed"], json!(["s1"]), "{un}");
    let gone = env
        .dws(["event", "unsubscribe", "s1", "--format", "json"])
        .run_with_timeout(EXIT_TIMEOUT);
    gone.assert_error(1);
    assert_valid("unsubscribe", &json_of(&gone.stdout));

    // consume --format json: an array of event lines.
    let arr = env
        .dws([
            "event",
            "consume",
            "sch.*",
            "--from",
            "earliest",
            "--max-events",
            "2",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    arr.assert_clean_exit("limit", 2);
    for line in arr.stdout_lines() {
        assert_valid("event", &json_of(line));
    }
    let arr = env
        .dws([
            "event",
            "consume",
            "sch.*",
            "--from",
            "earliest",
            "--max-events",
            "2",
            "--format",
            "json",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    arr.assert_clean_exit("limit", 2);
    for item in json_of(&arr.stdout).as_array().expect("an array") {
        assert_valid("event", item);
    }

    // The whole bus.
    let all = dws_json(&env, &["event", "stop", "--format", "json"]);
    assert_valid("stop", &all);
    assert_eq!(all["bus_stopping"], true, "{all}");
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit after stop");
}

#[test]
fn an_exec_event_with_headers_and_a_memory_store_match_the_schemas() {
    let env = TestEnv::new();
    let feed = env.root().join("feed.py");
    std::fs::write(
        &feed,
        "import json, time\n\
         print(json.dumps({'event_type': 'x.full', 'event_id': 'f-1', 'data': {'k': 1},\n\
                           'headers': {'h1': 'v1'}, 'born_time': 1700000000000}), flush=True)\n\
         print('not json', flush=True)\n\
         time.sleep(3600)\n",
    )
    .expect("write feed.py");
    // The bus this consumer spawns inherits the source settings.
    let mut c = env
        .dws(["event", "consume", "x.*", "--from", "earliest"])
        .env("DWS_EVENT_SOURCE", "exec")
        .env("DWS_EVENT_BUS_STORE", "memory")
        .env(
            "DWS_EXEC_COMMAND",
            format!("{} -u {}", python().display(), feed.display()),
        )
        .stdin_hold()
        .spawn();
    c.wait_ready();
    let line = json_of(&c.wait_stdout_lines(1, T)[0]);
    assert_valid("event", &line);
    assert_eq!(line["headers"]["h1"], "v1", "{line}");
    env.wait_until(T, "the malformed line to be counted", || {
        env.status()["source"]["malformed"] == 1
    });
    let st = env.status();
    assert_valid("status", &st);
    assert_eq!(st["store"]["path"], Value::Null, "{st:#}");
    c.signal(Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 1);
}

// ------------------------------------------------------------------ versions, install

#[test]
fn dws_and_busd_print_the_same_version_and_protocol() {
    let env = TestEnv::new();
    let dws = env.dws(["--version"]).run_with_timeout(EXIT_TIMEOUT);
    dws.assert_code(0);
    let busd = env.busd(["--version"]).run_with_timeout(EXIT_TIMEOUT);
    busd.assert_code(0);
    let d = dws
        .stdout
        .trim()
        .strip_prefix("dws ")
        .expect("dws NAME")
        .to_owned();
    let b = busd
        .stdout
        .trim()
        .strip_prefix("busd ")
        .expect("busd NAME")
        .to_owned();
    assert_eq!(d, b, "same build and protocol\n{dws}\n{busd}");
    assert_eq!(
        d,
        format!("{} (protocol {})", proto::BUILD, proto::PROTOCOL_VERSION)
    );
    // The running bus reports the same.
    let mut c = env.dws(["event", "consume", "v.k"]).stdin_hold().spawn();
    c.wait_ready();
    let st = env.status();
    assert_eq!(
        format!(
            "{} (protocol {})",
            st["bus"]["version"].as_str().unwrap_or("?"),
            st["bus"]["protocol_version"]
        ),
        d,
        "{st:#}"
    );
}

/// A stand-in for cargo that logs its arguments to `cargo.log`; its
/// `build` copies the built binaries into STUB_TARGET/{debug,release} (by
/// `--release`) and its `metadata` names STUB_TARGET as the target
/// directory, so `scripts/install.sh` runs without building anything.
fn cargo_stub(env: &TestEnv) -> (PathBuf, PathBuf) {
    let stub = env.root().join("cargo-stub");
    let log = env.root().join("cargo.log");
    std::fs::write(
        &stub,
        "#!/bin/sh\n\
         printf '%s\\n' \"$*\" >> \"$STUB_LOG\"\n\
         case \"$1\" in\n\
           build) out=debug; for a; do [ \"$a\" = --release ] && out=release; done\n\
             mkdir -p \"$STUB_TARGET/$out\"\n\
             cp \"$STUB_BIN/busd\" \"$STUB_BIN/dws\" \"$STUB_TARGET/$out/\" ;;\n\
           metadata) printf '{\"packages\":[],\"target_directory\":\"%s\",\"version\":1}\\n' \"$STUB_TARGET\" ;;\n\
           *) echo \"unexpected: cargo $*\" >&2; exit 9 ;; esac\n",
    )
    .expect("write the cargo stub");
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (stub, log)
}

/// `scripts/install.sh ARGS` with the cargo stub.
fn run_install(env: &TestEnv, args: &[&std::ffi::OsStr]) -> (dws_tests::Output, PathBuf) {
    let (stub, log) = cargo_stub(env);
    let mut argv = vec![repo().join("scripts/install.sh").into_os_string()];
    argv.extend(args.iter().map(|a| a.to_os_string()));
    let out = env
        .command("bash", argv)
        .env("CARGO", &stub)
        .env("STUB_LOG", &log)
        .env("STUB_BIN", dws_tests::bin_dir())
        .env("STUB_TARGET", env.root().join("stub-target"))
        .run_with_timeout(T);
    (out, log)
}

#[test]
fn install_script_puts_both_binaries_side_by_side_with_docs_and_dws_finds_its_busd() {
    let env = TestEnv::new();
    let root = env.root().join("prefix");
    let (out, log) = run_install(&env, &["--root".as_ref(), root.as_os_str()]);
    out.assert_code(0);
    let calls = std::fs::read_to_string(&log).expect("cargo was called");
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            "build --locked --release -p busd -p dws-client",
            "metadata --locked --no-deps --format-version 1"
        ],
        "one build of both packages\n{out}"
    );
    let version = format!("{} (protocol {})", proto::BUILD, proto::PROTOCOL_VERSION);
    assert!(
        out.stdout.contains(&format!("installed dws {version}")),
        "{out}"
    );
    let share = root.join("share");
    for f in [
        "man/man1/dws.1",
        "man/man1/dws-event-consume.1",
        "man/man1/dws-event-status.1",
        "man/man1/busd.1",
        "bash-completion/completions/dws",
        "zsh/site-functions/_dws",
        "fish/vendor_completions.d/dws.fish",
    ] {
        let p = share.join(f);
        assert!(
            std::fs::metadata(&p).is_ok_and(|m| m.len() > 0),
            "{} is installed\n{out}",
            p.display()
        );
    }

    // The installed dws, with nothing else on PATH and no DWS_BUSD, spawns
    // the busd next to it.
    let bin = root.join("bin");
    let mut c = env
        .command(
            bin.join("dws"),
            ["event", "consume", "inst.k", "--max-events", "1"],
        )
        .env("PATH", "/usr/bin:/bin")
        .spawn();
    let ready = c.wait_ready();
    let exe = std::fs::read_link(format!("/proc/{}/exe", ready.bus_pid)).expect("bus exe");
    assert_eq!(exe, bin.join("busd"), "the busd next to the installed dws");
    let publish = env
        .command(bin.join("dws"), ["event", "publish", "inst.k", "hi"])
        .env("PATH", "/usr/bin:/bin")
        .run_with_timeout(EXIT_TIMEOUT);
    publish.publish_json();
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("limit", 1);
}

#[test]
fn install_script_with_systemd_and_no_enable_writes_the_units_and_runs_no_systemctl() {
    let env = TestEnv::new();
    let root = env.root().join("prefix");
    let units = env.root().join("units");
    // A systemctl that would say it was run.
    let stubs = env.root().join("stubs");
    std::fs::create_dir_all(&stubs).expect("mkdir stubs");
    let ran = env.root().join("systemctl-ran");
    std::fs::write(
        stubs.join("systemctl"),
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", ran.display()),
    )
    .expect("write the systemctl stub");
    std::fs::set_permissions(
        stubs.join("systemctl"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    let path = format!(
        "{}:{}",
        stubs.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (stub, log) = cargo_stub(&env);
    let out = env
        .command(
            "bash",
            [
                repo().join("scripts/install.sh").as_os_str(),
                "--root".as_ref(),
                root.as_os_str(),
                "--debug".as_ref(),
                "--systemd".as_ref(),
                "--no-enable".as_ref(),
                "--unit-dir".as_ref(),
                units.as_os_str(),
            ],
        )
        .env("PATH", path)
        .env("CARGO", &stub)
        .env("STUB_LOG", &log)
        .env("STUB_BIN", dws_tests::bin_dir())
        .env("STUB_TARGET", env.root().join("stub-target"))
        .run_with_timeout(T);
    out.assert_code(0);
    let service = std::fs::read_to_string(units.join("dws-bus@default.service"))
        .unwrap_or_else(|e| panic!("the service unit ({e})\n{out}"));
    assert!(
        service.lines().any(|l| l
            == format!(
                "ExecStart={} --foreground --profile %i",
                root.join("bin/busd").display()
            )),
        "{service}"
    );
    assert!(
        units.join("dws-bus@default.socket").is_file(),
        "the socket unit\n{out}"
    );
    assert!(!ran.exists(), "--no-enable runs no systemctl\n{out}");
    let calls = std::fs::read_to_string(&log).expect("cargo was called");
    assert_eq!(
        calls.lines().next(),
        Some("build --locked -p busd -p dws-client"),
        "--debug builds the dev profile\n{out}"
    );
}

#[test]
fn install_script_refuses_an_unknown_argument() {
    let env = TestEnv::new();
    let out = env
        .command(
            "bash",
            [
                repo().join("scripts/install.sh").as_os_str(),
                "--bogus".as_ref(),
            ],
        )
        .env("CARGO", "/bin/false")
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(2);
    assert!(out.stderr.contains("unknown argument"), "{out}");
}

// ------------------------------------------------------------------ completions, man pages

#[test]
fn completion_scripts_for_every_shell_and_bash_completes_subcommands() {
    let env = TestEnv::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = env
            .dws(["completions", shell])
            .run_with_timeout(EXIT_TIMEOUT);
        out.assert_code(0);
        assert!(
            out.stdout.contains("consume") && out.stdout.contains("max-events"),
            "{shell} completions name the subcommands and flags\n{out}"
        );
    }
    env.dws(["completions", "tcsh"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_error(2);
    // bash: the script parses, and completes `dws event co` and `--max-`.
    let script = env.root().join("dws.bash");
    std::fs::write(
        &script,
        env.dws(["completions", "bash"])
            .run_with_timeout(EXIT_TIMEOUT)
            .stdout,
    )
    .expect("write the bash script");
    let complete = |words: &str| {
        let out = env
            .command(
                "bash",
                [
                    "-c",
                    format!(
                        "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); \
                         COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; \
                         _dws dws \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; \
                         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                        script.display()
                    )
                    .as_str(),
                ],
            )
            .run_with_timeout(EXIT_TIMEOUT);
        out.assert_code(0);
        out.stdout
    };
    let subs = complete("dws event co");
    assert!(subs.lines().any(|l| l.trim() == "consume"), "{subs:?}");
    let flags = complete("dws event consume --max-");
    assert!(
        flags.lines().any(|l| l.trim() == "--max-events"),
        "{flags:?}"
    );
    env.wait_no_busd(Duration::ZERO, "completions start no bus");
    // Without a bus, a subscription id completes to nothing (and starts none).
    let ids = |words: &str| {
        let out = env
            .command(
                "bash",
                [
                    "-c",
                    format!(
                        "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); \
                         _dws_ids dws \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; \
                         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                        script.display()
                    )
                    .as_str(),
                ],
            )
            .run_with_timeout(EXIT_TIMEOUT);
        out.assert_code(0);
        let mut v: Vec<String> = out
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
    assert!(ids("dws event consume --subscribe-id ''").is_empty());
    env.wait_no_busd(Duration::ZERO, "completing an id starts no bus");
    // With one: the running bus's ids, where an id goes.
    env.subscribe(&["c.*", "--id", "alpha"]);
    env.subscribe(&["c.*", "--id", "beta"]);
    assert_eq!(
        ids("dws event consume --subscribe-id ''"),
        ["alpha", "beta"]
    );
    assert_eq!(ids("dws event consume --subscribe-id al"), ["alpha"]);
    assert_eq!(ids("dws event unsubscribe ''"), ["alpha", "beta"]);
    assert_eq!(ids("dws event subscription skip b"), ["beta"]);
    // Elsewhere, clap's completion as before.
    let subs = ids("dws event co");
    assert!(subs.iter().any(|l| l == "consume"), "{subs:?}");
}

#[test]
fn man_pages_for_dws_its_subcommands_and_busd_render_cleanly() {
    let env = TestEnv::new();
    let dir = env.root().join("man1");
    let out = env
        .dws(["manpages".as_ref(), dir.as_os_str()])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    let busd = env
        .busd(["--generate-man".as_ref(), dir.as_os_str()])
        .run_with_timeout(EXIT_TIMEOUT);
    busd.assert_code(0);
    assert_eq!(busd.stdout.trim(), dir.join("busd.1").to_string_lossy());
    let mut pages: Vec<PathBuf> = out.stdout.lines().map(PathBuf::from).collect();
    pages.push(dir.join("busd.1"));
    for sub in [
        "consume",
        "publish",
        "status",
        "stop",
        "subscribe",
        "unsubscribe",
    ] {
        assert!(
            pages.contains(&dir.join(format!("dws-event-{sub}.1"))),
            "a page for dws event {sub}\n{out}"
        );
    }
    assert!(pages.contains(&dir.join("dws.1")), "{out}");
    let busd_page = std::fs::read_to_string(dir.join("busd.1")).expect("busd.1");
    assert!(
        busd_page.contains("NOTIFY_SOCKET"),
        "busd(1) documents the service mode"
    );
    // As man(1) renders them: preconv (-k) for UTF-8, every warning on.
    let Some(groff) = tool("groff") else { return };
    for page in &pages {
        let r = Command::new(&groff)
            .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
            .arg(page)
            .output()
            .expect("run groff");
        assert!(
            r.status.success() && r.stderr.is_empty(),
            "{} renders without warnings: {}",
            page.display(),
            String::from_utf8_lossy(&r.stderr)
        );
    }
    let r = Command::new(&groff)
        .args(["-k", "-man", "-Tutf8"])
        .arg(dir.join("dws-event-consume.1"))
        .output()
        .expect("run groff");
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(text.contains("max") && text.contains("kill"), "{text}");
}

// ------------------------------------------------------------------ systemd

/// The datagrams a fake service manager received.
struct Manager {
    sock: UnixDatagram,
    path: PathBuf,
    got: Vec<String>,
}

impl Manager {
    fn new(env: &TestEnv) -> Manager {
        let path = env.root().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("read timeout");
        Manager {
            sock,
            path,
            got: vec![],
        }
    }

    /// Receives until a datagram has a line `line`; returns that datagram.
    fn wait_for(&mut self, line: &str, child: &Child) -> String {
        let deadline = Instant::now() + T;
        loop {
            if let Some(d) = self.got.iter().find(|d| d.lines().any(|l| l == line)) {
                return d.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no {line:?} from busd; got {:?}\n{}",
                self.got,
                child.report()
            );
            let mut buf = [0u8; 4096];
            if let Ok(n) = self.sock.recv(&mut buf) {
                self.got
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    }

    /// Every datagram received within `d`.
    fn drain(&mut self, d: Duration) -> Vec<String> {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            let mut buf = [0u8; 4096];
            if let Ok(n) = self.sock.recv(&mut buf) {
                self.got
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        self.got.clone()
    }
}

#[test]
fn busd_foreground_speaks_the_readiness_protocol_and_serves_dws() {
    let env = TestEnv::new();
    let mut mgr = Manager::new(&env);
    let bus = env
        .busd(["--foreground"])
        .env("NOTIFY_SOCKET", &mgr.path)
        .spawn();
    let ready = mgr.wait_for("READY=1", &bus);
    // The socket accepts connections the moment READY=1 is out.
    std::os::unix::net::UnixStream::connect(env.expected_socket_path())
        .unwrap_or_else(|e| panic!("connect after READY=1: {e}\n{}", bus.report()));
    assert!(
        mgr.got[0].starts_with("STATUS=starting"),
        "the first message says it is starting: {:?}",
        mgr.got
    );
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=serving profile default")),
        "READY=1 comes with a status: {ready:?}"
    );

    // dws uses it like a spawned bus; under a service manager it never idles out.
    let st = env.status();
    assert_eq!(st["bus"]["pid"], bus.pid(), "{st:#}");
    assert_eq!(st["bus"]["idle_timeout_ms"], 0, "{st:#}");
    let mut c = env.dws(["event", "consume", "sd.k"]).stdin_hold().spawn();
    let r: Ready = c.wait_ready();
    assert_eq!(r.bus_pid, bus.pid());
    env.publish("sd.k", "x", &[]);
    c.wait_stdout_lines(1, T);
    // The status line follows the counts.
    let deadline = Instant::now() + T;
    while !mgr
        .got
        .iter()
        .any(|d| d.contains("STATUS=serving") && d.contains("1 subscription(s)"))
    {
        assert!(
            Instant::now() < deadline,
            "STATUS= shows the consumer: {:?}",
            mgr.got
        );
        mgr.drain(Duration::from_millis(200));
    }

    bus.signal(Sig::SIGTERM);
    let stopping = mgr.wait_for("STOPPING=1", &bus);
    assert!(
        stopping.contains("STATUS=stopping (shutdown)"),
        "{stopping:?}"
    );
    c.wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("bus_shutdown", 1);
    bus.wait_exit(EXIT_TIMEOUT).assert_code(0);
    let ready_at = mgr.got.iter().position(|d| d.contains("READY=1"));
    let stopping_at = mgr.got.iter().position(|d| d.contains("STOPPING=1"));
    assert!(ready_at < stopping_at, "{:?}", mgr.got);
}

#[test]
fn an_explicit_idle_timeout_wins_and_a_spawned_bus_never_notifies() {
    let env = TestEnv::new();
    let mut mgr = Manager::new(&env);
    let bus = env
        .busd(["--foreground", "--idle-timeout", "1h"])
        .env("NOTIFY_SOCKET", &mgr.path)
        .spawn();
    mgr.wait_for("READY=1", &bus);
    assert_eq!(env.status()["bus"]["idle_timeout_ms"], 3_600_000);
    bus.signal(Sig::SIGTERM);
    mgr.wait_for("STOPPING=1", &bus);
    bus.wait_exit(EXIT_TIMEOUT).assert_code(0);

    // The env var is explicit too.
    let bus = env
        .busd(["--foreground"])
        .env("NOTIFY_SOCKET", &mgr.path)
        .env("DWS_EVENT_BUS_IDLE_TIMEOUT", "2h")
        .spawn();
    mgr.got.clear();
    mgr.wait_for("READY=1", &bus);
    assert_eq!(env.status()["bus"]["idle_timeout_ms"], 7_200_000);
    bus.signal(Sig::SIGTERM);
    bus.wait_exit(EXIT_TIMEOUT).assert_code(0);

    // A bus that dws spawns inherits NOTIFY_SOCKET but is not supervised.
    mgr.drain(Duration::from_millis(300));
    mgr.got.clear();
    let mut c = env
        .dws(["event", "consume", "sp.k"])
        .env("NOTIFY_SOCKET", &mgr.path)
        .stdin_hold()
        .spawn();
    c.wait_ready();
    assert_eq!(env.status()["bus"]["idle_timeout_ms"], 300_000);
    assert!(
        mgr.drain(Duration::from_millis(500)).is_empty(),
        "a spawned bus sends nothing: {:?}",
        mgr.got
    );
}

// The units and `systemd-analyze verify`: `service.rs`.

// ------------------------------------------------------------------ operators

#[test]
fn status_watch_prints_one_report_per_interval_until_sigterm() {
    let env = TestEnv::new();
    let mut w = env
        .dws(["event", "status", "--watch", "--interval", "200ms"])
        .spawn();
    w.wait_stdout_line("a report", T, |l| l.starts_with("bus not running"));
    // A bus that starts meanwhile shows up at the next refresh.
    let mut c = env.dws(["event", "consume", "w.k"]).stdin_hold().spawn();
    let r = c.wait_ready();
    w.wait_stdout_line("a running report", T, |l| {
        l.starts_with("bus ") && l.contains(&format!("pid {}", r.bus_pid))
    });
    w.signal(Sig::SIGTERM);
    let out = w.wait_exit(EXIT_TIMEOUT);
    out.assert_code(0);
    assert!(out.stderr.is_empty(), "{out}");
    assert!(
        !out.stdout.contains('\x1b'),
        "plain lines when not a terminal\n{out}"
    );
    let headers = out.stdout.lines().filter(|l| l.starts_with("--- ")).count();
    assert!(headers >= 2, "one report per interval\n{out}");

    // JSON: one document per line, each a valid status; SIGINT ends it too.
    let mut w = env
        .dws([
            "event",
            "status",
            "--watch",
            "--interval",
            "100ms",
            "--format",
            "json",
        ])
        .spawn();
    let lines = w.wait_stdout_lines(3, T);
    w.signal(Sig::SIGINT);
    w.wait_exit(EXIT_TIMEOUT).assert_code(0);
    for l in lines {
        let doc = json_of(&l);
        assert_valid("status", &doc);
        assert_eq!(doc["bus"]["pid"], r.bus_pid, "{doc}");
    }
    env.dws(["event", "status", "--interval", "1s"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_error(2);
    env.dws(["event", "status", "--watch", "--interval", "10ms"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_error(2);
}

#[test]
fn status_watch_redraws_in_place_on_a_terminal() {
    let Some(script) = tool("script") else { return };
    let env = TestEnv::new();
    // script(1) gives dws a terminal; timeout(1) sends SIGINT after 1.5 s.
    let cmd = format!(
        "timeout -s INT --preserve-status 1.5 {} event status --watch --interval 200ms",
        dws_bin().display()
    );
    let out = env
        .command(script, ["-qec", &cmd, "/dev/null"])
        .run_with_timeout(T);
    out.assert_code(0);
    let redraws = out.stdout.matches("\x1b[H\x1b[2J").count();
    assert!(
        redraws >= 2,
        "clears and redraws each interval\n{out:?}",
        out = out.stdout
    );
    assert!(out.stdout.contains("bus not running"), "{out}");
}

#[test]
fn bus_log_as_json_lines() {
    let env = TestEnv::with_env(&[("DWS_BUS_LOG_FORMAT", "json")]);
    let mut c = env.dws(["event", "consume", "log.k"]).stdin_hold().spawn();
    c.wait_ready();
    env.publish("log.k", "x", &[]);
    c.signal(Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT);
    let log = std::fs::read_to_string(env.bus_log_path()).expect("bus.log");
    let lines: Vec<Value> = log.lines().map(json_of).collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            l["timestamp"].is_string() && l["level"].is_string() && l["fields"].is_object(),
            "a JSON log line: {l}"
        );
    }
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "bus ready"),
        "{log}"
    );

    // A value busd does not know is a configuration error (exit 2), said once.
    let bad = TestEnv::with_env(&[("DWS_BUS_LOG_FORMAT", "xml")]);
    let out = bad
        .dws(["event", "consume", "log.k", "--max-events", "1"])
        .run_with_timeout(EXIT_TIMEOUT);
    let err = out.assert_error(2);
    assert!(err.contains("xml"), "{out}");
}

// ------------------------------------------------------------------ examples

/// The example programs that can run here: (name, interpreter, script).
fn examples() -> Vec<(&'static str, PathBuf, PathBuf)> {
    let mut v = vec![(
        "python",
        python(),
        repo().join("examples/python/consume.py"),
    )];
    if let Some(node) = tool("node") {
        v.push(("node", node, repo().join("examples/node/consume.mjs")));
    }
    v
}

/// One example run: `ARGS` go to the example, then `--`, then `CONSUME`.
fn example(
    env: &TestEnv,
    (interp, script): (&PathBuf, &PathBuf),
    args: &[&str],
    consume: &[&str],
) -> Child {
    let mut all: Vec<String> = vec![
        script.to_string_lossy().into_owned(),
        "--dws".into(),
        dws_bin().to_string_lossy().into_owned(),
    ];
    all.extend(args.iter().map(|s| s.to_string()));
    all.push("--".into());
    all.extend(consume.iter().map(|s| s.to_string()));
    env.command(interp, all).spawn()
}

fn kind_is(line: &str, kind: &str) -> bool {
    serde_json::from_str::<Value>(line).is_ok_and(|v| v["kind"] == kind)
}

/// Waits for a `ready` record other than `previous` (the predicate is run
/// over every line again on each wake-up, so it cannot count).
fn wait_example_ready(c: &mut Child, previous: Option<&Value>) -> Value {
    let lines = c.wait_stdout_line("a (new) ready record", T, |l| {
        kind_is(l, "ready") && previous.is_none_or(|p| json_of(l) != *p)
    });
    json_of(lines.last().expect("the ready record"))
}

/// The example's records of one kind, after it exited.
fn records(out: &dws_tests::Output, kind: &str) -> Vec<Value> {
    out.stdout_lines()
        .into_iter()
        .filter(|l| kind_is(l, kind))
        .map(json_of)
        .collect()
}

fn last_result(out: &dws_tests::Output) -> Value {
    records(out, "result")
        .pop()
        .unwrap_or_else(|| panic!("no result record\n{out}"))
}

#[test]
fn examples_stream_until_the_limit_and_report_done() {
    for (name, interp, script) in examples() {
        let env = TestEnv::new();
        let mut c = example(
            &env,
            (&interp, &script),
            &[],
            &["ex.*", "--max-events", "2"],
        );
        let ready = wait_example_ready(&mut c, None);
        assert_eq!(ready["event_key"], "ex.*", "{name}: {ready}");
        env.publish("ex.a", "{\"n\":1}", &[]);
        env.publish("ex.b", "two", &[]);
        let out = c.wait_exit(T);
        out.assert_code(0);
        let events = records(&out, "event");
        assert_eq!(events.len(), 2, "{name}\n{out}");
        assert_eq!(events[0]["event_type"], "ex.a");
        assert_eq!(events[1]["data"], "two");
        let r = last_result(&out);
        assert_eq!(
            (
                &r["code"],
                &r["reason"],
                &r["action"],
                &r["reported_events"]
            ),
            (&json!(0), &json!("limit"), &json!("done"), &json!(2)),
            "{name}\n{out}"
        );
    }
}

#[test]
fn examples_stop_the_consumer_by_sigterm_and_by_closing_stdin() {
    for (name, interp, script) in examples() {
        for how in ["sigterm", "stdin"] {
            let env = TestEnv::new();
            let mut c = example(
                &env,
                (&interp, &script),
                &["--stop-after", "1", "--stop-with", how],
                &["ex.*"],
            );
            wait_example_ready(&mut c, None);
            env.publish("ex.a", "1", &[]);
            let out = c.wait_exit(T);
            out.assert_code(0);
            let r = last_result(&out);
            assert_eq!(
                (&r["code"], &r["reason"], &r["action"]),
                (&json!(0), &json!("signal"), &json!("stopped")),
                "{name} {how}\n{out}"
            );
            // A clean stop removed the run's own subscription.
            let st = env.status();
            assert_eq!(st["subscriptions"], json!([]), "{name} {how}: {st:#}");
        }
    }
}

#[test]
fn examples_map_timeout_usage_error_and_bus_shutdown() {
    for (name, interp, script) in examples() {
        let env = TestEnv::new();
        let out =
            example(&env, (&interp, &script), &[], &["ex.*", "--duration", "1s"]).wait_exit(T);
        let r = last_result(&out);
        assert_eq!(
            (&r["reason"], &r["action"]),
            (&json!("timeout"), &json!("done")),
            "{name}\n{out}"
        );

        let out = example(&env, (&interp, &script), &[], &["bad key!"]).wait_exit(T);
        out.assert_code(1);
        let r = last_result(&out);
        assert_eq!(
            (&r["code"], &r["action"]),
            (&json!(2), &json!("fix-usage")),
            "{name}\n{out}"
        );
        assert!(
            r["error"].as_str().is_some_and(|e| e.contains("bad key")),
            "{name}\n{out}"
        );
        assert!(
            records(&out, "ready").is_empty(),
            "no ready before a usage error"
        );

        let mut c = example(&env, (&interp, &script), &[], &["ex.*"]);
        wait_example_ready(&mut c, None);
        env.dws(["event", "stop"])
            .run_with_timeout(EXIT_TIMEOUT)
            .assert_code(0);
        let out = c.wait_exit(T);
        out.assert_code(1);
        let r = last_result(&out);
        assert_eq!(
            (&r["reason"], &r["lost_without_goodbye"], &r["action"]),
            (&json!("bus_shutdown"), &json!(false), &json!("restart")),
            "{name}\n{out}"
        );
    }
}

#[test]
fn examples_restart_after_a_crashed_bus_and_resume_their_subscription() {
    for (name, interp, script) in examples() {
        let env = TestEnv::new();
        env.dws(["event", "subscribe", "cr.*", "--id", "s1"])
            .run_with_timeout(EXIT_TIMEOUT)
            .assert_code(0);
        let mut c = example(
            &env,
            (&interp, &script),
            &["--restarts", "1"],
            &["--subscribe-id", "s1"],
        );
        let first = wait_example_ready(&mut c, None);
        env.publish("cr.a", "before", &[]);
        c.wait_stdout_line("the first event", T, |l| l.contains("\"before\""));
        for pid in env.busd_pids() {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Sig::SIGKILL)
                .expect("kill -9 busd");
        }
        // The example restarts the consumer, which starts a new bus.
        let second = wait_example_ready(&mut c, Some(&first));
        assert_ne!(first["bus_pid"], second["bus_pid"], "{name}");
        env.publish("cr.a", "after", &[]);
        c.wait_stdout_line("the event after the restart", T, |l| {
            l.contains("\"after\"")
        });
        c.signal(Sig::SIGTERM);
        let out = c.wait_exit(T);
        out.assert_code(0);
        let results = records(&out, "result");
        assert_eq!(results.len(), 2, "{name}\n{out}");
        assert_eq!(
            (
                &results[0]["reason"],
                &results[0]["lost_without_goodbye"],
                &results[0]["action"]
            ),
            (&json!("bus_shutdown"), &json!(true), &json!("restart")),
            "{name}\n{out}"
        );
        assert_eq!(
            (&results[1]["reason"], &results[1]["action"]),
            (&json!("signal"), &json!("stopped")),
            "{name}: SIGTERM to the example stops its consumer cleanly\n{out}"
        );
    }
}

#[test]
fn examples_raise_an_alert_when_the_source_is_lost() {
    for (name, interp, script) in examples() {
        let fake = FakeDingTalk::start();
        // Transient failures, so that the source is lost only after the
        // consumer attached (a first 401 would end it at once).
        fake.fail_next_opens(1000, 503, r#"{"code":"unavailable","message":"try later"}"#);
        let env = dingtalk_env(
            &fake.app_profile("max_attempts = 3\n"),
            &[
                ("DWS_DINGTALK_BACKOFF_MIN_MS", "1000"),
                ("DWS_DINGTALK_BACKOFF_MAX_MS", "2000"),
            ],
        );
        let out = example(&env, (&interp, &script), &[], &["*"]).wait_exit(T);
        out.assert_code(1);
        let r = last_result(&out);
        assert_eq!(
            (&r["code"], &r["reason"], &r["action"]),
            (&json!(0), &json!("source_lost"), &json!("alert")),
            "{name}\n{out}"
        );
        assert!(
            out.stderr.contains("[event] source lost"),
            "diagnostics are forwarded\n{out}"
        );
    }
}

#[test]
fn examples_ack_explicitly_and_stop_by_closing_stdin_after_the_last_ack() {
    for (name, interp, script) in examples() {
        let env = TestEnv::new();
        env.dws(["event", "subscribe", "ack.*", "--id", "s1"])
            .run_with_timeout(EXIT_TIMEOUT)
            .assert_code(0);
        let mut c = example(
            &env,
            (&interp, &script),
            &["--stop-after", "2", "--stop-with", "stdin"],
            &["--subscribe-id", "s1", "--ack", "explicit"],
        );
        wait_example_ready(&mut c, None);
        env.publish("ack.a", "1", &[]);
        env.publish("ack.a", "2", &[]);
        let out = c.wait_exit(T);
        out.assert_code(0);
        let r = last_result(&out);
        assert_eq!(
            (&r["reason"], &r["action"]),
            (&json!("signal"), &json!("stopped")),
            "{name}\n{out}"
        );
        let s1 = listed(&env.status(), "s1");
        assert_eq!(
            (&s1["acked"], &s1["pending"]),
            (&json!(2), &json!(0)),
            "{name}: both acks reached the bus before the EOF: {s1:#}"
        );
    }
}

#[test]
fn examples_nack_a_failing_event_until_the_subscription_halts() {
    for (name, interp, script) in examples() {
        let env = TestEnv::new();
        env.dws([
            "event",
            "subscribe",
            "poi.*",
            "--id",
            "s2",
            "--max-deliver",
            "2",
        ])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
        let mut c = example(
            &env,
            (&interp, &script),
            &["--fail-on", "bad"],
            &["--subscribe-id", "s2", "--ack", "explicit"],
        );
        wait_example_ready(&mut c, None);
        env.publish("poi.a", "bad", &[]);
        let out = c.wait_exit(T);
        out.assert_code(1);
        let events = records(&out, "event");
        assert!(
            events.len() >= 2 && events.iter().all(|e| e["handled"] == false),
            "{name}: nacked and delivered again\n{out}"
        );
        let r = last_result(&out);
        assert_eq!(
            (&r["code"], &r["reason"], &r["action"]),
            (&json!(0), &json!("halted"), &json!("inspect-poison")),
            "{name}\n{out}"
        );
        assert_eq!(listed(&env.status(), "s2")["state"], "halted", "{name}");

        // What an operator does next; each verb's JSON matches its schema.
        let verb = |args: &[&str]| {
            let mut all = vec!["event", "subscription"];
            all.extend_from_slice(args);
            all.extend_from_slice(&["--format", "json"]);
            let doc = dws_json(&env, &all);
            assert_valid("subscription", &doc);
            doc
        };
        let shown = verb(&["parked", "s2"]);
        assert_eq!(shown["state"], "halted", "{name}: {shown}");
        assert!(shown["halted"]["seq"].is_u64(), "{name}: {shown}");
        let dry = verb(&["skip", "s2", "--dry-run"]);
        assert_eq!(
            (&dry["dry_run"], &dry["state"]),
            (&json!(true), &json!("active")),
            "{dry}"
        );
        let skipped = verb(&["skip", "s2"]);
        assert!(skipped["skipped_seq"].is_u64(), "{skipped}");
        let parked = verb(&["parked", "s2"]);
        assert_eq!(
            parked["parked_events"].as_array().map(Vec::len),
            Some(1),
            "{parked}"
        );
        verb(&["disable", "s2"]);
        verb(&["enable", "s2"]);
        let replay = verb(&["replay-parked", "s2"]);
        assert_eq!(replay["replayed"], 1, "{replay}");
        let seek = verb(&["seek", "s2", "--to", "earliest"]);
        assert!(seek["seek"]["from_seq"].is_u64(), "{seek}");
        // The seek offered the event again: pending once, parked nowhere.
        assert_eq!(
            (&seek["pending"], &seek["parked"]),
            (&json!(1), &json!(0)),
            "{seek}"
        );
    }
}

#[test]
fn examples_keep_a_slow_event_alive_with_progress_and_term_a_hopeless_one() {
    for (name, interp, script) in examples() {
        let env = TestEnv::new();
        env.dws(["event", "subscribe", "slow.*", "--id", "s3"])
            .run_with_timeout(EXIT_TIMEOUT)
            .assert_code(0);
        // Three ack waits of work on "big", progress every 200 ms.
        let mut c = example(
            &env,
            (&interp, &script),
            &[
                "--slow-on",
                "big",
                "--work",
                "3",
                "--progress-every",
                "0.2",
                "--term-on",
                "never",
                "--stop-after",
                "2",
                "--stop-with",
                "stdin",
            ],
            &[
                "--subscribe-id",
                "s3",
                "--ack",
                "explicit",
                "--ack-wait",
                "1s",
            ],
        );
        wait_example_ready(&mut c, None);
        env.publish("slow.a", "big", &[]);
        env.publish("slow.a", "never", &[]);
        let out = c.wait_exit(T);
        out.assert_code(0);
        let events = records(&out, "event");
        assert_eq!(events.len(), 2, "{name}: nothing delivered twice\n{out}");
        assert_eq!(
            (&events[0]["handled"], &events[0]["delivery"]),
            (&json!(true), &json!(1)),
            "{name}\n{out}"
        );
        assert!(
            events[0]["progress"].as_u64().unwrap_or(0) >= 1,
            "{name}: progress sent while working\n{out}"
        );
        assert_eq!(events[1]["termed"], true, "{name}\n{out}");
        let st = env.status();
        let s3 = listed(&st, "s3");
        assert_eq!(
            (
                &s3["acked"],
                &s3["parked"],
                &s3["redelivered"],
                &s3["pending"]
            ),
            (&json!(1), &json!(1), &json!(0), &json!(0)),
            "{name}: {s3:#}"
        );
        let parked = dws_json(
            &env,
            &["event", "subscription", "parked", "s3", "--format", "json"],
        );
        assert_valid("subscription", &parked);
        assert_eq!(
            parked["parked_events"][0]["reason"], "demo handler: \"never\" can never succeed",
            "{name}: {parked:#}"
        );
    }
}

/// The status row of subscription `id`.
fn listed(st: &Value, id: &str) -> Value {
    st["subscriptions"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["id"] == id))
        .unwrap_or_else(|| panic!("{id} listed: {st:#}"))
        .clone()
}
