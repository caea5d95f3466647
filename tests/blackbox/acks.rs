//! At-least-once processing: `--ack explicit` (stdin `ack`/`ack-upto`/`nack`),
//! the ack wait, delivery counts, poison events (`halt`, `park`) and the
//! operator verbs of `dws event subscription`, also across a bus restart.

use std::time::Duration;

use dws_tests::{common::listed, Child, Output, Sig, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(30);

/// A consumer of `s1` with explicit acks, stdin a pipe the test writes.
pub(crate) fn explicit(env: &TestEnv, extra: &[&str]) -> Child {
    let mut a = vec![
        "event",
        "consume",
        "--subscribe-id",
        "s1",
        "--ack",
        "explicit",
    ];
    a.extend_from_slice(extra);
    let mut c = env.dws(&a).stdin_pipe().spawn();
    c.wait_ready();
    c
}

fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// The n-th stdout line (1-based) once it is there, as JSON.
fn event_line(c: &mut Child, n: usize) -> Value {
    let lines = c.wait_stdout_lines(n, LONG);
    json(&lines[n - 1])
}

fn publish_n(env: &TestEnv, n: usize) {
    for i in 1..=n {
        env.publish(
            "k.e",
            &format!("{{\"n\":{i}}}"),
            &["--id", &format!("e{i}")],
        );
    }
}

fn verb(env: &TestEnv, args: &[&str]) -> Output {
    let mut a = vec!["event", "subscription"];
    a.extend_from_slice(args);
    env.dws(&a).run_with_timeout(EXIT_TIMEOUT)
}

fn verb_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend_from_slice(&["--format", "json"]);
    let out = verb(env, &a);
    out.assert_code(0);
    json(out.stdout.trim())
}

fn stop_term(c: Child) -> Output {
    c.signal(Sig::SIGTERM);
    c.wait_exit(LONG)
}

