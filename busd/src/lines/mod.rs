//! The bus's renderings of its lines, one for every connection ([`Lines`]):
//! runs of first deliveries' lines rendered once (`runs`), also written
//! into the line ring (`ring`), which consumers that hold it read in place
//! instead of being sent the bytes. One `Lines` per bus, made at start and
//! handed to each connection by the server: no state of its own outlives
//! its bus, and two buses in one process (tests) share nothing.
//!
//! What a connection does with a piece: a consumer that reads the ring is
//! told where its lines are (`RingBatch`) and holds that batch until it
//! says it read it (`Ack.ring_read`, [`Lines::release`]) or leaves; any
//! other consumer is sent the bytes (`LineBatch`). A ring that cannot be
//! made (no memory file) or has no chunk free leaves everything to bytes.

pub mod ring;
mod runs;

use std::{
    os::fd::OwnedFd,
    sync::{Arc, Mutex, MutexGuard},
};

pub use runs::{LineKind, Piece, Pulled, MIN_SHARED_SLICE};

use self::{ring::Ring, runs::LineRuns};
use crate::eventlog::{LineBytes, ReadError};

#[derive(Debug)]
struct Renderings {
    runs: LineRuns,
    ring: Option<Ring>,
    stats: Stats,
    /// The log's count of rendered line parts.
    counted: LineBytes,
}

/// What the renderings served, for status (`lines`).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Stats {
    /// The bus has a line ring.
    pub ring: bool,
    /// Pieces told as a place in the ring (`RingBatch`).
    pub ring_batches: u64,
    /// Pieces sent as bytes (`LineBatch`).
    pub line_batches: u64,
}

/// The bus's renderings (cheap to clone).
#[derive(Debug, Clone)]
pub struct Lines(Arc<Mutex<Renderings>>);

impl Lines {
    /// Renderings with a line ring when one can be made (else logged: bytes
    /// only, as for an older `dws`); what they render counts in `counted`
    /// (the log's: `hub.line_bytes()`).
    pub fn with_a_ring(counted: LineBytes) -> Lines {
        let ring = match Ring::create() {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(cause = %e, "cannot make the line ring; consumers are sent their lines");
                None
            }
        };
        Lines::with_ring(ring, counted)
    }

    /// Renderings without a ring (tests).
    pub fn without_ring(counted: LineBytes) -> Lines {
        Lines::with_ring(None, counted)
    }

    fn with_ring(ring: Option<Ring>, counted: LineBytes) -> Lines {
        let stats = Stats {
            ring: ring.is_some(),
            ..Stats::default()
        };
        Lines(Arc::new(Mutex::new(Renderings {
            runs: LineRuns::counted_in(counted.clone()),
            ring,
            stats,
            counted,
        })))
    }

    /// The count the rendered line parts go into (a connection rendering
    /// lines of its own passes it to `LoggedEvent::line_parts`).
    pub fn counted(&self) -> LineBytes {
        self.lock().counted.clone()
    }

    /// See [`runs::shareable`].
    pub fn shareable(&self, events: &[Pulled], kind: LineKind) -> Option<u32> {
        let counted = self.counted();
        runs::shareable(events, kind, &counted)
    }

    fn lock(&self) -> MutexGuard<'_, Renderings> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pieces that carry `events` (see [`shareable`]), in order; with
    /// `ring`, those in the line ring are held there for the caller.
    pub fn pieces(
        &self,
        events: &[Pulled],
        delivery: u32,
        kind: LineKind,
        ring: bool,
    ) -> Result<Vec<Piece>, ReadError> {
        let mut r = self.lock();
        let Renderings {
            runs,
            ring: ring_of,
            stats,
            ..
        } = &mut *r;
        let pieces = runs.pieces(events, delivery, kind, ring_of.as_mut(), ring)?;
        for p in &pieces {
            match p.ring {
                Some(_) => stats.ring_batches += 1,
                None => stats.line_batches += 1,
            }
        }
        Ok(pieces)
    }

    /// What was served so far.
    pub fn stats(&self) -> Stats {
        self.lock().stats
    }

    /// A consumer read (or will never read) batches held in these chunks.
    pub fn release(&self, chunks: impl IntoIterator<Item = u32>) {
        let mut r = self.lock();
        if let Some(ring) = r.ring.as_mut() {
            for c in chunks {
                ring.release(c);
            }
        }
    }

    /// A read-only descriptor of the ring for a consumer, if there is one.
    pub fn ring_reader(&self) -> Option<std::io::Result<OwnedFd>> {
        self.lock().ring.as_ref().map(Ring::reader)
    }
}
