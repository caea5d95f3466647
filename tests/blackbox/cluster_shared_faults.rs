//! Shared delivery (`--delivery shared`) under faults: a host killed with
//! `-9` and restarted at once (its new incarnation must not keep the dead
//! one's claims), retention evicting events no host delivered (a gap, like
//! per-host), `--from latest` meaning the head at creation cluster-wide,
//! and PostgreSQL restarting while consumers ack (no ack forgotten, no
//! answered event left undelivered).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use dws_tests::common::{cluster_host as host, wait_subscription_known as wait_known};
use dws_tests::{pg::PgServer, Child, TestEnv, EXIT_TIMEOUT};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

/// Every event line of `c` so far: event id → (seq, redelivered) of each
/// delivery.
fn seen(c: &Child) -> BTreeMap<String, Vec<(u64, bool)>> {
    let mut m: BTreeMap<String, Vec<(u64, bool)>> = BTreeMap::new();
    for l in c.stdout_so_far() {
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}"));
        m.entry(v["event_id"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push((v["seq"].as_u64().unwrap_or(0), v["redelivered"] == true));
    }
    m
}

/// Waits (bounded) until `cond` holds over the consumers' output.
fn wait_for(
    what: &str,
    cs: &[&Child],
    cond: impl Fn(&[BTreeMap<String, Vec<(u64, bool)>>]) -> bool,
) {
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

fn publish_ids(env: &TestEnv, prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let id = format!("{prefix}-{i:03}");
            let r = env.publish("sh.job", "{}", &["--id", &id]);
            assert_eq!(r["duplicate"], false, "{r}");
            id
        })
        .collect()
}

fn consume(env: &TestEnv, extra: &[&str]) -> Child {
    let mut args = vec!["event", "consume", "--subscribe-id", "work"];
    args.extend_from_slice(extra);
    let mut c = env.dws(&args).stdin_hold().spawn();
    c.wait_ready();
    c
}

