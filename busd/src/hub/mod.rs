//! [`Hub`]: the bus's shared state — event log, dedup window, subscriptions,
//! connections, source state and counters — behind one cloneable handle.
//! This file owns the handle, the state it guards, the constructor (recovery
//! from what the store returned) and the connection registry; each job the
//! hub does lives in its own submodule, all of them `impl Hub` blocks over
//! the same `State`:
//!
//! - `subscribe`: subscribe, attach, unsubscribe, stop, upstream release;
//! - `delivery`: staging (`append`), fan-out of committed batches and
//!   retention (`committed`), `pull` and `ack`;
//! - `store_work`: the committer's work queue (`next_commit_work`),
//!   snapshots, `saved`, `store_failed`, `close_store`, `wait_durable`;
//! - `control`: the operator verbs (`dws event subscription VERB`);
//! - `status`: the status document and the subscription document;
//! - `housekeeping`: the idle timer and the TTL reaper;
//! - `source_state`: the source's state and counters;
//! - `refused`: the clients refused at a bound, the global input bound.
//!
//! Locking: one `std::sync::Mutex`. Every critical section is short and
//! synchronous; no lock is ever held across an `.await`, and wake-ups
//! (`Notify`) are sent after the guard is dropped. The upstream side
//! (`append`) never waits for a consumer.
//!
//! Durability: [`Hub::append`] only *stages* an event (dedup, seq). The
//! committer thread (`crate::commit`) takes every staged event as one batch,
//! makes it durable through the store, and hands it back to
//! [`Hub::committed`], which appends it to the in-memory log and fans it out.
//! So consumers only ever see durable events, and whoever must acknowledge an
//! event upstream waits for [`Hub::wait_durable`] first. Subscription changes
//! mark the subscriptions dirty; the committer saves them lazily, or at once
//! when a reply waits for them (`connection::replies` (`reply_after`)).
//!
//! Upstream subscriptions: the hub holds the source's [`UpstreamControl`],
//! if any, and only releases through it; it depends on `crate::upstream`,
//! never on the sources.

mod control;
mod dedup;
mod delivery;
mod housekeeping;
pub use housekeeping::requested_ttl;
mod refused;
mod shared;
mod source_state;
mod status;
mod store_work;
mod subscribe;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, AtomicUsize},
        Arc, Condvar, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use proto::v1::{self, ByeReason};
use tokio::sync::{watch, Notify};

use self::delivery::TypeCounters;
pub use self::{
    delivery::{halted_line, Appended, Delivery, MAX_EVENT_TYPES, OTHER_TYPES},
    refused::{Refused, RefusedKind, MAX_BUFFERED_INPUT},
    shared::{SharedWant, SharedWork},
    source_state::SourceInfo,
    store_work::{CommitWork, Durable, SAVE_INTERVAL},
};
pub use crate::eventlog::NewEvent;
pub use crate::subscription::ConnId;
use crate::{
    clock::now_ms,
    eventlog::{EventLog, LoggedEvent, Retention},
    pattern::Selector,
    shutdown::ShutdownTrigger,
    store::{Recovered, StoreInfo, SubRecord},
    subscription::Subscription,
    upstream::UpstreamControl,
};

/// Settings the hub needs; resolved by `config`.
#[derive(Debug, Clone)]
pub struct HubConfig {
    pub profile: String,
    pub socket: PathBuf,
    pub work_dir: PathBuf,
    pub retention: Retention,
    pub default_ttl: Duration,
    pub default_window: u32,
    pub dedup_capacity: usize,
    /// The store keeps events past the dedup window and refuses a repeated
    /// id among them (the cluster store): the window keeps their keys too
    /// (see `dedup`).
    pub dedup_keeps_retained: bool,
    pub idle_timeout: Duration,
    pub source_kind: String,
    /// The store keeps nothing (`store = "memory"`): an accepted event is
    /// "durable" at once, so `append` fans it out itself instead of handing
    /// it to the committer thread (one thread hop less per event).
    pub inline_commit: bool,
    /// `store = "postgres"`: this host is part of a cluster (shared
    /// delivery is possible).
    pub clustered: bool,
}

