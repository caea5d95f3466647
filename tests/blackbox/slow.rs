//! Processing for slow consumers (`--ack explicit`): `progress SEQ` keeps an
//! event alive past its ack wait, a consumer that stops sending it (SIGSTOP)
//! gets the event again marked redelivered, `term SEQ [REASON]` parks an
//! event at once with its reason, `--backoff` spaces redeliveries, and a
//! delayed event keeps its due time across a `kill -9` of the bus while
//! retention leaves it alone.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dws_tests::{common::listed, Child, Output, Sig, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

use super::acks::explicit;

const LONG: Duration = Duration::from_secs(30);

fn line(c: &mut Child, n: usize) -> Value {
    let lines = c.wait_stdout_lines(n, LONG);
    serde_json::from_str(&lines[n - 1]).unwrap_or_else(|e| panic!("not JSON ({e})"))
}

/// (seq, redelivered, delivery) of an event line.
fn seen(e: &Value) -> (u64, bool, u64) {
    (
        e["seq"].as_u64().unwrap_or(0),
        e["redelivered"].as_bool().unwrap_or(false),
        e["delivery"].as_u64().unwrap_or(0),
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn stop_term(c: Child) -> Output {
    c.signal(Sig::SIGTERM);
    c.wait_exit(LONG)
}

fn verb_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut a = vec!["event", "subscription"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--format", "json"]);
    let out = env.dws(&a).run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e})\n{out}"))
}

#[test]
fn progress_keeps_an_event_alive_and_a_stopped_consumer_gets_it_again_after_the_ack_wait() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1"]);
    env.publish("k.e", "{}", &["--id", "e1"]);
    let mut c = explicit(&env, &["--ack-wait", "1s"]);
    assert_eq!(seen(&line(&mut c, 1)), (1, false, 1));
    // Three ack waits of work, with progress every 200 ms: no redelivery.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        c.write_stdin(b"progress 1\n");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        c.try_wait_stdout_lines(2, Duration::ZERO).is_none(),
        "redelivered although progress kept coming: {:?}",
        c.stdout_so_far()
    );
    let st = env.status();
    let s1 = listed(&st, "s1");
    assert_eq!(
        (s1["redelivered"].as_u64(), s1["in_flight"].as_u64()),
        (Some(0), Some(1)),
        "{s1:#}"
    );
    assert_eq!(s1["head_attempts"], 1, "progress counts no delivery");
    // The consumer hangs: no more progress. After the ack wait the bus
    // delivers the event again (into the stopped consumer's socket).
    c.signal(Sig::SIGSTOP);
    let st = env.wait_status(LONG, "a redelivery after the ack wait", |st| {
        listed(st, "s1")["redelivered"] == 1
    });
    let attempts = listed(&st, "s1")["head_attempts"].as_u64().unwrap_or(0);
    assert!(attempts >= 2, "{st:#}");
    c.signal(Sig::SIGCONT);
    assert_eq!(seen(&line(&mut c, 2)), (1, true, 2));
    c.write_stdin(b"progress 9\nack 1\n");
    env.wait_status(LONG, "acked", |st| listed(st, "s1")["pending"] == 0);
    let out = stop_term(c);
    let want = "ignored: seq 9 was not delivered to this run (or is settled)";
    assert!(
        out.stderr_lines().iter().any(|l| l.ends_with(want)),
        "missing {want:?}\n{out}"
    );
}

