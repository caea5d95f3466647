//! Validation of `dws event consume`'s flags into a [`Plan`]: every check,
//! no I/O, every failure a usage error (exit 2). Also what the plan implies
//! that is not a flag: whether stdin's end ends the run, in every mode
//! ([`stdin_eof_armed`]) and the `--dry-run` document ([`Plan::describe`]).

use std::{
    io::{self, IsTerminal},
    os::fd::{AsFd, AsRawFd},
    time::Duration,
};

use proto::{paths::Endpoint, v1};

use crate::{
    cli::{ConsumeArgs, DataMode, Format, From},
    exit::{CliError, Result},
    validate,
};

/// A consume run after validation: everything needed, nothing connected.
#[derive(Debug)]
pub struct Plan {
    pub keys: Vec<String>,
    pub filter: String,
    /// `--where` jq expressions (ANDed).
    pub wheres: Vec<String>,
    pub subscribe_id: Option<String>,
    pub ephemeral: bool,
    pub from: From,
    pub ttl: Option<Duration>,
    pub max_events: Option<u64>,
    pub duration: Option<Duration>,
    pub format: Format,
    /// `--data`: the payload as a string (the default) or a JSON value.
    pub data: DataMode,
    pub quiet: bool,
    pub takeover: bool,
    pub dry_run: bool,
    pub upstream: Option<v1::UpstreamSpec>,
    /// `--ack explicit`: how long an unacked event waits before it comes again.
    pub explicit_ack: Option<Duration>,
    /// `--ack-wait` was given (else the subscription's default, or 30 s).
    pub ack_wait_named: bool,
    /// `--max-in-flight`: the credit window (0: the bus's default).
    pub window: u32,
    pub max_deliver: u32,
    pub on_poison: v1::PoisonPolicy,
    /// `--backoff`, in ms (empty: redeliver at once).
    pub backoff_ms: Vec<u64>,
}

/// `--ack-wait` when neither the run nor its subscription names one.
pub const DEFAULT_ACK_WAIT: Duration = proto::limits::DEFAULT_ACK_WAIT;

/// `--max-deliver` / `--on-poison`, checked: what a new subscription gets.
pub fn poison(args: &crate::cli::PoisonArgs) -> Result<(u32, v1::PoisonPolicy)> {
    use crate::cli::OnPoison;
    let policy = match args.on_poison {
        None | Some(OnPoison::Halt) => v1::PoisonPolicy::PoisonHalt,
        Some(OnPoison::Park) => v1::PoisonPolicy::PoisonPark,
    };
    if args.on_poison.is_some() && args.max_deliver.unwrap_or(0) == 0 {
        return Err(CliError::usage(
            "--on-poison needs --max-deliver N (N >= 1): without a limit nothing is poison",
        ));
    }
    Ok((args.max_deliver.unwrap_or(0), policy))
}

/// `--backoff`, checked against the bus's rule: the steps in ms.
pub fn backoff(args: &crate::cli::PoisonArgs) -> Result<Vec<u64>> {
    let steps: Vec<u64> = args
        .backoff
        .iter()
        .flatten()
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .collect();
    proto::limits::check_backoff(&steps).map_err(CliError::usage)?;
    Ok(steps)
}

