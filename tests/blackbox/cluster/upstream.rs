//! The harness of the failover tests ([`super::failover`],
//! [`super::fencing`]): two cluster hosts whose upstream is one loopback
//! fake DingTalk gateway ([`FakeDingTalk`], through the `dingtalk` source:
//! only the lease holder opens it), a per-host named subscription with a
//! consumer on each host, a numbered stream of pushes, and the checks every
//! failover must pass: one upstream connection at a time, every event once
//! by event id and in seq order at the survivor, what a dead host delivered
//! is in the survivor's stream under the same seqs, the log holds exactly
//! the survivor's stream, and nothing is left behind.
//!
//! The fake redelivers every unacked EVENT on the next connection (same
//! `messageId`, same `eventId`), like the real gateway: events the old owner
//! had not acked reach the new owner, whose dedup window (it came with the
//! log) drops the ones already in the log.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use dws_tests::{
    common::{cluster_host_with, sub},
    fake_dingtalk::{Event, FakeDingTalk, FakeState, FAST_BACKOFF},
    is_live,
    pg::PgServer,
    Child, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::json;

use super::{seqs_and_ids, wait_cluster, CLUSTER_WAIT};

/// Bound of the waits for events and acks.
pub(super) const T: Duration = Duration::from_secs(30);
/// Generous bound of a takeover after the owner died or lost its lease
/// session (the documented target is about 2 s).
pub(super) const TAKEOVER_BOUND: Duration = Duration::from_secs(10);
/// The named per-host subscription every host's consumer reads.
const SUB: &str = "fo";

/// One host of the cluster on `server`, its upstream the `dingtalk` source
/// on `fake` (configured the same on every host, as docs/cluster.md says).
pub(super) fn dingtalk_host(server: &PgServer, fake: &FakeDingTalk, name: &str) -> TestEnv {
    let env = cluster_host_with(server, name, &FAST_BACKOFF);
    env.write_default_profile(&fake.app_profile("max_attempts = 0\n"));
    env
}

pub(super) fn ev(id: &str) -> Event {
    Event::new(id, "user_add_org", json!({"userId": [id]}).to_string())
}

/// Two hosts on `fake` with the per-host subscription [`SUB`] (created on
/// host a, waited for on host b) and a consumer of it on each; returns them
/// once the cluster has an owner and the owner's upstream is connected.
pub(super) struct TwoHosts {
    a: TestEnv,
    b: TestEnv,
    ca: Child,
    cb: Child,
}

impl TwoHosts {
    pub(super) fn start(server: &PgServer, fake: &FakeDingTalk) -> TwoHosts {
        let a = dingtalk_host(server, fake, "host-a");
        let b = dingtalk_host(server, fake, "host-b");
        start_bus(&a);
        start_bus(&b);
        a.subscribe(&["*", "--id", SUB]);
        b.wait_status(CLUSTER_WAIT, "the subscription reaches host b", |st| {
            sub(st, SUB).is_some()
        });
        let consume = |env: &TestEnv| {
            let mut c = env
                .dws(["event", "consume", "--subscribe-id", SUB])
                .stdin_hold()
                .spawn();
            c.wait_ready();
            c
        };
        let ca = consume(&a);
        let cb = consume(&b);
        wait_cluster(&a, "both hosts registered, one owner", |c| {
            c["hosts"].as_array().is_some_and(|h| h.len() == 2) && c["owner"].is_string()
        });
        fake.wait_connected(T);
        TwoHosts { a, b, ca, cb }
    }

    /// `(owner, its consumer, follower, its consumer, owner's name,
    /// follower's name)`, as host a's status says.
    #[allow(clippy::type_complexity)]
    pub(super) fn split(self) -> (TestEnv, Child, TestEnv, Child, &'static str, &'static str) {
        let c = wait_cluster(&self.a, "an owner", |c| c["owner"].is_string());
        if c["owner"] == "host-a" {
            (self.a, self.ca, self.b, self.cb, "host-a", "host-b")
        } else {
            assert_eq!(c["owner"], "host-b", "{c:#}");
            (self.b, self.cb, self.a, self.ca, "host-b", "host-a")
        }
    }
}