/// The per-connection end of the hub: how the hub wakes a connection task and
/// tells it to leave.
#[derive(Debug, Default)]
pub struct ConnHandle {
    pub wake: Notify,
    kick: Mutex<Option<ByeReason>>,
}

impl ConnHandle {
    /// Asks the connection to send `Bye{reason}` and close.
    fn kick(&self, reason: ByeReason) {
        *lock(&self.kick) = Some(reason);
        self.wake.notify_one();
    }

    pub fn take_kick(&self) -> Option<ByeReason> {
        lock(&self.kick).take()
    }
}

#[derive(Debug)]
struct Conn {
    pid: u32,
    name: String,
    handle: Arc<ConnHandle>,
    attached: Option<String>,
    connected_at_ms: i64,
    delivered: u64,
    acked: u64,
}

struct State {
    /// The durable, retained log: what consumers read.
    log: EventLog,
    /// The seq the next staged event gets.
    next_seq: u64,
    /// Accepted but not yet durable, in seq order.
    staged: Vec<Arc<LoggedEvent>>,
    dedup: dedup::Dedup,
    subs: BTreeMap<String, Subscription>,
    conns: HashMap<ConnId, Conn>,
    next_conn: ConnId,
    next_generated: u64,
    types: BTreeMap<String, TypeCounters>,
    source: SourceInfo,
    source_gen: u64,
    /// Bumped on every change that matters to the idle and TTL timers.
    activity_gen: u64,
    /// Named subscriptions changed since the last save.
    subs_dirty: bool,
    /// Bumped by a change a reply must not precede on disk (create, remove).
    subs_gen: u64,
    subs_saved_gen: u64,
    store: StoreInfo,
    /// Set once the store failed; the bus is stopping.
    store_error: Option<Arc<str>>,
    /// The cluster lease is lost for good: the committer fails the store
    /// once the batch it is appending, if any, is resolved.
    lease_lost: Option<String>,
    /// The committer flushes what is left and stops.
    closing: bool,
    refused: Refused,
    /// `store = "postgres"`: the cluster as the link last read it.
    cluster: Option<proto::status::ClusterDoc>,
    /// Shared subscriptions' events acked here, and those given back by a
    /// consumer that left: for the claims in the cluster (`shared`).
    shared_work: shared::SharedWork,
    /// Subscriptions removed by their TTL, for status.
    expired: housekeeping::Expired,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the committer: something staged, dirty, or closing.
    commit_wake: Condvar,
    durable: watch::Sender<Durable>,
    /// Wakes the housekeeping task (idle timer, TTL reaper).
    housekeeping: Notify,
    /// Mirror of `State::source_gen`, so connections can check for a source
    /// state change on every wake-up without the lock.
    source_gen: AtomicU64,
    config: HubConfig,
    started_at_ms: i64,
    started: Instant,
    shutdown: ShutdownTrigger,
    /// The source's upstream subscription control plane, if it has one.
    upstream: Option<Arc<dyn UpstreamControl>>,
    /// Bytes charged by connections against [`MAX_BUFFERED_INPUT`].
    input_buffered: AtomicUsize,
    /// Connections not read now because their client leaves replies unread.
    paused_readers: AtomicUsize,
    /// How long each append to the store took (recorded by the committer).
    append_latency: crate::latency::Histogram,
}

/// Acknowledged seqs the store lost (`Recovered::lost`): `sub` counts the
/// ones it had not read as lost and reports them with a gap. Below the
/// snapshot's `floor` only its pinned events were still wanted (the rest
/// was already counted lost to retention).
fn report_lost(sub: &mut Subscription, rec: &SubRecord, lost: &[(u64, u64)], floor: u64) {
    let mut pinned = rec.pinned.clone();
    pinned.sort_unstable();
    for &(a, b) in lost {
        for &p in pinned.iter().filter(|&&p| p >= a && p <= b && p < floor) {
            sub.missed(p, p);
        }
        let from = a.max(floor);
        if from <= b {
            sub.missed(from, b);
        }
    }
}

