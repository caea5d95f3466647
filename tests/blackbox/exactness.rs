//! Delivery exactness: acks name exactly what reached stdout, and a gap is
//! reported until a consumer reads past it.
//!
//! - A parked event replayed behind higher seqs is acked once `dws` wrote
//!   it (write acks name seqs), and a cumulative `Ack` from an older client
//!   settles only what was delivered up to the acked seq, in delivery order.
//! - A gap sent to a consumer that dies before reading past it (stdout
//!   stalled, or the process stopped) goes to the successor, with the seq
//!   after the loss, and agrees with `lost_to_retention`.
//! - Bad explicit-ack lines with stderr unread never stop delivery.

use std::{
    collections::BTreeSet, io::Read, os::unix::fs::OpenOptionsExt, path::Path, time::Duration,
};

use bytes::BytesMut;
use dws_tests::{
    common::{listed, u64_of},
    wire::Wire,
    Child, Output, Sig, TestEnv, EXIT_TIMEOUT,
};
use proto::{
    v1::{
        client_frame::Kind as C, server_frame::Kind as S, Ack, ClientFrame, Publish, StatusRequest,
        Subscribe,
    },
    PROTOCOL_VERSION,
};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(30);

fn frame(kind: C) -> ClientFrame {
    ClientFrame { kind: Some(kind) }
}

fn greeted(socket: &Path) -> Wire {
    let mut w = Wire::connect(socket);
    w.hello(PROTOCOL_VERSION);
    match w.read_frame(LONG).kind {
        Some(S::HelloAck(_)) => w,
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

/// A raw client that attached to the named subscription `s1`.
fn attached_to_s1(socket: &Path) -> Wire {
    let mut w = greeted(socket);
    w.send(&frame(C::Subscribe(Subscribe {
        request_id: 1,
        subscription_id: "s1".into(),
        attach: true,
        must_exist: true,
        ..Subscribe::default()
    })));
    w
}

/// Publishes `n` events of `event_type`, ids `<prefix>-<i>`, each with
/// about `payload` bytes of data, pipelined on one connection; waits for
/// every answer.
fn publish_many(env: &TestEnv, event_type: &str, prefix: &str, n: u64, payload: usize) {
    let socket = env.bus_meta_socket().expect("the bus socket");
    let mut w = greeted(&socket);
    let mut bytes = BytesMut::new();
    for i in 1..=n {
        let f = frame(C::Publish(Publish {
            request_id: i,
            event_type: event_type.into(),
            event_id: format!("{prefix}-{i}"),
            data: format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(payload)),
            ..Publish::default()
        }));
        proto::encode_frame(&f, &mut bytes).expect("encode");
    }
    let sent = w.send_in_background(bytes.to_vec());
    let mut answered = 0;
    while answered < n {
        match w.read_frame(LONG).kind {
            Some(S::PublishAck(_)) => answered += 1,
            other => panic!("expected PublishAck, got {other:?}"),
        }
    }
    sent.join().expect("the writer thread");
}

fn verb_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut a = vec!["event", "subscription"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--format", "json"]);
    let out = env.dws(&a).run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Subscription `s1` on `k.*`, whose event 1 (`e1`) an explicit consumer
/// termed: it is on the parked list, and nothing else is pending.
fn with_event_1_parked(env: &TestEnv) {
    env.subscribe(&["k.*", "--id", "s1"]);
    env.publish("k.e", "{\"n\":1}", &["--id", "e1"]);
    let mut c = crate::acks::explicit(env, &[]);
    c.wait_stdout_lines(1, LONG);
    c.write_stdin(b"term 1 later\n");
    env.wait_status(LONG, "event 1 parked", |st| listed(st, "s1")["parked"] == 1);
    c.signal(Sig::SIGTERM);
    c.wait_exit(LONG).assert_clean_exit("signal", 1);
}

fn seq_of(line: &str) -> u64 {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    u64_of(&v, "seq")
}

// ------------------------------------------------------------------ acks

/// The consumer caught up (2..=4 written and acked), then the operator
/// replays the parked event 1: it comes behind higher seqs, and `dws` acks
/// it once written. (It used to ack only when the last written seq rose,
/// so 1 stayed in flight for good, and came again to every next consumer.)
#[test]
fn a_parked_event_replayed_after_the_consumer_caught_up_is_acked_once_written() {
    let env = TestEnv::new();
    with_event_1_parked(&env);
    let mut c = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn();
    c.wait_ready();
    for i in 2..=4 {
        env.publish(
            "k.e",
            &format!("{{\"n\":{i}}}"),
            &["--id", &format!("e{i}")],
        );
    }
    c.wait_stdout_lines(3, LONG);
    env.wait_status(LONG, "2..=4 acked", |st| {
        let s = listed(st, "s1");
        s["acked"] == 3 && s["in_flight"] == 0
    });
    assert_eq!(verb_json(&env, &["replay-parked", "s1"])["replayed"], 1);
    let lines = c.wait_stdout_lines(4, LONG);
    assert_eq!(seq_of(&lines[3]), 1, "{lines:?}");
    env.wait_status(LONG, "the replayed event 1 acked once written", |st| {
        let s = listed(st, "s1");
        s["acked"] == 4 && s["in_flight"] == 0 && s["pending"] == 0
    });
    c.signal(Sig::SIGTERM);
    c.wait_exit(LONG).assert_clean_exit("signal", 4);
    // Nothing comes again to the next consumer.
    env.publish("k.e", "{\"n\":5}", &["--id", "e5"]);
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--max-events",
            "1",
        ])
        .run_with_timeout(LONG);
    out.assert_clean_exit("limit", 1);
    assert_eq!(seq_of(out.stdout_lines()[0]), 5, "{out}");
}

