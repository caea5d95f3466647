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

/// The source's part of the hub state: what status shows and the
/// generation connections compare to notice a change.
#[derive(Debug, Default)]
pub(super) struct SourcePart {
    info: SourceInfo,
    gen: u64,
}

impl SourcePart {
    /// Connecting, since `since_unix_ms`.
    pub(super) fn new(since_unix_ms: i64) -> SourcePart {
        SourcePart {
            info: SourceInfo {
                state: v1::SourceState {
                    state: v1::SourceStatus::Connecting as i32,
                    since_unix_ms,
                    ..Default::default()
                },
                ..Default::default()
            },
            gen: 0,
        }
    }

    /// A new state (and the last error, if any): counts reconnects, notes
    /// when it connected; returns the new generation.
    pub(super) fn set_state(&mut self, state: v1::SourceState, last_error: Option<String>) -> u64 {
        let status = v1::SourceStatus::try_from(state.state).unwrap_or_default();
        if status == v1::SourceStatus::Connected {
            self.info.connected_since_ms = state.since_unix_ms;
        }
        if status == v1::SourceStatus::Reconnecting {
            self.info.reconnects += 1;
        }
        if let Some(e) = last_error {
            self.info.last_error = e;
        }
        self.info.state = state;
        self.gen += 1;
        self.gen
    }

    pub(super) fn malformed(&mut self, why: &str) {
        self.info.malformed += 1;
        self.info.last_error = format!("malformed input: {why}");
    }

    pub(super) fn unroutable(&mut self, reason: &'static str, detail: &str) {
        *self.info.unroutable.entry(reason).or_insert(0) += 1;
        self.info.last_error = format!("unroutable frame ({reason}): {detail}");
    }

    pub(super) fn info(&self) -> &SourceInfo {
        &self.info
    }

    /// The state and its generation.
    pub(super) fn state(&self) -> (v1::SourceState, u64) {
        (self.info.state.clone(), self.gen)
    }
}

impl Hub {
    pub(super) fn set_source_state(&self, state: v1::SourceState, last_error: Option<String>) {
        let mut st = self.state();
        let gen = st.source.set_state(state, last_error);
        self.shared.source_gen.store(gen, Ordering::Release);
        let handles = st.registry.consumer_handles();
        drop(st);
        for h in handles {
            h.wake.notify_one();
        }
    }

    /// Counts and logs one piece of upstream input that is not a valid event.
    pub(super) fn source_malformed(&self, why: &str) {
        tracing::warn!(cause = %why, "malformed upstream input skipped");
        self.state().source.malformed(why);
    }

    /// Counts one upstream frame that was acked but could not be routed.
    /// The caller logs it (rate-limited); this only counts it for `status`.
    pub(super) fn source_unroutable(&self, reason: &'static str, detail: &str) {
        self.state().source.unroutable(reason, detail);
    }

    /// The source state's generation, without taking the lock.
    pub(super) fn source_gen(&self) -> u64 {
        self.shared.source_gen.load(Ordering::Acquire)
    }

    /// The source state and its generation (to detect changes).
    pub(super) fn source_state(&self) -> (v1::SourceState, u64) {
        self.state().source.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(s: v1::SourceStatus, since: i64) -> v1::SourceState {
        v1::SourceState {
            state: s as i32,
            since_unix_ms: since,
            ..Default::default()
        }
    }

    #[test]
    fn every_state_change_moves_the_generation_and_reconnects_are_counted() {
        let mut p = SourcePart::new(1);
        assert_eq!(p.state().1, 0);
        assert_eq!(p.set_state(state(v1::SourceStatus::Connected, 10), None), 1);
        assert_eq!(p.info().connected_since_ms, 10);
        let gen = p.set_state(
            state(v1::SourceStatus::Reconnecting, 20),
            Some("reset".into()),
        );
        assert_eq!(gen, 2);
        assert_eq!(p.info().reconnects, 1);
        assert_eq!(p.info().last_error, "reset");
        // Connected again: the error stays until another one replaces it.
        p.set_state(state(v1::SourceStatus::Connected, 30), None);
        assert_eq!(p.info().connected_since_ms, 30);
        assert_eq!(p.info().last_error, "reset");
        assert_eq!(p.state().1, 3);
    }

    #[test]
    fn malformed_and_unroutable_input_is_counted_without_a_state_change() {
        let mut p = SourcePart::new(1);
        p.malformed("not json");
        p.unroutable("no-route", "a");
        p.unroutable("no-route", "b");
        assert_eq!(p.info().malformed, 1);
        assert_eq!(p.info().unroutable.get("no-route"), Some(&2));
        assert_eq!(p.info().last_error, "unroutable frame (no-route): b");
        assert_eq!(p.state().1, 0);
    }
}
