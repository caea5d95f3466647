//! The command line of `dws`: the single source of its help text.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::values::{
    parse_count, parse_interval, parse_nonzero_duration, parse_seq, parse_step, parse_ttl,
};

mod logs;
mod publish;
pub use logs::LogsArgs;
pub use publish::PublishArgs;

/// `dws --version`: the build and the protocol version it speaks, the same
/// line as `busd --version` (checked by a test against `proto`).
pub const VERSION: &str = proto::VERSION_LINE;

/// dws: attach to the local dws event bus and stream its events.
#[derive(Debug, Parser)]
#[command(name = "dws", version = VERSION, about, long_about = None, arg_required_else_help = true,
          styles = crate::colour::styles())]
pub struct Cli {
    /// Profile (one bus per profile). Env DWS_PROFILE; default "default".
    #[arg(long, global = true, value_name = "NAME")]
    pub profile: Option<String>,

    #[command(subcommand)]
    pub command: Top,
}

// Parsed once per process: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Top {
    /// Event bus commands.
    #[command(subcommand, arg_required_else_help = true)]
    Event(EventCmd),
    Completions(CompletionsArgs),
    Manpages(ManpagesArgs),
}

/// Print the shell completion script for dws.
///
/// bash: `dws completions bash > ~/.local/share/bash-completion/completions/dws`;
/// zsh: `dws completions zsh > "${fpath[1]}/_dws"`;
/// fish: `dws completions fish > ~/.config/fish/completions/dws.fish`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// Write the man pages of dws and its subcommands into DIR.
///
/// One page per command (dws.1, dws-event.1, dws-event-consume.1, …); their
/// paths are printed. busd's page comes from `busd --generate-man DIR`. Then e.g.
/// `MANPATH=DIR/..: man dws-event-consume`, or write them into
/// ~/.local/share/man/man1.
#[derive(Debug, Args)]
pub struct ManpagesArgs {
    /// Directory to write into (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: std::path::PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum EventCmd {
    Consume(ConsumeArgs),
    Publish(PublishArgs),
    Status(StatusArgs),
    Stop(StopArgs),
    Restart(RestartArgs),
    Doctor(DoctorArgs),
    Subscribe(SubscribeArgs),
    Unsubscribe(UnsubscribeArgs),
    Get(GetArgs),
    Logs(LogsArgs),
    /// The running bus's subscription ids, one a line (for completion
    /// scripts; prints nothing without a bus, never starts one).
    #[command(name = "__subscription-ids", hide = true)]
    SubscriptionIds,
    /// The subscriptions (list, info) and operator verbs on one: restart,
    /// skip, disable, enable, seek, parked, replay-parked.
    #[command(subcommand, arg_required_else_help = true)]
    Subscription(SubscriptionVerb),
}

