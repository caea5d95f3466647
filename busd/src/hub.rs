//! [`Hub`]: the bus's shared state — event log, dedup window, subscriptions,
//! connections, source state and counters — behind one cloneable handle.
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
//! when a reply waits for them (`connection::reply_after`).

use std::{
    collections::{BTreeMap, HashMap},
    num::NonZeroUsize,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use lru::LruCache;
use prost::Message;
use proto::{
    limits::{MAX_EVENT_ENCODED, MAX_SUBSCRIPTIONS},
    v1::{self, ByeReason, ErrorCode},
};
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::{
    eventlog::{EventLog, LoggedEvent, Retention},
    pattern::Selector,
    shutdown::ShutdownTrigger,
    source::UpstreamControl,
    store::{Recovered, Snapshot, StoreInfo, SNAPSHOT_FORMAT},
    subscription::Subscription,
};

pub use crate::subscription::ConnId;

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
    pub idle_timeout: Duration,
    pub source_kind: String,
}

/// An event on its way into the log, before it has a seq.
#[derive(Debug, Default, Clone)]
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

/// Result of [`Hub::append`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub event_id: String,
    pub duplicate: bool,
}

/// What a consumer connection should send next.
#[derive(Debug, Default)]
pub struct Delivery {
    pub subscription_id: String,
    pub gap: Option<v1::Gap>,
    /// Events with their redelivered mark and delivery count.
    pub events: Vec<(Arc<LoggedEvent>, bool, u32)>,
    /// Delivery stopped at an event the store found damaged: why.
    pub damaged: Option<String>,
    /// The subscription halted at a poison event: the consumer's last words.
    pub halted: Option<String>,
}

/// How far the store has come, published by the committer.
#[derive(Debug, Clone, Default)]
pub struct Durable {
    /// Every event up to this seq is durable (and fanned out).
    pub seq: u64,
    /// Every subscription change up to this generation is saved.
    pub subs_gen: u64,
    /// The store failed: nothing more will become durable.
    pub failed: Option<Arc<str>>,
}

/// One round of work for the committer (see [`Hub::next_commit_work`]).
pub enum CommitWork {
    /// Make these staged events durable, then call [`Hub::committed`].
    Append(Vec<Arc<LoggedEvent>>),
    /// Save the subscriptions; then events below `keep_from` may be
    /// released; then call [`Hub::saved`] with `gen`.
    Save {
        snapshot: Snapshot,
        keep_from: u64,
        gen: u64,
    },
    /// The bus is closing and everything is flushed: save this last
    /// snapshot (marked clean) and stop.
    Final(Snapshot),
    /// Stop now (the store failed).
    Stop,
}

/// Subscription state is saved at most this often while only cursors move.
pub const SAVE_INTERVAL: Duration = Duration::from_millis(200);

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

/// A request that the hub refused, with the code for the `Error` frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
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

#[derive(Debug, Default, Clone, Copy)]
struct TypeCounters {
    received: u64,
    duplicates: u64,
}

#[derive(Debug, Clone, Default)]
pub struct SourceInfo {
    pub state: v1::SourceState,
    /// Upstream input that could not be turned into an event (counted, logged).
    pub malformed: u64,
    /// Upstream frames acked but not routed, by reason (a fixed set).
    pub unroutable: BTreeMap<&'static str, u64>,
    pub reconnects: u64,
    pub last_error: String,
    pub connected_since_ms: i64,
}

struct State {
    /// The durable, retained log: what consumers read.
    log: EventLog,
    /// The seq the next staged event gets.
    next_seq: u64,
    /// Accepted but not yet durable, in seq order.
    staged: Vec<Arc<LoggedEvent>>,
    dedup: LruCache<(String, String), u64>,
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
    /// The committer flushes what is left and stops.
    closing: bool,
    refused: Refused,
}

/// Clients refused because they hit a bound (see README "Limits").
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Refused {
    /// Connections over [`crate::server::MAX_CONNECTIONS`].
    pub connections: u64,
    /// Connections closed because all connections together held too much
    /// partially received input.
    pub input_budget: u64,
    /// Connections that sent no Hello, or did not finish a frame, in time.
    pub slow_clients: u64,
    /// Bad frames (oversized, undecodable, truncated, wrong version).
    pub bad_frames: u64,
    /// Events refused at the door for their size.
    pub too_large_events: u64,
}

/// Which bound a client hit.
#[derive(Debug, Clone, Copy)]
pub enum RefusedKind {
    Connections,
    InputBudget,
    SlowClient,
    BadFrame,
    TooLargeEvent,
}

/// Most bytes of partially received input all connections together may
/// hold beyond their first 64 KiB each (see [`Hub::charge_input`]).
pub const MAX_BUFFERED_INPUT: usize = 256 << 20;

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
}

