//! Subscriptions seen from outside: owned vs durable (`dws event subscribe`)
//! lifetimes across SIGTERM and `kill -9`, redelivery of unacked events,
//! overlapping patterns, takeover, TTL expiry, retention gaps, a stalled
//! consumer that must not stall anyone else, `unsubscribe`, `stop
//! --subscribe-id`, `subscribe` idempotency, `--subscribe-id` validation, the
//! `status --format json` counters, and `--from earliest|SEQ`.
//!
//! Every assertion is on exact text, exit codes, or `status --format json`
//! fields; every wait is bounded.

use std::{
    collections::{BTreeMap, BTreeSet},
    thread,
    time::Duration,
};

use dws_tests::common::*;
use dws_tests::{Child, Output, Sig, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

// ------------------------------------------------------------------ helpers

/// `dws event subscribe <args...>` run to completion.
fn subscribe(env: &TestEnv, args: &[&str]) -> Output {
    let mut a = vec!["event", "subscribe"];
    a.extend_from_slice(args);
    env.dws(&a).run_with_timeout(EXIT_TIMEOUT)
}

/// `n` distinct event ids `<prefix>-000`… with `payload_len` bytes of data each.
fn items(prefix: &str, range: std::ops::Range<usize>, payload_len: usize) -> Vec<(String, String)> {
    range
        .map(|i| {
            let id = format!("{prefix}-{i:04}");
            let mut data = format!("{id}:");
            while data.len() < payload_len {
                data.push('x');
            }
            (id, data)
        })
        .collect()
}

/// Asserts that the seqs of `events` strictly increase and no event id repeats.
fn assert_ordered_unique(events: &[Value], what: &str) {
    let mut seen = BTreeSet::new();
    let mut last = 0;
    for e in events {
        let seq = u64_of(e, "seq");
        assert!(
            seq > last,
            "{what}: seq {seq} after {last} (not increasing): {e}"
        );
        last = seq;
        assert!(
            seen.insert(str_of(e, "event_id").to_owned()),
            "{what}: event id delivered twice: {e}"
        );
    }
}

/// Waits until `c` has printed a line for every id in `want` (lines with
/// other ids are allowed here and checked by the caller); returns all lines
/// up to the one that completed the set.
fn wait_for_ids(c: &mut Child, want: &BTreeSet<String>, what: &str) -> Vec<String> {
    let mut missing = want.clone();
    c.wait_stdout_line(what, EXIT_TIMEOUT, |l| {
        if let Ok(v) = serde_json::from_str::<Value>(l) {
            if let Some(id) = v["event_id"].as_str() {
                missing.remove(id);
            }
        }
        missing.is_empty()
    })
}

/// Run 2 of a `kill -9` test: `consume` (which attaches `sub_id`) must
/// print every id of `published` that run 1 (`run1`) did not print, then
/// a sentinel event `sentinel` of `event_type` published now; it ends on
/// SIGTERM with a clean exit, its events in order and unique, and every
/// published id arrived across the two runs. Returns run 2's output and
/// events.
fn second_run(
    env: &TestEnv,
    consume: &[&str],
    sub_id: &str,
    event_type: &str,
    published: &[&[(String, String)]],
    run1: &Output,
    sentinel: &str,
) -> (Output, Vec<Value>) {
    let mut r = env.dws(consume).spawn();
    assert_eq!(r.wait_ready().subscribe_id, sub_id);
    let p1_ids: BTreeSet<String> = ids_of(&complete_events(run1)).into_iter().collect();
    let published: Vec<&String> = published
        .iter()
        .flat_map(|p| p.iter().map(|(id, _)| id))
        .collect();
    let missing: BTreeSet<String> = published
        .iter()
        .filter(|id| !p1_ids.contains(id.as_str()))
        .map(|id| id.to_string())
        .collect();
    wait_for_ids(&mut r, &missing, "every event not printed by run 1");
    env.publish(event_type, "end", &["--id", sentinel]);
    let quoted = format!("\"{sentinel}\"");
    r.wait_stdout_line("the sentinel", EXIT_TIMEOUT, |l| l.contains(&quoted));
    r.signal(Sig::SIGTERM);
    let run2 = r.wait_exit(EXIT_TIMEOUT);
    let p2 = run2.json_lines();
    run2.assert_clean_exit("signal", p2.len() as u64);
    assert_ordered_unique(&p2, "run 2");
    let all: BTreeSet<String> = p1_ids.into_iter().chain(ids_of(&p2)).collect();
    for id in published {
        assert!(all.contains(id), "event {id} never arrived\n{run1}\n{run2}");
    }
    (run2, p2)
}

// ------------------------------------------------------------------ owned / durable lifetimes

#[test]
fn sigterm_of_a_consume_that_created_its_subscription_removes_it() {
    let env = TestEnv::new();
    let mut c = env.dws(["event", "consume", "own.k"]).spawn();
    let id = c.wait_ready().subscribe_id;
    let st = env.status();
    let s = listed(&st, &id);
    assert_eq!(
        s["owned"], true,
        "a consume without --subscribe-id owns it\n{st:#}"
    );
    assert_eq!(s["attached_pid"], c.pid(), "{st:#}");
    c.signal(Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 0);
    let st = env.status();
    assert_eq!(st["running"], true, "the bus outlives the consumer\n{st:#}");
    assert_eq!(
        st["subscriptions"],
        serde_json::json!([]),
        "a clean exit removes the subscription it created\n{st:#}"
    );
    assert_eq!(st["consumers"], serde_json::json!([]), "{st:#}");
}

#[test]
fn a_subscribed_id_survives_sigterm_of_its_consumer_detached_without_expiry() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["dur.k", "--id", "X"], "X");
    let mut c = env.dws(["event", "consume", "--subscribe-id", "X"]).spawn();
    assert_eq!(c.wait_ready().subscribe_id, "X");
    let st = env.status();
    let s = listed(&st, "X");
    assert_eq!(s["owned"], false, "{st:#}");
    assert_eq!(s["attached_pid"], c.pid(), "{st:#}");
    let before = now_ms();
    c.signal(Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 0);
    let st = env.status();
    let s = listed(&st, "X");
    assert_eq!(
        s["attached_pid"],
        Value::Null,
        "detached after SIGTERM\n{st:#}"
    );
    assert_eq!(st["consumers"], serde_json::json!([]), "{st:#}");
    let detached = u64_of(s, "detached_since_unix_ms");
    assert!(
        detached >= before && detached <= now_ms(),
        "detached_since_unix_ms {detached} is the moment of the SIGTERM (>= {before})\n{st:#}"
    );
    // Created by `subscribe` without --ttl: it lives until removed.
    assert_eq!(s["ttl_ms"], Value::Null, "{st:#}");
    assert_eq!(s["expires_at_unix_ms"], Value::Null, "{st:#}");
}

