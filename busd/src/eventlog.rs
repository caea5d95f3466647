//! The bus's event log: every accepted event, in `seq` order, bounded by
//! count and bytes. Delivery reads from here; retention evicts from the front.
//!
//! This is the in-memory view of the retained log: what consumers read.
//! The durable copy is the store's (`crate::store`); only events the store
//! has made durable are appended here.
//!
//! The log is a hot tail in memory and a cold range behind it: only the
//! newest [`Retention::hot_events`] events (and at most [`HOT_BYTES`]) keep
//! their encoded bytes and their rendered NDJSON line parts in memory.
//! Older events keep their seq and routing fields; their bytes are read
//! back from the store's segment on each use ([`body`]). On a store that
//! keeps no files (memory) a cooled event keeps its encoded bytes and drops
//! only the rendered parts: each retained event is held once.
//!
//! The byte bound counts each event's encoded size (plus its fields) and
//! the rendered line parts alive ([`LineParts`], counted process-wide while
//! they live, also for events held in flight past retention).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use bytes::Bytes;

pub mod body;
pub mod name;
pub mod stored;
pub use body::{Body, ColdSegment, ColdSource, Place, ReadError};
pub use name::{Interner, Name, Text};

/// The most bytes of events whose encoded form stays in memory: the hot
/// tail is also cut here when its events are large.
pub const HOT_BYTES: usize = 32 << 20;

/// An event on its way into the log, before it has a seq. Serializable: a
/// cluster host that does not own the log hands its publishes to the owner
/// through the database (`cluster::db::inbox`).
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct NewEvent {
    /// Dedup scope: the upstream subscription the event came through.
    pub scope: String,
    /// Empty: generated, and the event is not deduplicated.
    pub event_id: String,
    pub event_type: String,
    pub event_born_time: i64,
    pub event_corp_id: String,
    pub event_unified_app_id: String,
    pub source_id: String,
    pub rule_type: String,
    /// The upstream subscription the event was routed to (personal stream):
    /// only local subscriptions bound to it receive the event. Empty: route
    /// by event type alone.
    pub upstream_subscription: String,
    pub data: String,
    pub headers: BTreeMap<String, String>,
}

/// One accepted event. Shared (`Arc`) between the log and the pending queues
/// of the subscriptions that matched it, so fan-out never copies payloads.
/// Compact, since the log holds one per retained event: shared names, and
/// the renderings of a hot event inside its [`Body`] (gone once it cools).
#[derive(Debug, Default)]
pub struct LoggedEvent {
    pub seq: u64,
    pub event_type: Name,
    pub received_at_unix_ms: i64,
    /// `v1::Event` encoded once, without the per-delivery fields: in
    /// memory while hot, else read back from the store ([`Body`]), with
    /// the event's NDJSON line parts cached while hot.
    pub encoded: Body,
    /// Dedup scope; empty when the event is not deduplicated.
    pub scope: Name,
    pub event_id: Text,
    /// The upstream subscription the event was routed to; empty: by type only.
    pub route: Name,
    /// A seq whose record failed its checksum in the store: a placeholder
    /// that is never delivered (see `store::disk`).
    pub damaged: bool,
}

/// Bytes of one bus's [`LineParts`] alive (cheap to clone): its log
/// counts them against its byte bound, its connections render them.
#[derive(Debug, Clone, Default)]
pub struct LineBytes(Arc<AtomicUsize>);

impl LineBytes {
    /// Bytes of the NDJSON line parts rendered and still held.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// An event's rendered NDJSON line parts; their bytes count against the
/// log's byte bound while they live ([`LineBytes`]).
#[derive(Debug)]
pub struct LineParts {
    parts: (Bytes, Bytes),
    counted: LineBytes,
}

impl LineParts {
    pub fn new(head: Bytes, tail: Bytes, counted: &LineBytes) -> LineParts {
        counted
            .0
            .fetch_add(head.len() + tail.len(), Ordering::Relaxed);
        LineParts {
            parts: (head, tail),
            counted: counted.clone(),
        }
    }

    pub fn parts(&self) -> &(Bytes, Bytes) {
        &self.parts
    }