/// Cloneable handle to the bus state.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
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
        let cap = NonZeroUsize::new(config.dedup_capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        let mut dedup = LruCache::new(cap);
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
            match Selector::new(&rec.patterns, &rec.filter) {
                Ok(sel) => {
                    let sub = Subscription::restore(
                        rec,
                        sel,
                        &events,
                        (floor, snap_head, clean),
                        now,
                        config.default_window as usize,
                    );
                    subs.insert(rec.id.clone(), sub);
                }
                Err(e) => {
                    tracing::error!(subscription = %rec.id, cause = %e, "stored subscription not restored")
                }
            }
        }
        while let Some(old) = log.evict_one() {
            for sub in subs.values_mut() {
                sub.evicted(old.seq);
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
            next_seq: head + 1,
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
            closing: false,
            refused: Refused::default(),
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
            }),
        }
    }

    /// Sets a connection's charge against the global input bound to `want`
    /// bytes (`charged` is what it holds now). `false` when the bound would
    /// be passed: the connection must refuse its client.
    pub fn charge_input(&self, charged: &mut usize, want: usize) -> bool {
        let total = &self.shared.input_buffered;
        if want <= *charged {
            total.fetch_sub(*charged - want, Ordering::Relaxed);
            *charged = want;
            return true;
        }
        let more = want - *charged;
        let before = total.fetch_add(more, Ordering::Relaxed);
        if before + more > MAX_BUFFERED_INPUT {
            total.fetch_sub(more, Ordering::Relaxed);
            return false;
        }
        *charged = want;
        true
    }

    /// Counts a client refused for hitting a bound.
    pub fn count_refused(&self, kind: RefusedKind) {
        let r = &mut self.state().refused;
        match kind {
            RefusedKind::Connections => r.connections += 1,
            RefusedKind::InputBudget => r.input_budget += 1,
            RefusedKind::SlowClient => r.slow_clients += 1,
            RefusedKind::BadFrame => r.bad_frames += 1,
            RefusedKind::TooLargeEvent => r.too_large_events += 1,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    pub fn config(&self) -> &HubConfig {
        &self.shared.config
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
        detach_locked(&mut st, conn);
        st.conns.remove(&conn);
        self.touch(&mut st);
    }

    /// Detaches `conn` from its subscription (a clean Bye, or the connection
    /// closing): its in-flight events become pending again for redelivery.
    pub fn detach(&self, conn: ConnId) {
        let mut st = self.state();
        detach_locked(&mut st, conn);
        self.touch(&mut st);
    }

    // ------------------------------------------------------------ subscriptions

    /// The upstream control plane, when a Subscribe for `req` must first
    /// bind an upstream subscription: the source has one and `req` would
    /// create a new local subscription.
    pub fn upstream_for(&self, req: &v1::Subscribe) -> Option<Arc<dyn UpstreamControl>> {
        let upstream = self.shared.upstream.clone()?;
        let exists =
            !req.subscription_id.is_empty() && self.state().subs.contains_key(&req.subscription_id);
        (!exists && !req.must_exist).then_some(upstream)
    }

    pub fn has_upstream_control(&self) -> bool {
        self.shared.upstream.is_some()
    }

    /// Creates or attaches a subscription. `upstream_id` binds a newly
    /// created one to an upstream subscription (see [`Hub::upstream_for`]);
    /// if the subscription is not created after all, the binding is released.
    /// With the reply comes the subscription generation that must be saved
    /// before it is sent (a named subscription was created).
    pub fn subscribe(
        &self,
        conn: ConnId,
        req: &v1::Subscribe,
        upstream_id: Option<String>,
    ) -> Result<(v1::Subscribed, Option<u64>), Refusal> {
        let result = self.subscribe_locked(conn, req, upstream_id.clone());
        if let (Some(up), Some(ctl)) = (&upstream_id, &self.shared.upstream) {
            if !result.as_ref().is_ok_and(|(r, _)| r.created) {
                ctl.release(up);
            }
        }
        result
    }

    fn subscribe_locked(
        &self,
        conn: ConnId,
        req: &v1::Subscribe,
        upstream_id: Option<String>,
    ) -> Result<(v1::Subscribed, Option<u64>), Refusal> {
        let cfg = &self.shared.config;
        if !req.subscription_id.is_empty() && !proto::is_valid_id(&req.subscription_id) {
            return Err(Refusal::new(
                ErrorCode::BadRequest,
                format!(
                    "invalid subscription id {:?}: use 1-64 characters from A-Z a-z 0-9 . _ -",
                    req.subscription_id
                ),
            ));
        }
        let patterns_given = !req.patterns.is_empty();
        let selector = if patterns_given || !req.must_exist {
            Some(
                Selector::new(&req.patterns, &req.filter)
                    .map_err(|m| Refusal::new(ErrorCode::BadRequest, m))?,
            )
        } else {
            None
        };
        let mut kicked = None;
        let mut save_gen = None;
        let mut st = self.state();
        let head = st.log.head_seq();
        let exists = st.subs.contains_key(&req.subscription_id);
        let created = !exists;
        if exists {
            let sub = &st.subs[&req.subscription_id];
            if let Some(sel) = &selector {
                if !sub.selector.same_spec(sel) {
                    return Err(Refusal::new(
                        ErrorCode::BadRequest,
                        format!(
                            "subscription {} exists with event keys {} and filter {:?}; \
                             this request asks for {} and {:?}",
                            sub.id,
                            sub.selector.pattern_strings().join(","),
                            sub.selector.filter_str(),
                            sel.pattern_strings().join(","),
                            sel.filter_str()
                        ),
                    ));
                }
            }
        } else if req.must_exist {
            return Err(Refusal::new(
                ErrorCode::NotFound,
                format!("subscription {} not found", req.subscription_id),
            ));
        }
        let id = if req.subscription_id.is_empty() {
            loop {
                let id = format!("sub-{}-{}", std::process::id(), st.next_generated);
                st.next_generated += 1;
                if !st.subs.contains_key(&id) {
                    break id;
                }
            }
        } else {
            req.subscription_id.clone()
        };
        if created && st.subs.len() >= MAX_SUBSCRIPTIONS {
            return Err(Refusal::new(
                ErrorCode::ResourceExhausted,
                format!("too many subscriptions ({MAX_SUBSCRIPTIONS}); unsubscribe some first"),
            ));
        }
        if created {
            let Some(selector) = selector else {
                return Err(Refusal::new(
                    ErrorCode::BadRequest,
                    "at least one event key is required",
                ));
            };
            let start_from = match v1::StartPosition::try_from(req.start).unwrap_or_default() {
                v1::StartPosition::StartLatest => head + 1,
                v1::StartPosition::StartEarliest => 0,
                v1::StartPosition::StartSeq => req.start_seq,
            };
            let ttl = if req.ttl_ms == 0 {
                cfg.default_ttl
            } else {
                Duration::from_millis(req.ttl_ms)
            };
            let mut sub = Subscription::new(
                id.clone(),
                selector,
                req.owned,
                ttl,
                upstream_id,
                start_from.saturating_sub(1),
                (Instant::now(), now_ms()),
                cfg.default_window as usize,
            );
            sub.max_deliver = req.max_deliver;
            sub.on_poison = v1::PoisonPolicy::try_from(req.on_poison).unwrap_or_default();
            for e in st.log.since(start_from) {
                sub.offer(e);
            }
            st.subs.insert(id.clone(), sub);
            if !req.owned {
                st.subs_gen += 1;
                save_gen = Some(st.subs_gen);
            }
        }
        if req.attach {
            if st.subs[&id].state == crate::subscription::State::Disabled {
                return Err(Refusal::new(
                    ErrorCode::FailedPrecondition,
                    format!(
                        "subscription {id} is disabled: it collects events but delivers none \
                         (dws event subscription enable {id})"
                    ),
                ));
            }
            let holder = st.subs[&id].consumer().filter(|c| *c != conn);
            if let Some(holder) = holder {
                if !req.takeover {
                    let pid = st.conns.get(&holder).map_or(0, |c| c.pid);
                    return Err(Refusal::new(
                        ErrorCode::AlreadyAttached,
                        format!(
                            "subscription {id} is already attached to a consumer (pid {pid}); \
                             use --takeover to replace it"
                        ),
                    ));
                }
                detach_locked(&mut st, holder);
                kicked = st.conns.get(&holder).map(|c| c.handle.clone());
            }
            // A connection consumes one subscription at a time.
            if st.conns.get(&conn).and_then(|c| c.attached.as_ref()) != Some(&id) {
                detach_locked(&mut st, conn);
            }
            let window = if req.window == 0 {
                cfg.default_window
            } else {
                req.window
            };
            let sub = st
                .subs
                .get_mut(&id)
                .ok_or_else(|| Refusal::new(ErrorCode::Internal, "subscription vanished"))?;
            let explicit = req
                .explicit_ack
                .then(|| Duration::from_millis(req.ack_wait_ms.max(1)));
            sub.attach(conn, window as usize, explicit);
            if let Some(c) = st.conns.get_mut(&conn) {
                c.attached = Some(id.clone());
            }
        }
        let sub = &st.subs[&id];
        let reply = v1::Subscribed {
            request_id: req.request_id,
            subscription_id: id.clone(),
            created,
            patterns: sub.selector.pattern_strings(),
            filter: sub.selector.filter_str().to_owned(),
            cursor: sub.cursor(head),
            head_seq: head,
            attached: req.attach,
            upstream_subscription_id: sub.upstream_id.clone().unwrap_or_default(),
        };
        let wake = req
            .attach
            .then(|| st.conns.get(&conn).map(|c| c.handle.clone()))
            .flatten();
        st.subs_dirty = true;
        self.touch(&mut st);
        drop(st);
        if save_gen.is_some() {
            self.shared.commit_wake.notify_one();
        }
        if let Some(k) = kicked {
            k.kick(ByeReason::TakenOver);
        }
        if let Some(w) = wake {
            w.wake.notify_one();
        }
        Ok((reply, save_gen))
    }

    /// Removes subscriptions. A consumer attached to one (other than the
    /// requester itself) gets `Bye{UNSUBSCRIBED}`.
    /// Returns the removed and unknown ids, and the subscription generation
    /// to save before replying (a named subscription was removed).
    pub fn unsubscribe(
        &self,
        requester: ConnId,
        ids: &[String],
    ) -> (Vec<String>, Vec<String>, Option<u64>) {
        let mut removed = vec![];
        let mut save_gen = None;
        let mut not_found = vec![];
        let mut kicks = vec![];
        let mut released = vec![];
        let mut st = self.state();
        for id in ids {
            match st.subs.remove(id) {
                Some(sub) => {
                    if !sub.owned {
                        st.subs_gen += 1;
                        save_gen = Some(st.subs_gen);
                        st.subs_dirty = true;
                    }
                    released.extend(sub.upstream_id.clone());
                    if let Some(c) = sub.consumer() {
                        if let Some(conn) = st.conns.get_mut(&c) {
                            conn.attached = None;
                            if c != requester {
                                kicks.push(conn.handle.clone());
                            }
                        }
                    }
                    removed.push(id.clone());
                }
                None => not_found.push(id.clone()),
            }
        }
        self.touch(&mut st);
        drop(st);
        if save_gen.is_some() {
            self.shared.commit_wake.notify_one();
        }
        for k in kicks {
            k.kick(ByeReason::Unsubscribed);
        }
        self.release_upstream(released);
        (removed, not_found, save_gen)
    }

    fn release_upstream(&self, ids: Vec<String>) {
        if let Some(ctl) = &self.shared.upstream {
            for id in ids {
                ctl.release(&id);
            }
        }
    }

    /// Closes the consumers attached to `ids` (Bye SUBSCRIPTION_STOPPED) and
    /// leaves the subscriptions in place.
    pub fn stop_consumers(&self, ids: &[String], dry_run: bool) -> v1::StopReply {
        let mut reply = v1::StopReply::default();
        let mut kicks = vec![];
        let mut st = self.state();
        for id in ids {
            let Some(holder) = st.subs.get(id).map(Subscription::consumer) else {
                reply.not_found.push(id.clone());
                continue;
            };
            reply.subscription_ids.push(id.clone());
            if let Some(c) = holder {
                if let Some(conn) = st.conns.get(&c) {
                    reply.consumer_pids.push(conn.pid);
                    kicks.push(conn.handle.clone());
                }
                if !dry_run {
                    detach_locked(&mut st, c);
                }
            }
        }
        if !dry_run {
            self.touch(&mut st);
        }
        drop(st);
        if !dry_run {
            for k in kicks {
                k.kick(ByeReason::SubscriptionStopped);
            }
        }
        reply
    }

    /// Pids of every consumer currently attached (for a dry-run stop).
    pub fn consumer_pids(&self) -> Vec<u32> {
        let st = self.state();
        st.conns
            .values()
            .filter(|c| c.attached.is_some())
            .map(|c| c.pid)
            .collect()
    }

    // ------------------------------------------------------------ delivery

    /// Accepts an event unless its id is in the dedup window: gives it the
    /// next seq and stages it for the committer. Never waits for anyone. The
    /// event is durable (and delivered) once [`Hub::wait_durable`] for its
    /// seq returns; a duplicate's seq is the original's, which may itself be
    /// still staged, so callers wait on duplicates too.
    ///
    /// An event whose deliveries would not fit in a frame is refused here,
    /// at the door, so nothing is ever acked that cannot be delivered.
    pub fn append(&self, ev: NewEvent) -> Result<Appended, Refusal> {
        let mut st = self.state();
        count_type(&mut st.types, &ev.event_type).received += 1;
        let dedup_key = (!ev.event_id.is_empty()).then(|| (ev.scope.clone(), ev.event_id.clone()));
        if let Some(key) = &dedup_key {
            if let Some(&seq) = st.dedup.get(key) {
                count_type(&mut st.types, &ev.event_type).duplicates += 1;
                return Ok(Appended {
                    seq,
                    event_id: ev.event_id,
                    duplicate: true,
                });
            }
        }
        let seq = st.next_seq;
        let event_id = if ev.event_id.is_empty() {
            format!("{}-{seq}", self.shared.started_at_ms)
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
            st.refused.too_large_events += 1;
            return Err(Refusal::new(
                ErrorCode::TooLarge,
                format!(
                    "event too large: {} bytes encoded (data, headers and ids together); the most \
                     is {MAX_EVENT_ENCODED}, so that every delivery fits in one frame",
                    encoded.len()
                ),
            ));
        }
        st.next_seq += 1;
        let (scope, key_id) = dedup_key.clone().unwrap_or_default();
        st.staged.push(Arc::new(LoggedEvent {
            seq,
            event_type: ev.event_type,
            received_at_unix_ms,
            encoded: Bytes::from(encoded),
            scope,
            event_id: key_id,
            route: ev.upstream_subscription,
            damaged: false,
            line_parts: Default::default(),
        }));
        if let Some(key) = dedup_key {
            st.dedup.put(key, seq);
        }
        let first = st.staged.len() == 1;
        drop(st);
        if first {
            self.shared.commit_wake.notify_one();
        }
        Ok(Appended {
            seq,
            event_id,
            duplicate: false,
        })
    }

    /// Waits until every event up to `seq` is durable. Fails when the store
    /// failed (the bus is stopping), with the cause.
    pub async fn wait_durable(&self, seq: u64) -> Result<(), Arc<str>> {
        let mut rx = self.shared.durable.subscribe();
        let d = rx
            .wait_for(|d| d.seq >= seq || d.failed.is_some())
            .await
            .map_err(|_| Arc::<str>::from("the bus is stopping"))?;
        match (&d.failed, d.seq >= seq) {
            (_, true) => Ok(()),
            (Some(e), false) => Err(e.clone()),
            (None, false) => Err("the bus is stopping".into()),
        }
    }

    /// A receiver of the committer's progress (connections wait on it for
    /// their pipelined publish replies).
    pub fn durable(&self) -> watch::Receiver<Durable> {
        self.shared.durable.subscribe()
    }

    /// Why the store failed, once it did.
    pub fn store_error(&self) -> Option<Arc<str>> {
        self.state().store_error.clone()
    }

    // ------------------------------------------------------------ committer

    /// The committer's next round: blocks (on a condvar, in the committer's
    /// own thread) until there is something to do. Staged events first, so
    /// the next batch forms while the previous one is being synced.
    pub fn next_commit_work(&self, last_save: Instant) -> CommitWork {
        let mut st = self.state();
        loop {
            if st.store_error.is_some() {
                return CommitWork::Stop;
            }
            if !st.staged.is_empty() {
                return CommitWork::Append(std::mem::take(&mut st.staged));
            }
            let urgent = st.subs_gen > st.subs_saved_gen;
            if st.closing {
                return CommitWork::Final(self.snapshot_locked(&st, true).0);
            }
            let due = last_save + SAVE_INTERVAL;
            if st.subs_dirty && (urgent || Instant::now() >= due) {
                st.subs_dirty = false;
                let (snapshot, keep_from) = self.snapshot_locked(&st, false);
                return CommitWork::Save {
                    snapshot,
                    keep_from,
                    gen: st.subs_gen,
                };
            }
            st = if st.subs_dirty {
                let wait = due.saturating_duration_since(Instant::now());
                self.shared
                    .commit_wake
                    .wait_timeout(st, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0)
            } else {
                self.shared
                    .commit_wake
                    .wait(st)
                    .unwrap_or_else(|p| p.into_inner())
            };
        }
    }

    /// The subscriptions as they are now, and the lowest seq the store must
    /// keep: the log's oldest retained event, the events pinned in flight,
    /// and the dedup window.
    fn snapshot_locked(&self, st: &State, clean: bool) -> (Snapshot, u64) {
        let head = st.log.head_seq();
        let log_floor = st.log.oldest_seq().unwrap_or(head + 1);
        let subscriptions: Vec<_> = st
            .subs
            .values()
            .filter(|s| !s.owned)
            .map(|s| s.record(log_floor, head))
            .collect();
        // Pinned in-flight events and parked ones outlive the log.
        let pinned_floor = st
            .subs
            .values()
            .filter(|s| !s.owned)
            .filter_map(Subscription::oldest_kept)
            .min()
            .unwrap_or(u64::MAX);
        let dedup_floor = (head + 1).saturating_sub(self.shared.config.dedup_capacity as u64);
        let keep_from = log_floor.min(pinned_floor).min(dedup_floor);
        let snapshot = Snapshot {
            format: SNAPSHOT_FORMAT,
            clean,
            head_seq: head,
            log_floor,
            saved_at_unix_ms: now_ms(),
            subscriptions,
        };
        (snapshot, keep_from)
    }

    /// The snapshot written at start-up, before anything is served: marks
    /// the store as in use (not clean) until the next clean exit.
    pub fn startup_snapshot(&self) -> Snapshot {
        self.snapshot_locked(&self.state(), false).0
    }

    /// A batch is durable: append it to the log, fan it out, apply
    /// retention, and tell the waiters.
    pub fn committed(&self, batch: Vec<Arc<LoggedEvent>>, info: StoreInfo) {
        let mut wake = vec![];
        let mut st = self.state();
        st.store = info;
        let State {
            subs, conns, log, ..
        } = &mut *st;
        for e in batch {
            for sub in subs.values_mut() {
                if sub.offer(&e) {
                    if let Some(c) = sub.consumer().and_then(|c| conns.get(&c)) {
                        wake.push(c.handle.clone());
                    }
                }
            }
            log.append(e);
        }
        // Retention: evict from the front; a subscription loses an evicted
        // event only if it had not been sent yet, and is told with a Gap.
        let mut evicted = false;
        while let Some(old) = log.evict_one() {
            evicted = true;
            for sub in subs.values_mut() {
                sub.evicted(old.seq);
            }
        }
        let head = log.head_seq();
        // Cursors of named subscriptions and the log floor moved.
        st.subs_dirty |= evicted || st.subs.values().any(|s| !s.owned);
        drop(st);
        self.shared.durable.send_modify(|d| d.seq = head);
        wake.sort_by_key(Arc::as_ptr);
        wake.dedup_by_key(|h| Arc::as_ptr(h));
        for w in wake {
            w.wake.notify_one();
        }
    }

    /// The subscriptions of generation `gen` are saved.
    pub fn saved(&self, gen: u64, info: StoreInfo) {
        let mut st = self.state();
        st.store = info;
        st.subs_saved_gen = st.subs_saved_gen.max(gen);
        drop(st);
        self.shared
            .durable
            .send_modify(|d| d.subs_gen = d.subs_gen.max(gen));
    }

    /// The store failed: nothing more can be made durable. Fatal — the bus
    /// stops, and every consumer and waiting publisher is told why. Never
    /// retried: after a failed fsync the kernel may have dropped the pages.
    pub fn store_failed(&self, why: String) {
        tracing::error!(cause = %why, "the store failed; the bus stops (the next start recovers what is on disk)");
        let why: Arc<str> = why.into();
        self.state().store_error = Some(why.clone());
        self.shared
            .durable
            .send_modify(|d| d.failed = Some(why.clone()));
        self.shared.shutdown.trigger(ByeReason::Shutdown);
    }

    /// Asks the committer to flush what is staged, save the subscriptions
    /// marked clean, and stop.
    pub fn close_store(&self) {
        self.state().closing = true;
        self.shared.commit_wake.notify_one();
    }

    /// Takes what `conn` may send now: a pending Gap and up to its credit of
    /// events. Marks them in flight.
    pub fn pull(&self, conn: ConnId, max_events: usize) -> (Option<Delivery>, Option<Instant>) {
        let mut st = self.state();
        let head = st.log.head_seq();
        let State {
            subs,
            conns,
            store,
            subs_dirty,
            ..
        } = &mut *st;
        let Some((c, sub)) = conns
            .get_mut(&conn)
            .and_then(|c| Some((c.attached.clone()?, c)))
            .and_then(|(id, c)| Some((c, subs.get_mut(&id)?)))
        else {
            return (None, None);
        };
        let pulled = sub.pull(max_events, head, Instant::now());
        c.delivered += pulled.events.len() as u64;
        let damaged = pulled.damaged_at.map(|seq| {
            let at = store
                .damaged
                .iter()
                .find(|d| (d.from_seq..=d.to_seq).contains(&seq))
                .map(|d| format!(" ({} at offset {})", d.file, d.offset))
                .unwrap_or_default();
            format!(
                "the bus's store is damaged: event seq {seq} of subscription {} failed its \
                 checksum{at}; it is never delivered, and this subscription cannot read past it \
                 (see `dws event status`)",
                sub.id
            )
        });
        let halted = pulled.halted.map(|h| {
            tracing::warn!(subscription = %sub.id, seq = h.seq, deliveries = h.deliveries, "subscription halted at a poison event");
            *subs_dirty = true;
            halted_line(&sub.id, h.seq, h.deliveries)
        });
        if !pulled.events.is_empty() && !sub.owned {
            // Delivery counts are stored.
            *subs_dirty = true;
        }
        let next_due = pulled.next_due;
        if pulled.gap.is_none() && pulled.events.is_empty() && damaged.is_none() && halted.is_none()
        {
            return (None, next_due);
        }
        let d = Delivery {
            subscription_id: sub.id.clone(),
            gap: pulled.gap,
            events: pulled.events,
            damaged,
            halted,
        };
        (Some(d), next_due)
    }

    /// An ack from `conn`: cumulative (`seq`), event by event (`seqs`), and
    /// nacks (deliver again after a delay).
    pub fn ack(&self, conn: ConnId, ack: &v1::Ack) {
        let mut st = self.state();
        let State { subs, conns, .. } = &mut *st;
        let Some(c) = conns.get_mut(&conn) else {
            return;
        };
        let Some(sub) = c.attached.as_ref().and_then(|id| subs.get_mut(id)) else {
            return;
        };
        let mut n = if ack.seq > 0 { sub.ack(ack.seq) } else { 0 };
        for &seq in &ack.seqs {
            n += u64::from(sub.ack_one(seq));
        }
        let now = Instant::now();
        let mut nacked = false;
        for nack in &ack.nacks {
            nacked |= sub.nack(nack.seq, now + Duration::from_millis(nack.delay_ms));
        }
        c.acked += n;
        let more = sub.has_unsent() || nacked;
        let named = !sub.owned;
        let handle = c.handle.clone();
        st.subs_dirty |= named && (n > 0 || nacked);
        drop(st);
        if more {
            handle.wake.notify_one();
        }
    }

    // ------------------------------------------------------------ operator verbs

    /// `dws event subscription VERB ID`: applies the verb (or, with
    /// `dry_run`, shows what it would do) and returns the subscription's
    /// state after it, with the generation to save before replying.
    pub fn control(
        &self,
        req: &v1::SubscriptionControl,
    ) -> Result<(serde_json::Value, Option<u64>), Refusal> {
        use crate::subscription::State as S;
        let mut st = self.state();
        let head = st.log.head_seq();
        let oldest = st.log.oldest_seq().unwrap_or(head + 1);
        let Some(current) = st.subs.get(&req.subscription_id) else {
            return Err(Refusal::new(
                ErrorCode::NotFound,
                format!(
                    "subscription {} not found",
                    proto::limits::clip(&req.subscription_id)
                ),
            ));
        };
        let mut sub = current.clone();
        let refuse = |m: String| Refusal::new(ErrorCode::BadRequest, m);
        let not_now = |m: String| Refusal::new(ErrorCode::FailedPrecondition, m);
        let mut extra = serde_json::Map::new();
        let changed = match req.verb.as_str() {
            "show" | "parked" => false,
            "restart" => sub.restart().map(|()| true).map_err(not_now)?,
            "skip" => {
                let seq = sub.skip().map_err(not_now)?;
                extra.insert("skipped_seq".into(), seq.into());
                true
            }
            "disable" => {
                let was = sub.state == S::Disabled;
                sub.disable().map_err(not_now)?;
                !was
            }
            "enable" => {
                let was = sub.state == S::Active;
                sub.enable().map_err(not_now)?;
                !was
            }
            "seek" => {
                let start = match req.target.as_str() {
                    "earliest" => 0,
                    "latest" => head + 1,
                    t => match t.strip_prefix("t:") {
                        Some(ms) => {
                            let ms: i64 = ms.parse().map_err(|_| {
                                refuse(format!("seek: bad time {:?}", proto::limits::clip(t)))
                            })?;
                            st.log
                                .since(0)
                                .find(|e| e.received_at_unix_ms >= ms)
                                .map_or(head + 1, |e| e.seq)
                        }
                        None => t.parse::<u64>().map_err(|_| {
                            refuse(format!(
                                "seek: target {} is not earliest, latest, a seq or a time",
                                proto::limits::quoted(t)
                            ))
                        })?,
                    },
                };
                let from = start.max(oldest).min(head + 1);
                let gone = from.saturating_sub(start.max(1));
                sub.seek(from.saturating_sub(1));
                for e in st.log.since(from) {
                    sub.offer(e);
                }
                extra.insert(
                    "seek".into(),
                    json!({"requested": req.target, "from_seq": from, "gone": gone}),
                );
                true
            }
            "replay-parked" => {
                let n = sub.replay_parked(&req.seqs);
                extra.insert("replayed".into(), n.into());
                n > 0
            }
            other => {
                return Err(refuse(format!(
                    "unknown verb {}: use restart, skip, disable, enable, seek, parked or replay-parked",
                    proto::limits::quoted(other)
                )))
            }
        };
        let mut doc = subscription_doc(&sub, head, req.verb == "parked");
        if let Some(obj) = doc.as_object_mut() {
            obj.insert("verb".into(), req.verb.clone().into());
            obj.insert("dry_run".into(), req.dry_run.into());
            obj.insert("changed".into(), changed.into());
            obj.extend(extra);
        }
        if req.dry_run || !changed {
            return Ok((doc, None));
        }
        tracing::info!(subscription = %sub.id, verb = %req.verb, "subscription changed by an operator");
        let wake = sub
            .consumer()
            .and_then(|c| st.conns.get(&c))
            .map(|c| c.handle.clone());
        let named = !sub.owned;
        st.subs.insert(sub.id.clone(), sub);
        let gen = named.then(|| {
            st.subs_gen += 1;
            st.subs_dirty = true;
            st.subs_gen
        });
        drop(st);
        if gen.is_some() {
            self.shared.commit_wake.notify_one();
        }
        if let Some(w) = wake {
            w.wake.notify_one();
        }
        Ok((doc, gen))
    }

    // ------------------------------------------------------------ source

    pub fn set_source_state(&self, state: v1::SourceState, last_error: Option<String>) {
        let mut st = self.state();
        let status = v1::SourceStatus::try_from(state.state).unwrap_or_default();
        if status == v1::SourceStatus::Connected {
            st.source.connected_since_ms = state.since_unix_ms;
        }
        if status == v1::SourceStatus::Reconnecting {
            st.source.reconnects += 1;
        }
        if let Some(e) = last_error {
            st.source.last_error = e;
        }
        st.source.state = state;
        st.source_gen += 1;
        self.shared
            .source_gen
            .store(st.source_gen, Ordering::Release);
        let handles: Vec<_> = st
            .conns
            .values()
            .filter(|c| c.attached.is_some())
            .map(|c| c.handle.clone())
            .collect();
        drop(st);
        for h in handles {
            h.wake.notify_one();
        }
    }

    /// Counts and logs one piece of upstream input that is not a valid event.
    pub fn source_malformed(&self, why: &str) {
        tracing::warn!(cause = %why, "malformed upstream input skipped");
        let mut st = self.state();
        st.source.malformed += 1;
        st.source.last_error = format!("malformed input: {why}");
    }

    /// Counts one upstream frame that was acked but could not be routed.
    /// The caller logs it (rate-limited); this only counts it for `status`.
    pub fn source_unroutable(&self, reason: &'static str, detail: &str) {
        let mut st = self.state();
        *st.source.unroutable.entry(reason).or_insert(0) += 1;
        st.source.last_error = format!("unroutable frame ({reason}): {detail}");
    }

    /// The source state's generation, without taking the lock.
    pub fn source_gen(&self) -> u64 {
        self.shared.source_gen.load(Ordering::Acquire)
    }

    /// The source state and its generation (to detect changes).
    pub fn source_state(&self) -> (v1::SourceState, u64) {
        let st = self.state();
        (st.source.state.clone(), st.source_gen)
    }

    // ------------------------------------------------------------ housekeeping

    /// Runs the idle timer and the TTL reaper until shutdown. Sleeps until the
    /// next deadline or a change in activity: no polling.
    pub async fn housekeeping(self, mut shutdown: crate::shutdown::Shutdown) {
        let idle_timeout = self.shared.config.idle_timeout;
        let mut idle_since: Option<(Instant, u64)> = None;
        loop {
            let notified = self.shared.housekeeping.notified();
            let now = Instant::now();
            let mut released = vec![];
            let (busy, gen, next_expiry) = {
                let mut st = self.state();
                let expired: Vec<String> = st
                    .subs
                    .values()
                    .filter(|s| s.expires_at().is_some_and(|t| t <= now))
                    .map(|s| s.id.clone())
                    .collect();
                for id in &expired {
                    tracing::info!(subscription = %id, "subscription expired (ttl)");
                    if let Some(up) = st.subs.remove(id).and_then(|s| s.upstream_id) {
                        released.push(up);
                    }
                }
                if !expired.is_empty() {
                    st.activity_gen += 1;
                    st.subs_dirty = true;
                }
                let next = st.subs.values().filter_map(Subscription::expires_at).min();
                (
                    !st.conns.is_empty() || !st.subs.is_empty(),
                    st.activity_gen,
                    next,
                )
            };
            self.release_upstream(released);
            let mut deadline = next_expiry;
            if busy || idle_timeout.is_zero() {
                idle_since = None;
            } else {
                let since = match idle_since {
                    Some((t, g)) if g == gen => t,
                    _ => now,
                };
                idle_since = Some((since, gen));
                let idle_at = since + idle_timeout;
                if idle_at <= now {
                    tracing::info!(timeout = ?idle_timeout, "idle: no consumers and no subscriptions");
                    self.shared.shutdown.trigger(ByeReason::Idle);
                    return;
                }
                deadline = Some(deadline.map_or(idle_at, |d| d.min(idle_at)));
            }
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = sleep => {}
                _ = shutdown.recv() => return,
            }
        }
    }

    // ------------------------------------------------------------ status

    /// The status document, listing at most `max_listed` consumers and
    /// subscriptions (the connection lowers it until the reply fits in a
    /// frame; `truncated` then says how many there are).
    pub fn status_json(&self, max_listed: usize) -> serde_json::Value {
        use serde_json::json;
        let cfg = &self.shared.config;
        let st = self.state();
        let now = now_ms();
        let head = st.log.head_seq();
        let source_status = v1::SourceStatus::try_from(st.source.state.state).unwrap_or_default();
        let opt_ms = |v: i64| if v > 0 { json!(v) } else { json!(null) };
        let consumers: Vec<_> = st
            .conns
            .values()
            .filter_map(|c| {
                let sub = c.attached.as_ref()?;
                let in_flight = st.subs.get(sub).map_or(0, Subscription::in_flight);
                Some(json!({
                    "pid": c.pid,
                    "client": c.name,
                    "subscription_id": sub,
                    "connected_at_unix_ms": c.connected_at_ms,
                    "delivered": c.delivered,
                    "acked": c.acked,
                    "in_flight": in_flight,
                }))
            })
            .take(max_listed)
            .collect();
        let consumers_total = st.conns.values().filter(|c| c.attached.is_some()).count();
        let mut holder: Option<(u64, &str)> = None;
        for s in st.subs.values() {
            if let Some((o, _)) = s.oldest_pending() {
                if holder.is_none_or(|(seq, _)| o.seq < seq) {
                    holder = Some((o.seq, &s.id));
                }
            }
        }
        let subs: Vec<_> = st
            .subs
            .values()
            .take(max_listed)
            .map(|s| {
                let attached_pid = s.consumer().and_then(|c| st.conns.get(&c)).map(|c| c.pid);
                let oldest = s.oldest_pending().map(|(e, _)| e);
                let head_attempts = s.oldest_pending().map_or(0, |(_, n)| n);
                let expires = s.detached_since_ms().map(|ms| ms + s.ttl.as_millis() as i64);
                let cur = s.cursor(head);
                json!({
                    "id": s.id,
                    "patterns": s.selector.pattern_strings(),
                    "filter": (!s.selector.filter_str().is_empty()).then(|| s.selector.filter_str()),
                    "owned": s.owned,
                    "upstream_subscription_id": s.upstream_id,
                    "attached_pid": attached_pid,
                    "detached_since_unix_ms": s.detached_since_ms(),
                    "expires_at_unix_ms": expires,
                    "ttl_ms": s.ttl.as_millis() as u64,
                    "created_at_unix_ms": s.created_at_ms,
                    "cursor": cur,
                    "head_seq": head,
                    "lag": head - cur,
                    "pending": s.pending_len(),
                    "in_flight": s.in_flight(),
                    "oldest_unacked_age_ms": oldest.map(|e| (now - e.received_at_unix_ms).max(0)),
                    "matched": s.counters.matched,
                    "delivered": s.counters.delivered,
                    "acked": s.counters.acked,
                    "redelivered": s.counters.redelivered,
                    "lost_to_retention": s.counters.lost,
                    "state": s.state.name(),
                    "halted": match &s.state {
                        crate::subscription::State::Halted(h) => json!({
                            "seq": h.seq,
                            "event_id": h.event_id,
                            "deliveries": h.deliveries,
                            "since_unix_ms": h.since_unix_ms,
                        }),
                        _ => json!(null),
                    },
                    "head_attempts": head_attempts,
                    "max_deliver": s.max_deliver,
                    "on_poison": crate::subscription::poison_name(s.on_poison),
                    "parked": s.parked_len(),
                    "parked_total": s.counters.parked,
                    "parked_dropped": s.counters.parked_dropped,
                    "explicit_ack": s.explicit_ack(),
                })
            })
            .collect();
        // The subscription with the oldest unacked event is the one whose
        // cursor the log's retention is protecting (or would evict first).
        let retention_held_by = holder.map(|(_, id)| id.to_owned());
        let types: Vec<_> = st
            .types
            .iter()
            .map(|(t, c)| json!({"event_type": t, "received": c.received, "duplicates": c.duplicates}))
            .collect();
        json!({
            "running": true,
            "bus": {
                "pid": std::process::id(),
                "profile": cfg.profile,
                "version": proto::BUILD,
                "protocol_version": proto::PROTOCOL_VERSION,
                "started_at_unix_ms": self.shared.started_at_ms,
                "uptime_ms": self.shared.started.elapsed().as_millis() as u64,
                "idle_timeout_ms": cfg.idle_timeout.as_millis() as u64,
                "socket": cfg.socket,
                "work_dir": cfg.work_dir,
                "connections": st.conns.len(),
                "refused": st.refused,
            },
            "source": {
                "kind": cfg.source_kind,
                "state": proto::source_status_name(source_status),
                "since_unix_ms": opt_ms(st.source.state.since_unix_ms),
                "connected_since_unix_ms": opt_ms(st.source.connected_since_ms),
                "reconnects": st.source.reconnects,
                "malformed": st.source.malformed,
                "unroutable": st.source.unroutable,
                "attempt": st.source.state.attempt,
                "next_retry_at_unix_ms": opt_ms(st.source.state.next_retry_at_unix_ms),
                "reason": (!st.source.state.reason.is_empty()).then(|| st.source.state.reason.clone()),
                "last_error": (!st.source.last_error.is_empty()).then(|| st.source.last_error.clone()),
            },
            "truncated": (consumers.len() < consumers_total || subs.len() < st.subs.len()).then(|| json!({
                "consumers_total": consumers_total,
                "subscriptions_total": st.subs.len(),
            })),
            "consumers": consumers,
            "subscriptions": subs,
            "event_types": types,
            "log": {
                "oldest_seq": st.log.oldest_seq(),
                "head_seq": head,
                "events": st.log.len(),
                "bytes": st.log.bytes(),
                "max_events": st.log.retention().max_events,
                "max_bytes": st.log.retention().max_bytes,
                "retention_held_by": retention_held_by,
            },
            "store": {
                "kind": st.store.kind,
                "durability": st.store.durability,
                "path": st.store.path,
                "durable_seq": head,
                "staged": st.staged.len(),
                "segments": st.store.segments,
                "bytes": st.store.bytes,
                "damaged": st.store.damaged,
                "last_error": st.store_error.as_deref(),
            },
        })
    }
}

