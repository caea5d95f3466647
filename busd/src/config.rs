//! Command-line flags of `busd` (each with its env fallback) and the
//! resolved settings derived from them.

use std::time::Duration;

use clap::Parser;

/// The dws event bus daemon. Normally started on demand by `dws`; run it by
/// hand with `--foreground` to debug.
#[derive(Debug, Parser)]
#[command(name = "busd", version, about, long_about = None)]
pub struct Args {
    /// Profile to serve (env DWS_PROFILE; default "default").
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,

    /// Also log to stderr (the daemon never forks; `dws` detaches it).
    #[arg(long)]
    pub foreground: bool,

    /// Exit after this long with no connections and no subscriptions; 0 = never.
    #[arg(long, value_name = "DUR", env = "DWS_EVENT_BUS_IDLE_TIMEOUT", default_value = "5m",
          value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// File descriptor of the ready pipe (set by the spawning `dws`).
    #[arg(long, value_name = "FD")]
    pub ready_fd: Option<i32>,

    /// Retention: most events kept in the log.
    #[arg(long, value_name = "N", env = "DWS_EVENT_BUS_RETENTION_EVENTS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_events: u64,

    /// Retention: most bytes of events kept in the log.
    #[arg(long, value_name = "BYTES", env = "DWS_EVENT_BUS_RETENTION_BYTES", default_value_t = 64 << 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_bytes: u64,

    /// How long a subscription lives without a consumer, unless it asks otherwise.
    #[arg(long, value_name = "DUR", env = "DWS_EVENT_BUS_DEFAULT_TTL", default_value = "10m",
          value_parser = parse_nonzero_duration)]
    pub default_ttl: Duration,

    /// Most unacked events in flight to one consumer (credit window).
    #[arg(long, value_name = "N", env = "DWS_EVENT_BUS_WINDOW", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub window: u32,

    /// How many event ids the dedup window remembers.
    #[arg(long, value_name = "N", default_value_t = 65_536,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub dedup_capacity: u64,
}

/// A humantime duration (`30s`, `5m`, `1h 30m`), or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (expected a duration like 30s, 5m, 1h)"))
}

fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be more than 0".into()),
        d => Ok(d),
    }
}

/// Finds `--ready-fd N` in raw argv, for reporting a flag error on the pipe
/// when clap itself refused the command line.
pub fn ready_fd_from_argv(args: &[String]) -> Option<i32> {
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--ready-fd=")
            .map(str::to_owned)
            .or_else(|| {
                (a == "--ready-fd")
                    .then(|| args.get(i + 1).cloned())
                    .flatten()
            })
            .and_then(|v| v.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("5x").is_err());
        assert!(parse_nonzero_duration("0").is_err());
    }

    #[test]
    fn ready_fd_scan() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ready_fd_from_argv(&v(&["busd", "--ready-fd", "3"])),
            Some(3)
        );
        assert_eq!(
            ready_fd_from_argv(&v(&["busd", "--ready-fd=4", "--x"])),
            Some(4)
        );
        assert_eq!(ready_fd_from_argv(&v(&["busd"])), None);
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
