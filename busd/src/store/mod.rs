//! The storage boundary: everything the bus must not lose — the event log,
//! the dedup keys that travel with it, and the named subscriptions with their
//! cursors — goes through the [`Store`] trait. The hub never touches a file.
//!
//! One thread, the committer (`crate::commit`), owns the store and is the
//! only caller of its methods; the trait is therefore `&mut self` and
//! synchronous. Implementations:
//! - [`disk::DiskStore`] (the default): a segmented, checksummed append-only
//!   log plus an atomically replaced subscriptions file, under
//!   `events/<profile>/store/`.
//! - [`memory::MemoryStore`]: keeps nothing; the bus's state dies with it
//!   (tests, and users who ask for it with `store = "memory"`).
//! - [`postgres::store::PgStore`] (`store = "postgres"`): a cluster of hosts
//!   sharing one log in PostgreSQL; only the host holding the cluster's
//!   upstream lease appends (see [`postgres`]).
//!
//! The durability contract the committer builds on these methods (see
//! docs/guide.md, "Durability"): `append` returns only once the batch is on disk (fsynced when
//! `durability = "fsync"`; for postgres: once the transaction committed);
//! only then are the events fanned out to consumers and acknowledged
//! upstream or to the publisher.

pub mod dedup_ids;
pub mod disk;
pub mod fileops;
pub mod memory;
pub mod postgres;
pub mod record;

use std::{
    path::PathBuf,
    sync::{atomic::AtomicI64, Arc},
};

use serde::{Deserialize, Serialize};

use crate::eventlog::LoggedEvent;

/// Which store a profile uses (`store = "disk" | "memory" | "postgres"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Disk,
    Memory,
    Postgres,
}

/// Whether an append waits for the disk (`durability = "fsync" | "none"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` each batch before it is acknowledged.
    Fsync,
    /// Write, but let the kernel flush when it likes: survives a crash of the
    /// bus, not a power cut.
    None,
}

impl StoreKind {
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Disk => "disk",
            StoreKind::Memory => "memory",
            StoreKind::Postgres => "postgres",
        }
    }
    pub fn parse(s: &str) -> Option<StoreKind> {
        match s {
            "disk" => Some(StoreKind::Disk),
            "memory" => Some(StoreKind::Memory),
            "postgres" => Some(StoreKind::Postgres),
            _ => None,
        }
    }
}

impl Durability {
    pub fn name(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::None => "none",
        }
    }
    pub fn parse(s: &str) -> Option<Durability> {
        match s {
            "fsync" => Some(Durability::Fsync),
            "none" => Some(Durability::None),
            _ => None,
        }
    }
}

/// A profile's storage settings.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub kind: StoreKind,
    /// For `disk` (and shown for `memory`); PostgreSQL decides for
    /// `postgres` (a profile may not set it there).
    pub durability: Durability,
    /// `Some` exactly when `kind` is [`StoreKind::Postgres`].
    pub postgres: Option<crate::pg::PgSettings>,
}

/// Delivery counters of a subscription, kept across restarts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubCounters {
    pub matched: u64,
    pub delivered: u64,
    pub acked: u64,
    pub redelivered: u64,
    pub lost: u64,
    /// Moved to the parked list (poison, or `skip`).
    #[serde(default)]
    pub parked: u64,
    /// Parked events dropped because the parked list was full.
    #[serde(default)]
    pub parked_dropped: u64,
    /// Events whose type matched but whose `--where` evaluation failed or
    /// passed its step bound (not delivered).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub where_errors: u64,
}

