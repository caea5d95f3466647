//! [`StdoutPump`]: stdout is written by a dedicated thread, fed chunks of
//! formatted events through a small bounded channel.
//!
//! Why: a consumer whose reader stalls (stops reading without closing the
//! pipe) blocks in `write(2)`. On the main thread that would also block the
//! signal handling, so SIGTERM could not end the run and an orchestrator
//! would have to use `kill -9`, leaving the subscription behind. With the
//! pump, the main loop keeps serving signals and the socket; it stops
//! reading the socket while a chunk waits (the bus's credit window then
//! bounds what is in flight), and acks only what the pump reports written.
//!
//! Each chunk is written and flushed whole: one `write(2)` per burst of
//! events, so a burst costs one syscall and one wake-up of the reader.
//!
//! The fast path skips the thread: while the pump is idle, the main loop
//! first tries [`StdoutPump::write_direct`], a write that cannot block
//! (`pwritev2(RWF_NOWAIT)`). When stdout takes the whole chunk — the usual
//! case for a reader that keeps up — the chunk is written with no thread
//! hand-off and no wake-up coming back, which is what a lone event costs
//! at low rates. Whatever it does not take (a full pipe, a partial write, a
//! stdout that does not support the flag) goes through the thread as
//! before, in order: a direct write is only tried when the thread has
//! nothing left to write.

use std::{
    cell::Cell,
    io::{self, Write},
};

use tokio::sync::{mpsc, watch};

/// Events formatted for stdout, and how many.
#[derive(Debug, Default)]
pub struct Chunk {
    pub bytes: Vec<u8>,
    pub events: u64,
}

impl Chunk {
    pub fn with_capacity(bytes: usize) -> Chunk {
        Chunk {
            bytes: Vec::with_capacity(bytes),
            ..Chunk::default()
        }
    }
}

/// How a write to stdout failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteFailure {
    /// The reader closed the pipe.
    BrokenPipe,
    Other(String),
}

/// What the pump has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Events written and flushed, in the order they were formatted: the
    /// first `written` of them may be acked (by seq, see `consume::written`).
    pub written: u64,
    pub failed: Option<WriteFailure>,
    /// The pump has stopped (channel closed and drained, or a failure).
    pub done: bool,
    /// Chunks the writer thread has finished with (written or failed).
    pub chunks: u64,
}

pub struct StdoutPump {
    tx: Option<mpsc::Sender<Chunk>>,
    progress: watch::Receiver<Progress>,
    /// Chunks handed to the writer thread.
    handed: Cell<u64>,
    /// What [`StdoutPump::write_direct`] wrote, and whether it may still
    /// be tried (`false` once stdout refused the non-blocking flag).
    direct: Progress,
    direct_enabled: bool,
}

/// What [`StdoutPump::write_direct`] did with a chunk.
#[derive(Debug)]
pub enum Direct {
    /// All of it reached stdout; the emptied chunk comes back for reuse.
    Written(Chunk),
    /// This part (all of it, or what is left after a partial write) must
    /// go through the writer thread.
    Rest(Chunk),
    /// stdout failed (see [`StdoutPump::progress`]).
    Failed,
}

