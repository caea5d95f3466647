//! The hub's ingest: what happens to an upstream event before it is
//! durable. [`Ingest::stage`] counts it by type, answers a repeated id from
//! the dedup window with the original's seq, refuses what cannot be
//! delivered (no seq left, too large for a frame), and otherwise gives it
//! the next seq and stages it; the committer takes the staged events in
//! batches ([`Ingest::take_staged`]). Events another cluster host appended
//! move the seq counter and the window too ([`Ingest::replicated`]).

use std::{collections::BTreeMap, sync::Arc};

use bytes::Bytes;
use prost::Message;
use proto::{
    limits::MAX_EVENT_ENCODED,
    v1::{self, ErrorCode},
};

use super::dedup::Dedup;
use crate::{
    clock::now_ms,
    eventlog::{Interner, LoggedEvent, NewEvent},
    upstream::Refusal,
};

/// Most distinct event types counted one by one in status; the rest are
/// counted together under [`OTHER_TYPES`], so an exec feed that invents
/// types cannot grow the map for the bus's life.
pub const MAX_EVENT_TYPES: usize = 1000;
/// The status row that counts every event type past [`MAX_EVENT_TYPES`].
pub const OTHER_TYPES: &str = "(other)";

/// Result of `Hub::append` (and [`Ingest::stage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub event_id: String,
    pub duplicate: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct TypeCounters {
    pub(super) received: u64,
    pub(super) duplicates: u64,
}

/// Why [`Ingest::stage`] refused an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NotStaged {
    /// Its deliveries would not fit in a frame (counted by status).
    TooLarge(Refusal),
    /// Anything else: no seq left.
    Refused(Refusal),
}

impl NotStaged {
    pub(super) fn into_refusal(self) -> Refusal {
        match self {
            NotStaged::TooLarge(r) | NotStaged::Refused(r) => r,
        }
    }
}

/// Seq counter, staged events, dedup window and per-type counters.
pub(super) struct Ingest {
    /// The seq the next staged event gets.
    next_seq: u64,
    /// Accepted but not yet durable, in seq order.
    staged: Vec<Arc<LoggedEvent>>,
    dedup: Dedup,
    types: BTreeMap<String, TypeCounters>,
    /// The staged events' names: one copy of each.
    names: Interner,
}

impl Ingest {
    pub(super) fn new(next_seq: u64, dedup: Dedup) -> Ingest {
        Ingest {
            next_seq,
            staged: vec![],
            dedup,
            types: BTreeMap::new(),
            names: Interner::default(),
        }
    }

