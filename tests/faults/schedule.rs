//! The mixed schedule: faults of every kind, several at once, drawn from a
//! seed into a [`Schedule`] that is printed before it runs (the same seed
//! gives the same schedule, so a failure replays): `kill -9`, SIGSTOP and
//! SIGCONT, `dws event restart` of a host's bus, PostgreSQL stopped (fast,
//! immediate or killed) and started again, `pg_terminate_backend` of every
//! busd session, and the network between a host and PostgreSQL black-holed,
//! held one way, reset again and again, or slowed down. Faults overlap, but
//! never two of one kind on one host (one network fault per host's proxy,
//! one freeze per bus, one PostgreSQL restart at a time). Every fault is
//! healed when [`run`] returns.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use dws_tests::proxy::Direction;
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use crate::workload::Cluster;

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Kill9,
    Freeze,
    Restart,
    PgFast,
    PgImmediate,
    PgKill,
    Terminate,
    Partition,
    Hold(Direction),
    Resets,
    Latency,
}

/// A fault, its host (unused for PostgreSQL's), when it starts and how long
/// it lasts (0: at once).
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub at: Duration,
    pub fault: Fault,
    pub host: usize,
    pub lasts: Duration,
}

/// The seeded schedule.
pub struct Schedule(pub Vec<Step>);

impl Schedule {
    /// Faults for `length` over `hosts` hosts: one every 0.5–2 s, each
    /// lasting long enough to matter (past the suite's 3 s lease and a
    /// statement's 5 s bound) and at most 12 s.
    pub fn draw(seed: u64, hosts: usize, length: Duration) -> Schedule {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut steps = vec![];
        let mut at = Duration::from_millis(rng.u64(500..1_500));
        // Busy until: per host its network and its freeze; PostgreSQL.
        let mut net = vec![Duration::ZERO; hosts];
        let mut frozen = vec![Duration::ZERO; hosts];
        let mut pg = Duration::ZERO;
        while at < length {
            let host = rng.usize(..hosts);
            let ms = |rng: &mut fastrand::Rng, r: std::ops::Range<u64>| {
                Duration::from_millis(rng.u64(r))
            };
            let (fault, lasts) = match rng.u8(..11) {
                0 => (Fault::Kill9, Duration::ZERO),
                1 => (Fault::Freeze, ms(&mut rng, 500..9_000)),
                2 => (Fault::Restart, Duration::ZERO),
                3 => (Fault::PgFast, ms(&mut rng, 200..2_500)),
                4 => (Fault::PgImmediate, ms(&mut rng, 200..2_500)),
                5 => (Fault::PgKill, ms(&mut rng, 200..2_500)),
                6 => (Fault::Terminate, Duration::ZERO),
                7 | 8 => (Fault::Partition, ms(&mut rng, 2_000..12_000)),
                9 => {
                    let d = if rng.bool() {
                        Direction::Up
                    } else {
                        Direction::Down
                    };
                    (Fault::Hold(d), ms(&mut rng, 2_000..10_000))
                }
                _ => {
                    let f = if rng.bool() {
                        Fault::Resets
                    } else {
                        Fault::Latency
                    };
                    (f, ms(&mut rng, 2_000..8_000))
                }
            };
            let slot = match fault {
                Fault::Partition | Fault::Hold(_) | Fault::Resets | Fault::Latency => {
                    &mut net[host]
                }
                Fault::Freeze => &mut frozen[host],
                // Backends are ended only while the server runs.
                Fault::PgFast | Fault::PgImmediate | Fault::PgKill | Fault::Terminate => &mut pg,
                _ => &mut frozen[host],
            };
            if *slot <= at {
                // An instant fault on a frozen bus would wait for the thaw.
                *slot = at + lasts;
                steps.push(Step {
                    at,
                    fault,
                    host,
                    lasts,
                });
            }
            at += ms(&mut rng, 500..2_000);
        }
        Schedule(steps)
    }

    /// One line per step, for the log and the failure message.
    pub fn lines(&self, names: &[String]) -> Vec<String> {
        self.0
            .iter()
            .map(|s| {
                let on = match s.fault {
                    Fault::PgFast | Fault::PgImmediate | Fault::PgKill | Fault::Terminate => {
                        "postgres".to_owned()
                    }
                    _ => names[s.host].clone(),
                };
                format!(
                    "{:>6.1}s {:?} on {on} for {:.1}s",
                    s.at.as_secs_f64(),
                    s.fault,
                    s.lasts.as_secs_f64()
                )
            })
            .collect()
    }
}

/// An action due at a time: a fault's start or its end.
enum Due {
    Start(Step),
    End(Step),
}

