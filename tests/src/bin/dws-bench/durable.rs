//! Durable publishing: P publisher connections flood a bus with no
//! consumers (a PublishAck means the event is written, and fdatasync'ed on
//! the fsync store), and publish→ack latency at a fixed rate.

use std::{path::PathBuf, sync::Barrier, thread};

use serde_json::Value;

use crate::{
    fanout::Mode,
    opts::{Opts, StoreSel},
    procs::{
        bus_info, clock_ticks_per_sec, guarded, interrupted, proc_cpu_ticks, thread_cpu_us, BusEnv,
        CMD_TIMEOUT,
    },
    publisher::Publisher,
    report::{fmt_opt, percentile, size_name},
    table::{Col, Row, Table},
    unix_nanos, Res, EVENT_TYPE,
};

pub struct DurableResult {
    /// Acked publishes/s: events / (last ack − first send).
    pub rate: f64,
    pub ack_p50_us: f64,
    pub ack_p99_us: f64,
    pub ack_max_us: f64,
    pub acks: usize,
    /// busd's CPU µs per publish over the run (its whole process, from just
    /// before the first publish until the last ack).
    pub busd_cpu_us: Option<f64>,
    /// This benchmark's CPU µs per publish: the publishing threads and
    /// their ack readers. Printed next to busd's so a harness that costs
    /// more than it should shows (a 256 KiB buffer zeroed per ack once took
    /// 4–5 µs per publish and halved these rows).
    pub bench_cpu_us: Option<f64>,
}

/// Starts the bus of `env` without a consumer (by publishing one event of
/// another type through `dws event publish`) and checks it runs on `store`.
/// Returns the bus socket.
pub fn start_bus(env: &BusEnv, store: StoreSel) -> Res<PathBuf> {
    let r = env.run_dws(&["event", "publish", "bench.start"], CMD_TIMEOUT)?;
    if !r.ok {
        return Err(format!(
            "`dws event publish bench.start` failed ({:?}): {} {}\n{}",
            r.code,
            r.stdout.trim(),
            r.stderr.trim(),
            env.log_tail()
        ));
    }
    let status = env.status()?;
    if status["running"] != Value::Bool(true) {
        return Err(format!(
            "no bus running after `dws event publish`: {status}"
        ));
    }
    store.check(&status)?;
    Ok(bus_info(&status)?.0)
}

/// What one publisher thread of [`run_durable`] did: its first send and
/// last ack (unix ns), its write-to-ack latencies (ns) and its CPU µs.
type Published = (u64, u64, Vec<u64>, f64);

