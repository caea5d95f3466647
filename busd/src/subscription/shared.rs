//! The shared-delivery side of a [`Subscription`] (a cluster's
//! `--delivery shared`): events enter `pending` only when this host claimed
//! them; what it holds is renewed, acked ones are done, a leaving consumer
//! gives everything back; the seq the subscription starts after on every
//! host; and events no host delivered before retention took them, counted
//! lost here when this host reports them.

use std::sync::Arc;

use super::{Entry, Slot, Subscription};
use crate::eventlog::LoggedEvent;

impl Subscription {
    /// Shared delivery: an event this host claimed, delivered for the
    /// `deliveries`-th time (a claim taken over from a host that died counts
    /// again, so the delivery is marked redelivered). Kept in seq order.
    pub fn push_claimed(&mut self, event: Arc<LoggedEvent>, deliveries: u32) -> bool {
        let Err(at) = self
            .pending
            .binary_search_by_key(&event.seq, |e| e.event.seq)
        else {
            return false;
        };
        self.pending.insert(
            at,
            Entry {
                event,
                slot: Slot::Unsent.into(),
                deliveries: deliveries.saturating_sub(1),
                sent: 0,
            },
        );
        self.counters.matched += 1;
        self.reopen(at);
        true
    }

    /// Whether `seq` is pending here (claimed by this host, not yet acked).
    pub fn holds(&self, seq: u64) -> bool {
        self.pending
            .binary_search_by_key(&seq, |e| e.event.seq)
            .is_ok_and(|i| self.pending[i].slot.get() != Slot::Acked)
    }

    /// Shared delivery, the consumer left: everything not acked is given
    /// back (the claims are released, so another host delivers them).
    pub fn release_all(&mut self) -> Vec<u64> {
        let seqs = self
            .pending
            .iter()
            .filter(|e| e.slot.get() != Slot::Acked)
            .map(|e| e.event.seq)
            .collect();
        self.pending.clear();
        self.in_flight = 0;
        self.acked_in_queue = 0;
        self.rescan();
        seqs
    }

    /// Shared delivery: room for more claims (within the window).
    pub fn claim_room(&self) -> usize {
        self.window.saturating_sub(self.pending_len())
    }

    /// Shared delivery: the seqs this host holds a claim for (pending here,
    /// not acked): what it renews.
    pub fn held_seqs(&self) -> Vec<u64> {
        self.pending
            .iter()
            .filter(|e| e.slot.get() != Slot::Acked)
            .map(|e| e.event.seq)
            .collect()
    }

    /// Shared delivery: the subscription starts after this seq on every
    /// host; older events are never claimed for it.
    pub fn shared_from(&self) -> u64 {
        self.shared_from
    }

    /// Shared delivery: starts after `seq` (created, adopted, restored, or
    /// moved by `seek`).
    pub fn set_shared_from(&mut self, seq: u64) {
        self.shared_from = seq;
    }

    /// Shared delivery: whether retention evicting `e` from this host's log
    /// may be a loss of the subscription (an event it selects, after its
    /// start, that this host does not hold): the cluster decides whether
    /// any host delivered it.
    pub fn may_lose_shared(&self, e: &LoggedEvent) -> bool {
        self.shared
            && !e.damaged
            && e.seq > self.shared_from
            && self.selects(e)
            && !self.holds(e.seq)
    }

    /// Shared delivery: `n` events of this subscription no host delivered
    /// before retention took them; reported to the next consumer here by a
    /// gap, and counted lost.
    pub fn lost_shared(&mut self, n: u64) {
        self.gaps.lost(n, None);
        self.counters.lost += n;
    }
}