#[test]
fn ephemeral_consume_on_a_subscribed_id_removes_it_on_sigterm() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["eph.k", "--id", "X"], "X");
    let mut c = env
        .dws(["event", "consume", "--subscribe-id", "X", "--ephemeral"])
        .spawn();
    assert_eq!(c.wait_ready().subscribe_id, "X");
    assert_eq!(listed(&env.status(), "X")["attached_pid"], c.pid());
    c.signal(Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 0);
    let st = env.status();
    assert!(
        sub(&st, "X").is_none(),
        "--ephemeral removes the subscription on a clean exit\n{st:#}"
    );
}

// ------------------------------------------------------------------ kill -9 and redelivery

/// `kill -9` midway through 100 events (published concurrently while the
/// consumer reads), 20 more while it is dead, then a resume: every event
/// arrives at least once, and only events the first run could have been sent
/// (its printed lines plus one window) come again, marked redelivered, first.
#[test]
fn kill_9_midway_then_resume_delivers_every_event_at_least_once() {
    const WINDOW: usize = 8;
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_WINDOW", "8")]);
    subscribe_ok(&env, &["mid.k", "--id", "mid"], "mid");
    let mut c = env
        .dws(["event", "consume", "mid.k", "--subscribe-id", "mid"])
        .spawn();
    c.wait_ready();
    let first = items("m", 0..100, 64);
    let pub1 = thread::scope(|s| {
        let publishers = s.spawn(|| publish_parallel(&env, "mid.k", &first, 4));
        c.wait_stdout_lines(10, EXIT_TIMEOUT);
        c.signal(Sig::SIGKILL);
        publishers.join().expect("publishers")
    });
    let run1 = c.wait_exit(EXIT_TIMEOUT);
    assert_eq!(run1.signal, Some(9), "{run1}");
    let p1 = complete_events(&run1);
    assert!(p1.len() >= 10, "{run1}");
    assert_ordered_unique(&p1, "run 1");
    assert!(p1.iter().all(|e| e["redelivered"] == false), "{run1}");

    let st = env.status();
    let s = listed(&st, "mid");
    assert_eq!(
        s["attached_pid"],
        Value::Null,
        "kill -9 leaves it detached\n{st:#}"
    );
    assert_eq!(st["consumers"], serde_json::json!([]), "{st:#}");

    let second = items("m", 100..120, 64);
    let pub2 = publish_parallel(&env, "mid.k", &second, 2);

    // Every published id arrives at least once across the two runs.
    let (run2, p2) = second_run(
        &env,
        &["event", "consume", "mid.k", "--subscribe-id", "mid"],
        "mid",
        "mid.k",
        &[&first, &second],
        &run1,
        "m-end",
    );
    let p1_ids: BTreeSet<String> = ids_of(&p1).into_iter().collect();
    // Redelivered lines come first, and only for events among the first
    // |run 1 lines| + WINDOW of the subscription (what run 1 could have been
    // sent: it acks only what it printed, and at most a window is unacked).
    let mut by_seq: Vec<u64> = pub1.iter().chain(&pub2).map(|p| u64_of(p, "seq")).collect();
    by_seq.sort_unstable();
    let could_have_been_sent = by_seq[(p1.len() + WINDOW).min(by_seq.len()) - 1];
    let n_redelivered = p2.iter().filter(|e| e["redelivered"] == true).count();
    assert!(
        n_redelivered <= WINDOW,
        "at most one window is redelivered\n{run2}"
    );
    for (i, e) in p2.iter().enumerate() {
        let id = str_of(e, "event_id");
        if i < n_redelivered {
            assert_eq!(
                e["redelivered"], true,
                "redelivered events come first\n{run2}"
            );
            assert!(
                u64_of(e, "seq") <= could_have_been_sent,
                "redelivered {e} could not have been sent to run 1 (its {} lines + window {WINDOW} \
                 end at seq {could_have_been_sent})\n{run1}\n{run2}",
                p1.len()
            );
        } else {
            assert_eq!(
                e["redelivered"], false,
                "redelivered events come first\n{run2}"
            );
        }
        if p1_ids.contains(id) {
            assert_eq!(
                e["redelivered"], true,
                "an event printed by run 1 may come again only marked redelivered: {e}\n{run2}"
            );
        }
    }
}