fn detach_locked(st: &mut State, conn: ConnId) {
    let Some(c) = st.conns.get_mut(&conn) else {
        return;
    };
    let Some(id) = c.attached.take() else { return };
    if let Some(sub) = st.subs.get_mut(&id) {
        if sub.consumer() == Some(conn) {
            sub.detach((Instant::now(), now_ms()));
            st.subs_dirty |= !sub.owned;
        }
    }
}

/// Most distinct event types counted one by one in status; the rest are
/// counted together under [`OTHER_TYPES`], so an exec feed that invents
/// types cannot grow the map for the bus's life.
pub const MAX_EVENT_TYPES: usize = 1000;
/// The status row that counts every event type past [`MAX_EVENT_TYPES`].
pub const OTHER_TYPES: &str = "(other)";

fn count_type<'a>(
    types: &'a mut BTreeMap<String, TypeCounters>,
    event_type: &str,
) -> &'a mut TypeCounters {
    let key = if types.contains_key(event_type) || types.len() < MAX_EVENT_TYPES {
        event_type
    } else {
        OTHER_TYPES
    };
    types.entry(key.to_owned()).or_default()
}

/// The consumer's line when its subscription halts (also in the Bye).
pub fn halted_line(id: &str, seq: u64, deliveries: u32) -> String {
    format!(
        "[event] subscription {id} halted at seq {seq}: delivered {deliveries} times without ack"
    )
}