#[test]
fn term_parks_an_event_at_once_with_its_reason_and_count_also_after_a_restart() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1", "--max-deliver", "5"]);
    for i in 1..=2 {
        env.publish("k.e", "{}", &["--id", &format!("e{i}")]);
    }
    let mut c = explicit(&env, &[]);
    line(&mut c, 2);
    c.write_stdin(b"nack 1\n");
    assert_eq!(seen(&line(&mut c, 3)), (1, true, 2));
    c.write_stdin(b"term 1 invalid payload: no \"to\" field\nack 2\nterm 1\nterm 7 x\n");
    let st = env.wait_status(LONG, "1 parked, 2 acked", |st| {
        listed(st, "s1")["parked"] == 1 && listed(st, "s1")["pending"] == 0
    });
    assert_eq!(listed(&st, "s1")["state"], "active", "{st:#}");
    let out = stop_term(c);
    let ignored = out
        .stderr_lines()
        .iter()
        .filter(|l| l.contains("was not delivered to this run (or is settled)"))
        .count();
    assert_eq!(ignored, 2, "term of a settled and of an unknown seq\n{out}");
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    env.wait_no_busd(LONG, "the bus to stop");
    env.subscribe(&["k.*", "--id", "s1"]);
    let doc = verb_json(&env, &["parked", "s1"]);
    let p = &doc["parked_events"][0];
    assert_eq!(
        (p["seq"].as_u64(), p["deliveries"].as_u64()),
        (Some(1), Some(2)),
        "{doc:#}"
    );
    assert_eq!(p["reason"], "invalid payload: no \"to\" field", "{doc:#}");
    let text = env
        .dws(["event", "subscription", "parked", "s1"])
        .run_with_timeout(EXIT_TIMEOUT);
    text.assert_code(0);
    assert!(
        text.stdout.contains(
            r#"parked seq 1 "k.e" "e1" (2 deliveries): "invalid payload: no \"to\" field""#
        ),
        "{text}"
    );
}

#[test]
fn the_backoff_spaces_redeliveries_and_its_last_step_repeats() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1", "--backoff", "1s,2s"]);
    let st = env.status();
    assert_eq!(
        listed(&st, "s1")["backoff_ms"],
        serde_json::json!([1000, 2000])
    );
    let mut c = explicit(&env, &["--ack-wait", "1s"]);
    let published = Instant::now();
    env.publish("k.e", "{}", &["--id", "e1"]);
    assert_eq!(seen(&line(&mut c, 1)), (1, false, 1));
    // Not acked: the ack wait (1 s), then the first step (1 s).
    assert_eq!(seen(&line(&mut c, 2)), (1, true, 2));
    assert!(
        published.elapsed() >= Duration::from_secs(2),
        "came again before the ack wait and the first step: {:?}",
        published.elapsed()
    );
    // A consumer leaving gives its event back at once (no step).
    stop_term(c);
    let mut c = explicit(&env, &["--ack-wait", "1m"]);
    assert_eq!(seen(&line(&mut c, 1)), (1, true, 3));
    // A nack without a delay waits the next step, here the last one
    // (2 s), which repeats; status shows the wait.
    for n in 2..=3 {
        let nacked = Instant::now();
        let nacked_ms = now_ms();
        c.write_stdin(b"nack 1\n");
        let st = env.wait_status(LONG, "a delayed event", |st| {
            listed(st, "s1")["delayed"] == 1
        });
        let due = listed(&st, "s1")["next_due_unix_ms"].as_i64().unwrap_or(0);
        assert!(
            due >= nacked_ms + 2000,
            "due {due}, nacked at {nacked_ms}\n{st:#}"
        );
        if n == 2 {
            let text = env.dws(["event", "status"]).run_with_timeout(EXIT_TIMEOUT);
            text.assert_code(0);
            assert!(text.stdout.contains("DELAYED"), "{text}");
            // Unless it came due meanwhile: one delayed, due in N s.
            let shown = text.stdout.contains(" 1 (in ");
            assert!(
                shown || c.try_wait_stdout_lines(n, Duration::ZERO).is_some(),
                "{text}"
            );
        }
        assert_eq!(seen(&line(&mut c, n)), (1, true, n as u64 + 2));
        assert!(
            nacked.elapsed() >= Duration::from_secs(2),
            "came again before its step: {:?}",
            nacked.elapsed()
        );
    }
    c.write_stdin(b"ack 1\n");
    let st = env.wait_status(LONG, "acked", |st| listed(st, "s1")["pending"] == 0);
    let s1 = listed(&st, "s1");
    assert_eq!(
        (s1["delayed"].as_u64(), &s1["next_due_unix_ms"]),
        (Some(0), &Value::Null)
    );
    stop_term(c);
}

