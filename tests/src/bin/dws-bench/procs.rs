//! The processes a scenario runs, on the harness's guards: one isolated bus
//! world ([`BusEnv`], on `dws_tests::TestEnv`, which kills its busd on drop)
//! with a graceful stop, the consumers ([`Consumer`], on
//! `dws_tests::UnreadChild`, killed on drop), what /proc says about them,
//! and the interrupt flag set by SIGINT/SIGTERM/SIGHUP.

use std::{
    path::PathBuf,
    process::{ChildStdout, ExitStatus},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use dws_tests::{TestEnv, UnreadChild};
use nix::{
    sys::{
        resource::{getrusage, UsageWho},
        signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal},
        wait::{waitid, Id, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};
use serde_json::Value;

use crate::{Res, EVENT_TYPE, POLL};

/// How long a scenario waits for its consumers to attach.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `dws event status|stop|publish` may take.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long busd may take to exit after `dws event stop`.
const BUS_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Clusters handed out so far: each bus of a postgres run gets its own.
static CLUSTERS: AtomicU64 = AtomicU64::new(0);

/// A signal asked the benchmark to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

pub fn check_interrupted() -> Res<()> {
    if interrupted() {
        Err("interrupted by a signal".into())
    } else {
        Ok(())
    }
}

extern "C" fn on_signal(_: nix::libc::c_int) {
    // A second signal: leave at once, without cleanup.
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { nix::libc::_exit(130) }
    }
}

/// SIGINT, SIGTERM and SIGHUP set the interrupt flag (every wait checks it,
/// cleans up and fails); a second one exits at once. A handler, not a
/// blocked mask, so the children start with default dispositions.
pub fn install_signal_watch() -> Res<()> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only touches an atomic and calls _exit.
        unsafe { sigaction(sig, &action) }.map_err(|e| format!("sigaction {sig:?}: {e}"))?;
    }
    thread::spawn(|| {
        while !interrupted() {
            thread::sleep(Duration::from_millis(100));
        }
        eprintln!("dws-bench: interrupted, cleaning up (a second signal exits at once)");
    });
    Ok(())
}

/// Runs `f`, turning a panic of the harness into a failure message.
pub fn guarded<T>(f: impl FnOnce() -> Res<T>) -> Res<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into())),
    }
}

// ------------------------------------------------------------------ bus env

/// One isolated bus world: the harness's [`TestEnv`] (temp dir, env vars,
/// kills its busd on drop) plus graceful stop.
pub struct BusEnv {
    pub env: TestEnv,
    stopped: bool,
}

/// A finished `dws` command.
pub struct Ran {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl BusEnv {
    pub fn new(extra: &[(&str, &str)]) -> BusEnv {
        let mut vars: Vec<(&str, &str)> = extra.to_vec();
        // A bus leaked by a hard kill of this benchmark goes away on its own.
        vars.push(("DWS_EVENT_BUS_IDLE_TIMEOUT", "60s"));
        let env = TestEnv::with_env(&vars);
        if extra
            .iter()
            .any(|(k, v)| *k == "DWS_EVENT_BUS_STORE" && *v == "postgres")
        {
            let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
            let cluster = format!("bench-{}-{n}", std::process::id());
            let _ = std::fs::write(
                env.cfg_dir().join("config.toml"),
                format!("[profiles.default]\ncluster = \"{cluster}\"\n"),
            );
        }
        BusEnv {
            env,
            stopped: false,
        }
    }

