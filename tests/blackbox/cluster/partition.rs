//! Partitions that TCP cannot see (issue 35): a [`Proxy`] between a host and
//! PostgreSQL takes every byte and delivers none, closing nothing, so the
//! host's sockets, keepalives included, look healthy. Every answer must
//! still come within its documented bound (docs/cluster.md, "Faults"): a
//! black-holed owner answers its publishes (failed or outcome unknown, never
//! "failed" for what is appended) within the outage bound and a follower
//! takes over within the lease bound plus about 2 s; a black-holed follower
//! answers its forwarded publishes within 30 s plus a statement's bound,
//! tells its consumers that events stopped arriving, and after the heal they
//! get everything, in order, without a hole; an owner cut off stops acking
//! the upstream within its lease.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use dws_tests::{
    common::cluster_host_with,
    fake_dingtalk::{FakeDingTalk, FAST_BACKOFF},
    pg::PgServer,
    proxy::Proxy,
    Child, Output, TestEnv,
};

use super::{
    upstream::{ev, lines_until, log_rows, start_bus, wait_new_connection, T},
    wait_cluster,
};

/// The lease of these tests.
const LEASE: Duration = Duration::from_secs(4);
/// A forwarded publish fails after 30 s without an owner; a statement in
/// flight then may take its bound (5 s) more.
const FORWARD_BOUND: Duration = Duration::from_secs(35);
/// An owner's append waits at most 60 s, then one statement's bound to
/// tell whether it committed.
const OWNER_BOUND: Duration = Duration::from_secs(65);
/// What the tests allow on top of a bound for a loaded machine.
const MARGIN: Duration = Duration::from_secs(15);

