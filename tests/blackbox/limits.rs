//! Every resource a client can make the bus spend is bounded, and hitting a
//! bound refuses only that client, with a clear error, while everyone else
//! is served (docs/guide.md "Limits"). Each test attacks a real bus through raw
//! connections (`dws_tests::wire::Wire`) or the real `dws`, with a real
//! consumer attached, and then checks that the consumer still receives.

use std::{
    io::Write,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use bytes::{BufMut, BytesMut};
use dws_tests::{wire::Wire, Child, TestEnv, EXIT_TIMEOUT};
use proto::{
    limits::{MAX_EVENT_ENCODED, MAX_PATTERNS, MAX_SUBSCRIPTIONS},
    v1::{
        client_frame::Kind as C, server_frame::Kind as S, ClientFrame, ErrorCode, Publish,
        ServerFrame, StatusRequest, Subscribe,
    },
    MAX_FRAME_LEN, PROTOCOL_VERSION,
};

const LONG: Duration = Duration::from_secs(30);

/// A bus with one real consumer of `k.*` attached; the socket and bus pid.
fn bus_with_consumer(env: &TestEnv) -> (Child, PathBuf, i32) {
    let mut c = env.dws(["event", "consume", "k.*"]).stdin_hold().spawn();
    c.wait_ready();
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    let pid = env.bus_meta_pid().expect("bus.meta names the pid");
    (c, socket, pid)
}

/// Publishes one event with `dws` and waits for the consumer to print it.
fn still_served(env: &TestEnv, consumer: &mut Child, tag: &str) {
    let out = env
        .dws(["event", "publish", "k.after", tag])
        .run_with_timeout(LONG);
    out.assert_code(0);
    consumer.wait_stdout_line("the event published after the attack", LONG, |l| {
        l.contains(tag)
    });
}

/// Asserts that status counts at least `min` clients refused for `kind`.
fn assert_refused(env: &TestEnv, kind: &str, min: u64) {
    let st = env.status();
    let n = st["bus"]["refused"][kind].as_u64().unwrap_or(0);
    assert!(
        n >= min,
        "bus.refused.{kind} is {n}, expected at least {min}\n{st}"
    );
}

fn rss_kb(pid: i32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn frame(kind: C) -> ClientFrame {
    ClientFrame { kind: Some(kind) }
}

fn hello_frame() -> ClientFrame {
    frame(C::Hello(proto::v1::Hello {
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        client_name: "limits".into(),
        build: "test".into(),
    }))
}

fn error_of(f: &ServerFrame) -> Option<(ErrorCode, String)> {
    match &f.kind {
        Some(S::Error(e)) => Some((e.code(), e.message.clone())),
        _ => None,
    }
}

fn greeted(socket: &Path) -> Wire {
    let mut w = Wire::connect(socket);
    w.hello(PROTOCOL_VERSION);
    match w.read_frame(LONG).kind {
        Some(S::HelloAck(_)) => w,
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

fn encode(frames: &[ClientFrame]) -> Vec<u8> {
    let mut b = BytesMut::new();
    for f in frames {
        proto::encode_frame(f, &mut b).expect("encode");
    }
    b.to_vec()
}

#[test]
fn a_client_that_sends_requests_and_never_reads_replies_stalls_only_itself() {
    let env = TestEnv::new();
    let (mut consumer, socket, pid) = bus_with_consumer(&env);
    let before = rss_kb(pid);
    // Hello and 5,000 status requests, written from a thread that never reads:
    // the bus stops reading this client once its replies pile up, so the
    // writer blocks (and gives up after its write timeout).
    let writer = {
        let socket = socket.clone();
        thread::spawn(move || {
            let mut s = UnixStream::connect(&socket).expect("connect");
            s.set_write_timeout(Some(Duration::from_secs(5))).ok();
            let mut frames = vec![frame(C::Hello(proto::v1::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_pid: std::process::id(),
                client_name: "never-reads".into(),
                build: "test".into(),
            }))];
            frames.extend(
                (1..=5000).map(|i| frame(C::StatusRequest(StatusRequest { request_id: i }))),
            );
            let _ = s.write_all(&encode(&frames));
            s // kept open (unread) until joined
        })
    };
    thread::sleep(Duration::from_secs(2));
    still_served(&env, &mut consumer, "served-while-a-client-never-reads");
    let st = env.wait_status(LONG, "the silent client's connection to be paused", |st| {
        st["bus"]["paused_readers"].as_u64().unwrap_or(0) >= 1
    });
    assert_eq!(st["running"], true);
    let after = rss_kb(pid);
    // Unbounded replies grew the bus to 620 MB here; the bound keeps it to
    // about one paused output buffer plus one reply.
    assert!(
        after < before + 64 * 1024,
        "busd grew from {before} kB to {after} kB with a client that never reads"
    );
    drop(writer.join().expect("writer thread"));
}

#[test]
fn over_the_connection_limit_a_client_gets_a_clear_error_and_the_others_are_served() {
    // The test process needs more than 1,024 descriptors for this.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    if hard < 2200 {
        eprintln!("skipped: RLIMIT_NOFILE hard limit {hard} is too low to open 1,024 connections");
        return;
    }
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    let env = TestEnv::new();
    let (mut consumer, socket, _) = bus_with_consumer(&env);
    let limit = 1024;
    let mut open = vec![];
    let mut refused = vec![];
    for _ in 0..limit + 5 {
        let mut w = Wire::connect(&socket);
        // A refused client may find the bus closed its side already.
        w.send_raw(&encode(&[hello_frame()]));
        let f = w.read_frame(LONG);
        match error_of(&f) {
            Some((code, message)) => refused.push((code, message)),
            None => open.push(w),
        }
    }
    assert_eq!(
        open.len(),
        limit - 1,
        "the consumer holds one of the {limit}"
    );
    assert_eq!(refused.len(), 6);
    for (code, message) in &refused {
        assert_eq!(*code, ErrorCode::ResourceExhausted);
        assert!(message.contains("too many connections"), "{message}");
    }
    // `dws` at the limit: a clear error, not a hang.
    let out = env.dws(["event", "status"]).run_with_timeout(LONG);
    let msg = out.assert_error(1);
    assert!(msg.contains("too many connections"), "{msg}");
    // Everyone already connected is served: a publish on an open connection
    // reaches the consumer.
    let w = &mut open[0];
    w.send(&frame(C::Publish(Publish {
        request_id: 1,
        event_type: "k.at-limit".into(),
        data: "published-at-the-limit".into(),
        ..Publish::default()
    })));
    consumer.wait_stdout_line("an event published at the limit", LONG, |l| {
        l.contains("published-at-the-limit")
    });
    drop(open);
    env.wait_until(LONG, "connections to close", || {
        env.dws(["event", "status", "--format", "json"])
            .run_with_timeout(LONG)
            .code
            == Some(0)
    });
    assert_refused(&env, "connections", 7);
    still_served(&env, &mut consumer, "served-after-the-limit");
}

#[test]
fn a_silent_client_and_an_unfinished_frame_are_cut_off_with_an_error() {
    let env = TestEnv::new();
    let (mut consumer, socket, _) = bus_with_consumer(&env);
    let silent = {
        let socket = socket.clone();
        thread::spawn(move || {
            let mut w = Wire::connect(&socket);
            w.read_until_closed(LONG)
        })
    };
    let slow = {
        let socket = socket.clone();
        thread::spawn(move || {
            let mut w = greeted(&socket);
            let mut b = BytesMut::new();
            b.put_u32(1000);
            b.put_slice(b"only ten b");
            w.send_raw(&b);
            w.read_until_closed(LONG)
        })
    };
    let silent = silent.join().expect("silent client");
    let slow = slow.join().expect("slow client");
    let e = silent
        .iter()
        .find_map(error_of)
        .expect("an Error frame for the silent client");
    assert!(e.1.contains("no Hello within 10s"), "{e:?}");
    let e = slow
        .iter()
        .find_map(error_of)
        .expect("an Error frame for the slow frame");
    assert!(e.1.contains("not completed within 10s"), "{e:?}");
    assert_refused(&env, "slow_clients", 2);
    still_served(&env, &mut consumer, "served-after-slow-clients");
}

#[test]
fn partially_sent_frames_are_bounded_across_all_connections() {
    let env = TestEnv::new();
    let (mut consumer, socket, pid) = bus_with_consumer(&env);
    // 64 connections each announce a 4 MiB frame and send all of it but one
    // byte: 256 MiB of input that can never complete.
    let mut conns = vec![];
    let chunk = vec![b'x'; MAX_FRAME_LEN - 1];
    for _ in 0..64 {
        let mut w = greeted(&socket);
        let mut b = BytesMut::new();
        b.put_u32(MAX_FRAME_LEN as u32);
        w.send_raw(&b);
        w.send_raw(&chunk);
        conns.push(w);
    }
    let mut refused = 0;
    for w in &mut conns {
        if let Some(f) = w.try_read_frame(Duration::from_millis(200)) {
            let (code, message) = error_of(&f).expect("only an Error frame");
            assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
            assert!(message.contains("partially received input"), "{message}");
            refused += 1;
        }
    }
    assert!(
        refused > 0,
        "no connection was refused: the input bound does not hold"
    );
    let rss = rss_kb(pid);
    assert!(rss < 1024 * 1024, "busd holds {rss} kB of partial frames");
    assert_refused(&env, "input_budget", 1);
    still_served(&env, &mut consumer, "served-with-partial-frames-around");
    drop(conns);
}

#[test]
fn an_event_too_large_to_deliver_is_refused_at_the_door_and_the_largest_one_is_delivered() {
    let env = TestEnv::new();
    let (mut consumer, socket, _) = bus_with_consumer(&env);
    let mut w = greeted(&socket);
    // Within ~40 bytes of the frame limit: the Publish frame fits, but no
    // delivery of it could. It used to be acked and then reach nobody.
    let data = "x".repeat(MAX_FRAME_LEN - 40);
    w.send(&frame(C::Publish(Publish {
        request_id: 7,
        event_type: "k.big".into(),
        data,
        ..Publish::default()
    })));
    let f = w.read_frame(LONG);
    let (code, message) = error_of(&f).unwrap_or_else(|| panic!("expected an Error, got {f:?}"));
    assert_eq!(code, ErrorCode::TooLarge);
    assert!(message.contains("event too large"), "{message}");
    // The largest event that fits is accepted and delivered whole.
    let data = format!("edge{}", "y".repeat(MAX_EVENT_ENCODED - 200));
    w.send(&frame(C::Publish(Publish {
        request_id: 8,
        event_type: "k.edge".into(),
        data,
        ..Publish::default()
    })));
    match w.read_frame(LONG).kind {
        Some(S::PublishAck(a)) => assert_eq!(a.request_id, 8),
        other => panic!("expected PublishAck, got {other:?}"),
    }
    let lines = consumer.wait_stdout_line("the largest event", LONG, |l| l.contains("\"edge"));
    let line = lines.last().expect("the matching line");
    assert!(line.len() > MAX_EVENT_ENCODED - 300, "{} bytes", line.len());
    // `dws event publish` of an oversized event: usage error, exit 2 (the
    // client checks the data before it sends anything).
    let big = "z".repeat(MAX_FRAME_LEN - 100);
    let out = env
        .dws(["event", "publish", "k.big", "-"])
        .stdin_bytes(big)
        .run_with_timeout(LONG);
    let msg = out.assert_error(2);
    assert!(msg.contains("event data is"), "{msg}");
    still_served(&env, &mut consumer, "served-after-a-too-large-event");
    assert_refused(&env, "too_large_events", 1);
}

#[test]
fn event_type_counters_are_bounded_and_status_always_fits_in_a_frame() {
    let env = TestEnv::new();
    let (mut consumer, socket, _) = bus_with_consumer(&env);
    let mut w = greeted(&socket);
    // 1,200 distinct event types.
    let publishes: Vec<_> = (0..1200u64)
        .map(|i| {
            frame(C::Publish(Publish {
                request_id: i + 1,
                event_type: format!("t.type-{i}"),
                data: "x".into(),
                ..Publish::default()
            }))
        })
        .collect();
    let sent = w.send_in_background(encode(&publishes));
    for _ in 0..1200 {
        assert!(matches!(w.read_frame(LONG).kind, Some(S::PublishAck(_))));
    }
    sent.join().expect("the writer thread");
    // 300 subscriptions of 256 long patterns each: a status document of about
    // 5 MB, more than one frame.
    let subs: Vec<_> = (0..300u64)
        .map(|i| {
            frame(C::Subscribe(Subscribe {
                request_id: 10_000 + i,
                subscription_id: format!("big-{i}"),
                patterns: (0..MAX_PATTERNS)
                    .map(|p| format!("p.{p}.{}", "q".repeat(50)))
                    .collect(),
                ..Subscribe::default()
            }))
        })
        .collect();
    let sent = w.send_in_background(encode(&subs));
    for _ in 0..300 {
        let f = w.read_frame(LONG);
        assert!(matches!(f.kind, Some(S::Subscribed(_))), "{f:?}");
    }
    sent.join().expect("the writer thread");
    let st = env.status();
    let types = st["event_types"].as_array().expect("event_types");
    assert!(types.len() <= 1001, "{} event types listed", types.len());
    let other = types
        .iter()
        .find(|t| t["event_type"] == "(other)")
        .expect("an (other) row");
    assert!(other["received"].as_u64().unwrap_or(0) >= 200, "{other}");
    assert_eq!(
        st["truncated"]["subscriptions_total"], 301,
        "{}",
        st["truncated"]
    );
    assert!(st["subscriptions"].as_array().map_or(0, Vec::len) < 301);
    let text = env.dws(["event", "status"]).run_with_timeout(LONG);
    text.assert_code(0);
    still_served(&env, &mut consumer, "served-with-a-huge-status");
}

/// Issue 36 row 10: 401 subscriptions with large key lists make a status
/// document the bus cuts to fit one frame, and a halted subscription among
/// those left out showed nowhere, in no metric. Now busd counts over every
/// subscription (`subscription_totals`), the metrics carry those totals and
/// `dws_status_truncated 1`, and dws says on stderr that the list was cut.
#[test]
fn a_halted_subscription_left_out_of_a_cut_status_still_counts_in_the_totals() {
    let env = TestEnv::new();
    // Named to sort after the others: the bus lists subscriptions by id.
    env.subscribe(&[
        "h.*",
        "--id",
        "zz-halted",
        "--max-deliver",
        "1",
        "--on-poison",
        "halt",
    ]);
    env.publish("h.k", "poison", &[]);
    let mut c = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "zz-halted",
            "--ack",
            "explicit",
        ])
        .stdin_pipe()
        .spawn();
    c.wait_ready();
    c.wait_stdout_lines(1, LONG);
    c.write_stdin(b"nack 1\n");
    c.wait_exit(LONG).assert_clean_exit("halted", 1);
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    let mut w = greeted(&socket);
    let subs: Vec<_> = (0..400u64)
        .map(|i| {
            frame(C::Subscribe(Subscribe {
                request_id: 1 + i,
                subscription_id: format!("big-{i:03}"),
                patterns: (0..MAX_PATTERNS)
                    .map(|p| format!("p.{p}.{}", "q".repeat(50)))
                    .collect(),
                ..Subscribe::default()
            }))
        })
        .collect();
    let sent = w.send_in_background(encode(&subs));
    for _ in 0..400 {
        let f = w.read_frame(LONG);
        assert!(matches!(f.kind, Some(S::Subscribed(_))), "{f:?}");
    }
    sent.join().expect("the writer thread");

    let out = env
        .dws(["event", "status", "--format", "prometheus"])
        .run_with_timeout(LONG);
    out.assert_code(0);
    let p = "{profile=\"default\"}";
    for line in [
        format!("dws_status_truncated{p} 1"),
        format!("dws_subscriptions{p} 401"),
        format!("dws_subscriptions_halted{p} 1"),
    ] {
        assert!(
            out.stdout.lines().any(|l| l == line),
            "{line:?} missing\n{}",
            out.stdout
                .lines()
                .filter(|l| !l.contains("subscription="))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let listed = out.stdout.matches("dws_subscription_halted{").count();
    assert!(listed < 401, "the list was cut: {listed} listed");
    let note = out.stderr_lines();
    assert!(
        note.len() == 1
            && note[0].starts_with("[event] ")
            && note[0].contains("of its 401 subscriptions"),
        "one [event] line on stderr: {note:?}"
    );
    let st = env.status();
    crate::ecosystem::assert_valid("status", &st);
    let totals = &st["subscription_totals"];
    assert_eq!(
        (totals["count"].as_u64(), totals["halted"].as_u64()),
        (Some(401), Some(1)),
        "{totals}"
    );
    let text = env.dws(["event", "status"]).run_with_timeout(LONG);
    text.assert_code(0);
    assert!(
        text.stdout.contains("of 401") && text.stdout.contains("1 halted"),
        "{}",
        text.stdout
            .lines()
            .filter(|l| l.starts_with("subscriptions"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn subscriptions_and_their_patterns_are_bounded() {
    let env = TestEnv::new();
    let (mut consumer, socket, _) = bus_with_consumer(&env);
    let keys: Vec<String> = (0..=MAX_PATTERNS).map(|i| format!("k.p{i}")).collect();
    let mut args = vec!["event".to_owned(), "subscribe".into()];
    args.extend(keys);
    let out = env.dws(&args).run_with_timeout(LONG);
    let msg = out.assert_error(2);
    assert!(msg.contains("the most is 256"), "{msg}");
    // Fill the subscription table (the consumer's own is one).
    let mut w = greeted(&socket);
    let subs: Vec<_> = (0..MAX_SUBSCRIPTIONS as u64)
        .map(|i| {
            frame(C::Subscribe(Subscribe {
                request_id: i + 1,
                subscription_id: format!("fill-{i}"),
                patterns: vec!["f.x".into()],
                ..Subscribe::default()
            }))
        })
        .collect();
    let sent = w.send_in_background(encode(&subs));
    let mut errors = vec![];
    for _ in 0..MAX_SUBSCRIPTIONS {
        let f = w.read_frame(LONG);
        if let Some(e) = error_of(&f) {
            errors.push(e);
        }
    }
    sent.join().expect("the writer thread");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, ErrorCode::ResourceExhausted);
    let out = env
        .dws(["event", "subscribe", "k.x", "--id", "one-too-many"])
        .run_with_timeout(LONG);
    let msg = out.assert_error(1);
    assert!(msg.contains("too many subscriptions"), "{msg}");
    still_served(&env, &mut consumer, "served-with-a-full-table");
}

#[test]
fn a_gap_reaches_whichever_consumer_reads_past_it_next() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_EVENTS", "10")]);
    env.dws(["event", "subscribe", "g.*", "--id", "s1"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    for i in 1..=5 {
        env.publish("g.e", &format!("{{\"n\":{i}}}"), &[]);
    }
    let first = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--max-events",
            "5",
        ])
        .run_with_timeout(LONG);
    first.assert_clean_exit("limit", 5);
    // 50 more while nobody is attached: 40 of them leave retention unsent.
    let socket = env.bus_meta_socket().expect("socket");
    let mut w = greeted(&socket);
    let publishes: Vec<_> = (6..=55u64)
        .map(|i| {
            frame(C::Publish(Publish {
                request_id: i,
                event_type: "g.e".into(),
                data: format!("{{\"n\":{i}}}"),
                ..Publish::default()
            }))
        })
        .collect();
    let sent = w.send_in_background(encode(&publishes));
    for _ in 6..=55 {
        assert!(matches!(w.read_frame(LONG).kind, Some(S::PublishAck(_))));
    }
    sent.join().expect("the writer thread");
    let second = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--max-events",
            "10",
        ])
        .run_with_timeout(LONG);
    second.assert_clean_exit("limit", 10);
    assert!(
        second
            .stderr_lines()
            .contains(&"[event] gap — lost 40 event(s) before seq 46 (retention)"),
        "{second}"
    );
    let seqs: Vec<u64> = second
        .json_lines()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, (46..=55).collect::<Vec<_>>());
}