/// A consumer whose stdout is full holds a window of sent, unacked events;
/// `kill -9` it, and on resume exactly those come first with
/// `"redelivered":true`, then everything else, nothing lost.
#[test]
fn events_unacked_at_kill_9_come_again_marked_redelivered() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_WINDOW", "8")]);
    subscribe_ok(&env, &["red.k", "--id", "red"], "red");
    let mut c = env
        .dws(["event", "consume", "red.k", "--subscribe-id", "red"])
        .spawn_stdout_unread();
    c.wait_ready();
    // 100 × ~2 KiB: far more than the 64 KiB pipe plus one window.
    let first = items("r", 0..100, 2048);
    let pub1 = publish_parallel(&env, "red.k", &first, 4);
    let head_at_kill = pub1.iter().map(|p| u64_of(p, "seq")).max().expect("seqs");
    // Stalled: the window is full and nothing more gets acked.
    let mut last: Option<(u64, u64)> = None;
    let mut stable = 0;
    let snap = env.wait_status(
        EXIT_TIMEOUT,
        "the stdout-stalled consumer to stop acking",
        |st| {
            let s = listed(st, "red");
            let now = (u64_of(s, "acked"), u64_of(s, "delivered"));
            stable = if last == Some(now) { stable + 1 } else { 0 };
            last = Some(now);
            u64_of(s, "in_flight") > 0 && stable >= 3
        },
    );
    let snap = listed(&snap, "red").clone();
    let in_flight = u64_of(&snap, "in_flight");
    assert!(
        in_flight <= 8,
        "in_flight is bounded by the window\n{snap:#}"
    );
    assert!(u64_of(&snap, "acked") < 100, "{snap:#}");
    c.signal(Sig::SIGKILL);
    let run1 = c.wait_exit_then_read_stdout(EXIT_TIMEOUT);
    let p1 = complete_events(&run1);
    assert_ordered_unique(&p1, "run 1");
    assert!(p1.iter().all(|e| e["redelivered"] == false), "{run1}");
    let st = env.status();
    assert_eq!(listed(&st, "red")["attached_pid"], Value::Null, "{st:#}");

    let second = items("r", 100..110, 64);
    publish_parallel(&env, "red.k", &second, 2);
    let (run2, p2) = second_run(
        &env,
        &["event", "consume", "--subscribe-id", "red"],
        "red",
        "red.k",
        &[&first, &second],
        &run1,
        "r-end",
    );
    let p1_ids: BTreeSet<String> = ids_of(&p1).into_iter().collect();

    let redelivered: Vec<&Value> = p2.iter().filter(|e| e["redelivered"] == true).collect();
    assert_eq!(
        redelivered.len() as u64,
        in_flight,
        "exactly the events in flight at the kill come again marked redelivered \
         (status before the kill: {snap:#})\n{run2}"
    );
    for (i, e) in p2.iter().enumerate() {
        assert_eq!(
            e["redelivered"] == true,
            i < redelivered.len(),
            "redelivered events come first\n{run2}"
        );
        if i < redelivered.len() {
            assert!(
                u64_of(e, "seq") > u64_of(&snap, "cursor") && u64_of(e, "seq") <= head_at_kill,
                "a redelivered event was sent before the kill: {e}\n{snap:#}"
            );
        } else {
            assert!(
                !p1_ids.contains(str_of(e, "event_id")),
                "an event printed by run 1 came again unmarked: {e}\n{run2}"
            );
        }
    }
    let st = env.status();
    let s = listed(&st, "red");
    assert_eq!(
        s["redelivered"],
        redelivered.len(),
        "status counts them\n{st:#}"
    );
    assert_eq!(s["lost_to_retention"], 0, "{st:#}");
}

// ------------------------------------------------------------------ overlapping patterns

