//! A subscription's acks: cumulative (`Ack.seq`, in delivery order), one
//! event at a time (`Ack.seqs`) and by runs of consecutive seqs
//! (`Ack.runs`); each marks the events in flight here acked, and
//! [`Subscription::settle`] drops the acked ones from the queue's front.

use super::{Slot, Subscription};

impl Subscription {
    /// Drops acked events from the front; returns how many were acked now.
    pub(super) fn settle(&mut self, newly: u64) -> u64 {
        while self.pending.front().is_some_and(|e| e.slot.is_acked()) {
            self.acked_in_queue -= 1;
            self.drop_front();
        }
        self.counters.acked += newly;
        newly
    }

    fn ack_entry(&mut self, i: usize) -> bool {
        if self.in_flight_here(i) {
            self.alive();
            self.pending[i].slot.set(Slot::Acked);
            self.left_flight(i);
            self.acked_in_queue += 1;
            self.gaps.read_past(self.pending[i].sent);
            true
        } else {
            false
        }
    }

    /// Cumulative ack (`Ack.seq`): the consumer wrote every event delivered
    /// up to and including the delivery of `seq` now in flight. Settles
    /// those, in delivery order, not seq order: an event replayed or
    /// redelivered behind higher seqs is not settled by an ack of a higher
    /// seq sent before it. A seq not in flight settles nothing. Returns the
    /// seqs acked.
    pub(super) fn ack(&mut self, seq: u64) -> Vec<u64> {
        let mut acked = Vec::new();
        let Ok(i) = self.position(seq) else {
            return acked;
        };
        if !self.in_flight_here(i) {
            return acked;
        }
        let upto = self.pending[i].sent;
        // In-flight events are at most a window: stop after the last one.
        let mut left = self.in_flight;
        let mut j = 0;
        while left > 0 && j < self.pending.len() {
            if self.pending[j].slot.is_in_flight() {
                left -= 1;
                if self.pending[j].sent <= upto && self.ack_entry(j) {
                    acked.push(self.pending[j].event.seq);
                }
            }
            j += 1;
        }
        self.settle(acked.len() as u64);
        acked
    }

    /// Acks one in-flight event (explicit acks). Returns whether it was one.
    pub(super) fn ack_one(&mut self, seq: u64) -> bool {
        let Ok(i) = self.position(seq) else {
            return false;
        };
        let acked = self.ack_entry(i);
        self.settle(u64::from(acked));
        acked
    }

    /// Acks the events in flight here with a seq in `first..=last` (a run
    /// of `Ack.runs`), each as [`Self::ack_one`] would. Walks the pending
    /// entries of the run, never the run's width: a run wider than the
    /// queue costs the queue. Returns how many were acked, and pushes their
    /// seqs on `acked` when it is given (a claimed subscription's claims
    /// learn them).
    pub(super) fn ack_run(
        &mut self,
        first: u64,
        last: u64,
        mut acked: Option<&mut Vec<u64>>,
    ) -> u64 {
        let mut j = match self.position(first) {
            Ok(i) | Err(i) => i,
        };
        let mut n = 0;
        while let Some(e) = self.pending.get(j) {
            let seq = e.event.seq;
            if seq > last {
                break;
            }
            // At the queue's front (the common case: acks follow delivery)
            // an acked entry leaves at once; further in, it is marked and
            // leaves when everything before it is settled.
            let acked_here = if j == 0 {
                self.pop_acked_front()
            } else {
                let a = self.ack_entry(j);
                j += 1;
                a
            };
            if acked_here {
                n += 1;
                if let Some(out) = acked.as_deref_mut() {
                    out.push(seq);
                }
            } else if j == 0 {
                j = 1;
            }
        }
        self.settle(n)
    }

    /// [`Self::ack_entry`] of the front entry, which then leaves the queue
    /// at once (what [`Self::settle`] would do next). Whether it was in
    /// flight here.
    fn pop_acked_front(&mut self) -> bool {
        if !self.in_flight_here(0) {
            return false;
        }
        self.alive();
        self.left_flight(0);
        if let Some(sent) = self.drop_front() {
            self.gaps.read_past(sent);
        }
        true
    }

    /// The front entry, settled, leaves the queue: the cursor may pass it.
    /// Its delivery number, if there was one.
    fn drop_front(&mut self) -> Option<u64> {
        let e = self.pending.pop_front()?;
        self.removed_at(0);
        self.acked_through = self.acked_through.max(e.event.seq);
        Some(e.sent)
    }
}
