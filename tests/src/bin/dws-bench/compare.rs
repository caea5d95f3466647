//! Side-by-side runs: the flood fan-out on the memory store vs the disk
//! store (and postgres, with its failover time), and without vs with
//! `--where EXPR` on every consumer.

use std::{
    thread,
    time::{Duration, Instant},
};

use crate::{
    durable::{median_of, start_bus},
    fanout::{run_fanout, run_fanout_with, FanoutResult, Mode},
    opts::{Opts, StoreSel},
    procs::{guarded, interrupted, BusEnv},
    Res, POLL,
};

/// Two hosts of one cluster: the owner's busd is killed with SIGKILL; the
/// time until the other host's status says it owns the cluster.
fn measure_failover() -> Res<Duration> {
    let mut env = StoreSel::POSTGRES.env();
    env.retain(|(k, _)| *k != "DWS_CLUSTER_HOST");
    let mut a_env = env.clone();
    a_env.push(("DWS_CLUSTER_HOST", "host-a"));
    let a = BusEnv::new(&a_env);
    let cluster = std::fs::read_to_string(a.env.cfg_dir().join("config.toml"))
        .map_err(|e| format!("cannot read host-a's config: {e}"))?;
    let mut b_env = env;
    b_env.push(("DWS_CLUSTER_HOST", "host-b"));
    let b = BusEnv::new(&b_env);
    std::fs::write(b.env.cfg_dir().join("config.toml"), cluster)
        .map_err(|e| format!("cannot write host-b's config: {e}"))?;
    start_bus(&a, StoreSel::POSTGRES)?;
    let role = |env: &BusEnv| -> Res<String> {
        Ok(env.status()?["cluster"]["role"]
            .as_str()
            .unwrap_or("")
            .to_owned())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while role(&a)? != "owner" {
        if Instant::now() >= deadline {
            return Err(format!("host-a never became the owner\n{}", a.log_tail()));
        }
        thread::sleep(POLL);
    }
    start_bus(&b, StoreSel::POSTGRES)?;
    let pids = a.env.busd_pids();
    let killed = Instant::now();
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    while role(&b)? != "owner" {
        if killed.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "host-b did not take over within 30 s\n{}",
                b.log_tail()
            ));
        }
        thread::sleep(POLL);
    }
    Ok(killed.elapsed())
}

/// The flood fan-out on the memory store and on the disk store (fsync).
pub fn run_store_compare(opts: &Opts, failures: &mut Vec<String>) {
    let n = opts.compare_consumers;
    let events = opts.events_small;
    println!();
    println!(
        "Fan-out, disk store vs memory store: 1 publisher (≤{} in flight) → {n} consumers, {events} × 256 B \
         (median of {} run(s) by deliveries/s)",
        opts.inflight, opts.runs
    );
    println!();
    println!(
        "{:>14}  {:>13}  {:>15}  {:>9}  {:>9}",
        "store", "ev/s/cons avg", "deliveries/s", "p50 µs", "p99 µs"
    );
    let mut rates = Vec::new();
    let mut stores = vec![StoreSel::MEMORY, StoreSel::DISK_FSYNC];
    if opts.store == StoreSel::POSTGRES {
        stores.push(StoreSel::POSTGRES);
    }
    for store in stores {
        if interrupted() {
            return;
        }
        let name = match store.kind {
            "memory" => "memory".to_string(),
            k => format!("{k}, {}", store.durability),
        };
        let result = median_of(
            opts.runs,
            |r: &FanoutResult| r.aggregate,
            || run_fanout(n, 256, events, Mode::Flood, opts.inflight, store),
        );
        match result {
            Ok(r) => {
                println!(
                    "{:>14}  {:>13.0}  {:>15.0}  {:>9.0}  {:>9.0}",
                    name, r.per_consumer_avg, r.aggregate, r.p50_us, r.p99_us
                );
                rates.push(r.aggregate);
            }
            Err(e) => {
                println!("{name:>14}  FAILED (see below)");
                failures.push(format!("fan-out store comparison, {name}: {e}"));
            }
        }
    }
    if let [memory, disk, ..] = rates[..] {
        println!("  disk/memory deliveries/s: {:.2}", disk / memory);
    }
    if let [_, disk, postgres] = rates[..] {
        println!("  postgres/disk deliveries/s: {:.2}", postgres / disk);
    }
    if opts.store == StoreSel::POSTGRES && !interrupted() {
        match guarded(measure_failover) {
            Ok(t) => println!(
                "\nFailover (postgres): the owner's busd killed with -9 → the other host owns the cluster: {:.0} ms",
                t.as_secs_f64() * 1000.0
            ),
            Err(e) => failures.push(format!("failover: {e}")),
        }
    }
}

/// The flood fan-out without and with `--where EXPR` on every consumer:
/// what the bus spends per delivery on one evaluation.
pub fn run_where_compare(opts: &Opts, expr: &str, failures: &mut Vec<String>) {
    let n = opts.compare_consumers;
    let events = opts.events_small;
    println!();
    println!(
        "Fan-out without and with --where {expr:?} on every consumer: 1 publisher (≤{} in flight) → \
         {n} consumers, {events} × 256 B, {} (median of {} run(s) by deliveries/s)",
        opts.inflight,
        opts.store.describe(),
        opts.runs
    );
    println!();
    println!(
        "{:>8}  {:>13}  {:>15}  {:>9}  {:>9}  {:>12}  {:>9}",
        "where", "ev/s/cons avg", "deliveries/s", "p50 µs", "p99 µs", "cpu µs/deliv", "busd part"
    );
    let mut busd = Vec::new();
    for (name, extra) in [("none", vec![]), ("--where", vec!["--where", expr])] {
        if interrupted() {
            return;
        }
        let result = median_of(
            opts.runs,
            |r: &FanoutResult| r.aggregate,
            || {
                run_fanout_with(
                    n,
                    256,
                    events,
                    Mode::Flood,
                    opts.inflight,
                    opts.store,
                    &extra,
                )
            },
        );
        match result {
            Ok(r) => {
                let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
                println!(
                    "{:>8}  {:>13.0}  {:>15.0}  {:>9.0}  {:>9.0}  {:>12}  {:>9}",
                    name,
                    r.per_consumer_avg,
                    r.aggregate,
                    r.p50_us,
                    r.p99_us,
                    f(r.cpu_us_per_delivery),
                    f(r.busd_cpu_us_per_delivery)
                );
                busd.push(r.busd_cpu_us_per_delivery);
            }
            Err(e) => {
                println!("{name:>8}  FAILED (see below)");
                failures.push(format!("fan-out with --where, {name}: {e}"));
            }
        }
    }
    if let [Some(without), Some(with)] = busd[..] {
        println!(
            "  --where costs busd {:.2} µs per delivery (one evaluation per event and consumer)",
            with - without
        );
    }
}
