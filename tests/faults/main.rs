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

mod nemesis;
mod workload;

use std::time::Duration;

use dws_tests::{history::Outcome, pg::PgServer};
use nemesis::Kind;
use workload::Cluster;

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
    for seed in seeds() {
        eprintln!("fault scenario {name}: seed {seed} (replay with DWS_FAULT_SEED={seed} DWS_FAULT_SEEDS=1)");
        let server = PgServer::start();
        setup(&server);
        let mut cluster = Cluster::start(server, hosts, HOST_ENV);
        let did = nemesis::run(&mut cluster, kinds, seed, fault_time());
        let (history, server, hosts) = cluster.finish();
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
        panic!(
            "fault scenario {name}, seed {seed}: {} violation(s), {answered} answered publishes\n\
             {}\n--- faults ---\n{}\n{}\n--- postgres ---\n{}",
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