/// Cloneable handle to the bus state.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

/// Locks a mutex, recovering from poisoning: the state stays consistent
/// because no critical section can panic half-way through an update that
/// later code depends on.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Hub {
    /// A hub over what the store recovered: the retained log, the dedup
    /// window, the named subscriptions and the seq counter. What recovery
    /// had to repair is logged.
    pub fn new(
        config: HubConfig,
        shutdown: ShutdownTrigger,
        upstream: Option<Arc<dyn UpstreamControl>>,
        recovered: Recovered,
        store: StoreInfo,
    ) -> Hub {
        for note in &recovered.notes {
            tracing::warn!("store recovery: {note}");
        }
        let mut dedup = dedup::Dedup::new(config.dedup_capacity, config.dedup_keeps_retained);
        let events = recovered.events;
        let (floor, snap_head, clean) = recovered
            .snapshot
            .as_ref()
            .map_or((0, 0, true), |s| (s.log_floor, s.head_seq, s.clean));
        let last_seq = events.last().map_or(0, |e| e.seq);
        let head = last_seq.max(snap_head);
        let first_kept = events.iter().find(|e| e.seq >= floor).map(|e| e.seq);
        let mut log = EventLog::with_head(config.retention, first_kept.map_or(head, |f| f - 1));
        for e in &events {
            if !e.scope.is_empty() && !e.damaged {
                dedup.put((e.scope.clone(), e.event_id.clone()), e.seq);
            }
            if e.seq >= floor {
                log.append(e.clone());
            }
        }
        log.advance_head(head);
        let now = (Instant::now(), now_ms());
        let mut subs = BTreeMap::new();
        for rec in recovered.snapshot.iter().flat_map(|s| &s.subscriptions) {
            match Selector::new(&rec.patterns, &rec.filter)
                .and_then(|s| s.with_where(&rec.where_exprs))
            {
                Ok(sel) => {
                    let mut sub = Subscription::restore(
                        rec,
                        sel,
                        &events,
                        (floor, snap_head, clean),
                        now,
                        config.default_window as usize,
                    );
                    report_lost(&mut sub, rec, &recovered.lost, floor);
                    subs.insert(rec.id.clone(), sub);
                }
                Err(e) => {
                    tracing::error!(subscription = %rec.id, cause = %e, "stored subscription not restored")
                }
            }
        }
        // Shared subscriptions' events evicted here may be losses: the
        // claims task asks the cluster.
        let mut shared_work = shared::SharedWork::default();
        while let Some(old) = log.evict_one() {
            for sub in subs.values_mut() {
                sub.evicted(old.seq);
                if sub.may_lose_shared(&old) {
                    shared_work.evicted(&sub.id, old.seq);
                }
            }
        }
        if !subs.is_empty() || head > 0 {
            tracing::info!(
                subscriptions = subs.len(),
                head_seq = head,
                events = log.len(),
                clean,
                "state restored from the store"
            );
        }
        let state = State {
            log,
            next_seq: head.saturating_add(1),
            staged: vec![],
            dedup,
            subs,
            conns: HashMap::new(),
            next_conn: 1,
            next_generated: 1,
            types: BTreeMap::new(),
            source: SourceInfo {
                state: v1::SourceState {
                    state: v1::SourceStatus::Connecting as i32,
                    since_unix_ms: now_ms(),
                    ..Default::default()
                },
                ..Default::default()
            },
            source_gen: 0,
            activity_gen: 0,
            subs_dirty: true,
            subs_gen: 0,
            subs_saved_gen: 0,
            store,
            store_error: None,
            lease_lost: None,
            closing: false,
            refused: Refused::default(),
            cluster: None,
            shared_work,
            expired: housekeeping::Expired::default(),
        };
        let (durable, _) = watch::channel(Durable {
            seq: head,
            ..Durable::default()
        });
        Hub {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                commit_wake: Condvar::new(),
                durable,
                housekeeping: Notify::new(),
                source_gen: AtomicU64::new(0),
                config,
                started_at_ms: now_ms(),
                started: Instant::now(),
                shutdown,
                upstream,
                input_buffered: AtomicUsize::new(0),
                paused_readers: AtomicUsize::new(0),
                append_latency: Default::default(),
            }),
        }
    }

    /// How long appends to the store take: the committer records, status
    /// reads.
    pub fn append_latency(&self) -> &crate::latency::Histogram {
        &self.shared.append_latency
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    pub fn config(&self) -> &HubConfig {
        &self.shared.config
    }

    /// The cluster as last read, for status.
    pub fn set_cluster_status(&self, doc: proto::status::ClusterDoc) {
        self.state().cluster = Some(doc);
    }

    /// Wakes every connection waiting on the store's progress (a forwarded
    /// publish was answered).
    pub fn nudge_waiters(&self) {
        self.shared.durable.send_modify(|d| d.forwarded += 1);
    }

    pub fn shutdown_trigger(&self) -> &ShutdownTrigger {
        &self.shared.shutdown
    }

    fn touch(&self, st: &mut State) {
        st.activity_gen += 1;
        self.shared.housekeeping.notify_one();
    }

    // ------------------------------------------------------------ connections

    pub fn register_conn(&self) -> (ConnId, Arc<ConnHandle>) {
        let mut st = self.state();
        let id = st.next_conn;
        st.next_conn += 1;
        let handle = Arc::new(ConnHandle::default());
        st.conns.insert(
            id,
            Conn {
                pid: 0,
                name: String::new(),
                handle: handle.clone(),
                attached: None,
                connected_at_ms: now_ms(),
                delivered: 0,
                acked: 0,
            },
        );
        self.touch(&mut st);
        (id, handle)
    }

    pub fn identify_conn(&self, conn: ConnId, pid: u32, name: &str) {
        if let Some(c) = self.state().conns.get_mut(&conn) {
            c.pid = pid;
            c.name = name.chars().take(64).collect();
        }
    }

    pub fn unregister_conn(&self, conn: ConnId) {
        let mut st = self.state();
        self.detach_and_mark(&mut st, conn);
        st.conns.remove(&conn);
        self.touch(&mut st);
    }

    /// Detaches `conn` from its subscription (a clean Bye, or the connection
    /// closing): its in-flight events become pending again for redelivery.
    pub fn detach(&self, conn: ConnId) {
        let mut st = self.state();
        self.detach_and_mark(&mut st, conn);
        self.touch(&mut st);
    }

    /// [`detach_locked`], waking the committer if that changed a named
    /// subscription.
    fn detach_and_mark(&self, st: &mut State, conn: ConnId) {
        let was_dirty = st.subs_dirty;
        detach_locked(st, conn);
        if st.subs_dirty && !was_dirty {
            st.subs_dirty = false;
            self.mark_subs_dirty(st);
        }
    }
}

/// Detaches `conn` from its subscription, under the lock: what it had in
/// flight is pending again.
fn detach_locked(st: &mut State, conn: ConnId) {
    let Some(c) = st.conns.get_mut(&conn) else {
        return;
    };
    let Some(id) = c.attached.take() else { return };
    if let Some(sub) = st.subs.get_mut(&id) {
        if sub.consumer() == Some(conn) {
            sub.detach((Instant::now(), now_ms()));
            if sub.shared {
                let given_back = sub.release_all();
                st.shared_work.released(&id, given_back);
            }
            st.subs_dirty |= !sub.owned;
        }
    }
}
