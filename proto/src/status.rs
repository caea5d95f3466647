//! The status document (`dws event status`, docs/guide.md "Status",
//! `schemas/status.schema.json`) as typed `serde` structs: the bus fills and
//! serializes them, `dws` deserializes them to render its text report.
//!
//! Field order is the documented order (serde_json keeps it); `Option`
//! fields are `null` when unset, never left out, unless marked. Fields are
//! only ever added: a reader ignores fields it does not know, and every
//! struct is `#[serde(default)]` so a document from an older bus that lacks
//! a field still reads.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

/// The document of a running bus.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusDoc {
    /// Always `true` from a bus.
    pub running: bool,
    pub bus: BusDoc,
    pub source: SourceDoc,
    /// Present when a list was cut to fit in one frame.
    pub truncated: Option<TruncatedDoc>,
    pub consumers: Vec<ConsumerDoc>,
    pub subscriptions: Vec<SubscriptionStatus>,
    /// Counted by the bus over every subscription it holds, listed or not:
    /// a cut list cannot hide a halted one. `None` from a bus older than
    /// this field.
    pub subscription_totals: Option<SubscriptionTotalsDoc>,
    pub event_types: Vec<EventTypeDoc>,
    pub log: LogDoc,
    pub store: StoreDoc,
    /// `store = "postgres"` only: the cluster this host belongs to, as last
    /// read from the database (refreshed every second).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterDoc>,
}

/// The cluster of a host on the PostgreSQL store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterDoc {
    pub name: String,
    /// This host's name in the cluster.
    pub host: String,
    /// `owner` (holds the upstream and appends the log) or `follower`.
    pub role: String,
    /// The host holding the upstream lease, and since when.
    pub owner: Option<String>,
    pub owner_since_unix_ms: Option<i64>,
    /// Bumped by every takeover of the lease.
    pub epoch: i64,
    /// The cluster log's head: the database's at the read, or this host's
    /// own log's when that is newer ([`ClusterDoc::at_least`]).
    pub head_seq: u64,
    pub hosts: Vec<ClusterHostDoc>,
    /// Every named subscription's cursor on every host that saved one.
    pub cursors: Vec<ClusterCursorDoc>,
    /// Why the last read of the cluster failed, if it did.
    pub last_error: Option<String>,
    /// The upstream lease as the database had it at the read, aged to the
    /// answer ([`ClusterDoc::aged`]); `None` before the first read.
    pub lease: Option<ClusterLeaseDoc>,
    /// This host's clock when the cluster was last read (every second,
    /// unless the database is slow or unreachable).
    pub read_at_unix_ms: i64,
    /// How long before the answer that was: every age and expiry in this
    /// document already counts it.
    pub read_age_ms: u64,
}

/// The cluster's upstream lease, on the database's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterLeaseDoc {
    /// The host the lease row names (`None`: no host ever took it, or its
    /// holder gave it up), whether or not the lease has expired.
    pub holder: Option<String>,
    pub epoch: i64,
    /// When it expires unless renewed (database clock, ms since the epoch).
    pub expires_at_unix_ms: Option<i64>,
    /// How long it still runs (negative: since when it has expired).
    pub expires_in_ms: Option<i64>,
    /// No host holds a valid lease: `owner` is then `None`.
    pub expired: bool,
}

impl ClusterDoc {
    /// The document as of `age_ms` after its read: the lease's remaining
    /// time and every host's heartbeat age move on by `age_ms`, and a lease
    /// that ran out meanwhile is expired, with no owner: a stale read never
    /// shows a holder as live past its lease's expiry.
    pub fn aged(&self, age_ms: u64) -> ClusterDoc {
        let mut doc = self.clone();
        doc.read_age_ms = age_ms;
        let age = i64::try_from(age_ms).unwrap_or(i64::MAX);
        for h in &mut doc.hosts {
            h.heartbeat_age_ms = h.heartbeat_age_ms.saturating_add(age_ms);
        }
        if let Some(lease) = &mut doc.lease {
            lease.expires_in_ms = lease.expires_in_ms.map(|ms| ms.saturating_sub(age));
            lease.expired = lease.holder.is_none() || lease.expires_in_ms.is_none_or(|ms| ms <= 0);
            if lease.expired {
                doc.owner = None;
                doc.owner_since_unix_ms = None;
            }
        }
        doc
    }

