//! The line ring: first deliveries' lines, rendered once, read in place by
//! every consumer that holds the bus's ring instead of being sent to it.
//! Its stdout is byte for byte what the bytes give (`DWS_LINE_RING=off`)
//! over random events, a filtered subscription's holes and redeliveries;
//! a consumer stopped while it holds batches of the ring never stops the
//! others, and gets everything once it runs again.

use std::collections::BTreeMap;

use dws_tests::{
    common::{publish_parallel, subscribe_ok},
    Child, Output, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::Value;

/// A line's seq, redelivered mark, delivery count; the line without its
/// `subscribe_id`; and the line without those per-delivery fields too.
fn parts(line: &str) -> ((u64, bool, u64), String, String) {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let id =
        serde_json::to_string(v["subscribe_id"].as_str().unwrap_or_default()).expect("well-formed");
    let no_id = line.replacen(&format!(",\"subscribe_id\":{id}"), "", 1);
    let mut bare = v.clone();
    for k in ["subscribe_id", "redelivered", "delivery"] {
        bare.as_object_mut().expect("well-formed").remove(k);
    }
    let key = (
        v["seq"].as_u64().expect("well-formed"),
        v["redelivered"].as_bool().unwrap_or(false),
        v["delivery"].as_u64().unwrap_or(0),
    );
    (key, no_id, bare.to_string())
}

/// Random payloads: JSON and text, quotes, backslashes, control
/// characters, non-ASCII, sizes from empty to a few KiB.
fn payload(rng: &mut fastrand::Rng) -> String {
    const ALPHABET: &[&str] = &[
        "a", "Z", "0", " ", "\"", "\\", "\u{1}", "\n", "\t", "é", "漢", "🙂", "{", "}",
    ];
    let n = match rng.u8(..10) {
        0 => 0,
        1..=7 => rng.usize(1..200),
        _ => rng.usize(200..4000),
    };
    let text: String = (0..n)
        .map(|_| ALPHABET[rng.usize(..ALPHABET.len())])
        .collect();
    if rng.bool() {
        serde_json::json!({ "n": rng.u32(..), "s": text }).to_string()
    } else {
        text
    }
}

fn consume(env: &TestEnv, id: &str, n: usize, raw: bool, bytes: bool) -> Child {
    let n = n.to_string();
    let mut args = vec![
        "event",
        "consume",
        "--subscribe-id",
        id,
        "--max-events",
        n.as_str(),
    ];
    if raw {
        args.extend(["--format", "raw"]);
    }
    let mut c = env.dws(args);
    if bytes {
        c = c.env("DWS_LINE_RING", "off");
    }
    let mut c = c.stdin_hold().spawn();
    c.wait_ready();
    c
}

fn lines_of(out: &Output) -> Vec<String> {
    out.stdout_lines().into_iter().map(str::to_owned).collect()
}

fn finished(c: Child, n: u64) -> Output {
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", n);
    out
}

#[test]
fn the_line_ring_and_the_bytes_print_the_same_lines_over_random_events_filters_and_redeliveries() {
    let seed = fastrand::u64(..);
    eprintln!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let env = TestEnv::new();
    for (id, key) in [
        ("ring", "rg.*"),
        ("bytes", "rg.*"),
        ("ring-a", "rg.a"),
        ("bytes-a", "rg.a"),
        ("ring-raw", "rg.*"),
        ("bytes-raw", "rg.*"),
    ] {
        subscribe_ok(&env, &[key, "--id", id], id);
    }
    let events: Vec<(&str, String)> = (0..400)
        .map(|_| (if rng.bool() { "rg.a" } else { "rg.b" }, payload(&mut rng)))
        .collect();
    let of = |t: &str, range: std::ops::Range<usize>| -> Vec<(String, String)> {
        events
            .iter()
            .enumerate()
            .filter(|(i, (et, _))| range.contains(i) && *et == t)
            .map(|(i, (_, d))| (format!("{t}-{}", rng_id(seed, i)), d.clone()))
            .collect()
    };
    let publish = |range: std::ops::Range<usize>| {
        std::thread::scope(|s| {
            s.spawn(|| publish_parallel(&env, "rg.a", &of("rg.a", range.clone()), 2));
            s.spawn(|| publish_parallel(&env, "rg.b", &of("rg.b", range.clone()), 2));
        });
    };
    let a_total = events.iter().filter(|(t, _)| *t == "rg.a").count();
    // Half of it while consumers read, which then stop at 100 events: what
    // they read ahead of that comes again, redelivered.
    let mut outs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let first = [("ring", 100, false, false), ("bytes", 100, false, true)];
    let running: Vec<_> = first
        .iter()
        .map(|&(id, n, raw, bytes)| (id, n, consume(&env, id, n, raw, bytes)))
        .collect();
    publish(0..200);
    for (id, n, c) in running {
        outs.entry(id)
            .or_default()
            .extend(lines_of(&finished(c, n as u64)));
    }
    // The rest, with every consumer attached (the filtered ones from the
    // start: their seqs have holes).
    let rest = [
        ("ring", 300, false, false),
        ("bytes", 300, false, true),
        ("ring-raw", 400, true, false),
        ("bytes-raw", 400, true, true),
        ("ring-a", a_total, false, false),
        ("bytes-a", a_total, false, true),
    ];
    let running: Vec<_> = rest
        .iter()
        .map(|&(id, n, raw, bytes)| (id, n, consume(&env, id, n, raw, bytes)))
        .collect();
    publish(200..400);
    let mut raw: BTreeMap<&str, String> = BTreeMap::new();
    for (id, n, c) in running {
        let out = finished(c, n as u64);
        if id.ends_with("-raw") {
            raw.insert(id, out.stdout.clone());
        } else {
            outs.entry(id).or_default().extend(lines_of(&out));
        }
    }
    let st = env.status();
    assert!(st["lines"]["ring"] == true, "{}", st["lines"]);
    assert!(
        st["lines"]["ring_batches"].as_u64().unwrap_or(0) > 0,
        "{}",
        st["lines"]
    );
    assert!(
        st["lines"]["line_batches"].as_u64().unwrap_or(0) > 0,
        "{}",
        st["lines"]
    );

    for (ring, bytes) in [("ring", "bytes"), ("ring-a", "bytes-a")] {
        let of_bytes: BTreeMap<(u64, bool, u64), String> = outs[bytes]
            .iter()
            .map(|l| (parts(l).0, parts(l).1))
            .collect();
        let bare_of_bytes: BTreeMap<u64, String> = outs[bytes]
            .iter()
            .map(|l| (parts(l).0 .0, parts(l).2))
            .collect();
        let mut seqs: Vec<u64> = outs[ring].iter().map(|l| parts(l).0 .0).collect();
        seqs.sort_unstable();
        seqs.dedup();
        let want: Vec<u64> = bare_of_bytes.keys().copied().collect();
        assert_eq!(
            seqs, want,
            "{ring} and {bytes} got the same events (seed {seed})"
        );
        for line in &outs[ring] {
            let (key, no_id, bare) = parts(line);
            match of_bytes.get(&key) {
                // The same delivery: the same bytes, but for the id.
                Some(b) => assert_eq!(&no_id, b, "seq {} (seed {seed})", key.0),
                // Delivered another time here than there: the same event.
                None => assert_eq!(Some(&bare), bare_of_bytes.get(&key.0), "seed {seed}"),
            }
        }
    }
    // Raw lines, read once each (the raw consumers take all 400 in one
    // run): each event's data and a newline, the same bytes both ways.
    let data: String = {
        let mut by_seq: BTreeMap<u64, String> = BTreeMap::new();
        for l in &outs["bytes"] {
            let v: Value = serde_json::from_str(l).expect("well-formed");
            let data = v["data"].as_str().unwrap_or_default().to_owned();
            by_seq.insert(v["seq"].as_u64().expect("well-formed"), data + "\n");
        }
        by_seq.into_values().collect()
    };
    assert_eq!(raw["bytes-raw"], data, "seed {seed}");
    assert_eq!(raw["ring-raw"], data, "seed {seed}");
}

/// A published event id, unique per run and event.
fn rng_id(seed: u64, i: usize) -> String {
    format!("{:x}", seed.wrapping_mul(31).wrapping_add(i as u64))
}

/// Publishes events `from..to` of `rs.x`, about 4 KiB each, one per line.
fn publish_lines(env: &TestEnv, from: usize, to: usize) {
    let lines: String = (from..to)
        .map(|i| format!("{{\"i\":{i},\"pad\":\"{}\"}}\n", "p".repeat(4000)))
        .collect();
    env.dws(["event", "publish", "rs.x", "--lines"])
        .stdin_bytes(lines.into_bytes())
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
}

#[test]
fn a_consumer_stopped_while_it_holds_ring_batches_never_stops_the_others() {
    const N: usize = 10_000;
    // Retention holds everything: the stopped consumer loses nothing.
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_BYTES", "536870912")]);
    for id in ["stopped", "a", "b"] {
        subscribe_ok(&env, &["rs.*", "--id", id], id);
    }
    let mut stopped = consume(&env, "stopped", N, false, false);
    let a = consume(&env, "a", N, false, false);
    let b = consume(&env, "b", N, false, false);
    publish_lines(&env, 0, 200);
    stopped.wait_stdout_line_count(50, EXIT_TIMEOUT);
    stopped.signal(Sig::SIGSTOP);
    // More than the whole ring (32 MiB) while it holds what it was told of.
    publish_lines(&env, 200, N);
    for c in [a, b] {
        let out = finished(c, N as u64);
        let seqs: Vec<u64> = out.stdout_lines().iter().map(|l| parts(l).0 .0).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order, once");
        assert_eq!(seqs.len(), N);
    }
    stopped.signal(Sig::SIGCONT);
    let out = finished(stopped, N as u64);
    let seqs: Vec<u64> = out.stdout_lines().iter().map(|l| parts(l).0 .0).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order, once");
    let st = env.status();
    assert!(
        st["lines"]["ring_batches"].as_u64().unwrap_or(0) > 0,
        "{}",
        st["lines"]
    );
}