#[test]
fn consumers_with_overlapping_patterns_each_get_every_match_exactly_once() {
    let env = TestEnv::new();
    let mut wide = env.dws(["event", "consume", "ov.*"]).spawn();
    wide.wait_ready();
    let mut narrow = env.dws(["event", "consume", "ov.a"]).spawn();
    narrow.wait_ready();
    let types = ["ov.a", "ov.b", "ov.a.x", "ov", "other.a", "ova", "ov.ab"];
    let mut want_wide = Vec::new();
    let mut want_narrow = Vec::new();
    for i in 0..10 {
        for t in types {
            let id = format!("{t}#{i}");
            env.publish(t, "p", &["--id", &id]);
            if ["ov.a", "ov.b", "ov.a.x", "ov", "ov.ab"].contains(&t) {
                want_wide.push(id.clone());
            }
            if t == "ov.a" {
                want_narrow.push(id);
            }
        }
    }
    env.publish("ov.a", "end", &["--id", "end"]);
    want_wide.push("end".into());
    want_narrow.push("end".into());
    for c in [&mut wide, &mut narrow] {
        c.wait_stdout_line("the sentinel", EXIT_TIMEOUT, |l| l.contains("\"end\""));
        c.signal(Sig::SIGTERM);
    }
    for (c, want, pattern) in [(wide, want_wide, "ov.*"), (narrow, want_narrow, "ov.a")] {
        let out = c.wait_exit(EXIT_TIMEOUT);
        out.assert_clean_exit("signal", want.len() as u64);
        let got = ids_of(&out.json_lines());
        assert_eq!(
            got, want,
            "{pattern}: every match once, in order, nothing else\n{out}"
        );
    }
}

// ------------------------------------------------------------------ takeover

#[test]
fn takeover_replaces_the_attached_consumer_which_exits_with_taken_over() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["tk.k", "--id", "X"], "X");
    let mut a = env
        .dws(["event", "consume", "tk.k", "--subscribe-id", "X"])
        .spawn();
    a.wait_ready();
    let refused = env
        .dws(["event", "consume", "tk.k", "--subscribe-id", "X"])
        .run_with_timeout(EXIT_TIMEOUT);
    let err = refused.assert_error(1);
    assert!(err.contains("already attached"), "{refused}");
    assert!(
        err.contains(&format!("(pid {})", a.pid())),
        "the error names the attached consumer's pid {}\n{refused}",
        a.pid()
    );
    assert_eq!(refused.stdout, "", "{refused}");
    assert!(
        a.is_running(),
        "a refused attach leaves A alone\n{}",
        a.report()
    );

    let mut b = env
        .dws([
            "event",
            "consume",
            "tk.k",
            "--subscribe-id",
            "X",
            "--takeover",
        ])
        .spawn();
    assert_eq!(b.wait_ready().subscribe_id, "X");
    let out_a = a.wait_exit(EXIT_TIMEOUT);
    out_a.assert_clean_exit("taken_over", 0);
    assert_eq!(
        listed(&env.status(), "X")["attached_pid"],
        b.pid(),
        "X is attached to B now"
    );
    env.publish("tk.k", "after", &["--id", "after"]);
    let lines = b.wait_stdout_lines(1, EXIT_TIMEOUT);
    let v: Value = serde_json::from_str(&lines[0]).expect("NDJSON");
    assert_eq!(v["event_id"], "after", "{}", b.report());
    assert_eq!(v["subscribe_id"], "X", "{}", b.report());
    b.signal(Sig::SIGTERM);
    b.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 1);
}

// ------------------------------------------------------------------ TTL

#[test]
fn a_detached_subscription_disappears_when_its_ttl_expires() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["ttl.k", "--id", "t", "--ttl", "2s"], "t");
    let st = env.status();
    let s = listed(&st, "t");
    assert_eq!(s["ttl_ms"], 2000, "{st:#}");
    assert_eq!(s["attached_pid"], Value::Null, "{st:#}");
    // Time-based on purpose: a 2 s TTL, bounded at 20 s.
    let st = env.wait_status(Duration::from_secs(20), "subscription t to expire", |st| {
        sub(st, "t").is_none()
    });
    assert_eq!(st["running"], true, "{st:#}");
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "t",
            "--duration",
            "1s",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_error(1);
}

// ------------------------------------------------------------------ retention gap

#[test]
fn events_evicted_before_delivery_are_reported_as_one_exact_gap_line() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_EVENTS", "10")]);
    subscribe_ok(&env, &["g.k", "--id", "g"], "g");
    let published: Vec<u64> = (0..30)
        .map(|i| {
            u64_of(
                &env.publish("g.k", &format!("p{i}"), &["--id", &format!("g-{i}")]),
                "seq",
            )
        })
        .collect();
    // Fresh bus: seqs 1..=30, the log keeps the last 10.
    assert_eq!(published, (1..=30).collect::<Vec<u64>>());
    let kept = &published[20..];
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "g",
            "--max-events",
            "10",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 10);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 3, "ready, gap, exited\n{out}");
    assert_eq!(
        lines[1],
        format!(
            "[event] gap \u{2014} lost 20 event(s) before seq {} (retention)",
            kept[0]
        ),
        "{out}"
    );
    let events = out.json_lines();
    let seqs: Vec<u64> = events.iter().map(|e| u64_of(e, "seq")).collect();
    assert_eq!(seqs, kept, "the retained events arrive\n{out}");
    assert_eq!(
        ids_of(&events),
        (20..30).map(|i| format!("g-{i}")).collect::<Vec<_>>(),
        "{out}"
    );
    let st = env.status();
    let s = listed(&st, "g");
    assert_eq!(s["lost_to_retention"], 20, "{st:#}");
    assert_eq!(s["cursor"], 30, "{st:#}");
    assert_eq!(s["lag"], 0, "{st:#}");
}