    /// Stages `ev` unless its id is in the dedup window (then the
    /// original's seq, `duplicate`). An event without an id gets one made
    /// of `id_prefix` (the bus's start time) and its seq.
    pub(super) fn stage(&mut self, ev: NewEvent, id_prefix: i64) -> Result<Appended, NotStaged> {
        count_type(&mut self.types, &ev.event_type, |c| c.received += 1);
        let dedup_key = (!ev.event_id.is_empty()).then(|| (ev.scope.clone(), ev.event_id.clone()));
        if let Some(key) = &dedup_key {
            if let Some(seq) = self.dedup.get(key) {
                count_type(&mut self.types, &ev.event_type, |c| c.duplicates += 1);
                return Ok(Appended {
                    seq,
                    event_id: ev.event_id,
                    duplicate: true,
                });
            }
        }
        let seq = self.next_seq;
        if seq > proto::limits::MAX_SEQ {
            // A seq never wraps: past the last one, nothing is appended.
            return Err(NotStaged::Refused(Refusal::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "the log has used every seq up to {} (the highest a bus assigns); nothing \
                     more can be published to this store",
                    proto::limits::MAX_SEQ
                ),
            )));
        }
        let event_id = if ev.event_id.is_empty() {
            format!("{id_prefix}-{seq}")
        } else {
            ev.event_id.clone()
        };
        let received_at_unix_ms = now_ms();
        let encoded = v1::Event {
            seq,
            event_id: event_id.clone(),
            event_born_time: ev.event_born_time,
            event_corp_id: ev.event_corp_id,
            event_type: ev.event_type.clone(),
            event_unified_app_id: ev.event_unified_app_id,
            subscription_id: String::new(),
            source_id: ev.source_id,
            rule_type: ev.rule_type,
            data: ev.data,
            headers: ev.headers.into_iter().collect(),
            received_at_unix_ms,
            redelivered: false,
            delivery: 0,
        }
        .encode_to_vec();
        if encoded.len() > MAX_EVENT_ENCODED {
            return Err(NotStaged::TooLarge(Refusal::new(
                ErrorCode::TooLarge,
                format!(
                    "event too large: {} bytes encoded (data, headers and ids together); the most \
                     is {MAX_EVENT_ENCODED}, so that every delivery fits in one frame",
                    encoded.len()
                ),
            )));
        }
        self.next_seq += 1;
        let (scope, key_id) = dedup_key.clone().unwrap_or_default();
        self.staged.push(Arc::new(LoggedEvent {
            seq,
            event_type: self.names.name(&ev.event_type),
            received_at_unix_ms,
            encoded: Bytes::from(encoded).into(),
            scope: self.names.name(&scope),
            event_id: key_id.into(),
            route: self.names.name(&ev.upstream_subscription),
            ..LoggedEvent::default()
        }));
        if let Some(key) = dedup_key {
            self.dedup.put(key, seq);
        }
        Ok(Appended {
            seq,
            event_id,
            duplicate: false,
        })
    }

    pub(super) fn staged_len(&self) -> usize {
        self.staged.len()
    }

    /// The encoded sizes of the staged events, in seq order.
    pub(super) fn staged_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.staged.iter().map(|e| e.encoded.len())
    }

    /// Takes the first `n` staged events (all of them when `n` is more).
    pub(super) fn take_staged(&mut self, n: usize) -> Vec<Arc<LoggedEvent>> {
        if n >= self.staged.len() {
            std::mem::take(&mut self.staged)
        } else {
            self.staged.drain(..n).collect()
        }
    }

    /// Events another host appended (seq order, above this log's head):
    /// their ids join the window and the seq counter moves past them.
    pub(super) fn replicated(&mut self, batch: &[Arc<LoggedEvent>]) {
        for e in batch {
            if !e.scope.is_empty() {
                self.dedup
                    .put((e.scope.to_string(), e.event_id.to_string()), e.seq);
            }
        }
        if let Some(last) = batch.last() {
            self.next_seq = self.next_seq.max(last.seq + 1);
        }
    }

    /// See [`Dedup::retained_from`].
    pub(super) fn dedup_retained_from(&mut self, floor: u64) {
        self.dedup.retained_from(floor);
    }

    /// See [`Dedup::seed_older`].
    pub(super) fn seed_dedup(&mut self, older: &[crate::store::dedup_ids::Entry]) {
        self.dedup.seed_older(older);
    }

    /// Per event type: received and duplicates, for status.
    pub(super) fn types(&self) -> impl Iterator<Item = (&String, &TypeCounters)> {
        self.types.iter()
    }
}

