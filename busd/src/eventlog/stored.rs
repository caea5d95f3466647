//! One event as a store keeps it — its fields, its encoded bytes and where
//! its record lies in a segment — and how it becomes the log's
//! [`LoggedEvent`]. The disk store's record format (`store::record`), the
//! PostgreSQL log (`pg::log`) and recovery all speak it.

use super::{Body, ColdSegment, Interner, LoggedEvent};

/// One event as it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub seq: u64,
    pub received_at_unix_ms: i64,
    /// Dedup scope; empty when the event is not deduplicated.
    pub scope: String,
    pub event_id: String,
    pub event_type: String,
    /// The upstream subscription the event was routed to (may be empty).
    pub route: String,
    /// `v1::Event`, encoded once.
    pub encoded: Vec<u8>,
    /// Where the record lies in its segment (0s when not read from one).
    pub place: RecordPlace,
}

/// Where an event record lies in a segment: its offset (at its header).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecordPlace {
    pub at: u64,
}

impl EventRecord {
    /// The event as the log holds it in memory.
    pub fn into_logged(self) -> LoggedEvent {
        self.into_logged_with(&mut Interner::default())
    }

    /// [`EventRecord::into_logged`], its names shared through `names`.
    pub fn into_logged_with(mut self, names: &mut Interner) -> LoggedEvent {
        let encoded = bytes::Bytes::from(std::mem::take(&mut self.encoded)).into();
        self.named(encoded, names)
    }

    /// The event as the log holds it, its bytes left on disk in `segment`
    /// (read back through its reader), its names shared through `names`.
    pub fn into_cold(
        self,
        segment: std::sync::Arc<ColdSegment>,
        names: &mut Interner,
    ) -> LoggedEvent {
        let body = Body::cold(
            self.encoded.len(),
            super::Place {
                segment,
                at: self.place.at,
            },
        );
        self.named(body, names)
    }

    fn named(self, encoded: Body, names: &mut Interner) -> LoggedEvent {
        LoggedEvent {
            seq: self.seq,
            event_type: names.name(&self.event_type),
            received_at_unix_ms: self.received_at_unix_ms,
            encoded,
            scope: names.name(&self.scope),
            event_id: self.event_id.into(),
            route: names.name(&self.route),
            ..LoggedEvent::default()
        }
    }
}
