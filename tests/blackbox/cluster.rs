//! Several hosts on one PostgreSQL (`store = "postgres"`): each "host" is a
//! [`TestEnv`] of its own (its own config and runtime dirs, its own `busd`)
//! with `DWS_CLUSTER_HOST` naming it, all pointed at one private
//! [`PgServer`] through `DWS_POSTGRES_URL`. Per-host fan-out, publishing
//! from any host, subscriptions created on one host reaching the others,
//! the cluster in `status`, and start-up errors.
//!
//! Submodules, against the fake DingTalk gateway: [`failover`] (the owner
//! dies, the upstream moves to another host), [`fencing`] (the owner loses
//! its lease, running or frozen), and their harness [`upstream`];
//! [`faults_lease`] (the time-bounded lease, a crashing server, forwarded
//! publishes across a restart, a pinned duplicate id); [`follower`]: a
//! follower's gaps, cursors and parked events under the owner's retention,
//! and one definition per subscription cluster-wide; [`partition`]: owner
//! and follower cut off from PostgreSQL by a proxy that swallows every byte;
//! [`status`]: what a follower's status says of the lease once the owner is
//! killed or frozen.

mod failover;
mod faults_lease;
mod fencing;
mod follower;
mod order;
mod partition;
mod status;
mod upstream;

use std::{collections::BTreeSet, time::Duration};

use dws_tests::common::cluster_host as host;
use dws_tests::{
    common::{sub, subscribe_ok},
    pg::PgServer,
    TestEnv, EXIT_TIMEOUT,
};
use serde_json::Value;

/// How long the cluster may take to show something (a refresh is 1 s).
const CLUSTER_WAIT: Duration = Duration::from_secs(15);

fn cluster_of(env: &TestEnv) -> Value {
    env.status()["cluster"].clone()
}