/// A client that acks cumulatively (`Ack.seq`, as older `dws` did): after
/// 2 and 3, the replayed 1 is delivered; an ack of 3 settles 2 and 3 only,
/// not 1, which was delivered after 3 and may not be written yet.
#[test]
fn a_cumulative_ack_settles_only_what_was_delivered_up_to_it() {
    let env = TestEnv::new();
    with_event_1_parked(&env);
    for i in 2..=3 {
        env.publish(
            "k.e",
            &format!("{{\"n\":{i}}}"),
            &["--id", &format!("e{i}")],
        );
    }
    let socket = env.bus_meta_socket().expect("the bus socket");
    let mut w = attached_to_s1(&socket);
    let mut got = vec![];
    while got.len() < 2 {
        match w.read_frame(LONG).kind {
            Some(S::Subscribed(_)) | Some(S::SourceState(_)) | Some(S::Heartbeat(_)) => {}
            Some(S::Event(e)) => got.push(e.seq),
            other => panic!("unexpected frame {other:?}"),
        }
    }
    assert_eq!(got, [2, 3]);
    assert_eq!(verb_json(&env, &["replay-parked", "s1"])["replayed"], 1);
    loop {
        match w.read_frame(LONG).kind {
            Some(S::Event(e)) => {
                assert_eq!(e.seq, 1);
                break;
            }
            Some(S::SourceState(_)) | Some(S::Heartbeat(_)) => {}
            other => panic!("unexpected frame {other:?}"),
        }
    }
    let status_after = |w: &mut Wire, ack: Ack, id: u64| -> Value {
        w.send(&frame(C::Ack(ack)));
        // Frames of one connection are handled in order: the status
        // answer comes after the ack was applied.
        w.send(&frame(C::StatusRequest(StatusRequest { request_id: id })));
        loop {
            if let Some(S::StatusReply(r)) = w.read_frame(LONG).kind {
                let st: Value = serde_json::from_str(&r.json).expect("status JSON");
                return listed(&st, "s1").clone();
            }
        }
    };
    let s = status_after(
        &mut w,
        Ack {
            seq: 3,
            ..Ack::default()
        },
        2,
    );
    assert_eq!(
        (s["acked"].as_u64(), s["in_flight"].as_u64()),
        (Some(2), Some(1)),
        "the ack of 3 must not settle 1, delivered after it\n{s:#}"
    );
    let s = status_after(
        &mut w,
        Ack {
            seq: 1,
            ..Ack::default()
        },
        3,
    );
    assert_eq!(
        (
            s["acked"].as_u64(),
            s["in_flight"].as_u64(),
            s["pending"].as_u64()
        ),
        (Some(3), Some(0), Some(0)),
        "{s:#}"
    );
}

