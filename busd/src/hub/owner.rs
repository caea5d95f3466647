//! [`HubOwner`]: what the bus's main (`crate::run`) holds of the hub — it
//! makes the hub from what the store recovered, hands each role its handle
//! ([`Sessions`] to the accept loop, [`CommitPort`] to the committer,
//! [`ReplicaPort`] to the cluster, [`SourceHandle`] to a source,
//! [`FilterHandle`] to the filter thread, [`StatusReader`] to the service
//! manager's notifier), runs the hub's own tasks, and at the end closes the
//! store and reads whether it failed. It has no data-path method: events,
//! subscriptions and status go through the role handles.

use std::{future::Future, sync::Arc};

use super::{
    CommitPort, FilterHandle, Hub, HubConfig, ReplicaPort, Sessions, SourceHandle, StatusReader,
};
use crate::{
    shutdown::{Shutdown, ShutdownTrigger},
    store::{dedup_ids::Entry, Recovered, Snapshot, StoreInfo},
    upstream::UpstreamControl,
};

/// The one owner of the hub (not cloneable: one per bus).
pub struct HubOwner {
    hub: Hub,
}

impl HubOwner {
    /// Makes the hub from what the store recovered (see `recover`).
    pub fn new(
        config: HubConfig,
        shutdown: ShutdownTrigger,
        upstream: Option<Arc<dyn UpstreamControl>>,
        recovered: Recovered,
        store: StoreInfo,
    ) -> HubOwner {
        HubOwner {
            hub: Hub::new(config, shutdown, upstream, recovered, store),
        }
    }

    /// See [`Hub::seed_dedup`].
    pub fn seed_dedup(&self, older: &[Entry]) {
        self.hub.seed_dedup(older);
    }

    /// See [`Hub::startup_snapshot`].
    pub fn startup_snapshot(&self) -> Snapshot {
        self.hub.startup_snapshot()
    }

    // The role handles.

    pub fn sessions(&self) -> Sessions {
        self.hub.sessions()
    }

    pub fn commit_port(&self) -> CommitPort {
        self.hub.commit_port()
    }

    pub fn replica_port(&self) -> ReplicaPort {
        self.hub.replica_port()
    }

    pub fn source_handle(&self) -> SourceHandle {
        self.hub.source_handle()
    }

    pub fn filter_handle(&self) -> FilterHandle {
        self.hub.filter_handle()
    }

    pub fn status_reader(&self) -> StatusReader {
        self.hub.status_reader()
    }

    // The hub's own tasks.

    /// The idle timer and the TTL reaper, until `shutdown`.
    pub fn housekeeping(&self, shutdown: Shutdown) -> impl Future<Output = ()> + Send + 'static {
        self.hub.clone().housekeeping(shutdown)
    }

    /// Passes the committer's wake-ups on to the tasks (runs as long as the
    /// runtime).
    pub fn wake_relay(&self) -> impl Future<Output = ()> + Send + 'static {
        self.hub.clone().wake_relay()
    }

    // The end.

    /// See [`Hub::close_store`].
    pub fn close_store(&self) {
        self.hub.close_store();
    }

    pub fn store_error(&self) -> Option<Arc<str>> {
        self.hub.store_error()
    }
}
