//! The cluster's side of a shared [`Subscription`] (`--delivery shared`
//! on a cluster host, [`Subscription::set_claimed`]): events enter
//! `pending` only when this host claimed them; what it holds is renewed,
//! acked ones are done, the last consumer leaving gives everything back;
//! the seq the subscription starts after on every host; and events no host
//! delivered before retention took them, counted lost here when this host
//! reports them. (On one host a shared subscription is fed like any other;
//! its consumers share it: `workers`.)

use std::sync::Arc;

use super::{Entry, Slot, Subscription};
use crate::eventlog::LoggedEvent;

impl Subscription {
    /// A shared subscription on a cluster host (`clustered`) is fed by this
    /// host's claims: what a restore put in `pending` is claimed again (its
    /// claims expired or are taken back), not kept.
    pub fn set_claimed(&mut self, clustered: bool) {
        self.claimed = self.shared && clustered;
        if self.claimed {
            self.pending.clear();
            self.filtering = 0;
            self.none_in_flight();
            self.rescan();
        }
    }

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
                owner: 0,
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
        self.none_in_flight();
        self.acked_in_queue = 0;
        self.rescan();
        seqs
    }

    /// Shared delivery: room for more claims (within the window).
    pub fn claim_room(&self) -> usize {
        self.windows().saturating_sub(self.pending_len())
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
        self.claimed
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
