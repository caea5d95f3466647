//! A latency histogram recorded without a lock (the committer records how
//! long each append to the store took; `status` reads it): fixed buckets,
//! counts per bucket, the sum and the count, as Prometheus histograms have.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use proto::status::LatencyDoc;

/// Upper bounds of the buckets, in microseconds (the last bucket, +Inf, is
/// implied): 100 µs to 2.5 s, about three per decade.
pub const BOUNDS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000,
];

/// Counts per bucket (the last one is over every bound), sum and count.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let i = BOUNDS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// For `status`: cumulative counts per bound (as Prometheus's `le`
    /// buckets), then the sum and the count.
    pub fn doc(&self) -> LatencyDoc {
        let mut running = 0;
        let mut cumulative = Vec::with_capacity(BOUNDS_US.len());
        for b in &self.buckets[..BOUNDS_US.len()] {
            running += b.load(Ordering::Relaxed);
            cumulative.push(running);
        }
        LatencyDoc {
            le_us: BOUNDS_US.to_vec(),
            cumulative,
            sum_us: self.sum_us.load(Ordering::Relaxed),
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_bound_itself_belongs_to_its_bucket() {
        let h = Histogram::default();
        h.record(Duration::from_micros(100));
        h.record(Duration::from_micros(101));
        h.record(Duration::from_millis(1));
        h.record(Duration::from_secs(10));
        let d = h.doc();
        assert_eq!(d.le_us[0], 100);
        assert_eq!(d.cumulative[0], 1, "100 µs is in le=100");
        assert_eq!(d.cumulative[1], 2, "101 µs in le=250");
        assert_eq!(d.cumulative[3], 3, "1 ms in le=1000");
        assert_eq!(*d.cumulative.last().unwrap(), 3, "10 s only in +Inf");
        assert_eq!(d.count, 4);
        assert_eq!(d.sum_us, 100 + 101 + 1_000 + 10_000_000);
    }
}
