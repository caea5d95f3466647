//! busd's side of the filter worker ([`super::worker`]): [`Pool`] keeps one
//! worker process, starts it on first use and again after it ended, and
//! judges a batch through it. The pipes are non-blocking and polled, so a
//! worker that stops answering costs at most the wall-clock backstop
//! ([`STALL_AFTER`]) before busd kills it; a worker that ends (its CPU
//! timer, its memory bound, a crash) ends the event it was judging, and the
//! rest of the batch goes to the next one.

use std::{
    io::{Read, Write},
    os::fd::AsFd,
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use bytes::Bytes;
use nix::{
    fcntl::{fcntl, FcntlArg, OFlag},
    libc,
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::signal::Signal,
};

use super::{
    limits::{CPU_BUDGET, STALL_AFTER},
    wire, Verdict, WhereFailure,
};
use crate::ratelimit::LogLimit;

/// The worker process, while it runs.
struct Worker {
    child: Child,
    to: ChildStdin,
    from: ChildStdout,
    /// The program the worker judges by now.
    program: Option<Vec<String>>,
    inbuf: Vec<u8>,
}

/// Starts and keeps the worker.
pub struct Pool {
    exe: PathBuf,
    worker: Option<Worker>,
    /// When a start last failed: not tried again for a second.
    failed_at: Option<Instant>,
    /// One line a minute about workers ending at a limit.
    log: LogLimit,
}

impl Pool {
    /// Workers run `exe` (busd itself: `/proc/self/exe`, the running
    /// build even after an upgrade replaced the file).
    pub fn new(exe: PathBuf) -> Pool {
        Pool {
            exe,
            worker: None,
            failed_at: None,
            log: LogLimit::new(Duration::from_secs(60)),
        }
    }

    /// One verdict per event, in order, with the CPU time it took.
    pub fn judge(&mut self, exprs: &[String], events: &[(u64, Bytes)]) -> Vec<(Verdict, Duration)> {
        let mut out = Vec::with_capacity(events.len());
        while out.len() < events.len() {
            let Some(w) = self.worker() else {
                let failed = (Verdict::Failed(WhereFailure::Crashed), Duration::ZERO);
                out.resize(events.len(), failed);
                break;
            };
            let done = out.len();
            if let Err(why) = w.judge(exprs, &events[done..], &mut out) {
                let seq = events[out.len()].0;
                crate::warn_limited!(
                    self.log,
                    seq,
                    "a --where gave no answer for this event: it {why}; the event is not \
                     delivered to that subscription (status: where_errors)"
                );
                out.push((Verdict::Failed(why), CPU_BUDGET));
                self.stop();
            }
        }
        out
    }

    fn worker(&mut self) -> Option<&mut Worker> {
        if self.worker.is_none() {
            if self
                .failed_at
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
            {
                return None;
            }
            match start(&self.exe) {
                Ok(w) => {
                    self.worker = Some(w);
                    self.failed_at = None;
                }
                Err(e) => {
                    crate::warn_limited!(self.log, cause = %e, "cannot start the --where filter worker");
                    self.failed_at = Some(Instant::now());
                    return None;
                }
            }
        }
        self.worker.as_mut()
    }

    /// Kills and reaps the worker.
    fn stop(&mut self) {
        if let Some(mut w) = self.worker.take() {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start(exe: &PathBuf) -> std::io::Result<Worker> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(exe);
    cmd.arg(super::worker::ARG)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec the closure only makes system calls
    // (async-signal-safe): every descriptor busd holds beyond the three
    // standard ones is closed at exec (the lock, sockets, a ready pipe).
    unsafe {
        cmd.pre_exec(|| {
            const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;
            let r = libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            );
            if r != 0 {
                for fd in 3..65_536 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let (Some(to), Some(from)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other("the worker's pipes are missing"));
    };
    use std::os::fd::AsRawFd;
    for fd in [to.as_raw_fd(), from.as_raw_fd()] {
        let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
        fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    }
    Ok(Worker {
        child,
        to,
        from,
        program: None,
        inbuf: Vec::new(),
    })
}

impl Worker {
    /// Sends `events` and reads their answers into `out`, in order. `Err`:
    /// the worker ended, or stopped answering, at the first event without
    /// an answer (the caller kills it).
    fn judge(
        &mut self,
        exprs: &[String],
        events: &[(u64, Bytes)],
        out: &mut Vec<(Verdict, Duration)>,
    ) -> Result<(), WhereFailure> {
        let mut buf = Vec::new();
        if self.program.as_deref() != Some(exprs) {
            wire::program(&mut buf, exprs);
            self.program = Some(exprs.to_vec());
        }
        for (seq, event) in events {
            wire::eval(&mut buf, *seq, event);
        }
        let mut written = 0;
        let mut answered = 0;
        let mut deadline = Instant::now() + STALL_AFTER;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            while let Some((body, used)) =
                wire::split(&self.inbuf).map_err(|_| WhereFailure::Crashed)?
            {
                let a = wire::read_answer(body).map_err(|_| WhereFailure::Crashed)?;
                if events.get(answered).map(|e| e.0) != Some(a.seq) {
                    return Err(WhereFailure::Crashed);
                }
                out.push((a.verdict, Duration::from_nanos(a.cpu_ns)));
                answered += 1;
                self.inbuf.drain(..used);
                deadline = Instant::now() + STALL_AFTER;
            }
            if answered == events.len() {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(WhereFailure::Stalled);
            }
            let want_write = written < buf.len();
            let mut fds = vec![PollFd::new(self.from.as_fd(), PollFlags::POLLIN)];
            if want_write {
                fds.push(PollFd::new(self.to.as_fd(), PollFlags::POLLOUT));
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return Err(WhereFailure::Crashed),
            }
            let readable = fds[0].revents().is_some_and(|r| !r.is_empty());
            let writable = want_write && fds[1].revents().is_some_and(|r| !r.is_empty());
            drop(fds);
            if readable {
                match self.from.read(&mut chunk) {
                    Ok(0) => return Err(self.ended()),
                    Ok(n) => self.inbuf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return Err(self.ended()),
                }
            }
            if writable {
                match self.to.write(&buf[written..]) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return Err(self.ended()),
                }
            }
        }
    }

    /// The worker closed its pipes: why it ended.
    fn ended(&mut self) -> WhereFailure {
        // It is exiting; give it a moment, then make sure.
        let until = Instant::now() + Duration::from_secs(1);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
                _ => break None,
            }
        };
        use std::os::unix::process::ExitStatusExt;
        match status.and_then(|s| s.signal()).map(Signal::try_from) {
            Some(Ok(Signal::SIGPROF | Signal::SIGXCPU)) => WhereFailure::Cpu,
            // An allocation past the bound aborts, as a stack overflow does;
            // the kernel's own out-of-memory kill is SIGKILL.
            Some(Ok(Signal::SIGABRT | Signal::SIGSEGV | Signal::SIGBUS | Signal::SIGKILL)) => {
                WhereFailure::Memory
            }
            _ => WhereFailure::Crashed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_that_cannot_start_fails_every_event_at_once() {
        let mut pool = Pool::new("/nonexistent/busd".into());
        let events = [(1, Bytes::new()), (2, Bytes::new())];
        let out = pool.judge(&[".".into()], &events);
        assert_eq!(out.len(), 2);
        assert!(out
            .iter()
            .all(|(v, _)| *v == Verdict::Failed(WhereFailure::Crashed)));
    }

    #[test]
    fn a_program_that_is_no_worker_ends_its_events_and_the_rest_are_tried_again() {
        // `true` starts and exits at once: each start ends one event.
        let mut pool = Pool::new("/bin/true".into());
        let events = [(1, Bytes::from_static(b"x")), (2, Bytes::new())];
        let out = pool.judge(&[".".into()], &events);
        assert_eq!(out.len(), 2);
        assert!(matches!(out[0].0, Verdict::Failed(_)));
    }
}