/// Starts `env`'s bus (a consumer attaches and leaves again; the bus stays).
pub(super) fn start_bus(env: &TestEnv) {
    let mut c = env.dws(["event", "consume", "warm.up"]).spawn();
    c.wait_ready();
    c.signal(Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 0);
}

/// The one live `busd` of `env`.
pub(super) fn busd_pid(env: &TestEnv) -> i32 {
    let pids = env.busd_pids();
    assert_eq!(pids.len(), 1, "one busd per host: {pids:?}");
    pids[0]
}

pub(super) fn signal(pid: i32, sig: Sig) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
        .unwrap_or_else(|e| panic!("kill -{sig} {pid}: {e}"));
}

/// `(seq, event_id)` of every event line so far, once the event `last` has
/// arrived.
pub(super) fn lines_until(c: &mut Child, last: &str) -> Vec<(u64, String)> {
    let lines = c.wait_stdout_line(&format!("event {last}"), T, |l| {
        l.contains(&format!("\"event_id\":\"{last}\""))
    });
    seqs_and_ids(&lines)
}

/// Exactly once by event id, in increasing seq order.
pub(super) fn assert_once_in_order(got: &[(u64, String)], want: &[String], who: &str) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, id) in got {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{who}: delivered more than once: {twice:?}"
    );
    let missing: Vec<_> = want
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .collect();
    assert!(missing.is_empty(), "{who}: never delivered: {missing:?}");
    let extra: Vec<_> = counts
        .keys()
        .filter(|id| !want.iter().any(|w| w == *id))
        .collect();
    assert!(
        extra.is_empty(),
        "{who}: delivered but never pushed: {extra:?}"
    );
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "{who}: not in seq order: {got:?}"
    );
}

/// Every `(seq, id)` a host delivered before it died is in the survivor's
/// stream with the same seq: a consumer only ever sees events in the log.
pub(super) fn assert_prefix_consistent(
    dead: &[(u64, String)],
    survivor: &[(u64, String)],
    who: &str,
) {
    for e in dead {
        assert!(
            survivor.contains(e),
            "{who} delivered {e:?}, which the survivor's stream lacks (or has under another seq)"
        );
    }
}

/// The upstream connections never overlapped: each one ended before the
/// next one was opened.
pub(super) fn assert_one_connection_at_a_time(fake: &FakeDingTalk) {
    let conns = fake.connections();
    for w in conns.windows(2) {
        let (old, new) = (&w[0], &w[1]);
        assert!(
            old.closed_at.is_some_and(|end| end <= new.opened_at),
            "upstream connection {} was opened while {} was still live\n{}",
            new.id,
            old.id,
            fake.summary()
        );
    }
}

