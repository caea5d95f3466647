//! The slow-agents row, the bus's side: a work queue whose workers take
//! time per job, as agents do, and one of which stops (SIGSTOP) a third of
//! the way in. A fresh bus, `dws event subscribe 'job.*' --id work
//! --delivery shared`, then [`WORKERS`] × `dws event consume --subscribe-id
//! work --ack explicit --max-in-flight 1 --ack-wait 2s`; each worker here
//! reads one job, works [`WORK`] on it (a sleep), then acks it. [`JOBS`]
//! jobs are published at once. Once a third are acked, one worker's `dws`
//! is stopped with SIGSTOP (the job it holds comes again to another worker
//! after its ack wait).
//!
//! Makespan: first publish → the last job acked, next to the ideal
//! (`JOBS × WORK / (WORKERS − 1)`: the work spread evenly over the workers
//! left).

use std::{
    io::{BufRead, BufReader, Write},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    opts::StoreSel,
    procs::{bus_info, BusEnv, Consumer, CMD_TIMEOUT},
    publisher::Publisher,
    queue::parse_job,
    Res,
};

pub const WORKERS: usize = 4;
pub const JOBS: u64 = 400;
pub const WORK: Duration = Duration::from_millis(20);
const ACK_WAIT: &str = "2s";
const SIZE: usize = 256;
const TIMEOUT: Duration = Duration::from_secs(120);

/// One run's figures.
pub struct SlowAgents {
    pub makespan: Duration,
    pub ideal: Duration,
    pub redelivered: u64,
}

/// One run on a fresh bus on `store`.
pub fn run_slow_agents(store: StoreSel) -> Res<SlowAgents> {
    let mut env = BusEnv::new(&store.env());
    let sub = env.run_dws(
        &[
            "event",
            "subscribe",
            "job.*",
            "--id",
            "work",
            "--delivery",
            "shared",
        ],
        CMD_TIMEOUT,
    )?;
    if !sub.ok {
        return Err(format!("subscribe failed: {}", sub.stderr.trim()));
    }
    let args = [
        "event",
        "consume",
        "--subscribe-id",
        "work",
        "--ack",
        "explicit",
        "--max-in-flight",
        "1",
        "--ack-wait",
        ACK_WAIT,
    ];
    let mut workers = (0..WORKERS)
        .map(|_| Consumer::spawn_worker(&env, &args))
        .collect::<Res<Vec<_>>>()?;
    let status = env.wait_consumers(WORKERS, &mut workers)?;
    let socket = bus_info(&status)?.0;
    let seen = Arc::new(Mutex::new(vec![false; JOBS as usize]));
    let done = Arc::new(AtomicU64::new(0));
    let redelivered = Arc::new(AtomicU64::new(0));
    let quit = Arc::new(AtomicBool::new(false));
    let mut threads = vec![];
    for w in &mut workers {
        let out = BufReader::new(w.take_stdout()?);
        let mut stdin = w.take_stdin()?;
        let (seen, done, redelivered, quit) = (
            seen.clone(),
            done.clone(),
            redelivered.clone(),
            quit.clone(),
        );
        threads.push(thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                if quit.load(Ordering::SeqCst) {
                    break;
                }
                let Some(job) = parse_job(line.as_bytes()) else {
                    continue;
                };
                redelivered.fetch_add(u64::from(job.redelivered), Ordering::Relaxed);
                thread::sleep(WORK);
                if stdin
                    .write_all(format!("ack {}\n", job.seq).as_bytes())
                    .is_err()
                {
                    break;
                }
                let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(slot) = s.get_mut(job.index as usize) {
                    if !*slot {
                        *slot = true;
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    let mut publisher = Publisher::connect(&socket)?;
    publisher.set_event_type("job.x");
    let started = Instant::now();
    publisher.flood(JOBS, SIZE, JOBS, None)?;
    publisher.close();
    let victim = workers[WORKERS - 1].pid();
    let mut stopped = false;
    let result = loop {
        let n = done.load(Ordering::SeqCst);
        if !stopped && n >= JOBS / 3 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(victim),
                nix::sys::signal::Signal::SIGSTOP,
            );
            stopped = true;
        }
        if n >= JOBS {
            break Ok(started.elapsed());
        }
        if started.elapsed() > TIMEOUT {
            break Err(format!("only {n} of {JOBS} jobs acked in {TIMEOUT:?}"));
        }
        thread::sleep(Duration::from_millis(1));
    };
    quit.store(true, Ordering::SeqCst);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGCONT,
    );
    for w in &workers {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w.pid()),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    for w in &mut workers {
        w.wait_exit(Duration::from_secs(10));
    }
    drop(workers);
    for t in threads {
        let _ = t.join();
    }
    env.stop()?;
    let makespan = result?;
    Ok(SlowAgents {
        makespan,
        ideal: WORK * JOBS as u32 / (WORKERS as u32 - 1),
        redelivered: redelivered.load(Ordering::Relaxed),
    })
}
