//! [`ReplicaPort`]: the part of the hub a cluster host (`crate::cluster`)
//! may use — publishes forwarded from other hosts, the owner's log
//! replicated into this host's, shared delivery's claims, the lease lost,
//! the cluster's status and definitions adopted from the database, and the
//! log's ends and times it asks about. The cluster holds this (and a
//! [`SourceHandle`] for the upstream it leases), never the [`Hub`].

use std::{collections::BTreeMap, sync::Arc};

use proto::v1;
use tokio::sync::watch;

use super::{Appended, Durable, Hub, HubConfig, NewEvent, SharedWant, SharedWork, SourceHandle};
use crate::{eventlog::LoggedEvent, store::SubRecord, upstream::Refusal};

/// What the cluster holds of the hub (cheap to clone).
#[derive(Clone)]
pub struct ReplicaPort {
    hub: Hub,
}

impl Hub {
    pub(super) fn replica_port(&self) -> ReplicaPort {
        ReplicaPort { hub: self.clone() }
    }
}

impl ReplicaPort {
    pub fn config(&self) -> &HubConfig {
        self.hub.config()
    }

    /// The handle the leased upstream source runs with.
    pub fn source_handle(&self) -> SourceHandle {
        self.hub.source_handle()
    }

    // The log.

    /// See [`Hub::append`] (a publish forwarded to this host, the owner).
    pub fn append(&self, ev: NewEvent) -> Result<Appended, Refusal> {
        self.hub.append(ev)
    }

    pub fn durable(&self) -> watch::Receiver<Durable> {
        self.hub.durable()
    }

    /// See [`Hub::wait_durable`].
    pub async fn wait_durable(&self, seq: u64) -> Result<(), Arc<str>> {
        self.hub.wait_durable(seq).await
    }

    /// See [`Hub::replicated`]: the owner's events, in this host's log.
    pub fn replicated(&self, batch: Vec<Arc<LoggedEvent>>) {
        self.hub.replicated(batch);
    }

    pub fn head_seq(&self) -> u64 {
        self.hub.head_seq()
    }

    pub fn oldest_seq(&self) -> Option<u64> {
        self.hub.oldest_seq()
    }

    /// See [`Hub::seq_at_time`].
    pub fn seq_at_time(&self, ms: i64) -> u64 {
        self.hub.seq_at_time(ms)
    }

    /// Wakes whoever waits for the log (a publish this host forwarded).
    pub fn nudge_waiters(&self) {
        self.hub.nudge_waiters();
    }

    // Subscriptions.

    pub fn has_subscription(&self, id: &str) -> bool {
        self.hub.has_subscription(id)
    }

    /// See [`Hub::adopt`]: definitions other hosts made.
    pub fn adopt(&self, records: Vec<SubRecord>) -> usize {
        self.hub.adopt(records)
    }

    // Shared delivery.

    /// See [`Hub::shared_wants`].
    pub fn shared_wants(&self, skip: impl Fn(&str, u64) -> bool) -> Vec<SharedWant> {
        self.hub.shared_wants(skip)
    }

    /// See [`Hub::offer_claimed`].
    pub fn offer_claimed(&self, subscription: &str, claimed: &[(u64, u32)]) -> Vec<u64> {
        self.hub.offer_claimed(subscription, claimed)
    }

    pub fn take_shared_work(&self) -> SharedWork {
        self.hub.take_shared_work()
    }

    pub fn shared_held(&self) -> BTreeMap<String, Vec<u64>> {
        self.hub.shared_held()
    }

    pub fn shared_ids(&self) -> Vec<String> {
        self.hub.shared_ids()
    }

    pub fn shared_attached(&self) -> Vec<String> {
        self.hub.shared_attached()
    }

    /// See [`Hub::shared_lost`].
    pub fn shared_lost(&self, subscription: &str, n: u64) {
        self.hub.shared_lost(subscription, n);
    }

    // The host's standing.

    pub fn set_source_state(&self, state: v1::SourceState, last_error: Option<String>) {
        self.hub.set_source_state(state, last_error);
    }

    pub fn set_cluster_status(&self, doc: proto::status::ClusterDoc) {
        self.hub.set_cluster_status(doc);
    }

    /// See [`Hub::lease_lost`].
    pub fn lease_lost(&self, why: String) {
        self.hub.lease_lost(why);
    }

    /// See [`Hub::store_failed`].
    pub fn store_failed(&self, why: String) {
        self.hub.store_failed(why);
    }
}
