//! [`Child`]: a running process, spawned by [`crate::Cmd`], whose stdout
//! is either captured as it comes or left unread (a stalled reader) until
//! the test starts reading it; its stderr is always captured. Every wait
//! is bounded and panics with everything captured; dropping it SIGKILLs
//! and reaps the process.

use std::{
    io::Write,
    os::unix::process::ExitStatusExt,
    path::PathBuf,
    process::{ChildStdin, ChildStdout, ExitStatus},
    thread,
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;

use crate::{
    capture::Capture,
    contract::Ready,
    output::{describe_status, log_section, Output},
    pids::signal_pid,
    PIPE_GRACE, POLL, READY_TIMEOUT,
};

/// The former name of a [`Child`] spawned with
/// [`crate::Cmd::spawn_stdout_unread`]: one type does both now.
pub type UnreadChild = Child;

/// What the test does with a child's stdout.
pub(crate) enum StdoutMode {
    /// Read as it comes by a background thread.
    Captured(Capture),
    /// A pipe held but not read (`None` once handed to a reader).
    Unread(Option<ChildStdout>),
}

/// What [`crate::Cmd`] hands over when it spawned a process.
pub(crate) struct ChildParts {
    pub(crate) display: String,
    pub(crate) proc: std::process::Child,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) stdout: StdoutMode,
    pub(crate) stderr: Capture,
    pub(crate) log_path: PathBuf,
}

/// A running process. Dropping it SIGKILLs and reaps it.
pub struct Child {
    display: String,
    proc: std::process::Child,
    stdin: Option<ChildStdin>,
    stdout: StdoutMode,
    stderr: Capture,
    log_path: PathBuf,
    started: Instant,
    status: Option<ExitStatus>,
}

impl Child {
    pub(crate) fn from_parts(p: ChildParts) -> Child {
        Child {
            display: p.display,
            proc: p.proc,
            stdin: p.stdin,
            stdout: p.stdout,
            stderr: p.stderr,
            log_path: p.log_path,
            started: Instant::now(),
            status: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.proc.id() as i32
    }

    /// The command line, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The complete stdout lines captured so far (the process runs on);
    /// none while stdout is left unread.
    pub fn stdout_so_far(&self) -> Vec<String> {
        match &self.stdout {
            StdoutMode::Captured(c) => c.lines_so_far(),
            StdoutMode::Unread(_) => Vec::new(),
        }
    }

    /// The complete stderr lines captured so far (the process runs on).
    pub fn stderr_so_far(&self) -> Vec<String> {
        self.stderr.lines_so_far()
    }

    /// `true` while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        poll_running(&mut self.proc, &mut self.status)
    }

    /// Everything captured so far, for failure messages.
    pub fn report(&self) -> String {
        let stdout = match &self.stdout {
            StdoutMode::Captured(c) => c.text(),
            StdoutMode::Unread(_) => "<not read>".into(),
        };
        format!(
            "command: {}\npid: {}\nstatus: {}\nelapsed: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
            self.display,
            self.proc.id(),
            self.status.map(describe_status).unwrap_or_else(|| "running".into()),
            self.started.elapsed(),
            stdout,
            self.stderr.text(),
            log_section(&self.log_path)
        )
    }

