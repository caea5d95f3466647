//! The floor of a durable delivery: raw `fdatasync` of 256 B appends at a
//! fixed rate, in a temp dir of the file system the buses' stores are on,
//! measured by the benchmark itself so that the disk store's fixed-rate
//! latency is judged against the disk of the same run.
//!
//! Two figures: the time each write + `fdatasync` took (the service
//! time, what a plain fdatasync loop reports), and for each append the time
//! from when it was due until it was durable (the response time). Appends
//! come due on schedule whatever the disk does, and the ones that came due
//! during an `fdatasync` go together in the next write and `fdatasync`
//! (group commit, as the bus does). The figures differ when one
//! `fdatasync` stalls: the appends due meanwhile wait for it, and only the
//! response time counts that wait. The bus's events wait the same way, and
//! its latency is measured from when each was sent: the response time is
//! the like-for-like floor.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use crate::{procs::check_interrupted, report::percentile, Res};

/// Latencies of the appends.
pub struct FsyncFloor {
    /// Write + `fdatasync` alone.
    pub service: Percentiles,
    /// From when the append was due until it was durable.
    pub response: Percentiles,
    pub appends: u64,
}

pub struct Percentiles {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Percentiles {
    fn of(mut samples: Vec<u64>) -> Percentiles {
        samples.sort_unstable();
        Percentiles {
            p50_us: percentile(&samples, 0.50),
            p99_us: percentile(&samples, 0.99),
            max_us: samples.last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
        }
    }
}

/// Appends of `size` bytes come due `rate` times a second for `secs`; each
/// round writes every append due by then with one `write` and one
/// `fdatasync`, in a fresh file under the system temp dir.
pub fn measure(rate: u64, secs: f64, size: usize) -> Res<FsyncFloor> {
    let dir = tempfile::Builder::new()
        .prefix("dws-bench-fsync-")
        .tempdir()
        .map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let path = dir.path().join("append.log");
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let n = ((rate as f64 * secs).round() as u64).max(1);
    let due = |i: u64| Duration::from_nanos(i.saturating_mul(1_000_000_000) / rate.max(1));
    let mut buf = Vec::new();
    let mut service = Vec::new();
    let mut response = Vec::with_capacity(n as usize);
    let start = Instant::now();
    let mut next = 0;
    while next < n {
        let first_due = start + due(next);
        let now = Instant::now();
        if first_due > now {
            std::thread::sleep(first_due - now);
        }
        check_interrupted()?;
        // Everything due by now goes in this round.
        let elapsed = start.elapsed();
        let mut end = next + 1;
        while end < n && due(end) <= elapsed {
            end += 1;
        }
        buf.clear();
        buf.resize(size.max(1) * (end - next) as usize, b'x');
        let t = Instant::now();
        file.write_all(&buf)
            .and_then(|()| file.sync_data())
            .map_err(|e| format!("cannot append to {}: {e}", path.display()))?;
        let done = Instant::now();
        service.push(done.duration_since(t).as_nanos() as u64);
        for i in next..end {
            response.push(done.saturating_duration_since(start + due(i)).as_nanos() as u64);
        }
        next = end;
    }
    Ok(FsyncFloor {
        service: Percentiles::of(service),
        response: Percentiles::of(response),
        appends: n,
    })
}

/// Measures the floor at `rate` for `secs` right after a bus run whose p99
/// was `bus_p99_us`, prints both figures and the bus's distance to them,
/// and returns the response times (the like-for-like floor).
pub fn print_floor(
    rate: u64,
    secs: f64,
    bus_p99_us: f64,
    failures: &mut Vec<String>,
) -> Option<Percentiles> {
    match measure(rate, secs, 256) {
        Ok(f) => {
            let (s, w) = (&f.service, &f.response);
            println!(
                "  raw fdatasync of 256 B appends at {rate}/s, same file system, this run ({} appends, \
                 those due meanwhile in one write + fdatasync):\n    \
                 each write + fdatasync: p50 {:.0} µs   p99 {:.0} µs   max {:.0} µs\n    \
                 each append, from when due (waits behind a slow one, as the bus's events do): p50 {:.0} µs   \
                 p99 {:.0} µs   max {:.0} µs\n    the bus's p99 is {:+.0} µs from the latter (goal: ≤ +300 µs), \
                 {:+.0} µs from the former",
                f.appends,
                s.p50_us,
                s.p99_us,
                s.max_us,
                w.p50_us,
                w.p99_us,
                w.max_us,
                bus_p99_us - w.p99_us,
                bus_p99_us - s.p99_us
            );
            Some(f.response)
        }
        Err(e) => {
            failures.push(format!("raw fdatasync at {rate}/s: {e}"));
            None
        }
    }
}
