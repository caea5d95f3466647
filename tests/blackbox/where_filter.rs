//! `--where EXPR` : a jq expression on the event's line, run by
//! the bus. Matching on the line's fields and on `data` parsed, several
//! expressions ANDed, the README's examples on the personal stream's
//! message shape; refusal before any side effect (exit 2 with the column);
//! the step bound and errors counted in `where_errors` without stopping
//! anyone; a named subscription's expressions across a restart; re-attach
//! with other expressions refused like other keys; a cluster definition
//! carrying them to another host.

use dws_tests::common::*;
use dws_tests::{pg::PgServer, Output, TestEnv, EXIT_TIMEOUT};
use serde_json::{json, Value};

/// `dws event consume ARGS…` run to completion.
fn consume(env: &TestEnv, args: &[&str]) -> Output {
    let mut a = vec!["event", "consume"];
    a.extend_from_slice(args);
    env.dws(&a).run_with_timeout(EXIT_TIMEOUT)
}

/// `dws event subscribe ARGS…` run to completion.
fn subscribe(env: &TestEnv, args: &[&str]) -> Output {
    let mut a = vec!["event", "subscribe"];
    a.extend_from_slice(args);
    env.dws(&a).run_with_timeout(EXIT_TIMEOUT)
}

/// A personal-stream IM message as the reference CLI's filter fields name
/// it (`payload.body.openConversationId`, `.content`, `.sender`).
fn im(conversation: &str, sender: &str, content: &str) -> String {
    json!({"payload": {"body": {
        "openConversationId": conversation,
        "sender": sender,
        "content": content,
    }}})
    .to_string()
}

fn publish_all(env: &TestEnv, event_type: &str, items: &[(&str, String)]) {
    for (id, data) in items {
        let p = env.publish(event_type, data, &["--id", id]);
        assert_eq!(p["duplicate"], false, "{p}");
    }
}

/// The ids a `--from earliest --max-events n` run with `args` receives.
fn ids_received(env: &TestEnv, key: &str, n: usize, args: &[&str]) -> Vec<String> {
    let n_s = n.to_string();
    let mut a = vec![key, "--from", "earliest", "--max-events", n_s.as_str()];
    a.extend_from_slice(args);
    let out = consume(env, &a);
    out.assert_clean_exit("limit", n as u64);
    ids_of(&out.json_lines())
}