#[test]
fn explicit_acks_out_of_order_leave_exactly_the_unacked_event_pending() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1"]);
    publish_n(&env, 3);
    let mut c = explicit(&env, &[]);
    for n in 1..=3 {
        let e = event_line(&mut c, n);
        assert_eq!(e["seq"], n as u64);
        assert_eq!(e["delivery"], 1, "{e}");
        assert_eq!(e["redelivered"], false);
    }
    c.write_stdin(b"ack 3\nack 1\n");
    let st = env.wait_status(LONG, "two acks", |st| listed(st, "s1")["acked"] == 2);
    assert_eq!(listed(&st, "s1")["cursor"], 1, "{st:#}");
    let out = stop_term(c);
    out.assert_clean_exit("signal", 3);
    let st = env.status();
    assert_eq!(listed(&st, "s1")["pending"], 1, "{st:#}");
    // The unacked one comes again, marked, counted.
    let mut again = explicit(&env, &[]);
    let e = event_line(&mut again, 1);
    assert_eq!(
        (e["seq"].as_u64(), e["delivery"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(e["redelivered"], true);
    again.write_stdin(b"ack-upto 2\n");
    env.wait_status(LONG, "all acked", |st| listed(st, "s1")["pending"] == 0);
    stop_term(again).assert_clean_exit("signal", 1);
}

#[test]
fn a_nack_and_the_ack_wait_deliver_again_and_garbage_on_stdin_changes_nothing() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1"]);
    publish_n(&env, 2);
    let mut c = explicit(&env, &["--ack-wait", "1s"]);
    event_line(&mut c, 2);
    c.write_stdin(b"hello\nack nine\nack 99\nnack 1 200ms\n");
    // 1 comes again after its nack; 2, never acked, after the ack wait.
    let mut seen = vec![];
    for n in 3..=4 {
        let e = event_line(&mut c, n);
        assert_eq!(e["redelivered"], true, "{e}");
        assert_eq!(e["delivery"], 2, "{e}");
        seen.push(e["seq"].as_u64().unwrap_or(0));
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![1, 2]);
    c.write_stdin(b"ack-upto 2\n");
    env.wait_status(LONG, "all acked", |st| listed(st, "s1")["pending"] == 0);
    let out = stop_term(c);
    let err = out.stderr_lines();
    for want in [
        "[event] stdin line 1 ignored: unknown verb \"hello\": use ack SEQ, ack-upto SEQ, nack SEQ [DELAY], progress SEQ or term SEQ [REASON]",
        "[event] stdin line 2 ignored: \"nine\" is not a seq",
        "[event] stdin line 3 ignored: seq 99 was not delivered to this run (or is settled)",
    ] {
        assert!(err.contains(&want), "missing {want:?}\n{out}");
    }
}

/// Issue 36 row 11: a stdin line over its bound (4 KiB) is refused whole,
/// never cut and applied (a cut `nack 1<spaces>1h` was an immediate nack),
/// and so is trailing junk, each with a `[event]` line naming its number.
#[test]
fn an_overlong_or_junk_trailed_ack_line_is_refused_whole_and_named() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1"]);
    publish_n(&env, 2);
    let mut c = explicit(&env, &[]);
    event_line(&mut c, 2);
    let pad = " ".repeat(5000);
    c.write_stdin(format!("nack 1{pad}1h\nack 2{pad}junk\nack 2   junk\n").as_bytes());
    for (n, why) in [
        (
            1,
            "longer than 4096 bytes (5008 bytes): refused whole, nothing applied",
        ),
        (
            2,
            "longer than 4096 bytes (5009 bytes): refused whole, nothing applied",
        ),
        (3, "unexpected \"junk\""),
    ] {
        let want = format!("[event] stdin line {n} ignored: {why}");
        c.wait_stderr_line(&want, LONG, |l| l == want);
    }
    // Nothing was applied: no nack brought event 1 back, event 2 is unacked.
    let st = env.status();
    let s1 = listed(&st, "s1");
    assert_eq!(
        (
            s1["acked"].as_u64(),
            s1["redelivered"].as_u64(),
            s1["delayed"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{st:#}"
    );
    c.write_stdin(b"ack-upto 2\n");
    env.wait_status(LONG, "both acked", |st| listed(st, "s1")["acked"] == 2);
    let out = stop_term(c);
    out.assert_clean_exit("signal", 2);
    assert_eq!(out.stdout_lines().len(), 2, "nothing came again\n{out}");
}

/// `subscribe --ack-wait` sets the ack wait of its explicit-ack consumers
/// that name none; one that names its own keeps it. (The default, 30 s,
/// would not redeliver within this test's 15 s.)
#[test]
fn subscribe_ack_wait_is_the_wait_of_consumers_that_name_none() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1", "--ack-wait", "1s"]);
    assert_eq!(listed(&env.status(), "s1")["ack_wait_ms"], 1000);
    crate::ecosystem::assert_valid("status", &env.status());
    publish_n(&env, 1);
    let mut c = explicit(&env, &[]);
    event_line(&mut c, 1);
    // Never acked: after the subscription's 1 s it comes again.
    let lines = c.wait_stdout_lines(2, Duration::from_secs(15));
    let again = json(&lines[1]);
    assert_eq!(
        (again["seq"].as_u64(), again["delivery"].as_u64()),
        (Some(1), Some(2))
    );
    stop_term(c);
    // A consumer's own --ack-wait wins: 60 s, so nothing comes again soon.
    let mut c = explicit(&env, &["--ack-wait", "60s"]);
    event_line(&mut c, 1);
    assert!(
        c.try_wait_stdout_lines(2, Duration::from_secs(3)).is_none(),
        "{}",
        c.report()
    );
    stop_term(c);
    // Without a subscription default: 30 s, as before.
    env.subscribe(&["k.*", "--id", "s2"]);
    assert_eq!(listed(&env.status(), "s2")["ack_wait_ms"], Value::Null);
}

#[test]
fn a_parent_that_dies_mid_batch_gets_everything_unacked_again() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1"]);
    publish_n(&env, 4);
    let mut c = explicit(&env, &[]);
    event_line(&mut c, 4);
    c.write_stdin(b"ack 1\n");
    env.wait_status(LONG, "one ack", |st| listed(st, "s1")["acked"] == 1);
    // The parent dies: stdin reaches EOF, which ends the run (reason signal).
    c.close_stdin();
    c.wait_exit(LONG).assert_clean_exit("signal", 4);
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--max-events",
            "3",
        ])
        .run_with_timeout(LONG);
    out.assert_clean_exit("limit", 3);
    let events: Vec<Value> = out.stdout_lines().iter().map(|l| json(l)).collect();
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, vec![2, 3, 4]);
    assert!(events
        .iter()
        .all(|e| e["redelivered"] == true && e["delivery"] == 2));
}