    /// Runs `dws <args>` to completion within `timeout` (killed after it).
    pub fn run_dws(&self, args: &[&str], timeout: Duration) -> Res<Ran> {
        let out = guarded(|| Ok(self.env.dws(args).run_with_timeout(timeout)))?;
        Ok(Ran {
            ok: out.code == Some(0),
            code: out.code,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    /// `dws event status --format json`, parsed.
    pub fn status(&self) -> Res<Value> {
        let r = self.run_dws(&["event", "status", "--format", "json"], CMD_TIMEOUT)?;
        if !r.ok {
            return Err(format!(
                "`dws event status` failed ({:?}): {}",
                r.code,
                r.stderr.trim()
            ));
        }
        serde_json::from_str(&r.stdout)
            .map_err(|e| format!("status output is not JSON ({e}): {}", r.stdout))
    }

    /// Waits until the bus shows `n` attached consumers; returns that status.
    /// Fails early when a consumer already exited.
    pub fn wait_consumers(&self, n: usize, consumers: &mut [Consumer]) -> Res<Value> {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            check_interrupted()?;
            for c in consumers.iter_mut() {
                if let Some(st) = c.exited() {
                    return Err(format!(
                        "consumer pid {} exited ({st}) before {n} consumer(s) were attached:\n{}",
                        c.pid(),
                        c.report()
                    ));
                }
            }
            let status = self.status()?;
            let attached = status["consumers"].as_array().map_or(0, |a| a.len());
            if attached == n && status["running"] == Value::Bool(true) {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out after {ATTACH_TIMEOUT:?} waiting for {n} attached consumer(s); last status: running={} consumers={attached}\n{}",
                    status["running"],
                    self.log_tail()
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_tail(&self) -> String {
        format!("--- bus.log (tail) ---\n{}", self.env.bus_log_tail())
    }

    /// `dws event stop`, then waits (bounded) until this env has no busd.
    pub fn stop(&mut self) -> Res<()> {
        self.stopped = true;
        let stop = self.run_dws(&["event", "stop"], CMD_TIMEOUT);
        let deadline = Instant::now() + BUS_EXIT_TIMEOUT;
        while !self.env.busd_pids().is_empty() {
            if Instant::now() >= deadline {
                return Err(format!(
                    "busd still running {BUS_EXIT_TIMEOUT:?} after `dws event stop` (pids {:?}; stop said: {})",
                    self.env.busd_pids(),
                    match &stop {
                        Ok(r) => format!("{:?}: {} {}", r.code, r.stdout.trim(), r.stderr.trim()),
                        Err(e) => e.clone(),
                    }
                ));
            }
            thread::sleep(POLL);
        }
        match stop {
            Ok(r) if r.ok => Ok(()),
            Ok(r) => Err(format!(
                "`dws event stop` failed ({:?}): {} {}",
                r.code,
                r.stdout.trim(),
                r.stderr.trim()
            )),
            Err(e) => Err(e),
        }
    }
}

impl Drop for BusEnv {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.stop();
        }
        // TestEnv's drop then SIGKILLs any busd of this env that is left.
    }
}

// ------------------------------------------------------------------ consumers

/// A running `dws event consume bench.x --format raw --quiet` whose stdout
/// the benchmark reads itself; dropping it kills it (the harness's guard).
pub struct Consumer {
    child: UnreadChild,
    status: Option<ExitStatus>,
    /// utime + stime in clock ticks, read from /proc while the exited
    /// process was still a zombie (reaping it removes /proc/<pid>).
    final_cpu_ticks: Option<u64>,
}

impl Consumer {
    pub fn spawn(env: &BusEnv, extra_args: &[&str]) -> Res<Consumer> {
        let mut args = vec!["event", "consume", EVENT_TYPE, "--format", "raw", "--quiet"];
        args.extend_from_slice(extra_args);
        let child = guarded(|| Ok(env.env.dws(&args).spawn_stdout_unread()))?;
        Ok(Consumer {
            child,
            status: None,
            final_cpu_ticks: None,
        })
    }

    /// `dws <args>` with its stdin a pipe this benchmark writes
    /// ([`Consumer::take_stdin`]) and its stdout left for it to read: a
    /// work-queue worker.
    pub fn spawn_worker(env: &BusEnv, args: &[&str]) -> Res<Consumer> {
        let child = guarded(|| Ok(env.env.dws(args).stdin_pipe().spawn_stdout_unread()))?;
        Ok(Consumer {
            child,
            status: None,
            final_cpu_ticks: None,
        })
    }

    pub fn take_stdin(&mut self) -> Res<std::process::ChildStdin> {
        self.child
            .take_stdin()
            .ok_or_else(|| "worker stdin already taken".to_string())
    }

    pub fn pid(&self) -> i32 {
        self.child.pid()
    }

    pub fn take_stdout(&mut self) -> Res<ChildStdout> {
        self.child
            .take_stdout()
            .ok_or_else(|| "consumer stdout already taken".to_string())
    }

    /// The exit status once it exited. Looks without reaping first: an
    /// exited child stays a zombie, and its /proc/<pid>/stat still holds its
    /// final CPU times.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            match waitid(Id::Pid(Pid::from_raw(self.pid())), flags) {
                Ok(WaitStatus::StillAlive) => return None,
                Ok(_) => self.final_cpu_ticks = proc_cpu_ticks(self.pid() as i64),
                Err(_) => {}
            }
            self.status = self.child.exit_status();
        }
        self.status
    }