// ------------------------------------------------------------------ stalled consumer

#[test]
fn a_consumer_whose_stdout_is_never_read_stalls_only_itself() {
    const RETENTION: u64 = 500;
    const WINDOW: u64 = 16;
    const N: usize = 1500;
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_BUS_RETENTION_EVENTS", "500"),
        ("DWS_EVENT_BUS_WINDOW", "16"),
    ]);
    subscribe_ok(&env, &["st.*", "--id", "slow"], "slow");
    let mut slow = env
        .dws(["event", "consume", "--subscribe-id", "slow"])
        .spawn_stdout_unread();
    slow.wait_ready();
    let mut fast = env.dws(["event", "consume", "st.a"]).spawn();
    let fast_id = fast.wait_ready().subscribe_id;

    // ~1 KiB each: the slow consumer's 64 KiB pipe fills after ~60 events.
    let all = items("s", 0..N, 1024);
    let published = publish_parallel(&env, "st.a", &all, 4);
    assert_eq!(published.len(), N, "every publish completed");
    assert!(published.iter().all(|p| p["duplicate"] == false));

    let want: BTreeSet<String> = all.iter().map(|(id, _)| id.clone()).collect();
    wait_for_ids(&mut fast, &want, "the fast consumer to receive every event");
    let st = env.status();
    assert_eq!(st["running"], true, "the bus answers\n{st:#}");
    let s = listed(&st, "slow");
    assert_eq!(s["attached_pid"], slow.pid(), "{st:#}");
    assert!(slow.is_running(), "{}", slow.report());
    let lost = u64_of(s, "lost_to_retention");
    let pending = u64_of(s, "pending");
    assert!(
        pending <= RETENTION + WINDOW,
        "pending {pending} is bounded\n{st:#}"
    );
    assert!(
        lost > 0,
        "{} events are far past retention: lost > 0\n{st:#}",
        N
    );
    assert!(u64_of(s, "in_flight") <= WINDOW, "{st:#}");
    let log = &st["log"];
    assert!(
        u64_of(log, "events") <= RETENTION + WINDOW,
        "the log stays bounded (retention + one pinned window)\n{st:#}"
    );
    let f = listed(&st, &fast_id);
    assert_eq!(f["lost_to_retention"], 0, "{st:#}");

    fast.signal(Sig::SIGTERM);
    let out = fast.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", N as u64);
    let events = out.json_lines();
    assert_ordered_unique(&events, "fast consumer");
    assert_eq!(events.len(), N, "{}", out.stderr);
    assert!(slow.is_running(), "{}", slow.report());
}

/// stdout is written without blocking while the reader keeps up and by the
/// writer thread once the pipe is full: a reader that stalls and comes back
/// gets every event once, in order, across both hand-overs.
#[test]
fn a_reader_that_stalls_and_comes_back_gets_every_event_in_order() {
    const N: usize = 400;
    let env = TestEnv::new();
    let slow = env.dws(["event", "consume", "sr.a"]).spawn_stdout_unread();
    let mut slow = slow;
    slow.wait_ready();
    // ~1 KiB each: the 64 KiB pipe fills after ~60 events, the rest waits
    // in the writer thread and the bus.
    let first = items("a", 0..N / 2, 1024);
    assert_eq!(publish_parallel(&env, "sr.a", &first, 2).len(), N / 2);
    let mut reader = slow.start_reading();
    let second = items("b", N / 2..N, 1024);
    assert_eq!(publish_parallel(&env, "sr.a", &second, 2).len(), N / 2);
    let want: BTreeSet<String> = first
        .iter()
        .chain(&second)
        .map(|(id, _)| id.clone())
        .collect();
    wait_for_ids(&mut reader, &want, "every event after the reader came back");
    reader.signal(Sig::SIGTERM);
    let out = reader.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", N as u64);
    let events = out.json_lines();
    assert_ordered_unique(&events, "the reader that stalled");
    assert_eq!(events.len(), N, "{}", out.stderr);
}

// ------------------------------------------------------------------ unsubscribe

#[test]
fn unsubscribe_while_attached_ends_the_consumer_with_bus_shutdown() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["un.k", "--id", "U"], "U");
    let mut c = env
        .dws(["event", "consume", "un.k", "--subscribe-id", "U"])
        .spawn();
    c.wait_ready();
    env.dws(["event", "unsubscribe", "U"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    c.wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("bus_shutdown", 0);
    let st = env.status();
    assert!(sub(&st, "U").is_none(), "{st:#}");
}

#[test]
fn unsubscribe_of_an_unknown_id_fails_with_exit_1_naming_it() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["un.k", "--id", "known"], "known");
    let out = env
        .dws(["event", "unsubscribe", "nope"])
        .run_with_timeout(EXIT_TIMEOUT);
    let err = out.assert_error(1);
    assert_eq!(err, "Error: subscription(s) not found: nope", "{out}");
    assert!(
        sub(&env.status(), "known").is_some(),
        "nothing else removed"
    );
}

