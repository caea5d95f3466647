//! `dws`, the thin client of the dws event bus.
//!
//! Layout:
//! - [`cli`]: the command line (single source of help); [`colour`]: colour
//!   on a terminal only;
//! - [`exit`]: the exit-code contract and [`exit::CliError`];
//! - [`bus`]: discover-or-spawn and request/reply over the socket;
//!   [`spawn`]: starting `busd` with a ready pipe;
//! - [`consume`]: `dws event consume` and its stderr/exit contract;
//!   [`output`]: event formats; [`pump`]: the stdout writer thread;
//!   [`ring`]: the bus's line ring, read in place;
//! - [`status`], [`commands`] ([`publish_lines`]: `publish --lines`),
//!   [`restart`], [`doctor`] (with [`files`]: the bus's files read as busd
//!   opens them), [`reading`] (get,
//!   subscription list and info): the other subcommands; [`metrics`]: status
//!   as Prometheus / OpenMetrics text;
//! - [`human`]: durations and local times in text output;
//! - [`validate`]: flag checks shared by the commands; [`values`]: flag
//!   values as clap parses them (durations); [`start`]: `--from` (a seq or
//!   an RFC 3339 time);
//! - [`docs`]: completion scripts and man pages from the clap definitions.
//!
//! `dws` never connects upstream: it only talks to its bus.

pub mod acks;
pub mod bus;
pub mod cli;
pub mod colour;
pub mod commands;
pub mod consume;
pub mod docs;
pub mod doctor;
pub mod exit;
pub mod files;
pub mod human;
pub mod logs;
pub mod metrics;
pub mod output;
pub mod publish_lines;
pub mod pump;
pub mod reading;
pub mod recorded;
pub mod restart;
pub mod ring;
pub mod spawn;
pub mod start;
pub mod status;
pub mod subscription;
pub mod validate;
pub mod values;

use std::{ffi::OsString, io::Write, process::ExitCode};

use clap::{CommandFactory, Parser};

use crate::{
    cli::{Cli, EventCmd, Top},
    exit::{clip, quoted, CliError, Result},
};

/// Writes to stdout; a reader that went away is not an error for these
/// one-shot commands.
pub fn print_stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::runtime(format!("cannot write to stdout: {e}"))),
    }
}

/// The process's argv as text. Every argument must be UTF-8 (a usage
/// error, exit 2, naming the first one that is not); the program name
/// (argument 0) is only used for display and is converted lossily.
pub fn utf8_args(argv: impl IntoIterator<Item = OsString>) -> Result<Vec<String>> {
    argv.into_iter()
        .enumerate()
        .map(|(i, arg)| match arg.into_string() {
            Ok(s) => Ok(s),
            Err(arg) if i == 0 => Ok(arg.to_string_lossy().into_owned()),
            Err(arg) => Err(CliError::usage(format!(
                "argument {i} is not valid UTF-8: {}",
                quoted(&arg.to_string_lossy())
            ))),
        })
        .collect()
}

/// Entry point of the binary: [`main_with_args`] after checking that argv
/// is UTF-8.
pub fn main_with_os_args(argv: impl IntoIterator<Item = OsString>) -> ExitCode {
    match utf8_args(argv) {
        Ok(argv) => main_with_args(argv),
        Err(e) => fail(&e),
    }
}

/// Parses argv, runs the command, prints the one `Error:` line on failure.
pub fn main_with_args(argv: Vec<String>) -> ExitCode {
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e)
            if !e.use_stderr()
                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            // --help and --version, and a bare `dws` / `dws event` /
            // `dws event subscription`: print the help as asked, exit 0;
            // in cargo's colours on a terminal.
            let rendered = e.render();
            let help = match colour::on_stdout() {
                true => rendered.ansi().to_string(),
                false => rendered.to_string(),
            };
            let _ = print_stdout(&help);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // An unknown verb: name the valid ones (clap only suggests a
            // similar one, when there is one).
            let valid = (e.kind() == clap::error::ErrorKind::InvalidSubcommand)
                .then(|| format!("valid subcommands: {}", subcommands_at(&argv).join(", ")));
            let rendered = clip_clap_context(e).render().to_string();
            return fail(&CliError::usage(usage_line(&rendered, valid)));
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// The visible subcommands of the deepest command `argv` names (its flags
/// and `--profile NAME` skipped), for an unknown verb's error.
fn subcommands_at(argv: &[String]) -> Vec<String> {
    let mut cmd = Cli::command();
    let mut words = argv.iter().skip(1);
    while let Some(w) = words.next() {
        if w == "--profile" {
            words.next();
            continue;
        }
        if w.starts_with('-') {
            continue;
        }
        match cmd.find_subcommand(w) {
            Some(sub) => cmd = sub.clone(),
            None => break,
        }
    }
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.get_name().to_owned())
        .collect()
}

