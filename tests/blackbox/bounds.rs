//! Every resource bounded under floods (issue 19): a client that pipelines
//! thousands of requests without reading its replies, disk use against
//! retention and the dedup window, the committer's saves under a sustained
//! publish flood, and the memory the log's rendered lines take. Each test
//! drives a real bus through raw connections (`dws_tests::wire::Wire`) or the
//! real `dws`; memory is read from `/proc/PID/status` and disk use from the
//! store directory, always against a generous bound (never a speed).

use std::{
    io::Write,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use bytes::BytesMut;
use dws_tests::{common::listed, proc_kb, wire::Wire, Child, TestEnv};
use proto::{
    v1::{
        client_frame::Kind as C, server_frame::Kind as S, ClientFrame, Publish, StatusRequest,
        Subscribe, SubscriptionControl,
    },
    PROTOCOL_VERSION,
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
    env.dws(["event", "publish", "k.after", tag])
        .run_with_timeout(LONG)
        .assert_code(0);
    consumer.wait_stdout_line("the event published after the attack", LONG, |l| {
        l.contains(tag)
    });
}

fn frame(kind: C) -> ClientFrame {
    ClientFrame { kind: Some(kind) }
}

fn hello_frame(name: &str) -> ClientFrame {
    frame(C::Hello(proto::v1::Hello {
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        client_name: name.into(),
        build: "test".into(),
    }))
}

fn encode(frames: &[ClientFrame]) -> Vec<u8> {
    let mut b = BytesMut::new();
    for f in frames {
        proto::encode_frame(f, &mut b).expect("encode");
    }
    b.to_vec()
}

fn greeted(socket: &Path) -> Wire {
    let mut w = Wire::connect(socket);
    w.hello(PROTOCOL_VERSION);
    match w.read_frame(LONG).kind {
        Some(S::HelloAck(_)) => w,
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

/// Creates `n` named subscriptions `s1..sN` over one raw connection.
fn many_subscriptions(socket: &Path, n: u64) {
    let mut w = greeted(socket);
    let frames: Vec<_> = (1..=n)
        .map(|i| {
            frame(C::Subscribe(Subscribe {
                request_id: i,
                subscription_id: format!("s{i}"),
                patterns: vec![format!("p{i}.*"), format!("q{i}.x")],
                ..Subscribe::default()
            }))
        })
        .collect();
    let sent = w.send_in_background(encode(&frames));
    for _ in 1..=n {
        match w.read_frame(LONG).kind {
            Some(S::Subscribed(_)) => {}
            other => panic!("expected Subscribed, got {other:?}"),
        }
    }
    sent.join().expect("the writer thread");
}

/// Hello and `requests` written in one go on a new connection that never
/// reads; the socket is returned open (its replies unread).
fn pipelined_never_read(socket: &Path, requests: Vec<ClientFrame>) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect");
    s.set_write_timeout(Some(Duration::from_secs(5))).ok();
    let mut frames = vec![hello_frame("pipelines-and-never-reads")];
    frames.extend(requests);
    // Small requests: the whole write fits the socket buffers; a bus that
    // stops reading would only make this return early with an error.
    let _ = s.write_all(&encode(&frames));
    s
}

/// Reads `n` frames from a raw socket that was never read before (into a
/// `Wire` over a clone), proving the bus resumed decoding once its client
/// read.
fn read_frames(s: &UnixStream, n: usize) -> Vec<ServerKind> {
    let mut w = Wire::from_stream(s.try_clone().expect("clone"));
    (0..n)
        .map(|_| ServerKind::of(w.read_frame(LONG).kind))
        .collect()
}

/// What kind of reply a frame was (the tests count them).
#[derive(Debug, PartialEq, Eq)]
enum ServerKind {
    HelloAck,
    Status,
    Verb,
    Other(String),
}

impl ServerKind {
    fn of(kind: Option<S>) -> ServerKind {
        match kind {
            Some(S::HelloAck(_)) => ServerKind::HelloAck,
            Some(S::StatusReply(_)) => ServerKind::Status,
            Some(S::SubscriptionState(_)) => ServerKind::Verb,
            other => ServerKind::Other(format!("{other:?}")),
        }
    }
}

/// Item 7: Hello + 5,000 `Status` requests in one write, with 100 named
/// subscriptions (each status reply tens of kB): the bus answers until its
/// unread-output bound and decodes nothing more until the client reads.
/// Before, it answered every frame of the read at once (hundreds of MB).
/// Then the same with 5,000 `parked` verbs.
#[test]
fn a_client_pipelining_thousands_of_requests_without_reading_costs_one_output_bound() {
    let env = TestEnv::new();
    let (mut consumer, socket, pid) = bus_with_consumer(&env);
    many_subscriptions(&socket, 100);
    let before = proc_kb(pid, "VmHWM");

    let status: Vec<_> = (1..=5000)
        .map(|i| frame(C::StatusRequest(StatusRequest { request_id: i })))
        .collect();
    let flooder = pipelined_never_read(&socket, status);
    thread::sleep(Duration::from_secs(2));
    still_served(&env, &mut consumer, "served-while-status-piles-up");
    let st = env.wait_status(LONG, "the pipelining client to be paused", |st| {
        st["bus"]["paused_readers"].as_u64().unwrap_or(0) >= 1
    });
    assert_eq!(st["running"], true);
    let peak = proc_kb(pid, "VmHWM");
    // 1 MiB of unread output plus one reply (at most one 4 MiB frame), and
    // the status requests of this test: far below 64 MiB. Unbounded, 5,000
    // replies of ~80 kB took about 400 MB.
    assert!(
        peak < before + 64 * 1024,
        "busd's peak RSS grew from {before} kB to {peak} kB under 5,000 pipelined status requests"
    );
    // Reading resumes decoding: the first 100 replies arrive in order.
    let got = read_frames(&flooder, 101);
    assert_eq!(got[0], ServerKind::HelloAck);
    assert!(got[1..].iter().all(|k| *k == ServerKind::Status), "{got:?}");
    drop(flooder);

    let parked: Vec<_> = (1..=5000)
        .map(|i| {
            frame(C::SubscriptionControl(SubscriptionControl {
                request_id: i,
                subscription_id: format!("s{}", i % 100 + 1),
                verb: "parked".into(),
                ..SubscriptionControl::default()
            }))
        })
        .collect();
    let before = proc_kb(pid, "VmHWM");
    let flooder = pipelined_never_read(&socket, parked);
    thread::sleep(Duration::from_secs(2));
    still_served(&env, &mut consumer, "served-while-parked-piles-up");
    let peak = proc_kb(pid, "VmHWM");
    assert!(
        peak < before + 64 * 1024,
        "busd's peak RSS grew from {before} kB to {peak} kB under 5,000 pipelined parked requests"
    );
    let got = read_frames(&flooder, 11);
    assert!(got[1..].iter().all(|k| *k == ServerKind::Verb), "{got:?}");
    drop(flooder);
    let rss = proc_kb(pid, "VmRSS");
    assert!(rss > 0, "busd is still running");
}

/// Publishes without pause from `threads` raw connections until `stop`:
/// each has a writer that keeps up to 2,048 publishes unanswered (well below
/// the bus's per-connection bound, so it never pauses the connection) and a
/// reader counting the answers in `done`: the bus always has a batch staged.
fn flood(
    socket: &Path,
    threads: usize,
    data: String,
    stop: &Arc<AtomicBool>,
    done: &Arc<AtomicU64>,
) -> Vec<thread::JoinHandle<()>> {
    let mut handles = Vec::new();
    for t in 0..threads {
        let mut w = greeted(socket);
        let mut s = w.s.try_clone().expect("clone the socket");
        let acked = Arc::new(AtomicU64::new(0));
        let (stop_w, data, acked_w) = (stop.clone(), data.clone(), acked.clone());
        handles.push(thread::spawn(move || {
            let mut id = 0u64;
            while !stop_w.load(Ordering::Relaxed) {
                if id - acked_w.load(Ordering::Relaxed) >= 2048 {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
                let frames: Vec<_> = (0..64)
                    .map(|_| {
                        id += 1;
                        frame(C::Publish(Publish {
                            request_id: id,
                            event_type: "f.e".into(),
                            event_id: format!("f{t}-{id}"),
                            data: data.clone(),
                            ..Publish::default()
                        }))
                    })
                    .collect();
                if s.write_all(&encode(&frames)).is_err() {
                    return;
                }
            }
        }));
        let (stop_r, done) = (stop.clone(), done.clone());
        handles.push(thread::spawn(move || {
            while !stop_r.load(Ordering::Relaxed) {
                match w.try_read_frame(Duration::from_millis(500)).map(|f| f.kind) {
                    Some(Some(S::PublishAck(_))) => {
                        acked.fetch_add(1, Ordering::Relaxed);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(_) => return,
                    None => {}
                }
            }
        }));
    }
    handles
}

/// Item 9: under a sustained flood from several publishers, `subscribe` (a
/// reply that waits for a save) is answered and log segments are released.
/// Before, the committer always preferred the next batch, so a save waited
/// for the flood to end.
#[test]
fn saves_and_segment_release_keep_running_under_a_sustained_publish_flood() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_BYTES", "1048576")]);
    env.subscribe(&["w.*", "--id", "warm-up"]);
    let socket = env.bus_meta_socket().expect("socket");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let publishers = flood(&socket, 4, "x".repeat(1000), &stop, &done);
    let started = Instant::now();
    env.wait_until(LONG, "the flood to be under way", || {
        done.load(Ordering::Relaxed) >= 2000
    });
    // A reply that waits for a save, asked in the middle of the flood.
    let asked = Instant::now();
    let out = env
        .dws(["event", "subscribe", "f.*", "--id", "during-flood"])
        .run_with_timeout(LONG);
    eprintln!("subscribe answered after {:?} of flood", asked.elapsed());
    let answered_during = !stop.load(Ordering::Relaxed);
    // Saves keep coming while the flood goes on: the stored snapshot's
    // `saved_at_unix_ms` moves (a save is due every 200 ms; over 3 s at
    // least 3 distinct ones is a generous liveness bound).
    let st = env.status();
    let snapshot = PathBuf::from(st["store"]["path"].as_str().expect("the store's path"))
        .join("subscriptions.json");
    let mut saves = std::collections::BTreeSet::new();
    let sampled = Instant::now();
    while sampled.elapsed() < Duration::from_secs(3) {
        if let Ok(bytes) = std::fs::read(&snapshot) {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                saves.insert(v["saved_at_unix_ms"].as_i64().unwrap_or(0));
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("{} distinct saves seen in 3 s of flood", saves.len());
    let flooding = !stop.load(Ordering::Relaxed);
    // Segments are released while it goes on: the store stays near
    // retention (1 MiB) plus a few segments (4 MiB each) of what arrived
    // between two saves, though far more was published.
    let from = done.load(Ordering::Relaxed);
    env.wait_until(Duration::from_secs(120), "64 MB more published", || {
        done.load(Ordering::Relaxed) >= from + 64_000
    });
    let st = env.status();
    stop.store(true, Ordering::Relaxed);
    for p in publishers {
        let _ = p.join();
    }
    out.assert_code(0);
    assert!(
        answered_during,
        "subscribe was answered only after the flood"
    );
    assert!(
        flooding && saves.len() >= 3,
        "{} distinct saves in 3 s of flood",
        saves.len()
    );
    let published = done.load(Ordering::Relaxed);
    let store_bytes = st["store"]["bytes"].as_u64().unwrap_or(u64::MAX);
    eprintln!("{published} published; the store holds {store_bytes} bytes");
    assert!(
        store_bytes <= 24 << 20,
        "{published} events of 1 kB published in {:?}: the store holds {store_bytes} bytes \
         (retention 1 MiB); segments were not released during the flood\n{st:#}",
        started.elapsed()
    );
}

/// Bytes of the regular files in `dir` (the store: segments, subscriptions,
/// dedup ids).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Publishes `n` events of `size` bytes with ids `{prefix}{i}` over one raw
/// connection, 8 at a time (each group answered before the next is sent);
/// returns their seqs.
fn publish_big(socket: &Path, prefix: &str, n: u64, size: usize) -> Vec<u64> {
    let mut w = greeted(socket);
    let data = "y".repeat(size);
    let mut seqs = Vec::new();
    let mut next = 1;
    while next <= n {
        let last = (next + 7).min(n);
        let frames: Vec<_> = (next..=last)
            .map(|i| {
                frame(C::Publish(Publish {
                    request_id: i,
                    event_type: "big.e".into(),
                    event_id: format!("{prefix}{i}"),
                    data: data.clone(),
                    ..Publish::default()
                }))
            })
            .collect();
        w.s.write_all(&encode(&frames)).expect("write publishes");
        for _ in next..=last {
            match w.read_frame(LONG).kind {
                Some(S::PublishAck(a)) => seqs.push(a.seq),
                other => panic!("expected PublishAck, got {other:?}"),
            }
        }
        next = last + 1;
    }
    seqs
}

/// Item 8: with 16 MiB of retention, 200 events of 1 MiB leave about
/// retention on disk, not the dedup window's 65,536 seqs of payloads
/// (201 MiB before); an old id is still deduplicated, also after a restart.
#[test]
fn disk_use_is_bounded_by_retention_and_the_dedup_window_keeps_only_ids() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_BYTES", "16777216")]);
    env.subscribe(&["w.*", "--id", "warm-up"]);
    let socket = env.bus_meta_socket().expect("socket");
    let seqs = publish_big(&socket, "big-", 200, 1 << 20);
    assert_eq!(seqs.len(), 200);
    let st = env.status();
    let store = PathBuf::from(st["store"]["path"].as_str().expect("the store's path"));
    // Retention (16 MiB) plus the segments (4 MiB each) it straddles, and
    // the dedup ids: under 32 MiB.
    let bound = 32u64 << 20;
    // The release comes with the next save (within 200 ms of the last
    // batch): wait for it on disk and in status alike.
    env.wait_until(LONG, "old segments to be released", || {
        dir_bytes(&store) <= bound
            && env.status()["store"]["bytes"].as_u64().unwrap_or(u64::MAX) <= bound
    });
    // The first id's event left the disk long ago; its id did not.
    let again = env.publish("big.e", "small", &["--id", "big-1"]);
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["seq"], seqs[0], "{again}");
    env.dws(["event", "stop"])
        .run_with_timeout(LONG)
        .assert_code(0);
    env.wait_no_busd(LONG, "the bus to stop");
    for (i, seq) in [(2usize, seqs[1]), (150, seqs[149]), (200, seqs[199])] {
        let again = env.publish("big.e", "small", &["--id", &format!("big-{i}")]);
        assert_eq!(again["duplicate"], true, "big-{i} after a restart: {again}");
        assert_eq!(again["seq"], seq, "{again}");
    }
    let fresh = env.publish("big.e", "small", &["--id", "big-201"]);
    assert_eq!(fresh["duplicate"], false, "{fresh}");
    // And after kill -9: the ids written before their segments went are
    // durable on their own.
    for pid in env.busd_pids() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    env.wait_no_busd(LONG, "the bus to die");
    let again = env.publish("big.e", "small", &["--id", "big-3"]);
    assert_eq!(again["duplicate"], true, "big-3 after kill -9: {again}");
    assert_eq!(again["seq"], seqs[2], "{again}");
    assert!(
        dir_bytes(&store) <= bound,
        "the store holds {} bytes after a restart",
        dir_bytes(&store)
    );
}

/// Item 12: the log's byte bound counts the NDJSON lines rendered for
/// consumers that take lines, not only the encoded events: with 64 MiB of
/// retention and a consumer reading everything, the log holds one retention
/// of events and lines, not one of each.
#[test]
fn rendered_lines_count_against_retention_so_memory_stays_near_one_retention() {
    let retention: u64 = 64 << 20;
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_BYTES", retention.to_string())]);
    let mut consumer = env.dws(["event", "consume", "big.*"]).stdin_hold().spawn();
    consumer.wait_ready();
    let socket = env.bus_meta_socket().expect("socket");
    let pid = env.bus_meta_pid().expect("pid");
    let before = proc_kb(pid, "VmRSS");
    // 320 events of 512 KiB (160 MiB), every one rendered as a line. The
    // publisher waits for the consumer to come within 16 events (16 MiB of
    // events and lines) after every 8: a consumer slowed by a loaded machine
    // would otherwise fall a retention behind and be told of a gap, which is
    // right but not what this test measures.
    for batch in 0..40usize {
        publish_big(&socket, &format!("line-{batch}-"), 8, 512 << 10);
        let published = (batch + 1) * 8;
        consumer.wait_stdout_line_count(published.saturating_sub(16), LONG);
    }
    consumer.wait_stdout_line_count(320, Duration::from_secs(120));
    // One more batch: retention is applied after every batch.
    publish_big(&socket, "last-", 1, 10);
    consumer.wait_stdout_line_count(321, LONG);
    let st = env.status();
    let log_bytes = st["log"]["bytes"].as_u64().unwrap_or(u64::MAX);
    let rss = proc_kb(pid, "VmRSS");
    eprintln!("busd RSS {before} kB -> {rss} kB; log.bytes {log_bytes}");
    assert!(
        log_bytes <= retention,
        "log.bytes {log_bytes} over retention {retention}"
    );
    // The log holds one retention (64 MiB); buffers and what the allocator
    // keeps of freed events add about as much again here (+122 MB). Counting
    // only the encoded events, the lines alone doubled the log (+199 MB).
    // The bound sits between: two retentions and 16 MiB of growth.
    assert!(
        rss < before + (2 * retention + (16 << 20)) / 1024,
        "busd's RSS grew from {before} kB to {rss} kB with {} MiB of retention",
        retention >> 20
    );
}

/// A consumer that never reads attaches behind a backlog of large events:
/// the bus takes from its subscription only what fits its output buffer
/// (one event at least), so it neither copies a pull's worth of events
/// (up to 256) into that buffer nor pins them in flight. Before, all 48
/// events of 3 MiB were taken at once (in flight 48, a copy of 144 MiB).
#[test]
fn a_consumer_that_never_reads_holds_one_buffer_of_large_events_not_a_pull_of_them() {
    let retention: u64 = 256 << 20;
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_BYTES", retention.to_string())]);
    env.subscribe(&["big.*", "--id", "stuck"]);
    let socket = env.bus_meta_socket().expect("socket");
    let pid = env.bus_meta_pid().expect("pid");
    let seqs = publish_big(&socket, "huge-", 48, 3 << 20);
    assert_eq!(seqs.len(), 48);
    let before = proc_kb(pid, "VmRSS");
    let mut stuck = env
        .dws(["event", "consume", "--subscribe-id", "stuck"])
        .spawn_stdout_unread();
    stuck.wait_ready();
    // Let the bus fill what it will.
    std::thread::sleep(Duration::from_millis(500));
    let st = env.status();
    let s = listed(&st, "stuck");
    let in_flight = s["in_flight"].as_u64().unwrap_or(u64::MAX);
    assert!(
        in_flight <= 8,
        "only what fits the output buffer is taken: in flight {in_flight}\n{st:#}"
    );
    let grew_mib = proc_kb(pid, "VmRSS").saturating_sub(before) / 1024;
    assert!(
        grew_mib < 48,
        "busd grew by {grew_mib} MiB for one stuck consumer"
    );
    assert!(stuck.is_running(), "{}", stuck.report());
}