// ------------------------------------------------------------------ stop

/// Two subscriptions X and Y, each with a resident consumer.
fn two_attached(env: &TestEnv) -> (Child, Child) {
    subscribe_ok(env, &["sx.k", "--id", "X"], "X");
    subscribe_ok(env, &["sy.k", "--id", "Y"], "Y");
    let mut cx = env.dws(["event", "consume", "--subscribe-id", "X"]).spawn();
    cx.wait_ready();
    let mut cy = env.dws(["event", "consume", "--subscribe-id", "Y"]).spawn();
    cy.wait_ready();
    (cx, cy)
}

#[test]
fn stop_subscribe_id_closes_only_that_consumer_and_keeps_the_subscription() {
    let env = TestEnv::new();
    let (cx, mut cy) = two_attached(&env);
    env.dws(["event", "stop", "--subscribe-id", "X"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    // Issue 44, item 5: `stopped`, which an orchestrator does not restart
    // (it was `bus_shutdown`, read as "restart").
    cx.wait_exit(EXIT_TIMEOUT).assert_clean_exit("stopped", 0);
    assert!(
        cy.is_running(),
        "Y's consumer is untouched\n{}",
        cy.report()
    );
    let st = env.status();
    assert_eq!(listed(&st, "X")["attached_pid"], Value::Null, "{st:#}");
    assert_eq!(listed(&st, "Y")["attached_pid"], cy.pid(), "{st:#}");
    env.publish("sy.k", "still", &[]);
    cy.wait_stdout_lines(1, EXIT_TIMEOUT);
    cy.signal(Sig::SIGTERM);
    cy.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 1);
}

#[test]
fn stop_subscribe_id_dry_run_names_the_consumer_and_stops_nothing() {
    let env = TestEnv::new();
    let (mut cx, mut cy) = two_attached(&env);
    let out = env
        .dws(["event", "stop", "--subscribe-id", "X", "--dry-run"])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    assert!(
        out.stdout.contains(&cx.pid().to_string()),
        "--dry-run prints the consumer that would be stopped\n{out}"
    );
    assert!(!out.stdout.contains(&cy.pid().to_string()), "{out}");
    let st = env.status();
    assert_eq!(listed(&st, "X")["attached_pid"], cx.pid(), "{st:#}");
    assert!(
        cx.is_running() && cy.is_running(),
        "{}\n{}",
        cx.report(),
        cy.report()
    );
    env.publish("sx.k", "still", &[]);
    cx.wait_stdout_lines(1, EXIT_TIMEOUT);
}

#[test]
fn stop_dry_run_stops_nothing_then_stop_ends_the_bus_and_every_consumer() {
    let env = TestEnv::new();
    let (mut cx, mut cy) = two_attached(&env);
    let bus_pid = env.status()["bus"]["pid"].as_i64().expect("bus.pid") as i32;
    let dry = env
        .dws(["event", "stop", "--dry-run"])
        .run_with_timeout(EXIT_TIMEOUT);
    dry.assert_code(0);
    assert!(
        dry.stdout.contains(&bus_pid.to_string()),
        "names the bus\n{dry}"
    );
    assert!(
        cx.is_running() && cy.is_running(),
        "{}\n{}",
        cx.report(),
        cy.report()
    );
    assert_eq!(env.status()["running"], true);

    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    cx.wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("bus_shutdown", 0);
    cy.wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("bus_shutdown", 0);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after `dws event stop`");
    let st = env.status();
    assert_eq!(st["running"], false, "{st:#}");
}

// ------------------------------------------------------------------ subscribe

#[test]
fn subscribe_twice_with_the_same_id_and_spec_is_a_no_op() {
    let env = TestEnv::new();
    subscribe_ok(
        &env,
        &["id.k", "id.j", "--id", "same", "--filter", "^id"],
        "same",
    );
    subscribe_ok(
        &env,
        &["id.k", "id.j", "--id", "same", "--filter", "^id"],
        "same",
    );
    let st = env.status();
    assert_eq!(
        st["subscriptions"].as_array().map(Vec::len),
        Some(1),
        "one subscription\n{st:#}"
    );
    assert_eq!(
        listed(&st, "same")["patterns"],
        serde_json::json!(["id.k", "id.j"])
    );
    assert_eq!(listed(&st, "same")["filter"], "^id");
}

#[test]
fn subscribe_with_an_existing_id_and_different_spec_fails_with_exit_2() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["id.k", "--id", "same"], "same");
    for args in [
        &["id.other", "--id", "same"][..],
        &["id.k", "id.j", "--id", "same"][..],
        &["id.k", "--id", "same", "--filter", "x"][..],
    ] {
        let out = subscribe(&env, args);
        out.assert_error(2);
        assert_eq!(out.stdout, "", "{out}");
    }
    let st = env.status();
    assert_eq!(
        listed(&st, "same")["patterns"],
        serde_json::json!(["id.k"]),
        "unchanged\n{st:#}"
    );
    assert_eq!(
        st["subscriptions"].as_array().map(Vec::len),
        Some(1),
        "{st:#}"
    );
}

