//! A follower under the owner's retention, and definitions cluster-wide:
//! a follower frozen while retention took what it had not read yet reports
//! the loss as a gap; a follower killed with `-9` finds its unacked and
//! parked events again after a restart (the owner's retention keeps what any
//! host's named subscription still needs); a follower saves its cursor and
//! delivery counts as its consumer acks; and two hosts defining one
//! subscription with different keys at once get one winner.
//!
//! The owner is a `busd --foreground` started first with a small dedup
//! window (`--dedup-capacity 50`), so that with a retention of 50 events it
//! really deletes old rows from the shared log.

use std::{
    sync::Barrier,
    time::{Duration, Instant},
};

use dws_tests::{
    common::{cluster_host, publish_parallel, sub, subscribe_ok},
    pg::PgServer,
    wait_pid_gone, Child, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::Value;

use super::{
    fencing::freeze_between_transactions,
    upstream::{busd_pid, signal},
    wait_cluster, CLUSTER_WAIT,
};

/// Bound of the waits for events, saves and deletions.
const T: Duration = Duration::from_secs(60);
/// The retention of every host here, in events.
const RETENTION: &str = "50";

/// A host of the cluster with a retention of [`RETENTION`] events.
fn host(server: &PgServer, name: &str) -> TestEnv {
    TestEnv::with_env(&[
        ("DWS_EVENT_BUS_STORE", "postgres"),
        ("DWS_POSTGRES_URL", server.url().as_str()),
        ("DWS_CLUSTER_HOST", name),
        ("DWS_EVENT_BUS_IDLE_TIMEOUT", "10m"),
        ("DWS_EVENT_BUS_RETENTION_EVENTS", RETENTION),
    ])
}

/// Host `host-a`, started first so that it owns the cluster; its dedup
/// window is the retention, so its retention deletes from the shared log.
fn owner(server: &PgServer) -> (TestEnv, Child) {
    let a = host(server, "host-a");
    let bus = a
        .busd(["--foreground", "--dedup-capacity", RETENTION])
        .spawn();
    let socket = a.expected_socket_path();
    a.wait_until(T, "host a's busd to create its socket", || socket.exists());
    wait_cluster(&a, "host a owns the cluster", |c| c["role"] == "owner");
    (a, bus)
}

fn scalar(server: &PgServer, sql: &str) -> String {
    server.psql(sql).trim().to_owned()
}

/// Waits until `sql` (one value) satisfies `cond`; returns the value.
/// `env`'s bus log is shown on a timeout.
fn wait_sql(
    server: &PgServer,
    env: &TestEnv,
    what: &str,
    sql: &str,
    cond: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + T;
    loop {
        let v = scalar(server, sql);
        if cond(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: `{sql}` gives {v:?}\n{}",
            env.bus_log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// Publishes `n` events `fl.x` from `env` with ids `{prefix}-{i}`;
/// returns the seq of the last.
fn publish_n(env: &TestEnv, prefix: &str, n: usize) -> u64 {
    let items: Vec<(String, String)> = (1..=n)
        .map(|i| (format!("{prefix}-{i}"), format!("{{\"i\":{i}}}")))
        .collect();
    publish_parallel(env, "fl.x", &items, 4)
        .iter()
        .filter_map(|r| r["seq"].as_u64())
        .max()
        .unwrap_or_else(|| panic!("no publish answered with a seq"))
}

/// The owner has saved (and then released the log below what it keeps)
/// after `seq`, twice over: a marker event is published and saved too.
fn wait_owner_retention(server: &PgServer, a: &TestEnv, seq: u64) -> u64 {
    let snap = "SELECT coalesce((snapshot->>'head_seq')::bigint, 0) FROM dws_host_snapshot \
                WHERE host = 'host-a'";
    wait_sql(server, a, "the owner's save", snap, |v| {
        v.parse::<u64>().is_ok_and(|h| h >= seq)
    });
    let marker = a.publish("fl.x", "{\"marker\":true}", &["--id", "marker"])["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("the marker has no seq"));
    wait_sql(server, a, "the owner's save of the marker", snap, |v| {
        v.parse::<u64>().is_ok_and(|h| h >= marker)
    });
    marker
}

fn is_gap(line: &str) -> bool {
    line.starts_with("[event] gap")
}

/// The `[event] gap` lines of `lines`: `(lost, before_seq)`.
fn gaps(lines: &[String]) -> Vec<(u64, u64)> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l.strip_prefix("[event] gap \u{2014} lost ")?;
            let (lost, rest) = rest.split_once(" event(s) before seq ")?;
            let before = rest.split_whitespace().next()?;
            Some((lost.parse().ok()?, before.parse().ok()?))
        })
        .collect()
}

fn kill_9(env: &TestEnv) {
    let pid = busd_pid(env);
    signal(pid, Sig::SIGKILL);
    assert!(wait_pid_gone(pid, EXIT_TIMEOUT), "busd {pid} survived -9");
}

/// Row 4a: a follower frozen while the owner takes 300 events with a
/// retention of 50 finds a hole when it reads on: its consumer gets a gap
/// line that accounts for every event it did not get, never a silent jump.
#[test]
fn a_frozen_follower_reports_what_retention_took_while_it_was_frozen() {
    let server = PgServer::start();
    let (a, _bus_a) = owner(&server);
    let b = host(&server, "host-b");
    let mut cb = b.dws(["event", "consume", "fl.*"]).spawn();
    cb.wait_ready();
    let first = publish_n(&a, "f", 7);
    let before = cb.wait_stdout_lines(7, T);
    assert_eq!(json(&before[6])["seq"].as_u64(), Some(first), "{before:?}");

    let pid = busd_pid(&b);
    freeze_between_transactions(&server, pid, "host-b");
    let last = publish_n(&a, "g", 300);
    wait_sql(
        &server,
        &a,
        "the owner's retention to delete what host b has not read",
        "SELECT coalesce(min(seq), 0) FROM dws_event",
        |v| v.parse::<u64>().is_ok_and(|m| m > first + 1),
    );
    signal(pid, Sig::SIGCONT);

    let lines = cb.wait_stdout_line("the last event", T, |l| {
        json(l)["seq"].as_u64() == Some(last)
    });
    let after: Vec<u64> = lines[7..]
        .iter()
        .map(|l| json(l)["seq"].as_u64().unwrap_or_default())
        .collect();
    assert!(after.windows(2).all(|w| w[0] < w[1]), "in order: {after:?}");
    // stderr is read apart from stdout: the gap line may come in later.
    cb.try_wait_stderr_line(T, is_gap);
    let gaps = gaps(&cb.stderr_so_far());
    let lost: u64 = gaps.iter().map(|g| g.0).sum();
    assert!(
        !gaps.is_empty() && after.len() as u64 + lost == last - first,
        "every one of the {} events after seq {first} is delivered or counted in a gap: \
         {} delivered (from seq {:?}), gaps {gaps:?}\n{}",
        last - first,
        after.len(),
        after.first(),
        cb.report()
    );
    assert_eq!(
        gaps[0].1, after[0],
        "the gap comes before the first event after it: {gaps:?}"
    );
}

/// A named subscription `fs` on host b with a consumer acking explicitly.
fn explicit(env: &TestEnv, id: &str) -> Child {
    let mut c = dws_tests::common::queue_worker(env, id, &[]).spawn();
    c.wait_ready();
    c
}

/// Row 4b: a follower killed with `-9` while its consumer left one event
/// unacked; the owner takes 300 more with a retention of 50; after the
/// restart the unacked event is delivered again or reported lost (a gap
/// line and `lost_to_retention`), never silently skipped.
#[test]
fn a_followers_unacked_event_survives_its_kill_and_the_owners_retention() {
    let server = PgServer::start();
    let (a, _bus_a) = owner(&server);
    let b = host(&server, "host-b");
    subscribe_ok(&b, &["fl.*", "--id", "fs"], "fs");
    let mut c = explicit(&b, "fs");
    let last = publish_n(&a, "u", 4);
    let lines = c.wait_stdout_lines(4, T);
    let seqs: Vec<u64> = lines
        .iter()
        .map(|l| json(l)["seq"].as_u64().unwrap_or_default())
        .collect();
    let unacked = last;
    for s in seqs.iter().filter(|&&s| s != unacked) {
        c.write_stdin(format!("ack {s}\n").as_bytes());
    }
    b.wait_status(T, "one event unacked", |st| {
        sub(st, "fs").is_some_and(|s| s["pending"] == 1)
    });
    kill_9(&b);
    drop(c);

    let end = publish_n(&a, "v", 300);
    let marker = wait_owner_retention(&server, &a, end);

    let mut c = explicit(&b, "fs");
    let lines = c.wait_stdout_line("the marker", T, |l| json(l)["seq"].as_u64() == Some(marker));
    let again = lines
        .iter()
        .any(|l| json(l)["seq"].as_u64() == Some(unacked));
    if !again {
        c.try_wait_stderr_line(T, is_gap);
    }
    let gaps = gaps(&c.stderr_so_far());
    let covered = gaps
        .iter()
        .any(|&(lost, before)| lost > 0 && before > unacked);
    let st = b.status();
    let fs = sub(&st, "fs")
        .unwrap_or_else(|| panic!("fs is gone: {st:#}"))
        .clone();
    assert!(
        again || (covered && fs["lost_to_retention"].as_u64() > Some(0)),
        "the unacked seq {unacked} is neither delivered again nor reported lost: gaps {gaps:?}, \
         subscription {fs:#}\n{}",
        c.report()
    );
}

/// The hold has a hard cap (10 times the retention: 500 events here): a
/// follower away while more than that was appended loses its unacked event
/// to the owner's retention, and reports it when it comes back.
#[test]
fn a_follower_away_past_the_hard_cap_reports_its_unacked_event_lost() {
    let server = PgServer::start();
    let (a, _bus_a) = owner(&server);
    let b = host(&server, "host-b");
    subscribe_ok(&b, &["fl.*", "--id", "fs"], "fs");
    let mut c = explicit(&b, "fs");
    let unacked = publish_n(&a, "u", 1);
    c.wait_stdout_lines(1, T);
    let cursor = "SELECT record->>'cursor' FROM dws_cursor \
                  WHERE host = 'host-b' AND subscription = 'fs'";
    wait_sql(&server, &b, "host b's cursor saved", cursor, |v| {
        v == (unacked - 1).to_string()
    });
    kill_9(&b);
    drop(c);

    let end = publish_n(&a, "w", 600);
    wait_owner_retention(&server, &a, end);
    let first: u64 = scalar(&server, "SELECT min(seq) FROM dws_event")
        .parse()
        .unwrap_or_default();
    assert!(
        first > unacked,
        "the cap let retention delete seq {unacked}"
    );

    let mut c = explicit(&b, "fs");
    c.wait_stdout_lines(1, T);
    // stdout and stderr are read apart: the gap line may show up after
    // the first event line has.
    c.try_wait_stderr_line(T, is_gap);
    let gaps = gaps(&c.stderr_so_far());
    assert!(
        gaps.iter()
            .any(|&(lost, before)| lost > 0 && before > unacked),
        "the lost seq {unacked} is reported: {gaps:?}\n{}",
        c.report()
    );
    let st = b.status();
    assert!(
        sub(&st, "fs").is_some_and(|s| s["lost_to_retention"].as_u64() > Some(0)),
        "{st:#}"
    );
}

/// Row 4c: as row 4b with a parked event: after the restart
/// `subscription parked` still lists it (the owner kept its row).
#[test]
fn a_followers_parked_event_survives_its_kill_and_the_owners_retention() {
    let server = PgServer::start();
    let (a, _bus_a) = owner(&server);
    let b = host(&server, "host-b");
    let park = [
        "fl.*",
        "--id",
        "fs",
        "--max-deliver",
        "1",
        "--on-poison",
        "park",
    ];
    subscribe_ok(&b, &park, "fs");
    let mut c = explicit(&b, "fs");
    let last = publish_n(&a, "p", 4);
    c.wait_stdout_lines(4, T);
    for s in last - 3..last {
        c.write_stdin(format!("ack {s}\n").as_bytes());
    }
    c.write_stdin(format!("nack {last}\n").as_bytes());
    b.wait_status(T, "the event parked", |st| {
        sub(st, "fs").is_some_and(|s| s["parked"] == 1)
    });
    let parked = "SELECT coalesce(jsonb_array_length(record->'parked'), 0) FROM dws_cursor \
                  WHERE host = 'host-b' AND subscription = 'fs'";
    wait_sql(
        &server,
        &b,
        "host b's save of the parked event",
        parked,
        |v| v == "1",
    );
    kill_9(&b);
    drop(c);

    let end = publish_n(&a, "q", 300);
    wait_owner_retention(&server, &a, end);

    // The verbs do not start a bus: subscribing again (same keys) does.
    subscribe_ok(&b, &park, "fs");
    let out = b
        .dws(["event", "subscription", "parked", "fs"])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    assert!(
        out.stdout.contains(&format!("parked seq {last}")),
        "the parked event is still listed\n{out}"
    );
}

/// Row 9: a consumer on a follower acks; the follower saves its cursor and
/// its delivery counts like an owner does, so both survive a `kill -9`.
#[test]
fn a_follower_saves_its_cursor_and_delivery_counts() {
    let server = PgServer::start();
    let a = cluster_host(&server, "host-a");
    a.publish("cu.x", "{}", &[]);
    wait_cluster(&a, "host a owns the cluster", |c| c["role"] == "owner");
    let b = cluster_host(&server, "host-b");
    subscribe_ok(&b, &["cu.*", "--id", "cur", "--max-deliver", "5"], "cur");
    let mut c = explicit(&b, "cur");
    let seqs: Vec<u64> = (1..=3)
        .map(|i| {
            a.publish("cu.x", "{}", &["--id", &format!("c{i}")])["seq"]
                .as_u64()
                .unwrap_or_default()
        })
        .collect();
    c.wait_stdout_lines(3, T);
    for s in &seqs {
        c.write_stdin(format!("ack {s}\n").as_bytes());
    }
    let cursor = "SELECT record->>'cursor' FROM dws_cursor \
                  WHERE host = 'host-b' AND subscription = 'cur'";
    wait_sql(&server, &b, "host b's cursor saved", cursor, |v| {
        v == seqs[2].to_string()
    });
    wait_cluster(&b, "host b's cursor in status", |c| {
        c["cursors"].as_array().is_some_and(|v| {
            v.iter()
                .any(|x| x["host"] == "host-b" && x["cursor"].as_u64() == Some(seqs[2]))
        })
    });

    let poison = a.publish("cu.x", "{}", &["--id", "c4"])["seq"]
        .as_u64()
        .unwrap_or_default();
    c.wait_stdout_lines(4, T);
    c.write_stdin(format!("nack {poison}\n").as_bytes());
    let lines = c.wait_stdout_lines(5, T);
    assert_eq!(json(&lines[4])["delivery"].as_u64(), Some(2), "{lines:?}");
    let counts = "SELECT record->'deliveries'::text FROM dws_cursor \
                  WHERE host = 'host-b' AND subscription = 'cur'";
    wait_sql(&server, &b, "host b's delivery count saved", counts, |v| {
        v.replace(' ', "") == format!("[[{poison},2]]")
    });
    kill_9(&b);
    drop(c);

    let mut c = explicit(&b, "cur");
    let line = json(&c.wait_stdout_lines(1, T)[0]);
    assert_eq!(
        (line["seq"].as_u64(), line["delivery"].as_u64()),
        (Some(poison), Some(3)),
        "after the kill the event comes again with its count: {line}"
    );
}

/// Row 11: two hosts define the same subscription id with different keys
/// at the same instant: one wins (exit 0), the other is refused with exit 2
/// and the reason, and both hosts end up with the winner's keys.
#[test]
fn a_subscription_defined_at_once_on_two_hosts_with_different_keys_has_one_winner() {
    let server = PgServer::start();
    let a = cluster_host(&server, "host-a");
    let b = cluster_host(&server, "host-b");
    a.publish("w.x", "{}", &[]);
    b.publish("w.x", "{}", &[]);
    wait_cluster(&a, "both hosts registered", |c| {
        c["hosts"].as_array().is_some_and(|h| h.len() == 2)
    });
    for round in 0..3 {
        let id = format!("same-{round}");
        let barrier = Barrier::new(2);
        let run = |env: &TestEnv, key: &str| {
            barrier.wait();
            env.dws(["event", "subscribe", key, "--id", &id])
                .run_with_timeout(EXIT_TIMEOUT)
        };
        let (oa, ob) = std::thread::scope(|s| {
            let ha = s.spawn(|| run(&a, "ka.*"));
            let hb = s.spawn(|| run(&b, "kb.*"));
            (ha.join().expect("a"), hb.join().expect("b"))
        });
        let (winner, loser) = match (oa.code, ob.code) {
            (Some(0), Some(2)) => ("ka.*", &ob),
            (Some(2), Some(0)) => ("kb.*", &oa),
            _ => panic!("one wins, the other gets exit 2\n{oa}\n{ob}"),
        };
        let err = loser.assert_error(2);
        assert!(err.contains("exists with event keys"), "{err}");
        for env in [&a, &b] {
            env.wait_status(CLUSTER_WAIT, "the winner's keys on every host", |st| {
                sub(st, &id).is_some_and(|s| s["patterns"] == serde_json::json!([winner]))
            });
        }
    }
}
