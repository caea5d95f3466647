//! The fan-out scenario: one publisher floods (or paces) `bench.x` events to
//! N real `dws event consume` processes; deliveries/s, latency, CPU per
//! delivery and busd's peak RSS, and the median over runs.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use crate::{
    opts::StoreSel,
    procs::{
        bus_info, check_interrupted, clock_ticks_per_sec, guarded, proc_cpu_ticks, proc_switches,
        read_proc_kb, thread_cpu_us, BusEnv, Consumer,
    },
    publisher::Publisher,
    reader::{spawn_reader, ReadResult},
    report::{median, percentile},
    Res,
};

/// How long consumers may take to deliver everything after the last publish.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the consumers may go without printing anything while events are due.
const STALL_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a consumer may take to exit after its last event.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct FanoutResult {
    pub per_consumer_avg: f64,
    pub per_consumer_min: f64,
    pub aggregate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub busd_hwm_kb: Option<u64>,
    /// The bus ran with retention raised to hold every event.
    pub retention_raised: bool,
    /// CPU µs of busd and all consumer processes per delivery, from just
    /// before the first publish until the consumers exited.
    pub cpu_us_per_delivery: Option<f64>,
    /// The same plus this benchmark's publisher threads (the publishing one
    /// and its ack reader): comparable with peers that count their publisher.
    pub cpu_with_pub_us_per_delivery: Option<f64>,
    /// busd's part of `cpu_us_per_delivery`.
    pub busd_cpu_us_per_delivery: Option<f64>,
    /// The clock ticks behind `cpu_us_per_delivery` (the fewest of the runs
    /// in a table row): below [`COARSE_CPU_TICKS`] the figure is coarse.
    pub cpu_ticks: Option<u64>,
    /// Events the log held when the consumers were done (all of them when
    /// retention was raised), from the bus status.
    pub retained_events: Option<u64>,
    /// Context switches per delivery (its threads' sleeps and wake-ups)
    /// of busd, and of every consumer, from just before the first publish
    /// until the last publish was acknowledged (see [`proc_switches`]).
    pub busd_switches_per_delivery: Option<f64>,
    pub consumer_switches_per_delivery: Option<f64>,
}

/// CPU figures measured from fewer clock ticks than this are marked coarse:
/// every process's figure is only good to ±1 tick.
pub const COARSE_CPU_TICKS: u64 = 20;

#[derive(Clone, Copy)]
pub enum Mode {
    Flood,
    Rate(u64),
}

/// Waits for the reader results of `consumers` (bounded) and checks every
/// consumer got exactly `events` events and exited 0. Fails early when the
/// consumers stop making progress or one of them loses events to retention.
pub fn collect(
    rx: &mpsc::Receiver<(usize, ReadResult)>,
    progress: &[Arc<AtomicU64>],
    consumers: &mut [Consumer],
    events: u64,
    env: &BusEnv,
) -> Res<Vec<ReadResult>> {
    let n = consumers.len();
    let mut results: Vec<Option<ReadResult>> = (0..n).map(|_| None).collect();
    let started = Instant::now();
    let deadline = started + DELIVERY_TIMEOUT;
    let total = || {
        progress
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let (mut last_total, mut last_change) = (total(), Instant::now());
    let mut next_status = started + Duration::from_secs(2);
    let pids: Vec<i64> = consumers.iter().map(|c| c.pid() as i64).collect();
    let mut got = 0;
    while got < n {
        check_interrupted()?;
        let why = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((i, r)) => {
                results[i] = Some(r);
                got += 1;
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => "a reader thread vanished".to_string(),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                let t = total();
                if t != last_total {
                    (last_total, last_change) = (t, now);
                }
                let mut why = None;
                if now >= deadline {
                    why = Some(format!("timed out after {DELIVERY_TIMEOUT:?}"));
                } else if now - last_change >= STALL_TIMEOUT {
                    why = Some(format!(
                        "no consumer printed anything for {STALL_TIMEOUT:?}"
                    ));
                } else if now >= next_status {
                    // Slow to finish: is it because events were evicted?
                    next_status = now + Duration::from_secs(2);
                    let status = env.status()?;
                    let lost: Vec<String> = status["subscriptions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|s| {
                            s["attached_pid"]
                                .as_i64()
                                .is_some_and(|p| pids.contains(&p))
                        })
                        .filter(|s| s["lost_to_retention"].as_u64().unwrap_or(0) > 0)
                        .map(|s| {
                            format!("pid {} lost {}", s["attached_pid"], s["lost_to_retention"])
                        })
                        .collect();
                    if !lost.is_empty() {
                        why = Some(format!(
                            "consumers lost events to log retention ({}): the publisher outran them by more than the \
                             log holds; use fewer events or raise DWS_EVENT_BUS_RETENTION_EVENTS/BYTES",
                            lost.join(", ")
                        ));
                    }
                }
                match why {
                    Some(w) => w,
                    None => continue,
                }
            }
        };
        let status = env.status().map_or_else(
            |e| e,
            |s| {
                format!(
                    "consumers: {}, subscriptions: {}",
                    s["consumers"], s["subscriptions"]
                )
            },
        );
        let missing: Vec<String> = consumers
            .iter_mut()
            .zip(&results)
            .zip(progress)
            .filter(|((_, r), _)| r.is_none())
            .map(|((c, _), p)| {
                let state = c.exited().map_or("running".into(), |s| s.to_string());
                format!(
                    "pid {} ({state}, {} of {events} lines)",
                    c.pid(),
                    p.load(Ordering::Relaxed)
                )
            })
            .collect();
        return Err(format!(
            "{why}: {} of {n} consumers did not finish: {}\nbus status: {status}\n{}",
            missing.len(),
            missing.join(", "),
            env.log_tail()
        ));
    }
    let mut out = Vec::with_capacity(n);
    let mut problems = Vec::new();
    for (c, r) in consumers.iter_mut().zip(results) {
        let r = r.unwrap_or_default();
        let st = c.wait_exit(EXIT_TIMEOUT);
        if r.lines != events {
            problems.push(format!(
                "consumer pid {} printed {} of {events} events",
                c.pid(),
                r.lines
            ));
        }
        if let Some(e) = &r.error {
            problems.push(format!("consumer pid {}: {e}", c.pid()));
        }
        match st {
            Some(s) if s.success() => {}
            Some(s) => problems.push(format!("consumer exited with {s}:\n{}", c.report())),
            None => problems.push(format!(
                "consumer pid {} still running {EXIT_TIMEOUT:?} after its stdout closed",
                c.pid()
            )),
        }
        out.push(r);
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("\n"))
    }
}

