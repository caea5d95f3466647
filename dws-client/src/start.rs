//! `--from` on the command line (consume, subscribe): latest, earliest, a
//! seq, or an RFC 3339 time; the time parser `seek --to` shares. Pure.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Latest,
    Earliest,
    Seq(u64),
    /// A time, unix ms: the first retained event received at or after it.
    Time(i64),
}

/// `--from`: latest, earliest, a seq, or a time.
pub fn parse_from(s: &str) -> Result<From, String> {
    match s {
        "latest" => Ok(From::Latest),
        "earliest" => Ok(From::Earliest),
        _ if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s
            .parse()
            .map(From::Seq)
            .map_err(|_| "the sequence number is too large".to_owned()),
        _ => parse_time_ms(s).map(From::Time).ok_or_else(|| {
            "expected latest, earliest, a sequence number or a time like 2026-11-30T12:00:00Z"
                .to_owned()
        }),
    }
}

/// An RFC 3339 time (`Z` or an offset like `+08:00`; as `seek --to`
/// accepts) as unix ms; `None` if it is not one or is before 1970.
pub fn parse_time_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let (local, offset_ms) = match split_offset(s) {
        Some((local, ms)) => (local, ms),
        None => (s, 0),
    };
    let ms = humantime::parse_rfc3339_weak(local)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())?;
    Some(ms - offset_ms).filter(|ms| *ms >= 0)
}

/// `…T12:00:00+08:00` → (`…T12:00:00`, +8 h in ms).
fn split_offset(s: &str) -> Option<(&str, i64)> {
    let cut = s.len().checked_sub(6)?;
    let (local, tail) = (s.get(..cut)?, s.get(cut..)?);
    let b = tail.as_bytes();
    let sign = match b[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits = |x: &[u8]| -> Option<i64> {
        x.iter().all(u8::is_ascii_digit).then_some(())?;
        Some(i64::from(x[0] - b'0') * 10 + i64::from(x[1] - b'0'))
    };
    let (h, m) = (digits(&b[1..3])?, digits(&b[4..6])?);
    (b[3] == b':' && local.contains('T') && h < 24 && m < 60)
        .then_some((local, sign * (h * 60 + m) * 60_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_takes_a_seq_or_a_time() {
        assert_eq!(parse_from("7"), Ok(From::Seq(7)));
        assert_eq!(parse_from("earliest"), Ok(From::Earliest));
        assert_eq!(
            parse_from("2026-11-30T12:00:00Z"),
            Ok(From::Time(1_796_040_000_000))
        );
        assert_eq!(
            parse_from("2026-11-30T12:00:00.250Z"),
            Ok(From::Time(1_796_040_000_250))
        );
        assert_eq!(
            parse_from("2026-11-30T20:00:00+08:00"),
            Ok(From::Time(1_796_040_000_000))
        );
        assert_eq!(
            parse_from("2026-11-30T11:30:00-00:30"),
            Ok(From::Time(1_796_040_000_000))
        );
        assert!(parse_from("2026-11-30T20:00:00+8:00").is_err());
        assert!(parse_from("yesterday").is_err());
        assert!(parse_from("").is_err());
        assert!(parse_from("99999999999999999999999").is_err());
    }
}
