//! The status document (`dws event status`, [`Hub::status_json`]) and a
//! subscription's delivery state for the operator verbs
//! ([`subscription_doc`]), as typed `serde` structs borrowed from the state
//! under the lock. Field order is the documented order (serde_json keeps it);
//! `Option` fields are `null` when unset, never left out, unless marked.

use std::{collections::BTreeMap, path::Path};

use proto::v1;
use serde::Serialize;

use super::{Hub, Refused};
use crate::{
    clock::now_ms,
    store::{Damage, HaltRecord},
    subscription::{self, Subscription},
};

#[derive(Serialize)]
struct StatusDoc<'a> {
    running: bool,
    bus: BusDoc<'a>,
    source: SourceDoc<'a>,
    truncated: Option<TruncatedDoc>,
    consumers: Vec<ConsumerDoc<'a>>,
    subscriptions: Vec<SubscriptionStatus<'a>>,
    event_types: Vec<EventTypeDoc<'a>>,
    log: LogDoc<'a>,
    store: StoreDoc<'a>,
}

#[derive(Serialize)]
struct BusDoc<'a> {
    pid: u32,
    profile: &'a str,
    version: &'static str,
    protocol_version: u32,
    started_at_unix_ms: i64,
    uptime_ms: u64,
    idle_timeout_ms: u64,
    socket: &'a Path,
    work_dir: &'a Path,
    connections: usize,
    refused: Refused,
}

#[derive(Serialize)]
struct SourceDoc<'a> {
    kind: &'a str,
    state: &'static str,
    since_unix_ms: Option<i64>,
    connected_since_unix_ms: Option<i64>,
    reconnects: u64,
    malformed: u64,
    unroutable: &'a BTreeMap<&'static str, u64>,
    attempt: u32,
    next_retry_at_unix_ms: Option<i64>,
    reason: Option<&'a str>,
    last_error: Option<&'a str>,
}

/// Present when a list was cut to fit in one frame: the real sizes.
#[derive(Serialize)]
struct TruncatedDoc {
    consumers_total: usize,
    subscriptions_total: usize,
}

#[derive(Serialize)]
struct ConsumerDoc<'a> {
    pid: u32,
    client: &'a str,
    subscription_id: &'a str,
    connected_at_unix_ms: i64,
    delivered: u64,
    acked: u64,
    in_flight: usize,
}

/// One subscription in the status document.
#[derive(Serialize)]
struct SubscriptionStatus<'a> {
    id: &'a str,
    patterns: Vec<String>,
    filter: Option<&'a str>,
    owned: bool,
    upstream_subscription_id: Option<&'a str>,
    attached_pid: Option<u32>,
    detached_since_unix_ms: Option<i64>,
    expires_at_unix_ms: Option<i64>,
    ttl_ms: u64,
    created_at_unix_ms: i64,
    cursor: u64,
    head_seq: u64,
    lag: u64,
    pending: usize,
    in_flight: usize,
    oldest_unacked_age_ms: Option<i64>,
    matched: u64,
    delivered: u64,
    acked: u64,
    redelivered: u64,
    lost_to_retention: u64,
    state: &'static str,
    halted: Option<HaltedDoc<'a>>,
    head_attempts: u32,
    max_deliver: u32,
    on_poison: &'static str,
    parked: usize,
    parked_total: u64,
    parked_dropped: u64,
    explicit_ack: bool,
}

/// Where a halted subscription stopped.
#[derive(Serialize)]
struct HaltedDoc<'a> {
    seq: u64,
    event_id: &'a str,
    deliveries: u32,
    since_unix_ms: i64,
}

impl<'a> HaltedDoc<'a> {
    fn of(s: &'a Subscription) -> Option<HaltedDoc<'a>> {
        match &s.state {
            subscription::State::Halted(HaltRecord {
                seq,
                event_id,
                deliveries,
                since_unix_ms,
            }) => Some(HaltedDoc {
                seq: *seq,
                event_id,
                deliveries: *deliveries,
                since_unix_ms: *since_unix_ms,
            }),
            _ => None,
        }
    }
}

#[derive(Serialize)]
struct EventTypeDoc<'a> {
    event_type: &'a str,
    received: u64,
    duplicates: u64,
}

#[derive(Serialize)]
struct LogDoc<'a> {
    oldest_seq: Option<u64>,
    head_seq: u64,
    events: usize,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
    /// The subscription with the oldest unacked event.
    retention_held_by: Option<&'a str>,
}

