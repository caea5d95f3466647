//! `dws`, the thin client of the dws event bus.
//!
//! Layout:
//! - [`cli`]: the command line (single source of help);
//! - [`exit`]: the exit-code contract and [`exit::CliError`];
//! - [`bus`]: discover-or-spawn and request/reply over the socket;
//!   [`spawn`]: starting `busd` with a ready pipe;
//! - [`consume`]: `dws event consume` and its stderr/exit contract;
//!   [`output`]: event formats; [`pump`]: the stdout writer thread;
//! - [`status`], [`commands`]: the other subcommands;
//! - [`validate`]: flag checks shared by the commands.
//!
//! `dws` never connects upstream: it only talks to its bus.

pub mod bus;
pub mod cli;
pub mod commands;
pub mod consume;
pub mod exit;
pub mod output;
pub mod pump;
pub mod spawn;
pub mod status;
pub mod validate;

use std::{io::Write, process::ExitCode};

use clap::Parser;

use crate::{
    cli::{Cli, EventCmd, Top},
    exit::{CliError, Result},
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

/// Parses argv, runs the command, prints the one `Error:` line on failure.
pub fn main_with_args(argv: Vec<String>) -> ExitCode {
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version: print as asked, exit 0.
            let _ = print_stdout(&e.render().to_string());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid command line");
            return fail(&CliError::usage(first.trim_start_matches("error: ").trim()));
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &CliError) -> ExitCode {
    let mut err = std::io::stderr().lock();
    let one_line = e.message.replace('\n', " ");
    let _ = writeln!(err, "Error: {one_line}");
    ExitCode::from(e.code)
}

fn run(cli: Cli) -> Result<()> {
    let uid = nix::unistd::geteuid().as_raw();
    let env = proto::paths::Env::from_process(uid);
    let endpoint = proto::paths::resolve(cli.profile.as_deref(), &env).map_err(|e| match e {
        proto::paths::PathError::InvalidProfile(_) => CliError::usage(e.to_string()),
        _ => CliError::runtime(e.to_string()),
    })?;
    let Top::Event(cmd) = cli.command;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))?;
    match cmd {
        EventCmd::Consume(args) => {
            let plan = consume::plan(args)?;
            let armed = consume::stdin_eof_armed(&plan);
            if plan.dry_run {
                return print_stdout(&format!("{:#}\n", plan.describe(&endpoint, armed)));
            }
            runtime.block_on(consume::run(plan, &endpoint, armed))
        }
        EventCmd::Publish(args) => runtime.block_on(commands::publish(args, &endpoint)),
        EventCmd::Status(args) => runtime.block_on(status::run(args, &endpoint)),
        EventCmd::Stop(args) => runtime.block_on(commands::stop(args, &endpoint)),
        EventCmd::Subscribe(args) => runtime.block_on(commands::subscribe(args, &endpoint)),
        EventCmd::Unsubscribe(args) => runtime.block_on(commands::unsubscribe(args, &endpoint)),
    }
}