/// Stream events as NDJSON on stdout (starts the bus if needed).
///
/// stderr carries exactly a ready line, after the subscription is confirmed
/// and before any event, and an exited line with the reason (limit, timeout,
/// signal, bus_shutdown, stopped, taken_over, source_lost, halted); on failure it carries one `Error:` line
/// instead, with exit code 1 (runtime), 2 (usage) or 3 (permission). A bus
/// that vanished without saying goodbye (crash, kill -9) adds the line
/// `[event] bus connection lost without goodbye` before the exited line.
///
/// Stop a consumer with SIGTERM, SIGINT or by closing its stdin: EOF on a
/// stdin that is a pipe, a socket or a file ends every run, one with
/// --max-events or --duration too (reason: signal); a terminal or /dev/null
/// never does. To keep a run alive with a pipe, feed it one that never
/// ends: `dws event consume KEY --duration 1h < <(tail -f /dev/null)`. Do
/// not use `kill -9`: the run cannot clean up, and its subscription lingers
/// until its TTL expires.
///
/// DUR, here and in every dws command: a number and a unit (ms, s, m, h, d),
/// or several: 30s, 5m, 1h30m, 2d.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Event keys: exact (im.message), prefix (im.*) or all (*); no empty segment (a..b, .a, a.).
    /// Optional with --subscribe-id.
    #[arg(value_name = "EVENT_KEY")]
    pub keys: Vec<String>,

    /// Only events whose type matches this regex.
    #[arg(long, value_name = "RE")]
    pub filter: Option<String>,

    /// Only events for which this jq expression's first output is truthy, evaluated by the bus on the
    /// event's line (data parsed when it is JSON). Repeatable: all must hold.
    #[arg(long = "where", value_name = "EXPR")]
    pub where_exprs: Vec<String>,

    /// Attach to this existing subscription and resume after its cursor.
    #[arg(long, value_name = "ID")]
    pub subscribe_id: Option<String>,

    /// Remove the subscription on exit even if it was reused through --subscribe-id.
    #[arg(long)]
    pub ephemeral: bool,

    /// Where a new subscription starts: latest (default), earliest, a seq,
    /// or a time (RFC 3339, e.g. 2026-11-30T12:00:00Z: the first retained
    /// event received at or after it).
    #[arg(long, value_name = "latest|earliest|SEQ|TIME", value_parser = crate::start::parse_from)]
    pub from: Option<From>,

    /// How `data` is written: string (default: the payload as a JSON
    /// string) or json (the payload as a JSON value when it is valid JSON,
    /// the string otherwise).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = DataMode::String)]
    pub data: DataMode,

    /// How long a subscription this run creates outlives a run that could
    /// not remove it (default 10m), or never.
    #[arg(long, value_name = "DUR|never", value_parser = parse_ttl, allow_hyphen_values = true)]
    pub ttl: Option<Duration>,

    /// Exit after N events (reason: limit).
    #[arg(long, value_name = "N", value_parser = parse_count, allow_negative_numbers = true)]
    pub max_events: Option<u64>,

    /// Exit after this long, e.g. 30s, 5m (reason: timeout).
    #[arg(long, value_name = "DUR", value_parser = parse_nonzero_duration, allow_hyphen_values = true)]
    pub duration: Option<Duration>,

    /// Output format. `json` (one array) needs --max-events or --duration.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Ndjson)]
    pub format: Format,

    /// Print nothing on stderr except an error.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// Print the resolved configuration as JSON and exit; connect to nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Detach the subscription's current consumer instead of failing.
    #[arg(long)]
    pub takeover: bool,

    /// write: an event is acked once it reached stdout. explicit: only when
    /// a line `ack SEQ`, `ack-upto SEQ` or `nack SEQ [DELAY]` arrives on
    /// stdin (`progress SEQ`: still working; `term SEQ [REASON]`: park it).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = AckMode::Write)]
    pub ack: AckMode,

    /// With --ack explicit: an event sent but not acked within this long is delivered again.
    #[arg(long, value_name = "DUR", value_parser = parse_nonzero_duration, allow_hyphen_values = true)]
    pub ack_wait: Option<Duration>,

    /// Most events unacked at once to this consumer (its credit window);
    /// default: the bus's (4096), or 16 for a shared subscription.
    #[arg(long, value_name = "N", value_parser = parse_count, allow_negative_numbers = true)]
    pub max_in_flight: Option<u64>,

    #[command(flatten)]
    pub poison: PoisonArgs,

    #[command(flatten)]
    pub upstream: UpstreamArgs,
}

/// How an event's `data` is written (`--data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum DataMode {
    /// The payload as a JSON string (the contract's default).
    #[default]
    String,
    /// The payload as a JSON value when it is valid JSON, else the string.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AckMode {
    Write,
    Explicit,
}

/// Poison handling and redelivery backoff of a subscription being created.
#[derive(Debug, Clone, Default, Args)]
pub struct PoisonArgs {
    /// An event delivered this many times without an ack is poison (default 0: unlimited).
    #[arg(long, value_name = "N")]
    pub max_deliver: Option<u32>,

    /// What poison does: halt the subscription at it (default) or park it and go on.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub on_poison: Option<OnPoison>,

    /// Delays before the 1st, 2nd, … redelivery after an ack-wait expiry or
    /// a nack without a delay (e.g. 1s,10s,1m,10m; the last one repeats).
    /// Default: at once.
    #[arg(long, value_name = "DUR,...", value_delimiter = ',', value_parser = parse_step,
          allow_hyphen_values = true)]
    pub backoff: Option<Vec<Duration>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnPoison {
    Halt,
    Park,
}

/// An operator verb on one subscription. Each prints the subscription's
/// state after the change; exit 1 when its state does not allow the verb.
#[derive(Debug, Subcommand)]
pub enum SubscriptionVerb {
    /// List the subscriptions: id, state, keys, lag, pending, consumer.
    List(ListArgs),
    /// Show one subscription's status (as in `dws event status`).
    Info(InfoArgs),
    /// A halted subscription tries the event it stopped at again (its count reset).
    Restart(VerbArgs),
    /// A halted subscription moves past the event it stopped at (which is parked).
    Skip(VerbArgs),
    /// Keep collecting (bounded by retention) but deliver nothing.
    Disable(VerbArgs),
    /// Deliver again after disable.
    Enable(VerbArgs),
    /// Rewind or skip ahead within retention.
    Seek(SeekArgs),
    /// List the parked (dead-letter) events.
    Parked(VerbArgs),
    /// Deliver parked events again (all, or the given seqs).
    ReplayParked(ReplayArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// text: one line per subscription; json: an array of the status
    /// document's `subscriptions[]` entries (schemas/subscription-list.schema.json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Subscription id.
    #[arg(value_name = "ID")]
    pub id: String,

    /// text: `key: value` lines; json: the status document's entry
    /// (schemas/subscription-info.schema.json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,
}

/// Print one retained event by its seq, as the NDJSON line consume writes
/// (without the per-delivery fields); exit 1 when the seq is not retained.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The event's seq.
    #[arg(value_name = "SEQ", value_parser = parse_seq, allow_negative_numbers = true)]
    pub seq: u64,

