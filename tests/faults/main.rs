//! The cluster's fault suite: several real hosts (`busd` with
//! `store = "postgres"`) on one private PostgreSQL, a publisher and a
//! consumer on every host, and a nemesis injecting faults at seeded random
//! moments; at the end the whole history is checked
//! (`dws_tests::history`): every answered publish is in the log exactly
//! once under its seq, no publish told "failed" was appended, no seq names
//! two events, every consumer run is in seq order with repeats marked, every
//! answered event reached every host's subscription or a gap line covers
//! it, and at most one host appended under each epoch.
//!
//! Each scenario runs `DWS_FAULT_SEEDS` times (default 3) with seeds from
//! `DWS_FAULT_SEED` (default: the clock) on, printing each seed so a failure
//! can be replayed; `DWS_FAULT_SECONDS` (default 10) is how long the nemesis
//! acts per run. A longer run:
//!
//! ```text
//! DWS_FAULT_SEEDS=20 DWS_FAULT_SECONDS=30 cargo test -p dws-tests --test faults
//! ```
//!
//! The network scenarios put a TCP proxy (`dws_tests::proxy`) between each
//! host and PostgreSQL. The mixed schedule (`schedule.rs`: three hosts,
//! explicit acks, a shared subscription, every kind of fault, several at
//! once) prints its schedule before it runs; `DWS_FAULTS_SECS=1800` makes
//! it a soak of that many seconds (one seed unless `DWS_FAULT_SEEDS` says
//! otherwise):
//!
//! ```text
//! DWS_FAULTS_SECS=1800 cargo test -p dws-tests --test faults -- mixed
//! ```
//!
//! A scenario the checker flags keeps its directories, history, tables and
//! logs (`keep.rs`, under `DWS_FAULT_KEEP`, default `/tmp/dws-faults-kept`)
//! and names where in its failure message.

mod keep;
mod nemesis;
mod schedule;
mod workload;

use std::time::Duration;

use dws_tests::{history::Outcome, pg::PgServer};
use nemesis::Kind;
use workload::{Cluster, Options};

/// Extra environment of every host: a short lease bound, so a frozen owner
/// loses the upstream within the freezes the nemesis causes.
const HOST_ENV: &[(&str, &str)] = &[("DWS_CLUSTER_LEASE", "3s")];

