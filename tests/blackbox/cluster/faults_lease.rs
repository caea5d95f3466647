//! The cluster's promise under the faults of the upstream lease and of the
//! database (issue 18, rows 5–8): an owner frozen (`SIGSTOP`) loses its
//! time-bounded lease and a follower takes over; a server configured with
//! `synchronous_commit=off` and stopped `-m immediate` mid-flood loses no
//! answered publish and reuses no seq; a follower's publishes without `--id`
//! across a PostgreSQL restart are appended once, and none said to have
//! failed is appended; an event id kept in the log by a pinned event and
//! published again is a duplicate, not the owner's end.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use dws_tests::{pg::PgServer, wait_pid_gone, Output, Sig, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

use super::{
    upstream::{busd_pid, lines_until, log_rows, signal, T},
    wait_cluster,
};

/// Starts `name` as a host with a consumer of `pattern`; waits for its
/// role (`owner` or `follower`).
fn start_host(
    server: &PgServer,
    name: &str,
    extra: &[(&str, &str)],
    pattern: &str,
    role: &str,
) -> (TestEnv, dws_tests::Child) {
    let env = dws_tests::common::cluster_host_with(server, name, extra);
    let mut c = env.dws(["event", "consume", pattern]).spawn();
    c.wait_ready();
    wait_cluster(&env, &format!("{name} is the {role}"), |c| {
        c["role"] == role && c["epoch"].as_i64() >= Some(1)
    });
    (env, c)
}

/// One publish's outcome: its reply, or the failed run.
enum Outcome {
    Answered(Value),
    Failed(Output),
}

fn publish_outcome(env: &TestEnv, args: &[&str]) -> Outcome {
    let mut all = vec!["event", "publish"];
    all.extend_from_slice(args);
    let out = env.dws(&all).run_with_timeout(Duration::from_secs(150));
    if out.code == Some(0) {
        Outcome::Answered(out.publish_json())
    } else {
        Outcome::Failed(out)
    }
}

/// The owner's busd frozen (`SIGSTOP`) for longer than its lease: a follower
/// takes the lease over (epoch 2) within the bound plus about 2 s, and a
/// publish made on the follower meanwhile is answered and appended once.
/// After `SIGCONT` the old owner finds itself fenced and its bus stops; it
/// appends nothing.
#[test]
fn a_frozen_owner_loses_its_lease_and_a_follower_takes_over() {
    let server = PgServer::start();
    let lease = [("DWS_CLUSTER_LEASE", "3s")];
    let (a, ca) = start_host(&server, "host-a", &lease, "fz.*", "owner");
    let (b, mut cb) = start_host(&server, "host-b", &lease, "fz.*", "follower");
    b.publish("fz.x", "{}", &["--id", "before"]);
    lines_until(&mut cb, "before");

    let pid_a = busd_pid(&a);
    signal(pid_a, Sig::SIGSTOP);
    let frozen_at = Instant::now();
    let during = publish_outcome(&b, &["fz.x", "{}", "--id", "while-frozen"]);
    let reply = match during {
        Outcome::Answered(v) => v,
        Outcome::Failed(out) => {
            signal(pid_a, Sig::SIGCONT);
            panic!(
                "a follower's publish while the owner is frozen failed\n{out}\n{}",
                b.bus_log_tail()
            )
        }
    };
    assert_eq!(reply["duplicate"], false, "{reply}");
    let c = wait_cluster(&b, "host-b owns the cluster under epoch 2", |c| {
        c["role"] == "owner" && c["epoch"] == 2
    });
    eprintln!(
        "cluster lease: owner frozen; host-b owned the upstream (epoch {}) and answered a \
         publish {:?} after the freeze (lease 3 s)",
        c["epoch"],
        frozen_at.elapsed()
    );
    let got = lines_until(&mut cb, "while-frozen");
    assert_eq!(
        got.last().map(|(s, _)| *s),
        reply["seq"].as_u64(),
        "{got:?}"
    );

    // The old owner wakes up fenced: its bus stops, saying why.
    signal(pid_a, Sig::SIGCONT);
    let out_a = ca.wait_exit(T);
    let err = out_a.assert_error(1);
    assert!(err.contains("lease"), "{out_a}");
    assert!(
        wait_pid_gone(pid_a, EXIT_TIMEOUT),
        "the fenced busd {pid_a} still runs\n{}",
        a.bus_log_tail()
    );
    let after = b.publish("fz.x", "{}", &["--id", "after"]);
    let rows = log_rows(&server);
    let ids: Vec<&str> = rows.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids, ["before", "while-frozen", "after"], "{rows:?}");
    assert_eq!(rows[2].0, after["seq"].as_u64().unwrap_or_default());
}