/// [`wait_cluster`] with room for a takeover on a loaded machine.
fn wait_cluster_long(
    env: &TestEnv,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + LEASE + MARGIN + MARGIN;
    loop {
        let c = env.status()["cluster"].clone();
        if cond(&c) {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {c:#}\n{}",
            env.bus_log_tail()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// A host whose database traffic goes through its own proxy.
fn host_behind(server: &PgServer, proxy: &Proxy, name: &str) -> TestEnv {
    let url = proxy.url(&server.url());
    TestEnv::with_env(&[
        ("DWS_EVENT_BUS_STORE", "postgres"),
        ("DWS_POSTGRES_URL", url.as_str()),
        ("DWS_CLUSTER_HOST", name),
        ("DWS_EVENT_BUS_IDLE_TIMEOUT", "10m"),
        ("DWS_CLUSTER_LEASE", "4s"),
    ])
}

fn consumer(env: &TestEnv, name: &str, role: &str, pattern: &str) -> Child {
    let mut c = env.dws(["event", "consume", pattern]).spawn();
    c.wait_ready();
    wait_cluster(env, &format!("{name} is the {role}"), |c| {
        c["role"] == role && c["epoch"].as_i64() >= Some(1)
    });
    c
}

/// Runs `dws event publish` and says how long its answer took.
fn timed_publish(env: &TestEnv, id: &str, limit: Duration) -> (Output, Duration) {
    let t = Instant::now();
    let out = env
        .dws(["event", "publish", "pt.x", "{}", "--id", id])
        .run_with_timeout(limit);
    (out, t.elapsed())
}

/// A failed answer must not be one for an event that is in the log; an
/// answer that says its outcome is unknown may be either.
fn assert_failed_only_if_absent(server: &PgServer, out: &Output, id: &str) {
    assert_ne!(out.code, Some(0), "{out}");
    let in_log = log_rows(server).iter().any(|(_, i)| i == id);
    if in_log {
        assert!(
            out.stderr.contains("its outcome is unknown"),
            "{id} was told it failed, yet it is in the log\n{out}"
        );
    }
}

/// The owner's path to PostgreSQL swallows everything: the follower takes
/// the upstream once the lease ran out (measured and printed with the
/// outage its publishers saw), the owner's publish made in the partition is
/// answered within the outage bound, not at the heal, and the owner says
/// in its log what is going on. After the heal nothing answered is missing.
#[test]
fn a_black_holed_owner_is_replaced_within_the_lease_bound_and_answers_within_the_outage_bound() {
    let server = PgServer::start();
    let (pa, pb) = (Proxy::start(server.port()), Proxy::start(server.port()));
    let a = host_behind(&server, &pa, "host-a");
    let _ca = consumer(&a, "host-a", "owner", "pt.*");
    let b = host_behind(&server, &pb, "host-b");
    let mut cb = consumer(&b, "host-b", "follower", "pt.*");
    b.publish("pt.x", "{}", &["--id", "before"]);
    lines_until(&mut cb, "before");

    // A publisher on the follower, one publish after another: the longest
    // wait between two answered publishes is the outage a client sees.
    let stop = AtomicBool::new(false);
    let answered: Mutex<Vec<(Instant, String)>> = Mutex::default();
    let cut = Instant::now() + Duration::from_secs(2);
    let (c, failover, out_a, took_a) = thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("b-{n}");
                n += 1;
                let (out, _) = timed_publish(&b, &id, Duration::from_secs(120));
                if out.code == Some(0) {
                    answered
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), id));
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        thread::sleep(cut.saturating_duration_since(Instant::now()));
        pa.black_hole();
        let on_a = s.spawn(|| timed_publish(&a, "on-a", OWNER_BOUND + MARGIN + MARGIN));
        let c = wait_cluster_long(&b, "host-b owns the cluster", |c| c["role"] == "owner");
        let failover = cut.elapsed();
        // The owner tells its log within its lease's heartbeat bound.
        a.wait_until(Duration::from_secs(15), "host-a logs the partition", || {
            a.bus_log_tail().contains("did not answer")
        });
        let (out_a, took_a) = on_a.join().expect("the publish on host-a");
        assert!(
            cut.elapsed() < OWNER_BOUND + MARGIN + MARGIN,
            "the partition outlasted the bound under test"
        );
        pa.heal();
        stop.store(true, Ordering::SeqCst);
        (c, failover, out_a, took_a)
    });
    assert!(
        took_a <= OWNER_BOUND + MARGIN,
        "the owner's publish was answered only after {took_a:?}\n{out_a}"
    );
    let answered = answered.into_inner().unwrap_or_else(|p| p.into_inner());
    let outage = answered
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or_default();
    eprintln!(
        "partition: owner black-holed; host-b took the upstream (epoch {}) {:.1} s after the \
         cut (lease {} s); the longest wait between two answered publishes on host-b: {:.1} s; \
         the owner's publish was answered after {:.1} s ({})",
        c["epoch"],
        failover.as_secs_f64(),
        LEASE.as_secs(),
        outage.as_secs_f64(),
        took_a.as_secs_f64(),
        out_a.stderr.lines().next().unwrap_or("")
    );
    assert!(
        failover <= LEASE + Duration::from_secs(2) + MARGIN,
        "failover took {failover:?}"
    );
    assert_failed_only_if_absent(&server, &out_a, "on-a");
    let last = &answered.last().expect("host-b answered publishes").1;
    let got = lines_until(&mut cb, last);
    let rows = log_rows(&server);
    for (_, id) in &answered {
        let seq = rows.iter().find(|(_, i)| i == id).map(|(s, _)| *s);
        assert!(seq.is_some(), "{id} was answered but is not in the log");
        assert!(
            got.iter().any(|(s, i)| i == id && Some(*s) == seq),
            "host-b's consumer missed {id}"
        );
    }
}

/// The follower's path swallows everything while the owner goes on: the
/// follower's publish is answered within the forward bound, its consumer is
/// told that events stopped arriving, and after the heal it gets every event
/// the owner appended meanwhile, in order, and is told the source is back.
#[test]
fn a_black_holed_follower_answers_in_time_tells_its_consumer_and_resumes_without_a_hole() {
    let server = PgServer::start();
    let (pa, pb) = (Proxy::start(server.port()), Proxy::start(server.port()));
    let a = host_behind(&server, &pa, "host-a");
    let _ca = consumer(&a, "host-a", "owner", "pt.*");
    let b = host_behind(&server, &pb, "host-b");
    let mut cb = consumer(&b, "host-b", "follower", "pt.*");
    a.publish("pt.x", "{}", &["--id", "before"]);
    lines_until(&mut cb, "before");

    pb.black_hole();
    let cut = Instant::now();
    let (told, told_after, during, out_b, took_b) = thread::scope(|s| {
        let on_b = s.spawn(|| timed_publish(&b, "on-b", FORWARD_BOUND + MARGIN + MARGIN));
        let told = cb.wait_stderr_line(
            "the consumer is told its events stopped arriving",
            Duration::from_secs(6) + MARGIN,
            |l| l.starts_with("[event] source reconnecting"),
        );
        let told_after = cut.elapsed();
        let mut during = vec![];
        for n in 0..5 {
            let id = format!("during-{n}");
            a.publish("pt.x", "{}", &["--id", &id]);
            during.push(id);
        }
        let (out_b, took_b) = on_b.join().expect("the publish on host-b");
        (told, told_after, during, out_b, took_b)
    });
    eprintln!(
        "partition: follower black-holed; its consumer was told after {:.1} s ({told}); its \
         publish was answered after {:.1} s: {}",
        told_after.as_secs_f64(),
        took_b.as_secs_f64(),
        out_b.stderr.lines().next().unwrap_or("")
    );
    assert!(
        took_b <= FORWARD_BOUND + MARGIN,
        "the follower's publish was answered only after {took_b:?}\n{out_b}"
    );
    pb.heal();
    cb.wait_stderr_line(
        "the consumer is told the source is back",
        Duration::from_secs(30),
        |l| l.starts_with("[event] source connected"),
    );
    a.publish("pt.x", "{}", &["--id", "after"]);
    let got = lines_until(&mut cb, "after");
    let ids: Vec<&str> = got.iter().map(|(_, i)| i.as_str()).collect();
    let mut want = vec!["before"];
    want.extend(during.iter().map(String::as_str));
    want.push("after");
    let rows = log_rows(&server);
    let on_b_in_log = rows.iter().find(|(_, i)| i == "on-b").map(|(s, _)| *s);
    let kept: Vec<&str> = ids.iter().copied().filter(|i| *i != "on-b").collect();
    assert_eq!(kept, want, "{got:?}");
    let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    if let Some(seq) = on_b_in_log {
        assert!(
            got.iter().any(|(s, i)| i == "on-b" && *s == seq),
            "on-b is in the log at {seq} but the consumer missed it: {got:?}"
        );
    }
    assert_failed_only_if_absent(&server, &out_b, "on-b");
}