#[test]
fn where_selects_on_the_line_and_on_parsed_data_and_several_are_anded() {
    let env = TestEnv::new();
    // The personal stream's message shape under a local key (a personal key
    // would ask for an upstream subscription the local source does not have).
    let key = "im.message";
    publish_all(
        &env,
        key,
        &[
            ("m1", im("cid-a", "alice", "hello @Bob")),
            ("m2", im("cid-b", "bob", "deploy now @Bob")),
            ("m3", im("cid-c", "carol", "lunch?")),
            ("m4", im("cid-a", "bob", "my own note")),
            ("x5", "not json at all".to_owned()),
            ("m6", im("cid-b", "alice", "ping @Bob")),
        ],
    );
    // The README's three examples.
    let conv = r#".data.payload.body.openConversationId | . == "cid-a" or . == "cid-b""#;
    let mention = r#".data.payload.body.content | test("@Bob\\b")"#;
    let not_mine = r#".data.payload.body.sender != "bob""#;
    assert_eq!(
        ids_received(&env, key, 4, &["--where", conv]),
        ["m1", "m2", "m4", "m6"]
    );
    assert_eq!(
        ids_received(&env, key, 3, &["--where", mention]),
        ["m1", "m2", "m6"]
    );
    // Data that is not JSON is a string: `.payload` of it raises, which is
    // no match (x5 is counted in where_errors, not delivered).
    assert_eq!(
        ids_received(&env, key, 3, &["--where", not_mine]),
        ["m1", "m3", "m6"]
    );
    // ANDed: in the two conversations, mentioning Bob, not from Bob.
    assert_eq!(
        ids_received(
            &env,
            key,
            2,
            &["--where", conv, "--where", mention, "--where", not_mine]
        ),
        ["m1", "m6"]
    );
    // The line's own fields: event id, seq, type; data that is not JSON
    // stays a string.
    assert_eq!(
        ids_received(
            &env,
            key,
            1,
            &[
                "--where",
                r#".event_id | startswith("x")"#,
                "--where",
                ".seq > 1"
            ]
        ),
        ["x5"]
    );
    assert_eq!(
        ids_received(&env, key, 1, &["--where", r#".data == "not json at all""#]),
        ["x5"]
    );
    assert_eq!(
        ids_received(
            &env,
            "*",
            6,
            &[
                "--where",
                r#".type == "event" and (.event_type | startswith("im."))"#
            ]
        ),
        ["m1", "m2", "m3", "m4", "x5", "m6"]
    );
}

#[test]
fn where_sees_the_headers_of_an_exec_event() {
    let env = TestEnv::new();
    let feed = env.root().join("feed.sh");
    std::fs::write(
        &feed,
        "echo '{\"event_type\":\"x.h\",\"event_id\":\"h-1\",\"headers\":{\"h1\":\"drop\"}}'\n\
         echo '{\"event_type\":\"x.h\",\"event_id\":\"h-2\",\"headers\":{\"h1\":\"keep\"}}'\n\
         exec sleep 3600\n",
    )
    .expect("write feed.sh");
    // The bus this consumer spawns inherits the source settings.
    let out = env
        .dws([
            "event",
            "consume",
            "x.*",
            "--from",
            "earliest",
            "--max-events",
            "1",
            "--where",
            r#".headers.h1 == "keep""#,
        ])
        .env("DWS_EVENT_SOURCE", "exec")
        .env("DWS_EVENT_BUS_STORE", "memory")
        .env("DWS_EXEC_COMMAND", format!("sh {}", feed.display()))
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 1);
    let lines = out.json_lines();
    assert_eq!(ids_of(&lines), ["h-2"], "{out}");
    assert_eq!(lines[0]["headers"]["h1"], "keep", "{out}");
}

#[test]
fn a_bad_where_is_exit_2_with_its_column_before_any_side_effect() {
    for (args, says) in [
        (
            &["event", "consume", "k", "--where", ".data.x =="][..],
            "column 11",
        ),
        (
            &["event", "consume", "k", "--where", ".a | (.b"],
            "closing parenthesis",
        ),
        (
            &["event", "consume", "k", "--where", ".a | nosuchfn(1)"],
            "column 6",
        ),
        (
            &["event", "consume", "k", "--where", "def f: f; f"],
            "`def` is not allowed",
        ),
        (
            &["event", "consume", "k", "--where", "last(range(1e9))"],
            "`range` is not allowed",
        ),
        (
            &["event", "consume", "k", "--where", "$ENV.HOME"],
            "$ENV is not allowed",
        ),
        (
            &[
                "event",
                "subscribe",
                "k",
                "--id",
                "s",
                "--where",
                "true",
                "--where",
                "reduce .[] as $x (0; 1)",
            ],
            "`reduce` is not allowed",
        ),
        (
            &[
                "event",
                "subscribe",
                "k",
                "--id",
                "s",
                "--where",
                r#""x" * 1000000000000"#,
            ],
            "`*` is not allowed",
        ),
    ] {
        let env = TestEnv::new();
        let out = env.dws(args).run_with_timeout(EXIT_TIMEOUT);
        let err = out.assert_error(2);
        assert!(err.contains(says), "{says:?} in the error\n{out}");
        assert!(err.contains("--where"), "{out}");
        assert_eq!(out.stdout, "", "{out}");
        assert!(
            env.busd_pids().is_empty(),
            "a usage error starts no bus\n{out}"
        );
        assert!(env.bus_meta().is_none(), "{out}");
    }
    let env = TestEnv::new();
    let long = format!(".data == \"{}\"", "a".repeat(2000));
    let out = env
        .dws(["event", "consume", "k", "--where", long.as_str()])
        .run_with_timeout(EXIT_TIMEOUT);
    let err = out.assert_error(2);
    assert!(err.contains("the most is 1024") && err.len() < 400, "{out}");
    assert!(env.busd_pids().is_empty(), "{out}");
}

#[test]
fn an_event_past_the_step_bound_or_raising_is_no_match_counted_in_where_errors() {
    let env = TestEnv::new();
    // A cartesian product over data.a: cheap for a short array, past the
    // step bound for a long one; `.data.n + 1` raises on a string.
    let heavy = ".data.a[]? as $x | .data.a[]? as $y | empty";
    subscribe_ok(&env, &["wb.*", "--id", "heavy", "--where", heavy], "heavy");
    subscribe_ok(
        &env,
        &["wb.*", "--id", "raises", "--where", ".data.n + 1 > 2"],
        "raises",
    );
    subscribe_ok(&env, &["wb.*", "--id", "all"], "all");
    let long: Vec<u32> = (0..400).collect();
    publish_all(
        &env,
        "wb.x",
        &[
            ("short", json!({"a": [1, 2], "n": 5}).to_string()),
            ("long", json!({"a": long, "n": "five"}).to_string()),
            ("plain", json!({"n": 7}).to_string()),
        ],
    );
    // The filters judge apart from the bus: wait until they did.
    let st = env.wait_status(EXIT_TIMEOUT, "the fan-out of three events", |st| {
        listed(st, "all")["matched"] == 3
            && ["heavy", "raises"]
                .iter()
                .all(|id| listed(st, id)["where_waiting"] == 0)
    });
    let heavy_s = listed(&st, "heavy");
    assert_eq!(heavy_s["where"], json!([heavy]), "{st:#}");
    assert_eq!(heavy_s["matched"], 0, "`empty` never matches\n{st:#}");
    assert_eq!(
        heavy_s["where_errors"], 1,
        "only the long array passed the bound\n{st:#}"
    );
    let raises = listed(&st, "raises");
    assert_eq!(raises["matched"], 2, "short and plain\n{st:#}");
    assert_eq!(raises["where_errors"], 1, "\"five\" + 1 raised\n{st:#}");
    assert_eq!(listed(&st, "all")["where_errors"], 0, "{st:#}");
    assert_eq!(listed(&st, "all")["where"], json!([]), "{st:#}");

    let out = consume(&env, &["--subscribe-id", "raises", "--max-events", "2"]);
    out.assert_clean_exit("limit", 2);
    assert_eq!(ids_of(&out.json_lines()), ["short", "plain"], "{out}");
    // The bus and the other subscription went on.
    let out = consume(&env, &["--subscribe-id", "all", "--max-events", "3"]);
    out.assert_clean_exit("limit", 3);
    assert_eq!(
        ids_of(&out.json_lines()),
        ["short", "long", "plain"],
        "{out}"
    );
}

#[test]
fn a_named_subscriptions_where_survives_a_restart_and_still_filters() {
    let env = TestEnv::new();
    let w = r#".data.keep == true"#;
    subscribe_ok(
        &env,
        &["wr.*", "--id", "kept", "--where", w, "--ttl", "1h"],
        "kept",
    );
    publish_all(
        &env,
        "wr.x",
        &[
            ("k1", json!({"keep": true}).to_string()),
            ("d1", json!({"keep": false}).to_string()),
        ],
    );
    let before = env.wait_status(EXIT_TIMEOUT, "k1 matched", |st| {
        listed(st, "kept")["matched"] == 1
    });
    assert_eq!(listed(&before, "kept")["where"], json!([w]), "{before:#}");
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after `dws event stop`");

    // This publish starts the new bus.
    publish_all(
        &env,
        "wr.x",
        &[
            ("d2", json!({"keep": "yes"}).to_string()),
            ("k2", json!({"keep": true}).to_string()),
        ],
    );
    let after = env.status();
    let kept = listed(&after, "kept");
    assert_eq!(kept["where"], json!([w]), "{after:#}");
    assert_eq!(kept["patterns"], json!(["wr.*"]), "{after:#}");
    let out = consume(&env, &["--subscribe-id", "kept", "--max-events", "2"]);
    out.assert_clean_exit("limit", 2);
    assert_eq!(ids_of(&out.json_lines()), ["k1", "k2"], "{out}");
}

#[test]
fn re_attaching_with_other_where_expressions_is_refused_like_other_keys() {
    let env = TestEnv::new();
    let (a, b) = (r#".data.n > 1"#, r#".data.m == "x""#);
    subscribe_ok(
        &env,
        &["ra.*", "--id", "s", "--where", a, "--where", b],
        "s",
    );
    // The same expressions in another order: the same spec, a no-op.
    let again = subscribe(
        &env,
        &[
            "ra.*", "--id", "s", "--where", b, "--where", a, "--format", "json",
        ],
    );
    again.assert_code(0);
    let v: Value = serde_json::from_str(&again.stdout).unwrap_or_else(|e| panic!("{e}\n{again}"));
    assert_eq!(v["created"], false, "{again}");
    assert_eq!(v["where"], json!([a, b]), "{again}");
    for args in [
        &["ra.*", "--id", "s", "--where", a][..],
        &["ra.*", "--id", "s"][..],
        &[
            "ra.*",
            "--id",
            "s",
            "--where",
            a,
            "--where",
            ".data.m == \"y\"",
        ][..],
    ] {
        let out = subscribe(&env, args);
        let err = out.assert_error(2);
        assert!(
            err.contains("subscription s exists with event keys ra.*"),
            "{out}"
        );
        assert!(err.contains("--where"), "{out}");
    }
    // consume --subscribe-id with the keys compares the expressions too.
    let out = consume(
        &env,
        &[
            "ra.*",
            "--subscribe-id",
            "s",
            "--where",
            a,
            "--max-events",
            "1",
        ],
    );
    let err = out.assert_error(2);
    assert!(err.contains("--where"), "{out}");
    // Without the keys it cannot compare: refused before the bus is asked.
    let out = consume(
        &env,
        &["--subscribe-id", "s", "--where", a, "--max-events", "1"],
    );
    let err = out.assert_error(2);
    assert!(err.contains("needs the EVENT_KEYs"), "{out}");
    let st = env.status();
    assert_eq!(
        listed(&st, "s")["where"],
        json!([a, b]),
        "unchanged\n{st:#}"
    );
}

#[test]
fn a_cluster_definition_carries_where_to_another_host() {
    let server = PgServer::start();
    let a = cluster_host(&server, "host-a");
    let b = cluster_host(&server, "host-b");
    a.publish("cw.x", "{}", &[]);
    let w = r#".data.to == "b""#;
    a.subscribe(&["cw.*", "--id", "team", "--where", w]);
    wait_subscription_known(&b, "team");
    let st = b.status();
    assert_eq!(
        listed(&st, "team")["where"],
        json!([w]),
        "adopted with its expression\n{st:#}"
    );
    // Defining it again on b with another expression is refused.
    let out = subscribe(
        &b,
        &["cw.*", "--id", "team", "--where", ".data.to == \"c\""],
    );
    let err = out.assert_error(2);
    assert!(err.contains("--where"), "{out}");
    publish_all(
        &b,
        "cw.x",
        &[
            ("n1", json!({"to": "a"}).to_string()),
            ("n2", json!({"to": "b"}).to_string()),
        ],
    );
    let out = consume(&b, &["--subscribe-id", "team", "--max-events", "1"]);
    out.assert_clean_exit("limit", 1);
    assert_eq!(ids_of(&out.json_lines()), ["n2"], "{out}");
}
