//! `--ack explicit`: the lines a consumer's parent writes to `dws`'s stdin
//! to settle events, parsed by a pure function, and the thread that reads
//! them.
//!
//! - `ack SEQ`: that event is handled;
//! - `ack-upto SEQ`: every event delivered to this run up to SEQ is handled;
//! - `nack SEQ [DELAY]`: deliver it again, now (or after the backoff step)
//!   or after DELAY (`5s`, `2m`);
//! - `progress SEQ`: still working on it; its ack wait starts again;
//! - `term SEQ [REASON]`: it will never succeed; park it (REASON is the rest
//!   of the line).
//!
//! A line that is none of these is reported on stderr and changes nothing.

use std::{
    io::{self, BufRead},
    time::Duration,
};

use tokio::sync::mpsc;

/// One settled line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckLine {
    Ack(u64),
    AckUpto(u64),
    Nack(u64, Duration),
    Progress(u64),
    /// The seq and the reason (possibly empty).
    Term(u64, String),
}

/// Parses one stdin line (surrounding whitespace ignored).
pub fn parse(line: &str) -> Result<AckLine, String> {
    let mut words = line.split_whitespace();
    let verb = words.next().ok_or("empty line")?;
    let seq = |w: Option<&str>| -> Result<u64, String> {
        let w = w.ok_or_else(|| format!("`{verb}` needs a seq"))?;
        w.parse::<u64>()
            .ok()
            .filter(|s| *s > 0)
            .ok_or_else(|| format!("{} is not a seq", crate::exit::quoted(w)))
    };
    let parsed = match verb {
        "ack" => AckLine::Ack(seq(words.next())?),
        "ack-upto" => AckLine::AckUpto(seq(words.next())?),
        "nack" => {
            let s = seq(words.next())?;
            let delay = match words.next() {
                None => Duration::ZERO,
                Some("0") => Duration::ZERO,
                Some(d) => humantime::parse_duration(d)
                    .ok()
                    .filter(|&d| d <= proto::limits::MAX_DURATION)
                    .ok_or_else(|| {
                    format!(
                        "{} is not a delay (expected e.g. 5s, 2m)",
                        crate::exit::quoted(d)
                    )
                })?,
            };
            AckLine::Nack(s, delay)
        }
        "progress" => AckLine::Progress(seq(words.next())?),
        "term" => {
            let s = seq(words.next())?;
            let reason: Vec<&str> = words.by_ref().collect();
            AckLine::Term(s, reason.join(" "))
        }
        other => {
            return Err(format!(
                "unknown verb {}: use ack SEQ, ack-upto SEQ, nack SEQ [DELAY], progress SEQ or term SEQ [REASON]",
                crate::exit::quoted(other)
            ))
        }
    };
    match words.next() {
        None => Ok(parsed),
        Some(extra) => Err(format!("unexpected {}", crate::exit::quoted(extra))),
    }
}

/// What the stdin reader sends: a numbered line, or the end of stdin.
pub enum Input {
    Line(u64, String),
    Eof,
}

/// Reads stdin line by line on a plain thread (abandoned at exit). Lines
/// longer than 4 KiB are passed on cut, to be reported as malformed.
pub fn read_stdin() -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel(1024);
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut n = 0;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match (&mut stdin).take(4096).read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) => {
                    if !buf.ends_with(b"\n") && buf.len() == 4096 {
                        // Skip the rest of an overlong line, 4 KiB at a time.
                        let mut rest = Vec::new();
                        loop {
                            rest.clear();
                            match (&mut stdin).take(4096).read_until(b'\n', &mut rest) {
                                Ok(0) => break,
                                Ok(_) if rest.ends_with(b"\n") => break,
                                Ok(_) => continue,
                                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                                Err(_) => break,
                            }
                        }
                    }
                    n += 1;
                    let line = String::from_utf8_lossy(&buf).trim().to_owned();
                    if tx.blocking_send(Input::Line(n, line)).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = tx.blocking_send(Input::Eof);
    });
    rx
}

use std::io::Read as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_lines() {
        assert_eq!(parse("ack 7"), Ok(AckLine::Ack(7)));
        assert_eq!(parse("  ack-upto 9 "), Ok(AckLine::AckUpto(9)));
        assert_eq!(parse("nack 3"), Ok(AckLine::Nack(3, Duration::ZERO)));
        assert_eq!(
            parse("nack 3 5s"),
            Ok(AckLine::Nack(3, Duration::from_secs(5)))
        );
        assert_eq!(parse("progress 4"), Ok(AckLine::Progress(4)));
        assert_eq!(parse("term 5"), Ok(AckLine::Term(5, String::new())));
        assert_eq!(
            parse("term 5  bad  input: no\tretry "),
            Ok(AckLine::Term(5, "bad input: no retry".into()))
        );
    }

    #[test]
    fn bad_lines_say_why() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("ack").unwrap_err().contains("needs a seq"));
        assert!(parse("ack x").unwrap_err().contains("not a seq"));
        assert!(parse("ack 0").unwrap_err().contains("not a seq"));
        assert!(parse("nack 1 soon").unwrap_err().contains("not a delay"));
        assert!(parse("ok 1").unwrap_err().contains("unknown verb"));
        assert!(parse("ack 1 2").unwrap_err().contains("unexpected"));
        assert!(parse("progress").unwrap_err().contains("needs a seq"));
        assert!(parse("progress 1 2").unwrap_err().contains("unexpected"));
        assert!(parse("term x why").unwrap_err().contains("not a seq"));
        assert!(parse(&"x".repeat(5000)).unwrap_err().len() < 300);
    }
}
