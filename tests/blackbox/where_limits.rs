//! `--where` expressions written to hurt: each costs only its own
//! subscription. A value doubled until it is gigabytes, a quadratic
//! `indices`, a large regex, a `"g"` flag on an empty pattern, hundreds of
//! subscriptions at the step bound, a filter over everything retained:
//! meanwhile a plain consumer is served and publishes are answered
//! promptly, busd's memory stays its own, the event the filter could not
//! judge is counted and told once on the consumer's stderr, and a bus
//! killed while such an event waits starts at once (docs/guide.md
//! "Limits").

use std::{
    path::Path,
    thread,
    time::{Duration, Instant},
};

use dws_tests::{
    common::{listed, subscribe_ok},
    pids::proc_kb,
    wire::Wire,
    Sig, TestEnv, EXIT_TIMEOUT,
};
use proto::v1::{client_frame::Kind as C, server_frame::Kind as S, Publish, Subscribe};

const LONG: Duration = Duration::from_secs(60);

/// Publishes `data` as one event of `event_type` with `dws` (stdin: it may
/// be larger than an argument may).
fn publish_stdin(env: &TestEnv, event_type: &str, data: &str) {
    env.dws(["event", "publish", event_type, "-"])
        .stdin_bytes(data.as_bytes().to_vec())
        .run_with_timeout(LONG)
        .assert_code(0);
}

/// A raw consumer of `probe.*` and a raw publisher: publishes `n` small
/// events one at a time and times each from its Publish to its PublishAck
/// and to its delivery. Returns both latencies, sorted.
fn probe(socket: &Path, n: u64) -> (Vec<Duration>, Vec<Duration>) {
    let mut consumer = Wire::greeted(socket);
    consumer.request(C::Subscribe(Subscribe {
        request_id: 1,
        patterns: vec!["probe.*".into()],
        owned: true,
        attach: true,
        ..Subscribe::default()
    }));
    match consumer.read_frame(LONG).kind {
        Some(S::Subscribed(_)) => {}
        other => panic!("expected Subscribed, got {other:?}"),
    }
    let mut publisher = Wire::greeted(socket);
    let (mut acked, mut delivered) = (vec![], vec![]);
    for i in 1..=n {
        let sent = Instant::now();
        publisher.request(C::Publish(Publish {
            request_id: i,
            event_type: "probe.tick".into(),
            data: format!("tick-{i}"),
            ..Publish::default()
        }));
        match publisher.read_frame(LONG).kind {
            Some(S::PublishAck(_)) => acked.push(sent.elapsed()),
            other => panic!("expected PublishAck, got {other:?}"),
        }
        loop {
            match consumer.read_frame(LONG).kind {
                Some(S::Event(e)) if e.data == format!("tick-{i}") => break,
                Some(S::Event(_) | S::Heartbeat(_) | S::SourceState(_)) => {}
                other => panic!("expected the probe's event, got {other:?}"),
            }
        }
        delivered.push(sent.elapsed());
        thread::sleep(Duration::from_millis(20));
    }
    acked.sort();
    delivered.sort();
    (acked, delivered)
}

/// Asserts that 90 % of the probe's latencies are under 50 ms and none is
/// near the stalls these filters caused (seconds to minutes): one slow
/// sample on a loaded machine is the machine's, a stall is the bus's.
fn assert_prompt(what: &str, sorted: &[Duration]) {
    let p90 = sorted[sorted.len() * 9 / 10];
    let max = sorted[sorted.len() - 1];
    assert!(
        p90 < Duration::from_millis(50) && max < Duration::from_secs(2),
        "{what}: p90 {p90:?}, max {max:?} (all: {sorted:?})"
    );
}

#[test]
fn the_worst_filters_cost_only_their_own_subscriptions() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_STORE", "memory")]);
    // What every filter below reads: retained events, 64 KB each.
    let big = "a".repeat(64 * 1024);
    publish_stdin(&env, "hurt.warm", &big);
    let socket = env.bus_meta_socket().expect("the bus socket");
    let busd = env.bus_meta_pid().expect("the bus pid");
    // Quadratic in the value (row 3), a regex whose work is its size times
    // the input's (row 4), a "g" flag on an empty pattern (row 5).
    let hostile = [
        ".data | indices(.[0:(length/2|floor)]) | length > 0",
        r#".data | test("(?:a?){200}a{200}b")"#,
        r#".data | test("";"g")"#,
        ".data | explode | . as $a | $a | indices($a[0:(length/2|floor)]) | length > 0",
    ];
    for (i, w) in hostile.iter().enumerate() {
        let id = format!("hostile-{i}");
        subscribe_ok(&env, &["hurt.*", "--id", &id, "--where", w], &id);
    }
    // 200 subscriptions at the step bound (row 7), made on one connection.
    let heavy = ".data.a[]? as $x | .data.a[]? as $y | empty";
    let mut w = Wire::greeted(&socket);
    for i in 0..200u64 {
        w.request(C::Subscribe(Subscribe {
            request_id: i + 1,
            subscription_id: format!("steps-{i}"),
            patterns: vec!["steps.*".into()],
            where_exprs: vec![heavy.into()],
            ..Subscribe::default()
        }));
        match w.read_frame(LONG).kind {
            Some(S::Subscribed(_)) => {}
            other => panic!("expected Subscribed, got {other:?}"),
        }
    }
    let long: Vec<u32> = (0..400).collect();
    let steps = serde_json::json!({ "a": long }).to_string();
    for _ in 0..3 {
        publish_stdin(&env, "hurt.x", &big);
        publish_stdin(&env, "steps.x", &steps);
    }
    // A filter over everything retained (row 6): the subscribe and a seek
    // return without waiting for it.
    let started = Instant::now();
    subscribe_ok(
        &env,
        &[
            "*",
            "--id",
            "everything",
            "--from",
            "earliest",
            "--where",
            heavy,
        ],
        "everything",
    );
    assert!(started.elapsed() < EXIT_TIMEOUT);
    // And again, all of it, with a seek.
    env.dws([
        "event",
        "subscription",
        "seek",
        "everything",
        "--to",
        "earliest",
    ])
    .run_with_timeout(EXIT_TIMEOUT)
    .assert_code(0);
    assert!(started.elapsed() < EXIT_TIMEOUT);

    let (acked, delivered) = probe(&socket, 30);
    assert_prompt("publish acks while the filters run", &acked);
    assert_prompt("deliveries to a plain consumer", &delivered);
    // busd itself never held what the filters made.
    let peak_mib = proc_kb(busd, "VmHWM") / 1024;
    assert!(peak_mib < 200, "busd's peak RSS {peak_mib} MiB");
    // The filters did run, and what they could not judge is counted (a
    // string's `indices` may finish within the budget: it is not checked).
    let st = env.wait_status(LONG, "the hostile filters to judge their events", |st| {
        (0..hostile.len()).all(|i| listed(st, &format!("hostile-{i}"))["where_waiting"] == 0)
    });
    for i in 1..hostile.len() {
        let s = listed(&st, &format!("hostile-{i}"));
        assert!(
            s["where_errors"].as_u64().unwrap_or(0) >= 1,
            "hostile-{i}: {s:#}"
        );
        assert!(s["where_last_limit"].is_string(), "hostile-{i}: {s:#}");
    }
    assert_eq!(env.bus_meta_pid(), Some(busd), "the same bus throughout");
}