#[test]
fn subscribe_format_json_prints_id_created_and_patterns() {
    let env = TestEnv::new();
    let parse = |out: &Output| -> Value {
        out.assert_code(0);
        assert_eq!(out.stdout_lines().len(), 1, "one JSON line\n{out}");
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{out}"))
    };
    let first = subscribe(&env, &["js.*", "--id", "J", "--format", "json"]);
    let v = parse(&first);
    assert_eq!(v["id"], "J", "{first}");
    assert_eq!(v["created"], true, "{first}");
    assert_eq!(v["patterns"], serde_json::json!(["js.*"]), "{first}");
    let again = subscribe(&env, &["js.*", "--id", "J", "--format", "json"]);
    let v = parse(&again);
    assert_eq!(v["id"], "J", "{again}");
    assert_eq!(v["created"], false, "the repeat created nothing\n{again}");
    let generated = subscribe(&env, &["js.*", "--format", "json"]);
    let v = parse(&generated);
    let id = str_of(&v, "id");
    assert!(id != "J" && !id.is_empty(), "a generated id\n{generated}");
    assert_eq!(v["created"], true, "{generated}");
    assert!(sub(&env.status(), id).is_some(), "listed");
}

// ------------------------------------------------------------------ consume --subscribe-id validation

#[test]
fn consume_subscribe_id_with_matching_keys_attaches() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["mk.a", "mk.b", "--id", "M"], "M");
    let mut c = env
        .dws([
            "event",
            "consume",
            "mk.a,mk.b",
            "--subscribe-id",
            "M",
            "--max-events",
            "1",
        ])
        .spawn();
    let ready = c.wait_ready();
    assert_eq!(ready.subscribe_id, "M");
    assert_eq!(ready.event_key, "mk.a,mk.b");
    env.publish("mk.b", "b", &[]);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 1);
    assert_eq!(out.json_lines()[0]["subscribe_id"], "M", "{out}");
    assert!(
        sub(&env.status(), "M").is_some(),
        "a reused subscription stays"
    );
}

#[test]
fn consume_subscribe_id_with_mismatching_keys_fails_with_exit_2() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["mk.a", "--id", "M"], "M");
    let out = env
        .dws([
            "event",
            "consume",
            "mk.b",
            "--subscribe-id",
            "M",
            "--max-events",
            "1",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_error(2);
    assert_eq!(out.stdout, "", "{out}");
    let st = env.status();
    assert_eq!(
        listed(&st, "M")["patterns"],
        serde_json::json!(["mk.a"]),
        "{st:#}"
    );
    assert_eq!(listed(&st, "M")["attached_pid"], Value::Null, "{st:#}");
}

#[test]
fn consume_subscribe_id_with_from_or_ttl_fails_with_exit_2() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["mk.a", "--id", "M"], "M");
    for extra in [["--from", "earliest"], ["--from", "1"], ["--ttl", "5s"]] {
        let mut args = vec![
            "event",
            "consume",
            "--subscribe-id",
            "M",
            "--max-events",
            "1",
        ];
        args.extend_from_slice(&extra);
        let out = env.dws(&args).run_with_timeout(EXIT_TIMEOUT);
        out.assert_error(2);
        assert_eq!(out.stdout, "", "{out}");
    }
    assert_eq!(listed(&env.status(), "M")["attached_pid"], Value::Null);
}

// ------------------------------------------------------------------ status counters