    /// This document with the log's head at least `head` (the host's own
    /// log, newer than the last read of the database): status never shows
    /// the cluster's head behind the log it lists. Every per-host cursor's
    /// lag counts from that head.
    pub fn at_least(mut self, head: u64) -> ClusterDoc {
        if head > self.head_seq {
            self.head_seq = head;
            for c in &mut self.cursors {
                c.lag = head.saturating_sub(c.cursor);
            }
        }
        self
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterHostDoc {
    pub host: String,
    pub pid: u32,
    pub version: String,
    pub started_at_unix_ms: i64,
    pub heartbeat_age_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterCursorDoc {
    pub subscription: String,
    /// `per-host` (v1 has no shared subscriptions yet).
    pub delivery: String,
    pub host: String,
    pub cursor: u64,
    /// The cluster head minus the cursor.
    pub lag: u64,
    pub saved_at_unix_ms: i64,
}

impl StatusDoc {
    /// The bus's clock when it answered: start time plus uptime.
    pub fn now_unix_ms(&self) -> i64 {
        self.bus.started_at_unix_ms + self.bus.uptime_ms as i64
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BusDoc {
    pub pid: u32,
    pub profile: String,
    pub version: String,
    pub protocol_version: u32,
    pub started_at_unix_ms: i64,
    pub uptime_ms: u64,
    /// 0 = never.
    pub idle_timeout_ms: u64,
    pub socket: PathBuf,
    pub work_dir: PathBuf,
    pub connections: u64,
    pub refused: RefusedDoc,
    /// Connections whose requests are not read now because their client
    /// leaves replies unread (docs/guide.md "Limits": it stalls only itself).
    pub paused_readers: u64,
    /// The executable the bus runs (from `/proc/self/exe`).
    pub executable: Option<PathBuf>,
    /// The bus's executable was replaced or removed on disk since it
    /// started (an install put a new build in place): `dws event restart`
    /// runs the installed one.
    pub executable_replaced: bool,
    /// Subscriptions removed because they stayed detached past their TTL.
    pub expired: ExpiredDoc,
}

/// Subscriptions removed by their TTL since the bus started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExpiredDoc {
    pub total: u64,
    /// The most recent removals (at most 16), oldest first.
    pub recent: Vec<ExpiredSubDoc>,
}

/// One subscription removed by its TTL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExpiredSubDoc {
    pub id: String,
    /// Owned by a `consume` run (it lingered after the run), or named.
    pub owned: bool,
    pub ttl_ms: u64,
    pub expired_at_unix_ms: i64,
    /// Events it still held (unacked, in flight or delayed) when removed.
    pub pending: u64,
}

/// Clients refused because they hit a bound (docs/guide.md "Limits").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RefusedDoc {
    pub connections: u64,
    pub input_budget: u64,
    pub slow_clients: u64,
    pub bad_frames: u64,
    pub too_large_events: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceDoc {
    pub kind: String,
    pub state: String,
    pub since_unix_ms: Option<i64>,
    pub connected_since_unix_ms: Option<i64>,
    pub reconnects: u64,
    pub malformed: u64,
    /// Reason → count of upstream frames acked but not routed.
    pub unroutable: BTreeMap<String, u64>,
    pub attempt: u32,
    pub next_retry_at_unix_ms: Option<i64>,
    pub reason: Option<String>,
    pub last_error: Option<String>,
}

/// The real sizes of lists cut to fit in one frame.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TruncatedDoc {
    pub consumers_total: u64,
    pub subscriptions_total: u64,
}

/// Totals over every subscription of the bus (`subscription_totals`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SubscriptionTotalsDoc {
    /// Subscriptions the bus holds.
    pub count: u64,
    /// With a consumer attached.
    pub attached: u64,
    /// Halted at a poison event.
    pub halted: u64,
    pub disabled: u64,
    /// Events matched and not yet acked, summed.
    pub pending: u64,
    /// Events on the parked lists now, summed.
    pub parked: u64,
}

impl SubscriptionTotalsDoc {
    /// The totals of `subs` (for a list that is complete).
    pub fn of(subs: &[SubscriptionStatus]) -> SubscriptionTotalsDoc {
        let mut t = SubscriptionTotalsDoc::default();
        for s in subs {
            t.add(s.attached_pid.is_some(), &s.state, s.pending, s.parked);
        }
        t
    }