/// The owner cut off from PostgreSQL stops acking the upstream within its
/// lease: it closes its upstream connection once its renewals go
/// unanswered (before the lease can have run out for the others), acks
/// nothing on it after the cut, and the follower opens the next connection
/// within the lease plus about 2 s and acks what comes.
#[test]
fn a_black_holed_owner_stops_acking_the_upstream_within_its_lease() {
    let server = PgServer::start();
    let fake = FakeDingTalk::start();
    let pa = Proxy::start(server.port());
    let url_a = pa.url(&server.url());
    let lease = ("DWS_CLUSTER_LEASE", "4s");
    let mut vars_a = FAST_BACKOFF.to_vec();
    vars_a.extend([lease, ("DWS_POSTGRES_URL", url_a.as_str())]);
    let a = cluster_host_with(&server, "host-a", &vars_a);
    let mut vars_b = FAST_BACKOFF.to_vec();
    vars_b.push(lease);
    let b = cluster_host_with(&server, "host-b", &vars_b);
    for env in [&a, &b] {
        env.write_default_profile(&fake.app_profile("max_attempts = 0\n"));
    }
    start_bus(&a);
    wait_cluster(&a, "host-a owns the upstream", |c| c["role"] == "owner");
    start_bus(&b);
    wait_cluster(&b, "host-b follows", |c| c["role"] == "follower");
    let old = fake.wait_connected(T);
    let mid = fake.push_event(&ev("up-before"));
    fake.wait_ack(&mid, T);

    let cut = Instant::now();
    pa.black_hole();
    let closed = fake.wait(
        "the owner closes its upstream connection",
        LEASE + MARGIN,
        |s| {
            s.conns
                .iter()
                .find(|c| c.id == old)
                .and_then(|c| c.closed_at)
                .map(|at| at.saturating_duration_since(cut))
        },
    );
    let (new, takeover) = wait_new_connection(&fake, cut);
    let mid = fake.push_event(&ev("up-after"));
    let ack = fake.wait_ack(&mid, T);
    pa.heal();
    eprintln!(
        "partition: owner black-holed; it closed its upstream connection {:.1} s after the cut, \
         host-b opened the next {:.1} s after it (lease {} s)",
        closed.as_secs_f64(),
        takeover.as_secs_f64(),
        LEASE.as_secs()
    );
    assert!(
        closed < LEASE,
        "the cut-off owner kept its upstream for {closed:?}"
    );
    assert!(
        takeover <= LEASE + Duration::from_secs(2) + MARGIN,
        "the takeover took {takeover:?}"
    );
    assert_eq!(ack.conn, new, "acked on the new owner's connection");
    fake.with_state(|s| {
        let late: Vec<_> = s
            .acks
            .iter()
            .filter(|a| a.conn == old && a.at >= cut)
            .map(|a| a.message_id.clone())
            .collect();
        assert!(
            late.is_empty(),
            "the cut-off owner acked {late:?} after the cut"
        );
    });
}
