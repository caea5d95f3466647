//! The bus's durable state and settings are not trusted blindly: a
//! `subscriptions.json` this build cannot restore as it was saved is refused
//! at start (named, left as it is); a FIFO (or any non-regular file) where
//! `config.toml`, a secret file or a store file should be is refused at once
//! instead of hanging the bus; durations too long for the clock are refused;
//! a `config.toml` that is not UTF-8 is a configuration error; a named
//! subscription lives until removed unless it asked for a TTL, and a TTL
//! removal shows in status and `bus.log`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use dws_tests::common::*;
use dws_tests::{Output, Sig, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

/// Longer than any wait of a refused start: a hang would pass it.
const REFUSED_WITHIN: Duration = Duration::from_secs(8);
/// A duration humantime parses (it fits in u64 seconds) that no `Instant`
/// can be moved by (over i64 seconds, ~292 billion years).
const HUGE: &str = "50000000000d";
/// The highest seq a bus assigns: 2^63 − 1.
const MAX_SEQ: u64 = i64::MAX as u64;

fn store_dir(env: &TestEnv) -> PathBuf {
    env.work_dir().join("store")
}

fn subs_file(env: &TestEnv) -> PathBuf {
    store_dir(env).join("subscriptions.json")
}

fn stop_bus(env: &TestEnv) {
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after `dws event stop`");
}

fn write_config(env: &TestEnv, body: &[u8]) {
    env.write_private("config.toml", body);
}

fn mkfifo(p: &Path) {
    let _ = std::fs::remove_file(p);
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
}

/// A bus with one named subscription `s1` on `st.k` and three events,
/// stopped cleanly: its store holds `FORMAT`, one segment and
/// `subscriptions.json`.
fn stopped_store() -> TestEnv {
    let env = TestEnv::new();
    subscribe_ok(&env, &["st.k", "--id", "s1"], "s1");
    for i in 0..3 {
        env.publish("st.k", &format!("{{\"n\":{i}}}"), &[]);
    }
    stop_bus(&env);
    env
}

/// Edits `subscriptions.json` as JSON and writes it back.
fn edit_subs(env: &TestEnv, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let path = subs_file(env);
    let mut v: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read subscriptions.json"))
            .expect("subscriptions.json is JSON");
    edit(&mut v);
    let bytes = serde_json::to_vec_pretty(&v).expect("encode");
    std::fs::write(&path, &bytes).expect("write subscriptions.json");
    bytes
}

/// `dws event publish st.k x`, which starts the bus; returns its output
/// and how long it took.
fn publish(env: &TestEnv) -> (Output, Duration) {
    let t = Instant::now();
    let out = env
        .dws(["event", "publish", "st.k", "{}"])
        .run_with_timeout(EXIT_TIMEOUT);
    (out, t.elapsed())
}

/// A start refused with `code`, at once, naming `needles`; no bus left.
fn assert_refused(env: &TestEnv, code: i32, needles: &[&str]) -> String {
    let (out, took) = publish(env);
    let err = out.assert_error(code);
    assert!(
        err.starts_with("Error: cannot start the bus: "),
        "a refused start says so\n{out}"
    );
    for n in needles {
        assert!(err.contains(n), "the error names {n:?}\n{out}");
    }
    assert!(
        took < REFUSED_WITHIN,
        "refused at once, not after a hang ({took:?})\n{out}"
    );
    env.wait_no_busd(EXIT_TIMEOUT, "no busd after a refused start");
    err
}

// ---------------------------------------------------- subscriptions.json

#[test]
fn a_head_seq_no_seq_can_follow_refuses_to_start_and_the_file_is_kept() {
    let env = stopped_store();
    let bytes = edit_subs(&env, |v| v["head_seq"] = u64::MAX.into());
    for _ in 0..2 {
        assert_refused(
            &env,
            1,
            &[
                "subscriptions.json",
                "head_seq 18446744073709551615",
                "9223372036854775807",
            ],
        );
        assert_eq!(
            std::fs::read(subs_file(&env)).unwrap(),
            bytes,
            "left as it is"
        );
    }
}

#[test]
fn a_cursor_beyond_the_head_refuses_to_start_naming_the_subscription() {
    let env = stopped_store();
    let bytes = edit_subs(&env, |v| v["subscriptions"][0]["cursor"] = 1000.into());
    let err = assert_refused(
        &env,
        1,
        &["subscriptions.json", "subscription s1", "cursor 1000"],
    );
    assert!(err.contains("beyond head_seq 3"), "{err}");
    assert_eq!(
        std::fs::read(subs_file(&env)).unwrap(),
        bytes,
        "left as it is"
    );
}

/// A subscription whose pattern this build refuses (as after a downgrade)
/// is neither dropped at start nor erased by the next save.
#[test]
fn a_pattern_this_build_refuses_is_never_dropped_or_rewritten_away() {
    let env = stopped_store();
    let bytes = edit_subs(&env, |v| {
        v["subscriptions"][0]["patterns"] = serde_json::json!(["st.*.k"])
    });
    assert_refused(
        &env,
        1,
        &["subscriptions.json", "subscription s1", "st.*.k"],
    );
    assert_eq!(
        std::fs::read(subs_file(&env)).unwrap(),
        bytes,
        "left as it is"
    );
    let st = env
        .dws(["event", "status", "--format", "json"])
        .run_with_timeout(EXIT_TIMEOUT);
    assert_eq!(
        std::fs::read(subs_file(&env)).unwrap(),
        bytes,
        "status does not start a bus over it either\n{st}"
    );
}

/// A key an older build accepted and this one refuses for a new
/// subscription (an empty segment) is restored as it was stored: a start
/// is never refused over it.
#[test]
fn a_key_an_older_build_stored_is_restored_though_new_ones_are_refused() {
    let env = stopped_store();
    edit_subs(&env, |v| {
        v["subscriptions"][0]["patterns"] = serde_json::json!(["st..k", "st.k"])
    });
    let (out, _) = publish(&env);
    out.assert_code(0);
    let st = env.status();
    assert_eq!(
        dws_tests::common::listed(&st, "s1")["patterns"],
        serde_json::json!(["st..k", "st.k"]),
        "{st:#}"
    );
    // A new subscription with such a key is still refused.
    let out = env
        .dws(["event", "subscribe", "st..k", "--id", "s2"])
        .run_with_timeout(EXIT_TIMEOUT);
    assert!(out.assert_error(2).contains("empty segment"), "{out}");
}

/// At the highest seq, publishes are refused with the reason: a seq is
/// never reused; the bus keeps serving everything else.
#[test]
fn at_the_last_seq_a_publish_is_refused_and_no_seq_wraps() {
    let env = stopped_store();
    edit_subs(&env, |v| {
        v["head_seq"] = MAX_SEQ.into();
        v["subscriptions"][0]["cursor"] = MAX_SEQ.into();
        v["subscriptions"][0]["max_sent_seq"] = MAX_SEQ.into();
    });
    let (out, _) = publish(&env);
    let err = out.assert_error(1);
    assert!(
        err.contains("every seq") && err.contains("9223372036854775807"),
        "{out}"
    );
    let st = env.status();
    assert_eq!(listed(&st, "s1")["head_seq"], MAX_SEQ, "{st:#}");
    assert_eq!(st["log"]["head_seq"], MAX_SEQ, "{st:#}");
}

// ------------------------------------------------------------------ FIFOs

#[test]
fn a_fifo_as_a_store_file_is_refused_at_once() {
    for name in [
        "subscriptions.json",
        "FORMAT",
        "log-00000000000000000001.seg",
    ] {
        let env = stopped_store();
        let path = store_dir(&env).join(name);
        assert!(path.exists(), "{name} is in the store");
        mkfifo(&path);
        assert_refused(&env, 1, &[name, "a FIFO"]);
    }
}

#[test]
fn a_fifo_as_config_toml_is_refused_at_once() {
    let env = TestEnv::new();
    mkfifo(&env.cfg_dir().join("config.toml"));
    assert_refused(&env, 2, &["config.toml", "a FIFO"]);
}

#[test]
fn a_fifo_as_a_secret_file_is_refused_at_once() {
    let env = TestEnv::new();
    write_config(
        &env,
        b"[profiles.default]\nsource = \"dingtalk\"\nclient_id = \"i\"\nclient_secret_file = \"app.secret\"\n",
    );
    mkfifo(&env.cfg_dir().join("app.secret"));
    assert_refused(&env, 3, &["app.secret", "a FIFO"]);
}

// ------------------------------------------------------ settings

#[test]
fn a_config_toml_that_is_not_utf8_is_a_configuration_error() {
    let env = TestEnv::new();
    write_config(&env, b"[profiles.default]\nsource = \"local\"\n# caf\xe9\n");
    assert_refused(&env, 2, &["config.toml", "not UTF-8"]);
}

#[test]
fn durations_too_long_for_the_clock_are_refused_with_the_reason() {
    for var in ["DWS_EVENT_BUS_DEFAULT_TTL", "DWS_EVENT_BUS_IDLE_TIMEOUT"] {
        let env = TestEnv::with_env(&[(var, HUGE)]);
        assert_refused(&env, 2, &[HUGE, "100 years"]);
    }
    let env = TestEnv::new();
    write_config(
        &env,
        format!(
            "[profiles.default]\nsource = \"exec\"\ncommand = [\"sleep\", \"60\"]\nrestart_min = \"{HUGE}\"\n"
        )
        .as_bytes(),
    );
    assert_refused(&env, 2, &["restart_min", "100 years"]);
    let env = TestEnv::new();
    for args in [
        &["event", "subscribe", "st.k", "--ttl", HUGE][..],
        &["event", "consume", "st.k", "--duration", HUGE][..],
    ] {
        let out = env.dws(args).run_with_timeout(EXIT_TIMEOUT);
        let err = out.assert_error(2);
        assert!(err.contains("100 years"), "{out}");
    }
}

// ------------------------------------------------------------------ TTL

/// With the bus default TTL at 1 s: a run's own subscription (its consumer
/// killed -9) lingers 1 s and goes; one created by `subscribe` without a
/// TTL or with `--ttl never` stays; one with `--ttl 1s` goes. Each removal
/// is in status (`bus.expired`) and in `bus.log`.
#[test]
fn named_subscriptions_live_until_removed_unless_they_asked_for_a_ttl() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_DEFAULT_TTL", "1s")]);
    subscribe_ok(&env, &["ttl.k", "--id", "kept"], "kept");
    subscribe_ok(&env, &["ttl.k", "--id", "never", "--ttl", "never"], "never");
    env.publish("ttl.k", "{}", &[]);
    // Created after the event, from the start of the log: it holds the
    // event from its first moment, however slow this machine is.
    subscribe_ok(
        &env,
        &[
            "ttl.k", "--id", "short", "--ttl", "1s", "--from", "earliest",
        ],
        "short",
    );
    let mut c = env.dws(["event", "consume", "ttl.k"]).spawn();
    let owned = c.wait_ready().subscribe_id;
    c.signal(Sig::SIGKILL);
    let _ = c.wait_exit(EXIT_TIMEOUT);
    let st = env.wait_status(
        Duration::from_secs(20),
        "both short TTLs to run out",
        |st| sub(st, "short").is_none() && sub(st, &owned).is_none(),
    );
    for id in ["kept", "never"] {
        let s = listed(&st, id);
        assert_eq!(s["ttl_ms"], Value::Null, "{id} lives until removed\n{st:#}");
        assert_eq!(s["expires_at_unix_ms"], Value::Null, "{st:#}");
        assert_eq!(s["pending"], 1, "its backlog is kept\n{st:#}");
    }
    let expired = &st["bus"]["expired"];
    assert_eq!(expired["total"], 2, "{st:#}");
    let recent = expired["recent"].as_array().expect("recent is a list");
    let short = recent
        .iter()
        .find(|e| e["id"] == "short")
        .expect("short listed");
    assert_eq!(
        (short["owned"].clone(), short["ttl_ms"].clone()),
        (false.into(), 1000.into())
    );
    assert_eq!(short["pending"], 1, "{st:#}");
    let run = recent
        .iter()
        .find(|e| e["id"] == owned.as_str())
        .expect("the run's listed");
    assert_eq!(run["owned"], true, "{st:#}");
    crate::ecosystem::assert_valid("status", &st);
    let text = env.dws(["event", "status"]).run_with_timeout(EXIT_TIMEOUT);
    text.assert_code(0);
    assert!(
        text.stdout.contains("2 removed by their ttl (last "),
        "text status counts the removals\n{text}"
    );
    let kept = text
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("kept "));
    assert!(
        kept.is_some_and(|l| l.contains(" never ")),
        "text status shows `never` under EXPIRES\n{text}"
    );
    let log = env.bus_log_tail();
    assert!(
        log.lines()
            .any(|l| l.contains("subscription expired (ttl)") && l.contains("short")),
        "bus.log names the removal\n{log}"
    );
}