/// `publishers` connections to a fresh bus on `store` with no consumers
/// publish `events` events of `size` bytes between them (the first ones
/// take one more when it does not divide), each from its own thread: in
/// `Mode::Flood`, as fast as acks allow with at most `inflight` unacked per
/// connection, all starting together; in `Mode::Rate(r)`, at `r`/s each.
/// The events are not consumed; default retention drops old ones.
pub fn run_durable(
    store: StoreSel,
    size: usize,
    publishers: usize,
    events: u64,
    mode: Mode,
    inflight: u64,
) -> Res<DurableResult> {
    let mut env = BusEnv::new(&store.env());
    let socket = start_bus(&env, store)?;
    let bus_pid = bus_info(&env.status()?)?.1;
    let head_before = env.status()?["log"]["head_seq"].as_u64().unwrap_or(0);
    let mut pubs = Vec::with_capacity(publishers);
    for _ in 0..publishers {
        let mut p = Publisher::connect(&socket)?;
        p.track_latency();
        pubs.push(p);
    }
    let per = events / publishers as u64;
    let extra = events % publishers as u64;
    let start = Barrier::new(publishers);
    let busd_cpu0 = proc_cpu_ticks(bus_pid);
    let outcomes: Vec<Res<Published>> = thread::scope(|s| {
        let handles: Vec<_> = pubs
            .into_iter()
            .enumerate()
            .map(|(i, mut p)| {
                let n = per + u64::from((i as u64) < extra);
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let cpu0 = thread_cpu_us();
                    let first = match mode {
                        Mode::Flood => p.flood(n, size, inflight, None)?,
                        Mode::Rate(rate) => p.paced(n, size, rate, inflight)?,
                    };
                    let last = unix_nanos();
                    let lat = p.take_latencies();
                    let cpu = thread_cpu_us() - cpu0;
                    let reader = p.close().unwrap_or(f64::NAN);
                    Ok((first, last, lat, cpu + reader))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a publisher thread panicked".into()))
            })
            .collect()
    });
    let busd_ticks = busd_cpu0
        .zip(proc_cpu_ticks(bus_pid))
        .map(|(a, b)| b.saturating_sub(a));
    let mut first = u64::MAX;
    let mut last = 0;
    let mut lat = Vec::with_capacity(events as usize);
    let mut bench_cpu = 0.0;
    for (i, o) in outcomes.into_iter().enumerate() {
        let (f, l, mut v, cpu) =
            o.map_err(|e| format!("publisher {}: {e}\n{}", i + 1, env.log_tail()))?;
        first = first.min(f);
        last = last.max(l);
        lat.append(&mut v);
        bench_cpu += cpu;
    }
    let status = env.status()?;
    let head = status["log"]["head_seq"].as_u64().unwrap_or(0);
    if head < head_before + events {
        return Err(format!(
            "all {events} publishes acked, but the log head moved only from {head_before} to {head}"
        ));
    }
    if !status["store"]["last_error"].is_null() {
        return Err(format!("store error: {}", status["store"]["last_error"]));
    }
    if lat.len() as u64 != events {
        return Err(format!(
            "{} ack latencies recorded for {events} publishes",
            lat.len()
        ));
    }
    env.stop()?;
    lat.sort_unstable();
    Ok(DurableResult {
        rate: events as f64 / (last.saturating_sub(first).max(1) as f64 / 1e9),
        ack_p50_us: percentile(&lat, 0.50),
        ack_p99_us: percentile(&lat, 0.99),
        ack_max_us: lat.last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
        acks: lat.len(),
        busd_cpu_us: busd_ticks.map(|t| t as f64 / clock_ticks_per_sec() * 1e6 / events as f64),
        bench_cpu_us: Some(bench_cpu / events as f64).filter(|c| c.is_finite()),
    })
}

/// Runs `f` `runs` times and keeps the median result by `key`.
pub fn median_of<T>(runs: usize, key: impl Fn(&T) -> f64, f: impl Fn() -> Res<T>) -> Res<T> {
    let mut rs = (0..runs).map(|_| guarded(&f)).collect::<Res<Vec<_>>>()?;
    rs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    Ok(rs.swap_remove(rs.len() / 2))
}

/// Durable-publish throughput (durability × payload × publishers), the
/// `dws event publish --lines` row, and the publish→ack latency at a fixed
/// rate.
pub fn run_durable_sections(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    if !opts.only_latency && !opts.only_lines {
        run_floods(opts, failures, table);
    }
    if !opts.only_latency && !interrupted() {
        crate::lines::run_lines_row(opts, failures);
    }
    if !opts.only_lines {
        run_ack_latency(opts, failures, table);
    }
}

