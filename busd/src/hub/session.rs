//! [`Session`]: what one client connection may ask of the hub — publish,
//! subscribe and unsubscribe, pull and ack its deliveries, the operator
//! verbs, reading an event and the status, stopping consumers or the bus —
//! and [`Sessions`], the accept loop's door, which opens one per accepted
//! connection. A session is registered when it is opened and unregistered
//! when it is dropped (its events in flight become pending again), so a
//! connection cannot forget to leave. Connections get this type, never the
//! [`Hub`]; every method acts for the session's own connection.

use std::{sync::Arc, time::Instant};

use proto::v1;
use tokio::sync::{watch, Notify};

use super::{
    Appended, ConnHandle, ConnId, Delivery, Durable, Hub, HubConfig, NewEvent, RefusedKind,
};
use crate::{
    eventlog::LineBytes,
    upstream::{Refusal, UpstreamControl, UpstreamId},
};

/// The accept loop's door to the hub: opens sessions, counts the clients
/// refused before they had one, and shares the line ring's bytes.
#[derive(Clone)]
pub struct Sessions {
    hub: Hub,
}

impl Hub {
    /// The door the accept loop holds.
    pub(super) fn sessions(&self) -> Sessions {
        Sessions { hub: self.clone() }
    }
}

impl Sessions {
    /// Registers a new connection and returns its session.
    pub fn open(&self) -> Session {
        let (id, handle) = self.hub.register_conn();
        Session {
            hub: self.hub.clone(),
            id,
            handle,
        }
    }

    /// See [`Hub::count_refused`].
    pub fn count_refused(&self, kind: RefusedKind) {
        self.hub.count_refused(kind);
    }

    /// See [`Hub::line_bytes`].
    pub fn line_bytes(&self) -> LineBytes {
        self.hub.line_bytes()
    }
}

/// One connection's end of the hub; unregisters the connection on drop.
pub struct Session {
    hub: Hub,
    id: ConnId,
    handle: Arc<ConnHandle>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.hub.unregister_conn(self.id);
    }
}

impl Session {
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// Woken when the hub has something for this connection.
    pub fn wake(&self) -> &Notify {
        &self.handle.wake
    }

    /// The reason the hub asked this connection to leave, once.
    pub fn take_kick(&self) -> Option<v1::ByeReason> {
        self.handle.take_kick()
    }

    pub fn config(&self) -> &HubConfig {
        self.hub.config()
    }

    /// The client said who it is (Hello).
    pub fn identify(&self, pid: u32, name: &str) {
        self.hub.identify_conn(self.id, pid, name);
    }

    /// See [`Hub::mark_active`].
    pub fn mark_active(&self) {
        self.hub.mark_active(self.id);
    }

    /// See [`Hub::append`].
    pub fn append(&self, ev: NewEvent) -> Result<Appended, Refusal> {
        self.hub.append(ev)
    }

    pub fn durable(&self) -> watch::Receiver<Durable> {
        self.hub.durable()
    }

    /// See [`Hub::subscribe`].
    pub fn subscribe(
        &self,
        req: &v1::Subscribe,
        upstream_id: Option<UpstreamId>,
    ) -> Result<(v1::Subscribed, Option<u64>), Refusal> {
        self.hub.subscribe(self.id, req, upstream_id)
    }

    /// See [`Hub::upstream_for`].
    pub fn upstream_for(&self, req: &v1::Subscribe) -> Option<Arc<dyn UpstreamControl>> {
        self.hub.upstream_for(req)
    }

    pub fn has_upstream_control(&self) -> bool {
        self.hub.has_upstream_control()
    }

    /// See [`Hub::unsubscribe`].
    pub fn unsubscribe(&self, ids: &[String]) -> (Vec<String>, Vec<String>, Option<u64>) {
        self.hub.unsubscribe(self.id, ids)
    }

    /// See [`Hub::detach`].
    pub fn detach(&self) {
        self.hub.detach(self.id);
    }

    /// See [`Hub::pull`].
    pub fn pull(&self, max_events: usize, max_bytes: usize) -> (Option<Delivery>, Option<Instant>) {
        self.hub.pull(self.id, max_events, max_bytes)
    }

    /// See [`Hub::expire_held`].
    pub fn expire_held(&self) -> Option<Instant> {
        self.hub.expire_held(self.id)
    }

    /// See [`Hub::ack`].
    pub fn ack(&self, ack: &v1::Ack) {
        self.hub.ack(self.id, ack);
    }

    /// See [`Hub::control`].
    pub fn control(
        &self,
        req: &v1::SubscriptionControl,
    ) -> Result<(serde_json::Value, Option<u64>), Refusal> {
        self.hub.control(req)
    }

    /// See [`Hub::get_event`].
    pub fn get_event(&self, seq: u64) -> Option<v1::Event> {
        self.hub.get_event(seq)
    }

    pub fn head_seq(&self) -> u64 {
        self.hub.head_seq()
    }

    /// See [`Hub::status_json`].
    pub fn status_json(&self, max_listed: usize) -> serde_json::Value {
        self.hub.status_json(max_listed)
    }

    pub fn source_gen(&self) -> u64 {
        self.hub.source_gen()
    }

    pub fn source_state(&self) -> (v1::SourceState, u64) {
        self.hub.source_state()
    }

    pub fn consumer_pids(&self) -> Vec<u32> {
        self.hub.consumer_pids()
    }

    /// See [`Hub::stop_consumers`].
    pub fn stop_consumers(&self, ids: &[String], dry_run: bool) -> v1::StopReply {
        self.hub.stop_consumers(ids, dry_run)
    }

    /// Ends the whole bus (`dws event stop`).
    pub fn stop_bus(&self) {
        self.hub
            .shutdown_trigger()
            .trigger(v1::ByeReason::StopRequest);
    }

    pub fn store_error(&self) -> Option<Arc<str>> {
        self.hub.store_error()
    }

    /// See [`Hub::store_failed`].
    pub fn store_failed(&self, why: String) {
        self.hub.store_failed(why);
    }

    /// See [`Hub::count_refused`].
    pub fn count_refused(&self, kind: RefusedKind) {
        self.hub.count_refused(kind);
    }

    /// See [`Hub::reader_paused`].
    pub fn reader_paused(&self, paused: bool) {
        self.hub.reader_paused(paused);
    }

    /// See [`Hub::charge_input`].
    pub fn charge_input(&self, charged: &mut usize, want: usize) -> bool {
        self.hub.charge_input(charged, want)
    }
}
