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
//! A line that is none of these, has anything after them, or is longer
//! than [`MAX_LINE`] (refused whole, never cut) is reported on stderr and
//! changes nothing.

use std::{
    io::{self, BufRead, Read},
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
                Some(d) => proto::duration::parse(d)
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

/// The most bytes of one stdin line, its newline not counted. A longer
/// line is refused whole ([`Input::Refused`]): never cut and applied.
pub const MAX_LINE: usize = 4096;

/// What the stdin reader sends: a numbered line, a numbered line refused
/// before it was parsed (why), or the end of stdin.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    Line(u64, String),
    Refused(u64, String),
    Eof,
}

/// The next line of `reader`: `None` at its end; a line over [`MAX_LINE`]
/// is read to its newline (at most [`MAX_LINE`] bytes held at a time) and
/// refused, saying how long it was.
pub fn next_line(reader: &mut impl BufRead, n: u64) -> io::Result<Option<Input>> {
    let mut buf = Vec::new();
    // One byte over the bound tells an overlong line from one at the bound.
    let limit = MAX_LINE as u64 + 1;
    if read_until_retrying(reader.by_ref().take(limit), &mut buf)? == 0 {
        return Ok(None);
    }
    if buf.ends_with(b"\n") {
        buf.pop();
    } else if buf.len() as u64 == limit {
        let mut total = buf.len() as u64;
        loop {
            buf.clear();
            let got = read_until_retrying(reader.by_ref().take(limit), &mut buf)?;
            total += got as u64;
            if got == 0 || buf.ends_with(b"\n") {
                break;
            }
        }
        if buf.ends_with(b"\n") {
            total -= 1;
        }
        return Ok(Some(Input::Refused(
            n,
            format!("longer than {MAX_LINE} bytes ({total} bytes): refused whole, nothing applied"),
        )));
    }
    let line = String::from_utf8_lossy(&buf).trim().to_owned();
    Ok(Some(Input::Line(n, line)))
}

/// `read_until(b'\n')`, again after an interruption.
fn read_until_retrying(mut r: impl BufRead, buf: &mut Vec<u8>) -> io::Result<usize> {
    loop {
        match r.read_until(b'\n', buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Reads stdin line by line on a plain thread (abandoned at exit); a line
/// over [`MAX_LINE`] is passed on as refused ([`next_line`]).
pub fn read_stdin() -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel(1024);
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut n = 0;
        loop {
            n += 1;
            match next_line(&mut stdin, n) {
                Ok(Some(input)) => {
                    if tx.blocking_send(input).is_err() {
                        return;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        let _ = tx.blocking_send(Input::Eof);
    });
    rx
}

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

    fn lines_of(input: &[u8]) -> Vec<Input> {
        let mut r = io::BufReader::with_capacity(64, input);
        let mut out = vec![];
        let mut n = 0;
        while let Some(i) = next_line(&mut r, {
            n += 1;
            n
        })
        .unwrap()
        {
            out.push(i);
        }
        out
    }

    #[test]
    fn a_line_over_the_bound_is_refused_whole_and_the_next_one_read() {
        let long_nack = format!("nack 5{}1h\nack 4\n", " ".repeat(5000));
        let got = lines_of(long_nack.as_bytes());
        assert_eq!(got.len(), 2, "{got:?}");
        match &got[0] {
            Input::Refused(1, why) => assert!(why.contains("5008 bytes"), "{why}"),
            other => panic!("not refused: {other:?}"),
        }
        assert_eq!(got[1], Input::Line(2, "ack 4".into()));
        // At the bound exactly: a line; one byte over: refused; the last
        // line without a newline: a line.
        let at = "a".repeat(MAX_LINE);
        let over = "b".repeat(MAX_LINE + 1);
        let got = lines_of(format!("{at}\n{over}\nack 1").as_bytes());
        assert_eq!(got[0], Input::Line(1, at));
        assert!(matches!(&got[1], Input::Refused(2, _)), "{:?}", got[1]);
        assert_eq!(got[2], Input::Line(3, "ack 1".into()));
        // An overlong last line without a newline is refused too.
        let got = lines_of(over.as_bytes());
        assert!(matches!(&got[..], [Input::Refused(1, _)]), "{got:?}");
    }

    #[test]
    fn trailing_junk_is_refused() {
        assert!(parse("ack 4 junk").unwrap_err().contains("unexpected"));
        assert!(parse("ack 4\u{a0}junk").unwrap_err().contains("unexpected"));
        assert!(parse("ack 4junk").unwrap_err().contains("not a seq"));
        assert!(parse("ack 4\0").unwrap_err().contains("not a seq"));
        assert!(parse("nack 5 1h junk").unwrap_err().contains("unexpected"));
    }
}
