//! [`StatusReader`]: the hub's status document, read-only — for the service
//! manager's status line and watchdog (`crate::notify`), which may read the
//! bus but change nothing in it.

use super::Hub;

/// What a reader of the bus's status holds of the hub (cheap to clone).
#[derive(Clone)]
pub struct StatusReader {
    hub: Hub,
}

impl Hub {
    pub(super) fn status_reader(&self) -> StatusReader {
        StatusReader { hub: self.clone() }
    }
}

impl StatusReader {
    /// See [`Hub::status_json`].
    pub fn status_json(&self, max_listed: usize) -> serde_json::Value {
        self.hub.status_json(max_listed)
    }
}
