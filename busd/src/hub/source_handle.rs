//! [`SourceHandle`]: the part of the hub a source may use — append events,
//! wait until they are durable, report its state and count bad input, end
//! the bus when its upstream is gone. Sources get this type, never a
//! [`Hub`], so "sources use only the hub's handle API" is checked by the
//! compiler.

use std::sync::Arc;

use proto::v1;
use tokio::sync::watch;

use super::{Appended, Durable, Hub, NewEvent};
use crate::upstream::Refusal;

/// What a source holds of the hub (cheap to clone).
#[derive(Clone)]
pub struct SourceHandle {
    hub: Hub,
}

impl Hub {
    /// The handle a source runs with.
    pub(super) fn source_handle(&self) -> SourceHandle {
        SourceHandle { hub: self.clone() }
    }
}

impl SourceHandle {
    /// See [`Hub::append`].
    pub fn append(&self, ev: NewEvent) -> Result<Appended, Refusal> {
        self.hub.append(ev)
    }

    /// See [`Hub::wait_durable`].
    pub async fn wait_durable(&self, seq: u64) -> Result<(), Arc<str>> {
        self.hub.wait_durable(seq).await
    }

    /// See [`Hub::durable`].
    pub fn durable(&self) -> watch::Receiver<Durable> {
        self.hub.durable()
    }

    /// See [`Hub::set_source_state`].
    pub fn set_source_state(&self, state: v1::SourceState, last_error: Option<String>) {
        self.hub.set_source_state(state, last_error);
    }

    /// See [`Hub::source_malformed`].
    pub fn source_malformed(&self, why: &str) {
        self.hub.source_malformed(why);
    }

    /// See [`Hub::source_unroutable`].
    pub fn source_unroutable(&self, reason: &'static str, detail: &str) {
        self.hub.source_unroutable(reason, detail);
    }

    /// Ends the bus (a source whose upstream is gone for good: SOURCE_LOST).
    pub fn trigger_shutdown(&self, reason: v1::ByeReason) {
        self.hub.shutdown_trigger().trigger(reason);
    }
}
