//! [`CommitPort`]: the part of the hub the committer thread (`crate::commit`)
//! may use — take the next work (a staged batch, a snapshot to save, the
//! final save), hand back what it made durable or saved, say the store
//! failed, and time its appends. The committer holds this, never the
//! [`Hub`].

use std::{sync::Arc, time::Instant};

use super::{CommitWork, Hub};
use crate::{eventlog::LoggedEvent, store::StoreInfo};

/// What the committer holds of the hub.
pub struct CommitPort {
    hub: Hub,
}

impl Hub {
    /// The committer's port (one committer per bus).
    pub(super) fn commit_port(&self) -> CommitPort {
        CommitPort { hub: self.clone() }
    }
}

impl CommitPort {
    /// See [`Hub::next_commit_work`]: blocks until there is work.
    pub fn next_work(&self, last_save: Instant) -> CommitWork {
        self.hub.next_commit_work(last_save)
    }

    /// See [`Hub::committed`]: a batch is durable; fan it out.
    pub fn committed(&self, batch: Vec<Arc<LoggedEvent>>, info: StoreInfo) {
        self.hub.committed(batch, info);
    }

    /// See [`Hub::saved`].
    pub fn saved(&self, gen: u64, info: StoreInfo) {
        self.hub.saved(gen, info);
    }

    /// See [`Hub::store_retains_from`].
    pub fn store_retains_from(&self, floor: u64) {
        self.hub.store_retains_from(floor);
    }

    /// See [`Hub::store_failed`]: fatal, the bus stops.
    pub fn store_failed(&self, why: String) {
        self.hub.store_failed(why);
    }

    /// Records how long one append took.
    pub fn append_took(&self, took: std::time::Duration) {
        self.hub.append_latency().record(took);
    }
}