    /// Counts one subscription in: attached or not, its state's name
    /// (`active`, `halted`, `disabled`), its pending and parked events.
    pub fn add(&mut self, attached: bool, state: &str, pending: u64, parked: u64) {
        self.count += 1;
        self.attached += u64::from(attached);
        self.halted += u64::from(state == "halted");
        self.disabled += u64::from(state == "disabled");
        self.pending += pending;
        self.parked += parked;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsumerDoc {
    pub pid: u32,
    pub client: String,
    pub subscription_id: String,
    pub connected_at_unix_ms: i64,
    pub delivered: u64,
    /// Of its deliveries, those marked redelivered.
    pub redelivered: u64,
    pub acked: u64,
    pub in_flight: u64,
}

/// One consumer attached to a subscription: its pid and how many events
/// it holds unacked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerStatus {
    pub pid: u32,
    pub in_flight: u64,
}

/// One subscription in the status document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SubscriptionStatus {
    pub id: String,
    pub patterns: Vec<String>,
    pub filter: Option<String>,
    pub owned: bool,
    pub upstream_subscription_id: Option<String>,
    /// `per-host` (one consumer at a time; on a cluster, each host's
    /// consumers get every event) or `shared` (a work queue: each event to
    /// one of its consumers): the words of `subscribe --delivery`.
    pub delivery: String,
    /// Consumers attached now (more than one only when shared).
    pub consumers: u64,
    /// Each of them, in the order they attached.
    pub workers: Vec<WorkerStatus>,
    /// The first of them (the only one unless shared).
    pub attached_pid: Option<u32>,
    pub detached_since_unix_ms: Option<i64>,
    /// `None` while attached, and for a subscription that never expires.
    pub expires_at_unix_ms: Option<i64>,
    /// `None`: it lives until removed (`--ttl never`, the default of a
    /// subscription created by `subscribe`).
    pub ttl_ms: Option<u64>,
    pub created_at_unix_ms: i64,
    pub cursor: u64,
    pub head_seq: u64,
    pub lag: u64,
    pub pending: u64,
    pub in_flight: u64,
    pub oldest_unacked_age_ms: Option<i64>,
    pub matched: u64,
    pub delivered: u64,
    pub acked: u64,
    pub redelivered: u64,
    pub lost_to_retention: u64,
    pub state: String,
    pub halted: Option<HaltedDoc>,
    pub head_attempts: u32,
    pub max_deliver: u32,
    pub on_poison: String,
    pub parked: u64,
    pub parked_total: u64,
    pub parked_dropped: u64,
    pub explicit_ack: bool,
    /// The redelivery backoff's steps (empty: redeliver at once).
    pub backoff_ms: Vec<u64>,
    /// Pending events waiting out a delay (a nack's or a backoff step's).
    pub delayed: u64,
    /// When the first of them is due again.
    pub next_due_unix_ms: Option<i64>,
    /// The ack wait of explicit-ack consumers that name none (`subscribe
    /// --ack-wait`); `None`: 30 s.
    pub ack_wait_ms: Option<u64>,
    /// The `--where` expressions (ANDed); empty: none.
    #[serde(rename = "where")]
    pub where_exprs: Vec<String>,
    /// Events whose type matched but whose `--where` evaluation failed or
    /// passed one of its limits (not delivered).
    pub where_errors: u64,
    /// Events whose type matched, waiting for their `--where` verdict (the
    /// filter runs apart from the bus; delivery waits at the first).
    pub where_waiting: u64,
    /// The last event `--where` gave no answer for within a limit, and
    /// which limit ("seq 12: ran past its CPU budget (20 ms per event)");
    /// since the bus started.
    pub where_last_limit: Option<String>,
}

/// Where a halted subscription stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HaltedDoc {
    pub seq: u64,
    pub event_id: String,
    pub deliveries: u32,
    pub since_unix_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventTypeDoc {
    pub event_type: String,
    pub received: u64,
    pub duplicates: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogDoc {
    /// `None` while the log is empty.
    pub oldest_seq: Option<u64>,
    pub head_seq: u64,
    pub events: u64,
    pub bytes: u64,
    pub max_events: u64,
    pub max_bytes: u64,
    /// The subscription with the oldest unacked event.
    pub retention_held_by: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreDoc {
    pub kind: String,
    pub durability: String,
    /// `None` for a memory store.
    pub path: Option<PathBuf>,
    pub durable_seq: u64,
    pub staged: u64,
    pub segments: u64,
    pub bytes: u64,
    pub damaged: Vec<DamageDoc>,
    pub last_error: Option<String>,
    /// How long each append to the store took (write and fdatasync, or a
    /// cluster commit), since the bus started.
    pub append_latency: LatencyDoc,
}

/// A latency histogram: `cumulative[i]` appends took at most `le_us[i]`
/// microseconds; `count` in all (the rest took longer than the last bound).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencyDoc {
    pub le_us: Vec<u64>,
    pub cumulative: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

/// A stretch of the log that failed its checksum.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DamageDoc {
    pub from_seq: u64,
    pub to_seq: u64,
    pub file: String,
    pub offset: u64,
}

/// What `dws event status` prints when no bus runs (`running: false`), with
/// `error` (left out when unset) when a bus could not be asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NotRunningDoc {
    /// Always `false`.
    pub running: bool,
    pub profile: String,
    pub socket: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl NotRunningDoc {
    pub fn new(profile: impl Into<String>, socket: impl Into<PathBuf>) -> NotRunningDoc {
        NotRunningDoc {
            running: false,
            profile: profile.into(),
            socket: socket.into(),
            error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_round_trips_in_the_documented_order() {
        let doc = StatusDoc {
            cluster: None,
            running: true,
            subscriptions: vec![SubscriptionStatus {
                id: "s1".into(),
                halted: Some(HaltedDoc {
                    seq: 1,
                    event_id: "e1".into(),
                    deliveries: 2,
                    since_unix_ms: 5,
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&doc).unwrap();
        assert!(
            json.starts_with(r#"{"running":true,"bus":{"pid":0,"#),
            "{json}"
        );
        assert!(
            json.contains(r#""truncated":null,"consumers":[]"#),
            "{json}"
        );
        assert!(json.contains(r#""subscription_totals":null"#), "{json}");
        assert_eq!(serde_json::from_str::<StatusDoc>(&json).unwrap(), doc);
    }

    #[test]
    fn unknown_fields_are_ignored_and_missing_ones_default() {
        let doc: StatusDoc = serde_json::from_str(
            r#"{"running":true,"new_top":1,"bus":{"pid":7,"new":"x"},
                "subscriptions":[{"id":"a","later":[1]}]}"#,
        )
        .unwrap();
        assert!(doc.running);
        assert_eq!(doc.bus.pid, 7);
        assert_eq!(doc.subscriptions[0].id, "a");
        assert_eq!(doc.subscriptions[0].halted, None);
        assert_eq!(doc.log.oldest_seq, None);
        assert_eq!(doc.subscription_totals, None, "an older bus");
    }

    #[test]
    fn totals_count_each_state_and_sum_the_events() {
        let sub = |state: &str, attached: bool, pending, parked| SubscriptionStatus {
            state: state.into(),
            attached_pid: attached.then_some(7),
            pending,
            parked,
            ..Default::default()
        };
        let t = SubscriptionTotalsDoc::of(&[
            sub("active", true, 3, 0),
            sub("halted", false, 2, 1),
            sub("disabled", false, 0, 4),
        ]);
        assert_eq!(
            t,
            SubscriptionTotalsDoc {
                count: 3,
                attached: 1,
                halted: 1,
                disabled: 1,
                pending: 5,
                parked: 5,
            }
        );
    }

    #[test]
    fn not_running_leaves_out_an_unset_error() {
        let mut doc = NotRunningDoc::new("p", "/s");
        assert_eq!(
            serde_json::to_string(&doc).unwrap(),
            r#"{"running":false,"profile":"p","socket":"/s"}"#
        );
        doc.error = Some("e".into());
        assert_eq!(
            serde_json::to_string(&doc).unwrap(),
            r#"{"running":false,"profile":"p","socket":"/s","error":"e"}"#
        );
    }

    #[test]
    fn a_cluster_read_aged_past_its_lease_names_no_owner() {
        let read = ClusterDoc {
            owner: Some("a".into()),
            owner_since_unix_ms: Some(5),
            hosts: vec![ClusterHostDoc {
                host: "a".into(),
                heartbeat_age_ms: 400,
                ..ClusterHostDoc::default()
            }],
            lease: Some(ClusterLeaseDoc {
                holder: Some("a".into()),
                epoch: 3,
                expires_at_unix_ms: Some(10_000),
                expires_in_ms: Some(2_000),
                expired: false,
            }),
            ..ClusterDoc::default()
        };
        let fresh = read.aged(500);
        assert_eq!(fresh.owner.as_deref(), Some("a"));
        assert_eq!(fresh.read_age_ms, 500);
        assert_eq!(fresh.hosts[0].heartbeat_age_ms, 900);
        let lease = fresh.lease.as_ref().unwrap();
        assert_eq!((lease.expires_in_ms, lease.expired), (Some(1_500), false));
        let stale = read.aged(2_000);
        assert_eq!((stale.owner, stale.owner_since_unix_ms), (None, None));
        let lease = stale.lease.unwrap();
        assert_eq!(lease.holder.as_deref(), Some("a"), "the row still names it");
        assert_eq!((lease.expires_in_ms, lease.expired), (Some(0), true));
        assert_eq!(stale.hosts[0].heartbeat_age_ms, 2_400);
    }
}
