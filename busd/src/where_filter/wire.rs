//! The frames between busd and its filter worker, on the worker's stdin
//! and stdout: a 4-byte little-endian length, then the body. busd sends
//! [`Request::Program`] (the expressions every following event is judged
//! by) and [`Request::Eval`] (one event, as the bus encodes it); the
//! worker answers each `Eval`, in order, with one [`Answer`]. Both ends are
//! the same build, so the format has no version.

use super::{Verdict, WhereFailure};

/// Longest body either side accepts: an event at its limit, and a program
/// of its most expressions at their longest.
pub const MAX_BODY: usize = proto::MAX_FRAME_LEN + 64 * 1024;

const PROGRAM: u8 = 1;
const EVAL: u8 = 2;
const ANSWER: u8 = 3;

/// What busd asks.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Program(Vec<&'a str>),
    Eval { seq: u64, event: &'a [u8] },
}

/// The worker's answer to one `Eval`: the verdict and the CPU time it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub seq: u64,
    pub verdict: Verdict,
    pub cpu_ns: u64,
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad filter frame: {0}")]
pub struct BadFrame(&'static str);

fn put_len(out: &mut [u8], start: usize) {
    let len = u32::try_from(out.len() - start - 4).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends a program frame.
pub fn program(out: &mut Vec<u8>, exprs: &[String]) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(PROGRAM);
    out.extend_from_slice(&(exprs.len() as u32).to_le_bytes());
    for e in exprs {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e.as_bytes());
    }
    put_len(out, start);
}

/// Appends an eval frame.
pub fn eval(out: &mut Vec<u8>, seq: u64, event: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(EVAL);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(event);
    put_len(out, start);
}

/// Appends an answer frame.
pub fn answer(out: &mut Vec<u8>, a: &Answer) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(ANSWER);
    out.extend_from_slice(&a.seq.to_le_bytes());
    out.push(code_of(a.verdict));
    out.extend_from_slice(&a.cpu_ns.to_le_bytes());
    put_len(out, start);
}

fn code_of(v: Verdict) -> u8 {
    match v {
        Verdict::NoMatch => 0,
        Verdict::Match => 1,
        Verdict::Failed(WhereFailure::Raised) => 2,
        Verdict::Failed(WhereFailure::Steps) => 3,
        Verdict::Failed(_) => 4,
    }
}

fn verdict_of(code: u8) -> Result<Verdict, BadFrame> {
    Ok(match code {
        0 => Verdict::NoMatch,
        1 => Verdict::Match,
        2 => Verdict::Failed(WhereFailure::Raised),
        3 => Verdict::Failed(WhereFailure::Steps),
        4 => Verdict::Failed(WhereFailure::Crashed),
        _ => return Err(BadFrame("unknown verdict")),
    })
}

/// The body of the first whole frame in `buf`, and the bytes it took;
/// `None` while it is incomplete.
pub fn split(buf: &[u8]) -> Result<Option<(&[u8], usize)>, BadFrame> {
    let Some(head) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len > MAX_BODY {
        return Err(BadFrame("too long"));
    }
    Ok(buf.get(4..4 + len).map(|body| (body, 4 + len)))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, BadFrame> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(BadFrame("short"))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, BadFrame> {
    let s = b.get(at..at + 8).ok_or(BadFrame("short"))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

/// Reads a request body.
pub fn request(body: &[u8]) -> Result<Request<'_>, BadFrame> {
    match body.first() {
        Some(&PROGRAM) => {
            let n = u32_at(body, 1)? as usize;
            if n > proto::where_expr::MAX_WHERES {
                return Err(BadFrame("too many expressions"));
            }
            let mut at = 5;
            let mut exprs = Vec::with_capacity(n);
            for _ in 0..n {
                let len = u32_at(body, at)? as usize;
                let s = body
                    .get(at + 4..at + 4 + len)
                    .ok_or(BadFrame("short expression"))?;
                exprs.push(std::str::from_utf8(s).map_err(|_| BadFrame("not UTF-8"))?);
                at += 4 + len;
            }
            Ok(Request::Program(exprs))
        }
        Some(&EVAL) => Ok(Request::Eval {
            seq: u64_at(body, 1)?,
            event: &body[9..],
        }),
        _ => Err(BadFrame("unknown request")),
    }
}

/// Reads an answer body.
pub fn read_answer(body: &[u8]) -> Result<Answer, BadFrame> {
    if body.len() != 18 || body[0] != ANSWER {
        return Err(BadFrame("not an answer"));
    }
    Ok(Answer {
        seq: u64_at(body, 1)?,
        verdict: verdict_of(body[9])?,
        cpu_ns: u64_at(body, 10)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_as_written() {
        let mut buf = Vec::new();
        program(&mut buf, &[".a".into(), ".b == 1".into()]);
        eval(&mut buf, 7, b"\x01\x02");
        let (body, used) = split(&buf).unwrap().unwrap();
        assert_eq!(
            request(body).unwrap(),
            Request::Program(vec![".a", ".b == 1"])
        );
        let (body, used2) = split(&buf[used..]).unwrap().unwrap();
        assert_eq!(
            request(body).unwrap(),
            Request::Eval {
                seq: 7,
                event: b"\x01\x02"
            }
        );
        assert_eq!(used + used2, buf.len());
        for verdict in [
            Verdict::Match,
            Verdict::NoMatch,
            Verdict::Failed(WhereFailure::Raised),
            Verdict::Failed(WhereFailure::Steps),
        ] {
            let a = Answer {
                seq: u64::MAX,
                verdict,
                cpu_ns: 12345,
            };
            let mut out = Vec::new();
            answer(&mut out, &a);
            let (body, _) = split(&out).unwrap().unwrap();
            assert_eq!(read_answer(body).unwrap(), a);
        }
    }

    #[test]
    fn partial_and_bad_frames_are_told_apart() {
        let mut buf = Vec::new();
        eval(&mut buf, 1, &[0; 100]);
        for cut in 0..buf.len() {
            assert_eq!(split(&buf[..cut]).unwrap(), None);
        }
        assert!(split(&u32::MAX.to_le_bytes()).is_err());
        assert!(request(&[9]).is_err());
        assert!(request(&[PROGRAM, 1, 0, 0, 0, 5, 0, 0, 0, b'a']).is_err());
        let mut bad_verdict = [ANSWER; 18];
        bad_verdict[9] = 9;
        assert!(read_answer(&bad_verdict).is_err());
        assert!(read_answer(&[ANSWER; 17]).is_err());
    }
}
