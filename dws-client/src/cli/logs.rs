//! `dws event logs`'s flags (the command is `logs.rs`).

use clap::Args;

/// Print the bus's log (bus.log in the profile's work directory), like
/// `journalctl -u`: everything, or the last N lines; with -f, then every
/// line it writes, following it across its rotation, until interrupted.
/// Never starts a bus; exit 1 when the profile has no log yet.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Only the last N lines.
    #[arg(short = 'n', long = "lines", value_name = "N", value_parser = crate::values::parse_count)]
    pub lines: Option<u64>,

    /// Keep printing what the bus writes (Ctrl-C to stop).
    #[arg(short = 'f', long)]
    pub follow: bool,
}
