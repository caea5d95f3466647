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
//! A run is written into the ring only while some consumer reads it
//! ([`Lines::reading_ring`]): with none, the bus copies nothing there.

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
    /// Consumers attached that read the ring now.
    ring_readers: usize,
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
            ring_readers: 0,
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
            ring_readers,
            stats,
            ..
        } = &mut *r;
        let ring_of = ring_of.as_mut().filter(|_| *ring_readers > 0);
        let pieces = runs.pieces(events, delivery, kind, ring_of, ring)?;
        for p in &pieces {
            match p.ring {
                Some(_) => stats.ring_batches += 1,
                None => stats.line_batches += 1,
            }
        }
        Ok(pieces)
    }

    /// A consumer starts (`true`) or stops (`false`) reading the ring:
    /// new runs go into the ring only while one does.
    pub fn reading_ring(&self, reads: bool) {
        let mut r = self.lock();
        r.ring_readers = if reads {
            r.ring_readers + 1
        } else {
            r.ring_readers.saturating_sub(1)
        };
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::eventlog::LoggedEvent;

    fn first(seqs: std::ops::Range<u64>) -> Vec<Pulled> {
        seqs.map(|seq| {
            let encoded = prost::Message::encode_to_vec(&proto::v1::Event {
                seq,
                event_type: "t".into(),
                ..Default::default()
            });
            let e = LoggedEvent {
                seq,
                event_type: "t".into(),
                encoded: Bytes::from(encoded).into(),
                ..LoggedEvent::default()
            };
            (Arc::new(e), false, 1)
        })
        .collect()
    }

    #[test]
    fn runs_go_into_the_ring_only_while_a_consumer_reads_it() {
        let lines = Lines::with_a_ring(LineBytes::default());
        assert!(lines.stats().ring, "the ring's memory file");
        let (early, late) = (first(1..4), first(4..7));
        // Rendered while nobody reads the ring: bytes only, even for a
        // reader that comes later.
        lines.pieces(&early, 1, LineKind::Ndjson, false).unwrap();
        lines.reading_ring(true);
        let held = lines.pieces(&early, 1, LineKind::Ndjson, true).unwrap();
        assert!(held.iter().all(|p| p.ring.is_none()));
        // Rendered while one does: in the ring.
        let held = lines.pieces(&late, 1, LineKind::Ndjson, true).unwrap();
        assert!(!held.is_empty() && held.iter().all(|p| p.ring.is_some()));
        lines.release(held.iter().filter_map(|p| p.ring.map(|(s, _)| s.chunk)));
        lines.reading_ring(false);
        let later = first(7..9);
        lines.pieces(&later, 1, LineKind::Ndjson, false).unwrap();
        lines.reading_ring(true);
        let held = lines.pieces(&later, 1, LineKind::Ndjson, true).unwrap();
        assert!(held.iter().all(|p| p.ring.is_none()), "the reader left");
    }
}