/// Runs `schedule` on `cluster`; every fault is over when it returns.
/// Returns what was done (with the real times).
pub fn run(cluster: &mut Cluster, schedule: &Schedule) -> Vec<String> {
    let mut due: Vec<(Duration, usize, Due)> = vec![];
    for (i, s) in schedule.0.iter().enumerate() {
        due.push((s.at, i * 2, Due::Start(*s)));
        if !s.lasts.is_zero() {
            due.push((s.at + s.lasts, i * 2 + 1, Due::End(*s)));
        }
    }
    due.sort_by_key(|(at, order, _)| (*at, *order));
    let t0 = Instant::now();
    let mut done = vec![];
    let mut live = Live::default();
    for (at, _, what) in due {
        let now = t0.elapsed();
        if at > now {
            thread::sleep(at - now);
        }
        let line = match what {
            Due::Start(s) => start(cluster, &mut live, s),
            Due::End(s) => end(cluster, &mut live, s),
        };
        done.push(format!("{:>6.1}s {line}", t0.elapsed().as_secs_f64()));
    }
    done
}

/// What is in force: frozen pids (thawed on drop, also on a panic) and the
/// reset loops' stop flags per host.
#[derive(Default)]
struct Live {
    frozen: Vec<(usize, Vec<i32>)>,
    resets: Vec<(usize, Arc<AtomicBool>)>,
}

impl Drop for Live {
    fn drop(&mut self) {
        for (_, pids) in &self.frozen {
            signal_all(pids, Signal::SIGCONT);
        }
        for (_, stop) in &self.resets {
            stop.store(true, Ordering::SeqCst);
        }
    }
}

fn start(cluster: &mut Cluster, live: &mut Live, s: Step) -> String {
    let host = cluster.hosts[s.host].clone();
    let name = &host.name;
    match s.fault {
        Fault::Kill9 => {
            let pids = host.busd_pids();
            signal_all(&pids, Signal::SIGKILL);
            format!("kill -9 {name}'s busd {pids:?}")
        }
        Fault::Freeze => {
            let pids = host.busd_pids();
            signal_all(&pids, Signal::SIGSTOP);
            live.frozen.push((s.host, pids.clone()));
            format!("SIGSTOP {name}'s busd {pids:?}")
        }
        Fault::Restart => {
            // In the background: it waits for the old bus to stop.
            let h = host.clone();
            thread::spawn(move || {
                let _ = h
                    .env
                    .dws(["event", "restart"])
                    .stdin_null()
                    .run_with_timeout(Duration::from_secs(60));
            });
            format!("dws event restart on {name}")
        }
        Fault::PgFast => {
            cluster.server.stop();
            "PostgreSQL stopped -m fast".into()
        }
        Fault::PgImmediate => {
            cluster.server.stop_immediate();
            "PostgreSQL stopped -m immediate".into()
        }
        Fault::PgKill => {
            cluster.server.kill9();
            "PostgreSQL killed -9".into()
        }
        Fault::Terminate => {
            let n = cluster.server.psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name LIKE 'busd/%'",
            );
            format!("pg_terminate_backend of {n} busd session(s)")
        }
        Fault::Partition => {
            host.proxy().black_hole();
            format!("{name}'s path to PostgreSQL black-holed both ways")
        }
        Fault::Hold(d) => {
            host.proxy().hold(d);
            format!("{name}'s path to PostgreSQL held {d:?}")
        }
        Fault::Latency => {
            host.proxy()
                .delay(Duration::from_millis(200), Duration::from_millis(150));
            format!("{name}'s path to PostgreSQL delayed 200 ± 150 ms")
        }
        Fault::Resets => {
            let stop = Arc::new(AtomicBool::new(false));
            let (h, flag) = (host.clone(), stop.clone());
            thread::spawn(move || {
                while !flag.load(Ordering::SeqCst) {
                    h.proxy().reset_all();
                    thread::sleep(Duration::from_millis(300));
                }
            });
            live.resets.push((s.host, stop));
            format!("{name}'s connections to PostgreSQL reset every 300 ms")
        }
    }
}

fn end(cluster: &mut Cluster, live: &mut Live, s: Step) -> String {
    let host = cluster.hosts[s.host].clone();
    let name = &host.name;
    match s.fault {
        Fault::Freeze => {
            let i = live.frozen.iter().position(|(h, _)| *h == s.host);
            let pids = i.map(|i| live.frozen.remove(i).1).unwrap_or_default();
            signal_all(&pids, Signal::SIGCONT);
            format!("SIGCONT {name}'s busd {pids:?}")
        }
        Fault::PgFast | Fault::PgImmediate | Fault::PgKill => {
            cluster.server.start_again();
            "PostgreSQL started again".into()
        }
        Fault::Resets => {
            if let Some(i) = live.resets.iter().position(|(h, _)| *h == s.host) {
                live.resets.remove(i).1.store(true, Ordering::SeqCst);
            }
            format!("{name}'s connections no longer reset")
        }
        _ => {
            host.proxy().heal();
            format!("{name}'s path to PostgreSQL healed")
        }
    }
}

fn signal_all(pids: &[i32], sig: Signal) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), sig);
    }
}