#[test]
fn backoff_flags_are_checked_before_anything_is_created() {
    let env = TestEnv::new();
    for (args, want) in [
        (
            vec!["event", "subscribe", "k.*", "--backoff", "1s,2d"],
            "longer than one day",
        ),
        (
            vec!["event", "subscribe", "k.*", "--backoff", "1s,soon"],
            "--backoff",
        ),
        (
            vec!["event", "consume", "--subscribe-id", "x", "--backoff", "1s"],
            "apply to a subscription this run creates",
        ),
    ] {
        let out = env.dws(&args).run_with_timeout(EXIT_TIMEOUT);
        let msg = out.assert_error(2);
        assert!(msg.contains(want), "{args:?}: {msg}");
    }
    assert!(env.busd_pids().is_empty(), "no bus was started");
    let out = env
        .dws([
            "event",
            "consume",
            "k.*",
            "--ack",
            "explicit",
            "--backoff",
            "1s,1m",
            "--dry-run",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    let plan: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_default();
    assert_eq!(
        plan["backoff_ms"],
        serde_json::json!([1000, 60000]),
        "{out}"
    );
}

#[test]
fn a_delayed_event_keeps_its_due_time_and_its_place_across_retention_and_kill_9() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_EVENTS", "5")]);
    env.subscribe(&["k.*", "--id", "s1"]);
    for i in 1..=2 {
        env.publish("k.e", "{}", &["--id", &format!("e{i}")]);
    }
    let mut c = explicit(&env, &[]);
    line(&mut c, 2);
    c.write_stdin(b"nack 1 8s\nack 2\n");
    let st = env.wait_status(LONG, "1 delayed", |st| {
        listed(st, "s1")["delayed"] == 1 && listed(st, "s1")["acked"] == 1
    });
    let due = listed(&st, "s1")["next_due_unix_ms"].as_i64().unwrap_or(0);
    stop_term(c);
    // Retention passes the delayed event: the unsent 3..=7 are lost (no
    // consumer), the delayed 1 is kept.
    for i in 3..=12 {
        env.publish("k.e", "{}", &["--id", &format!("e{i}")]);
    }
    let st = env.status();
    assert_eq!(st["log"]["oldest_seq"], 8, "{st:#}");
    let s1 = listed(&st, "s1");
    assert_eq!(
        (s1["lost_to_retention"].as_u64(), s1["pending"].as_u64()),
        (Some(5), Some(6)),
        "{st:#}"
    );
    // The snapshot with the delay, and 1 pinned past the log, is on disk;
    // then the bus dies.
    let file = env.work_dir().join("store").join("subscriptions.json");
    env.wait_until(LONG, "the delay saved", || {
        let snap: Value = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        snap["subscriptions"].as_array().is_some_and(|subs| {
            subs.iter()
                .any(|s| s["id"] == "s1" && s["delayed"][0][0] == 1 && s["pinned"][0] == 1)
        })
    });
    let pids = env.busd_pids();
    for &p in &pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Sig::SIGKILL);
    }
    env.wait_no_busd(LONG, "the bus to die");
    env.subscribe(&["k.*", "--id", "s1"]);
    let st = env.status();
    let s1 = listed(&st, "s1");
    assert_eq!(s1["delayed"], 1, "{st:#}");
    let again = s1["next_due_unix_ms"].as_i64().unwrap_or(0);
    assert!(
        (again - due).abs() < 1000,
        "due {due} before, {again} after\n{st:#}"
    );
    assert_eq!(s1["lost_to_retention"], 5, "{st:#}");
    // Events 8..=12 come at once (marked: the bus crashed), 1 only at its
    // due time.
    let mut c = explicit(&env, &[]);
    let first = c.wait_stdout_lines(5, LONG);
    if now_ms() < due - 500 {
        assert!(
            !first.iter().any(|l| l.contains("\"seq\":1,")),
            "1 came before its due time: {first:?}"
        );
    }
    let lines = c.wait_stdout_lines(6, LONG);
    let events: Vec<(u64, bool, u64)> = lines
        .iter()
        .map(|l| seen(&serde_json::from_str(l).unwrap_or_default()))
        .collect();
    assert_eq!(events.last(), Some(&(1, true, 2)), "{events:?}");
    let mut seqs: Vec<u64> = events.iter().map(|e| e.0).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [1, 8, 9, 10, 11, 12]);
    let out = stop_term(c);
    let gaps: Vec<&str> = out
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("gap"))
        .collect();
    assert_eq!(
        gaps,
        ["[event] gap \u{2014} lost 5 event(s) before seq 8 (retention)"],
        "only the unsent events are lost\n{out}"
    );
}
