//! Retention on disk: the log keeps only its hot tail
//! (`DWS_EVENT_BUS_HOT_EVENTS`) in memory on the disk store; older events
//! are read back from the store's segments. A named subscription detached
//! behind far more than the hot tail catches up completely and in order,
//! with and without a `kill -9` of the bus in between, and busd's memory
//! stays far below the payload it retains (read from `/proc/PID/status`
//! against a generous bound, never a speed).

use std::{
    thread,
    time::{Duration, Instant},
};

use dws_tests::{common::*, proc_kb, wait_pid_gone, Sig, TestEnv, EXIT_TIMEOUT};
use nix::{sys::signal::kill, unistd::Pid};
use serde_json::Value;

/// Events published, and the bytes of each one's data.
const EVENTS: usize = 240;
const DATA: usize = 256 * 1024;

fn data_of(i: usize) -> String {
    format!("{{\"i\":{i},\"pad\":\"{}\"}}", "r".repeat(DATA))
}

/// Publishes event `i` for every `i` in `range` of type `ret.k` with id
/// `r-<i>`, from 4 publishers (its data from stdin: too large for argv).
fn publish_all(env: &TestEnv, range: std::ops::Range<usize>) {
    let all: Vec<usize> = range.collect();
    thread::scope(|s| {
        for part in all.chunks(all.len().div_ceil(4)) {
            s.spawn(move || {
                for &i in part {
                    let id = format!("r-{i:04}");
                    env.dws(["event", "publish", "ret.k", "-", "--id", &id])
                        .stdin_bytes(data_of(i))
                        .run_with_timeout(EXIT_TIMEOUT)
                        .assert_code(0);
                }
            });
        }
    });
}

fn busd_pid(env: &TestEnv) -> i32 {
    let pids = env.busd_pids();
    assert_eq!(pids.len(), 1, "one busd: {pids:?}");
    pids[0]
}

/// `dws event consume --subscribe-id ID --max-events N`.
fn consume_of(env: &TestEnv, id: &str, n: usize) -> dws_tests::Cmd {
    let max = n.to_string();
    env.dws([
        "event",
        "consume",
        "--subscribe-id",
        id,
        "--max-events",
        &max,
    ])
}

/// `consume --subscribe-id lag --max-events n`: the events, asserting
/// there are `n` and their seqs rise.
fn catch_up(env: &TestEnv, n: usize) -> Vec<Value> {
    let out = consume_of(env, "lag", n).run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", n as u64);
    let events = out.json_lines();
    assert_eq!(events.len(), n);
    let seqs: Vec<u64> = events.iter().map(|e| u64_of(e, "seq")).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");
    events
}

/// [`catch_up`] for the benchmark: the consumer's stdout is copied to a
/// file as it comes (by std's copy loop, so this debug-built test does not
/// set the pace by splitting and keeping a million lines), then checked
/// there: `n` lines, seqs rising. Returns how long the consumer took.
fn catch_up_to_file(env: &TestEnv, id: &str, n: usize) -> Duration {
    use std::io::BufRead;
    let path = env.root().join(format!("catch-up-{id}.ndjson"));
    let started = Instant::now();
    let mut c = consume_of(env, id, n).spawn_stdout_unread();
    let mut stdout = c.take_stdout().expect("stdout");
    let mut file = std::fs::File::create(&path).expect("create the catch-up file");
    std::io::copy(&mut stdout, &mut file).expect("copy stdout");
    let took = started.elapsed();
    let deadline = Instant::now() + EXIT_TIMEOUT;
    let status = loop {
        if let Some(status) = c.exit_status() {
            break status;
        }
        assert!(Instant::now() < deadline, "the consumer did not exit");
        thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0), "{:?}", c.stderr_so_far());
    let mut lines = 0;
    let mut last = 0;
    for line in std::io::BufReader::new(std::fs::File::open(&path).expect("open")).lines() {
        let seq = u64_of(
            &serde_json::from_str(&line.expect("a line")).expect("JSON"),
            "seq",
        );
        assert!(seq > last, "in order: {seq} after {last}");
        last = seq;
        lines += 1;
    }
    assert_eq!(lines, n);
    let _ = std::fs::remove_file(&path);
    took
}

/// [`catch_up`] of this file's events, asserting each arrived whole.
fn catch_up_whole(env: &TestEnv, n: usize) -> Vec<Value> {
    let events = catch_up(env, n);
    for e in &events {
        let id = str_of(e, "event_id");
        let data: Value = serde_json::from_str(str_of(e, "data")).expect("data is JSON");
        let i = data["i"].as_u64().expect("data.i") as usize;
        assert_eq!(id, format!("r-{i:04}"), "data and id of one event");
        assert_eq!(data["pad"].as_str().map(str::len), Some(DATA), "{id} whole");
    }
    events
}

