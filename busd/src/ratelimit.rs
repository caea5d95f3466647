//! Rate-limited warnings: a flood of bad clients (or failed accepts) must
//! not turn `bus.log` into the flood. Each [`LogLimit`] lets one line through
//! per interval and counts what it held back, which the next line reports.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl LogLimit {
    pub const fn new(interval: Duration) -> LogLimit {
        LogLimit {
            interval,
            last: Mutex::new(None),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be written now (`n` lines were held back
    /// since the last one), `None` when this one is held back.
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match *last {
            Some(t) if now.duration_since(t) < self.interval => {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                None
            }
            _ => {
                *last = Some(now);
                Some(self.suppressed.swap(0, Ordering::Relaxed))
            }
        }
    }
}

/// Logs a warning through a [`LogLimit`], adding how many were held back.
#[macro_export]
macro_rules! warn_limited {
    ($limit:expr, $($arg:tt)+) => {
        if let Some(held) = $limit.allow() {
            if held > 0 {
                tracing::warn!(similar_lines_held_back = held, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_then_the_count() {
        let l = LogLimit::new(Duration::from_secs(3600));
        assert_eq!(l.allow(), Some(0));
        assert_eq!(l.allow(), None);
        assert_eq!(l.allow(), None);
        let l2 = LogLimit::new(Duration::ZERO);
        assert_eq!(l2.allow(), Some(0));
        assert_eq!(l2.allow(), Some(0));
    }
}