/// A subscription's delivery state, for the operator verbs.
fn subscription_doc(s: &Subscription, head: u64, with_parked: bool) -> serde_json::Value {
    use serde_json::json;
    let halted = match &s.state {
        crate::subscription::State::Halted(h) => json!({
            "seq": h.seq,
            "event_id": h.event_id,
            "deliveries": h.deliveries,
            "since_unix_ms": h.since_unix_ms,
        }),
        _ => json!(null),
    };
    let mut doc = json!({
        "id": s.id,
        "state": s.state.name(),
        "halted": halted,
        "cursor": s.cursor(head),
        "head_seq": head,
        "pending": s.pending_len(),
        "in_flight": s.in_flight(),
        "head_attempts": s.oldest_pending().map_or(0, |(_, n)| n),
        "max_deliver": s.max_deliver,
        "on_poison": crate::subscription::poison_name(s.on_poison),
        "parked": s.parked_len(),
    });
    if with_parked {
        let list: Vec<_> = s
            .parked()
            .map(|p| {
                json!({
                    "seq": p.event.seq,
                    "event_id": p.event.event_id,
                    "event_type": p.event.event_type,
                    "deliveries": p.deliveries,
                    "parked_at_unix_ms": p.parked_at_ms,
                })
            })
            .collect();
        doc["parked_events"] = json!(list);
    }
    doc
}
