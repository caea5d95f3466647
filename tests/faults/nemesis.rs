//! The nemeses: faults injected at random moments (a seeded schedule) into a
//! running [`Cluster`]: a host's busd killed with `-9` or frozen with
//! SIGSTOP (then SIGCONT), PostgreSQL stopped fast, immediately or with
//! `kill -9` and started again, every busd backend ended with
//! `pg_terminate_backend`, and the network between a host and PostgreSQL
//! (its [`dws_tests::proxy::Proxy`]) black-holed both ways or one way,
//! reset again and again, or slowed down. Every fault is healed before
//! [`run`] returns, so the workload can finish and the history be checked.

use std::{
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use dws_tests::proxy::Direction;

use crate::workload::Cluster;

/// The kinds of fault a scenario draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A random host's busd: `kill -9` (its next `dws` command starts a new one).
    KillBus,
    /// A random host's busd: SIGSTOP for a random while, then SIGCONT.
    FreezeBus,
    /// PostgreSQL: fast shutdown (`-m fast`), down for a while, started again.
    PgRestartFast,
    /// PostgreSQL: immediate shutdown (`-m immediate`), started again.
    PgRestartImmediate,
    /// PostgreSQL: every process SIGKILLed, started again.
    PgKill,
    /// `pg_terminate_backend` of every busd session.
    TerminateBackends,
    /// A random host's path to PostgreSQL swallows everything, both ways,
    /// without a reset, for a while (the cluster needs proxies).
    Partition,
    /// Two hosts partitioned at once (an owner and a follower, or two
    /// followers), healed together.
    PartitionTwo,
    /// One direction of a random host's path held for a while.
    OneWay,
    /// Every connection of a random host reset, again and again, for a while.
    Resets,
    /// A random host's path delayed 200 ms ± 150 ms for a while.
    Latency,
}

impl Kind {
    /// Whether the fault needs a proxy between the hosts and PostgreSQL.
    pub fn is_network(self) -> bool {
        matches!(
            self,
            Kind::Partition | Kind::PartitionTwo | Kind::OneWay | Kind::Resets | Kind::Latency
        )
    }
}

/// How long a network fault lasts: past the suite's lease (3 s) and a
/// statement's bound (5 s), so owners lose their lease and statements give
/// up, but short enough for CI.
const NET_MS: std::ops::Range<u64> = 2_000..12_000;

/// The longest a frozen bus stays frozen: past the lease bound the suite
/// sets, so an owner frozen that long must lose the upstream.
const FREEZE_MAX_MS: u64 = 9_000;

/// Injects faults of `kinds` for `length`, one every 1–3 s, chosen by
/// `seed`; returns what it did, for the failure message.
pub fn run(cluster: &mut Cluster, kinds: &[Kind], seed: u64, length: Duration) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut done = Vec::new();
    let end = Instant::now() + length;
    let t0 = Instant::now();
    while Instant::now() < end {
        thread::sleep(Duration::from_millis(rng.u64(1_000..3_000)));
        let kind = kinds[rng.usize(..kinds.len())];
        let what = inject(cluster, kind, &mut rng);
        done.push(format!("{:>6.1}s {what}", t0.elapsed().as_secs_f64()));
    }
    done
}

/// Partitions in turn, each for a seeded while and 1–3 s apart: the owner
/// (as the database names it then), then a follower, then both at once,
/// then one direction of a random host's path.
pub fn partitions_in_turn(cluster: &mut Cluster, seed: u64) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut done = Vec::new();
    let t0 = Instant::now();
    let n = cluster.hosts.len();
    for step in ["the owner", "a follower", "owner and follower", "one way"] {
        thread::sleep(Duration::from_millis(rng.u64(1_000..3_000)));
        let owner = cluster
            .server
            .psql("SELECT coalesce(min(owner_host), '') FROM dws_cluster");
        let o = cluster
            .hosts
            .iter()
            .position(|h| h.name == owner)
            .unwrap_or(0);
        let f = (o + 1 + rng.usize(..n - 1)) % n;
        let ms = rng.u64(NET_MS);
        let (targets, dir) = match step {
            "the owner" => (vec![o], None),
            "a follower" => (vec![f], None),
            "owner and follower" => (vec![o, f], None),
            _ => {
                let d = if rng.bool() {
                    Direction::Up
                } else {
                    Direction::Down
                };
                (vec![rng.usize(..n)], Some(d))
            }
        };
        for &t in &targets {
            match dir {
                Some(d) => cluster.hosts[t].proxy().hold(d),
                None => cluster.hosts[t].proxy().black_hole(),
            }
        }
        thread::sleep(Duration::from_millis(ms));
        for &t in &targets {
            cluster.hosts[t].proxy().heal();
        }
        let names: Vec<&str> = targets
            .iter()
            .map(|&t| cluster.hosts[t].name.as_str())
            .collect();
        let how = dir.map_or("black-holed".to_owned(), |d| format!("held {d:?}"));
        done.push(format!(
            "{:>6.1}s {step} ({names:?}, owner {owner:?}): path to PostgreSQL {how} for {ms} ms",
            t0.elapsed().as_secs_f64()
        ));
    }
    done
}