#[test]
fn a_subscription_behind_more_than_the_hot_tail_catches_up_in_order_across_kill_9() {
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_BUS_HOT_EVENTS", "8"),
        ("DWS_EVENT_BUS_RETENTION_BYTES", "1073741824"),
    ]);
    subscribe_ok(&env, &["ret.*", "--id", "lag", "--ttl", "1h"], "lag");
    let pid = busd_pid(&env);
    // What busd holds with no events (a debug build holds about 23 MB).
    let base = proc_kb(pid, "VmRSS");
    publish_all(&env, 0..EVENTS);
    // 60 MiB retained and pending for `lag`; the hot tail is 2 MiB. Held
    // in memory (all of it hot), busd grew by 38,000 kB; with the hot tail
    // of 8 events, by 8,000 kB. A catch-up of these 256 KiB events leaves
    // 7–12 MB with the allocator, and up to 17 MB on a machine loaded by
    // the whole suite (the same with the busd before issue 45): a third of
    // the payload is over that and still far under what holding the log
    // costs.
    let payload_kb = (EVENTS * DATA / 1024) as u64;
    let bound = base + payload_kb / 3;
    let rss = proc_kb(pid, "VmRSS");
    assert!(
        rss > 0 && rss < bound,
        "busd holds {rss} kB ({base} kB before) with {payload_kb} kB of events retained"
    );

    // Without a restart: the first half, from the segments.
    let got = catch_up_whole(&env, EVENTS / 2);
    let rss = proc_kb(pid, "VmRSS");
    assert!(
        rss < bound,
        "after a catch-up busd holds {rss} kB ({base} kB before)"
    );

    // kill -9, then the rest: recovery does not load the log into memory.
    let _ = kill(Pid::from_raw(pid), Sig::SIGKILL);
    assert!(wait_pid_gone(pid, EXIT_TIMEOUT), "busd survived SIGKILL");
    // What the bus had not saved as acked before the kill comes again
    // (marked redelivered), and a consumer that stops at its limit leaves
    // its last acks behind: read until the subscription has nothing left.
    let mut seen: std::collections::BTreeSet<String> = got
        .iter()
        .map(|e| str_of(e, "event_id").to_owned())
        .collect();
    for e in catch_up_whole(&env, EVENTS / 2) {
        seen.insert(str_of(&e, "event_id").to_owned());
    }
    for _ in 0..10 {
        let lag = u64_of(listed(&env.status(), "lag"), "lag") as usize;
        if lag == 0 {
            break;
        }
        for e in catch_up_whole(&env, lag) {
            seen.insert(str_of(&e, "event_id").to_owned());
        }
    }
    assert_eq!(seen.len(), EVENTS, "every event arrived");
    let pid = busd_pid(&env);
    let peak = proc_kb(pid, "VmHWM");
    assert!(
        peak < bound,
        "after a restart busd's peak was {peak} kB (the first bus started at {base} kB) \
         with {payload_kb} kB of events retained"
    );
}

/// The retention benchmark (not a test: `--ignored`, run against release
/// binaries with `DWS_BIN`/`BUSD_BIN`): `RETAIN_BENCH_EVENTS` (default
/// 1,000,000) events of 256 B published over one pipelined connection while
/// a named subscription is detached behind all of them; prints busd's RSS
/// per retained event, then the catch-up rate of a consumer reading them all.
#[test]
#[ignore]
fn bench_retention_on_disk() {
    use dws_tests::wire::Wire;
    use proto::v1::{client_frame::Kind as C, server_frame::Kind as S, ClientFrame, Publish};

    let n: usize = std::env::var("RETAIN_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let hot = std::env::var("RETAIN_BENCH_HOT").unwrap_or_else(|_| "16384".into());
    let env = TestEnv::with_env(&[
        (
            "DWS_EVENT_BUS_RETENTION_EVENTS",
            (2 * n).to_string().as_str(),
        ),
        ("DWS_EVENT_BUS_RETENTION_BYTES", "100000000000"),
        ("DWS_EVENT_BUS_HOT_EVENTS", hot.as_str()),
        ("DWS_EVENT_BUS_IDLE_TIMEOUT", "0"),
    ]);
    subscribe_ok(&env, &["rb.*", "--id", "lag", "--ttl", "1h"], "lag");
    let pid = busd_pid(&env);
    let base = proc_kb(pid, "VmRSS");
    let mut w = Wire::connect(&env.expected_socket_path());
    w.hello(proto::PROTOCOL_VERSION);
    let _ = w.read_frame(Duration::from_secs(10));
    let data = format!("{{\"pad\":\"{}\"}}", "p".repeat(256 - 10));
    let started = Instant::now();
    let chunk = 4096;
    let mut sent = 0;
    while sent < n {
        let k = chunk.min(n - sent);
        let mut buf = bytes::BytesMut::new();
        for i in 0..k {
            let f = ClientFrame {
                kind: Some(C::Publish(Publish {
                    request_id: (sent + i + 1) as u64,
                    event_type: "rb.k".into(),
                    data: data.clone(),
                    ..Publish::default()
                })),
            };
            proto::encode_frame(&f, &mut buf).expect("encode");
        }
        let writer = w.send_in_background(buf.to_vec());
        let mut acked = 0;
        while acked < k {
            match w.read_frame(Duration::from_secs(60)).kind {
                Some(S::PublishAck(_)) => acked += 1,
                other => panic!("expected PublishAck, got {other:?}"),
            }
        }
        writer.join().expect("writer");
        sent += k;
    }
    let took = started.elapsed();
    let rss = proc_kb(pid, "VmRSS");
    let hwm = proc_kb(pid, "VmHWM");
    let st = env.status();
    eprintln!(
        "retained {n} x 256 B in {:.1} s ({:.0}/s); busd RSS {base} kB empty, {rss} kB \
         retained (peak {hwm} kB): {:.0} B per retained event; log {}",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        (rss.saturating_sub(base) * 1024) as f64 / n as f64,
        st["log"]
    );
    drop(w);
    let took = catch_up_to_file(&env, "lag", n);
    eprintln!(
        "caught up {n} events in {:.2} s: {:.0} events/s; busd RSS after {} kB (peak {} kB)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        proc_kb(pid, "VmRSS"),
        proc_kb(pid, "VmHWM"),
    );
}
