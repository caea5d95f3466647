//! What a follower's `dws event status` says of the cluster once its owner
//! is gone: the lease as the database has it (holder, epoch, expiry on the
//! database's clock, or that it expired), never a dead owner as live past
//! its lease, heartbeat ages that keep growing, and then the new owner with
//! the log's head as the database has it.

use std::time::{Duration, Instant};

use dws_tests::{common::cluster_host_with, pg::PgServer, wait_pid_gone, Sig, TestEnv};
use serde_json::Value;

use super::{
    upstream::{busd_pid, head_seq, signal},
    wait_cluster, CLUSTER_WAIT,
};

/// The dead or frozen host's row in `c["hosts"]`, if listed.
fn host_row<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["hosts"].as_array()?.iter().find(|h| h["host"] == name)
}

/// Polls `follower`'s status from `since` (when `gone`'s busd stopped
/// renewing anything) until it names itself the owner; every document on
/// the way must tell the truth: `gone` is named owner only under a lease
/// that has not expired, a lease that ran out names no owner, and `gone`'s
/// heartbeat age is at least the time since it stopped. Returns the last
/// document and how many named `gone` as owner.
fn watch_until_taken_over(
    follower: &TestEnv,
    gone: &str,
    me: &str,
    since: Instant,
) -> (Value, usize) {
    let deadline = Instant::now() + CLUSTER_WAIT * 2;
    let mut named_gone = 0;
    loop {
        let elapsed = since.elapsed();
        let st = follower.status();
        crate::ecosystem::assert_valid("status", &st);
        let c = st["cluster"].clone();
        let lease = &c["lease"];
        assert!(lease.is_object(), "status shows the lease: {c:#}");
        if c["owner"] == gone {
            named_gone += 1;
            assert_eq!(lease["holder"], gone, "{c:#}");
            assert_eq!(
                lease["expired"], false,
                "a dead owner named past its lease: {c:#}"
            );
            assert!(
                lease["expires_in_ms"].as_i64() > Some(0),
                "a dead owner named past its lease: {c:#}"
            );
        }
        if lease["expired"] == true {
            assert_eq!(
                c["owner"],
                Value::Null,
                "an expired lease names no owner: {c:#}"
            );
        }
        if let Some(h) = host_row(&c, gone) {
            let age = h["heartbeat_age_ms"].as_u64().unwrap_or_default();
            assert!(
                u128::from(age) >= elapsed.as_millis(),
                "{gone} stopped {elapsed:?} before this status, yet its heartbeat age is {age} ms \
                 (a stale read shown as fresh): {c:#}"
            );
        }
        if c["owner"] == me && c["role"] == "owner" {
            return (c, named_gone);
        }
        assert!(
            Instant::now() < deadline,
            "no takeover shown: {c:#}\n{}",
            follower.bus_log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Two local-source hosts; host a's bus starts first and owns the lease.
fn two_hosts(server: &PgServer, lease: &str) -> (TestEnv, TestEnv) {
    let extra = [("DWS_CLUSTER_LEASE", lease)];
    let a = cluster_host_with(server, "host-a", &extra);
    a.publish("ls.x", "{}", &["--id", "from-a"]);
    wait_cluster(&a, "host a owns", |c| c["role"] == "owner");
    let b = cluster_host_with(server, "host-b", &extra);
    b.publish("ls.x", "{}", &["--id", "from-b"]);
    let c = wait_cluster(&b, "host b follows host a, under a lease", |c| {
        c["owner"] == "host-a"
            && c["role"] == "follower"
            && c["lease"]["holder"] == "host-a"
            && c["hosts"].as_array().is_some_and(|h| h.len() == 2)
    });
    let lease = &c["lease"];
    assert_eq!(lease["epoch"], c["epoch"], "{c:#}");
    assert_eq!(lease["expired"], false, "{c:#}");
    assert!(lease["expires_at_unix_ms"].as_i64() > Some(0), "{c:#}");
    (a, b)
}

/// The owner's busd is killed with `-9`: until host b takes the lease,
/// b's status names host a only while the lease row still runs (its
/// expiry shown, on the database's clock), with host a's heartbeat age
/// growing from the kill on; then host b under a new epoch, and the head
/// the database has once b appended.
#[test]
fn after_the_owner_is_killed_a_followers_status_shows_the_lease_then_the_new_owner() {
    let server = PgServer::start();
    let (a, b) = two_hosts(&server, "10s");
    let epoch = b.status()["cluster"]["epoch"].as_i64().unwrap_or_default();
    let pid = busd_pid(&a);
    signal(pid, Sig::SIGKILL);
    let killed = Instant::now();
    assert!(
        wait_pid_gone(pid, Duration::from_secs(10)),
        "busd {pid} survived -9"
    );
    let (c, _) = watch_until_taken_over(&b, "host-a", "host-b", killed);
    assert!(c["epoch"].as_i64() > Some(epoch), "{c:#}");
    assert_eq!(c["lease"]["holder"], "host-b", "{c:#}");
    assert!(c["lease"]["expires_in_ms"].as_i64() > Some(0), "{c:#}");

    b.publish("ls.x", "{}", &["--id", "after"]);
    let db_head = head_seq(&server);
    wait_cluster(&b, "the database's head", |c| c["head_seq"] == db_head);
    let text = b
        .dws(["event", "status"])
        .run_with_timeout(Duration::from_secs(30));
    text.assert_code(0);
    assert!(
        text.stdout
            .lines()
            .any(|l| l.starts_with("lease      host-b  epoch ") && l.contains("expires in ")),
        "{}",
        text.stdout
    );
}

/// An owner frozen with SIGSTOP keeps its database sessions (and any lock
/// it held mid-append) but stops renewing: b's status never names it past
/// its lease (2 s here), shows its heartbeat ageing, and then b as owner.
#[test]
fn a_frozen_owner_is_never_shown_as_owner_past_its_lease() {
    let server = PgServer::start();
    let (a, b) = two_hosts(&server, "2s");
    let pid = busd_pid(&a);
    signal(pid, Sig::SIGSTOP);
    let frozen = Instant::now();
    let (c, named) = watch_until_taken_over(&b, "host-a", "host-b", frozen);
    eprintln!(
        "cluster status: the frozen owner was named in {named} status(es) before the takeover"
    );
    assert_eq!(c["lease"]["expired"], false, "{c:#}");
    signal(pid, Sig::SIGCONT);
    // Woken, host a finds itself fenced and its bus stops.
    assert!(
        wait_pid_gone(pid, Duration::from_secs(60)),
        "the fenced busd {pid} stopped"
    );
}

/// Issue 50: right after publishes, a host's status must not show the
/// cluster's head behind its own log (it read the database up to a second
/// before): the owner showed `head 1` while its log said `seq 1..2`. The
/// head is the newest of the two, on the owner and on a follower.
#[test]
fn the_clusters_head_in_status_is_never_behind_the_hosts_own_log() {
    let server = PgServer::start();
    let (a, b) = two_hosts(&server, "10s");
    for env in [&a, &b] {
        for n in 0..5 {
            env.publish("ls.x", "{}", &[]);
            let st = env.status();
            let (log, cluster) = (&st["log"]["head_seq"], &st["cluster"]["head_seq"]);
            assert!(
                cluster.as_u64() >= log.as_u64() && log.as_u64() > Some(n),
                "the cluster's head {cluster} is behind this host's log head {log}: {:#}",
                st["cluster"]
            );
        }
    }
}
