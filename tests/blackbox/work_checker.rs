//! A work queue whose four workers fail in every way an agent does, checked
//! over whole runs on several seeds: one healthy, one alive but never
//! acking (hung), one stopped with SIGSTOP at a seeded moment, one killed
//! with `kill -9` at a seeded moment and started again. The checker: every
//! job is acked, by a worker that was alive to do it; a job delivered again
//! is marked redelivered; a job a worker did not ack comes to another
//! within its ack wait plus a second; nothing is left pending.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    sync::{
        atomic::{AtomicBool, AtomicI32, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use dws_tests::{
    common::{listed, queue_worker, subscribe_ok},
    Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(60);
const ACK_WAIT: Duration = Duration::from_secs(2);
/// What the checker allows beyond the rule (the test's own reading).
const SLACK: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Healthy,
    Hung,
    Stopped,
    Killed,
}

const ROLES: [Role; 4] = [Role::Healthy, Role::Hung, Role::Stopped, Role::Killed];

/// A delivery or an ack, as the test saw it.
#[derive(Debug, Clone)]
struct Seen {
    worker: usize,
    seq: u64,
    redelivered: bool,
    /// Which delivery of the job (its `delivery` field).
    delivery: u64,
    at: Instant,
}

#[derive(Default)]
struct Log {
    delivered: Vec<Seen>,
    acked: Vec<Seen>,
}

fn signal_quiet(pid: i32, sig: Sig) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// Runs worker `n` until `stop`: prints go to the log; it acks what it
/// reads unless it is the hung one; it starts again when its run ends
/// (killed).
fn worker(env: &TestEnv, n: usize, log: &Mutex<Log>, pid: &AtomicI32, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let mut c =
            queue_worker(env, "work", &["--ack-wait", "2s", "--quiet"]).spawn_stdout_unread();
        pid.store(c.pid(), Ordering::SeqCst);
        let Some(out) = c.take_stdout() else {
            return;
        };
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            // What the stopped worker reads once let go at the end was
            // delivered long before: not seen in time, not recorded.
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let v: Value = serde_json::from_str(&line).expect("an NDJSON line");
            let seen = Seen {
                worker: n,
                seq: v["seq"].as_u64().expect("a seq"),
                redelivered: v["redelivered"].as_bool().unwrap_or(false),
                delivery: v["delivery"].as_u64().unwrap_or(0),
                at: Instant::now(),
            };
            log.lock()
                .expect("not poisoned")
                .delivered
                .push(seen.clone());
            if ROLES[n] == Role::Hung {
                continue;
            }
            thread::sleep(Duration::from_millis(fastrand::u64(0..5)));
            if c.try_write_stdin(format!("ack {}\n", seen.seq).as_bytes())
                .is_err()
            {
                break;
            }
            log.lock().expect("not poisoned").acked.push(Seen {
                at: Instant::now(),
                ..seen
            });
        }
        signal_quiet(c.pid(), Sig::SIGTERM);
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while c.is_running() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
}

fn run(seed: u64, jobs: usize) {
    eprintln!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let env = TestEnv::new();
    subscribe_ok(
        &env,
        &["job.*", "--id", "work", "--delivery", "shared"],
        "work",
    );
    let log = Mutex::new(Log::default());
    let stop = AtomicBool::new(false);
    let pids: Vec<AtomicI32> = (0..4).map(|_| AtomicI32::new(0)).collect();
    let chunks = 10;
    let per_chunk = jobs / chunks;
    let stop_after = rng.usize(1..chunks - 1);
    let kill_after = rng.usize(1..chunks - 1);
    let mut stopped_at = None;
    let mut published_at = Instant::now();
    thread::scope(|s| {
        for (n, pid) in pids.iter().enumerate() {
            let (env, log, stop) = (&env, &log, &stop);
            s.spawn(move || worker(env, n, log, pid, stop));
        }
        env.wait_status(LONG, "four workers", |st| {
            listed(st, "work")["consumers"] == 4
        });
        for chunk in 0..chunks {
            let input: String = (0..per_chunk)
                .map(|i| format!("{{\"job\":\"{chunk}-{i}\"}}\n"))
                .collect();
            env.dws([
                "event",
                "publish",
                "job.x",
                "--lines",
                "--id-prefix",
                &format!("c{chunk}"),
            ])
            .stdin_bytes(input.into_bytes())
            .run_with_timeout(LONG)
            .assert_code(0);
            if chunk == stop_after {
                signal_quiet(pids[2].load(Ordering::SeqCst), Sig::SIGSTOP);
                stopped_at = Some(Instant::now());
            }
            if chunk == kill_after {
                signal_quiet(pids[3].load(Ordering::SeqCst), Sig::SIGKILL);
            }
            thread::sleep(Duration::from_millis(rng.u64(50..300)));
        }
        published_at = Instant::now();
        let st = env.wait_status(LONG, "every job acked", |st| {
            let w = listed(st, "work");
            w["acked"] == jobs as u64 && w["pending"] == 0
        });
        let took = published_at.elapsed();
        // The last jobs the stopped and hung workers held come to others
        // within an ack wait and a second.
        assert!(
            took <= ACK_WAIT + Duration::from_secs(1) + SLACK * 2,
            "the last job acked {took:?} after the last publish (seed {seed})\n{st:#}"
        );
        stop.store(true, Ordering::SeqCst);
        signal_quiet(pids[2].load(Ordering::SeqCst), Sig::SIGCONT);
        for pid in &pids {
            signal_quiet(pid.load(Ordering::SeqCst), Sig::SIGTERM);
        }
    });
    let log = log.into_inner().expect("not poisoned");
    check(&log, jobs, stopped_at, seed);
}

