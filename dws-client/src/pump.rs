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

use std::io::{self, Write};

use tokio::sync::{mpsc, watch};

/// Events formatted for stdout, with the seq of the last one.
#[derive(Debug, Default)]
pub struct Chunk {
    pub bytes: Vec<u8>,
    pub last_seq: u64,
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
    /// Seq of the last event written and flushed: what may be acked.
    pub written_seq: u64,
    /// Events written and flushed.
    pub written: u64,
    pub failed: Option<WriteFailure>,
    /// The pump has stopped (channel closed and drained, or a failure).
    pub done: bool,
}

pub struct StdoutPump {
    tx: Option<mpsc::Sender<Chunk>>,
    progress: watch::Receiver<Progress>,
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
                    Ok(()) => {
                        if chunk.events > 0 {
                            p.written_seq = chunk.last_seq;
                            p.written += chunk.events;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                        p.failed = Some(WriteFailure::BrokenPipe);
                    }
                    Err(e) => p.failed = Some(WriteFailure::Other(e.to_string())),
                }
                let failed = p.failed.is_some();
                p.done = failed;
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
        }
    }

    /// Hands a chunk to the writer; waits while the previous one is queued.
    /// Returns the chunk back if the writer has stopped.
    pub async fn send(&self, chunk: Chunk) -> Result<(), Chunk> {
        match &self.tx {
            Some(tx) => tx.send(chunk).await.map_err(|e| e.0),
            None => Err(chunk),
        }
    }

    /// Waits for room for one chunk. Cancel-safe: nothing is lost when the
    /// wait is abandoned (unlike a pending `send`, which owns its chunk).
    /// `None` if the writer has stopped.
    pub async fn reserve(&self) -> Option<mpsc::Permit<'_, Chunk>> {
        self.tx.as_ref()?.reserve().await.ok()
    }

    /// A watch on the progress, for waiting on it while also sending.
    pub fn watch(&self) -> ProgressWatch {
        ProgressWatch(self.progress.clone())
    }

    pub fn progress(&self) -> Progress {
        self.progress.borrow().clone()
    }

    /// No more chunks: the writer finishes what it has and reports done.
    pub fn close(&mut self) {
        self.tx = None;
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
