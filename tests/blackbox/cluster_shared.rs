//! Shared delivery across a cluster (`dws event subscribe --delivery
//! shared`): consumers of one shared subscription on two hosts split the
//! events — each event exactly once across both hosts while nothing fails,
//! and at least once (the dead host's unacked events delivered again by the
//! other, marked redelivered) when a host is killed with `-9` mid-stream.
//! Also: shared delivery needs the cluster store.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use dws_tests::common::{cluster_host as host, wait_subscription_known as wait_known};
use dws_tests::{pg::PgServer, Child, TestEnv, EXIT_TIMEOUT};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

/// Every event line of `c` so far: event id → redelivered marks.
fn seen(c: &Child) -> BTreeMap<String, Vec<bool>> {
    let mut m: BTreeMap<String, Vec<bool>> = BTreeMap::new();
    for l in c.stdout_so_far() {
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}"));
        m.entry(v["event_id"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(v["redelivered"] == true);
    }
    m
}

fn publish_all(env: &TestEnv, n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|i| {
            let id = format!("job-{i:03}");
            let r = env.publish("sh.job", &format!("{{\"i\":{i}}}"), &["--id", &id]);
            assert_eq!(r["duplicate"], false, "{r}");
            id
        })
        .collect()
}

/// Waits until `cond` holds over the consumers' output.
fn wait_for(what: &str, cs: &[&Child], cond: impl Fn(&[BTreeMap<String, Vec<bool>>]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all: Vec<_> = cs.iter().map(|c| seen(c)).collect();
        if cond(&all) {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out waiting for {what}\n{}",
                cs.iter().map(|c| c.report()).collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_shared_subscription_gives_each_event_to_exactly_one_consumer_across_hosts() {
    const N: usize = 60;
    let server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    wait_known(&b, "work");
    let mut ca = a
        .dws(["event", "consume", "--subscribe-id", "work"])
        .spawn();
    ca.wait_ready();
    let mut cb = b
        .dws(["event", "consume", "--subscribe-id", "work"])
        .spawn();
    cb.wait_ready();

    let want = publish_all(&a, N / 2);
    let want: BTreeSet<String> = want.into_iter().chain(publish_all(&b, 0)).collect();
    let more: BTreeSet<String> = (N / 2..N)
        .map(|i| {
            let id = format!("job-{i:03}");
            b.publish("sh.job", "{}", &["--id", &id]);
            id
        })
        .collect();
    let want: BTreeSet<String> = want.into_iter().chain(more).collect();
    assert_eq!(want.len(), N);
    wait_for(
        "every event delivered once across the hosts",
        &[&ca, &cb],
        |all| all.iter().map(|m| m.len()).sum::<usize>() >= N,
    );
    // Quiet for a moment: nothing arrives twice afterwards either.
    std::thread::sleep(Duration::from_secs(2));
    let (sa, sb) = (seen(&ca), seen(&cb));
    for (name, s) in [("host-a", &sa), ("host-b", &sb)] {
        for (id, marks) in s {
            assert_eq!(marks, &[false], "{name} got {id} {} time(s)", marks.len());
        }
    }
    let ka: BTreeSet<&String> = sa.keys().collect();
    let kb: BTreeSet<&String> = sb.keys().collect();
    assert!(
        ka.is_disjoint(&kb),
        "an event went to both hosts: {:?}",
        ka.intersection(&kb).collect::<Vec<_>>()
    );
    let union: BTreeSet<String> = ka.union(&kb).map(|s| s.to_string()).collect();
    assert_eq!(union, want);
    assert!(
        !sa.is_empty() && !sb.is_empty(),
        "both hosts took a share: a {} b {}",
        sa.len(),
        sb.len()
    );
    eprintln!("host-a delivered {}, host-b {}", sa.len(), sb.len());
}

#[test]
fn a_host_killed_mid_stream_leaves_its_unacked_shared_events_to_the_others() {
    const N: usize = 30;
    let server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    wait_known(&b, "work");
    // host-a's consumer never acks: everything host-a claims stays in flight.
    let mut ca = a
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "work",
            "--ack",
            "explicit",
            "--ack-wait",
            "10m",
        ])
        .stdin_hold()
        .spawn();
    ca.wait_ready();
    let mut cb = b
        .dws(["event", "consume", "--subscribe-id", "work"])
        .spawn();
    cb.wait_ready();
    let want = publish_all(&a, N);
    wait_for("every event delivered somewhere", &[&ca, &cb], |all| {
        all[0]
            .keys()
            .chain(all[1].keys())
            .collect::<BTreeSet<_>>()
            .len()
            == N
    });
    let held_by_a: BTreeSet<String> = seen(&ca).into_keys().collect();
    assert!(!held_by_a.is_empty(), "host-a took a share");

    for pid in a.busd_pids() {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    // host-a's claims expire (they are no longer renewed): host-b delivers
    // them again, marked.
    wait_for("host-b has every event", &[&cb], |all| all[0].len() == N);
    let sb = seen(&cb);
    let got: BTreeSet<String> = sb.keys().cloned().collect();
    assert_eq!(got, want);
    for id in &held_by_a {
        assert_eq!(
            sb[id],
            [true],
            "{id}: delivered again by host-b, marked redelivered"
        );
    }
    drop(ca);
    let _ = EXIT_TIMEOUT;
}

#[test]
fn shared_delivery_on_one_host_is_a_work_queue_and_takes_where_there() {
    // No cluster needed: on one host several consumers share it.
    let env = TestEnv::new();
    let out = env
        .dws([
            "event",
            "subscribe",
            "sh.*",
            "--id",
            "w",
            "--delivery",
            "shared",
            "--where",
            ".data != \"skip\"",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    let st = env.status();
    let w = dws_tests::common::listed(&st, "w");
    assert_eq!(w["delivery"], "shared", "{st:#}");
    assert_eq!(
        w["where"],
        serde_json::json!([".data != \"skip\""]),
        "{st:#}"
    );
}

/// Issue 50, the shared delivery that stopped for good: a host that starts
/// after many events of a shared subscription were finished elsewhere tried
/// them one window (16) per claims round (about two a second), so a host
/// restarted more often than it could walk them never delivered again. Now
/// it looks them up thousands at a time: with 600 finished events and no
/// other consumer, the next event reaches the new host's consumer at once.
#[test]
fn a_host_started_after_many_finished_shared_events_delivers_the_next_at_once() {
    const DONE: usize = 600;
    let server = PgServer::start();
    let a = host(&server, "host-a");
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    let lines: String = (0..DONE).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    a.dws(["event", "publish", "sh.job", "--lines"])
        .stdin_bytes(lines.into_bytes())
        .run_with_timeout(Duration::from_secs(120))
        .assert_code(0);
    a.dws([
        "event",
        "consume",
        "--subscribe-id",
        "work",
        "--max-events",
        &DONE.to_string(),
    ])
    .run_with_timeout(Duration::from_secs(300))
    .assert_code(0);
    a.wait_until(Duration::from_secs(60), "every claim finished", || {
        server.psql("SELECT count(*) FROM dws_claim WHERE done") == DONE.to_string()
    });
    let b = host(&server, "host-b");
    wait_known(&b, "work");
    let mut cb = b
        .dws(["event", "consume", "--subscribe-id", "work"])
        .spawn();
    cb.wait_ready();
    let t = Instant::now();
    b.publish("sh.job", "{\"last\":true}", &["--id", "the-next"]);
    wait_for("the next event on host b", &[&cb], |all| {
        all[0].contains_key("the-next")
    });
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "host b delivered the next event only after {took:?}"
    );
    assert_eq!(seen(&cb).len(), 1, "nothing finished is delivered again");
}
