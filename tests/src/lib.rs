//! Harness of the black-box tests: runs the real `dws` and `busd` binaries in
//! isolated temporary directories and observes them only from the outside
//! (argv, env, stdin, stdout, stderr, exit status, signals, files, sockets).
//!
//! Why it looks the way it does:
//!
//! - **Isolation.** Every test builds its own [`TestEnv`]: a temp dir under
//!   `/tmp` (so socket paths stay far below the 107-byte `sun_path` limit) with
//!   `cfg/` (`DWS_CONFIG_DIR`), `run/` (`XDG_RUNTIME_DIR`, mode 0700) and
//!   `home/` (`HOME`). Every command starts from `env_clear()`, so nothing of
//!   the developer's own `~/.dws` or runtime dir leaks in and tests can run in
//!   parallel: each test has its own bus, socket and lock.
//! - **No leaked daemons.** `dws` spawns `busd` on demand and the daemon
//!   outlives it by design. [`TestEnv`]'s `Drop` finds every `busd` whose
//!   environment carries this test's `DWS_CONFIG_DIR` (by scanning
//!   `/proc/*/environ`) and SIGKILLs it, then waits (bounded) until it is gone.
//!   [`Child`] guards SIGKILL and reap their process on `Drop`, so a failing
//!   assertion never leaves a consumer behind either.
//! - **Bounded waits only.** Every wait takes a timeout and panics naming what
//!   it waited for, with the command, everything captured on stdout/stderr and
//!   the tail of `bus.log`. Tests never sleep "to let time pass" except where
//!   the behaviour itself is about time (idle timeout, `--duration`, stdin EOF).
//! - **Incremental capture.** stdout and stderr of a spawned process are read
//!   by background threads into shared buffers, so a test can block on "the
//!   ready line appeared" while the process keeps running, and no pipe ever
//!   fills up and stalls the process under test.
//! - **Binaries are located, not built.** Building from inside a test would
//!   race with the build that is running the test; see [`bin_dir`].
//!
//! The parts, one concern each (every public item is re-exported here, so
//! tests name them `dws_tests::X`):
//!
//! - [`bins`]: where the `dws` and `busd` binaries are.
//! - [`env`]: [`TestEnv`], the isolated world, its paths, its `config.toml`
//!   and the `dws` shortcuts (status, publish, subscribe).
//! - [`cmd`]: [`Cmd`], a command about to run (stdin, env, socket activation).
//! - [`process`]: [`Child`], a running process whose stdout is captured or
//!   left unread, and its bounded waits.
//! - [`capture`]: the background readers of a child's pipes.
//! - [`output`]: [`Output`], a finished process, and the assertions on it.
//! - [`terminal`]: [`run_on_terminal`], a command with stdout and stderr on
//!   a pseudo-terminal (the colour tests).
//! - [`contract`]: the strict parsers of the `ready` and `exited` lines.
//! - [`pids`]: processes seen through `/proc` and signals (liveness, the
//!   busd scan, freezing a process at a chosen moment).
//! - [`common`], [`fake_dingtalk`], [`history`], [`pg`], [`proxy`],
//!   [`wire`]: shared test helpers, the fake DingTalk server, the fault
//!   suite's history checker, a private PostgreSQL, a TCP proxy that fails
//!   like a network (black holes, resets, latency), the wire-protocol
//!   client.

pub mod bins;
pub mod capture;
pub mod cmd;
pub mod common;
pub mod contract;
pub mod env;
pub mod fake_dingtalk;
pub mod history;
pub mod output;
pub mod pg;
pub mod pids;
pub mod process;
pub mod proxy;
pub mod terminal;
pub mod wire;

#[cfg(test)]
mod selftest;

use std::time::Duration;

pub use bins::{bin_dir, busd_bin, dws_bin};
pub use cmd::Cmd;
pub use contract::{Exited, Ready, REASONS};
pub use env::TestEnv;
pub use nix::sys::signal::Signal as Sig;
pub use output::{assert_absent, Output};
pub use pids::{all_process_argv, freeze_when, is_live, proc_kb, signal_pid, wait_pid_gone};
pub use process::{Child, UnreadChild};
pub use terminal::{run_on_terminal, TerminalRun};

/// How long a test waits for a consumer's ready line. Generous on purpose: a
/// debug `busd` is spawned on demand while other tests load the same 2 cores.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a test waits for a process it expects to exit on its own.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(20);
/// After a process exited, how long its stdout/stderr may stay open. A pipe
/// still open after that is held by a descendant (a `busd` that did not
/// detach from its spawner's stdio), which would hang `dws ... | cat` forever.
const PIPE_GRACE: Duration = Duration::from_secs(3);
/// Poll interval of the few waits that have nothing to block on (files,
/// `/proc`, `try_wait`).
const POLL: Duration = Duration::from_millis(20);
