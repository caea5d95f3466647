//! The reader of one consumer's stdout: timestamps every chunk, checks every
//! line is the next event (`"<send unix nanos> <index> "` padded to the
//! size), and records publish-to-stdout latencies.

use std::{
    io::Read,
    process::ChildStdout,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread,
};

use crate::unix_nanos;

/// What a reader thread saw on one consumer's stdout.
#[derive(Default)]
pub struct ReadResult {
    pub lines: u64,
    pub first_recv_ns: u64,
    pub last_recv_ns: u64,
    /// Publish-to-read latency of every line, in ns.
    pub latencies: Vec<u64>,
    /// The first malformed, missing, duplicate or out-of-order line.
    pub error: Option<String>,
}

/// Reads a consumer's stdout to EOF on a thread and sends what it saw.
/// `size` is the payload size: every line is `size` bytes plus `\n`.
pub fn spawn_reader(
    progress: Arc<AtomicU64>,
    idx: usize,
    mut out: ChildStdout,
    size: usize,
    expect: u64,
    tx: mpsc::Sender<(usize, ReadResult)>,
) {
    thread::spawn(move || {
        let mut r = ReadResult {
            latencies: Vec::with_capacity(expect as usize),
            ..ReadResult::default()
        };
        let mut buf = vec![0u8; 256 * 1024];
        let mut have = 0usize;
        loop {
            if have == buf.len() {
                // A line longer than the buffer: not one of ours.
                r.error
                    .get_or_insert_with(|| format!("line longer than {} bytes", buf.len()));
                have = 0;
            }
            let n = match out.read(&mut buf[have..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = unix_nanos();
            have += n;
            let mut pos = 0;
            while pos < have {
                // Fast path: lines are exactly `size` bytes.
                let end = if pos + size < have && buf[pos + size] == b'\n' {
                    pos + size
                } else {
                    match buf[pos..have].iter().position(|b| *b == b'\n') {
                        Some(i) => pos + i,
                        None => break,
                    }
                };
                check_line(&mut r, &buf[pos..end], size, now);
                pos = end + 1;
            }
            progress.store(r.lines, Ordering::Relaxed);
            buf.copy_within(pos..have, 0);
            have -= pos;
        }
        if have > 0 {
            r.error
                .get_or_insert_with(|| format!("{have} trailing bytes without a newline"));
        }
        let _ = tx.send((idx, r));
    });
}

fn check_line(r: &mut ReadResult, line: &[u8], size: usize, now: u64) {
    let expected_index = r.lines;
    r.lines += 1;
    if r.first_recv_ns == 0 {
        r.first_recv_ns = now;
    }
    r.last_recv_ns = now;
    let mut fields = line.splitn(3, |b| *b == b' ');
    let sent = fields.next().and_then(parse_u64);
    let index = fields.next().and_then(parse_u64);
    match (sent, index) {
        (Some(sent), Some(index)) => {
            r.latencies.push(now.saturating_sub(sent));
            if r.error.is_none() && index != expected_index {
                r.error = Some(format!("line {expected_index} carries event index {index} (lost, duplicated or reordered)"));
            }
        }
        _ => {
            r.error.get_or_insert_with(|| {
                format!(
                    "line {expected_index} is not `<nanos> <index> ...`: {:?}",
                    String::from_utf8_lossy(&line[..line.len().min(60)])
                )
            });
        }
    }
    if r.error.is_none() && line.len() != size {
        r.error = Some(format!(
            "line {expected_index} has {} bytes, expected {size}",
            line.len()
        ));
    }
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(sent: u64, index: u64, size: usize) -> Vec<u8> {
        let mut l = format!("{sent} {index} ").into_bytes();
        l.resize(size, b'x');
        l
    }

    #[test]
    fn in_order_lines_of_the_size_pass() {
        let mut r = ReadResult::default();
        for i in 0..3 {
            check_line(&mut r, &line(1_000, i, 64), 64, 5_000);
        }
        assert_eq!(r.lines, 3);
        assert_eq!(r.error, None);
        assert_eq!(r.latencies, vec![4_000; 3]);
    }

    #[test]
    fn a_gap_a_short_line_and_garbage_are_errors() {
        let mut r = ReadResult::default();
        check_line(&mut r, &line(1, 0, 64), 64, 2);
        check_line(&mut r, &line(1, 2, 64), 64, 2);
        assert!(r.error.as_deref().is_some_and(|e| e.contains("index 2")));
        let mut r = ReadResult::default();
        check_line(&mut r, &line(1, 0, 32), 64, 2);
        assert!(r.error.as_deref().is_some_and(|e| e.contains("32 bytes")));
        let mut r = ReadResult::default();
        check_line(&mut r, b"hello", 64, 2);
        assert!(r.error.is_some());
    }
}
