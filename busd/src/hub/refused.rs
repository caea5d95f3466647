//! Clients refused because they hit a bound (docs/guide.md "Limits"): the
//! [`Refused`] counters shown by status, and the global bound on partially
//! received input that all connections share ([`Hub::charge_input`]).

use std::sync::atomic::Ordering;

use super::Hub;

/// Clients refused because they hit a bound (see docs/guide.md "Limits").
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

impl Hub {
    /// Sets a connection's charge against the global input bound to `want`
    /// bytes (`charged` is what it holds now). `false` when the bound would
    /// be passed: the connection must refuse its client.
    /// A connection stopped (`true`) or resumed (`false`) reading its
    /// client's requests because its replies pile up unread.
    pub(super) fn reader_paused(&self, paused: bool) {
        if paused {
            self.shared.paused_readers.fetch_add(1, Ordering::Relaxed);
        } else {
            self.shared.paused_readers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// How many connections are paused now (for status).
    pub fn paused_readers(&self) -> u64 {
        self.shared.paused_readers.load(Ordering::Relaxed) as u64
    }

    pub(super) fn charge_input(&self, charged: &mut usize, want: usize) -> bool {
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
    pub(super) fn count_refused(&self, kind: RefusedKind) {
        self.state().refused.count(kind);
    }
}

impl Refused {
    /// Counts one refusal of `kind`.
    pub(super) fn count(&mut self, kind: RefusedKind) {
        match kind {
            RefusedKind::Connections => self.connections += 1,
            RefusedKind::InputBudget => self.input_budget += 1,
            RefusedKind::SlowClient => self.slow_clients += 1,
            RefusedKind::BadFrame => self.bad_frames += 1,
            RefusedKind::TooLargeEvent => self.too_large_events += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_counts_in_its_own_counter() {
        let mut r = Refused::default();
        for kind in [
            RefusedKind::Connections,
            RefusedKind::InputBudget,
            RefusedKind::InputBudget,
            RefusedKind::SlowClient,
            RefusedKind::BadFrame,
            RefusedKind::TooLargeEvent,
        ] {
            r.count(kind);
        }
        assert_eq!(
            (
                r.connections,
                r.input_budget,
                r.slow_clients,
                r.bad_frames,
                r.too_large_events
            ),
            (1, 2, 1, 1, 1)
        );
    }
}