/// The owner frozen for less than its (long) lease but longer than a
/// forwarded publish waits: the follower's publish is said to fail, and it
/// is withdrawn, so the owner does not append it once it wakes up; it goes
/// on as the owner.
#[test]
fn a_forwarded_publish_said_to_fail_is_never_appended_later() {
    let server = PgServer::start();
    let lease = [("DWS_CLUSTER_LEASE", "120s")];
    let (a, _ca) = start_host(&server, "host-a", &lease, "wd.*", "owner");
    let (b, mut cb) = start_host(&server, "host-b", &lease, "wd.*", "follower");
    let pid_a = busd_pid(&a);
    signal(pid_a, Sig::SIGSTOP);
    let during = publish_outcome(&b, &["wd.x", "{}", "--id", "given-up"]);
    signal(pid_a, Sig::SIGCONT);
    let Outcome::Failed(out) = during else {
        panic!("a publish no owner could take was answered");
    };
    let after = b.publish("wd.x", "{}", &["--id", "after"]);
    assert_eq!(after["duplicate"], false, "{after}");
    let got = lines_until(&mut cb, "after");
    let ids: Vec<&str> = got.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(
        ids,
        ["after"],
        "said to fail ({}), yet delivered",
        out.stderr.trim()
    );
    let rows = log_rows(&server);
    assert!(rows.iter().all(|(_, id)| id != "given-up"), "{rows:?}");
    assert!(out.stderr.contains("withdrawn"), "{out}");
    wait_cluster(&a, "host-a still owns the cluster", |c| {
        c["role"] == "owner" && c["epoch"] == 1
    });
}

/// Publishes `prefix-N` (with `--id` when `with_id`) from `threads` threads
/// on `env` until `stop`; returns `(N, outcome)` of every publish.
fn flood(
    env: &TestEnv,
    prefix: &str,
    with_id: bool,
    threads: usize,
    stop: &AtomicBool,
    into: &Mutex<Vec<(String, Outcome)>>,
) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Acquire) {
                    let name = format!("{prefix}-{t}-{i}");
                    let data = format!("{{\"n\":\"{name}\"}}");
                    let mut args = vec!["fl.x", data.as_str()];
                    if with_id {
                        args.extend(["--id", name.as_str()]);
                    }
                    let got = publish_outcome(env, &args);
                    into.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((name, got));
                    i += 1;
                }
            });
        }
    });
}

fn answered(all: &Mutex<Vec<(String, Outcome)>>) -> usize {
    all.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Answered(_)))
        .count()
}

/// Waits until `n` publishes of `all` were answered.
fn wait_answered(all: &Mutex<Vec<(String, Outcome)>>, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while answered(all) < n {
        assert!(Instant::now() < deadline, "{what}: fewer than {n} answered");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server configured with `synchronous_commit=off` (and a lazy WAL
/// writer) is stopped `-m immediate` in the middle of a flood of publishes
/// on the owner and on a follower, then started again: every publish that
/// was answered is in the log exactly once, under the seq its reply named,
/// and no seq names two events.
#[test]
fn a_server_with_synchronous_commit_off_crashing_mid_flood_loses_no_answered_publish() {
    let mut server =
        PgServer::start_with_settings(&["synchronous_commit=off", "wal_writer_delay=10000ms"]);
    let (a, _ca) = start_host(&server, "host-a", &[], "fl.*", "owner");
    let (b, _cb) = start_host(&server, "host-b", &[], "fl.*", "follower");
    let stop = AtomicBool::new(false);
    let all = Mutex::new(vec![]);
    std::thread::scope(|s| {
        s.spawn(|| flood(&a, "own", true, 3, &stop, &all));
        s.spawn(|| flood(&b, "fol", true, 1, &stop, &all));
        wait_answered(&all, 60, "before the crash");
        server.stop_immediate();
        std::thread::sleep(Duration::from_secs(1));
        server.start_again();
        let n = answered(&all);
        // Some more once the server is back (bounded: the wait panics).
        let deadline = Instant::now() + Duration::from_secs(90);
        while answered(&all) < n + 30 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Release);
    });
    let all = all.into_inner().unwrap_or_else(|p| p.into_inner());
    let rows = log_rows(&server);
    let mut by_id: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (seq, id) in &rows {
        by_id.entry(id.as_str()).or_default().push(*seq);
    }
    let mut lost = vec![];
    for (name, o) in &all {
        if let Outcome::Answered(reply) = o {
            let seq = reply["seq"].as_u64().unwrap_or_else(|| panic!("{reply}"));
            match by_id.get(name.as_str()) {
                Some(seqs) if seqs == &[seq] => {}
                found => lost.push(format!("{name} answered seq {seq}, the log has {found:?}")),
            }
        }
    }
    let n_answered = all
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Answered(_)))
        .count();
    assert!(
        lost.is_empty(),
        "{} of {n_answered} answered publishes are not in the log as answered:\n{}\n{}",
        lost.len(),
        lost.join("\n"),
        a.bus_log_tail()
    );
}

