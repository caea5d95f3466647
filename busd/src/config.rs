//! Command-line flags of `busd` (each with its env fallback) and the
//! resolved settings derived from them.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{parser::ValueSource, CommandFactory, FromArgMatches, Parser, ValueEnum};

/// `busd --version`: the build and the protocol version it speaks, the same
/// line as `dws --version` (checked by a test against `proto`).
pub const VERSION: &str = proto::VERSION_LINE;

/// The dws event bus daemon. Normally started on demand by `dws`; run it by
/// hand with `--foreground` to debug, or under systemd (see
/// contrib/systemd/dws-bus@.service).
///
/// With `--foreground` and NOTIFY_SOCKET set (a Type=notify unit), busd
/// speaks the readiness protocol (READY=1, STATUS=, STOPPING=1, and
/// WATCHDOG=1 at half of WATCHDOG_USEC) and its idle timeout defaults to 0
/// (never): a service stays up until stopped. A listening socket passed by
/// systemd (LISTEN_FDS=1, LISTEN_PID) is served instead of binding one; it
/// must be bound at the profile's socket path (--print-socket-path).
#[derive(Debug, Parser)]
#[command(name = "busd", version = VERSION, about, long_about)]
pub struct Args {
    /// Profile to serve (env DWS_PROFILE; default "default").
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,

    /// Also log to stderr (the daemon never forks; `dws` detaches it).
    #[arg(long)]
    pub foreground: bool,

    /// Exit after this long with no connections and no subscriptions; 0 = never
    /// [default: 5m; 0 under a service manager (--foreground with NOTIFY_SOCKET)].
    #[arg(long, value_name = "DUR", env = "DWS_EVENT_BUS_IDLE_TIMEOUT", default_value = "5m",
          hide_default_value = true, value_parser = parse_duration)]
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

    /// The newest retained events whose bytes stay in memory (the hot tail);
    /// older ones are read back from the store's files (disk store).
    #[arg(long, value_name = "N", env = "DWS_EVENT_BUS_HOT_EVENTS", default_value_t = 16_384,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub hot_events: u64,

    /// How long a subscription lives without a consumer, unless it asks otherwise.
    #[arg(long, value_name = "DUR", env = "DWS_EVENT_BUS_DEFAULT_TTL", default_value = "10m",
          value_parser = parse_nonzero_duration)]
    pub default_ttl: Duration,

    /// Most unacked events in flight to one consumer (credit window). It
    /// must exceed what the buffers between the bus and the consumer's
    /// stdout hold (about 1,500 lines of 256 B events), or the stream waits
    /// for acks with those buffers half empty: at 1,024 a catch-up ran at
    /// half the speed of 4,096.
    #[arg(long, value_name = "N", env = "DWS_EVENT_BUS_WINDOW", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub window: u32,

    /// How many event ids the dedup window remembers.
    #[arg(long, value_name = "N", default_value_t = 65_536,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub dedup_capacity: u64,

    /// Format of bus.log (and of stderr with --foreground): text, or json
    /// (one JSON object per line, for log shippers).
    #[arg(long, value_enum, value_name = "FORMAT", env = "DWS_BUS_LOG_FORMAT",
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Check every profile of config.toml on its own (its keys, the secret
    /// files it names, whether its upstream accepts a TCP connection), print
    /// one JSON object per check and exit; `dws event doctor` shows them.
    #[arg(long)]
    pub doctor: bool,

    /// Print this profile's socket path (where `dws` looks for the bus and
    /// where a systemd socket unit must listen) and exit.
    #[arg(long)]
    pub print_socket_path: bool,

    /// Write the busd(1) man page into DIR and exit.
    #[arg(long, value_name = "DIR")]
    pub generate_man: Option<PathBuf>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `2026-01-01T00:00:00.000000Z  INFO busd: message key=value`.
    Text,
    /// `{"timestamp":…,"level":"INFO","fields":{"message":…},"target":…}`.
    Json,
}

