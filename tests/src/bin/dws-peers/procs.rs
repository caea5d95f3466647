//! The client processes of a run: dws-peers re-executes itself with the
//! hidden `role` subcommand. A [`Proc`] reads its stdout on a thread (so waits
//! are bounded), and is killed and reaped if dropped while running. Also CPU
//! accounting (/proc for the broker, RUSAGE_CHILDREN for reaped clients) and
//! the monotonic clock the payload carries.

use crate::PeersError;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// CLOCK_MONOTONIC in ns: system-wide, so a subscriber can subtract a
/// publisher's send time.
pub fn now_ns() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Sleeps until monotonic time `t_ns` (returns at once if it has passed).
pub fn sleep_until_ns(t_ns: u64) {
    let now = now_ns();
    if t_ns > now {
        std::thread::sleep(Duration::from_nanos(t_ns - now));
    }
}

/// utime + stime of process `pid` in seconds (0 if it is gone).
pub fn proc_cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    // Fields after the command: state is 0, utime 11, stime 12.
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// CPU seconds of every reaped child of this process.
pub fn children_cpu_s() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0.0)
}

/// A running role process.
pub struct Proc {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Proc {
    /// Starts `dws-peers role <args>`; `stdin` piped when the process waits
    /// for a GO line.
    pub fn role(args: &[String], stdin: bool) -> Result<Proc, PeersError> {
        let exe =
            std::env::current_exe().map_err(|e| PeersError::io("find dws-peers itself", e))?;
        let what = format!("role {}", args.first().map_or("", String::as_str));
        let mut child = Command::new(exe)
            .arg("role")
            .args(args)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| PeersError::io("start a client process", e))?;
        let out = child.stdout.take();
        let (tx, lines) = channel();
        if let Some(out) = out {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let stdin = child.stdin.take();
        Ok(Proc {
            what,
            child,
            stdin,
            lines,
        })
    }

    /// The next stdout line within `timeout`.
    pub fn line(&mut self, timeout: Duration) -> Result<String, PeersError> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => Err(PeersError::Run(format!(
                "{}: no line within {timeout:?}",
                self.what
            ))),
            Err(RecvTimeoutError::Disconnected) => {
                let st = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(PeersError::Run(format!(
                    "{} exited early ({st})",
                    self.what
                )))
            }
        }
    }

    /// Waits for `READY`.
    pub fn ready(&mut self) -> Result<(), PeersError> {
        let l = self.line(Duration::from_secs(30))?;
        if l.trim() == "READY" {
            Ok(())
        } else {
            Err(PeersError::Run(format!(
                "{} said {l:?} instead of READY",
                self.what
            )))
        }
    }

    /// Writes the start line to a process waiting for it.
    pub fn go(&mut self) -> Result<(), PeersError> {
        let mut s = self
            .stdin
            .take()
            .ok_or_else(|| PeersError::Run(format!("{}: no stdin", self.what)))?;
        s.write_all(b"GO\n")
            .map_err(|e| PeersError::io("write GO", e))
    }

    /// Reads to EOF (within `timeout`), reaps the process and returns its
    /// last JSON line.
    pub fn result(mut self, timeout: Duration) -> Result<Value, PeersError> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with('{') => last = Some(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    break;
                }
            }
        }
        let st = self
            .child
            .wait()
            .map_err(|e| PeersError::io("wait for a client", e))?;
        let line = last
            .ok_or_else(|| PeersError::Run(format!("{} produced no result ({st})", self.what)))?;
        serde_json::from_str(&line)
            .map_err(|e| PeersError::Run(format!("{}: bad result {line:?}: {e}", self.what)))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