/// Checks every flag; no I/O. Errors are usage errors (exit 2).
pub fn plan(args: ConsumeArgs) -> Result<Plan> {
    let keys = validate::event_keys(&args.keys)?;
    if keys.is_empty() && args.subscribe_id.is_none() {
        return Err(CliError::usage(
            "at least one EVENT_KEY is required (or --subscribe-id to resume a subscription)",
        ));
    }
    if let Some(id) = &args.subscribe_id {
        validate::subscription_id("--subscribe-id", id)?;
    }
    let filter = validate::filter(args.filter)?;
    let wheres = validate::wheres(args.where_exprs)?;
    if !wheres.is_empty() && args.subscribe_id.is_some() && keys.is_empty() {
        return Err(CliError::usage(
            "--where with --subscribe-id needs the EVENT_KEYs too: they and the expressions are compared with the subscription's",
        ));
    }
    let upstream = validate::upstream(&keys, &args.upstream)?;
    if upstream.is_some() && args.subscribe_id.is_some() {
        return Err(CliError::usage(
            "--rule, --user, --open-dingtalk-id, --group, --query and --filter-json apply to a subscription this run creates; they cannot be used with --subscribe-id",
        ));
    }
    let bounded = args.max_events.is_some() || args.duration.is_some();
    if args.format == Format::Json && !bounded {
        return Err(CliError::usage(
            "--format json writes one array and needs a bound: add --max-events or --duration (or use --format ndjson)",
        ));
    }
    if args.subscribe_id.is_some() && (args.from.is_some() || args.ttl.is_some()) {
        return Err(CliError::usage(
            "--from and --ttl apply to a subscription this run creates; they cannot be used with --subscribe-id",
        ));
    }
    if args.subscribe_id.is_some()
        && (args.poison.max_deliver.is_some()
            || args.poison.on_poison.is_some()
            || args.poison.backoff.is_some())
    {
        return Err(CliError::usage(
            "--max-deliver, --on-poison and --backoff apply to a subscription this run creates; set them with `dws event subscribe`",
        ));
    }
    let (max_deliver, on_poison) = poison(&args.poison)?;
    let backoff_ms = backoff(&args.poison)?;
    let explicit_ack = match (args.ack, args.ack_wait) {
        (crate::cli::AckMode::Explicit, wait) => Some(wait.unwrap_or(DEFAULT_ACK_WAIT)),
        (crate::cli::AckMode::Write, Some(_)) => {
            return Err(CliError::usage("--ack-wait applies to --ack explicit"))
        }
        (crate::cli::AckMode::Write, None) => None,
    };
    Ok(Plan {
        keys,
        filter,
        wheres,
        subscribe_id: args.subscribe_id,
        ephemeral: args.ephemeral,
        from: args.from.unwrap_or(From::Latest),
        ttl: args.ttl,
        max_events: args.max_events,
        duration: args.duration,
        format: args.format,
        data: args.data,
        quiet: args.quiet,
        takeover: args.takeover,
        dry_run: args.dry_run,
        upstream,
        explicit_ack,
        ack_wait_named: args.ack_wait.is_some(),
        window: match args.max_in_flight {
            None => 0,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|&n| n <= proto::limits::MAX_WINDOW)
                .ok_or_else(|| {
                    CliError::usage(format!(
                        "--max-in-flight {n}: the most is {}",
                        proto::limits::MAX_WINDOW
                    ))
                })?,
        },
        max_deliver,
        on_poison,
        backoff_ms,
    })
}

impl Plan {
    pub(super) fn owned(&self) -> bool {
        self.subscribe_id.is_none() || self.ephemeral
    }

    /// The resolved configuration, printed by `--dry-run`.
    pub fn describe(&self, endpoint: &Endpoint, stdin_eof_exits: bool) -> serde_json::Value {
        serde_json::json!({
            "profile": endpoint.profile,
            "socket": endpoint.socket_path,
            "work_dir": endpoint.work_dir,
            "event_keys": self.keys,
            "filter": (!self.filter.is_empty()).then_some(&self.filter),
            "where": self.wheres,
            "subscribe_id": self.subscribe_id,
            "remove_subscription_on_exit": self.owned(),
            "from": match self.from {
                From::Latest => serde_json::json!("latest"),
                From::Earliest => serde_json::json!("earliest"),
                From::Seq(n) => serde_json::json!(n),
                From::Time(ms) => serde_json::json!({ "time_unix_ms": ms }),
            },
            "ttl_ms": self.ttl.map(proto::limits::ttl_to_ms),
            "max_events": self.max_events,
            "duration_ms": self.duration.map(|d| d.as_millis() as u64),
            "format": format!("{:?}", self.format).to_lowercase(),
            "quiet": self.quiet,
            "takeover": self.takeover,
            "upstream": self.upstream.as_ref().map(|u| serde_json::json!({
                "rule_type": u.rule_type,
                "user": u.user,
                "open_dingtalk_id": u.open_dingtalk_id,
                "group": u.group,
                "query": u.query,
                "filter_json": u.filter_json,
                "name": u.name,
            })),
            "stdin_eof_exits": stdin_eof_exits,
            "ack": if self.explicit_ack.is_some() { "explicit" } else { "write" },
            "ack_wait_ms": self.explicit_ack.map(|d| d.as_millis() as u64),
            "max_deliver": self.max_deliver,
            "on_poison": if self.on_poison == v1::PoisonPolicy::PoisonPark { "park" } else { "halt" },
            "backoff_ms": self.backoff_ms,
        })
    }
}