// ------------------------------------------------------------------ gaps

/// A gap line: (lost, resume seq).
fn gaps(out: &Output) -> Vec<(u64, u64)> {
    out.stderr_lines()
        .iter()
        .filter_map(|l| l.strip_prefix("[event] gap — lost "))
        .map(|rest| {
            let (n, rest) = rest.split_once(" event(s) before seq ").expect("gap line");
            let s = rest.strip_suffix(" (retention)").expect("gap line");
            (n.parse().expect("lost"), s.parse().expect("seq"))
        })
        .collect()
}

/// Waits until `s1` has lost events to retention and its counters stopped
/// moving; returns its status entry.
fn wait_losses_settled(env: &TestEnv) -> Value {
    let mut last = None;
    let mut stable = 0;
    let st = env.wait_status(LONG, "s1 lost events and stopped moving", |st| {
        let s = listed(st, "s1");
        let now = (
            u64_of(s, "lost_to_retention"),
            u64_of(s, "delivered"),
            u64_of(s, "acked"),
        );
        stable = if last == Some(now) { stable + 1 } else { 0 };
        last = Some(now);
        now.0 > 0 && stable >= 3
    });
    listed(&st, "s1").clone()
}

/// The successor B of a consumer killed with a gap it never read past:
/// drains `s1`, and checks that its gap lines report exactly the events
/// nobody printed, resuming right after them.
fn successor_reports_the_loss(env: &TestEnv, first: &[u64], total: u64) {
    let mut b = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn();
    b.wait_ready();
    env.wait_status(LONG, "the successor to drain s1", |st| {
        let s = listed(st, "s1");
        s["pending"] == 0 && s["in_flight"] == 0
    });
    b.signal(Sig::SIGTERM);
    let out = b.wait_exit(LONG);
    let seen: BTreeSet<u64> = first
        .iter()
        .copied()
        .chain(out.stdout_lines().iter().map(|l| seq_of(l)))
        .collect();
    let lost: Vec<u64> = (1..=total).filter(|s| !seen.contains(s)).collect();
    let st = env.status();
    let s1 = listed(&st, "s1");
    assert_eq!(
        u64_of(s1, "lost_to_retention"),
        lost.len() as u64,
        "status agrees with what nobody printed\n{s1:#}\n{out}"
    );
    let g = gaps(&out);
    assert_eq!(
        g.iter().map(|g| g.0).sum::<u64>(),
        lost.len() as u64,
        "the successor's gap lines cover every event nobody printed ({} of them)\n{out}",
        lost.len()
    );
    let last_lost = *lost.last().expect("something was lost");
    assert!(
        g.iter().all(|&(_, seq)| seq > last_lost),
        "a gap names the seq after the loss (> {last_lost}), not an older pinned event: {g:?}"
    );
    assert_eq!(g.last().map(|g| g.1), Some(last_lost + 1), "{out}");
}