/// clap's whole error as the one `Error:` line: every paragraph it printed
/// (the missing arguments, the "similar argument" tip, the possible values,
/// the usage) joined with `; `, so nothing clap says is cut; `extra`, when
/// given, goes right after the first (what is wrong, then what is valid).
fn usage_line(rendered: &str, extra: Option<String>) -> String {
    let mut paragraphs: Vec<String> = rendered
        .split("\n\n")
        .map(|p| {
            p.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|p| !p.is_empty())
        .collect();
    if let Some(extra) = extra {
        paragraphs.insert(paragraphs.len().min(1), extra);
    }
    let mut line = String::new();
    for (i, p) in paragraphs.iter().enumerate() {
        if i == 0 {
            line.push_str(p.strip_prefix("error: ").unwrap_or(p));
            continue;
        }
        line.push_str("; ");
        let mut chars = p.chars();
        if let Some(c) = chars.next() {
            line.extend(c.to_lowercase());
            line.push_str(chars.as_str());
        }
    }
    if line.is_empty() {
        "invalid command line".to_owned()
    } else {
        line
    }
}

/// Shortens the user input a clap error repeats (the invalid value, the
/// unknown argument, …) before it is rendered.
fn clip_clap_context(mut e: clap::Error) -> clap::Error {
    use clap::error::ContextValue as V;
    let long: Vec<_> = e
        .context()
        .filter_map(|(kind, value)| match value {
            V::String(s) if s.len() > exit::ECHO_CHARS => Some((kind, V::String(clip(s)))),
            V::Strings(v) if v.iter().any(|s| s.len() > exit::ECHO_CHARS) => {
                Some((kind, V::Strings(v.iter().map(|s| clip(s)).collect())))
            }
            _ => None,
        })
        .collect();
    for (kind, value) in long {
        e.insert(kind, value);
    }
    e
}

/// Prints the one `Error:` line (a single line, at most
/// [`exit::MESSAGE_CHARS`] characters) and returns the exit code.
fn fail(e: &CliError) -> ExitCode {
    let line = colour::error_line(&error_line(&e.message), colour::on_stderr());
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    ExitCode::from(e.code)
}

/// A message as the one line `fail` prints: line breaks become spaces and
/// the length is capped, whatever the message echoes.
fn error_line(message: &str) -> String {
    let one_line = message.replace(['\n', '\r'], " ");
    exit::clip_to(&one_line, exit::MESSAGE_CHARS)
}

fn run(cli: Cli) -> Result<()> {
    // Completions and man pages need no profile, bus or runtime.
    let cmd = match cli.command {
        Top::Event(cmd) => cmd,
        Top::Completions(args) => return docs::completions(args),
        Top::Manpages(args) => return docs::manpages(args),
    };
    let uid = nix::unistd::geteuid().as_raw();
    let env = proto::paths::Env::from_process(uid);
    let endpoint = proto::paths::resolve(cli.profile.as_deref(), &env).map_err(|e| match e {
        proto::paths::PathError::InvalidProfile(p) => CliError::usage(format!(
            "invalid profile {}: use 1-64 characters from A-Z a-z 0-9 . _ -",
            quoted(&p)
        )),
        proto::paths::PathError::SocketPathTooLong { shortest } => CliError::runtime(format!(
            "socket path {} is longer than the {}-byte limit of a unix socket: \
             set XDG_RUNTIME_DIR or TMPDIR to a shorter directory",
            clip(&shortest.to_string_lossy()),
            proto::paths::MAX_SOCKET_PATH
        )),
        _ => CliError::runtime(e.to_string()),
    })?;
    // Another shell's environment may compute another socket than the one
    // the running bus listens on: bus.meta says which (`recorded`).
    let endpoint = recorded::prefer_recorded(endpoint, uid);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))?;
    match cmd {
        EventCmd::Consume(args) => {
            let plan = consume::plan(args)?;
            let armed = consume::stdin_eof_armed();
            if plan.dry_run {
                return print_stdout(&format!("{:#}\n", plan.describe(&endpoint, armed)));
            }
            runtime.block_on(consume::run(plan, &endpoint, armed))
        }
        EventCmd::Publish(args) => runtime.block_on(commands::publish(args, &endpoint)),
        EventCmd::Status(args) => runtime.block_on(status::run(args, &endpoint)),
        EventCmd::Stop(args) => runtime.block_on(commands::stop(args, &endpoint)),
        EventCmd::Restart(args) => runtime.block_on(restart::restart(args, &endpoint)),
        EventCmd::Doctor(args) => runtime.block_on(doctor::run(args, &endpoint)),
        EventCmd::Subscribe(args) => runtime.block_on(commands::subscribe(args, &endpoint)),
        EventCmd::Unsubscribe(args) => runtime.block_on(commands::unsubscribe(args, &endpoint)),
        EventCmd::Get(args) => runtime.block_on(reading::get(args, &endpoint)),
        EventCmd::Logs(args) => logs::run(args, &endpoint),
        EventCmd::SubscriptionIds => runtime.block_on(docs::subscription_ids(&endpoint)),
        EventCmd::Subscription(verb) => runtime.block_on(subscription::run(verb, &endpoint)),
    }
}
