//! `dws event consume`: the consumer contract — one ready line, events on
//! stdout, one exited line with its [`Reason`], the exit codes.
//!
//! Order of a run: validate every flag ([`plan()`]: exit 2 before anything
//! is created), connect or spawn the bus, subscribe and attach, print the
//! ready line, then stream ([`run()`]).
//!
//! Streaming: the frames readable from the socket at once are formatted
//! (`format`) into one chunk, handed to the stdout writer thread
//! ([`crate::pump`]), which writes it with one `write`. While a chunk waits
//! for that thread the socket is not read, so a stalled stdout reader only
//! fills the bus's credit window; signals, the `--duration` deadline, the end
//! of stdin (when armed, in every mode) and a vanished stdout reader (`watch`) still end
//! the run at once. With `--ack write` the Ack names exactly the events the
//! writer reports written (`written`), so only what reached stdout is ever
//! acked, whatever the order of their seqs; with `--ack
//! explicit` acks are the lines read from stdin, settled against the events
//! this run delivered.
//!
//! A clean exit lets stdout take what is formatted (interruptible by a
//! signal, bounded after one); then, unless the bus ended the run, acks what
//! reached stdout, removes an owned subscription and says Bye; last, it
//! prints the exited line.
//!
//! Files: `plan` (validation), `watch` (signals, stdin, stdout, explicit-ack
//! lines), `run` (the loop and the clean exit), `format` (frames into stdout
//! chunks and stderr lines), `written` (write acks), `complaints` (the
//! bounded, never-blocking complaints about bad explicit-ack lines).

mod complaints;
mod format;
mod plan;
mod run;
mod watch;
mod written;

use std::io::{self, Write};

pub use format::LOST_WITHOUT_BYE;
pub use plan::{backoff, plan, poison, stdin_eof_armed, Plan, DEFAULT_ACK_WAIT};
pub use run::run;

/// Why a run ended, as printed in the exited line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Limit,
    Timeout,
    Signal,
    BusShutdown,
    SourceLost,
    /// The subscription stopped at a poison event.
    Halted,
    /// Another consumer attached with `--takeover`: restarting this one
    /// would take the subscription back, so do not.
    TakenOver,
    /// An operator stopped this consumer (`dws event stop --subscribe-id`):
    /// draining a worker, so do not restart it.
    Stopped,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::Timeout => "timeout",
            Reason::Signal => "signal",
            Reason::BusShutdown => "bus_shutdown",
            Reason::SourceLost => "source_lost",
            Reason::Halted => "halted",
            Reason::TakenOver => "taken_over",
            Reason::Stopped => "stopped",
        }
    }

    /// The bus ended the run: the subscription is not ours to clean up.
    fn bus_ended(self) -> bool {
        matches!(
            self,
            Reason::BusShutdown
                | Reason::SourceLost
                | Reason::Halted
                | Reason::TakenOver
                | Reason::Stopped
        )
    }
}

/// One line on stderr, unless `--quiet`.
fn stderr_line(quiet: bool, line: &str) {
    if !quiet {
        let mut err = io::stderr().lock();
        let _ = writeln!(err, "{line}");
    }
}
