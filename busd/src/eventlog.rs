//! The bus's event log: every accepted event, in `seq` order, bounded by
//! count and bytes. Delivery reads from here; retention evicts from the front.
//!
//! This is the in-memory view of the retained log: what consumers read.
//! The durable copy is the store's (`crate::store`); only events the store
//! has made durable are appended here.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, OnceLock},
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
    pub line_parts: OnceLock<(Bytes, Bytes)>,
    /// The event as `--where` expressions see it, built on first need and
    /// shared by every subscription that has expressions.
    pub where_input: OnceLock<proto::where_expr::Input>,
}

impl LoggedEvent {
    /// Bytes this event counts against the retention bound.
    pub fn size(&self) -> usize {
        self.encoded.len() + self.event_type.len() + self.event_id.len() + self.scope.len() + 64
    }

    /// [`LoggedEvent::line_parts`], rendered now if it was not yet.
    pub fn line_parts(&self) -> &(Bytes, Bytes) {
        self.line_parts.get_or_init(|| {
            use prost::Message;
            let e = proto::v1::Event::decode(self.encoded.clone()).unwrap_or_default();
            let (head, tail) = proto::ndjson::parts(&e);
            (Bytes::from(head), Bytes::from(tail))
        })
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

    pub fn bytes(&self) -> usize {
        self.bytes
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
        let over =
            self.events.len() > self.retention.max_events || self.bytes > self.retention.max_bytes;
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