/// Pushes `ids` in bursts of 10 every 40 ms (so some are always in flight
/// unacked), then sets `done`.
pub(super) fn push_stream(fake: &FakeDingTalk, ids: &[String], done: &AtomicBool) {
    for burst in ids.chunks(10) {
        for id in burst {
            fake.push_event(&ev(id));
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    done.store(true, Ordering::Release);
}

pub(super) fn acked_count(s: &FakeState) -> usize {
    s.outbox.iter().filter(|o| o.acked).count()
}

/// Stops every host's bus (`dws event stop`, the surviving owner's clean
/// exit included) and the server, and checks that nothing is left: no
/// `busd` of any host, no PostgreSQL process.
pub(super) fn teardown(server: PgServer, hosts: &[&TestEnv]) {
    for env in hosts {
        if !env.busd_pids().is_empty() {
            env.dws(["event", "stop"])
                .run_with_timeout(EXIT_TIMEOUT)
                .assert_code(0);
        }
        env.wait_no_busd(EXIT_TIMEOUT, "the host's bus stopped");
    }
    let procs = server.processes();
    assert!(!procs.is_empty(), "the server runs");
    drop(server);
    for pid in procs {
        assert!(
            !is_live(pid),
            "PostgreSQL process {pid} outlived its server"
        );
    }
}

/// The cluster's head in the database.
pub(super) fn head_seq(server: &PgServer) -> u64 {
    let out = server.psql("SELECT head_seq FROM dws_cluster WHERE cluster = 'default'");
    out.parse().unwrap_or_else(|e| panic!("{out:?}: {e}"))
}

/// `(event id, when)` of every EVENT acked on connection `conn`.
pub(super) fn acked_on(fake: &FakeDingTalk, conn: u64) -> Vec<(String, Instant)> {
    fake.with_state(|s| {
        s.acks
            .iter()
            .filter(|a| a.conn == conn && a.code == 200)
            .filter_map(|a| {
                let o = s.outbox.iter().find(|o| o.message_id == a.message_id)?;
                Some((o.event_id.clone(), a.at))
            })
            .collect()
    })
}

/// The first connection opened after `since`: `(id, how long after)`.
pub(super) fn wait_new_connection(fake: &FakeDingTalk, since: Instant) -> (u64, Duration) {
    fake.wait("a new upstream connection", T, |s| {
        s.conns
            .iter()
            .find(|c| c.opened_at > since)
            .map(|c| (c.id, c.opened_at - since))
    })
}

/// The `(seq, event_id)` rows of the cluster's log, in seq order.
pub(super) fn log_rows(server: &PgServer) -> Vec<(u64, String)> {
    let out = server.psql("SELECT seq, event_id FROM dws_event ORDER BY seq");
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (seq, id) = l.split_once('|').unwrap_or_else(|| panic!("{l:?}"));
            (
                seq.parse().unwrap_or_else(|e| panic!("{l:?}: {e}")),
                id.to_owned(),
            )
        })
        .collect()
}

/// The cluster's log holds exactly `survivor`'s events, gapless from its
/// first seq.
pub(super) fn assert_log_is(server: &PgServer, survivor: &[(u64, String)]) {
    let rows = log_rows(server);
    let local: Vec<_> = rows
        .iter()
        .filter(|(s, _)| survivor.first().is_some_and(|f| *s >= f.0))
        .cloned()
        .collect();
    assert_eq!(local, survivor, "the log holds what the survivor delivered");
    assert!(
        rows.windows(2).all(|w| w[1].0 == w[0].0 + 1),
        "the log has gaps: {rows:?}"
    );
}

/// The end of a takeover test: once the fake saw all `ids` acked, one more
/// event `last` goes through the new owner; the survivor's consumer has
/// every event once, in order; what the old owner's consumer printed
/// (`old_stdout`) is a consistent prefix of it; the log is exactly that.
/// Returns the survivor's `(seq, id)`s.
pub(super) fn assert_survivor_has_everything(
    server: &PgServer,
    fake: &FakeDingTalk,
    survivor: &mut Child,
    ids: &[String],
    last: &str,
    old_stdout: &[&str],
    old_who: &str,
) -> Vec<(u64, String)> {
    fake.wait_until("every event acked", T, |s| {
        s.outbox.len() == ids.len() && s.unacked() == 0
    });
    let mid = fake.push_event(&ev(last));
    fake.wait_ack(&mid, T);
    let mut want = ids.to_vec();
    want.push(last.into());
    let got = lines_until(survivor, last);
    assert_once_in_order(&got, &want, "the survivor's consumer");
    let old: Vec<String> = old_stdout.iter().map(|l| l.to_string()).collect();
    let dead = seqs_and_ids(&old);
    assert!(!dead.is_empty(), "the first owner's consumer got events");
    assert_prefix_consistent(&dead, &got, old_who);
    assert_log_is(server, &got);
    got
}