impl Args {
    /// Parses argv like `try_parse_from`, then applies the service default:
    /// a supervised run ([`crate::notify::supervised`]) whose idle timeout
    /// was not given (neither `--idle-timeout` nor
    /// `DWS_EVENT_BUS_IDLE_TIMEOUT`) never exits idle.
    pub fn parse_from_argv(argv: &[String]) -> Result<Args, clap::Error> {
        let matches = Args::command().try_get_matches_from(argv)?;
        let mut args = Args::from_arg_matches(&matches)?;
        let explicit = matches.value_source("idle_timeout") != Some(ValueSource::DefaultValue);
        args.idle_timeout = idle_timeout(
            args.idle_timeout,
            explicit,
            crate::notify::supervised(args.foreground),
        );
        Ok(args)
    }
}

/// A flag error's message naming the flag (`'--idle-timeout <DUR>'`) when
/// the value came from its environment variable, which the user set (they
/// never typed the flag): the variable is named instead.
pub fn name_the_variable(message: &str, argv: &[String]) -> String {
    for arg in Args::command().get_arguments() {
        let (Some(long), Some(var)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let flag = format!("--{long}");
        let typed = argv
            .iter()
            .any(|a| a == &flag || a.starts_with(&format!("{flag}=")));
        let quoted = format!("'{flag}");
        let Some(at) = message.find(&quoted) else {
            continue;
        };
        if typed || std::env::var_os(var).is_none() {
            continue;
        }
        let Some(len) = message[at + 1..].find('\'') else {
            continue;
        };
        return format!(
            "{}{}{}",
            &message[..at],
            var.to_string_lossy(),
            &message[at + len + 2..]
        );
    }
    message.to_owned()
}

/// The effective idle timeout: `given` unless it is only the default and the
/// bus runs under a service manager, where idling out would look like a crash.
pub fn idle_timeout(given: Duration, explicit: bool, supervised: bool) -> Duration {
    if supervised && !explicit {
        Duration::ZERO
    } else {
        given
    }
}

/// Writes `busd.1` into `dir` (created if missing); returns its path.
pub fn write_man_page(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::Man::new(Args::command()).generate_to(dir)
}

/// A duration (`proto::duration`: `30s`, `5m`, `1h30m`), or `0`; at most
/// [`proto::limits::MAX_DURATION`] (100 years).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    let d = proto::duration::parse(s).map_err(DurationError::Syntax)?;
    proto::limits::check_duration(&proto::limits::quoted(s.trim()), d).map_err(DurationError::Bound)
}

fn parse_nonzero_duration(s: &str) -> Result<Duration, DurationError> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(DurationError::Zero),
        d => Ok(d),
    }
}

/// Why a duration flag value is refused (clap prints the message).
#[derive(Debug, thiserror::Error)]
pub enum DurationError {
    #[error("{0}")]
    Syntax(proto::duration::DurationError),
    /// Over [`proto::limits::MAX_DURATION`].
    #[error("{0}")]
    Bound(String),
    #[error("must be more than 0")]
    Zero,
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
        assert!(parse_duration("36500d").is_ok());
        assert!(parse_duration("5M").is_err(), "no months");
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        let err = parse_duration("50000000000d").unwrap_err();
        assert!(err.to_string().contains("100 years"), "{err}");
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
    fn the_idle_timeout_is_off_only_for_a_supervised_default() {
        let five = Duration::from_secs(300);
        assert_eq!(idle_timeout(five, false, true), Duration::ZERO);
        assert_eq!(idle_timeout(five, true, true), five);
        assert_eq!(idle_timeout(five, false, false), five);
        assert_eq!(idle_timeout(Duration::ZERO, true, false), Duration::ZERO);
    }

    #[test]
    fn an_explicit_idle_timeout_is_kept() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let args = Args::parse_from_argv(&v(&["busd", "--idle-timeout", "7s"])).unwrap();
        assert_eq!(args.idle_timeout, Duration::from_secs(7));
        let args = Args::parse_from_argv(&v(&["busd", "--log-format", "json"])).unwrap();
        assert_eq!(args.log_format, LogFormat::Json);
        assert!(Args::parse_from_argv(&v(&["busd", "--log-format", "xml"])).is_err());
    }

    #[test]
    fn the_man_page_renders() {
        let dir = tempfile::tempdir().unwrap();
        let page = write_man_page(dir.path()).unwrap();
        assert_eq!(page.file_name().unwrap(), "busd.1");
        let text = std::fs::read_to_string(page).unwrap();
        assert!(text.contains(".TH busd 1"), "{text}");
        assert!(text.contains(r"idle\-timeout"), "{text}");
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