#[derive(Serialize)]
struct StoreDoc<'a> {
    kind: &'static str,
    durability: &'static str,
    path: Option<&'a Path>,
    durable_seq: u64,
    staged: usize,
    segments: usize,
    bytes: u64,
    damaged: &'a [Damage],
    last_error: Option<&'a str>,
}

/// A subscription's delivery state, for the operator verbs.
#[derive(Serialize)]
pub(super) struct SubscriptionDoc<'a> {
    id: &'a str,
    state: &'static str,
    halted: Option<HaltedDoc<'a>>,
    cursor: u64,
    head_seq: u64,
    pending: usize,
    in_flight: usize,
    head_attempts: u32,
    max_deliver: u32,
    on_poison: &'static str,
    parked: usize,
    /// Only for the `parked` verb.
    #[serde(skip_serializing_if = "Option::is_none")]
    parked_events: Option<Vec<ParkedDoc<'a>>>,
}

#[derive(Serialize)]
struct ParkedDoc<'a> {
    seq: u64,
    event_id: &'a str,
    event_type: &'a str,
    deliveries: u32,
    parked_at_unix_ms: i64,
}

/// `Some(v)` for a positive time, `None` (null) for "not set".
fn opt_ms(v: i64) -> Option<i64> {
    (v > 0).then_some(v)
}

/// `Some(s)` unless `s` is empty.
fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// The document as JSON. Like the `json!` it replaced, a path that is not
/// UTF-8 cannot be shown and is a bug in the bus, not a client's fault.
fn to_json(doc: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(doc).expect("status documents serialize to JSON")
}

impl Hub {
    /// The status document, listing at most `max_listed` consumers and
    /// subscriptions (the connection lowers it until the reply fits in a
    /// frame; `truncated` then says how many there are).
    pub fn status_json(&self, max_listed: usize) -> serde_json::Value {
        let cfg = &self.shared.config;
        let st = self.state();
        let now = now_ms();
        let head = st.log.head_seq();
        let source_status = v1::SourceStatus::try_from(st.source.state.state).unwrap_or_default();
        let consumers: Vec<_> = st
            .conns
            .values()
            .filter_map(|c| {
                let sub = c.attached.as_ref()?;
                Some(ConsumerDoc {
                    pid: c.pid,
                    client: &c.name,
                    subscription_id: sub,
                    connected_at_unix_ms: c.connected_at_ms,
                    delivered: c.delivered,
                    acked: c.acked,
                    in_flight: st.subs.get(sub).map_or(0, Subscription::in_flight),
                })
            })
            .take(max_listed)
            .collect();
        let consumers_total = st.conns.values().filter(|c| c.attached.is_some()).count();
        // The subscription with the oldest unacked event is the one whose
        // cursor the log's retention is protecting (or would evict first).
        let mut holder: Option<(u64, &str)> = None;
        for s in st.subs.values() {
            if let Some((o, _)) = s.oldest_pending() {
                if holder.is_none_or(|(seq, _)| o.seq < seq) {
                    holder = Some((o.seq, &s.id));
                }
            }
        }
        let subscriptions: Vec<_> = st
            .subs
            .values()
            .take(max_listed)
            .map(|s| {
                let oldest = s.oldest_pending().map(|(e, _)| e);
                let cursor = s.cursor(head);
                SubscriptionStatus {
                    id: &s.id,
                    patterns: s.selector.pattern_strings(),
                    filter: non_empty(s.selector.filter_str()),
                    owned: s.owned,
                    upstream_subscription_id: s.upstream_id.as_deref(),
                    attached_pid: s.consumer().and_then(|c| st.conns.get(&c)).map(|c| c.pid),
                    detached_since_unix_ms: s.detached_since_ms(),
                    expires_at_unix_ms: s
                        .detached_since_ms()
                        .map(|ms| ms + s.ttl.as_millis() as i64),
                    ttl_ms: s.ttl.as_millis() as u64,
                    created_at_unix_ms: s.created_at_ms,
                    cursor,
                    head_seq: head,
                    lag: head - cursor,
                    pending: s.pending_len(),
                    in_flight: s.in_flight(),
                    oldest_unacked_age_ms: oldest.map(|e| (now - e.received_at_unix_ms).max(0)),
                    matched: s.counters.matched,
                    delivered: s.counters.delivered,
                    acked: s.counters.acked,
                    redelivered: s.counters.redelivered,
                    lost_to_retention: s.counters.lost,
                    state: s.state.name(),
                    halted: HaltedDoc::of(s),
                    head_attempts: s.oldest_pending().map_or(0, |(_, n)| n),
                    max_deliver: s.max_deliver,
                    on_poison: subscription::poison_name(s.on_poison),
                    parked: s.parked_len(),
                    parked_total: s.counters.parked,
                    parked_dropped: s.counters.parked_dropped,
                    explicit_ack: s.explicit_ack(),
                }
            })
            .collect();
        let truncated = (consumers.len() < consumers_total || subscriptions.len() < st.subs.len())
            .then(|| TruncatedDoc {
                consumers_total,
                subscriptions_total: st.subs.len(),
            });
        let doc = StatusDoc {
            running: true,
            bus: BusDoc {
                pid: std::process::id(),
                profile: &cfg.profile,
                version: proto::BUILD,
                protocol_version: proto::PROTOCOL_VERSION,
                started_at_unix_ms: self.shared.started_at_ms,
                uptime_ms: self.shared.started.elapsed().as_millis() as u64,
                idle_timeout_ms: cfg.idle_timeout.as_millis() as u64,
                socket: &cfg.socket,
                work_dir: &cfg.work_dir,
                connections: st.conns.len(),
                refused: st.refused,
            },
            source: SourceDoc {
                kind: &cfg.source_kind,
                state: proto::source_status_name(source_status),
                since_unix_ms: opt_ms(st.source.state.since_unix_ms),
                connected_since_unix_ms: opt_ms(st.source.connected_since_ms),
                reconnects: st.source.reconnects,
                malformed: st.source.malformed,
                unroutable: &st.source.unroutable,
                attempt: st.source.state.attempt,
                next_retry_at_unix_ms: opt_ms(st.source.state.next_retry_at_unix_ms),
                reason: non_empty(&st.source.state.reason),
                last_error: non_empty(&st.source.last_error),
            },
            truncated,
            consumers,
            subscriptions,
            event_types: st
                .types
                .iter()
                .map(|(t, c)| EventTypeDoc {
                    event_type: t,
                    received: c.received,
                    duplicates: c.duplicates,
                })
                .collect(),
            log: LogDoc {
                oldest_seq: st.log.oldest_seq(),
                head_seq: head,
                events: st.log.len(),
                bytes: st.log.bytes(),
                max_events: st.log.retention().max_events,
                max_bytes: st.log.retention().max_bytes,
                retention_held_by: holder.map(|(_, id)| id),
            },
            store: StoreDoc {
                kind: st.store.kind,
                durability: st.store.durability,
                path: st.store.path.as_deref(),
                durable_seq: head,
                staged: st.staged.len(),
                segments: st.store.segments,
                bytes: st.store.bytes,
                damaged: &st.store.damaged,
                last_error: st.store_error.as_deref(),
            },
        };
        to_json(&doc)
    }
}

