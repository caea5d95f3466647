//! The values of `dws`'s flags as clap parses them: durations (`--duration`,
//! `--ttl`, `--ack-wait`, `--interval`, the `--backoff` steps), counts
//! (`--max-events`) and seqs (`get SEQ`, from 1), each message saying what
//! is valid. Pure, unit-tested; `cli.rs` names them, and lets a value that
//! starts with `-` reach them (`--duration -1s` is a negative duration, not
//! an unknown flag `-1`).

use std::time::Duration;

/// One `--backoff` step: a humantime duration (`0` allowed: at once).
pub fn parse_step(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_nonzero_duration(s)
}

/// A TTL: a duration (see [`parse_nonzero_duration`]) or `never`
/// (`Duration::MAX`: the subscription lives until removed).
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    match s.trim() {
        "never" => Ok(Duration::MAX),
        _ => parse_nonzero_duration(s).map_err(|e| format!("{e}, or never (lives until removed)")),
    }
}

/// What a duration looks like, for messages.
const LIKE: &str = "use a number and a unit (ms, s, m, h, d), or several: 30s, 5m, 1h30m";

/// A duration (`proto::duration`: `30s`, `5m`, `1h30m`), more than zero
/// and at most 100 years (`proto::limits::MAX_DURATION`).
pub fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Some(rest) = t.strip_prefix('-') {
        return Err(if rest.starts_with(|c: char| c.is_ascii_digit()) {
            format!("a duration cannot be negative: {LIKE}")
        } else {
            format!("a value is missing ({t} is a flag): {LIKE}")
        });
    }
    use proto::duration::DurationError as E;
    match proto::duration::parse(t) {
        Ok(d) if d.is_zero() => Err(format!("must be more than 0: {LIKE}")),
        Ok(d) => proto::limits::check_duration(&crate::exit::quoted(t), d),
        Err(E::UnknownUnit(unit)) => Err(format!(
            "unknown time unit {}: {LIKE}",
            crate::exit::quoted(&unit)
        )),
        Err(E::TooLong) => Err("too long: at most 100 years".into()),
        Err(E::Empty) => Err(format!("empty: {LIKE}")),
        Err(E::NoUnit) => Err(format!("a number without a unit: {LIKE}")),
        Err(E::NoNumber) => Err(format!("not a duration: {LIKE}")),
    }
}

/// `--max-events N`: a whole number of 1 or more.
pub fn parse_count(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("use a whole number of 1 or more".into()),
    }
}

/// A seq (`get SEQ`, `replay-parked SEQ…`): seqs start at 1.
pub fn parse_seq(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(n) if n >= 1 => u64::try_from(n).map_err(|_| "too large for a seq".into()),
        Ok(_) => Err("seqs start at 1 (the first event the bus took is seq 1)".into()),
        Err(_) => Err("not a seq: use a whole number from 1 (an event's \"seq\")".into()),
    }
}

/// A --watch interval: a duration of at least 100 ms.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    match parse_nonzero_duration(s)? {
        d if d < Duration::from_millis(100) => Err("must be at least 100ms".into()),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    #[test]
    fn a_ttl_is_a_bounded_duration_or_never() {
        assert_eq!(parse_ttl("never"), Ok(Duration::MAX));
        assert_eq!(parse_ttl("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_ttl("0").is_err());
        let err = parse_ttl("50000000000d").unwrap_err();
        assert!(err.contains("100 years") && err.contains("never"), "{err}");
        assert_eq!(
            proto::limits::ttl_to_ms(Duration::MAX),
            proto::limits::TTL_NEVER_MS
        );
    }

    #[test]
    fn a_bad_duration_says_what_a_duration_is() {
        for (input, says) in [
            ("forever", "not a duration: use a number and a unit"),
            ("-1s", "cannot be negative"),
            ("--quiet", "a value is missing (--quiet is a flag)"),
            ("5x", "unknown time unit \"x\""),
            // Issue 44, item 4: one grammar — no months, no words, no
            // number without its unit; combinations are fine.
            ("5M", "unknown time unit \"M\""),
            ("1hour", "unknown time unit \"hour\""),
            ("1h30", "a number without a unit"),
            ("0s", "must be more than 0"),
            ("", "empty"),
        ] {
            let e = parse_nonzero_duration(input).unwrap_err();
            assert!(e.contains(says), "{input:?}: {e}");
            assert!(!e.contains(" at 0"), "{input:?}: {e}");
        }
        assert_eq!(
            parse_nonzero_duration("1h30m"),
            Ok(Duration::from_secs(5400))
        );
        let e = parse_ttl("forever").unwrap_err();
        assert!(e.ends_with(", or never (lives until removed)"), "{e}");
    }

    #[test]
    fn counts_and_seqs_start_at_1() {
        assert_eq!(parse_count("3"), Ok(3));
        for bad in ["0", "-1", "x"] {
            assert!(parse_count(bad).unwrap_err().contains("1 or more"));
        }
        assert_eq!(parse_seq("7"), Ok(7));
        for bad in ["0", "-1"] {
            assert!(parse_seq(bad).unwrap_err().contains("seqs start at 1"));
        }
        assert!(parse_seq("x").unwrap_err().contains("not a seq"));
        assert!(parse_seq("99999999999999999999999").is_err());
    }

    #[test]
    fn watch_interval_bounds() {
        assert!(parse_interval("50ms").is_err());
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert!(Cli::try_parse_from(["dws", "event", "status", "--interval", "1s"]).is_err());
    }
}
