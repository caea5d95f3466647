//! Runs of NDJSON lines (without `subscribe_id`, see `proto::lines`) for
//! consecutive seqs, rendered by the first connection that sends them and
//! then served as the same bytes to every consumer whose pull takes exactly
//! those events as their first delivery: slices of one shared buffer,
//! queued in each connection's outbox without a copy, and — for a consumer
//! that reads the line ring — a batch in the ring, read in place (the run
//! is written into the ring once, when it is rendered: [`Piece::ring`]).
//! Everything else (redeliveries, delivery counts that differ, a filtered
//! subscription's seqs with holes, a consumer of an older `dws`) goes the
//! per-subscription way (`EventLines`).
//!
//! A run holds weak references to its events, and a pulled event is served
//! from a run only if it is the very event the run rendered, so a run can
//! never stand for another event under the same seq. The runs are bounded
//! ([`MAX_RUN_BYTES`] in all, oldest seqs dropped first); a connection
//! queues a slice of a run only when the slice is at least
//! [`MIN_SHARED_SLICE`] bytes (smaller ones are copied), so what its unsent
//! output keeps alive stays within a small multiple of it.

use std::{
    collections::BTreeMap,
    sync::{Arc, Weak},
};

use bytes::Bytes;
use proto::lines::{self, CUT_LEN};

use super::ring::{Ring, Slot};
use crate::eventlog::{LineBytes, LoggedEvent, ReadError};

/// Bytes of all runs together (bodies and cuts); the oldest go first.
const MAX_RUN_BYTES: usize = 8 << 20;
/// A run's body stops growing past this.
const RUN_BODY_BUDGET: usize = 64 << 10;
/// A run slice smaller than this is copied into the outbox, not shared.
pub const MIN_SHARED_SLICE: usize = RUN_BODY_BUDGET / 8;
/// An event whose line parts exceed this never goes into a run.
const MAX_SHARED_LINE: usize = 1 << 20;

/// An event as pulled: the event, its redelivered mark, its delivery count.
pub type Pulled = (Arc<LoggedEvent>, bool, u32);

/// Which lines a consumer takes in `LineBatch` frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// The contract's NDJSON line, the subscription id inserted by `dws`.
    Ndjson,
    /// `--format raw`: the payload and a newline.
    Raw,
}

/// The batch-sharing decision: the delivery count every event of `events`
/// carries when the pull may be served from shared runs — first deliveries
/// (not marked redelivered) with one delivery count, consecutive seqs in
/// the log's hot tail, lines of a bounded size; `None` otherwise.
pub fn shareable(events: &[Pulled], kind: LineKind, counted: &LineBytes) -> Option<u32> {
    let (first, _, delivery) = events.first()?;
    let ok = events.iter().enumerate().all(|(i, (e, redelivered, d))| {
        // Runs serve events whose bytes are in memory: the hot tail, and on
        // a store that keeps no files (memory) every retained event, so
        // consumers lagging behind the hot tail still share one rendering
        // (runs are bounded by MAX_RUN_BYTES whatever they hold). An event
        // read back from a segment (a catch-up on the disk store) is
        // rendered per subscription and not kept.
        if e.is_cooled() && !e.encoded.is_resident() {
            return false;
        }
        let size = match kind {
            // A body that cannot be read back is not shared: the
            // per-subscription path meets the same failure, a store failure.
            LineKind::Ndjson => match e.line_len(counted) {
                Ok(n) => n,
                Err(_) => return false,
            },
            LineKind::Raw => e.encoded.len(),
        };
        !redelivered
            && d == delivery
            && first.seq.checked_add(i as u64) == Some(e.seq)
            && size <= MAX_SHARED_LINE
    });
    ok.then_some(*delivery)
}

#[derive(Debug)]
struct Run {
    kind: LineKind,
    delivery: u32,
    events: Vec<Weak<LoggedEvent>>,
    cuts: Bytes,
    body: Bytes,
    /// Offset of each line's start in `body`, and the body's length last.
    starts: Vec<usize>,
    /// The run in the line ring, if it was written there.
    ring: Option<Slot>,
}

impl Run {
    fn bytes(&self) -> usize {
        self.cuts.len() + self.body.len()
    }
}

/// A piece of a pull served by one run: lines `from..to` of the run that
/// starts at `first_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub first_seq: u64,
    pub cuts: Bytes,
    pub body: Bytes,
    /// Where the whole run is in the line ring, held for the connection
    /// that asked (released with `Lines::release`), and the first of its
    /// lines this piece is.
    pub ring: Option<(Slot, u32)>,
}