/// The durable floods: durability × payload × publishers.
fn run_floods(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    println!();
    println!(
        "Durable publish: P publisher connections flood `{EVENT_TYPE}` (pipelined, ≤{} unacked each), no consumers, disk store",
        opts.inflight
    );
    println!(
        "(publishes/s = events / (last PublishAck − first send); ack µs = frame written → its PublishAck read, \
         under saturation; median of {} run(s) by publishes/s, each on a fresh bus; CPU µs per publish of busd \
         and of this benchmark's publishers, its own threads and ack readers, so the harness's share shows)",
        opts.durable_runs
    );
    println!();
    println!(
        "{:>10}  {:>7}  {:>10}  {:>7}  {:>12}  {:>8}  {:>10}  {:>10}  {:>10}  {:>11}  {:>12}",
        "durability",
        "payload",
        "publishers",
        "events",
        "publishes/s",
        "MiB/s",
        "ack p50 µs",
        "ack p99 µs",
        "ack max µs",
        "busd µs/pub",
        "bench µs/pub"
    );
    for store in durable_stores(opts) {
        for &size in &[256usize, 4096] {
            for &p in &opts.durable_publishers {
                if interrupted() {
                    return;
                }
                let events = if size == 256 {
                    opts.durable_events_small
                } else {
                    opts.durable_events_large
                };
                let result = median_of(
                    opts.durable_runs,
                    |r: &DurableResult| r.rate,
                    || run_durable(store, size, p, events, Mode::Flood, opts.inflight),
                );
                if let (Ok(r), StoreSel::DISK_FSYNC, 256) = (&result, store, size) {
                    table.record_durable_flood(p, r.rate);
                }
                match result {
                    Ok(r) => println!(
                        "{:>10}  {:>7}  {:>10}  {:>7}  {:>12.0}  {:>8.1}  {:>10.0}  {:>10.0}  {:>10.0}  {:>11}  {:>12}",
                        store.durability,
                        size_name(size),
                        p,
                        events,
                        r.rate,
                        r.rate * size as f64 / (1024.0 * 1024.0),
                        r.ack_p50_us,
                        r.ack_p99_us,
                        r.ack_max_us,
                        fmt_opt(r.busd_cpu_us, 2),
                        fmt_opt(r.bench_cpu_us, 2)
                    ),
                    Err(e) => {
                        println!(
                            "{:>10}  {:>7}  {:>10}  {:>7}  FAILED (see below)",
                            store.durability,
                            size_name(size),
                            p,
                            events
                        );
                        failures.push(format!(
                            "durable publish durability={} payload={} publishers={p}: {e}",
                            store.durability,
                            size_name(size)
                        ));
                    }
                }
            }
        }
    }
}

/// Publish→ack at a fixed rate on each durable store; on the fsync store
/// next to raw fdatasync at the same rate.
fn run_ack_latency(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    let events = ((opts.durable_rate as f64 * opts.rate_secs).round() as u64).max(1);
    println!();
    println!(
        "Publish→ack latency at a fixed rate: 1 publisher, {} publishes/s for {:.1} s, 256 B, no consumers, disk store",
        opts.durable_rate, opts.rate_secs
    );
    for store in durable_stores(opts) {
        if interrupted() {
            return;
        }
        match guarded(|| {
            run_durable(
                store,
                256,
                1,
                events,
                Mode::Rate(opts.durable_rate),
                opts.inflight,
            )
        }) {
            Ok(r) => {
                if store == StoreSel::DISK_FSYNC {
                    table.set(Row::AckP50, Col::BusDisk, Some(r.ack_p50_us));
                    table.set(Row::AckP99, Col::BusDisk, Some(r.ack_p99_us));
                }
                println!(
                    "  {:<5}  p50 {:.0} µs   p99 {:.0} µs   max {:.0} µs   ({} acks)",
                    store.durability, r.ack_p50_us, r.ack_p99_us, r.ack_max_us, r.acks
                );
                if store == StoreSel::DISK_FSYNC && !interrupted() {
                    crate::fsync_floor::print_floor(
                        opts.durable_rate,
                        opts.rate_secs,
                        r.ack_p99_us,
                        failures,
                    );
                }
            }
            Err(e) => {
                println!("  {:<5}  FAILED (see below)", store.durability);
                failures.push(format!(
                    "publish→ack latency durability={}: {e}",
                    store.durability
                ));
            }
        }
    }
}

/// The stores of the durable-publish section: the disk store fsynced and
/// not, and the cluster store with `--store postgres`.
pub fn durable_stores(opts: &Opts) -> Vec<StoreSel> {
    let mut stores = vec![StoreSel::DISK_FSYNC, StoreSel::DISK_NONE];
    if opts.store == StoreSel::POSTGRES {
        stores.push(StoreSel::POSTGRES);
    }
    stores
}