#[test]
fn a_value_doubled_past_the_memory_bound_is_a_failure_told_once_not_an_abort() {
    let env = TestEnv::new();
    // 12 doublings of a 1 MiB string: 4 GiB, were it made (row 1).
    let doubling = format!(".data{} | length > 0", "|.+.".repeat(12));
    let mut judged = env
        .dws(["event", "consume", "mem.*", "--where", &doubling])
        .stdin_hold()
        .spawn();
    judged.wait_ready();
    let mut plain = env.dws(["event", "consume", "mem.*"]).stdin_hold().spawn();
    plain.wait_ready();
    let busd = env.bus_meta_pid().expect("the bus pid");
    publish_stdin(&env, "mem.big", &"m".repeat(1 << 20));
    env.publish("mem.small", "small", &[]);
    let lines = plain.wait_stdout_lines(2, LONG);
    assert!(lines[1].contains("\"small\""), "{lines:?}");
    // The small one doubles to 8 KiB and matches; the big one is a
    // failure, told once on the consumer's stderr.
    let got = judged.wait_stdout_lines(1, LONG);
    assert!(got[0].contains("\"seq\":2"), "{got:?}");
    let told = judged.wait_stderr_line("the where notice", LONG, |l| {
        l.starts_with("[event] where — no answer for seq 1 ")
    });
    assert!(
        told.contains("memory bound") || told.contains("CPU budget"),
        "{told}"
    );
    let peak_mib = proc_kb(busd, "VmHWM") / 1024;
    assert!(peak_mib < 200, "busd's peak RSS {peak_mib} MiB");
    // Another failure in the same run is not told again.
    publish_stdin(&env, "mem.big", &"n".repeat(1 << 20));
    env.publish("mem.small", "small-2", &[]);
    judged.wait_stdout_line("the next match", LONG, |l| l.contains("small-2"));
    judged.signal(Sig::SIGTERM);
    let out = judged.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", 2);
    let notices = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("[event] where"))
        .count();
    assert_eq!(notices, 1, "{out}");
    let st = env.status();
    let ids: Vec<&str> = st["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(env.bus_meta_pid(), Some(busd), "the same bus ({ids:?})");
}

#[test]
fn a_bus_killed_while_a_poison_event_waits_for_its_filter_starts_at_once() {
    let env = TestEnv::new();
    // Quadratic: about two minutes of CPU for one 200 KB event (row 2).
    let poison = ".data | explode | . as $a | $a | indices($a[0:(length/2|floor)]) | length > 0";
    subscribe_ok(
        &env,
        &["poison.*", "--id", "poisoned", "--where", poison],
        "poisoned",
    );
    for _ in 0..3 {
        publish_stdin(&env, "poison.x", &"p".repeat(200 * 1024));
    }
    let busd = env.bus_meta_pid().expect("the bus pid");
    dws_tests::pids::signal_pid(busd, Sig::SIGKILL);
    env.wait_no_busd(LONG, "the killed bus");
    // The next client starts a bus, which serves at once: the poison
    // events are judged again, apart, once it runs.
    let started = Instant::now();
    let p = env.publish("other.x", "after-the-restart", &[]);
    assert_eq!(p["duplicate"], false, "{p}");
    let st = env.status();
    assert!(started.elapsed() < EXIT_TIMEOUT, "{:?}", started.elapsed());
    assert!(listed(&st, "poisoned")["where"].is_array(), "{st:#}");
    let st = env.wait_status(LONG, "the poison events judged again", |st| {
        listed(st, "poisoned")["where_waiting"] == 0
    });
    let s = listed(&st, "poisoned");
    assert_eq!(s["matched"], 0, "{s:#}");
    assert!(
        s["where_last_limit"]
            .as_str()
            .is_some_and(|l| l.contains("CPU budget")),
        "{s:#}"
    );
}
