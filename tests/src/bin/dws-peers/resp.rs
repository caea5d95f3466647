//! The Redis pub/sub subscriber's read path: RESP push frames parsed in place
//! from a large read buffer. The `redis` crate sends SUBSCRIBE (and every
//! other command); a subscriber only reads `message` pushes, and the crate's
//! PubSub builds a value tree per message, which cost twice hiredis's CPU
//! per delivery and got the subscriber dropped as a slow consumer.

use std::io::Read;

/// What [`parse_push`] found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A complete push `[kind, channel, payload]` (payload of `message`) and
    /// the bytes it took.
    Push {
        kind: &'a [u8],
        payload: &'a [u8],
        len: usize,
    },
    /// Not enough bytes yet.
    Partial,
    /// Not a RESP push of bulk strings.
    Invalid,
}

/// One line `<prefix><decimal>\r\n` at `buf[at..]`: the number and the index
/// after the line.
fn header(buf: &[u8], at: usize, prefix: u8) -> Result<Option<(i64, usize)>, ()> {
    let Some(&first) = buf.get(at) else {
        return Ok(None);
    };
    if first != prefix {
        return Err(());
    }
    let Some(nl) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() - at > 32 {
            Err(())
        } else {
            Ok(None)
        };
    };
    let digits = std::str::from_utf8(&buf[at + 1..at + nl]).map_err(|_| ())?;
    let n = digits.parse::<i64>().map_err(|_| ())?;
    Ok(Some((n, at + nl + 2)))
}

/// Parses one push frame (an array of bulk strings; `>` (RESP3) or `*`).
pub fn parse_push(buf: &[u8]) -> Frame<'_> {
    let prefix = match buf.first() {
        None => return Frame::Partial,
        Some(b'>') => b'>',
        Some(_) => b'*',
    };
    let (n, mut at) = match header(buf, 0, prefix) {
        Ok(Some(h)) => h,
        Ok(None) => return Frame::Partial,
        Err(()) => return Frame::Invalid,
    };
    if !(1..=8).contains(&n) {
        return Frame::Invalid;
    }
    let mut parts: [&[u8]; 3] = [&[], &[], &[]];
    for i in 0..n as usize {
        if buf.get(at) == Some(&b':') {
            // An integer (the subscription count of a subscribe reply).
            match header(buf, at, b':') {
                Ok(Some((_, next))) => at = next,
                Ok(None) => return Frame::Partial,
                Err(()) => return Frame::Invalid,
            }
            continue;
        }
        let (len, start) = match header(buf, at, b'$') {
            Ok(Some((len, s))) if len >= 0 => (len as usize, s),
            Ok(Some(_)) | Err(()) => return Frame::Invalid,
            Ok(None) => return Frame::Partial,
        };
        let end = start + len;
        if buf.len() < end + 2 {
            return Frame::Partial;
        }
        if let Some(slot) = parts.get_mut(i) {
            *slot = &buf[start..end];
        }
        at = end + 2;
    }
    let payload = if n >= 3 { parts[2] } else { &[] };
    Frame::Push {
        kind: parts[0],
        payload,
        len: at,
    }
}

/// Reads pushes from `src` and calls `on_push` with each one's kind and
/// payload until it returns false or the stream ends (a read timeout is an
/// error of kind WouldBlock or TimedOut).
pub fn read_pushes(
    src: &mut impl Read,
    mut on_push: impl FnMut(&[u8], &[u8]) -> bool,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let (mut start, mut end) = (0usize, 0usize);
    loop {
        loop {
            match parse_push(&buf[start..end]) {
                Frame::Push { kind, payload, len } => {
                    start += len;
                    if !on_push(kind, payload) {
                        return Ok(());
                    }
                }
                Frame::Partial => break,
                Frame::Invalid => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "not a RESP push",
                    ));
                }
            }
        }
        if start > 0 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        if end == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = src.read(&mut buf[end..])?;
        if n == 0 {
            return Ok(());
        }
        end += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_push_parses_and_a_short_one_waits() {
        let m = b"*3\r\n$7\r\nmessage\r\n$5\r\nbench\r\n$3\r\nabc\r\n";
        assert_eq!(
            parse_push(m),
            Frame::Push {
                kind: b"message",
                payload: b"abc",
                len: m.len()
            }
        );
        for cut in 0..m.len() {
            assert_eq!(parse_push(&m[..cut]), Frame::Partial, "cut at {cut}");
        }
        let sub = b"*3\r\n$9\r\nsubscribe\r\n$5\r\nbench\r\n:1\r\n";
        assert_eq!(
            parse_push(sub),
            Frame::Push {
                kind: b"subscribe",
                payload: b"",
                len: sub.len()
            }
        );
        assert_eq!(parse_push(b"+OK\r\n"), Frame::Invalid);
        assert_eq!(parse_push(b"*3\r\n$-1\r\n"), Frame::Invalid);
        assert_eq!(parse_push(b"*x\r\n"), Frame::Invalid);
    }

    #[test]
    fn pushes_are_read_across_short_reads() {
        let one = b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n";
        let mut all = Vec::new();
        for _ in 0..1000 {
            all.extend_from_slice(one);
        }
        // A reader that returns 7 bytes at a time.
        struct Slow<'a>(&'a [u8]);
        impl Read for Slow<'_> {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(7).min(b.len());
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut got = 0;
        read_pushes(&mut Slow(&all), |k, p| {
            assert_eq!((k, p), (&b"message"[..], &b"hi"[..]));
            got += 1;
            true
        })
        .expect("read");
        assert_eq!(got, 1000);
    }
}
