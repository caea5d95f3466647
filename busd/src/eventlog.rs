//! The bus's event log: every accepted event, in `seq` order, bounded by
//! count and bytes. Delivery reads from here; retention evicts from the front.
//!
//! This is the in-memory view of the retained log: what consumers read.
//! The durable copy is the store's (`crate::store`); only events the store
//! has made durable are appended here.
//!
//! The byte bound counts what the log makes the bus hold: each event's
//! encoded form and, once a consumer that takes NDJSON lines needed them,
//! its rendered line parts ([`LineParts`], counted process-wide while they
//! live, also for events held in flight past retention). So the log's
//! memory stays within about one `retention_bytes`, not two.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, OnceLock,
    },
};

use bytes::Bytes;

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
#[derive(Debug, Default)]
pub struct LoggedEvent {
    pub seq: u64,
    pub event_type: String,
    pub received_at_unix_ms: i64,
    /// `v1::Event` encoded once, without the per-delivery fields.
    pub encoded: Bytes,
    /// Dedup scope; empty when the event is not deduplicated.
    pub scope: String,
    pub event_id: String,
    /// The upstream subscription the event was routed to; empty: by type only.
    pub route: String,
    /// A seq whose record failed its checksum in the store: a placeholder
    /// that is never delivered (see `store::disk`).
    pub damaged: bool,
    /// The event's NDJSON line without its per-delivery fields
    /// (`proto::ndjson::parts`), rendered once, on first need, for every
    /// consumer that takes lines.
    pub line_parts: OnceLock<LineParts>,
    /// The event as `--where` expressions see it, built on first need and
    /// shared by every subscription that has expressions.
    pub where_input: OnceLock<proto::where_expr::Input>,
}

/// Bytes of every [`LineParts`] alive in this process.
static LINE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// An event's rendered NDJSON line parts; their bytes count against the
/// log's byte bound while they live ([`line_bytes`]).
#[derive(Debug)]
pub struct LineParts((Bytes, Bytes));

impl LineParts {
    pub fn new(head: Bytes, tail: Bytes) -> LineParts {
        LINE_BYTES.fetch_add(head.len() + tail.len(), Ordering::Relaxed);
        LineParts((head, tail))
    }

    pub fn parts(&self) -> &(Bytes, Bytes) {
        &self.0
    }
}

impl Drop for LineParts {
    fn drop(&mut self) {
        LINE_BYTES.fetch_sub(self.0 .0.len() + self.0 .1.len(), Ordering::Relaxed);
    }
}

/// Bytes of the NDJSON line parts rendered and still held.
pub fn line_bytes() -> usize {
    LINE_BYTES.load(Ordering::Relaxed)
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
        Shown::decode(self.encoded.clone()).unwrap_or_default()
    }

    /// The id a consumer saw on this event's line: the dedup id it was
    /// published or received with, or the one the bus gave it.
    pub fn shown_id(&self) -> String {
        if self.event_id.is_empty() {
            self.shown().event_id
        } else {
            self.event_id.clone()
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

    /// [`LoggedEvent::line_parts`], rendered now if it was not yet.
    pub fn line_parts(&self) -> &(Bytes, Bytes) {
        self.line_parts
            .get_or_init(|| {
                use prost::Message;
                let e = proto::v1::Event::decode(self.encoded.clone()).unwrap_or_default();
                let (head, tail) = proto::ndjson::parts(&e);
                LineParts::new(Bytes::from(head), Bytes::from(tail))
            })
            .parts()
    }

    /// [`LoggedEvent::where_input`], built now if it was not yet.
    pub fn where_input(&self) -> &proto::where_expr::Input {
        self.where_input.get_or_init(|| {
            use prost::Message;
            let e = proto::v1::Event::decode(self.encoded.clone()).unwrap_or_default();
            proto::where_expr::Input::of(&e)
        })
    }

    /// Whether a subscription bound to `upstream_id` receives this event:
    /// an event routed to an upstream subscription goes only to the local
    /// subscriptions bound to it.
    pub fn routed_to(&self, upstream_id: Option<&str>) -> bool {
        self.route.is_empty() || upstream_id == Some(self.route.as_str())
    }
}

/// Retention bounds of the log.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_events: usize,
    pub max_bytes: usize,
}

#[derive(Debug)]
pub struct EventLog {
    events: VecDeque<Arc<LoggedEvent>>,
    bytes: usize,
    head_seq: u64,
    retention: Retention,
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
        }
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
        self.bytes.saturating_add(line_bytes())
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
        self.events.push_back(event);
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
            encoded: Bytes::from(vec![0; size]),
            ..LoggedEvent::default()
        })
    }

    #[test]
    fn rendered_lines_count_against_the_byte_bound_while_they_live() {
        let mut log = EventLog::new(Retention {
            max_events: 100,
            max_bytes: 2_000_000,
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
                Bytes::from(ev.encode_to_vec())
            },
            ..LoggedEvent::default()
        });
        log.append(e.clone());
        log.append(ev(2, 600_000));
        log.append(ev(3, 600_000));
        assert!(log.evict_one().is_none(), "1.8 MB of events fit");
        let before = line_bytes();
        let (head, tail) = e.line_parts();
        assert!(head.len() + tail.len() >= 600_000);
        assert!(line_bytes() >= before + 600_000);
        // Over the bound now: the oldest goes, and with it its line.
        let gone = log
            .evict_one()
            .expect("over the bound with the rendered line");
        assert_eq!(gone.seq, 1);
        drop((gone, e));
        assert!(line_bytes() < before + 600_000);
    }

    #[test]
    fn bounded_by_count_and_bytes() {
        let mut log = EventLog::new(Retention {
            max_events: 3,
            max_bytes: 10_000,
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
        });
        for s in 1..=3 {
            log.append(ev(s, 100));
        }
        while log.evict_one().is_some() {}
        assert_eq!(log.len(), 1);
    }
}
