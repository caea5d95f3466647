//! The `--where` side of a subscription: events its keys selected wait in
//! `pending` as `Filtering` until the filter, which runs off the hub lock
//! (`crate::where_filter`), hands back a verdict. [`Subscription::filter_jobs`]
//! gives the filter what it has not been given yet, in seq order;
//! [`Subscription::judged`] applies a verdict: a match becomes sendable, no
//! match leaves, a failure leaves and is counted in `where_errors` (the
//! first past a limit is told to the consumer). Delivery stops at the first
//! event still waiting, so verdicts never reorder what a consumer sees.

use std::sync::Arc;

use super::{Slot, Subscription};
use crate::{
    eventlog::LoggedEvent,
    where_filter::{Verdict, Wheres},
};

/// What [`Subscription::offer`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    No,
    /// Pending: its consumer may take it.
    Taken,
    /// Pending, waiting for its `--where` verdict: the filter must run.
    ToFilter,
}

impl Offered {
    pub fn taken(self) -> bool {
        self != Offered::No
    }
}

impl Subscription {
    /// The `--where` expressions, compiled, if any.
    pub fn wheres(&self) -> Option<&Wheres> {
        self.selector.wheres()
    }

    /// Up to `max` events waiting for a verdict that the filter was not
    /// given yet, at most `max_bytes` of them encoded (at least one).
    pub fn filter_jobs(&mut self, max: usize, max_bytes: usize) -> Vec<Arc<LoggedEvent>> {
        let mut out = Vec::new();
        if self.filtering == 0 {
            return out;
        }
        let handed = self.filter_handed;
        let from = self.pending.partition_point(|e| e.event.seq <= handed);
        let mut bytes = 0usize;
        for e in self.pending.range(from..) {
            if out.len() >= max || (bytes >= max_bytes && !out.is_empty()) {
                break;
            }
            if e.slot.get() == Slot::Filtering {
                bytes = bytes.saturating_add(e.event.encoded.len());
                out.push(e.event.clone());
            }
        }
        if let Some(last) = out.last() {
            self.filter_handed = last.seq;
        }
        out
    }

    /// Whether some event waits for a verdict the filter was not given.
    pub fn has_filter_jobs(&self) -> bool {
        self.filtering > 0
            && self
                .pending
                .back()
                .is_some_and(|e| e.event.seq > self.filter_handed)
    }

    /// The filter's verdict on `seq`. Returns whether an event became
    /// sendable. A verdict for an event no longer waiting (evicted, seeked
    /// past, judged already) changes nothing.
    pub fn judged(&mut self, seq: u64, verdict: Verdict) -> bool {
        let Ok(i) = self.position(seq) else {
            return false;
        };
        if self.pending[i].slot.get() != Slot::Filtering {
            return false;
        }
        self.filtering -= 1;
        let count = seq > self.counted_through;
        if verdict == Verdict::Match {
            self.pending[i].slot.set(Slot::Unsent);
            self.counters.matched += u64::from(count);
            self.reopen(i);
            return true;
        }
        self.pending.remove(i);
        self.removed_at(i);
        if let Verdict::Failed(why) = verdict {
            self.counters.where_errors += u64::from(count);
            if why.past_a_limit() {
                self.where_last = Some((seq, why));
                // For the consumers not told yet (or, none attached, for
                // the next one).
                let untold = self.workers.is_empty() || self.workers.iter().any(|w| !w.where_told);
                if self.where_notice.is_none() && untold {
                    self.where_notice = Some((seq, why));
                }
            }
        }
        // Acked entries left at the front, or nothing left: the cursor moves.
        self.settle(0);
        false
    }

    /// The last failure past a limit, for status.
    pub fn where_last_limit(&self) -> Option<String> {
        self.where_last
            .map(|(seq, why)| format!("seq {seq}: {why}"))
    }

    /// A failure past a limit waits to be told to the attached consumer.
    pub fn where_notice_due(&self) -> bool {
        self.where_notice.is_some() && self.workers.iter().any(|w| !w.where_told)
    }

    /// The filter must start again from the first waiting event (a seek
    /// rebuilt `pending`).
    pub(super) fn refilter(&mut self) {
        self.filtering = 0;
        self.filter_handed = 0;
    }
}
