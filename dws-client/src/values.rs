//! The values of `dws`'s flags as clap parses them: durations (`--duration`,
//! `--ttl`, `--ack-wait`, `--interval`, the `--backoff` steps), each message
//! saying what is expected. Pure, unit-tested; `cli.rs` names them.

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
        _ => parse_nonzero_duration(s).map_err(|e| format!("{e}; or never (lives until removed)")),
    }
}

/// A humantime duration (`30s`, `5m`, `1h 30m`), more than zero and at
/// most 100 years (`proto::limits::MAX_DURATION`).
pub fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s.trim()) {
        Ok(d) if d.is_zero() => Err("must be more than 0".into()),
        Ok(d) => proto::limits::check_duration(&crate::exit::quoted(s.trim()), d),
        // humantime's message repeats the unit it did not know, whole.
        Err(humantime::DurationError::UnknownUnit { unit, .. }) if !unit.is_empty() => {
            Err(format!(
                "unknown time unit {} (expected a duration like 30s, 5m, 1h)",
                crate::exit::quoted(&unit)
            ))
        }
        Err(e) => Err(format!("{e} (expected a duration like 30s, 5m, 1h)")),
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
        let err = parse_ttl("500000000000years").unwrap_err();
        assert!(err.contains("100 years") && err.contains("never"), "{err}");
        assert_eq!(
            proto::limits::ttl_to_ms(Duration::MAX),
            proto::limits::TTL_NEVER_MS
        );
    }

    #[test]
    fn watch_interval_bounds() {
        assert!(parse_interval("50ms").is_err());
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert!(Cli::try_parse_from(["dws", "event", "status", "--interval", "1s"]).is_err());
    }
}