    /// How `data` is written: string (default) or json (see consume --data).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = DataMode::String)]
    pub data: DataMode,
}

#[derive(Debug, Args)]
pub struct VerbArgs {
    /// Subscription id.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Show what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// text: the state line by line; json: the bus's state document.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,
}

#[derive(Debug, Args)]
pub struct SeekArgs {
    #[command(flatten)]
    pub verb: VerbArgs,

    /// earliest, latest, a seq, or a time (RFC 3339, e.g. 2026-11-30T12:00:00Z).
    #[arg(long, value_name = "TARGET")]
    pub to: String,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub verb: VerbArgs,

    /// Parked seqs to replay (default: all).
    #[arg(value_name = "SEQ", value_parser = parse_seq, allow_negative_numbers = true)]
    pub seqs: Vec<u64>,
}

/// What to subscribe to upstream on the personal stream (the bus's source
/// must be `personal`). Checked locally before anything is created upstream.
#[derive(Debug, Clone, Default, Args)]
pub struct UpstreamArgs {
    /// Personal rule type: at, singleChat, sender, group or all (default: the event key's).
    #[arg(long, value_name = "RULE")]
    pub rule: Option<String>,

    /// Target user (staffId) for singleChat / sender rules.
    #[arg(long, value_name = "STAFF_ID")]
    pub user: Option<String>,

    /// Target open DingTalk id for singleChat / sender rules.
    #[arg(long, value_name = "ID")]
    pub open_dingtalk_id: Option<String>,

    /// Open conversation id for group rules.
    #[arg(long, value_name = "OPEN_CONVERSATION_ID")]
    pub group: Option<String>,

    /// Only messages whose content contains this text (repeatable: any of them).
    #[arg(long, value_name = "TEXT")]
    pub query: Vec<String>,

    /// A content filter object as JSON, e.g. {"field":"sender","op":"eq","value":"x"}.
    #[arg(long, value_name = "JSON")]
    pub filter_json: Option<String>,

    /// The upstream subscription's name (ext.name); default: the profile's subscription_name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
}

impl UpstreamArgs {
    pub fn any(&self) -> bool {
        self.rule.is_some()
            || self.user.is_some()
            || self.open_dingtalk_id.is_some()
            || self.group.is_some()
            || !self.query.is_empty()
            || self.filter_json.is_some()
            || self.name.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One JSON object per line.
    Ndjson,
    /// One JSON array, closed at exit (needs a bound).
    Json,
    /// Indented JSON per event.
    Pretty,
    /// The payload only, one per line.
    Raw,
}

/// Where a consume starts (`--from`); parsed in `start`.
pub use crate::start::From;

/// A command whose output is always JSON; `--format json` is accepted so a
/// script can pass it to every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JsonOnly {
    Json,
}

/// Show the bus, its source, consumers, subscriptions and counters. Never starts a bus.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// text: a readable table; json: the stable document described in
    /// docs/guide.md ("Status"); prometheus / openmetrics: metrics text
    /// (per-subscription lag, pending, in flight, parked, halted, …) for a
    /// textfile collector.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = StatusFormat::Text)]
    pub format: StatusFormat,

    /// Refresh until SIGINT/SIGTERM: in place on a terminal; otherwise one
    /// report per interval (with --format json: one document per line).
    #[arg(long)]
    pub watch: bool,

    /// How often --watch refreshes (at least 100ms).
    #[arg(long, value_name = "DUR", default_value = "2s", requires = "watch",
          value_parser = parse_interval, allow_hyphen_values = true)]
    pub interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    Text,
    Json,
    Prometheus,
    Openmetrics,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TextOrJson {
    Text,
    Json,
}

/// Stop the bus, or with --subscribe-id only the consumers of those subscriptions.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Close only the consumers attached to this subscription (repeatable);
    /// the subscriptions stay.
    #[arg(long, value_name = "ID")]
    pub subscribe_id: Vec<String>,

    /// Print what would be stopped and stop nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// text: one line; json: an object (schemas/stop.schema.json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,
}

