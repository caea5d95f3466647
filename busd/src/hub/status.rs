//! The status document (`dws event status`, [`Hub::status_json`]), filled
//! from the state under the lock into the typed structs of
//! [`proto::status`] that `dws` reads back; and a subscription's delivery
//! state for the operator verbs ([`subscription_doc`]), as typed `serde`
//! structs borrowed from the state. Field order is the documented order
//! (serde_json keeps it); `Option` fields are `null` when unset, never left
//! out, unless marked.

use proto::{
    status::{
        BusDoc, DamageDoc, EventTypeDoc, HaltedDoc, LogDoc, RefusedDoc, SourceDoc, StatusDoc,
        StoreDoc, SubscriptionStatus, SubscriptionTotalsDoc, TruncatedDoc, WorkerStatus,
    },
    v1,
};
use serde::Serialize;

use super::{Hub, Refused};
use crate::{
    clock::now_ms,
    store::{Damage, HaltRecord},
    subscription::{self, Subscription},
};

/// Where a halted subscription stopped, or `None`.
fn halted_doc(s: &Subscription) -> Option<HaltedDoc> {
    match &s.state {
        subscription::State::Halted(HaltRecord {
            seq,
            event_id,
            deliveries,
            since_unix_ms,
        }) => Some(HaltedDoc {
            seq: *seq,
            event_id: event_id.clone(),
            deliveries: *deliveries,
            since_unix_ms: *since_unix_ms,
        }),
        _ => None,
    }
}

/// The refusal counters as shown (every field named: a new counter must be
/// added to the document too).
fn refused_doc(r: Refused) -> RefusedDoc {
    let Refused {
        connections,
        input_budget,
        slow_clients,
        bad_frames,
        too_large_events,
    } = r;
    RefusedDoc {
        connections,
        input_budget,
        slow_clients,
        bad_frames,
        too_large_events,
    }
}

fn damage_doc(d: &Damage) -> DamageDoc {
    let Damage {
        from_seq,
        to_seq,
        file,
        offset,
    } = d;
    DamageDoc {
        from_seq: *from_seq,
        to_seq: *to_seq,
        file: file.clone(),
        offset: *offset,
    }
}

/// A subscription's delivery state, for the operator verbs.
#[derive(Serialize)]
pub(super) struct SubscriptionDoc<'a> {
    id: &'a str,
    state: &'static str,
    halted: Option<HaltedDoc>,
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

/// How much of a parked event's `data` the `parked` verb shows: 1,000
/// parked events stay well inside one frame.
const PARKED_DATA_SHOWN: usize = 1024;

#[derive(Serialize)]
struct ParkedDoc<'a> {
    seq: u64,
    event_id: String,
    event_type: &'a str,
    /// The payload, at most [`PARKED_DATA_SHOWN`] bytes of it.
    data: String,
    /// The payload's whole size.
    data_bytes: usize,
    deliveries: u32,
    parked_at_unix_ms: i64,
    /// The consumer's reason (`term`); null when poison or `skip` parked it.
    reason: Option<&'a str>,
}

/// `Some(v)` for a positive time, `None` (null) for "not set".
fn opt_ms(v: i64) -> Option<i64> {
    (v > 0).then_some(v)
}