impl Piece {
    pub fn count(&self) -> u32 {
        (self.cuts.len() / CUT_LEN) as u32
    }
}

/// The rendered runs, by first seq.
#[derive(Debug, Default)]
pub(super) struct LineRuns {
    runs: BTreeMap<u64, Run>,
    bytes: usize,
    /// The log's count of rendered line parts (they count against it).
    counted: LineBytes,
}

impl LineRuns {
    /// Runs whose rendered line parts count in `counted` (the log's).
    pub(super) fn counted_in(counted: LineBytes) -> LineRuns {
        LineRuns {
            counted,
            ..LineRuns::default()
        }
    }

    /// The pieces that carry `events` (see [`shareable`]), in order. With
    /// a `ring`, new runs are also written into it; with `hold`, each piece
    /// whose run is there is held there for the caller (else no piece
    /// names the ring).
    pub(super) fn pieces(
        &mut self,
        events: &[Pulled],
        delivery: u32,
        kind: LineKind,
        mut ring: Option<&mut Ring>,
        hold: bool,
    ) -> Result<Vec<Piece>, ReadError> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < events.len() {
            let mut piece = match self.served(&events[i..], delivery, kind) {
                Some(p) => p,
                None => self.render(&events[i..], delivery, kind, ring.as_deref_mut())?,
            };
            let held = match (ring.as_deref_mut(), piece.ring) {
                (Some(r), Some((slot, _))) if hold => r.hold(&slot),
                _ => false,
            };
            if !held {
                piece.ring = None;
            }
            i += piece.count() as usize;
            out.push(piece);
        }
        Ok(out)
    }

    /// The longest prefix of `events` a run rendered, if any.
    fn served(&self, events: &[Pulled], delivery: u32, kind: LineKind) -> Option<Piece> {
        let seq = events.first()?.0.seq;
        let (&first_seq, run) = self.runs.range(..=seq).next_back()?;
        let from = usize::try_from(seq - first_seq).ok()?;
        if run.delivery != delivery || run.kind != kind {
            return None;
        }
        let n = run
            .events
            .get(from..)?
            .iter()
            .zip(events)
            .take_while(|(w, (e, _, _))| std::ptr::eq(w.as_ptr(), Arc::as_ptr(e)))
            .count();
        if n == 0 {
            return None;
        }
        let to = from + n;
        Some(Piece {
            first_seq: seq,
            cuts: run.cuts.slice(from * CUT_LEN..to * CUT_LEN),
            body: run.body.slice(run.starts[from]..run.starts[to]),
            ring: run.ring.map(|slot| (slot, from as u32)),
        })
    }

    /// Renders a new run from the start of `events` (at least one line, up
    /// to the body budget) and keeps it.
    /// A body that cannot be read back from the store is a store failure
    /// (the caller's).
    fn render(
        &mut self,
        events: &[Pulled],
        delivery: u32,
        kind: LineKind,
        ring: Option<&mut Ring>,
    ) -> Result<Piece, ReadError> {
        // Sized for the run at once (growing it by doubling copied it
        // several times): about its events' encoded size, which a line
        // exceeds by its field names only.
        let mut lines = 0;
        let mut estimate = 0usize;
        for (e, _, _) in events {
            if lines > 0 && estimate >= RUN_BODY_BUDGET {
                break;
            }
            lines += 1;
            estimate += e.encoded.len() + 160;
        }
        let mut body = Vec::with_capacity(estimate);
        let mut cuts = Vec::with_capacity(lines * CUT_LEN);
        let mut starts = Vec::with_capacity(lines + 1);
        starts.push(0);
        let mut weak = Vec::with_capacity(lines);
        for (e, _, _) in events {
            if !weak.is_empty() && body.len() >= RUN_BODY_BUDGET {
                break;
            }
            match kind {
                LineKind::Ndjson => {
                    let (head, tail) = e.line_parts(&self.counted)?;
                    lines::render_line(&mut body, &mut cuts, &head, &tail, delivery);
                }
                LineKind::Raw => lines::render_raw_line(&mut body, &mut cuts, &e.data()?),
            }
            starts.push(body.len());
            weak.push(Arc::downgrade(e));
        }
        if body.capacity() > 2 * body.len() + 4096 {
            body.shrink_to_fit();
        }
        let first_seq = events.first().map_or(0, |(e, _, _)| e.seq);
        let ring_kind = match kind {
            LineKind::Ndjson => proto::ring::Kind::Ndjson,
            LineKind::Raw => proto::ring::Kind::Raw,
        };
        let count = weak.len() as u32;
        let slot = ring.and_then(|r| r.write(ring_kind, first_seq, count, &cuts, &body));
        let run = Run {
            kind,
            delivery,
            events: weak,
            cuts: Bytes::from(cuts),
            body: Bytes::from(body),
            starts,
            ring: slot,
        };
        let piece = Piece {
            first_seq,
            cuts: run.cuts.clone(),
            body: run.body.clone(),
            ring: slot.map(|s| (s, 0)),
        };
        self.bytes += run.bytes();
        if let Some(old) = self.runs.insert(first_seq, run) {
            self.bytes -= old.bytes();
        }
        while self.bytes > MAX_RUN_BYTES {
            let Some((_, old)) = self.runs.pop_first() else {
                break;
            };
            self.bytes -= old.bytes();
        }
        Ok(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64) -> Arc<LoggedEvent> {
        Arc::new(LoggedEvent {
            seq,
            event_type: "t".into(),
            received_at_unix_ms: 1,
            encoded: Bytes::from(prost::Message::encode_to_vec(&proto::v1::Event {
                seq,
                event_type: "t".into(),
                data: "x".repeat(300),
                ..Default::default()
            }))
            .into(),
            ..LoggedEvent::default()
        })
    }

    fn first(events: &[Arc<LoggedEvent>]) -> Vec<Pulled> {
        events.iter().map(|e| (e.clone(), false, 1)).collect()
    }

    /// A store that could read every body back (never asked here).
    #[derive(Debug)]
    struct Segments;

    impl crate::eventlog::body::ColdSource for Segments {
        fn read(&self, _: &Arc<std::path::PathBuf>, _: u64, len: usize) -> std::io::Result<Bytes> {
            Ok(Bytes::from(vec![0; len]))
        }

        fn failed(&self, _: &str) {}

        fn take_failure(&self) -> Option<String> {
            None
        }
    }

    #[test]
    fn an_event_outside_the_hot_tail_is_shared_only_while_its_bytes_are_in_memory() {
        let evs: Vec<_> = (5..9).map(ev).collect();
        // The memory store: a cooled event keeps its bytes.
        evs[2].cool();
        assert_eq!(
            shareable(&first(&evs), LineKind::Ndjson, &LineBytes::default()),
            Some(1)
        );
        // The disk store: a cooled event is read back from its segment.
        evs[2].encoded.set_cold(crate::eventlog::Place {
            segment: Arc::new(crate::eventlog::ColdSegment {
                source: Arc::new(Segments),
                path: Arc::new("seg".into()),
            }),
            at: 0,
        });
        evs[2].cool();
        assert!(!evs[2].encoded.is_resident());
        assert_eq!(
            shareable(&first(&evs), LineKind::Ndjson, &LineBytes::default()),
            None
        );
        assert_eq!(
            shareable(&first(&evs[..2]), LineKind::Raw, &LineBytes::default()),
            Some(1)
        );
    }

    #[test]
    fn only_consecutive_first_deliveries_with_one_count_are_shared() {
        let evs: Vec<_> = (5..9).map(ev).collect();
        assert_eq!(
            shareable(&first(&evs), LineKind::Ndjson, &LineBytes::default()),
            Some(1)
        );
        assert_eq!(
            shareable(&[], LineKind::Ndjson, &LineBytes::default()),
            None
        );
        assert_eq!(
            shareable(&first(&evs), LineKind::Raw, &LineBytes::default()),
            Some(1)
        );
        let mut redelivered = first(&evs);
        redelivered[2].1 = true;
        assert_eq!(
            shareable(&redelivered, LineKind::Ndjson, &LineBytes::default()),
            None,
            "a redelivery differs"
        );
        let mut counts = first(&evs);
        counts[3].2 = 2;
        assert_eq!(
            shareable(&counts, LineKind::Ndjson, &LineBytes::default()),
            None,
            "delivery counts differ"
        );
        let holes = first(&[evs[0].clone(), evs[2].clone()]);
        assert_eq!(
            shareable(&holes, LineKind::Ndjson, &LineBytes::default()),
            None,
            "a filtered subscription's holes"
        );
        let no_count: Vec<_> = evs.iter().map(|e| (e.clone(), false, 0)).collect();
        assert_eq!(
            shareable(&no_count, LineKind::Ndjson, &LineBytes::default()),
            Some(0)
        );
    }

    fn lines_of(pieces: &[Piece], sub: &str) -> Vec<u8> {
        let mut out = vec![];
        for p in pieces {
            lines::expand(
                p.count(),
                &p.cuts,
                &p.body,
                usize::MAX,
                &lines::subscription_fragment(sub),
                &mut out,
            )
            .unwrap();
        }
        out
    }

    fn per_subscription(events: &[Pulled], sub: &str) -> Vec<u8> {
        let mut out = vec![];
        for (e, r, d) in events {
            let (head, tail) = e.line_parts(&LineBytes::default()).unwrap();
            proto::ndjson::write_line(&mut out, &head, sub, &tail, *r, *d);
        }
        out
    }

    #[test]
    fn a_second_consumer_gets_the_same_bytes_and_renders_only_what_is_new() {
        let mut runs = LineRuns::default();
        let evs: Vec<_> = (10..20).map(ev).collect();
        let a = runs
            .pieces(&first(&evs[..6]), 1, LineKind::Ndjson, None, false)
            .unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(
            lines_of(&a, "s1"),
            per_subscription(&first(&evs[..6]), "s1")
        );
        // Another subscription pulls 2..10: lines 2..6 are the same buffer.
        let b = runs
            .pieces(&first(&evs[2..]), 1, LineKind::Ndjson, None, false)
            .unwrap();
        assert_eq!(b.len(), 2);
        let start = runs.runs[&10].starts[2];
        assert_eq!(
            b[0].body.as_ptr(),
            a[0].body[start..].as_ptr(),
            "not a copy"
        );
        assert_eq!(
            lines_of(&b, "s-2"),
            per_subscription(&first(&evs[2..]), "s-2")
        );
        assert_eq!(runs.runs.len(), 2, "only seqs 16..20 were rendered again");
        // A third sees both runs, rendering nothing.
        let c = runs
            .pieces(&first(&evs), 1, LineKind::Ndjson, None, false)
            .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(runs.runs.len(), 2);
        assert_eq!(lines_of(&c, "x"), per_subscription(&first(&evs), "x"));
    }

    #[test]
    fn another_event_under_a_rendered_seq_or_another_count_is_rendered_anew() {
        let mut runs = LineRuns::default();
        let evs: Vec<_> = (1..4).map(ev).collect();
        runs.pieces(&first(&evs), 1, LineKind::Ndjson, None, false)
            .unwrap();
        let other: Vec<_> = (1..4).map(ev).collect();
        let p = runs
            .pieces(&first(&other), 1, LineKind::Ndjson, None, false)
            .unwrap();
        assert!(
            std::ptr::eq(runs.runs[&1].events[0].as_ptr(), Arc::as_ptr(&other[0])),
            "rendered anew for the other event"
        );
        assert_eq!(lines_of(&p, "s"), per_subscription(&first(&other), "s"));
        let twice: Vec<_> = evs.iter().map(|e| (e.clone(), false, 2)).collect();
        let q = runs
            .pieces(&twice, 2, LineKind::Ndjson, None, false)
            .unwrap();
        assert_eq!(lines_of(&q, "s"), per_subscription(&twice, "s"));
    }

    #[test]
    fn raw_lines_are_rendered_apart_from_ndjson_lines() {
        let mut runs = LineRuns::default();
        let evs: Vec<_> = (1..4).map(ev).collect();
        let nd = runs
            .pieces(&first(&evs), 1, LineKind::Ndjson, None, false)
            .unwrap();
        let raw = runs
            .pieces(&first(&evs), 1, LineKind::Raw, None, false)
            .unwrap();
        assert_ne!(nd[0].body, raw[0].body);
        let mut out = vec![];
        lines::expand(raw[0].count(), &raw[0].cuts, &raw[0].body, 9, b"", &mut out).unwrap();
        assert_eq!(
            out,
            format!("{0}\n{0}\n{0}\n", "x".repeat(300)).into_bytes()
        );
    }

    #[test]
    fn runs_stay_within_their_byte_bound() {
        let mut runs = LineRuns::default();
        let evs: Vec<_> = (1..40_000).map(ev).collect();
        for chunk in evs.chunks(500) {
            runs.pieces(&first(chunk), 1, LineKind::Ndjson, None, false)
                .unwrap();
            assert!(runs.bytes <= MAX_RUN_BYTES);
        }
        assert!(
            runs.runs.first_key_value().is_some_and(|(s, _)| *s > 1),
            "the oldest went"
        );
    }
}