fn kill9_bus(env: &TestEnv) {
    for pid in env.busd_pids() {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    env.wait_no_busd(EXIT_TIMEOUT, "the killed bus is gone");
}

/// Open (not done) claims in the database.
fn open_claims(server: &PgServer) -> u64 {
    server
        .psql("SELECT count(*) FROM dws_claim WHERE NOT done")
        .trim()
        .parse()
        .unwrap_or(u64::MAX)
}

#[test]
fn a_host_restarted_at_once_does_not_keep_its_dead_incarnations_claims() {
    let server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    wait_known(&b, "work");
    // host-a's consumer never acks: the 5 events stay claimed by host-a.
    let ca = consume(&a, &["--ack", "explicit", "--ack-wait", "10m"]);
    let want = publish_ids(&a, "held", 5);
    wait_for("host-a holds all 5", &[&ca], |all| all[0].len() == 5);

    let cb = consume(&b, &[]);
    kill9_bus(&a);
    // Restarted within a moment, under the same host name.
    a.publish("other.x", "{}", &[]);
    let ca2 = consume(&a, &[]);
    // The dead incarnation's claims expire; some host delivers the 5 again,
    // marked redelivered.
    wait_for(
        "the 5 held events delivered again after the restart",
        &[&cb, &ca2],
        |all| want.iter().all(|id| all.iter().any(|m| m.contains_key(id))),
    );
    let (sb, sa) = (seen(&cb), seen(&ca2));
    for id in &want {
        let marks: Vec<bool> = sb
            .get(id)
            .into_iter()
            .chain(sa.get(id))
            .flatten()
            .map(|&(_, r)| r)
            .collect();
        assert!(
            marks.iter().all(|&r| r),
            "{id}: marked redelivered {marks:?}"
        );
    }
    a.wait_until(Duration::from_secs(30), "every claim done", || {
        open_claims(&server) == 0
    });
    drop(ca);
}

#[test]
fn shared_events_evicted_before_any_host_delivered_them_are_a_gap() {
    let server = PgServer::start();
    let a = dws_tests::common::cluster_host_with(
        &server,
        "host-a",
        &[("DWS_EVENT_BUS_RETENTION_EVENTS", "50")],
    );
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    let items: Vec<(String, String)> = (0..200)
        .map(|i| (format!("ev-{i:03}"), "{}".to_owned()))
        .collect();
    dws_tests::common::publish_parallel(&a, "sh.job", &items, 4);
    let mut c = consume(&a, &[]);
    let gap = c.wait_stderr_line("the gap line", Duration::from_secs(30), |l| {
        l.starts_with("[event] gap")
    });
    assert!(gap.contains("lost 150 event(s)"), "{gap}\n{}", c.report());
    wait_for("the 50 retained events", &[&c], |all| all[0].len() >= 50);
    let st = a.status();
    let s = dws_tests::common::listed(&st, "work");
    assert_eq!(s["lost_to_retention"], 150, "{st:#}");
    assert_eq!(seen(&c).len(), 50, "{}", c.report());
}

#[test]
fn a_shared_subscription_from_latest_starts_at_the_head_cluster_wide() {
    let server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    let old = publish_ids(&a, "old", 10);
    b.publish("other.x", "{}", &[]);
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    wait_known(&b, "work");
    let ca = consume(&a, &[]);
    let cb = consume(&b, &[]);
    let new = publish_ids(&b, "new", 4);
    wait_for("the new events", &[&ca, &cb], |all| {
        new.iter().all(|id| all.iter().any(|m| m.contains_key(id)))
    });
    // Whatever an older event would have needed to arrive has had time: the
    // new ones came after it would have been claimed.
    std::thread::sleep(Duration::from_secs(2));
    for (name, c) in [("host-a", &ca), ("host-b", &cb)] {
        let got: BTreeSet<String> = seen(c).into_keys().collect();
        let wrong: Vec<&String> = old.iter().filter(|id| got.contains(*id)).collect();
        assert!(wrong.is_empty(), "{name} delivered older events {wrong:?}");
    }
}

#[test]
fn acks_made_while_postgres_restarts_are_not_forgotten() {
    let mut server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    wait_known(&b, "work");
    let mut ca = consume(&a, &["--ack", "explicit", "--ack-wait", "10m"]);
    let want = publish_ids(&a, "before", 6);
    wait_for("host-a holds the 6", &[&ca], |all| all[0].len() == 6);
    let seqs: Vec<u64> = seen(&ca).values().map(|d| d[0].0).collect();

    server.stop();
    // Acked while the database is down.
    let acks: String = seqs.iter().map(|s| format!("ack {s}\n")).collect();
    ca.write_stdin(acks.as_bytes());
    // Published on a follower and on the owner during the outage: answered
    // once the database is back.
    let during: Vec<_> = (0..3)
        .map(|i| {
            let env = if i % 2 == 0 { &a } else { &b };
            let id = format!("during-{i}");
            env.dws(["event", "publish", "sh.job", "{}", "--id", id.as_str()])
                .spawn()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    server.start_again();
    let mut answered = vec![];
    for (i, p) in during.into_iter().enumerate() {
        let out = p.wait_exit(Duration::from_secs(90));
        if out.code == Some(0) {
            answered.push(format!("during-{i}"));
        }
    }
    let cb = consume(&b, &[]);
    let after = publish_ids(&a, "after", 5);
    // Every answered event reaches a consumer (host-a's consumer acks
    // nothing more: host-b gets what host-a does not hold).
    let expect: Vec<String> = answered.iter().cloned().chain(after).collect();
    wait_for("every answered event delivered", &[&ca, &cb], |all| {
        expect
            .iter()
            .all(|id| all.iter().any(|m| m.contains_key(id)))
    });
    // host-a's acks reached the claims: none of the 6 is open any more.
    a.wait_until(
        Duration::from_secs(30),
        "host-a's acked claims done",
        || {
            server
                .psql(&format!(
                    "SELECT count(*) FROM dws_claim WHERE NOT done AND seq IN ({})",
                    seqs.iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ))
                .trim()
                == "0"
        },
    );
    assert_eq!(want.len(), 6);
}

#[test]
fn shared_events_a_leaving_consumer_held_past_retention_are_a_gap_not_a_silent_loss() {
    let server = PgServer::start();
    let a = dws_tests::common::cluster_host_with(
        &server,
        "host-a",
        &[("DWS_EVENT_BUS_RETENTION_EVENTS", "5")],
    );
    a.subscribe(&["sh.*", "--id", "work", "--delivery", "shared"]);
    // The first consumer takes all 13 and acks none: retention takes the
    // oldest 8 from the log while they are in flight (pinned).
    let c1 = consume(&a, &["--ack", "explicit", "--ack-wait", "10m"]);
    let ids = publish_ids(&a, "held", 13);
    wait_for("the first consumer holds all 13", &[&c1], |all| {
        all[0].len() == 13
    });
    c1.signal(Signal::SIGTERM);
    c1.wait_exit(EXIT_TIMEOUT);
    // What it held goes back: the 5 still in the log are delivered again,
    // the 8 nobody can deliver any more are a gap.
    let mut c2 = consume(&a, &[]);
    let gap = c2.wait_stderr_line("the gap line", Duration::from_secs(30), |l| {
        l.starts_with("[event] gap")
    });
    assert!(gap.contains("lost 8 event(s)"), "{gap}\n{}", c2.report());
    wait_for("the 5 retained events again", &[&c2], |all| {
        all[0].len() >= 5
    });
    let got = seen(&c2);
    assert_eq!(
        got.keys().cloned().collect::<Vec<_>>(),
        ids[8..].to_vec(),
        "{}",
        c2.report()
    );
    let st = a.status();
    assert_eq!(
        dws_tests::common::listed(&st, "work")["lost_to_retention"],
        8,
        "{st:#}"
    );
}