#[test]
fn poison_halts_the_subscription_and_restart_or_skip_move_it_on_across_a_restart() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1", "--max-deliver", "2"]);
    publish_n(&env, 2);
    let mut c = explicit(&env, &[]);
    event_line(&mut c, 2);
    c.write_stdin(b"ack 2\nnack 1\n");
    event_line(&mut c, 3);
    c.write_stdin(b"nack 1\n");
    let out = c.wait_exit(LONG);
    out.assert_clean_exit("halted", 3);
    assert!(
        out.stderr_lines()
            .contains(&"[event] subscription s1 halted at seq 1: delivered 2 times without ack"),
        "{out}"
    );
    let st = env.status();
    let s1 = listed(&st, "s1");
    assert_eq!(s1["state"], "halted", "{s1:#}");
    assert_eq!(s1["halted"]["seq"], 1);
    assert_eq!(s1["halted"]["event_id"], "e1");
    assert_eq!(s1["halted"]["deliveries"], 2);
    // The text status shows it too (`dws event status | grep -i halt`).
    let text = text_status_row(&env, "s1");
    assert!(text.contains("halted@1"), "{text}");
    // A consumer attaching to a halted subscription is told at once.
    let again = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .run_with_timeout(LONG);
    again.assert_clean_exit("halted", 0);
    assert!(
        again
            .stderr_lines()
            .contains(&"[event] subscription s1 halted at seq 1: delivered 2 times without ack"),
        "{again}"
    );
    // Not allowed: enable a halted subscription.
    let msg = verb(&env, &["enable", "s1"]).assert_error(1);
    assert!(msg.contains("halted"), "{msg}");
    // The halt survives a restart of the bus.
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    env.wait_no_busd(LONG, "the bus to stop");
    env.subscribe(&["k.*", "--id", "s1"]); // starts the bus again; s1 exists
    let st = env.status();
    assert_eq!(listed(&st, "s1")["state"], "halted", "{st:#}");
    // A dry run changes nothing.
    let dry = verb_json(&env, &["restart", "s1", "--dry-run"]);
    assert_eq!(
        (dry["state"].as_str(), dry["dry_run"].as_bool()),
        (Some("active"), Some(true))
    );
    assert_eq!(listed(&env.status(), "s1")["state"], "halted");
    // restart: the same event again, its count reset.
    let doc = verb_json(&env, &["restart", "s1"]);
    assert_eq!(doc["state"], "active");
    assert!(verb(&env, &["restart", "s1"])
        .assert_error(1)
        .contains("not halted"));
    let mut c = explicit(&env, &[]);
    let e = event_line(&mut c, 1);
    assert_eq!(
        (e["seq"].as_u64(), e["delivery"].as_u64()),
        (Some(1), Some(1))
    );
    c.write_stdin(b"nack 1\n");
    event_line(&mut c, 2);
    c.write_stdin(b"nack 1\n");
    c.wait_exit(LONG).assert_clean_exit("halted", 2);
    // skip: the event is parked and the subscription goes on.
    let doc = verb_json(&env, &["skip", "s1"]);
    assert_eq!(
        (doc["state"].as_str(), doc["parked"].as_u64()),
        (Some("active"), Some(1))
    );
    let parked = verb_json(&env, &["parked", "s1"]);
    assert_eq!(parked["parked_events"][0]["seq"], 1, "{parked:#}");
    assert_eq!(listed(&env.status(), "s1")["pending"], 0);
    // The row and its header from one report: widths differ between two.
    let [header, text] = text_status_rows(&env, ["ID", "s1"]);
    // Columns are left-aligned under their header.
    let column = |row: &str, name: &str| {
        let at = header.find(&format!(" {name}"))? + 1;
        row.get(at..)?.split_whitespace().next().map(str::to_owned)
    };
    assert_eq!(column(&text, "STATE").as_deref(), Some("active"), "{text}");
    assert_eq!(
        column(&text, "PARKED").as_deref(),
        Some("1"),
        "{header}\n{text}"
    );
}

