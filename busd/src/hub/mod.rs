//! [`Hub`]: the bus's shared state — event log, dedup window, subscriptions,
//! connections, source state and counters — behind one cloneable handle.
//! This file owns the handle and the state it guards; its constructor
//! (recovery from what the store returned) is `recover`.
//!
//! The state is a few owned parts, each a struct with private fields and
//! `&mut self` methods, in the file that does its job:
//!
//! - `ingest::Ingest`: seq counter, staged events, dedup window (`dedup`),
//!   per-type counters: staging an event;
//! - `registry::Registry`: subscriptions, connections and who consumes
//!   what, the activity generation, TTL removals;
//! - `store_work::Persistence`: dirty flag, save generations, store info,
//!   store error, lease lost, closing;
//! - `source_state::SourcePart`: the source's state, generation, counters;
//! - `refused::Refused`, `shared::SharedWork`, and the log (`eventlog`).
//!
//! The `Hub` methods, in `impl Hub` blocks by job, lock, call methods on
//! the parts, and wake whoever must know after the guard is dropped:
//!
//! - `subscribe`: subscribe, attach, unsubscribe, stop, upstream release;
//! - `delivery`: `append`, fan-out of committed batches and retention
//!   (`committed`, `replicated`), `pull` and `ack`;
//! - `store_work`: the committer's work queue (`next_commit_work`),
//!   snapshots, `saved`, `store_failed`, `close_store`, `wait_durable`;
//! - `control`: the operator verbs (`dws event subscription VERB`);
//! - `status`: the status document and the subscription document;
//! - `housekeeping`: the idle timer and the TTL reaper;
//! - `source_state`: the source's state and counters;
//! - `refused`: the clients refused at a bound, the global input bound;
//! - `shared`: the hub's side of shared delivery (cluster claims);
//! - `filtering`: what the `--where` filter thread takes and gives back.
//!
//! `Hub` is private to this module: each caller holds the handle of its
//! role, in the file of that role, and can call only what the role may do:
//!
//! - [`Session`] (`session`): one client connection — publish, subscribe,
//!   pull and ack, verbs, status; opened by the accept loop's [`Sessions`],
//!   unregistered on drop;
//! - [`CommitPort`] (`commit_port`): the committer thread;
//! - [`ReplicaPort`] (`replica_port`): a cluster host's link;
//! - [`SourceHandle`] (`source_handle`): a source;
//! - [`FilterHandle`] (`filtering`): the `--where` filter thread;
//! - [`StatusReader`] (`status_reader`): the service manager's notifier;
//! - [`HubOwner`] (`owner`): the bus's main — makes the hub, hands out the
//!   handles, runs its tasks, closes the store.
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

mod commit_port;
mod control;
mod dedup;
mod delivery;
mod filtering;
mod housekeeping;
pub use housekeeping::requested_ttl;
mod ingest;
mod owner;
mod recover;
mod refused;
mod registry;
mod relay;
mod replica_port;
mod session;
mod shared;
mod source_handle;
mod source_state;
mod status;
mod status_reader;
mod store_work;
mod subscribe;
#[cfg(test)]
mod tests;

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize},
        Arc, Condvar, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use tokio::sync::{watch, Notify};