/// A's stdout is never read while retention evicts; the gap goes to A,
/// which never gets past it on stdout; A is killed: B must be told.
#[test]
fn a_gap_sent_to_a_consumer_killed_with_its_stdout_unread_reaches_the_successor() {
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_BUS_RETENTION_EVENTS", "100"),
        ("DWS_EVENT_BUS_WINDOW", "8"),
    ]);
    env.subscribe(&["k.*", "--id", "s1"]);
    let mut a = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn_stdout_unread();
    a.wait_ready();
    // 4 KiB each: 40 fill A's 64 KiB pipe and its window, before
    // retention evicts anything.
    publish_many(&env, "k.e", "a", 40, 4096);
    let mut last = None;
    let mut stable = 0;
    env.wait_status(LONG, "A to stall", |st| {
        let s = listed(st, "s1");
        let now = (u64_of(s, "delivered"), u64_of(s, "acked"));
        stable = if last == Some(now) { stable + 1 } else { 0 };
        last = Some(now);
        u64_of(s, "in_flight") > 0 && stable >= 3
    });
    publish_many(&env, "k.e", "b", 260, 64);
    let s = wait_losses_settled(&env);
    assert!(u64_of(&s, "in_flight") > 0, "A holds a window\n{s:#}");
    a.signal(Sig::SIGKILL);
    let out_a = a.wait_exit_then_read_stdout(LONG);
    // A may have printed the gap line on stderr (frames are read ahead of
    // a stalled stdout), but it never got past it on stdout: the
    // successor must be told too.
    let first: Vec<u64> = dws_tests::common::complete_events(&out_a)
        .iter()
        .map(|e| u64_of(e, "seq"))
        .collect();
    successor_reports_the_loss(&env, &first, 300);
}

/// The same while A is stopped (SIGSTOP, reading nothing) with events in
/// flight, and more is lost after A is killed: the successor is told of
/// both, in one count, resuming after the last lost seq, not at A's pinned
/// events (delivered again first).
#[test]
fn a_gap_behind_events_in_flight_names_the_seq_after_the_loss_for_the_successor() {
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_BUS_RETENTION_EVENTS", "50"),
        ("DWS_EVENT_BUS_WINDOW", "8"),
    ]);
    env.subscribe(&["k.*", "--id", "s1"]);
    let mut a: Child = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn();
    a.wait_ready();
    env.publish("k.e", "{\"n\":0}", &["--id", "a-0"]);
    a.wait_stdout_lines(1, LONG);
    env.wait_status(LONG, "event 1 acked", |st| listed(st, "s1")["acked"] == 1);
    a.signal(Sig::SIGSTOP);
    publish_many(&env, "k.e", "b", 200, 64);
    let s = wait_losses_settled(&env);
    assert_eq!(u64_of(&s, "in_flight"), 8, "A holds a full window\n{s:#}");
    a.signal(Sig::SIGKILL);
    let out_a = a.wait_exit(LONG);
    let first: Vec<u64> = out_a.stdout_lines().iter().map(|l| seq_of(l)).collect();
    assert_eq!(first, [1], "{out_a}");
    // More lost while nobody is attached, below nothing A held.
    publish_many(&env, "k.e", "c", 100, 64);
    successor_reports_the_loss(&env, &first, 301);
}

/// 1,001 events nacked for an hour while still in the log: retention
/// keeps 1,000 of them (the bound on delayed events) and loses the last,
/// seq 1001. The gap line names the seq right after it (1002, delivered
/// already), not the head's successor.
#[test]
fn the_gap_of_an_evicted_nacked_event_names_the_seq_after_it() {
    const N: u64 = 1001;
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_EVENTS", "1010")]);
    env.subscribe(&["k.*", "--id", "s1"]);
    let mut c = crate::acks::explicit(&env, &[]);
    publish_many(&env, "k.e", "a", N, 16);
    c.wait_stdout_lines(N as usize, LONG);
    let nacks: String = (1..=N).map(|i| format!("nack {i} 1h\n")).collect();
    c.write_stdin(nacks.as_bytes());
    env.wait_status(LONG, "every event nacked", |st| {
        listed(st, "s1")["delayed"] == N
    });
    // 1,010 more: the log evicts 1..=1001, all delayed.
    publish_many(&env, "k.e", "b", 1010, 16);
    let line = c.wait_stderr_line("the gap line", LONG, |l| l.starts_with("[event] gap"));
    assert_eq!(
        line,
        "[event] gap — lost 1 event(s) before seq 1002 (retention)"
    );
    let st = env.status();
    assert_eq!(listed(&st, "s1")["lost_to_retention"], 1, "{st:#}");
    c.signal(Sig::SIGTERM);
    c.wait_exit(LONG).assert_code(0);
}

// ------------------------------------------------------------------ stderr