/// A named subscription as it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubRecord {
    pub id: String,
    pub patterns: Vec<String>,
    #[serde(default)]
    pub filter: String,
    pub ttl_ms: u64,
    pub created_at_unix_ms: i64,
    #[serde(default)]
    pub upstream_id: Option<String>,
    /// Every matching event at or below it was acked (or reported lost).
    pub cursor: u64,
    /// Unacked events below the snapshot's `log_floor`, kept only because
    /// they were in flight (at most one window).
    #[serde(default)]
    pub pinned: Vec<u64>,
    pub max_sent_seq: u64,
    /// Evicted before delivery and not yet reported in a gap line.
    pub gap_lost: u64,
    /// `None` while a consumer was attached.
    pub detached_since_unix_ms: Option<i64>,
    pub counters: SubCounters,
    /// Poison handling: 0 = unlimited deliveries.
    #[serde(default)]
    pub max_deliver: u32,
    /// `halt` or `park`.
    #[serde(default = "default_on_poison")]
    pub on_poison: String,
    /// `active`, `halted` or `disabled`.
    #[serde(default = "default_state")]
    pub state: String,
    #[serde(default)]
    pub halt: Option<HaltRecord>,
    /// Delivery counts of pending events that were delivered at least once.
    #[serde(default)]
    pub deliveries: Vec<(u64, u32)>,
    /// The dead-letter list: events moved aside as poison (kept in the log).
    #[serde(default)]
    pub parked: Vec<ParkedRecord>,
    /// Events above the cursor that were acked out of order.
    #[serde(default)]
    pub acked: Vec<u64>,
    /// Shared delivery across a cluster's hosts (`store = "postgres"`): its
    /// events come to this host only as it claims them.
    #[serde(default)]
    pub shared: bool,
    /// The redelivery backoff's steps (empty: redeliver at once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backoff_ms: Vec<u64>,
    /// Pending events waiting out a delay (a nack's or a backoff step's):
    /// seq and due time in unix ms, so the delay survives a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delayed: Vec<(u64, i64)>,
    /// Shared delivery: the seq the subscription starts after on every host
    /// (the head at its creation for `--from latest`); 0 and not written
    /// for a per-host subscription.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_from: u64,
    /// `--where` expressions (ANDed), part of the spec like `patterns`.
    #[serde(rename = "where", default, skip_serializing_if = "Vec::is_empty")]
    pub where_exprs: Vec<String>,
    /// The ack wait of an explicit-ack consumer that names none
    /// (`subscribe --ack-wait`); `None`: 30 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_wait_ms: Option<u64>,
}

impl SubRecord {
    /// A subscription created on another host of a cluster, as this host's
    /// instance of it: its spec and cursor, none of that host's delivery
    /// state, detached since `now_ms` (its TTL runs from there unless a
    /// consumer attaches).
    pub fn instance_for_host(&self, now_ms: i64) -> SubRecord {
        SubRecord {
            id: self.id.clone(),
            patterns: self.patterns.clone(),
            filter: self.filter.clone(),
            ttl_ms: self.ttl_ms,
            created_at_unix_ms: self.created_at_unix_ms,
            upstream_id: self.upstream_id.clone(),
            cursor: self.cursor,
            pinned: vec![],
            max_sent_seq: self.cursor,
            gap_lost: 0,
            detached_since_unix_ms: Some(now_ms),
            counters: SubCounters::default(),
            max_deliver: self.max_deliver,
            on_poison: self.on_poison.clone(),
            state: "active".into(),
            halt: None,
            deliveries: vec![],
            parked: vec![],
            acked: vec![],
            shared: self.shared,
            backoff_ms: self.backoff_ms.clone(),
            delayed: vec![],
            shared_from: self.shared_from,
            where_exprs: self.where_exprs.clone(),
            ack_wait_ms: self.ack_wait_ms,
        }
    }
}

#[cfg(test)]
impl SubRecord {
    /// A test's record: `id` on `pattern`, everything acked up to `cursor`,
    /// active, nothing parked or pending; tests change what they look at
    /// with `SubRecord { field, ..SubRecord::for_test(…) }`.
    pub fn for_test(id: &str, pattern: &str, cursor: u64) -> SubRecord {
        SubRecord {
            id: id.into(),
            patterns: vec![pattern.into()],
            filter: String::new(),
            ttl_ms: 600_000,
            created_at_unix_ms: 0,
            upstream_id: None,
            cursor,
            pinned: vec![],
            max_sent_seq: cursor,
            gap_lost: 0,
            detached_since_unix_ms: None,
            counters: SubCounters::default(),
            max_deliver: 0,
            on_poison: default_on_poison(),
            state: default_state(),
            halt: None,
            deliveries: vec![],
            parked: vec![],
            acked: vec![],
            shared: false,
            backoff_ms: vec![],
            delayed: vec![],
            shared_from: 0,
            where_exprs: vec![],
            ack_wait_ms: None,
        }
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn default_on_poison() -> String {
    "halt".into()
}

fn default_state() -> String {
    "active".into()
}

/// Where and why a subscription halted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltRecord {
    pub seq: u64,
    pub event_id: String,
    pub deliveries: u32,
    pub since_unix_ms: i64,
}

/// One parked event of a subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedRecord {
    pub seq: u64,
    pub deliveries: u32,
    pub parked_at_unix_ms: i64,
    /// The consumer's reason when it parked the event itself (`term`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The subscriptions file: the named subscriptions at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub format: u32,
    /// Written by a clean exit: the cursors and sent marks are exact.
    pub clean: bool,
    pub head_seq: u64,
    /// Every event below it had already left the log's retention (its
    /// losses are counted in the records); only `pinned` seqs below it are
    /// still wanted.
    pub log_floor: u64,
    pub saved_at_unix_ms: i64,
    pub subscriptions: Vec<SubRecord>,
}

