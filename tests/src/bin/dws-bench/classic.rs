//! The classic sections: the fan-out table (N × payload on `--store`), the
//! fixed-rate latency run and the memory run with a stalled consumer.

use crate::{
    fanout::{run_fanout_median, run_fixed_rate, FanoutResult},
    fsync_floor,
    memory::{describe_memory, run_memory},
    opts::{Opts, StoreSel},
    procs::{clock_ticks_per_sec, guarded, interrupted},
    report::{fmt_cpu, kb, size_name, COARSE_NOTE},
    table::{Col, Row, Table},
};

/// The fan-out table, the fixed-rate latency run and the memory run; what
/// the peer comparison table needs goes into `table` too.
pub fn run_classic_sections(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    if !opts.only_latency {
        fanout_table(opts, failures, table);
    }
    if !opts.skip_latency && !interrupted() {
        let events = ((opts.rate as f64 * opts.rate_secs).round() as u64).max(1);
        println!();
        println!(
            "Latency at a fixed rate: {} events/s for {:.1} s, {} consumers, 256 B, {}",
            opts.rate,
            opts.rate_secs,
            opts.rate_consumers,
            opts.store.describe()
        );
        println!(
            "(cpu µs/deliv: busd + consumers as in the table above; the publisher, this benchmark, not counted)"
        );
        match run_fixed_rate(opts, opts.store) {
            Ok(r) => {
                println!(
                    "  p50 {:.0} µs   p99 {:.0} µs   max {:.0} µs   cpu {} µs/deliv, busd part {}   ({} deliveries; busd peak {})",
                    r.p50_us,
                    r.p99_us,
                    r.max_us,
                    fmt_cpu(r.cpu_us_per_delivery, &r),
                    fmt_cpu(r.busd_cpu_us_per_delivery, &r),
                    events * opts.rate_consumers as u64,
                    kb(r.busd_hwm_kb)
                );
                println!(
                    "  context switches per delivery (sleeps and wake-ups of every thread): busd {}, consumers {}",
                    fmt_switches(r.busd_switches_per_delivery),
                    fmt_switches(r.consumer_switches_per_delivery)
                );
                if r.cpu_coarse() {
                    println!("{COARSE_NOTE}");
                }
                table.record_latency(opts.store, &r);
                if opts.store == StoreSel::DISK_FSYNC && !interrupted() {
                    fsync_floor(opts, &r, failures, table);
                }
            }
            Err(e) => {
                println!("  FAILED (see below)");
                failures.push(format!("fixed-rate latency: {e}"));
            }
        }
    }

    if !opts.skip_memory && !interrupted() {
        println!();
        println!(
            "Memory with a stalled consumer: {} × 256 B events, 1 fast + 1 stalled consumer (stdout never read), retention {} events, disk store, fsync",
            opts.memory_events, opts.memory_retention
        );
        match guarded(|| run_memory(opts.memory_events, opts.memory_retention, opts.inflight)) {
            Ok(r) => println!("{}", describe_memory(&r)),
            Err(e) => {
                println!("  FAILED (see below)");
                failures.push(format!("stalled-consumer memory: {e}"));
            }
        }
    }
}

fn fmt_switches(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.2}"))
}

/// The disk store's floor at the fixed rate (see [`fsync_floor`]), in the
/// table's "fdatasync alone" column.
fn fsync_floor(opts: &Opts, r: &FanoutResult, failures: &mut Vec<String>, table: &mut Table) {
    if let Some(w) = fsync_floor::print_floor(opts.rate, opts.rate_secs, r.p99_us, failures) {
        table.set(Row::LatP50, Col::Fsync, Some(w.p50_us));
        table.set(Row::LatP99, Col::Fsync, Some(w.p99_us));
    }
}

/// The fan-out table: N × payload on `--store`.
fn fanout_table(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    println!();
    println!("Fan-out throughput: 1 publisher (pipelined, ≤{} in flight) → N × `dws event consume --format raw`", opts.inflight);
    println!("(bus on the {})", opts.store.describe());
    println!(
        "(median of {} run(s) by deliveries/s, each on a fresh bus; latency here includes queueing under \
         saturation, see the fixed-rate run for unloaded latency)",
        opts.runs
    );
    println!(
        "(cpu µs/deliv: CPU time of busd plus every `dws event consume` process (utime + stime from /proc/<pid>/stat, \
         in 1/{} s ticks), from just before the first publish until the consumers exit, divided by the N × events \
         deliveries; median over the runs. Not counted: the publisher, which is this benchmark itself, and its \
         stdout readers)",
        clock_ticks_per_sec()
    );
    println!();
    println!(
        "{:>4}  {:>7}  {:>7}  {:>13}  {:>13}  {:>15}  {:>9}  {:>9}  {:>9}  {:>12}  {:>9}  {:>10}",
        "N",
        "payload",
        "events",
        "ev/s/cons avg",
        "ev/s/cons min",
        "deliveries/s",
        "p50 µs",
        "p99 µs",
        "max µs",
        "cpu µs/deliv",
        "busd part",
        "busd peak"
    );
    let mut raised_any = false;
    let mut coarse_any = false;
    for &size in &[256usize, 4096] {
        for &n in &opts.consumers {
            if interrupted() {
                break;
            }
            let events = if size == 256 {
                opts.events_small
            } else {
                opts.events_large
            };
            let result = run_fanout_median(opts.runs, n, size, events, opts.inflight, opts.store);
            match result {
                Ok(r) => {
                    raised_any |= r.retention_raised;
                    coarse_any |= r.cpu_coarse();
                    println!(
                    "{:>4}  {:>7}  {:>7}  {:>13.0}  {:>13.0}  {:>15.0}  {:>9.0}  {:>9.0}  {:>9.0}  {:>12}  {:>9}  {:>10}",
                    n,
                    size_name(size),
                    events,
                    r.per_consumer_avg,
                    r.per_consumer_min,
                    r.aggregate,
                    r.p50_us,
                    r.p99_us,
                    r.max_us,
                    fmt_cpu(r.cpu_us_per_delivery, &r),
                    fmt_cpu(r.busd_cpu_us_per_delivery, &r),
                    kb(r.busd_hwm_kb) + if r.retention_raised { " *" } else { "" }
                    );
                    table.record_fanout(opts.store, n, size, &r);
                }
                Err(e) => {
                    println!(
                        "{:>4}  {:>7}  {:>7}  FAILED (see below)",
                        n,
                        size_name(size),
                        events
                    );
                    failures.push(format!("fan-out N={n} payload={}: {e}", size_name(size)));
                }
            }
        }
    }

    if raised_any {
        println!(
            "  * bus retention raised to hold every event (DWS_EVENT_BUS_RETENTION_EVENTS/BYTES)"
        );
    }
    if coarse_any {
        println!("{COARSE_NOTE}");
    }
}
