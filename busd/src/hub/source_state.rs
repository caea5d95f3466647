//! The source's side of the hub: its state (pushed to consumers, shown by
//! status) with a lock-free generation for change detection, and its
//! counters (malformed input, unroutable frames, reconnects).

use std::{collections::BTreeMap, sync::atomic::Ordering};

use proto::v1;

use super::Hub;

/// What status shows about the source.
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

impl Hub {
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
}