    /// Takes a stdout left unread, for a caller that reads it itself (the
    /// benchmark checks every line as it comes); `None` once taken or when
    /// stdout is captured.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        match &mut self.stdout {
            StdoutMode::Unread(pipe) => pipe.take(),
            StdoutMode::Captured(_) => None,
        }
    }

    /// Takes the stdin pipe (see [`crate::Cmd::stdin_pipe`]), for a caller
    /// that writes it from a thread of its own (the benchmark's work-queue
    /// workers answer each line with an ack); dropping it closes stdin.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// The exit status, once the process has exited (reaps it).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        let _ = self.is_running();
        self.status
    }

    /// Starts reading a stdout left unread (a reader that stalled and came
    /// back); a no-op when stdout is read already.
    pub fn start_reading(mut self) -> Child {
        if let StdoutMode::Unread(pipe) = &mut self.stdout {
            if let Some(pipe) = pipe.take() {
                self.stdout = StdoutMode::Captured(Capture::spawn(pipe, None));
            }
        }
        self
    }

    /// The stdout capture, or a panic naming the mistake when the test left
    /// stdout unread.
    fn stdout_capture(&self) -> &Capture {
        match &self.stdout {
            StdoutMode::Captured(c) => c,
            StdoutMode::Unread(_) => panic!(
                "`{}`: stdout is left unread (spawn_stdout_unread): call start_reading first",
                self.display
            ),
        }
    }

    /// Panics for a wait on `stream` that ended without what it waited for
    /// (`closed`: the pipe closed; else the deadline passed).
    fn wait_failed(&mut self, stream: &str, closed: bool, what: &str) -> ! {
        let _ = self.is_running();
        panic!(
            "{} waiting for {what}\n{}",
            if closed {
                format!("{stream} closed while")
            } else {
                "timed out".to_owned()
            },
            self.report()
        )
    }

    /// Waits (up to `timeout`) for a stderr line matching `pred`; `None`
    /// when none came (the caller's assertion says what was missing).
    pub fn try_wait_stderr_line(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> Option<String> {
        let deadline = Instant::now() + timeout;
        self.stderr
            .wait_for(deadline, |lines, _| {
                lines.iter().find(|l| pred(l)).map(|l| l.to_string())
            })
            .ok()
    }

    /// Waits for a stderr line matching `pred` and returns it. Panics on
    /// timeout, or as soon as stderr closes without such a line, naming `what`.
    pub fn wait_stderr_line(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let r = self.stderr.wait_for(deadline, |lines, _| {
            lines.iter().find(|l| pred(l)).map(|l| l.to_string())
        });
        r.unwrap_or_else(|closed| {
            self.wait_failed("stderr", closed, &format!("stderr line: {what}"))
        })
    }

    /// Waits for the ready line and parses it strictly.
    pub fn wait_ready(&mut self) -> Ready {
        let line = self.wait_stderr_line("the `[event] ready ...` line", READY_TIMEOUT, |l| {
            l.starts_with("[event] ready")
        });
        Ready::parse(&line)
            .unwrap_or_else(|e| panic!("malformed ready line {line:?}: {e}\n{}", self.report()))
    }

    /// Waits until stdout holds at least `n` complete lines; returns the first `n`.
    pub fn wait_stdout_lines(&mut self, n: usize, timeout: Duration) -> Vec<String> {
        self.try_wait_stdout_lines_or(n, timeout)
            .unwrap_or_else(|closed| {
                self.wait_failed("stdout", closed, &format!("{n} stdout line(s)"))
            })
    }

    /// Waits until stdout holds at least `n` complete lines, copying none
    /// of them (for consumers of large lines that a test paces itself on).
    pub fn wait_stdout_line_count(&mut self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let reached = self
            .stdout_capture()
            .wait_for(deadline, |lines, _| (lines.len() >= n).then_some(()));
        reached.unwrap_or_else(|closed| {
            self.wait_failed("stdout", closed, &format!("{n} stdout line(s)"))
        })
    }

    /// Like [`Child::wait_stdout_lines`] but returns `None` instead of
    /// panicking when the lines are not there in time (or stdout closed).
    pub fn try_wait_stdout_lines(&mut self, n: usize, timeout: Duration) -> Option<Vec<String>> {
        self.try_wait_stdout_lines_or(n, timeout).ok()
    }

    fn try_wait_stdout_lines_or(&self, n: usize, timeout: Duration) -> Result<Vec<String>, bool> {
        let deadline = Instant::now() + timeout;
        self.stdout_capture().wait_for(deadline, |lines, _| {
            (lines.len() >= n).then(|| lines[..n].iter().map(|l| l.to_string()).collect())
        })
    }

    /// Waits for a stdout line matching `pred` and returns every line up to
    /// and including it. Panics on timeout or EOF, naming `what`.
    pub fn wait_stdout_line(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let r = self.stdout_capture().wait_for(deadline, |lines, _| {
            lines
                .iter()
                .position(|l| pred(l))
                .map(|i| lines[..=i].iter().map(|l| l.to_string()).collect())
        });
        r.unwrap_or_else(|closed| {
            self.wait_failed("stdout", closed, &format!("stdout line: {what}"))
        })
    }

    /// Writes to the stdin pipe (see [`crate::Cmd::stdin_pipe`]).
    pub fn write_stdin(&mut self, data: &[u8]) {
        let s = self
            .stdin
            .as_mut()
            .expect("stdin is not a pipe held by the test");
        s.write_all(data).expect("write to child stdin");
    }

    /// Writes to the stdin pipe; an error (the process is gone) is returned,
    /// not a panic.
    pub fn try_write_stdin(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self.stdin.as_mut() {
            Some(s) => s.write_all(data),
            None => Err(std::io::ErrorKind::NotConnected.into()),
        }
    }

    /// Closes the stdin pipe: the process sees EOF.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: Signal) {
        signal_pid(self.pid(), sig);
    }

    /// Waits for the process to exit and for its stdout/stderr to close; a
    /// stdout left unread is read from then on, to EOF. Panics (after
    /// killing it) if it is still running after `timeout`, or if its pipes
    /// stay open after it exited (a descendant holds them).
    pub fn wait_exit(mut self, timeout: Duration) -> Output {
        if !wait_exited(&mut self.proc, &mut self.status, timeout) {
            let msg = format!(
                "`{}` still running after {timeout:?}\n{}",
                self.display,
                self.report()
            );
            let _ = self.proc.kill();
            panic!("{msg}");
        }
        let this = self.start_reading();
        let pipes_deadline = Instant::now() + PIPE_GRACE;
        for (name, cap) in [("stdout", this.stdout_capture()), ("stderr", &this.stderr)] {
            if cap
                .wait_for(pipes_deadline, |_, done| done.then_some(()))
                .is_err()
                && !cap.is_done()
            {
                panic!(
                    "`{}` exited but its {name} was still open {PIPE_GRACE:?} later: a descendant \
                     (a spawned busd?) inherited it, so `dws ... | cat` would never finish\n{}",
                    this.display,
                    this.report()
                );
            }
        }
        let status = this.status.expect("exited");
        Output {
            display: this.display.clone(),
            code: status.code(),
            signal: status.signal(),
            stdout: this.stdout_capture().text(),
            stderr: this.stderr.text(),
            bus_log: log_section(&this.log_path),
            elapsed: this.started.elapsed(),
        }
    }

    /// [`Child::wait_exit`], named for a child whose stdout was left
    /// unread: what is left in the pipe is read after the exit.
    pub fn wait_exit_then_read_stdout(self, timeout: Duration) -> Output {
        self.wait_exit(timeout)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stdin = None;
        if self.status.is_none() {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}

/// Polls until `proc` has exited (`true`) or `timeout` passed (`false`).
fn wait_exited(
    proc: &mut std::process::Child,
    status: &mut Option<ExitStatus>,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    while poll_running(proc, status) {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
    true
}

/// `true` while `proc` runs; records its exit status once it has ended.
fn poll_running(proc: &mut std::process::Child, status: &mut Option<ExitStatus>) -> bool {
    if status.is_some() {
        return false;
    }
    match proc.try_wait() {
        Ok(Some(st)) => {
            *status = Some(st);
            false
        }
        Ok(None) => true,
        Err(_) => false,
    }
}