/// The current version of [`Snapshot::format`].
pub const SNAPSHOT_FORMAT: u32 = 1;

/// A stretch of the log that failed its checksum: never delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Damage {
    pub from_seq: u64,
    pub to_seq: u64,
    pub file: String,
    pub offset: u64,
}

/// What a store holds after a start.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Every recovered event in seq order; a damaged seq is a placeholder
    /// ([`LoggedEvent::damaged`]).
    pub events: Vec<Arc<LoggedEvent>>,
    pub snapshot: Option<Snapshot>,
    /// What recovery had to repair, for `bus.log`.
    pub notes: Vec<String>,
    /// Seq ranges the snapshot says were acknowledged and the store no
    /// longer holds (not placeholders): every restored subscription that
    /// had not read them counts them lost and reports a gap.
    pub lost: Vec<(u64, u64)>,
}

/// For `status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreInfo {
    pub kind: &'static str,
    pub durability: &'static str,
    pub path: Option<PathBuf>,
    pub segments: usize,
    pub bytes: u64,
    pub damaged: Vec<Damage>,
}

/// Why the store failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store cannot be used as it is (unknown format, unreadable
    /// subscriptions file): the bus refuses to start and touches nothing.
    Refused(String),
    /// A read, write or fsync failed.
    Io(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Refused(m) | StoreError::Io(m) => f.write_str(m),
        }
    }
}

/// The storage boundary. Called from one thread only.
pub trait Store: Send {
    /// Opens the store and returns what it holds. Repairs a torn tail; reports
    /// corruption as damaged ranges; refuses what it does not understand.
    fn recover(&mut self) -> Result<Recovered, StoreError>;
    /// Appends a batch (consecutive seqs) and returns once it is durable.
    fn append(&mut self, events: &[Arc<LoggedEvent>]) -> Result<(), StoreError>;
    /// Replaces the stored subscriptions with `snapshot`, atomically.
    fn save(&mut self, snapshot: &Snapshot) -> Result<(), StoreError>;
    /// Events below `seq` are no longer needed (retention, dedup and every
    /// subscription's snapshot are past them): their space may be reclaimed.
    fn release_below(&mut self, seq: u64) -> Result<(), StoreError>;
    fn info(&self) -> StoreInfo;
    /// The oldest seq the store still holds, when it keeps events the hub's
    /// dedup window must still cover (the cluster store); `None` otherwise.
    fn retained_from(&self) -> Option<u64> {
        None
    }
    /// A read of an event's body back from this store failed since the
    /// last call (the store failed: the committer stops the bus).
    fn take_read_failure(&mut self) -> Option<String> {
        None
    }
}

/// Opens the configured store at `dir` (not touched for `memory` and
/// `postgres`). `epoch` is the cluster's upstream lease as this host holds
/// it (0: not held); only the postgres store reads it, and the retention
/// (in events), from which it derives how much other hosts may hold back.
pub fn open(
    config: &StoreConfig,
    dir: PathBuf,
    epoch: Arc<AtomicI64>,
    retention_events: u64,
) -> Box<dyn Store> {
    match (config.kind, &config.postgres) {
        (StoreKind::Disk, _) => Box::new(disk::DiskStore::new(dir, config.durability)),
        (StoreKind::Memory, _) => Box::new(memory::MemoryStore),
        (StoreKind::Postgres, Some(settings)) => Box::new(
            postgres::store::PgStore::new(settings.clone(), epoch)
                .with_hold_cap(retention_events.saturating_mul(postgres::store::HOLD_FACTOR)),
        ),
        (StoreKind::Postgres, None) => Box::new(Unconfigured),
    }
}

/// `store = "postgres"` without its settings (the profile loader never
/// builds one): refuses to start.
struct Unconfigured;

impl Store for Unconfigured {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        Err(StoreError::Refused(
            "store = \"postgres\" has no database settings".into(),
        ))
    }
    fn append(&mut self, _: &[Arc<LoggedEvent>]) -> Result<(), StoreError> {
        Err(StoreError::Io(
            "the postgres store is not configured".into(),
        ))
    }
    fn save(&mut self, _: &Snapshot) -> Result<(), StoreError> {
        Err(StoreError::Io(
            "the postgres store is not configured".into(),
        ))
    }
    fn release_below(&mut self, _: u64) -> Result<(), StoreError> {
        Ok(())
    }
    fn info(&self) -> StoreInfo {
        StoreInfo {
            kind: "postgres",
            durability: "postgres",
            ..StoreInfo::default()
        }
    }
}