fn inject(cluster: &mut Cluster, kind: Kind, rng: &mut fastrand::Rng) -> String {
    let host = rng.usize(..cluster.hosts.len());
    let name = cluster.hosts[host].name.clone();
    match kind {
        Kind::KillBus => {
            let pids = cluster.hosts[host].busd_pids();
            signal_all(&pids, Signal::SIGKILL);
            format!("kill -9 {name}'s busd {pids:?}")
        }
        Kind::FreezeBus => {
            let pids = cluster.hosts[host].busd_pids();
            let ms = rng.u64(500..FREEZE_MAX_MS);
            let _thaw = Thaw(pids.clone());
            signal_all(&pids, Signal::SIGSTOP);
            thread::sleep(Duration::from_millis(ms));
            format!("SIGSTOP {name}'s busd {pids:?} for {ms} ms")
        }
        Kind::PgRestartFast => {
            let ms = rng.u64(200..2_500);
            cluster.server.stop();
            thread::sleep(Duration::from_millis(ms));
            cluster.server.start_again();
            format!("PostgreSQL stopped -m fast, down {ms} ms")
        }
        Kind::PgRestartImmediate => {
            let ms = rng.u64(200..2_500);
            cluster.server.stop_immediate();
            thread::sleep(Duration::from_millis(ms));
            cluster.server.start_again();
            format!("PostgreSQL stopped -m immediate, down {ms} ms")
        }
        Kind::PgKill => {
            let ms = rng.u64(200..2_500);
            cluster.server.kill9();
            thread::sleep(Duration::from_millis(ms));
            cluster.server.start_again();
            format!("PostgreSQL killed -9, down {ms} ms")
        }
        Kind::Partition | Kind::OneWay | Kind::Resets | Kind::Latency => {
            let ms = rng.u64(NET_MS);
            let proxy = cluster.hosts[host].proxy();
            let what = match kind {
                Kind::Partition => {
                    proxy.black_hole();
                    "black-holed both ways".to_owned()
                }
                Kind::OneWay => {
                    let d = if rng.bool() {
                        Direction::Up
                    } else {
                        Direction::Down
                    };
                    proxy.hold(d);
                    format!("held {d:?} only")
                }
                Kind::Latency => {
                    proxy.delay(Duration::from_millis(200), Duration::from_millis(150));
                    "delayed 200 ± 150 ms".to_owned()
                }
                _ => "reset every 300 ms".to_owned(),
            };
            let until = Instant::now() + Duration::from_millis(ms);
            let mut resets = 0;
            while Instant::now() < until {
                if kind == Kind::Resets {
                    resets += proxy.reset_all();
                }
                thread::sleep(Duration::from_millis(300));
            }
            proxy.heal();
            let n = if kind == Kind::Resets {
                format!(" ({resets} resets)")
            } else {
                String::new()
            };
            format!("{name}'s path to PostgreSQL {what} for {ms} ms{n}")
        }
        Kind::PartitionTwo => {
            let other = (host + 1 + rng.usize(..cluster.hosts.len() - 1)) % cluster.hosts.len();
            let ms = rng.u64(NET_MS);
            let (p1, p2) = (cluster.hosts[host].proxy(), cluster.hosts[other].proxy());
            p1.black_hole();
            p2.black_hole();
            thread::sleep(Duration::from_millis(ms));
            p1.heal();
            p2.heal();
            format!(
                "{name}'s and {}'s paths to PostgreSQL black-holed for {ms} ms",
                cluster.hosts[other].name
            )
        }
        Kind::TerminateBackends => {
            let n = cluster.server.psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name LIKE 'busd/%'",
            );
            format!("pg_terminate_backend of {n} busd session(s)")
        }
    }
}

fn signal_all(pids: &[i32], sig: Signal) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), sig);
    }
}

/// SIGCONTs its processes when dropped, so a frozen bus is thawed even when
/// the scenario panics.
struct Thaw(Vec<i32>);

impl Drop for Thaw {
    fn drop(&mut self) {
        signal_all(&self.0, Signal::SIGCONT);
    }
}