/// Stop the bus and start the installed one (after an upgrade).
///
/// The new bus restores the durable state (named subscriptions, their
/// cursors, the retained log on the disk store); consumers of the old one
/// exit with reason bus_shutdown and can attach again. With no bus running,
/// starts one.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// text: one line; json: {"old": {pid, version} or null, "new": {pid, version}}.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,
}

/// Check what the bus needs: directories, configuration, secrets, the bus, the store, the upstream.
///
/// One line per check: ok, warn or fail, what was found and what to do.
/// Checks the runtime (socket) directory and the work directory, every
/// profile of config.toml on its own with the secret files it names (one
/// bad profile does not hide the others), a stale bus (bus.lock held but no
/// answer on the socket; a socket with no process), the disk store (FORMAT,
/// damaged ranges of a running bus) and whether a DingTalk source's
/// endpoints accept a TCP connection (a warning only), and for store =
/// "postgres" what a start would try against the database (connect, TLS,
/// authenticate, schema, lease row), naming the step that fails. Never hangs: files
/// are opened non-blocking (regular files only, reads bounded) and every
/// check has a time bound. Exit 1 when a check failed (with an Error:
/// line), 0 otherwise. Starts no bus.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// text: one line per check; json: {"ok", "profile", "checks": [{check, profile, status, message, hint}]}.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,
}

/// Create a subscription without attaching (it collects events until it is
/// removed with unsubscribe, or until its --ttl runs out detached); prints its id.
#[derive(Debug, Args)]
pub struct SubscribeArgs {
    /// Event keys: exact (im.message), prefix (im.*) or all (*); no empty segment (a..b, .a, a.).
    #[arg(value_name = "EVENT_KEY", required = true)]
    pub keys: Vec<String>,

    /// Subscription id (default: generated). Repeating it with the same spec is a no-op.
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,

    /// Only events whose type matches this regex.
    #[arg(long, value_name = "RE")]
    pub filter: Option<String>,

    /// Only events for which this jq expression's first output is truthy, evaluated by the bus on the
    /// event's line (data parsed when it is JSON). Repeatable: all must hold.
    #[arg(long = "where", value_name = "EXPR")]
    pub where_exprs: Vec<String>,

    /// Where it starts: latest (default), earliest, a seq, or a time (RFC
    /// 3339: the first retained event received at or after it).
    #[arg(long, value_name = "latest|earliest|SEQ|TIME", value_parser = crate::start::parse_from)]
    pub from: Option<From>,

    /// How long it lives without a consumer: a duration, or never (the
    /// default: it lives until removed with unsubscribe).
    #[arg(long, value_name = "DUR|never", value_parser = parse_ttl, allow_hyphen_values = true)]
    pub ttl: Option<Duration>,

    /// The ack wait of its explicit-ack consumers that do not name one
    /// (`consume --ack explicit` without --ack-wait); default 30s.
    #[arg(long, value_name = "DUR", value_parser = parse_nonzero_duration, allow_hyphen_values = true)]
    pub ack_wait: Option<Duration>,

    #[command(flatten)]
    pub poison: PoisonArgs,

    #[command(flatten)]
    pub upstream: UpstreamArgs,

    /// text: just the id; json: the id and the subscription's spec.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,

    /// per-host: each consumer (and on a cluster each host) gets every
    /// event; shared: a work queue, several consumers attach at once and
    /// each event goes to one of them (on a cluster, one on one host).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = Delivery::PerHost)]
    pub delivery: Delivery,
}

/// How a named subscription delivers to its consumers (and across the
/// hosts of a cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Delivery {
    /// One consumer at a time; on a cluster each host keeps its own cursor:
    /// every host's consumers get every event.
    PerHost,
    /// A work queue: several consumers at once, each event to one of them;
    /// on a cluster one cursor for all hosts.
    Shared,
}

/// Remove subscriptions; their consumers are told (Bye UNSUBSCRIBED).
#[derive(Debug, Args)]
pub struct UnsubscribeArgs {
    /// Subscription ids.
    #[arg(value_name = "ID", required = true)]
    pub ids: Vec<String>,

    /// text: `removed ID,…`; json: an object (schemas/unsubscribe.schema.json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TextOrJson::Text)]
    pub format: TextOrJson,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_arg_is_documented() {
        fn walk(cmd: &clap::Command) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some(),
                    "{}: --{id} has no help",
                    cmd.get_name()
                );
            }
            for sub in cmd.get_subcommands() {
                walk(sub);
            }
        }
        walk(&Cli::command());
    }
}