/// EOF on stdin ends a run (bounded or not) when stdin is a pipe, socket
/// or regular file: a terminal or `/dev/null` (a character device) never
/// arms it.
pub fn stdin_eof_armed() -> bool {
    let stdin = io::stdin();
    let kind = nix::sys::stat::fstat(stdin.as_fd().as_raw_fd())
        .map(|st| st.st_mode & nix::libc::S_IFMT)
        .ok();
    eof_arms(stdin.is_terminal(), kind)
}

/// The rule of [`stdin_eof_armed`]: a stdin of this file type (`S_IFMT`
/// bits; `None` when it cannot be told) arms the end of stdin.
fn eof_arms(terminal: bool, kind: Option<nix::libc::mode_t>) -> bool {
    use nix::libc::{S_IFIFO, S_IFREG, S_IFSOCK};
    !terminal && kind.is_some_and(|k| k == S_IFIFO || k == S_IFREG || k == S_IFSOCK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cli::{Cli, EventCmd, Top},
        exit::USAGE,
    };
    use clap::Parser;

    fn args(flags: &[&str]) -> ConsumeArgs {
        let argv = ["dws", "event", "consume"].iter().chain(flags);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Top::Event(EventCmd::Consume(args))) => args,
            other => panic!("not a consume command line: {other:?}"),
        }
    }

    fn refused(flags: &[&str]) -> String {
        match plan(args(flags)) {
            Ok(p) => panic!("{flags:?} was accepted: {p:?}"),
            Err(e) => {
                assert_eq!(e.code, USAGE, "{flags:?}: {}", e.message);
                e.message
            }
        }
    }

    #[test]
    fn every_usage_error_is_exit_2_with_its_message() {
        let cases: &[(&[&str], &str)] = &[
            (
                &[],
                "at least one EVENT_KEY is required (or --subscribe-id to resume a subscription)",
            ),
            (
                &["--subscribe-id", "a/b"],
                "invalid --subscribe-id \"a/b\": use 1-64 characters from A-Z a-z 0-9 . _ -",
            ),
            (
                &["user_im_message_receive_at", "--subscribe-id", "s1"],
                "--rule, --user, --open-dingtalk-id, --group, --query and --filter-json apply to a \
                 subscription this run creates; they cannot be used with --subscribe-id",
            ),
            (
                &["a.b", "--format", "json"],
                "--format json writes one array and needs a bound: add --max-events or --duration \
                 (or use --format ndjson)",
            ),
            (
                &["--subscribe-id", "s1", "--from", "earliest"],
                "--from and --ttl apply to a subscription this run creates; they cannot be used \
                 with --subscribe-id",
            ),
            (
                &["--subscribe-id", "s1", "--ttl", "5m"],
                "--from and --ttl apply to a subscription this run creates; they cannot be used \
                 with --subscribe-id",
            ),
            (
                &["--subscribe-id", "s1", "--max-deliver", "3"],
                "--max-deliver, --on-poison and --backoff apply to a subscription this run creates; set them \
                 with `dws event subscribe`",
            ),
            (
                &["--subscribe-id", "s1", "--on-poison", "park"],
                "--max-deliver, --on-poison and --backoff apply to a subscription this run creates; set them \
                 with `dws event subscribe`",
            ),
            (
                &["a.b", "--on-poison", "park"],
                "--on-poison needs --max-deliver N (N >= 1): without a limit nothing is poison",
            ),
            (
                &["a.b", "--max-deliver", "0", "--on-poison", "halt"],
                "--on-poison needs --max-deliver N (N >= 1): without a limit nothing is poison",
            ),
            (
                &["a.b", "--ack-wait", "5s"],
                "--ack-wait applies to --ack explicit",
            ),
        ];
        for (flags, message) in cases {
            assert_eq!(refused(flags), *message, "{flags:?}");
        }
    }

    #[test]
    fn checks_of_the_shared_validators_are_usage_errors_too() {
        assert!(refused(&["a!b"]).starts_with("invalid event key"));
        assert!(refused(&["a.b", "--filter", "("]).starts_with("invalid --filter regex"));
        assert!(refused(&["a.b", "--rule", "nope"]).starts_with("invalid --rule"));
    }

    #[test]
    fn defaults_of_a_new_subscription() {
        let p = plan(args(&["a.b,c.*", "x.y"])).unwrap();
        assert_eq!(p.keys, ["a.b", "c.*", "x.y"]);
        assert!(p.filter.is_empty());
        assert_eq!(p.from, From::Latest);
        assert!(p.owned());
        assert_eq!((p.max_events, p.duration), (None, None));
        assert_eq!(p.explicit_ack, None);
        assert_eq!(
            (p.max_deliver, p.on_poison),
            (0, v1::PoisonPolicy::PoisonHalt)
        );
        assert_eq!(p.upstream, None);
    }

    #[test]
    fn explicit_acks_wait_30s_unless_told() {
        let p = plan(args(&["a.b", "--ack", "explicit"])).unwrap();
        assert_eq!(p.explicit_ack, Some(DEFAULT_ACK_WAIT));
        let p = plan(args(&["a.b", "--ack", "explicit", "--ack-wait", "5s"])).unwrap();
        assert_eq!(p.explicit_ack, Some(Duration::from_secs(5)));
    }

    #[test]
    fn a_resumed_subscription_is_owned_only_when_ephemeral() {
        let p = plan(args(&["--subscribe-id", "s1"])).unwrap();
        assert!(p.keys.is_empty());
        assert!(!p.owned());
        let p = plan(args(&["--subscribe-id", "s1", "--ephemeral"])).unwrap();
        assert!(p.owned());
    }

    #[test]
    fn poison_flags() {
        let p = plan(args(&["a.b", "--max-deliver", "3", "--on-poison", "park"])).unwrap();
        assert_eq!(
            (p.max_deliver, p.on_poison),
            (3, v1::PoisonPolicy::PoisonPark)
        );
        let p = plan(args(&["a.b", "--max-deliver", "2"])).unwrap();
        assert_eq!(
            (p.max_deliver, p.on_poison),
            (2, v1::PoisonPolicy::PoisonHalt)
        );
    }

    #[test]
    fn pipes_sockets_and_files_arm_the_end_of_stdin_terminals_and_devices_do_not() {
        use nix::libc::{S_IFCHR, S_IFIFO, S_IFREG, S_IFSOCK};
        for kind in [S_IFIFO, S_IFREG, S_IFSOCK] {
            assert!(eof_arms(false, Some(kind)));
            assert!(!eof_arms(true, Some(kind)));
        }
        assert!(!eof_arms(false, Some(S_IFCHR)), "/dev/null");
        assert!(!eof_arms(false, None));
    }

    #[test]
    fn dry_run_document() {
        let endpoint = Endpoint {
            profile: "p".into(),
            config_root: "/c".into(),
            work_dir: "/c/events/p".into(),
            socket_dir: "/r".into(),
            socket_path: "/r/p.sock".into(),
        };
        let p = plan(args(&["a.b", "--from", "7", "--ack", "explicit"])).unwrap();
        let doc = p.describe(&endpoint, true);
        assert_eq!(doc["profile"], "p");
        assert_eq!(doc["event_keys"], serde_json::json!(["a.b"]));
        assert_eq!(doc["filter"], serde_json::Value::Null);
        assert_eq!(doc["from"], 7);
        assert_eq!(doc["remove_subscription_on_exit"], true);
        assert_eq!(doc["format"], "ndjson");
        assert_eq!(doc["stdin_eof_exits"], true);
        assert_eq!(doc["ack"], "explicit");
        assert_eq!(doc["ack_wait_ms"], 30_000);
        assert_eq!(doc["on_poison"], "halt");
    }
}