    /// Bytes of the line (both parts).
    pub fn len(&self) -> usize {
        self.parts.0.len() + self.parts.1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for LineParts {
    fn drop(&mut self) {
        let n = self.parts.0.len() + self.parts.1.len();
        self.counted.0.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Only the payload of an encoded event, a slice of its bytes (no copy,
/// no other field decoded): what a raw line is.
#[derive(Clone, PartialEq, prost::Message)]
struct DataOnly {
    #[prost(bytes = "bytes", tag = "10")]
    data: Bytes,
}

/// The fields of an encoded event that verb documents show, read without
/// copying its payload (`data` is a slice of the encoded bytes).
#[derive(Clone, PartialEq, prost::Message)]
struct Shown {
    #[prost(string, tag = "2")]
    event_id: String,
    #[prost(bytes = "bytes", tag = "10")]
    data: Bytes,
}

impl LoggedEvent {
    fn shown(&self) -> Shown {
        use prost::Message;
        self.encoded
            .get()
            .ok()
            .and_then(|b| Shown::decode(b).ok())
            .unwrap_or_default()
    }

    /// The encoded event: from memory, or read back from the store.
    pub fn encoded(&self) -> Result<Bytes, ReadError> {
        self.encoded.get()
    }

    /// The event's `data` (a slice of its encoded bytes): a raw line.
    pub fn data(&self) -> Result<Bytes, ReadError> {
        use prost::Message;
        let encoded = self.encoded.get()?;
        Ok(DataOnly::decode(encoded)
            .map(|d| d.data)
            .unwrap_or_else(|e| {
                // The bus encoded it itself; never expected.
                tracing::error!(seq = self.seq, cause = %e, "cannot decode a logged event");
                Bytes::new()
            }))
    }

    /// Outside the hot tail: its renderings are not kept.
    pub fn is_cooled(&self) -> bool {
        self.encoded.is_cooled()
    }

    /// The event left the hot tail: its cached renderings go, and its bytes
    /// too when the store can read them back.
    pub fn cool(&self) {
        self.encoded.cool();
    }

    /// Retention dropped the event while something (a delivery in flight)
    /// still holds it: its bytes come back into memory, since its segment
    /// may be released. A failed read is noted as a store failure.
    pub fn keep_resident(&self) {
        let _ = self.encoded.make_resident();
    }

    /// The id a consumer saw on this event's line: the dedup id it was
    /// published or received with, or the one the bus gave it.
    pub fn shown_id(&self) -> String {
        if self.event_id.is_empty() {
            self.shown().event_id
        } else {
            self.event_id.to_string()
        }
    }

    /// The event's `data` as a consumer saw it, cut to at most `max` bytes
    /// (on a character boundary), and its whole size in bytes.
    pub fn data_prefix(&self, max: usize) -> (String, usize) {
        let data = self.shown().data;
        let text = String::from_utf8_lossy(&data);
        let mut end = text.len().min(max);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        (text[..end].to_owned(), data.len())
    }

    /// Bytes this event counts against the retention bound.
    pub fn size(&self) -> usize {
        self.encoded.len() + self.event_type.len() + self.event_id.len() + self.scope.len() + 64
    }

    /// The event's NDJSON line without its per-delivery fields
    /// (`proto::ndjson::parts`), rendered once, on first need, for every
    /// consumer that takes lines, and kept while the event is hot (its
    /// bytes `counted` against its log's bound).
    pub fn line_parts(&self, counted: &LineBytes) -> Result<(Bytes, Bytes), ReadError> {
        use prost::Message;
        if let Some(hit) = self.encoded.peek_line_parts() {
            return Ok(hit.parts().clone());
        }
        if self.is_cooled() {
            // A catch-up read from the store: rendered for this delivery only.
            return Ok(render_cold(&self.encoded.get()?));
        }
        let parts = self.encoded.line_parts(|encoded| {
            let e = proto::v1::Event::decode(encoded).unwrap_or_default();
            let (head, tail) = proto::ndjson::parts(&e);
            Arc::new(LineParts::new(
                Bytes::from(head),
                Bytes::from(tail),
                counted,
            ))
        })?;
        Ok(parts.parts().clone())
    }

    /// Bytes of [`Self::line_parts`]: read from the cached parts without
    /// cloning them (every consumer asks it of every event it may share).
    pub fn line_len(&self, counted: &LineBytes) -> Result<usize, ReadError> {
        if let Some(n) = self.encoded.line_parts_len() {
            return Ok(n);
        }
        self.line_parts(counted)
            .map(|(head, tail)| head.len() + tail.len())
    }

    /// Whether a subscription bound to `upstream_id` receives this event:
    /// an event routed to an upstream subscription goes only to the local
    /// subscriptions bound to it.
    pub fn routed_to(&self, upstream_id: Option<&str>) -> bool {
        self.route.is_empty() || upstream_id == Some(self.route.as_str())
    }
}

/// The line parts of an event outside the hot tail, rendered for one
/// delivery and not kept. A catch-up renders one such event after another:
/// the event is decoded into a scratch event reused by the thread (its
/// strings keep their capacity), so a cold line costs the rendering's
/// allocations only, not one per decoded field, in a heap full of the
/// log's small objects.
fn render_cold(encoded: &[u8]) -> (Bytes, Bytes) {
    use prost::Message;
    // process-wide: a per-thread scratch event, its strings' capacity kept;
    // nothing in it outlives a call.
    thread_local! {
        static SCRATCH: std::cell::RefCell<proto::v1::Event> = std::cell::RefCell::default();
    }
    SCRATCH.with(|scratch| {
        let mut e = scratch.borrow_mut();
        e.clear();
        if e.merge(encoded).is_err() {
            e.clear();
        }
        let (head, tail) = proto::ndjson::parts(&e);
        // A large event's capacity is not kept for the next one.
        if e.data.capacity() > 1 << 16 {
            *e = proto::v1::Event::default();
        }
        (Bytes::from(head), Bytes::from(tail))
    })
}

/// Retention bounds of the log.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_events: usize,
    pub max_bytes: usize,
    /// The newest events whose bytes stay in memory (the hot tail).
    pub hot_events: usize,
}

#[derive(Debug)]
pub struct EventLog {
    events: VecDeque<Arc<LoggedEvent>>,
    bytes: usize,
    head_seq: u64,
    retention: Retention,
    /// `events[..hot_from]` are cooled; the rest is the hot tail.
    hot_from: usize,
    /// Sizes of the hot tail's events.
    hot_bytes: usize,
    /// The rendered line parts of this log's events alive (counted too).
    line_bytes: LineBytes,
}

impl EventLog {
    pub fn new(retention: Retention) -> EventLog {
        EventLog::with_head(retention, 0)
    }

    /// An empty log whose next event gets `head_seq + 1` (after a restart
    /// that found every earlier event released).
    pub fn with_head(retention: Retention, head_seq: u64) -> EventLog {
        EventLog {
            events: VecDeque::new(),
            bytes: 0,
            head_seq,
            retention,
            hot_from: 0,
            hot_bytes: 0,
            line_bytes: LineBytes::default(),
        }
    }

    /// The counter of this log's rendered line parts, for those who render
    /// them.
    pub fn line_bytes(&self) -> LineBytes {
        self.line_bytes.clone()
    }

    /// The seq the next appended event gets.
    pub fn next_seq(&self) -> u64 {
        self.head_seq + 1
    }

    /// Seq of the newest event ever appended (0 before the first).
    pub fn head_seq(&self) -> u64 {
        self.head_seq
    }

    /// Seq of the oldest retained event, if any.
    pub fn oldest_seq(&self) -> Option<u64> {
        self.events.front().map(|e| e.seq)
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// The retained event `seq`, if any.
    pub fn get(&self, seq: u64) -> Option<Arc<LoggedEvent>> {
        let i = self.events.binary_search_by_key(&seq, |e| e.seq).ok()?;
        self.events.get(i).cloned()
    }

    /// The retained events, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &Arc<LoggedEvent>> {
        self.events.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Bytes the log holds: its events' sizes plus the rendered line parts.
    pub fn bytes(&self) -> usize {
        self.bytes.saturating_add(self.line_bytes.get())
    }

    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// Moves the head forward without an event (the store's seq counter was
    /// ahead of its retained events).
    pub fn advance_head(&mut self, seq: u64) {
        self.head_seq = self.head_seq.max(seq);
    }

    pub fn append(&mut self, event: Arc<LoggedEvent>) {
        debug_assert!(event.seq > self.head_seq);
        self.head_seq = event.seq;
        self.bytes += event.size();
        self.hot_bytes += event.size();
        self.events.push_back(event);
        // The hot tail keeps at least its newest event.
        while self.events.len() - self.hot_from > 1
            && (self.events.len() - self.hot_from > self.retention.hot_events
                || self.hot_bytes > HOT_BYTES)
        {
            if let Some(e) = self.events.get(self.hot_from) {
                e.cool();
                self.hot_bytes -= e.size();
            }
            self.hot_from += 1;
        }
    }

    /// How many of the retained events are hot (their bytes in memory).
    pub fn hot_len(&self) -> usize {
        self.events.len() - self.hot_from
    }

    /// Removes and returns the oldest event while the log is over a bound.
    /// The newest event is always kept, even if it alone exceeds the bounds.
    pub fn evict_one(&mut self) -> Option<Arc<LoggedEvent>> {
        let over = self.events.len() > self.retention.max_events
            || self.bytes() > self.retention.max_bytes;
        if !over || self.events.len() <= 1 {
            return None;
        }
        let e = self.events.pop_front()?;
        self.bytes -= e.size();
        if self.hot_from > 0 {
            self.hot_from -= 1;
        } else {
            self.hot_bytes -= e.size();
        }
        Some(e)
    }

    /// Retained events with `seq >= from`, oldest first.
    pub fn since(&self, from: u64) -> impl Iterator<Item = &Arc<LoggedEvent>> {
        let start = match self.events.front() {
            Some(first) if from > first.seq => (from - first.seq) as usize,
            _ => 0,
        };
        self.events.range(start.min(self.events.len())..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, size: usize) -> Arc<LoggedEvent> {
        Arc::new(LoggedEvent {
            seq,
            event_type: "t".into(),
            encoded: Bytes::from(vec![0; size]).into(),
            ..LoggedEvent::default()
        })
    }

    #[test]
    fn rendered_lines_count_against_the_byte_bound_while_they_live() {
        let mut log = EventLog::new(Retention {
            max_events: 100,
            max_bytes: 2_000_000,
            hot_events: 100,
        });
        let e = Arc::new(LoggedEvent {
            seq: 1,
            event_type: "t".into(),
            encoded: {
                use prost::Message;
                let ev = proto::v1::Event {
                    seq: 1,
                    event_type: "t".into(),
                    data: "y".repeat(600_000),
                    ..Default::default()
                };
                Bytes::from(ev.encode_to_vec()).into()
            },
            ..LoggedEvent::default()
        });
        log.append(e.clone());
        log.append(ev(2, 600_000));
        log.append(ev(3, 600_000));
        assert!(log.evict_one().is_none(), "1.8 MB of events fit");
        let counted = log.line_bytes();
        let (head, tail) = e.line_parts(&counted).expect("resident");
        assert!(head.len() + tail.len() >= 600_000);
        assert!(counted.get() >= 600_000, "this log's own count");
        // Over the bound now: the oldest goes, and with it its line.
        let gone = log
            .evict_one()
            .expect("over the bound with the rendered line");
        assert_eq!(gone.seq, 1);
        drop((gone, e, head, tail));
        assert_eq!(counted.get(), 0);
    }

    #[test]
    fn a_retained_event_is_compact() {
        // The log holds one per retained event; a subscription's pending
        // entry points at it.
        assert!(std::mem::size_of::<LoggedEvent>() <= 128);
        assert!(std::mem::size_of::<Body>() <= 40);
    }

    #[test]
    fn bounded_by_count_and_bytes() {
        let mut log = EventLog::new(Retention {
            max_events: 3,
            max_bytes: 10_000,
            hot_events: 100,
        });
        for s in 1..=5 {
            log.append(ev(s, 10));
        }
        let mut evicted = vec![];
        while let Some(e) = log.evict_one() {
            evicted.push(e.seq);
        }
        assert_eq!(evicted, vec![1, 2]);
        assert_eq!(log.oldest_seq(), Some(3));
        assert_eq!(log.since(4).map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(log.since(0).count(), 3);
        assert_eq!(log.since(99).count(), 0);

        let mut log = EventLog::new(Retention {
            max_events: 100,
            max_bytes: 200,
            hot_events: 100,
        });
        for s in 1..=3 {
            log.append(ev(s, 100));
        }
        while log.evict_one().is_some() {}
        assert_eq!(log.len(), 1);
    }

    fn real(seq: u64) -> Arc<LoggedEvent> {
        use prost::Message;
        let ev = proto::v1::Event {
            seq,
            event_type: "t".into(),
            data: format!("{{\"n\":{seq}}}"),
            ..Default::default()
        };
        Arc::new(LoggedEvent {
            seq,
            event_type: "t".into(),
            encoded: Bytes::from(ev.encode_to_vec()).into(),
            ..LoggedEvent::default()
        })
    }

    #[test]
    fn only_the_hot_tail_keeps_its_renderings() {
        let mut log = EventLog::new(Retention {
            max_events: 5,
            max_bytes: 1 << 20,
            hot_events: 3,
        });
        let all: Vec<_> = (1..=8).map(real).collect();
        let mut rendered = vec![];
        let counted = log.line_bytes();
        for e in &all {
            log.append(e.clone());
            rendered.push(e.line_parts(&counted).unwrap());
        }
        while log.evict_one().is_some() {}
        assert_eq!((log.len(), log.hot_len()), (5, 3));
        for e in &all {
            let hot = e.seq > 5;
            let peek = e.encoded.peek_line_parts().is_some();
            assert_eq!(peek, hot, "seq {}", e.seq);
            // No store to read it back from: the bytes stay, once.
            assert!(e.encoded.is_resident());
            // A cooled event still renders (the same line), without keeping it.
            let parts = e.line_parts(&counted).unwrap();
            assert!(!parts.0.is_empty());
            assert_eq!(parts, rendered[e.seq as usize - 1], "seq {}", e.seq);
            assert_eq!(e.encoded.peek_line_parts().is_some(), hot);
        }
        // Large events cut the hot tail by bytes too.
        let mut log = EventLog::new(Retention {
            max_events: 100,
            max_bytes: usize::MAX,
            hot_events: 100,
        });
        for s in 1..=4 {
            log.append(ev(s, HOT_BYTES / 3));
        }
        assert_eq!(log.hot_len(), 2);
        while log.evict_one().is_some() {}
        assert_eq!((log.len(), log.hot_len()), (4, 2));
    }
}