    /// CPU time (utime + stime, clock ticks) used so far, or in all once it
    /// exited (then known only if [`Consumer::exited`] saw it exit).
    pub fn cpu_ticks(&mut self) -> Option<u64> {
        match self.exited() {
            Some(_) => self.final_cpu_ticks,
            None => proc_cpu_ticks(self.pid() as i64),
        }
    }

    /// Command, status, stderr and bus log tail, for failure messages.
    pub fn report(&self) -> String {
        self.child.report()
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(POLL);
        }
    }
}

// ------------------------------------------------------------------ /proc

/// utime + stime of process `pid` (all its threads, not its children) in
/// clock ticks, from /proc/<pid>/stat (fields 14 and 15).
/// Context switches (voluntary and not) of every thread of `pid` so far:
/// how often it went to sleep and was woken, or was preempted. `None` once
/// it is gone; of an exited process (a zombie), what its main thread did.
pub fn proc_switches(pid: i64) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    // A thread that ends meanwhile is skipped (its count is lost with it).
    let counts = tasks.flatten().filter_map(|task| {
        let text = std::fs::read_to_string(task.path().join("status")).ok()?;
        parse_switches(&text)
    });
    Some(counts.sum())
}

fn parse_switches(status: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].trim().parse().ok()
    };
    Some(field("voluntary_ctxt_switches:")? + field("nonvoluntary_ctxt_switches:")?)
}

pub fn proc_cpu_ticks(pid: i64) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&text)
}

fn parse_stat_cpu_ticks(text: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain anything.
    let mut fields = text.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second of /proc's CPU times (sysconf(_SC_CLK_TCK)).
pub fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// CPU time (user + system) of the calling thread, in µs.
pub fn thread_cpu_us() -> f64 {
    getrusage(UsageWho::RUSAGE_THREAD).map_or(f64::NAN, |u| {
        let (user, sys) = (u.user_time(), u.system_time());
        (user.tv_sec() + sys.tv_sec()) as f64 * 1e6 + (user.tv_usec() + sys.tv_usec()) as f64
    })
}

/// A `kB` field of /proc/<pid>/status (`VmRSS`, `VmHWM`).
pub fn read_proc_kb(pid: i64, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim_start_matches(':')
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The bus socket and busd's pid from a status document.
pub fn bus_info(status: &Value) -> Res<(PathBuf, i64)> {
    let socket = status["bus"]["socket"]
        .as_str()
        .ok_or("status has no bus.socket")?;
    let pid = status["bus"]["pid"]
        .as_i64()
        .ok_or("status has no bus.pid")?;
    Ok((PathBuf::from(socket), pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_come_after_the_command_name() {
        let stat = "42 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 70 30 0 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(100));
        assert_eq!(parse_stat_cpu_ticks("42 (x) S 1"), None);
    }

    #[test]
    fn switches_add_both_kinds() {
        let status = "Name:\tbusd\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(parse_switches(status), Some(123));
        assert_eq!(parse_switches("Name:\tx\n"), None);
    }
}