/// `--ack explicit` with a stderr nobody reads: thousands of bad stdin
/// lines are reported within a bound and never stop delivery (they used to
/// fill the stderr pipe after ~640 lines, and `dws` then blocked for good).
#[test]
fn bad_ack_lines_with_stderr_unread_never_stop_delivery() {
    let env = TestEnv::new();
    env.subscribe(&["k.*", "--id", "s1"]);
    let fifo = env.root().join("stderr.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    // Opened for reading (so the writer's open does not wait), never read.
    let mut unread = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(&fifo)
        .expect("open the fifo");
    let mut c = env
        .command(
            "sh",
            [
                "-c",
                "exec dws event consume --subscribe-id s1 --ack explicit 2>\"$0\"",
                fifo.to_str().expect("utf-8 path"),
            ],
        )
        .stdin_pipe()
        .spawn();
    env.wait_status(LONG, "the consumer attached", |st| {
        !listed(st, "s1")["attached_pid"].is_null()
    });
    env.publish("k.e", "{\"n\":1}", &["--id", "e1"]);
    c.wait_stdout_lines(1, LONG);
    // ~100 bytes of complaint each: 3,000 lines are far past 64 KiB.
    let garbage = "nonsense here\n".repeat(3000);
    c.write_stdin(garbage.as_bytes());
    c.write_stdin(b"ack 1\n");
    env.wait_status(LONG, "the ack after the garbage", |st| {
        listed(st, "s1")["acked"] == 1
    });
    env.publish("k.e", "{\"n\":2}", &["--id", "e2"]);
    let lines = c.wait_stdout_lines(2, LONG);
    assert_eq!(seq_of(&lines[1]), 2);
    c.write_stdin(b"ack 2\n");
    env.wait_status(LONG, "event 2 acked", |st| listed(st, "s1")["acked"] == 2);
    c.signal(Sig::SIGTERM);
    let out = c.wait_exit(LONG);
    out.assert_code(0);
    let mut text = String::new();
    let _ = unread.read_to_string(&mut text);
    let complaints: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("[event] stdin line "))
        .collect();
    assert!(
        !complaints.is_empty() && complaints.len() < 100,
        "complaints are shown, within a bound: {} lines\n{text}",
        complaints.len()
    );
    assert_eq!(
        complaints[0],
        "[event] stdin line 1 ignored: unknown verb \"nonsense\": use ack SEQ, ack-upto SEQ, nack SEQ [DELAY], progress SEQ or term SEQ [REASON]"
    );
}

/// A client that acks what it read and closes at once, while the bus is
/// still writing it events it will not read: the bus's write fails, and the
/// ack it had not read yet still counts (nothing comes again to the next
/// client). Twenty rounds, each ack naming its seq by a run.
#[test]
fn an_ack_sent_just_before_a_close_counts_though_the_bus_write_failed() {
    let env = TestEnv::new();
    dws_tests::common::subscribe_ok(&env, &["big.*", "--id", "s1"], "s1");
    let data = format!("{{\"pad\":\"{}\"}}", "x".repeat(16 * 1024));
    let items: Vec<(String, String)> = (1..=200).map(|i| (format!("b{i}"), data.clone())).collect();
    dws_tests::common::publish_parallel(&env, "big.e", &items, 2);
    let socket = env.bus_meta_socket().expect("the bus socket");
    for want in 1..=20u64 {
        let mut w = attached_to_s1(&socket);
        let seq = loop {
            match w.read_frame(LONG).kind {
                Some(S::Event(e)) => break e.seq,
                Some(S::Subscribed(_)) | Some(S::SourceState(_)) | Some(S::Heartbeat(_)) => {}
                other => panic!("unexpected frame {other:?}"),
            }
        };
        assert_eq!(
            seq, want,
            "round {want} got again what an earlier one acked"
        );
        w.send(&frame(C::Ack(Ack {
            runs: vec![proto::v1::SeqRun {
                first: seq,
                last: seq,
            }],
            ..Ack::default()
        })));
        drop(w);
        // The next round attaches once the bus let this one go.
        env.wait_until(LONG, "s1 detached", || {
            listed(&env.status(), "s1")["consumers"].as_u64() == Some(0)
        });
    }
}
