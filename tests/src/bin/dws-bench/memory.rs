//! Memory with a stalled consumer: one fast consumer and one whose stdout
//! is never read; busd's peak RSS, per retained event too, and what the
//! stalled subscription was told it lost.

use std::sync::{atomic::AtomicU64, mpsc, Arc};

use serde_json::Value;

use crate::{
    fanout::collect,
    procs::{bus_info, read_proc_kb, BusEnv, Consumer},
    publisher::Publisher,
    reader::spawn_reader,
    report::{kb, percentile},
    Res,
};

pub struct MemoryResult {
    fast_received: u64,
    fast_rate: f64,
    fast_p99_us: f64,
    busd_rss_before_kb: Option<u64>,
    busd_hwm_kb: Option<u64>,
    busd_rss_after_kb: Option<u64>,
    stalled: Value,
    log: Value,
}

pub fn run_memory(events: u64, retention: u64, inflight: u64) -> Res<MemoryResult> {
    let retention_s = retention.to_string();
    let mut env = BusEnv::new(&[("DWS_EVENT_BUS_RETENTION_EVENTS", &retention_s)]);
    let max = events.to_string();
    let mut consumers = Vec::with_capacity(2);
    consumers.push(Consumer::spawn(&env, &["--max-events", &max])?);
    env.wait_consumers(1, &mut consumers)?;
    // The stalled one: unbounded, stdin /dev/null (no EOF exit), its stdout
    // pipe held here and never read.
    consumers.push(Consumer::spawn(&env, &[])?);
    let status = env.wait_consumers(2, &mut consumers)?;
    let (socket, bus_pid) = bus_info(&status)?;
    let stalled_pid = consumers[1].pid();
    let busd_rss_before_kb = read_proc_kb(bus_pid, "VmRSS");

    let (tx, rx) = mpsc::channel();
    let out = consumers[0].take_stdout()?;
    let progress: Arc<AtomicU64> = Arc::default();
    spawn_reader(progress.clone(), 0, out, 256, events, tx);

    let mut publisher = Publisher::connect(&socket)?;
    // Paced by the fast consumer so that it, unlike the stalled one, never
    // falls further behind than half the retention.
    let first_send = publisher.flood(
        events,
        256,
        inflight,
        Some((&progress, (retention / 2).max(1))),
    )?;
    publisher.close();

    let results = collect(
        &rx,
        std::slice::from_ref(&progress),
        &mut consumers[..1],
        events,
        &env,
    )?;
    let fast = &results[0];
    let busd_hwm_kb = read_proc_kb(bus_pid, "VmHWM");
    let busd_rss_after_kb = read_proc_kb(bus_pid, "VmRSS");
    let status = env.status()?;
    if consumers[1].exited().is_some() {
        return Err(format!(
            "the stalled consumer exited:\n{}",
            consumers[1].report()
        ));
    }
    let stalled = status["subscriptions"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["attached_pid"].as_i64() == Some(stalled_pid as i64)))
        .cloned()
        .ok_or_else(|| format!("no subscription attached to the stalled consumer (pid {stalled_pid}) in status: {}", status["subscriptions"]))?;
    let log = status["log"].clone();

    // End the stalled consumer (the harness's guard kills it).
    drop(consumers);
    env.stop()?;

    let mut lat = fast.latencies.clone();
    lat.sort_unstable();
    let r = MemoryResult {
        fast_received: fast.lines,
        fast_rate: events as f64
            / (fast.last_recv_ns.saturating_sub(first_send).max(1) as f64 / 1e9),
        fast_p99_us: percentile(&lat, 0.99),
        busd_rss_before_kb,
        busd_hwm_kb,
        busd_rss_after_kb,
        stalled,
        log,
    };
    let lost = r.stalled["lost_to_retention"].as_u64().unwrap_or(0);
    let log_events = r.log["events"].as_u64().unwrap_or(0);
    let mut problems = Vec::new();
    if events > retention + 2 * inflight.max(1024) && lost == 0 {
        problems.push(format!(
            "the stalled subscription reports lost_to_retention = 0 although {events} events went through a log of {retention}"
        ));
    }
    // The log may exceed retention by at most one pinned window (default 1024).
    if log_events > retention + 1024 {
        problems.push(format!(
            "the log holds {log_events} events, more than retention {retention} + one window"
        ));
    }
    if problems.is_empty() {
        Ok(r)
    } else {
        Err(format!("{}\n{}", problems.join("\n"), describe_memory(&r)))
    }
}

pub fn describe_memory(r: &MemoryResult) -> String {
    let s = &r.stalled;
    format!(
        "  fast consumer:       received {} events, {:.0} ev/s, p99 {:.0} µs\n\
         \x20 stalled consumer:    matched {}, delivered {}, in_flight {}, pending {}, lag {}, lost_to_retention {}\n\
         \x20 log:                 events {} (max {}), bytes {} (max {})\n\
         \x20 busd RSS:            {} before publishing, {} after; peak (VmHWM) {}\n\
         \x20 per retained event:  {} (peak RSS / the {} events the log holds; payload 256 B)",
        r.fast_received,
        r.fast_rate,
        r.fast_p99_us,
        s["matched"],
        s["delivered"],
        s["in_flight"],
        s["pending"],
        s["lag"],
        s["lost_to_retention"],
        r.log["events"],
        r.log["max_events"],
        r.log["bytes"],
        r.log["max_bytes"],
        kb(r.busd_rss_before_kb),
        kb(r.busd_rss_after_kb),
        kb(r.busd_hwm_kb),
        rss_per_event(r.busd_hwm_kb, r.log["events"].as_u64())
            .map_or("?".into(), |b| format!("{b:.0} B")),
        r.log["events"],
    )
}

/// Peak RSS (kB) per retained event, in bytes.
pub fn rss_per_event(hwm_kb: Option<u64>, events: Option<u64>) -> Option<f64> {
    let (kb, n) = (hwm_kb?, events.filter(|n| *n > 0)?);
    Some(kb as f64 * 1024.0 / n as f64)
}
