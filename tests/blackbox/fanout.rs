//! Fan-out of one rendering: the bus renders a run of first deliveries once
//! and sends the same bytes to every consumer that takes them (`LineBatch`),
//! each `dws` inserting its own subscription id; a subscription that takes
//! only some of those events gets its lines rendered for it. Either way each
//! consumer's stdout is exactly its events, in order, in the contract's
//! line. `--format raw` consumers share raw lines the same way.

use std::thread;

use dws_tests::{
    common::{publish_parallel, str_of, subscribe_ok},
    TestEnv, EXIT_TIMEOUT,
};
use serde_json::Value;

/// A line with its `subscribe_id` taken out, and that id.
fn without_id(line: &str) -> (String, String) {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let id = v["subscribe_id"].as_str().unwrap_or_default().to_owned();
    let needle = format!(
        ",\"subscribe_id\":{}",
        serde_json::to_string(&id).expect("a string is JSON")
    );
    (line.replacen(&needle, "", 1), id)
}

fn seq(line: &str) -> u64 {
    let v: Value = serde_json::from_str(line).expect("a JSON line");
    v["seq"].as_u64().expect("a seq")
}

#[test]
fn every_consumer_of_a_shared_fan_out_gets_exactly_its_events_with_its_own_id() {
    const N: usize = 120;
    let env = TestEnv::new();
    let consume = |key: &str, n: usize| {
        let mut c = env
            .dws(["event", "consume", key, "--max-events", &n.to_string()])
            .spawn();
        let ready = c.wait_ready();
        (c, ready.subscribe_id)
    };
    let all: Vec<_> = (0..3).map(|_| consume("fan.*", 2 * N)).collect();
    // Raw lines are shared too, and used as they come.
    let mut raw = env
        .dws([
            "event",
            "consume",
            "fan.*",
            "--format",
            "raw",
            "--max-events",
            &(2 * N).to_string(),
        ])
        .spawn();
    raw.wait_ready();
    // Half of the events, so its seqs have holes: rendered for it alone.
    let only_a = consume("fan.a", N);
    let items = |p: &str| -> Vec<(String, String)> {
        (0..N)
            .map(|i| (format!("{p}{i}"), format!("{{\"n\":{i},\"s\":\"é\\\"\"}}")))
            .collect()
    };
    thread::scope(|s| {
        s.spawn(|| publish_parallel(&env, "fan.a", &items("a"), 3));
        s.spawn(|| publish_parallel(&env, "fan.b", &items("b"), 3));
    });
    let mut reference: Option<Vec<String>> = None;
    for (c, id) in all {
        let out = c.wait_exit(EXIT_TIMEOUT);
        out.assert_clean_exit("limit", 2 * N as u64);
        let lines = out.stdout_lines();
        assert_eq!(lines.len(), 2 * N, "{out}");
        let seqs: Vec<u64> = lines.iter().map(|l| seq(l)).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "in order, once: {seqs:?}"
        );
        let (stripped, ids): (Vec<String>, Vec<String>) =
            lines.iter().map(|l| without_id(l)).unzip();
        assert!(
            ids.iter().all(|i| *i == id),
            "each line names its own subscription {id}"
        );
        match &reference {
            None => reference = Some(stripped),
            Some(r) => assert_eq!(r, &stripped, "the same lines for every consumer but the id"),
        }
    }
    let reference = reference.expect("three consumers");
    let out = raw.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 2 * N as u64);
    let datas: Vec<String> = reference
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("a JSON line")["data"]
                .as_str()
                .expect("data")
                .to_owned()
        })
        .collect();
    assert_eq!(
        out.stdout_lines(),
        datas,
        "raw: each event's data, in order"
    );
    let (c, id) = only_a;
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", N as u64);
    let (stripped, ids): (Vec<String>, Vec<String>) =
        out.stdout_lines().iter().map(|l| without_id(l)).unzip();
    assert!(ids.iter().all(|i| *i == id));
    let want: Vec<String> = reference
        .iter()
        .filter(|l| l.contains("\"event_type\":\"fan.a\""))
        .cloned()
        .collect();
    assert_eq!(
        stripped, want,
        "a filtered subscription's lines are the same lines"
    );
}

/// On the memory store every retained event keeps its bytes, so consumers
/// far behind the hot tail still share one rendering: each gets exactly its
/// events, in order, in the contract's line with its own id (and raw lines
/// are each event's data).
#[test]
fn consumers_behind_the_hot_tail_of_the_memory_store_get_exactly_their_lines() {
    const N: usize = 90;
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_BUS_STORE", "memory"),
        ("DWS_EVENT_BUS_HOT_EVENTS", "4"),
    ]);
    let ids = ["lag-a", "lag-b", "lag-raw"];
    for id in ids {
        subscribe_ok(&env, &["hot.*", "--id", id, "--ttl", "1h"], id);
    }
    let items: Vec<(String, String)> = (0..N)
        .map(|i| (format!("h{i:03}"), format!("{{\"n\":{i},\"s\":\"é\\\"\"}}")))
        .collect();
    publish_parallel(&env, "hot.k", &items, 3);
    // Every event is now far behind the hot tail of 4.
    let max = N.to_string();
    let consumers: Vec<_> = ids
        .iter()
        .map(|id| {
            let mut args = vec![
                "event",
                "consume",
                "--subscribe-id",
                id,
                "--max-events",
                &max,
            ];
            if *id == "lag-raw" {
                args.extend(["--format", "raw"]);
            }
            env.dws(args).spawn()
        })
        .collect();
    let mut reference: Option<Vec<String>> = None;
    let mut raw_lines: Vec<String> = vec![];
    for (c, id) in consumers.into_iter().zip(ids) {
        let out = c.wait_exit(EXIT_TIMEOUT);
        out.assert_clean_exit("limit", N as u64);
        let lines = out.stdout_lines();
        assert_eq!(lines.len(), N, "{out}");
        if id == "lag-raw" {
            raw_lines = lines.iter().map(|l| l.to_string()).collect();
            continue;
        }
        let seqs: Vec<u64> = lines.iter().map(|l| seq(l)).collect();
        assert_eq!(seqs, (1..=N as u64).collect::<Vec<_>>(), "in order, once");
        for l in &lines {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(str_of(&v, "subscribe_id"), id, "{l}");
            assert_eq!(v["redelivered"], false, "{l}");
            assert_eq!(str_of(&v, "event_type"), "hot.k", "{l}");
        }
        let (stripped, _): (Vec<String>, Vec<String>) = lines.iter().map(|l| without_id(l)).unzip();
        match &reference {
            None => reference = Some(stripped),
            Some(r) => assert_eq!(r, &stripped, "the same lines but the id"),
        }
    }
    let reference = reference.expect("two NDJSON consumers");
    let mut by_id: Vec<(String, String)> = reference
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            (
                str_of(&v, "event_id").to_owned(),
                str_of(&v, "data").to_owned(),
            )
        })
        .collect();
    let datas: Vec<String> = by_id.iter().map(|(_, d)| d.clone()).collect();
    assert_eq!(raw_lines, datas, "raw: each event's data, in order");
    by_id.sort();
    assert_eq!(by_id, items, "each event whole, with its id");
}