fn seeds() -> Vec<u64> {
    let n: u64 = std::env::var("DWS_FAULT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let base: u64 = std::env::var("DWS_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(dws_tests::common::now_ms);
    (0..n).map(|i| base.wrapping_add(i)).collect()
}

fn fault_time() -> Duration {
    Duration::from_secs(
        std::env::var("DWS_FAULT_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    )
}

/// Runs the workload under `kinds` once per seed and checks each history.
fn scenario(name: &str, hosts: &[&str], kinds: &[Kind], setup: impl Fn(&PgServer)) {
    let opts = Options {
        proxies: kinds.iter().any(|k| k.is_network()),
        ..Options::default()
    };
    run_scenario(name, hosts, opts, &seeds(), setup, |cluster, seed| {
        nemesis::run(cluster, kinds, seed, fault_time())
    });
}

/// Runs the workload with `opts` once per seed, `nemesis` acting on it,
/// and checks each history.
fn run_scenario(
    name: &str,
    hosts: &[&str],
    opts: Options,
    seeds: &[u64],
    setup: impl Fn(&PgServer),
    nemesis: impl Fn(&mut Cluster, u64) -> Vec<String>,
) {
    for &seed in seeds {
        eprintln!("fault scenario {name}: seed {seed} (replay with DWS_FAULT_SEED={seed} DWS_FAULT_SEEDS=1)");
        let server = PgServer::start();
        setup(&server);
        let mut cluster = Cluster::start(server, hosts, HOST_ENV, opts);
        let did = nemesis(&mut cluster, seed);
        let (history, server, hosts, shared_views) = cluster.finish();
        let answered = history
            .publishes
            .iter()
            .filter(|p| matches!(p.outcome, Outcome::Answered { .. }))
            .count();
        let violations = history.check();
        if violations.is_empty() && answered >= 10 {
            eprintln!(
                "fault scenario {name}: seed {seed}: {answered} answered publishes, {} runs, history clean",
                history.runs.len()
            );
            continue;
        }
        let logs: Vec<String> = hosts
            .iter()
            .map(|h| format!("--- {} ---\n{}", h.name, h.env.bus_log_tail()))
            .collect();
        let mut evidence = evidence(&history, &violations);
        evidence.push_str(&shared_evidence(&violations, &server, &shared_views));
        let kept = keep::keep(name, seed, &history, &server, &hosts, &did);
        panic!(
            "fault scenario {name}, seed {seed}: {} violation(s), {answered} answered publishes ({kept})\n\
             {}\n--- evidence ---\n{evidence}\n--- faults ---\n{}\n{}\n--- postgres ---\n{}",
            violations.len(),
            violations
                .iter()
                .take(40)
                .map(|v| format!("  {v}"))
                .collect::<Vec<_>>()
                .join("\n"),
            did.join("\n"),
            logs.join("\n"),
            server.log_tail()
        );
    }
}

/// For a violation about a seq or a token: the log around it, and every
/// delivery and nearby gap of it — what a diagnosis needs once the
/// scenario's directories are gone.
fn evidence(
    history: &dws_tests::history::History,
    violations: &[dws_tests::history::Violation],
) -> String {
    use dws_tests::history::{Seen, Violation as V};
    let mut out = vec![];
    for v in violations.iter().take(5) {
        let (seq, token) = match v {
            V::AnsweredNotInLog { token, seq } => (*seq, token.clone()),
            V::FailedButAppended { token, seq, .. } => (*seq, token.clone()),
            V::AnsweredWrongSeq {
                token, answered, ..
            } => (*answered, token.clone()),
            V::Missing { seq, token, .. } => (*seq, token.clone()),
            _ => continue,
        };
        let around: Vec<_> = history.log.range(seq.saturating_sub(2)..=seq + 2).collect();
        out.push(format!("{token} / seq {seq}: log around it {around:?}"));
        for run in &history.runs {
            for s in &run.seen {
                let hit = match s {
                    Seen::Event {
                        seq: q, token: t, ..
                    } => *q == seq || *t == token,
                    Seen::Gap { before } => *before > seq && *before <= seq + 1_000,
                };
                if hit {
                    out.push(format!("  {}/{}: {s:?}", run.host, run.subscription));
                }
            }
        }
    }
    out.join("\n")
}

/// For events of a shared subscription that no host delivered: why, from
/// their claims (never claimed, claimed by an incarnation whose claim then
/// expired and was not taken again, still held, finished as acked or lost),
/// in runs of consecutive seqs with the same reason, and each host's view of
/// the subscription at the end (consumer attached, halted, what it holds).
fn shared_evidence(
    violations: &[dws_tests::history::Violation],
    server: &PgServer,
    views: &[String],
) -> String {
    use dws_tests::history::{Violation as V, SHARED_HOST};
    use std::collections::BTreeSet;
    let mut missing: Vec<(String, u64)> = violations
        .iter()
        .filter_map(|v| match v {
            V::Missing {
                host,
                subscription,
                seq,
                ..
            } if host == SHARED_HOST => Some((subscription.clone(), *seq)),
            _ => None,
        })
        .collect();
    if missing.is_empty() {
        return String::new();
    }
    missing.sort();
    let mut out = vec!["\n--- shared delivery at the end ---".to_owned()];
    out.extend(views.iter().cloned());
    let claims = server.psql(
        "SELECT subscription, seq, host, incarnation, done, lost, deliveries, \
         claimed_until < now() FROM dws_claim ORDER BY subscription, seq",
    );
    // The incarnations running now: a claim of any other is a dead run's.
    let live: BTreeSet<String> = server
        .psql("SELECT incarnation FROM dws_host")
        .lines()
        .map(str::to_owned)
        .collect();
    let whose = |host: &str, inc: &str| {
        if live.contains(inc) {
            format!("{host} (incarnation {inc}, running)")
        } else {
            format!("{host} (incarnation {inc}, a dead run)")
        }
    };
    let by_seq: std::collections::HashMap<(String, u64), String> = claims
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let seq = f.get(1)?.parse().ok()?;
            let why = match (f.get(4)?, f.get(5)?, f.get(7)?) {
                (_, &"t", _) => "marked lost".to_owned(),
                (&"t", _, _) => format!("acked (done) on {}", f[2]),
                (_, _, &"t") => format!(
                    "claimed by {}, expired, never taken again",
                    whose(f[2], f[3])
                ),
                _ => format!("still held by {}", whose(f[2], f[3])),
            };
            Some(((f[0].to_owned(), seq), why))
        })
        .collect();
    // Runs of consecutive seqs with the same reason.
    let mut runs: Vec<(String, u64, u64, String)> = vec![];
    for (sub, seq) in missing {
        let why = by_seq
            .get(&(sub.clone(), seq))
            .cloned()
            .unwrap_or_else(|| "never claimed by any host".to_owned());
        match runs.last_mut() {
            Some((s, _, last, w)) if *s == sub && *last + 1 == seq && *w == why => *last = seq,
            _ => runs.push((sub, seq, seq, why)),
        }
    }
    for (sub, first, last, why) in runs.iter().take(20) {
        out.push(format!("{sub}: seqs {first}..={last}: {why}"));
    }
    if runs.len() > 20 {
        out.push(format!("… {} more runs", runs.len() - 20));
    }
    out.join("\n")
}

fn nothing(_: &PgServer) {}

#[test]
fn kill_9_of_owner_and_followers() {
    scenario("kill-9", &["a", "b"], &[Kind::KillBus], nothing);
}

#[test]
fn sigstop_of_owner_and_followers() {
    scenario("sigstop", &["a", "b"], &[Kind::FreezeBus], nothing);
}

#[test]
fn postgres_restarted_fast_immediate_and_killed() {
    scenario(
        "postgres-restart",
        &["a", "b"],
        &[Kind::PgRestartFast, Kind::PgRestartImmediate, Kind::PgKill],
        nothing,
    );
}

#[test]
fn busd_sessions_terminated() {
    scenario(
        "pg-terminate-backend",
        &["a", "b"],
        &[Kind::TerminateBackends],
        nothing,
    );
}

/// The server commits asynchronously (`synchronous_commit=off` in its
/// configuration) and is stopped immediately: the bus must commit
/// synchronously anyway, or refuse to run.
#[test]
fn asynchronous_commit_server_stopped_immediately() {
    scenario(
        "synchronous-commit-off",
        &["a", "b"],
        &[Kind::PgRestartImmediate, Kind::KillBus],
        |server| {
            server.psql("ALTER SYSTEM SET synchronous_commit = off;\nSELECT pg_reload_conf();");
        },
    );
}

/// Three hosts start at once on an empty database, then every fault.
#[test]
fn three_hosts_started_at_once_then_every_fault() {
    scenario(
        "three-hosts-every-fault",
        &["a", "b", "c"],
        &[
            Kind::KillBus,
            Kind::FreezeBus,
            Kind::PgRestartFast,
            Kind::TerminateBackends,
        ],
        nothing,
    );
}

/// The owner partitioned from PostgreSQL, then a follower with its
/// consumers attached, then both, then one direction of a host's path,
/// while every host publishes and consumes; then partitions of random
/// hosts, two at once, and one-way cuts.
#[test]
fn network_partitions_of_owner_and_followers() {
    let opts = Options {
        proxies: true,
        ..Options::default()
    };
    run_scenario(
        "network-partitions",
        &["a", "b"],
        opts,
        &seeds(),
        nothing,
        |cluster, seed| {
            let mut did = nemesis::partitions_in_turn(cluster, seed);
            did.extend(nemesis::run(
                cluster,
                &[Kind::Partition, Kind::PartitionTwo, Kind::OneWay],
                seed,
                fault_time(),
            ));
            did
        },
    );
}

/// A host's connections reset again and again, or slowed to 200 ± 150 ms,
/// with partitions in between.
#[test]
fn network_resets_and_latency() {
    scenario(
        "network-resets-latency",
        &["a", "b"],
        &[Kind::Resets, Kind::Latency, Kind::Partition],
        nothing,
    );
}

/// Three hosts, explicit acks, a per-host and a shared subscription, and a
/// seeded schedule of every fault, several at once (`schedule.rs`); with
/// `DWS_FAULTS_SECS` a soak of that length.
#[test]
fn mixed_schedule_of_every_fault() {
    let soak = std::env::var("DWS_FAULTS_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    let length = soak.map_or_else(|| fault_time() * 2, Duration::from_secs);
    let mut seeds = seeds();
    if soak.is_some() && std::env::var_os("DWS_FAULT_SEEDS").is_none() {
        seeds.truncate(1);
    }
    let opts = Options {
        proxies: true,
        explicit: true,
        shared: true,
    };
    run_scenario(
        "mixed",
        &["a", "b", "c"],
        opts,
        &seeds,
        nothing,
        |cluster, seed| {
            let names: Vec<String> = cluster.hosts.iter().map(|h| h.name.clone()).collect();
            let plan = schedule::Schedule::draw(seed, names.len(), length);
            eprintln!(
                "fault scenario mixed: seed {seed}, schedule:\n{}",
                plan.lines(&names).join("\n")
            );
            schedule::run(cluster, &plan)
        },
    );
}