/// The line of the text `dws event status` whose first word is `first`
/// (a subscription's row, or `ID` for the header).
fn text_status_row(env: &TestEnv, first: &str) -> String {
    let [row] = text_status_rows(env, [first]);
    row
}

/// The lines of one text `dws event status` whose first words are `firsts`.
fn text_status_rows<const N: usize>(env: &TestEnv, firsts: [&str; N]) -> [String; N] {
    let out = env.dws(["event", "status"]).run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    firsts.map(|first| {
        out.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no status row {first:?}\n{out}"))
            .to_owned()
    })
}

#[test]
fn poison_with_park_goes_on_and_parked_events_can_be_replayed() {
    let env = TestEnv::new();
    env.subscribe(&[
        "k.*",
        "--id",
        "s1",
        "--max-deliver",
        "1",
        "--on-poison",
        "park",
    ]);
    publish_n(&env, 2);
    let mut c = explicit(&env, &[]);
    event_line(&mut c, 2);
    c.write_stdin(b"nack 1\nack 2\n");
    env.wait_status(LONG, "event 1 parked", |st| listed(st, "s1")["parked"] == 1);
    let st = env.status();
    let s1 = listed(&st, "s1");
    assert_eq!(
        (s1["state"].as_str(), s1["pending"].as_u64()),
        (Some("active"), Some(0))
    );
    // The parked list survives a restart of the bus.
    stop_term(c);
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    env.wait_no_busd(LONG, "the bus to stop");
    env.subscribe(&["k.*", "--id", "s1"]);
    let text = verb(&env, &["parked", "s1"]);
    text.assert_code(0);
    assert!(text.stdout.contains("parked seq 1"), "{text}");
    let mut c = explicit(&env, &[]);
    let doc = verb_json(&env, &["replay-parked", "s1"]);
    assert_eq!(doc["replayed"], 1);
    let e = event_line(&mut c, 1);
    assert_eq!(
        (e["seq"].as_u64(), e["delivery"].as_u64()),
        (Some(1), Some(1))
    );
    stop_term(c);
}

/// An event published without an id gets one from the bus; the parked
/// list and a halt name that id (they said `""`), and `parked` shows the
/// payload.
#[test]
fn parked_and_halted_records_name_the_id_on_the_line_and_parked_shows_the_data() {
    let env = TestEnv::new();
    env.subscribe(&[
        "k.*",
        "--id",
        "s1",
        "--max-deliver",
        "1",
        "--on-poison",
        "park",
    ]);
    env.subscribe(&["k.*", "--id", "s2", "--max-deliver", "1"]);
    env.publish("k.e", "{\"order\":42}", &[]);
    let mut c = explicit(&env, &[]);
    let line = event_line(&mut c, 1);
    let id = line["event_id"]
        .as_str()
        .expect("an id on the line")
        .to_owned();
    assert!(!id.is_empty(), "{line}");
    c.write_stdin(b"nack 1\n");
    env.wait_status(LONG, "event 1 parked", |st| listed(st, "s1")["parked"] == 1);
    stop_term(c);
    let parked = verb_json(&env, &["parked", "s1"]);
    let p = &parked["parked_events"][0];
    assert_eq!(p["event_id"], id.as_str(), "{parked:#}");
    assert_eq!(p["data"], "{\"order\":42}", "{parked:#}");
    assert_eq!(p["data_bytes"], 12, "{parked:#}");
    crate::ecosystem::assert_valid("subscription", &parked);
    let mut c = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s2",
            "--ack",
            "explicit",
        ])
        .stdin_pipe()
        .spawn();
    c.wait_ready();
    event_line(&mut c, 1);
    c.write_stdin(b"nack 1\n");
    c.wait_exit(LONG).assert_clean_exit("halted", 1);
    let st = env.status();
    assert_eq!(
        listed(&st, "s2")["halted"]["event_id"],
        id.as_str(),
        "{st:#}"
    );
}