impl StdoutPump {
    /// Starts the writer thread. It is abandoned, not joined, if the process
    /// exits while it is blocked on a stalled stdout.
    pub fn start() -> StdoutPump {
        let (tx, mut rx) = mpsc::channel::<Chunk>(1);
        let (ptx, progress) = watch::channel(Progress::default());
        std::thread::spawn(move || {
            let stdout = io::stdout();
            let mut p = Progress::default();
            while let Some(chunk) = rx.blocking_recv() {
                let mut out = stdout.lock();
                match out.write_all(&chunk.bytes).and_then(|()| out.flush()) {
                    Ok(()) => p.written += chunk.events,
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                        p.failed = Some(WriteFailure::BrokenPipe);
                    }
                    Err(e) => p.failed = Some(WriteFailure::Other(e.to_string())),
                }
                let failed = p.failed.is_some();
                p.done = failed;
                p.chunks += 1;
                let _ = ptx.send(p.clone());
                if failed {
                    return;
                }
            }
            p.done = true;
            let _ = ptx.send(p);
        });
        StdoutPump {
            tx: Some(tx),
            progress,
            handed: Cell::new(0),
            direct: Progress::default(),
            direct_enabled: true,
        }
    }

    /// Hands a chunk to the writer; waits while the previous one is queued.
    /// Returns the chunk back if the writer has stopped.
    pub async fn send(&self, chunk: Chunk) -> Result<(), Chunk> {
        match &self.tx {
            Some(tx) => {
                tx.send(chunk).await.map_err(|e| e.0)?;
                self.handed.set(self.handed.get() + 1);
                Ok(())
            }
            None => Err(chunk),
        }
    }

    /// Waits for room for one chunk. Cancel-safe: nothing is lost when the
    /// wait is abandoned (unlike a pending `send`, which owns its chunk).
    /// `None` if the writer has stopped.
    pub async fn reserve(&self) -> Option<Permit<'_>> {
        let permit = self.tx.as_ref()?.reserve().await.ok()?;
        Some(Permit {
            permit,
            handed: &self.handed,
        })
    }

    /// Whether a direct write may be tried now: the thread has written
    /// everything it was given (so order is kept) and stdout has not
    /// refused the non-blocking flag.
    pub fn can_write_direct(&self) -> bool {
        self.direct_enabled
            && self.direct.failed.is_none()
            && self.tx.is_some()
            && self.progress.borrow().chunks == self.handed.get()
    }

    /// Writes `chunk` to stdout without blocking, as far as stdout takes
    /// it. Call only when [`StdoutPump::can_write_direct`].
    pub fn write_direct(&mut self, mut chunk: Chunk) -> Direct {
        let mut off = 0;
        while off < chunk.bytes.len() {
            match write_nowait(&chunk.bytes[off..]) {
                Ok(0) => break,
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                    self.direct.failed = Some(WriteFailure::BrokenPipe);
                    return Direct::Failed;
                }
                // Not a pipe that supports RWF_NOWAIT (a tty, a file, an
                // older kernel) or anything else: the thread writes, and
                // reports a real error itself.
                Err(_) => {
                    self.direct_enabled = false;
                    break;
                }
            }
        }
        if off == chunk.bytes.len() {
            self.direct.written += chunk.events;
            chunk.bytes.clear();
            chunk.events = 0;
            return Direct::Written(chunk);
        }
        chunk.bytes.drain(..off);
        Direct::Rest(chunk)
    }

    /// A watch on the progress, for waiting on it while also sending.
    pub fn watch(&self) -> ProgressWatch {
        ProgressWatch(self.progress.clone())
    }

    /// Everything written so far, by the thread and directly (direct
    /// writes only happen while the thread is idle, so the order is kept).
    pub fn progress(&self) -> Progress {
        let mut p = self.progress.borrow().clone();
        p.written += self.direct.written;
        if p.failed.is_none() && self.direct.failed.is_some() {
            p.failed = self.direct.failed.clone();
            p.done = true;
        }
        p
    }

    /// No more chunks: the writer finishes what it has and reports done.
    pub fn close(&mut self) {
        self.tx = None;
    }
}

/// Room for one chunk in the writer's queue (see [`StdoutPump::reserve`]).
pub struct Permit<'a> {
    permit: mpsc::Permit<'a, Chunk>,
    handed: &'a Cell<u64>,
}

impl Permit<'_> {
    pub fn send(self, chunk: Chunk) {
        self.permit.send(chunk);
        self.handed.set(self.handed.get() + 1);
    }
}

/// One `pwritev2(1, buf, -1, RWF_NOWAIT)`: writes what stdout takes without
/// blocking; `WouldBlock` when it takes nothing now.
fn write_nowait(buf: &[u8]) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `iov` describes `buf`, which is borrowed for the whole call;
    // the kernel only reads from it.
    let n = unsafe { libc::pwritev2(libc::STDOUT_FILENO, &iov, 1, -1, libc::RWF_NOWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Waits for [`Progress`] changes of a [`StdoutPump`].
pub struct ProgressWatch(watch::Receiver<Progress>);

impl ProgressWatch {
    /// Resolves when the progress changed; returns the new progress.
    pub async fn changed(&mut self) -> Progress {
        if self.0.changed().await.is_err() {
            // The thread is gone without a final report: treat as done.
            let mut p = self.0.borrow().clone();
            p.done = true;
            return p;
        }
        self.0.borrow_and_update().clone()
    }
}