/// `Some(s)` unless `s` is empty.
fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The document as JSON. A path that is not UTF-8 (a socket or work dir
/// from the environment) cannot be encoded: the client then gets a document
/// that says so instead of a bus that panics.
fn to_json(doc: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(doc).unwrap_or_else(|e| {
        serde_json::json!({
            "running": true,
            "error": format!("the status document cannot be encoded: {e}"),
        })
    })
}

impl Hub {
    /// The status document, listing at most `max_listed` consumers and
    /// subscriptions (the connection lowers it until the reply fits in a
    /// frame; `truncated` then says how many there are).
    pub(super) fn status_json(&self, max_listed: usize) -> serde_json::Value {
        let cfg = &self.shared.config;
        let st = self.state();
        let now = now_ms();
        let wall = (std::time::Instant::now(), now);
        let head = st.log.head_seq();
        let source = st.source.info();
        let source_status = v1::SourceStatus::try_from(source.state.state).unwrap_or_default();
        let subs = st.registry.subs();
        let in_flight = |id: &str, conn| subs.get(id).map_or(0, |s| s.in_flight_of(conn));
        let consumers: Vec<_> = st
            .registry
            .conns()
            .filter_map(|c| c.consumer_doc(in_flight))
            .take(max_listed)
            .collect();
        let consumers_total = st
            .registry
            .conns()
            .filter(|c| c.attached().is_some())
            .count();
        // The subscription with the oldest unacked event is the one whose
        // cursor the log's retention is protecting (or would evict first).
        let mut holder: Option<(u64, &str)> = None;
        // Over every subscription, however many are listed.
        let mut totals = SubscriptionTotalsDoc::default();
        for s in subs.values() {
            totals.add(
                s.consumer().is_some(),
                s.state.name(),
                s.pending_len() as u64,
                s.parked_len() as u64,
            );
            if let Some((o, _)) = s.oldest_pending() {
                if holder.is_none_or(|(seq, _)| o.seq < seq) {
                    holder = Some((o.seq, &s.id));
                }
            }
        }
        let subscriptions: Vec<_> = subs
            .values()
            .take(max_listed)
            .map(|s| {
                let oldest = s.oldest_pending().map(|(e, _)| e);
                let (delayed, next_due) = s.delayed();
                let cursor = s.cursor(head);
                SubscriptionStatus {
                    id: s.id.clone(),
                    patterns: s.selector.pattern_strings(),
                    filter: non_empty(s.selector.filter_str()),
                    owned: s.owned,
                    upstream_subscription_id: s.upstream_id.clone(),
                    delivery: if s.shared { "shared" } else { "per-host" }.into(),
                    consumers: s.consumers().count() as u64,
                    workers: s
                        .consumers()
                        .map(|c| WorkerStatus {
                            pid: st.registry.conn(c).map_or(0, |c| c.pid()),
                            in_flight: s.in_flight_of(c) as u64,
                        })
                        .collect(),
                    attached_pid: s
                        .consumer()
                        .and_then(|c| st.registry.conn(c))
                        .map(|c| c.pid()),
                    detached_since_unix_ms: s.detached_since_ms(),
                    expires_at_unix_ms: s.detached_since_ms().and_then(|ms| {
                        i64::try_from(s.ttl.as_millis())
                            .ok()
                            .and_then(|ttl| ms.checked_add(ttl))
                    }),
                    ttl_ms: Some(proto::limits::ttl_to_ms(s.ttl))
                        .filter(|&ms| ms != proto::limits::TTL_NEVER_MS),
                    created_at_unix_ms: s.created_at_ms,
                    cursor,
                    head_seq: head,
                    lag: head - cursor,
                    pending: s.pending_len() as u64,
                    in_flight: s.in_flight() as u64,
                    oldest_unacked_age_ms: oldest.map(|e| (now - e.received_at_unix_ms).max(0)),
                    matched: s.counters.matched,
                    delivered: s.counters.delivered,
                    acked: s.counters.acked,
                    redelivered: s.counters.redelivered,
                    lost_to_retention: s.counters.lost,
                    state: s.state.name().to_owned(),
                    halted: halted_doc(s),
                    head_attempts: s.oldest_pending().map_or(0, |(_, n)| n),
                    max_deliver: s.max_deliver,
                    on_poison: subscription::poison_name(s.on_poison).to_owned(),
                    parked: s.parked_len() as u64,
                    parked_total: s.counters.parked,
                    parked_dropped: s.counters.parked_dropped,
                    explicit_ack: s.explicit_ack(),
                    backoff_ms: s.backoff.iter().map(|d| d.as_millis() as u64).collect(),
                    delayed: delayed as u64,
                    next_due_unix_ms: next_due.map(|at| subscription::wall_ms(at, wall)),
                    where_exprs: s.selector.where_strs().to_vec(),
                    ack_wait_ms: s.ack_wait.map(|d| d.as_millis() as u64),
                    where_errors: s.counters.where_errors,
                    where_waiting: s.filtering_len() as u64,
                    where_last_limit: s.where_last_limit(),
                }
            })
            .collect();
        let truncated = (consumers.len() < consumers_total || subscriptions.len() < subs.len())
            .then_some(TruncatedDoc {
                consumers_total: consumers_total as u64,
                subscriptions_total: subs.len() as u64,
            });
        let exe = executable();
        let store = st.persist.info();
        let doc = StatusDoc {
            // As of now: a read a while ago has aged (its lease may have run out).
            // The head is the newest known: the database's at the read, or
            // this host's log since (the read lags it by up to a second).
            cluster: st.cluster.as_ref().map(|c| {
                let age = crate::clock::now_ms().saturating_sub(c.read_at_unix_ms);
                c.aged(u64::try_from(age).unwrap_or(0)).at_least(head)
            }),
            running: true,
            bus: BusDoc {
                pid: std::process::id(),
                profile: cfg.profile.clone(),
                version: proto::BUILD.to_owned(),
                protocol_version: proto::PROTOCOL_VERSION,
                started_at_unix_ms: self.shared.started_at_ms,
                uptime_ms: self.shared.started.elapsed().as_millis() as u64,
                idle_timeout_ms: cfg.idle_timeout.as_millis() as u64,
                socket: cfg.socket.clone(),
                work_dir: cfg.work_dir.clone(),
                connections: st.registry.conn_count() as u64,
                refused: refused_doc(st.refused),
                paused_readers: self.paused_readers(),
                executable: exe.0,
                executable_replaced: exe.1,
                expired: st.registry.expired_doc(),
            },
            source: SourceDoc {
                kind: cfg.source_kind.clone(),
                state: proto::source_status_name(source_status).to_owned(),
                since_unix_ms: opt_ms(source.state.since_unix_ms),
                connected_since_unix_ms: opt_ms(source.connected_since_ms),
                reconnects: source.reconnects,
                malformed: source.malformed,
                unroutable: source
                    .unroutable
                    .iter()
                    .map(|(reason, n)| ((*reason).to_owned(), *n))
                    .collect(),
                attempt: source.state.attempt,
                next_retry_at_unix_ms: opt_ms(source.state.next_retry_at_unix_ms),
                reason: non_empty(&source.state.reason),
                last_error: non_empty(&source.last_error),
            },
            truncated,
            consumers,
            subscriptions,
            subscription_totals: Some(totals),
            event_types: st
                .ingest
                .types()
                .map(|(t, c)| EventTypeDoc {
                    event_type: t.clone(),
                    received: c.received,
                    duplicates: c.duplicates,
                })
                .collect(),
            log: LogDoc {
                oldest_seq: st.log.oldest_seq(),
                head_seq: head,
                events: st.log.len() as u64,
                bytes: st.log.bytes() as u64,
                max_events: st.log.retention().max_events as u64,
                max_bytes: st.log.retention().max_bytes as u64,
                retention_held_by: holder.map(|(_, id)| id.to_owned()),
            },
            store: StoreDoc {
                kind: store.kind.to_owned(),
                durability: store.durability.to_owned(),
                path: store.path.clone(),
                durable_seq: head,
                staged: st.ingest.staged_len() as u64,
                segments: store.segments as u64,
                bytes: store.bytes,
                damaged: store.damaged.iter().map(damage_doc).collect(),
                last_error: st.persist.error().map(|e| e.to_string()),
                append_latency: self.append_latency().doc(),
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
        halted: halted_doc(s),
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
                .map(|p| {
                    let (data, data_bytes) = p.event.data_prefix(PARKED_DATA_SHOWN);
                    ParkedDoc {
                        seq: p.event.seq,
                        event_id: p.event.shown_id(),
                        event_type: &p.event.event_type,
                        data,
                        data_bytes,
                        deliveries: p.deliveries,
                        parked_at_unix_ms: p.parked_at_ms,
                        reason: p.reason.as_deref(),
                    }
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

/// The executable this process runs, and whether it was replaced or removed
/// on disk since (Linux shows the link of a deleted file as `… (deleted)`).
fn executable() -> (Option<std::path::PathBuf>, bool) {
    let Ok(link) = std::fs::read_link("/proc/self/exe") else {
        return (None, false);
    };
    match link.to_string_lossy().strip_suffix(" (deleted)") {
        Some(path) => (Some(path.into()), true),
        None => (Some(link.clone()), false),
    }
}