/// A subscription's delivery state, for the operator verbs; with the parked
/// list for `parked`.
pub(super) fn subscription_doc(
    s: &Subscription,
    head: u64,
    with_parked: bool,
) -> SubscriptionDoc<'_> {
    SubscriptionDoc {
        id: &s.id,
        state: s.state.name(),
        halted: HaltedDoc::of(s),
        cursor: s.cursor(head),
        head_seq: head,
        pending: s.pending_len(),
        in_flight: s.in_flight(),
        head_attempts: s.oldest_pending().map_or(0, |(_, n)| n),
        max_deliver: s.max_deliver,
        on_poison: subscription::poison_name(s.on_poison),
        parked: s.parked_len(),
        parked_events: with_parked.then(|| {
            s.parked()
                .map(|p| ParkedDoc {
                    seq: p.event.seq,
                    event_id: &p.event.event_id,
                    event_type: &p.event.event_type,
                    deliveries: p.deliveries,
                    parked_at_unix_ms: p.parked_at_ms,
                })
                .collect()
        }),
    }
}

/// What an operator verb answers: the subscription after it, what was
/// asked, whether it changed anything, and what the verb adds.
#[derive(Serialize)]
pub(super) struct VerbDoc<'a> {
    #[serde(flatten)]
    pub subscription: SubscriptionDoc<'a>,
    pub verb: &'a str,
    pub dry_run: bool,
    pub changed: bool,
    /// `skip`: the event it parked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_seq: Option<u64>,
    /// `seek`: where it went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seek: Option<SeekDoc<'a>>,
    /// `replay-parked`: how many events went back to pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<usize>,
}

#[derive(Serialize)]
pub(super) struct SeekDoc<'a> {
    pub requested: &'a str,
    pub from_seq: u64,
    pub gone: u64,
}

impl VerbDoc<'_> {
    pub(super) fn to_json(&self) -> serde_json::Value {
        to_json(self)
    }
}
