//! A work queue on one host: a `--delivery shared` subscription on the
//! default (disk) store, several `dws event consume --ack explicit` at once,
//! each event to one of them. Checked over a whole run, with kill -9 of a
//! consumer and of the bus at seeded moments, by a checker: every event
//! published is delivered, a delivery after an event's first one is marked
//! redelivered (a shared event is handled by one consumer at a time unless
//! marked), every consumer does work, and nothing is left pending.

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

const LONG: Duration = Duration::from_secs(120);

/// One delivery a worker saw: which worker, its seq, id, redelivered mark.
#[derive(Debug, Clone)]
struct Seen {
    worker: usize,
    seq: u64,
    id: String,
    redelivered: bool,
}

/// A worker: runs `dws event consume --subscribe-id work --ack explicit`,
/// acks every event it reads, and starts again whenever its consumer ends
/// (killed, or its bus was), until `stop`.
fn worker(env: &TestEnv, n: usize, seen: &Mutex<Vec<Seen>>, pid: &AtomicI32, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let mut c = queue_worker(env, "work", &["--quiet"]).spawn_stdout_unread();
        pid.store(c.pid(), Ordering::SeqCst);
        // The run ends: whoever stopped us saw this pid, or we see that.
        if stop.load(Ordering::SeqCst) {
            signal_quiet(c.pid(), Sig::SIGTERM);
        }
        let Some(out) = c.take_stdout() else {
            return;
        };
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).expect("an NDJSON line");
            let seq = v["seq"].as_u64().expect("a seq");
            seen.lock().expect("not poisoned").push(Seen {
                worker: n,
                seq,
                id: v["event_id"].as_str().unwrap_or_default().to_owned(),
                redelivered: v["redelivered"].as_bool().unwrap_or(false),
            });
            if c.try_write_stdin(format!("ack {seq}\n").as_bytes())
                .is_err()
            {
                break;
            }
        }
        signal_quiet(c.pid(), Sig::SIGTERM);
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while c.is_running() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends `sig` to `pid`, which may be gone already.
fn signal_quiet(pid: i32, sig: Sig) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Publishes chunk `chunk` (`lines` events, ids `c<chunk>-<line>`), again
/// until every line is answered: a bus killed meanwhile leaves some
/// unanswered, and the dedup window makes the rerun publish only those.
fn publish_chunk(env: &TestEnv, chunk: usize, lines: usize) {
    let input: String = (0..lines)
        .map(|i| format!("{{\"job\":{chunk}-{i},\"pad\":\"{}\"}}\n", "w".repeat(200)))
        .collect();
    let prefix = format!("c{chunk}");
    let deadline = Instant::now() + LONG;
    loop {
        let out = env
            .dws([
                "event",
                "publish",
                "job.x",
                "--lines",
                "--id-prefix",
                &prefix,
            ])
            .stdin_bytes(input.clone().into_bytes())
            .run_with_timeout(LONG);
        if out.code == Some(0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "chunk {chunk} never published\n{out}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

fn run(seed: u64, chunks: usize, lines: usize) {
    eprintln!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let env = TestEnv::new();
    subscribe_ok(
        &env,
        &["job.*", "--id", "work", "--delivery", "shared"],
        "work",
    );
    let seen = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let pids: Vec<AtomicI32> = (0..4).map(|_| AtomicI32::new(0)).collect();
    let kill_worker_after = rng.usize(..chunks);
    let kill_bus_after = rng.usize(..chunks);
    let total = chunks * lines;
    thread::scope(|s| {
        for (n, pid) in pids.iter().enumerate() {
            let (env, seen, stop) = (&env, &seen, &stop);
            s.spawn(move || worker(env, n, seen, pid, stop));
        }
        for chunk in 0..chunks {
            publish_chunk(&env, chunk, lines);
            if chunk == kill_worker_after {
                let victim = &pids[rng.usize(..4)];
                signal_quiet(victim.load(Ordering::SeqCst), Sig::SIGKILL);
            }
            if chunk == kill_bus_after {
                if let Some(bus) = env.bus_meta_pid() {
                    signal_quiet(bus, Sig::SIGKILL);
                }
            }
        }
        // Until every event was delivered (redeliveries may still come).
        let deadline = Instant::now() + LONG;
        loop {
            let distinct = {
                let seen = seen.lock().expect("not poisoned");
                let mut ids: Vec<&str> = seen.iter().map(|d| d.id.as_str()).collect();
                ids.sort_unstable();
                ids.dedup();
                ids.len()
            };
            if distinct >= total {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {distinct} of {total} events delivered (seed {seed})"
            );
            thread::sleep(Duration::from_millis(100));
        }
        let st = env.wait_status(LONG, "everything acked", |st| {
            let w = listed(st, "work");
            w["pending"] == 0 && w["in_flight"] == 0
        });
        assert_eq!(listed(&st, "work")["delivery"], "shared", "{st:#}");
        stop.store(true, Ordering::SeqCst);
        for pid in &pids {
            signal_quiet(pid.load(Ordering::SeqCst), Sig::SIGTERM);
        }
    });
    check(
        &seen.into_inner().expect("not poisoned"),
        chunks,
        lines,
        seed,
    );
}

/// The checker over every delivery of the run.
fn check(seen: &[Seen], chunks: usize, lines: usize, seed: u64) {
    let mut by_seq: BTreeMap<u64, Vec<&Seen>> = BTreeMap::new();
    for d in seen {
        by_seq.entry(d.seq).or_default().push(d);
    }
    let mut ids: BTreeMap<&str, u64> = BTreeMap::new();
    for (seq, ds) in &by_seq {
        // One seq names one event.
        assert!(
            ds.iter().all(|d| d.id == ds[0].id),
            "seq {seq}: {ds:?} (seed {seed})"
        );
        // Handled by one consumer at a time: any later delivery is marked.
        for d in &ds[1..] {
            assert!(
                d.redelivered,
                "seq {seq} delivered again unmarked: {ds:?} (seed {seed})"
            );
        }
        // And no event is under two seqs.
        if let Some(other) = ids.insert(&ds[0].id, *seq) {
            panic!("{} under seqs {other} and {seq} (seed {seed})", ds[0].id);
        }
    }
    for c in 0..chunks {
        for l in 1..=lines {
            let id = format!("c{c}-{l}");
            assert!(
                ids.contains_key(id.as_str()),
                "{id} never delivered (seed {seed})"
            );
        }
    }
    assert_eq!(ids.len(), chunks * lines, "no event beyond those published");
    let mut per_worker = [0usize; 4];
    for d in seen {
        per_worker[d.worker] += 1;
    }
    assert!(
        per_worker.iter().all(|&n| n > 0),
        "every worker worked: {per_worker:?}"
    );
    eprintln!("seed {seed}: {} deliveries {per_worker:?}", seen.len());
}

/// 100,000 events per seed, two seeds (each printed, replayable with
/// `run(seed, …)`).
#[test]
fn four_consumers_split_a_shared_subscription_across_kill_9_of_a_consumer_and_of_the_bus() {
    let seeds = [fastrand::u64(..), fastrand::u64(..)];
    for seed in seeds {
        run(seed, 10, 10_000);
    }
}
