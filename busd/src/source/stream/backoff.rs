//! The one reconnect/restart backoff of the sources (the DingTalk stream
//! runner and the exec source): exponential with jitter, capped, reset by
//! the caller after a healthy run.

use std::{
    hash::{BuildHasher, RandomState},
    time::Duration,
};

use tokio::time::Instant;

use crate::clock::now_ms;

/// Exponential backoff with jitter: the n-th delay is `b + U[0, b/4]` with
/// `b = min·2ⁿ`, never more than `max`. Delays never decrease until
/// [`Backoff::reset`].
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    base: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        let max = max.max(min);
        Backoff {
            min,
            max,
            base: min,
        }
    }

    /// Back to the first delay (after a healthy connection or run).
    pub fn reset(&mut self) {
        self.base = self.min;
    }

    /// The largest delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    pub fn next_delay(&mut self) -> Duration {
        let b = self.base;
        let jitter_ms = (b.as_millis() / 4) as u64;
        let jitter = if jitter_ms == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(random_u64() % (jitter_ms + 1))
        };
        self.base = (b * 2).min(self.max);
        (b + jitter).min(self.max)
    }
}

fn random_u64() -> u64 {
    RandomState::new().hash_one((std::process::id(), now_ms(), Instant::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut prev = Duration::ZERO;
        let mut seen = vec![];
        for _ in 0..12 {
            let d = b.next_delay();
            assert!(d >= prev, "{seen:?} then {d:?}");
            assert!(d <= Duration::from_secs(60));
            seen.push(d);
            prev = d;
        }
        assert!(
            seen[0] >= Duration::from_secs(1) && seen[0] <= Duration::from_millis(1250),
            "{seen:?}"
        );
        assert!(
            seen[1] >= Duration::from_secs(2) && seen[1] <= Duration::from_millis(2500),
            "{seen:?}"
        );
        assert_eq!(*seen.last().unwrap(), Duration::from_secs(60));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(1250));
    }

    #[test]
    fn a_max_below_min_is_min() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(10));
        assert_eq!(b.max(), Duration::from_millis(100));
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }
}
