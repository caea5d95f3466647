//! [`Complaints`]: the stderr lines about ignored explicit-ack stdin lines
//! (`[event] stdin line N ignored: WHY`), bounded so that a parent writing
//! garbage to stdin can neither flood stderr nor stop delivery.
//!
//! - The first [`BURST`] are printed; after that at most one per
//!   [`INTERVAL`]; the rest are counted, and the next printed line says how
//!   many were not shown (`… (K more ignored line(s) not shown)`), as does
//!   a last line at the end of the run.
//! - They are written without blocking: a stderr pipe nobody reads (its
//!   buffer full) drops the line, which is then counted as not shown. The
//!   run never waits for stderr because of them.
//!
//! The decision ([`Complaints::decide`]) is pure and unit-tested; the write
//! is [`write_stderr_nowait`].

use std::{
    io::{self, Write},
    time::{Duration, Instant},
};

/// Complaints printed before the rate limit applies.
pub(super) const BURST: u32 = 5;
/// At most one complaint line per interval after the burst.
pub(super) const INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(super) struct Complaints {
    printed: u32,
    last: Option<Instant>,
    /// Ignored lines not shown since the last line printed.
    hidden: u64,
}

impl Complaints {
    /// The line to print for stdin line `n` ignored because `why`, at
    /// `now`; `None` when the rate limit hides it (counted).
    pub(super) fn decide(&mut self, n: u64, why: &str, now: Instant) -> Option<String> {
        let allowed = self.printed < BURST || self.last.is_none_or(|t| now >= t + INTERVAL);
        if !allowed {
            self.hidden += 1;
            return None;
        }
        let mut line = format!("[event] stdin line {n} ignored: {why}");
        if self.hidden > 0 {
            line.push_str(&format!(
                " ({} more ignored line(s) not shown)",
                self.hidden
            ));
        }
        Some(line)
    }

    /// The line from [`Complaints::decide`] was written (`true`) or
    /// dropped because stderr was full (`false`, counted as not shown).
    pub(super) fn written(&mut self, ok: bool, now: Instant) {
        if ok {
            self.printed = self.printed.saturating_add(1);
            self.last = Some(now);
            self.hidden = 0;
        } else {
            self.hidden += 1;
        }
    }

    /// The last word at the end of a run: how many were never shown.
    pub(super) fn summary(&self) -> Option<String> {
        (self.hidden > 0).then(|| {
            format!(
                "[event] {} more ignored stdin line(s) not shown",
                self.hidden
            )
        })
    }

    /// Decides, writes without blocking, and records: one complaint.
    pub(super) fn complain(&mut self, quiet: bool, n: u64, why: &str) {
        if quiet {
            return;
        }
        let now = Instant::now();
        if let Some(line) = self.decide(n, why, now) {
            let ok = write_stderr_nowait(&line);
            self.written(ok, now);
        }
    }
}

/// Writes `line` and a newline to stderr without waiting for room: `false`
/// when stderr (a full pipe) would block. A stderr that does not support
/// non-blocking writes (a terminal, a file) is written as usual. A line
/// under the pipe's atomic size is written whole or not at all.
pub(super) fn write_stderr_nowait(line: &str) -> bool {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.truncate(4000);
    buf.push(b'\n');
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    loop {
        // SAFETY: `iov` describes `buf`, borrowed for the whole call; the
        // kernel only reads from it.
        let n = unsafe { libc::pwritev2(libc::STDERR_FILENO, &iov, 1, -1, libc::RWF_NOWAIT) };
        if n >= 0 {
            if (n as usize) < buf.len() {
                let _ = io::stderr().lock().write_all(&buf[n as usize..]);
            }
            return true;
        }
        match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::Interrupted => continue,
            e if e.kind() == io::ErrorKind::WouldBlock => return false,
            // No RWF_NOWAIT here (a terminal, a file, an old kernel): a plain
            // write, which such a stderr does not hold up for long.
            _ => return io::stderr().lock().write_all(&buf).is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_printed_then_one_line_per_interval_with_the_hidden_count() {
        let mut c = Complaints::default();
        let t0 = Instant::now();
        for n in 1..=u64::from(BURST) {
            let line = c.decide(n, "bad", t0).expect("within the burst");
            assert_eq!(line, format!("[event] stdin line {n} ignored: bad"));
            c.written(true, t0);
        }
        for n in 6..=105 {
            assert_eq!(c.decide(n, "bad", t0 + INTERVAL / 2), None);
        }
        assert_eq!(
            c.summary().as_deref(),
            Some("[event] 100 more ignored stdin line(s) not shown")
        );
        let line = c
            .decide(106, "worse", t0 + INTERVAL)
            .expect("an interval later");
        assert_eq!(
            line,
            "[event] stdin line 106 ignored: worse (100 more ignored line(s) not shown)"
        );
        c.written(true, t0 + INTERVAL);
        assert_eq!(c.summary(), None);
        assert_eq!(c.decide(107, "bad", t0 + INTERVAL), None);
    }

    #[test]
    fn a_line_stderr_could_not_take_is_counted_as_not_shown() {
        let mut c = Complaints::default();
        let t0 = Instant::now();
        assert!(c.decide(1, "bad", t0).is_some());
        c.written(false, t0);
        let line = c.decide(2, "bad", t0).expect("still within the burst");
        assert!(
            line.ends_with("(1 more ignored line(s) not shown)"),
            "{line}"
        );
    }
}