pub use self::{
    commit_port::CommitPort,
    delivery::{halted_line, Delivery},
    filtering::{FilterBatch, FilterHandle},
    ingest::{Appended, MAX_EVENT_TYPES, OTHER_TYPES},
    owner::HubOwner,
    refused::{Refused, RefusedKind, MAX_BUFFERED_INPUT},
    registry::ConnHandle,
    replica_port::ReplicaPort,
    session::{Session, Sessions},
    shared::{SharedWant, SharedWork},
    source_handle::SourceHandle,
    source_state::SourceInfo,
    status_reader::StatusReader,
    store_work::{CommitWork, Durable, SAVE_INTERVAL},
};
use self::{ingest::Ingest, registry::Registry, source_state::SourcePart, store_work::Persistence};
pub use crate::eventlog::NewEvent;
pub use crate::subscription::ConnId;
use crate::{
    eventlog::{EventLog, Retention},
    shutdown::ShutdownTrigger,
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

/// The bus state under the one lock: each part owns its fields and is
/// changed only through its methods (the log is `eventlog`'s).
struct State {
    /// The durable, retained log: what consumers read.
    log: EventLog,
    /// Seq counter, staged events, dedup window, per-type counters.
    ingest: Ingest,
    /// Subscriptions, connections, activity, TTL removals.
    registry: Registry,
    /// Dirty flag, save generations, store info and how the store ends.
    persist: Persistence,
    /// The source's state and counters.
    source: SourcePart,
    refused: Refused,
    /// `store = "postgres"`: the cluster as the link last read it.
    cluster: Option<proto::status::ClusterDoc>,
    /// Shared subscriptions' events acked here, and those given back by a
    /// consumer that left: for the claims in the cluster (`shared`).
    shared_work: shared::SharedWork,
    /// Subscriptions with events waiting for their `--where` verdict.
    filter_queue: filtering::FilterQueue,
}

impl State {
    /// Detaches `conn` (see [`Registry::detach`]); what a shared
    /// subscription gave back goes to the claims. `true` when a named
    /// subscription changed (it must be saved); with it the consumers to
    /// wake (after the lock): a shared subscription's others, which take
    /// what `conn` had in flight.
    fn detach(&mut self, conn: ConnId) -> (bool, Vec<Arc<ConnHandle>>) {
        let detached = self.registry.detach(conn);
        if let Some((id, seqs)) = detached.given_back {
            self.shared_work.released(&id, seqs);
        }
        let wake = detached
            .others_take
            .and_then(|id| self.registry.get(&id))
            .map(|s| self.registry.handles_of(s))
            .unwrap_or_default();
        (detached.named, wake)
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the committer: something staged, dirty, or closing.
    commit_wake: Condvar,
    /// Wakes the filter thread: a subscription has events to judge.
    filter_wake: Condvar,
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
    /// Wake-ups the committer hands to the runtime (`relay`).
    relay: Mutex<relay::Pending>,
    relay_wake: Notify,
    /// The relay task runs.
    relay_on: AtomicBool,
}

/// Cloneable handle to the bus state. Private to this module: every
/// caller outside holds the handle of its role (see the module header).
#[derive(Clone)]
struct Hub {
    shared: Arc<Shared>,
}

/// Locks a mutex, recovering from poisoning: the state stays consistent
/// because no critical section can panic half-way through an update that
/// later code depends on.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Hub {
    /// How long appends to the store take: the committer records, status
    /// reads.
    pub(super) fn append_latency(&self) -> &crate::latency::Histogram {
        &self.shared.append_latency
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    pub(super) fn config(&self) -> &HubConfig {
        &self.shared.config
    }

    /// The cluster as last read, for status.
    pub(super) fn set_cluster_status(&self, doc: proto::status::ClusterDoc) {
        self.state().cluster = Some(doc);
    }

    /// Wakes every connection waiting on the store's progress (a forwarded
    /// publish was answered).
    pub(super) fn nudge_waiters(&self) {
        self.shared.durable.send_modify(|d| d.forwarded += 1);
    }

    pub fn shutdown_trigger(&self) -> &ShutdownTrigger {
        &self.shared.shutdown
    }

    fn touch(&self, st: &mut State) {
        st.registry.touch();
        self.shared.housekeeping.notify_one();
    }

    // ------------------------------------------------------------ connections

    /// A new connection: not activity yet (a client that only reads status
    /// never keeps the bus up), until [`Hub::mark_active`].
    pub(super) fn register_conn(&self) -> (ConnId, Arc<ConnHandle>) {
        self.state().registry.register()
    }

    /// `conn` did something that keeps the bus up (it consumes, publishes,
    /// or changes something): the idle timer starts again when it leaves.
    pub(super) fn mark_active(&self, conn: ConnId) {
        let mut st = self.state();
        if st.registry.mark_active(conn) {
            self.touch(&mut st);
        }
    }

    pub(super) fn identify_conn(&self, conn: ConnId, pid: u32, name: &str) {
        self.state().registry.identify(conn, pid, name);
    }

    pub(super) fn unregister_conn(&self, conn: ConnId) {
        let mut st = self.state();
        let active = st.registry.was_active(conn);
        let wake = self.detach_and_mark(&mut st, conn);
        st.registry.unregister(conn);
        if active {
            self.touch(&mut st);
        }
        drop(st);
        wake_all(wake);
    }

    /// Detaches `conn` from its subscription (a clean Bye, or the connection
    /// closing): its in-flight events become pending again for redelivery.
    pub(super) fn detach(&self, conn: ConnId) {
        let mut st = self.state();
        let wake = self.detach_and_mark(&mut st, conn);
        // A goodbye after reading status is not activity.
        if st.registry.was_active(conn) {
            self.touch(&mut st);
        }
        drop(st);
        wake_all(wake);
    }

    /// [`State::detach`], waking the committer if that changed a named
    /// subscription. Returns the consumers to wake once the lock is gone.
    #[must_use]
    fn detach_and_mark(&self, st: &mut State, conn: ConnId) -> Vec<Arc<ConnHandle>> {
        let (named, wake) = st.detach(conn);
        if named {
            self.mark_subs_dirty(st);
        }
        wake
    }
}

/// Wakes connections (after the hub lock is dropped).
fn wake_all(handles: Vec<Arc<ConnHandle>>) {
    for h in handles {
        h.wake.notify_one();
    }
}