/// Counts an event of `event_type` with `count`; allocates only for a type
/// not seen before.
fn count_type(
    types: &mut BTreeMap<String, TypeCounters>,
    event_type: &str,
    count: impl FnOnce(&mut TypeCounters),
) {
    let key = if types.contains_key(event_type) || types.len() < MAX_EVENT_TYPES {
        event_type
    } else {
        OTHER_TYPES
    };
    match types.get_mut(key) {
        Some(c) => count(c),
        None => count(types.entry(key.to_owned()).or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingest(next_seq: u64) -> Ingest {
        Ingest::new(next_seq, Dedup::new(8, false))
    }

    fn ev(id: &str, ty: &str) -> NewEvent {
        NewEvent {
            event_id: id.into(),
            event_type: ty.into(),
            scope: if id.is_empty() { "" } else { "local" }.into(),
            data: "{}".into(),
            ..Default::default()
        }
    }

    #[test]
    fn staging_gives_consecutive_seqs_and_a_repeated_id_the_originals() {
        let mut i = ingest(5);
        let a = i.stage(ev("a", "t"), 0).unwrap();
        let b = i.stage(ev("b", "t"), 0).unwrap();
        assert_eq!((a.seq, a.duplicate), (5, false));
        assert_eq!((b.seq, b.duplicate), (6, false));
        let again = i.stage(ev("a", "t"), 0).unwrap();
        assert_eq!((again.seq, again.duplicate), (5, true));
        assert_eq!(i.staged_len(), 2, "a duplicate is not staged");
        let counted: Vec<_> = i.types().map(|(t, c)| (t.clone(), *c)).collect();
        assert_eq!(
            counted,
            vec![(
                "t".to_owned(),
                TypeCounters {
                    received: 3,
                    duplicates: 1
                }
            )]
        );
    }

    #[test]
    fn an_event_without_an_id_gets_one_from_the_start_time_and_its_seq() {
        let mut i = ingest(1);
        let a = i.stage(ev("", "t"), 1234).unwrap();
        assert_eq!(a.event_id, "1234-1");
        // Two id-less events are never duplicates of each other.
        assert!(!i.stage(ev("", "t"), 1234).unwrap().duplicate);
    }

    #[test]
    fn the_committer_takes_staged_events_in_seq_order_and_in_parts() {
        let mut i = ingest(1);
        for id in ["a", "b", "c"] {
            i.stage(ev(id, "t"), 0).unwrap();
        }
        assert_eq!(i.staged_sizes().count(), 3);
        let first: Vec<_> = i.take_staged(2).iter().map(|e| e.seq).collect();
        assert_eq!(first, vec![1, 2]);
        let rest: Vec<_> = i.take_staged(9).iter().map(|e| e.seq).collect();
        assert_eq!(rest, vec![3]);
        assert_eq!(i.staged_len(), 0);
    }

    #[test]
    fn a_too_large_event_and_a_spent_seq_range_are_refused_without_a_seq() {
        let mut i = ingest(1);
        let mut big = ev("big", "t");
        big.data = "x".repeat(MAX_EVENT_ENCODED + 1);
        assert!(matches!(i.stage(big, 0), Err(NotStaged::TooLarge(_))));
        assert_eq!(i.stage(ev("a", "t"), 0).unwrap().seq, 1, "no seq spent");
        let mut spent = ingest(proto::limits::MAX_SEQ + 1);
        let err = spent.stage(ev("b", "t"), 0).unwrap_err().into_refusal();
        assert_eq!(err.code, ErrorCode::ResourceExhausted);
        assert_eq!(spent.staged_len(), 0);
    }

    #[test]
    fn types_past_the_bound_are_counted_together() {
        let mut i = ingest(1);
        for n in 0..MAX_EVENT_TYPES + 2 {
            i.stage(ev("", &format!("type-{n}")), 0).unwrap();
        }
        assert_eq!(i.types().count(), MAX_EVENT_TYPES + 1);
        let other = i.types().find(|(t, _)| *t == OTHER_TYPES).map(|(_, c)| *c);
        assert_eq!(other.map(|c| c.received), Some(2));
    }

    #[test]
    fn replicated_events_move_the_seq_counter_and_the_window() {
        let mut i = ingest(1);
        let mut other = ingest(10);
        other.stage(ev("x", "t"), 0).unwrap();
        let batch = other.take_staged(1);
        i.replicated(&batch);
        let dup = i.stage(ev("x", "t"), 0).unwrap();
        assert_eq!((dup.seq, dup.duplicate), (10, true));
        assert_eq!(i.stage(ev("y", "t"), 0).unwrap().seq, 11);
    }
}