/// Retention bounds that hold `events` events of `size` bytes when the bus
/// defaults (100 000 events, 64 MiB) would not: a flooding publisher is never
/// throttled by consumers, so a long run would otherwise make the consumers
/// lose events to retention instead of measuring them.
pub fn retention_for(events: u64, size: usize) -> Option<(String, String)> {
    let bytes = events.saturating_mul(size as u64 + 1024);
    (events > 100_000 || bytes > 64 << 20)
        .then(|| ((events + 1024).to_string(), bytes.max(64 << 20).to_string()))
}

/// The fixed-rate latency run of `opts` (its rate, duration and
/// consumers, 256 B events) on `store`, guarded against panics.
pub fn run_fixed_rate(opts: &crate::opts::Opts, store: StoreSel) -> Res<FanoutResult> {
    let events = ((opts.rate as f64 * opts.rate_secs).round() as u64).max(1);
    crate::procs::guarded(|| {
        run_fanout(
            opts.rate_consumers,
            256,
            events,
            Mode::Rate(opts.rate),
            opts.inflight,
            store,
        )
    })
}

pub fn run_fanout(
    n: usize,
    size: usize,
    events: u64,
    mode: Mode,
    inflight: u64,
    store: StoreSel,
) -> Res<FanoutResult> {
    run_fanout_with(n, size, events, mode, inflight, store, &[])
}