#[test]
fn disable_enable_and_seek() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1"]);
    publish_n(&env, 3);
    let doc = verb_json(&env, &["disable", "s1"]);
    assert_eq!(doc["state"], "disabled");
    assert_eq!(
        verb_json(&env, &["disable", "s1"])["changed"],
        false,
        "idempotent"
    );
    let out = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .run_with_timeout(LONG);
    let msg = out.assert_error(1);
    assert!(msg.contains("disabled"), "{msg}");
    env.publish("k.e", "{\"n\":4}", &[]);
    assert_eq!(
        listed(&env.status(), "s1")["pending"],
        4,
        "it keeps collecting"
    );
    assert_eq!(verb_json(&env, &["enable", "s1"])["state"], "active");
    // seek to latest: nothing pending; to 2: events 2.. again; too old: from the oldest.
    assert_eq!(
        verb_json(&env, &["seek", "s1", "--to", "latest"])["pending"],
        0
    );
    let doc = verb_json(&env, &["seek", "s1", "--to", "2"]);
    assert_eq!(
        (doc["pending"].as_u64(), doc["seek"]["from_seq"].as_u64()),
        (Some(3), Some(2))
    );
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--max-events",
            "3",
        ])
        .run_with_timeout(LONG);
    out.assert_clean_exit("limit", 3);
    let msg = verb(&env, &["seek", "s1", "--to", "soon"]).assert_error(2);
    assert!(msg.contains("--to \"soon\""), "{msg}");
    let msg = verb(&env, &["restart", "nope"]).assert_error(1);
    assert!(msg.contains("not found"), "{msg}");
}

#[test]
fn poison_flags_are_checked_before_anything_is_created() {
    let env = TestEnv::new();
    let out = env
        .dws(["event", "subscribe", "k.*", "--on-poison", "park"])
        .run_with_timeout(EXIT_TIMEOUT);
    assert!(out
        .assert_error(2)
        .contains("--on-poison needs --max-deliver"));
    let out = env
        .dws(["event", "consume", "k.*", "--ack-wait", "5s"])
        .run_with_timeout(EXIT_TIMEOUT);
    assert!(out
        .assert_error(2)
        .contains("--ack-wait applies to --ack explicit"));
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "x",
            "--max-deliver",
            "3",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    assert!(out
        .assert_error(2)
        .contains("apply to a subscription this run creates"));
    assert!(env.busd_pids().is_empty(), "no bus was started");
}

/// A run that ends at `--max-events` acks what it printed before it goes:
/// the next run starts after it, nothing printed comes again. The bus has
/// more for the consumer than it reads (large events, the bytes path), so
/// the run closes with the bus still writing to it — which lost the last
/// ack when the bus's write failed before it read that ack.
#[test]
fn a_run_ended_by_max_events_with_more_on_the_way_acks_what_it_printed() {
    let env = TestEnv::new();
    dws_tests::common::subscribe_ok(&env, &["big.*", "--id", "s1"], "s1");
    let data = format!("{{\"pad\":\"{}\"}}", "x".repeat(16 * 1024));
    let items: Vec<(String, String)> = (1..=400).map(|i| (format!("b{i}"), data.clone())).collect();
    dws_tests::common::publish_parallel(&env, "big.e", &items, 2);
    for want in 1..=40u64 {
        let out = env
            .dws([
                "event",
                "consume",
                "--subscribe-id",
                "s1",
                "--max-events",
                "1",
            ])
            .env("DWS_LINE_RING", "off")
            .run_with_timeout(EXIT_TIMEOUT);
        out.assert_code(0);
        let line = json(out.stdout.trim());
        // (It may be marked redelivered: the run before read it ahead.)
        assert_eq!(
            line["seq"].as_u64(),
            Some(want),
            "run {want} printed again what an earlier run printed: {}",
            out.stderr
        );
    }
}