#[test]
fn status_json_tracks_an_attached_consumer_its_acks_and_event_type_counts() {
    let env = TestEnv::new();
    let mut c = env.dws(["event", "consume", "sc.a"]).spawn();
    let ready = c.wait_ready();
    let st = env.status();
    let consumers = st["consumers"].as_array().expect("consumers array");
    assert_eq!(consumers.len(), 1, "{st:#}");
    assert_eq!(consumers[0]["pid"], c.pid(), "{st:#}");
    assert_eq!(
        consumers[0]["subscription_id"],
        ready.subscribe_id.as_str(),
        "{st:#}"
    );
    let subs = st["subscriptions"].as_array().expect("subscriptions array");
    assert_eq!(subs.len(), 1, "{st:#}");
    assert_eq!(subs[0]["id"], ready.subscribe_id.as_str(), "{st:#}");
    assert_eq!(subs[0]["attached_pid"], c.pid(), "{st:#}");
    assert_eq!(subs[0]["owned"], true, "{st:#}");

    let mut seqs = BTreeMap::new();
    for id in ["a1", "a2", "a3", "a3"] {
        let p = env.publish("sc.a", id, &["--id", id]);
        seqs.insert(id, u64_of(&p, "seq"));
    }
    env.publish("sc.other", "o", &["--id", "o1"]);
    c.wait_stdout_lines(3, EXIT_TIMEOUT);
    let st = env.wait_status(EXIT_TIMEOUT, "the 3 events acked", |st| {
        let s = listed(st, &ready.subscribe_id);
        s["cursor"] == s["head_seq"] && s["lag"] == 0 && s["acked"] == 3
    });
    let s = listed(&st, &ready.subscribe_id);
    assert_eq!(s["head_seq"], st["log"]["head_seq"], "{st:#}");
    assert_eq!(
        u64_of(s, "head_seq"),
        4,
        "a1 a2 a3 sc.other: 4 events in the log\n{st:#}"
    );
    for k in ["matched", "delivered", "acked"] {
        assert_eq!(s[k], 3, "{k}\n{st:#}");
    }
    for k in ["pending", "in_flight", "redelivered", "lost_to_retention"] {
        assert_eq!(s[k], 0, "{k}\n{st:#}");
    }
    let consumer = &st["consumers"][0];
    assert_eq!(consumer["delivered"], 3, "{st:#}");
    assert_eq!(consumer["acked"], 3, "{st:#}");
    assert_eq!(consumer["in_flight"], 0, "{st:#}");
    let types = st["event_types"].as_array().expect("event_types array");
    let of = |t: &str| {
        types
            .iter()
            .find(|e| e["event_type"] == t)
            .unwrap_or_else(|| panic!("event type {t} listed\n{st:#}"))
    };
    // `received` counts every arrival, `duplicates` those dropped by dedup.
    assert_eq!(of("sc.a")["received"], 4, "{st:#}");
    assert_eq!(of("sc.a")["duplicates"], 1, "{st:#}");
    assert_eq!(of("sc.other")["received"], 1, "{st:#}");
    assert_eq!(of("sc.other")["duplicates"], 0, "{st:#}");
    assert_eq!(seqs["a3"], 3, "the duplicate kept the original seq");

    c.signal(Sig::SIGTERM);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", 3);
    assert_eq!(ids_of(&out.json_lines()), ["a1", "a2", "a3"], "{out}");
}

// ------------------------------------------------------------------ --from

#[test]
fn from_earliest_on_a_new_subscription_receives_events_already_in_the_log() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_IDLE_TIMEOUT", "10m")]);
    // Keep the log alive: a detached subscription holds the bus too.
    subscribe_ok(&env, &["keep.*", "--id", "keep"], "keep");
    let seqs: Vec<u64> = ["e1", "e2", "e3"]
        .iter()
        .map(|id| u64_of(&env.publish("fe.k", id, &["--id", id]), "seq"))
        .collect();
    let out = env
        .dws([
            "event",
            "consume",
            "fe.k",
            "--from",
            "earliest",
            "--max-events",
            "3",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 3);
    let events = out.json_lines();
    assert_eq!(ids_of(&events), ["e1", "e2", "e3"], "{out}");
    let got: Vec<u64> = events.iter().map(|e| u64_of(e, "seq")).collect();
    assert_eq!(got, seqs, "{out}");

    // A durable one created with --from earliest, then attached by id.
    subscribe_ok(&env, &["fe.k", "--id", "E", "--from", "earliest"], "E");
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "E",
            "--max-events",
            "3",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 3);
    assert_eq!(ids_of(&out.json_lines()), ["e1", "e2", "e3"], "{out}");

    // --from SEQ starts at that seq.
    let out = env
        .dws([
            "event",
            "consume",
            "fe.k",
            "--from",
            &seqs[1].to_string(),
            "--max-events",
            "2",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 2);
    assert_eq!(ids_of(&out.json_lines()), ["e2", "e3"], "{out}");
}

#[test]
fn from_latest_is_the_default_and_skips_events_already_in_the_log() {
    let env = TestEnv::new();
    env.publish("fl.k", "old", &["--id", "old"]);
    let mut c = env
        .dws(["event", "consume", "fl.k", "--max-events", "1"])
        .spawn();
    c.wait_ready();
    env.publish("fl.k", "new", &["--id", "new"]);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 1);
    assert_eq!(ids_of(&out.json_lines()), ["new"], "{out}");
}

/// SIGTERM still ends a consumer whose stdout reader stalled (stopped
/// reading without closing the pipe): exit 0, reason `signal`, and its owned
/// subscription is removed — no `kill -9` needed, nothing left behind.
#[test]
fn sigterm_ends_a_consumer_whose_stdout_is_stalled() {
    let env = TestEnv::new();
    let mut c = env
        .dws(["event", "consume", "stall.k"])
        .spawn_stdout_unread();
    c.wait_ready();
    // 100 × ~2 KiB: far more than the 64 KiB pipe, so writing blocks.
    publish_parallel(&env, "stall.k", &items("s", 0..100, 2048), 4);
    env.wait_status(EXIT_TIMEOUT, "the consumer to stall", |st| {
        st["consumers"][0]["in_flight"].as_u64().unwrap_or(0) > 0
    });
    c.signal(Sig::SIGTERM);
    let out = c.wait_exit_then_read_stdout(EXIT_TIMEOUT);
    out.assert_code(0);
    assert_eq!(out.exited().reason, "signal", "{out}");
    assert_eq!(
        env.status()["subscriptions"],
        serde_json::json!([]),
        "owned subscription removed: {out}"
    );
}