/// The checker over every delivery and ack of the run.
fn check(log: &Log, jobs: usize, stopped_at: Option<Instant>, seed: u64) {
    let mut by_seq: BTreeMap<u64, Vec<&Seen>> = BTreeMap::new();
    for d in &log.delivered {
        by_seq.entry(d.seq).or_default().push(d);
    }
    assert_eq!(by_seq.len(), jobs, "every job delivered (seed {seed})");
    let mut acks: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for a in &log.acked {
        acks.entry(a.seq).or_default().push(a.worker);
    }
    for (seq, ds) in by_seq.iter_mut() {
        // In delivery order: a killed worker's last line may be read after
        // another worker got the job again.
        ds.sort_by_key(|d| d.delivery);
        let ds = &*ds;
        for d in &ds[1..] {
            assert!(
                d.redelivered,
                "seq {seq} delivered again unmarked: {ds:?} (seed {seed})"
            );
        }
        let by = acks.get(seq).cloned().unwrap_or_default();
        assert!(
            !by.is_empty(),
            "seq {seq} never acked: {ds:?} (seed {seed})"
        );
        // Twice only when the killed worker's ack died with it, or the
        // stopped one's was written to a `dws` stopped before it sent it.
        assert!(
            by.len() == 1 || by.contains(&3) || by.contains(&2),
            "seq {seq} acked by {by:?}: {ds:?} (seed {seed})"
        );
        assert!(
            !by.contains(&1),
            "the hung worker acks nothing (seed {seed})"
        );
        // A delivery its worker did not ack comes to another in time
        // (the stopped worker's last reads may have been acked too late).
        // Each delivery between the two that nobody printed (to the
        // SIGSTOPped worker, whose `dws` is stopped too, before the bus
        // knew it stalled) took one more ack wait.
        for w in ds.windows(2) {
            let (d, next) = (w[0], w[1]);
            let acked_it = log
                .acked
                .iter()
                .any(|a| a.seq == *seq && a.worker == d.worker && a.at >= d.at);
            if acked_it {
                continue;
            }
            let after = next.at.duration_since(d.at);
            let waits = u32::try_from(next.delivery.saturating_sub(d.delivery).max(1)).unwrap_or(1);
            assert!(
                after <= (ACK_WAIT + Duration::from_secs(1)) * waits + SLACK,
                "seq {seq} waited {after:?} on worker {} ({:?}) before worker {} got it \
                 (seed {seed}): {ds:?}",
                d.worker,
                ROLES[d.worker],
                next.worker
            );
            assert_ne!(
                next.worker, d.worker,
                "seq {seq} went back to the worker it expired on while others were here \
                 (seed {seed}): {ds:?}"
            );
        }
    }
    // The stopped worker had work before it was stopped; the healthy one
    // did most of it.
    let per_worker: Vec<usize> = (0..4)
        .map(|w| log.acked.iter().filter(|a| a.worker == w).count())
        .collect();
    assert!(per_worker[0] > 0, "{per_worker:?} (seed {seed})");
    assert!(stopped_at.is_some());
    eprintln!(
        "seed {seed}: {} deliveries, acks {per_worker:?}",
        log.delivered.len()
    );
}

/// 300 jobs per seed, three seeds (each printed, replayable with
/// `run(seed, 300)`).
#[test]
fn four_workers_healthy_hung_stopped_and_killed_each_job_acked_by_a_live_one() {
    for _ in 0..3 {
        run(fastrand::u64(..), 300);
    }
}
