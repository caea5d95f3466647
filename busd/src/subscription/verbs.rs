//! The operator verbs on one subscription (`dws event subscription VERB`):
//! restart and skip a halted subscription, disable and enable delivery,
//! seek, and the parked list (show, replay). Each returns why it does not
//! apply instead of changing anything.

use super::{Entry, Parked, Slot, State, Subscription, VerbError, MAX_PARKED};

impl Subscription {
    /// Moves `pending[i]` to the parked list (`reason`: the consumer's).
    pub(super) fn park_at(&mut self, i: usize, reason: Option<String>) {
        if i >= self.pending.len() {
            return;
        }
        if let Slot::InFlight { .. } = self.pending[i].slot.get() {
            self.left_flight(i);
        }
        let Some(entry) = self.pending.remove(i) else {
            return;
        };
        self.removed_at(i);
        self.acked_through = self.acked_through.max(entry.event.seq);
        self.counters.parked += 1;
        // Parked once: a seq parked again (after a seek) replaces its entry.
        self.parked.retain(|p| p.event.seq != entry.event.seq);
        if self.parked.len() >= MAX_PARKED {
            self.parked.pop_front();
            self.counters.parked_dropped += 1;
        }
        self.parked.push_back(Parked {
            event: entry.event,
            deliveries: entry.deliveries,
            parked_at_ms: crate::clock::now_ms(),
            reason,
        });
    }

    /// halted → active; the same event is tried again, its count reset.
    pub fn restart(&mut self) -> Result<(), VerbError> {
        let State::Halted(h) = &self.state else {
            return Err(format!(
                "subscription {} is {}, not halted: nothing to restart",
                self.id,
                self.state.name()
            ));
        };
        let seq = h.seq;
        if let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) {
            self.pending[i].deliveries = 0;
        }
        self.state = State::Active;
        Ok(())
    }

    /// halted → active, past the event it was stuck on (which is parked).
    pub fn skip(&mut self) -> Result<u64, VerbError> {
        let State::Halted(h) = &self.state else {
            return Err(format!(
                "subscription {} is {}, not halted: nothing to skip",
                self.id,
                self.state.name()
            ));
        };
        let seq = h.seq;
        if let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) {
            self.park_at(i, None);
        }
        self.state = State::Active;
        Ok(seq)
    }

    pub fn disable(&mut self) -> Result<(), VerbError> {
        match self.state {
            State::Halted(_) => Err(format!(
                "subscription {} is halted: restart or skip it first",
                self.id
            )),
            _ => {
                self.state = State::Disabled;
                Ok(())
            }
        }
    }

    pub fn enable(&mut self) -> Result<(), VerbError> {
        match self.state {
            State::Halted(_) => Err(format!(
                "subscription {} is halted, not disabled: use restart or skip",
                self.id
            )),
            _ => {
                self.state = State::Active;
                Ok(())
            }
        }
    }

    /// Forgets everything pending (in flight included): the hub then offers
    /// the log again from `start_after + 1`. Earlier deliveries keep their
    /// redelivered mark. Parked events past `start_after` leave the parked
    /// list: the log offers them again, and a seq is pending or parked,
    /// never both (a replay after the seek would deliver it twice).
    pub fn seek(&mut self, start_after: u64) {
        self.parked.retain(|p| p.event.seq <= start_after);
        self.pending.clear();
        self.rescan();
        self.refilter();
        self.none_in_flight();
        self.acked_in_queue = 0;
        self.gaps.clear();
        self.acked_through = start_after;
        self.shared_from = start_after;
    }

    /// The parked list, oldest first.
    pub fn parked(&self) -> impl Iterator<Item = &Parked> {
        self.parked.iter()
    }

    /// Moves parked events (those in `seqs`, or all) back to pending, in seq
    /// order, with their delivery counts reset. Returns how many. One that
    /// is pending already (a seek offered it again) stays pending once, as
    /// it is: a seq is never pending twice.
    pub fn replay_parked(&mut self, seqs: &[u64]) -> usize {
        let mut moved = vec![];
        self.parked.retain(|p| {
            if seqs.is_empty() || seqs.contains(&p.event.seq) {
                moved.push(p.event.clone());
                false
            } else {
                true
            }
        });
        for event in &moved {
            let Err(at) = self
                .pending
                .binary_search_by_key(&event.seq, |e| e.event.seq)
            else {
                continue;
            };
            self.pending.insert(
                at,
                Entry {
                    event: event.clone(),
                    slot: Slot::Unsent.into(),
                    deliveries: 0,
                    sent: 0,
                    owner: 0,
                },
            );
            self.reopen(at);
        }
        moved.len()
    }
}