/// `(seq, name)` of every `fl.x` event in the log, the name read from the
/// event's data (`{"n":"NAME"}`), which the log keeps encoded.
fn logged_names(server: &PgServer) -> Vec<(u64, String)> {
    let out = server.psql(
        "SELECT seq, substring(encode(encoded, 'escape') from '\"n\":\"([a-z0-9-]+)\"') \
         FROM dws_event WHERE event_type = 'fl.x' ORDER BY seq",
    );
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (seq, name) = l.split_once('|').unwrap_or_else(|| panic!("{l:?}"));
            (
                seq.parse().unwrap_or_else(|e| panic!("{l:?}: {e}")),
                name.to_owned(),
            )
        })
        .collect()
}

/// What a publish whose outcome is unknown says (see `cluster::forward`).
const OUTCOME_UNKNOWN: &str = "outcome is unknown";

/// Publishes without `--id` on a follower while PostgreSQL restarts
/// (`pg_ctl restart -m fast`): none is appended twice, every answered one is
/// in the log under its seq, and none the publisher was told failed is in
/// the log (unless it was told the outcome is unknown).
#[test]
fn a_followers_publishes_without_id_across_a_postgres_restart_are_appended_once() {
    let mut server = PgServer::start();
    let (_a, _ca) = start_host(&server, "host-a", &[], "fl.*", "owner");
    let (b, _cb) = start_host(&server, "host-b", &[], "fl.*", "follower");
    let stop = AtomicBool::new(false);
    let all = Mutex::new(vec![]);
    std::thread::scope(|s| {
        s.spawn(|| flood(&b, "nid", false, 3, &stop, &all));
        wait_answered(&all, 40, "before the restart");
        server.stop();
        server.start_again();
        let n = answered(&all);
        let deadline = Instant::now() + Duration::from_secs(90);
        while answered(&all) < n + 40 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Release);
    });
    let all = all.into_inner().unwrap_or_else(|p| p.into_inner());
    let rows = logged_names(&server);
    let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (seq, name) in &rows {
        by_name.entry(name.as_str()).or_default().push(*seq);
    }
    let mut wrong = vec![];
    for (name, seqs) in &by_name {
        if seqs.len() > 1 {
            wrong.push(format!(
                "{name} appended {} times: seqs {seqs:?}",
                seqs.len()
            ));
        }
    }
    let mut failed = 0;
    for (name, o) in &all {
        let logged = by_name.get(name.as_str());
        match o {
            Outcome::Answered(reply) => {
                let seq = reply["seq"].as_u64();
                if logged.and_then(|s| s.first().copied()) != seq {
                    wrong.push(format!("{name} answered {reply}, the log has {logged:?}"));
                }
            }
            Outcome::Failed(out) => {
                failed += 1;
                if logged.is_some() && !out.stderr.contains(OUTCOME_UNKNOWN) {
                    wrong.push(format!(
                        "{name} was said to fail, yet is in the log at {logged:?}: {}",
                        out.stderr.trim()
                    ));
                }
            }
        }
    }
    eprintln!(
        "{} publishes, {failed} failed, {} events in the log",
        all.len(),
        rows.len()
    );
    assert!(
        wrong.is_empty(),
        "{}\n{}",
        wrong.join("\n"),
        b.bus_log_tail()
    );
}

/// An event pinned in flight (a consumer holds it unacked) stays in the
/// cluster's log past retention and past the owner's dedup window; its id
/// published again is answered as a duplicate with the original's seq, and
/// the owner goes on (a next publish is answered).
#[test]
fn a_pinned_event_id_published_again_is_a_duplicate_and_the_owner_goes_on() {
    let server = PgServer::start();
    let a = dws_tests::common::cluster_host_with(
        &server,
        "host-a",
        &[("DWS_EVENT_BUS_RETENTION_EVENTS", "3")],
    );
    let mut bus = a.busd(["--foreground", "--dedup-capacity", "1"]).spawn();
    a.wait_until(T, "the bus's socket", || a.expected_socket_path().exists());
    wait_cluster(&a, "host-a owns the cluster", |c| c["role"] == "owner");
    a.subscribe(&["pn.*", "--id", "pin"]);
    let mut c = a
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "pin",
            "--ack",
            "explicit",
        ])
        .stdin_hold()
        .spawn();
    c.wait_ready();
    let first = a.publish("pn.x", "{}", &["--id", "pinned"]);
    lines_until(&mut c, "pinned");
    for i in 0..8 {
        a.publish("pn.x", "{}", &["--id", &format!("later-{i}")]);
    }
    lines_until(&mut c, "later-7");

    let again = publish_outcome(&a, &["pn.x", "{}", "--id", "pinned"]);
    let again = match again {
        Outcome::Answered(v) => v,
        Outcome::Failed(out) => panic!(
            "publishing a pinned id again failed\n{out}\n{}",
            a.bus_log_tail()
        ),
    };
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["seq"], first["seq"], "{again}");
    let next = a.publish("pn.x", "{}", &["--id", "next"]);
    assert_eq!(next["duplicate"], false, "{next}");
    assert!(bus.is_running(), "the owner's bus runs\n{}", bus.report());
    let rows = log_rows(&server);
    assert_eq!(
        rows.iter().filter(|(_, id)| id == "pinned").count(),
        1,
        "{rows:?}"
    );
}