/// Waits until `env`'s status shows a cluster that satisfies `cond`.
fn wait_cluster(env: &TestEnv, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + CLUSTER_WAIT;
    loop {
        let c = cluster_of(env);
        if cond(&c) {
            return c;
        }
        if std::time::Instant::now() >= deadline {
            let st = env.status();
            panic!(
                "timed out waiting for {what}; the cluster is\n{c:#}\nsubscriptions {:#}\nstore {:#}\n{}",
                st["subscriptions"],
                st["store"],
                env.bus_log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn seqs_and_ids(lines: &[String]) -> Vec<(u64, String)> {
    lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            (
                v["seq"].as_u64().unwrap_or_else(|| panic!("no seq: {l}")),
                v["event_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Per-host delivery: a consumer on each host gets every event once, in the
/// cluster's order (the same seq for the same event on every host), whichever
/// host published it; the publish reply's seq is the cluster's.
#[test]
fn every_hosts_consumer_gets_every_event_whichever_host_published_it() {
    let server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    let mut ca = a.dws(["event", "consume", "cl.*"]).spawn();
    ca.wait_ready();
    let mut cb = b.dws(["event", "consume", "cl.*"]).spawn();
    cb.wait_ready();
    wait_cluster(&a, "both hosts registered, one owner", |c| {
        c["hosts"].as_array().is_some_and(|h| h.len() == 2) && c["owner"].is_string()
    });

    let mut replies = vec![];
    for i in 0..10 {
        let (env, who) = if i % 2 == 0 { (&a, "a") } else { (&b, "b") };
        let id = format!("{who}-{i}");
        replies.push(env.publish("cl.x", &format!("{{\"i\":{i}}}"), &["--id", &id]));
    }
    let seqs: Vec<u64> = replies
        .iter()
        .map(|r| r["seq"].as_u64().unwrap_or_else(|| panic!("{r}")))
        .collect();
    let distinct: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        10,
        "every publish got its own cluster seq: {replies:?}"
    );

    let la = seqs_and_ids(&ca.wait_stdout_lines(10, EXIT_TIMEOUT));
    let lb = seqs_and_ids(&cb.wait_stdout_lines(10, EXIT_TIMEOUT));
    assert_eq!(
        la, lb,
        "both hosts deliver the same events in the same order"
    );
    let got: BTreeSet<u64> = la.iter().map(|(s, _)| *s).collect();
    assert_eq!(got, distinct, "the seqs delivered are the ones published");
    assert!(
        la.windows(2).all(|w| w[0].0 < w[1].0),
        "in seq order: {la:?}"
    );

    // A duplicate id is a duplicate on any host.
    let again = b.publish("cl.x", "{}", &["--id", "a-0"]);
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["seq"], replies[0]["seq"], "{again}");
}

/// A named subscription created on one host exists on the others, each
/// with its own cursor from the point it was created; the cluster's status
/// on any host lists the hosts, the owner and every host's cursor.
#[test]
fn a_subscription_created_on_one_host_reaches_the_others_and_status_shows_the_cluster() {
    let server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    a.publish("cs.x", "{\"before\":true}", &[]);
    a.subscribe(&["cs.*", "--id", "team"]);
    b.publish("cs.x", "{\"n\":1}", &["--id", "n1"]);
    a.publish("cs.x", "{\"n\":2}", &["--id", "n2"]);

    let mut cb = b
        .dws(["event", "consume", "--subscribe-id", "team"])
        .spawn();
    cb.wait_ready();
    let got = seqs_and_ids(&cb.wait_stdout_lines(2, EXIT_TIMEOUT));
    let ids: Vec<&str> = got.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(
        ids,
        ["n1", "n2"],
        "host b's instance starts where team was created"
    );
    let mut ca = a
        .dws(["event", "consume", "--subscribe-id", "team"])
        .spawn();
    ca.wait_ready();
    let got_a = seqs_and_ids(&ca.wait_stdout_lines(2, EXIT_TIMEOUT));
    assert_eq!(got_a, got, "host a's own cursor gets the same events");

    let c = wait_cluster(&b, "both hosts' cursors of team", |c| {
        c["cursors"].as_array().is_some_and(|v| {
            v.iter()
                .filter(|x| x["subscription"] == "team" && x["cursor"].as_u64() >= Some(got[1].0))
                .count()
                == 2
        })
    });
    assert_eq!(c["name"], "default", "{c:#}");
    assert_eq!(c["host"], "host-b", "{c:#}");
    let owner = c["owner"]
        .as_str()
        .unwrap_or_else(|| panic!("{c:#}"))
        .to_owned();
    assert!(owner == "host-a" || owner == "host-b", "{c:#}");
    let role_b = if owner == "host-b" {
        "owner"
    } else {
        "follower"
    };
    assert_eq!(c["role"], role_b, "{c:#}");
    assert!(c["head_seq"].as_u64() >= Some(3), "{c:#}");
    let text = b.dws(["event", "status"]).run_with_timeout(EXIT_TIMEOUT);
    text.assert_code(0);
    assert!(
        text.stdout.contains("cluster    default  this host host-b"),
        "{}",
        text.stdout
    );
}

/// A subscription created on one host just after another host's bus
/// started reaches that host as well: the other host's first look at the
/// cluster's definitions comes after its recovery, and what was created in
/// between must not count as known already.
#[test]
fn a_subscription_created_while_another_host_starts_reaches_it() {
    let server = PgServer::start();
    let a = host(&server, "host-a");
    let b = host(&server, "host-b");
    a.publish("ad.x", "{}", &[]);
    // host b's bus is up (recovered, ready) and a subscription is created
    // on host a right away.
    let mut warm = b.dws(["event", "consume", "warm.up"]).spawn();
    warm.wait_ready();
    subscribe_ok(&a, &["ad.*", "--id", "late"], "late");
    b.wait_status(CLUSTER_WAIT, "subscription late on host b", |st| {
        sub(st, "late").is_some()
    });
    a.publish("ad.x", "{}", &["--id", "after"]);
    let mut cb = b
        .dws(["event", "consume", "--subscribe-id", "late"])
        .spawn();
    cb.wait_ready();
    let got = seqs_and_ids(&cb.wait_stdout_lines(1, EXIT_TIMEOUT));
    assert_eq!(got[0].1, "after", "{got:?}");
}

/// A lasting failure of the owner's inbox reads (here its role lost the
/// right to update `dws_inbox`) is retried with a growing backoff, not with
/// a new database session every few milliseconds.
#[test]
fn a_lasting_inbox_failure_on_the_owner_is_retried_with_a_backoff() {
    let server = PgServer::start();
    let a = host(&server, "host-a");
    a.publish("ib.x", "{}", &[]);
    wait_cluster(&a, "host a owns the cluster", |c| c["role"] == "owner");
    server.psql("REVOKE UPDATE ON dws_inbox FROM dws");
    std::thread::sleep(Duration::from_secs(4));
    let log = std::fs::read_to_string(a.bus_log_path()).unwrap_or_default();
    let failures = log
        .lines()
        .filter(|l| l.contains("draining the cluster inbox failed"))
        .count();
    // Polled every second, then retried after 0.1, 0.2, 0.4, 0.8, 1.6 s…
    assert!(
        (1..=12).contains(&failures),
        "{failures} failed inbox reads in 4 s\n{}",
        a.bus_log_tail()
    );
}

/// A database the bus cannot use is an `Error:` before any ready line, with
/// the exit code of its kind, and the password appears nowhere.
#[test]
fn a_cluster_database_that_cannot_be_used_is_refused_before_ready() {
    let server = PgServer::start();
    let wrong = server.url().replace(server.password(), "not-the-password");
    for (url, code, says) in [
        (wrong.as_str(), 3, "password authentication failed"),
        ("postgres://dws:pw@127.0.0.1:1/dws", 1, "127.0.0.1:1"),
        (
            "postgres://dws:pw@127.0.0.1:notaport/dws",
            2,
            "DWS_POSTGRES_URL",
        ),
    ] {
        let env = TestEnv::with_env(&[
            ("DWS_EVENT_BUS_STORE", "postgres"),
            ("DWS_POSTGRES_URL", url),
            ("DWS_CLUSTER_HOST", "h"),
        ]);
        let out = env
            .dws(["event", "consume", "x.y"])
            .run_with_timeout(Duration::from_secs(30));
        let err = out.assert_error(code);
        assert!(err.contains(says), "{url}: {err}\n{out}");
        assert!(!out.stderr.contains("[event] ready"), "{out}");
        for secret in ["not-the-password", server.password()] {
            assert!(!out.stderr.contains(secret), "{out}");
            assert!(
                !env.bus_log_tail().contains(secret),
                "{}",
                env.bus_log_tail()
            );
        }
    }
}

/// `dws event doctor --format json`: its exit code and document.
fn doctor(env: &TestEnv) -> (Option<i32>, Value) {
    let out = env
        .dws(["event", "doctor", "--format", "json"])
        .run_with_timeout(Duration::from_secs(90));
    let doc = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}\n{out}"));
    crate::ecosystem::assert_valid("doctor", &doc);
    (out.code, doc)
}

/// The one check `name` about the default profile.
fn check_of<'a>(doc: &'a Value, name: &str) -> &'a Value {
    let found: Vec<&Value> = doc["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["check"] == name && c["profile"] == "default")
        .collect();
    assert_eq!(found.len(), 1, "one {name} check: {doc:#}");
    found[0]
}

/// Issue 34 item 3: with a wrong PostgreSQL password the doctor said ok,
/// the start then failed with exit 3, and the failed start left a socket
/// the doctor then warned about. Now the doctor tries what a start tries
/// (connect, authenticate, TLS, schema, the lease row) and names the step
/// that fails, and a failed start leaves no socket and no bus.meta.
#[test]
fn doctor_tries_the_database_as_a_start_would_and_a_failed_start_leaves_no_socket() {
    let server = PgServer::start();
    let wrong = server.url().replace(server.password(), "not-the-password");
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_BUS_STORE", "postgres"),
        ("DWS_POSTGRES_URL", wrong.as_str()),
        ("DWS_CLUSTER_HOST", "h"),
    ]);
    let (code, doc) = doctor(&env);
    assert_eq!(code, Some(1), "{doc:#}");
    let db = check_of(&doc, "database");
    assert_eq!(db["status"], "fail", "{doc:#}");
    let msg = db["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("authenticate") && msg.contains("password authentication failed"),
        "{msg}"
    );
    assert!(
        db["hint"].as_str().is_some_and(|h| h.contains("password")),
        "{db}"
    );
    for secret in ["not-the-password", server.password()] {
        assert!(!doc.to_string().contains(secret), "{doc:#}");
    }
    // The start fails as the doctor said, and leaves nothing behind.
    let out = env
        .dws(["event", "publish", "x.y", "1"])
        .run_with_timeout(Duration::from_secs(30));
    assert!(out
        .assert_error(3)
        .contains("password authentication failed"));
    env.wait_no_busd(EXIT_TIMEOUT, "the failed bus exits");
    assert!(
        !env.expected_socket_path().exists(),
        "a failed start left its socket\n{out}"
    );
    assert!(env.bus_meta().is_none(), "a failed start left bus.meta");
    let (_, doc) = doctor(&env);
    assert_eq!(check_of(&doc, "bus")["status"], "ok", "{doc:#}");

    // The right password: every step passes, before and after a start.
    let good = host(&server, "h2");
    let (code, doc) = doctor(&good);
    assert_eq!(code, Some(0), "{doc:#}");
    let msg = check_of(&doc, "database")["message"].to_string();
    assert!(
        msg.contains("authenticated") && msg.contains("schema"),
        "{msg}"
    );
    good.publish("x.y", "1", &[]);
    let (code, doc) = doctor(&good);
    assert_eq!(code, Some(0), "{doc:#}");
    let msg = check_of(&doc, "database")["message"].to_string();
    assert!(msg.contains("lease held by h2"), "{msg}");
}