/// [`run_fanout`] with `extra` on every consumer's command line.
pub fn run_fanout_with(
    n: usize,
    size: usize,
    events: u64,
    mode: Mode,
    inflight: u64,
    store: StoreSel,
    extra: &[&str],
) -> Res<FanoutResult> {
    let retention = retention_for(events, size);
    let mut vars = store.env().to_vec();
    if let Some((ev, bytes)) = &retention {
        vars.push(("DWS_EVENT_BUS_RETENTION_EVENTS", ev.as_str()));
        vars.push(("DWS_EVENT_BUS_RETENTION_BYTES", bytes.as_str()));
    }
    let mut env = BusEnv::new(&vars);
    let max = events.to_string();
    let mut args = vec!["--max-events", max.as_str()];
    args.extend_from_slice(extra);
    let mut consumers = Vec::with_capacity(n);
    // The first consumer starts the bus; the others join it.
    consumers.push(Consumer::spawn(&env, &args)?);
    env.wait_consumers(1, &mut consumers)?;
    for _ in 1..n {
        consumers.push(Consumer::spawn(&env, &args)?);
    }
    let status = env.wait_consumers(n, &mut consumers)?;
    store.check(&status)?;
    let (socket, bus_pid) = bus_info(&status)?;

    let (tx, rx) = mpsc::channel();
    let progress: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::default()).collect();
    for (i, c) in consumers.iter_mut().enumerate() {
        let out = c.take_stdout()?;
        spawn_reader(progress[i].clone(), i, out, size, events, tx.clone());
    }
    drop(tx);

    // CPU baselines: busd and every consumer, and this (publishing) thread.
    let busd_cpu0 = proc_cpu_ticks(bus_pid);
    let consumers_cpu0: Vec<Option<u64>> = consumers.iter_mut().map(|c| c.cpu_ticks()).collect();
    let pub_cpu0 = thread_cpu_us();
    let busd_sw0 = proc_switches(bus_pid);
    let consumers_sw0: Option<u64> = consumers
        .iter()
        .map(|c| proc_switches(c.pid().into()))
        .sum();
    let mut publisher = Publisher::connect(&socket)?;
    let first_send = match mode {
        Mode::Flood => publisher.flood(events, size, inflight, None)?,
        Mode::Rate(rate) => publisher.paced(events, size, rate, inflight)?,
    };
    // Before the consumers exit (a zombie's threads are gone from /proc).
    let busd_sw = busd_sw0
        .zip(proc_switches(bus_pid))
        .map(|(a, b)| b.saturating_sub(a));
    let consumers_sw: Option<u64> = consumers
        .iter()
        .map(|c| proc_switches(c.pid().into()))
        .sum();
    let consumers_sw = consumers_sw0
        .zip(consumers_sw)
        .map(|(a, b)| b.saturating_sub(a));
    let pub_cpu_us = thread_cpu_us() - pub_cpu0 + publisher.close().unwrap_or(f64::NAN);

    let results = collect(&rx, &progress, &mut consumers, events, &env)?;
    let busd_hwm_kb = read_proc_kb(bus_pid, "VmHWM");
    let retained_events = env.status().ok().and_then(|s| s["log"]["events"].as_u64());
    // The consumers have exited (collect waited for each), busd still runs.
    let mut ticks = busd_cpu0
        .zip(proc_cpu_ticks(bus_pid))
        .map(|(a, b)| b.saturating_sub(a));
    let busd_ticks = ticks;
    for (c, before) in consumers.iter_mut().zip(consumers_cpu0) {
        let used = before.zip(c.cpu_ticks()).map(|(a, b)| b.saturating_sub(a));
        ticks = ticks.zip(used).map(|(t, u)| t + u);
    }
    env.stop()?;
    let deliveries = (n as u64 * events) as f64;
    let cpu_us_per_delivery = ticks.map(|t| t as f64 / clock_ticks_per_sec() * 1e6 / deliveries);
    let cpu_with_pub_us_per_delivery = cpu_us_per_delivery
        .map(|c| c + pub_cpu_us / deliveries)
        .filter(|c| c.is_finite());
    let busd_cpu_us_per_delivery =
        busd_ticks.map(|t| t as f64 / clock_ticks_per_sec() * 1e6 / deliveries);

    let rates: Vec<f64> = results
        .iter()
        .map(|r| events as f64 / (r.last_recv_ns.saturating_sub(first_send).max(1) as f64 / 1e9))
        .collect();
    let last = results
        .iter()
        .map(|r| r.last_recv_ns)
        .max()
        .unwrap_or(first_send);
    let mut lat: Vec<u64> = results.into_iter().flat_map(|r| r.latencies).collect();
    lat.sort_unstable();
    Ok(FanoutResult {
        per_consumer_avg: rates.iter().sum::<f64>() / rates.len() as f64,
        per_consumer_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
        aggregate: (n as u64 * events) as f64
            / (last.saturating_sub(first_send).max(1) as f64 / 1e9),
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        max_us: lat.last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
        busd_hwm_kb,
        retention_raised: retention.is_some(),
        cpu_us_per_delivery,
        cpu_with_pub_us_per_delivery,
        busd_cpu_us_per_delivery,
        cpu_ticks: ticks,
        retained_events,
        busd_switches_per_delivery: busd_sw.map(|s| s as f64 / deliveries),
        consumer_switches_per_delivery: consumers_sw.map(|s| s as f64 / deliveries),
    })
}

impl FanoutResult {
    pub fn cpu_coarse(&self) -> bool {
        self.cpu_ticks.is_some_and(|t| t < COARSE_CPU_TICKS)
    }
}

/// [`run_fanout`] `runs` times (each on a fresh bus): the median run by
/// deliveries/s, with the CPU figures the medians of their own and the
/// fewest clock ticks of the runs (short runs on a shared 2-core machine
/// are noisy).
pub fn run_fanout_median(
    runs: usize,
    n: usize,
    size: usize,
    events: u64,
    inflight: u64,
    store: StoreSel,
) -> Res<FanoutResult> {
    let mut rs = (0..runs.max(1))
        .map(|_| guarded(|| run_fanout(n, size, events, Mode::Flood, inflight, store)))
        .collect::<Res<Vec<_>>>()?;
    let cpu = median(rs.iter().filter_map(|r| r.cpu_us_per_delivery).collect());
    let cpu_pub = median(
        rs.iter()
            .filter_map(|r| r.cpu_with_pub_us_per_delivery)
            .collect(),
    );
    let busd_cpu = median(
        rs.iter()
            .filter_map(|r| r.busd_cpu_us_per_delivery)
            .collect(),
    );
    let ticks = rs.iter().filter_map(|r| r.cpu_ticks).min();
    rs.sort_by(|a, b| a.aggregate.total_cmp(&b.aggregate));
    let mut r = rs.swap_remove(rs.len() / 2);
    r.cpu_ticks = ticks;
    r.cpu_us_per_delivery = cpu;
    r.cpu_with_pub_us_per_delivery = cpu_pub;
    r.busd_cpu_us_per_delivery = busd_cpu;
    Ok(r)
}
