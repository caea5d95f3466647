//! The one duration grammar of every flag, variable and config value of
//! both binaries: one or more `<number><unit>` groups, optionally
//! separated by spaces — `30s`, `5m`, `1h30m`, `1h 30m`, `250ms`, `2d` — with
//! the units `ms`, `s`, `m`, `h` and `d`, lowercase. Nothing else: no
//! months or years (`5M` is not five minutes read as months), no words
//! (`1hour`), no number without its unit (`1h30`). Callers add their own
//! rules (zero allowed or not, the 100-year bound of
//! [`crate::limits::check_duration`]).

use std::time::Duration;

/// The grammar in a few words, for every message and help text.
pub const GRAMMAR: &str = "a number and a unit (ms, s, m, h, d), or several: 30s, 5m, 1h30m, 2d";

/// Why a value is not a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    Empty,
    /// A group without a number (`s`, `h5`).
    NoNumber,
    /// A number without a unit (`10`, `1h30`).
    NoUnit,
    /// A unit that is not one of ms, s, m, h, d (`M`, `y`, `hour`).
    UnknownUnit(String),
    /// More than a `u64` of milliseconds: far past any bound.
    TooLong,
}

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DurationError::Empty => write!(f, "empty: use {GRAMMAR}"),
            DurationError::NoNumber => write!(f, "a unit without a number: use {GRAMMAR}"),
            DurationError::NoUnit => write!(f, "a number without a unit: use {GRAMMAR}"),
            DurationError::UnknownUnit(u) => write!(
                f,
                "unknown time unit {}: use {GRAMMAR}",
                crate::limits::quoted(u)
            ),
            DurationError::TooLong => write!(f, "too long: at most 100 years"),
        }
    }
}

impl std::error::Error for DurationError {}

/// Parses `s` (trimmed) by the grammar of the module doc.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    // In milliseconds, the finest unit; far past any bound is TooLong.
    let mut total: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        rest = rest.trim_start_matches(' ');
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(DurationError::NoNumber);
        }
        let n: u128 = rest[..digits].parse().map_err(|_| DurationError::TooLong)?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == ' ')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms: u128 = match unit {
            "" => return Err(DurationError::NoUnit),
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            other => return Err(DurationError::UnknownUnit(other.to_owned())),
        };
        total = n
            .checked_mul(ms)
            .and_then(|p| total.checked_add(p))
            .filter(|&t| t <= u128::from(u64::MAX))
            .ok_or(DurationError::TooLong)?;
    }
    Ok(Duration::from_millis(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar_for_every_duration() {
        let s = Duration::from_secs;
        for (text, want) in [
            ("30s", s(30)),
            ("5m", s(300)),
            ("1h30m", s(5400)),
            ("1h 30m", s(5400)),
            (" 2d ", s(172_800)),
            ("250ms", Duration::from_millis(250)),
            ("0s", s(0)),
            ("1m30s", s(90)),
            ("4294967296ms", Duration::from_millis(4_294_967_296)),
        ] {
            assert_eq!(parse(text), Ok(want), "{text:?}");
        }
        for (text, why) in [
            ("", DurationError::Empty),
            ("5M", DurationError::UnknownUnit("M".into())),
            ("1y", DurationError::UnknownUnit("y".into())),
            ("1hour", DurationError::UnknownUnit("hour".into())),
            ("1 hour", DurationError::NoUnit),
            ("1h30", DurationError::NoUnit),
            ("10", DurationError::NoUnit),
            ("h", DurationError::NoNumber),
            ("-1s", DurationError::NoNumber),
            ("1.5s", DurationError::UnknownUnit(".".into())),
            ("99999999999999999999s", DurationError::TooLong),
            (
                "999999999999999999999999999999999999999999d",
                DurationError::TooLong,
            ),
        ] {
            assert_eq!(parse(text), Err(why), "{text:?}");
        }
    }
}
