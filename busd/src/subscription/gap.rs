//! [`Gaps`]: what a subscription lost before it was sent (retention took it
//! unsent, a follower's log had a hole, no cluster host delivered it), and
//! whether that loss has been reported.
//!
//! A loss is reported by a `Gap` at the front of the next pull. Sending it is
//! not enough: the consumer may die before the frame reaches its stderr (its
//! stdout stalled, so it stopped reading the socket). So a gap that was sent
//! is *told*, and counts as reported only once the consumer *read past it*:
//! it acked, nacked, termed or reported progress on an event delivered after
//! the gap. When the consumer leaves first, the told gaps are due again and
//! go to whichever consumer reads next. A gap may thus be reported twice,
//! never not at all.
//!
//! The gap names the seq delivery resumes at: the first event still pending
//! above every lost seq (the head's successor when there is none), never a
//! seq below the loss (an event pinned while in flight and returned to
//! unsent is older than what retention took after it).

use std::collections::VecDeque;

use super::{Slot, Subscription};

/// A gap sent to the attached consumer that it has not read past yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Told {
    /// Deliveries of the subscription when the gap was sent: a delivery
    /// numbered above it came after the gap.
    after: u64,
    lost: u64,
    through: u64,
}

/// The unreported losses of one subscription.
#[derive(Debug, Clone, Default)]
pub(super) struct Gaps {
    /// Lost and not sent to a consumer yet.
    due: u64,
    /// The highest lost seq among `due` (0 when unknown).
    through: u64,
    /// Sent, not yet read past by the consumer.
    told: VecDeque<Told>,
}

impl Gaps {
    /// A restored subscription: `n` losses never read past (their seqs are
    /// not stored; delivery resumes at the first pending event).
    pub(super) fn restored(n: u64) -> Gaps {
        Gaps {
            due: n,
            ..Gaps::default()
        }
    }

    /// `n` more losses, the highest at `through` (if known).
    pub(super) fn lost(&mut self, n: u64, through: Option<u64>) {
        self.due += n;
        if let Some(t) = through {
            self.through = self.through.max(t);
        }
    }

    /// Whether a gap is to be sent.
    pub(super) fn is_due(&self) -> bool {
        self.due > 0
    }

    /// The gap to send now, if one is due: how many were lost and the
    /// highest lost seq. It is told until the consumer reads past delivery
    /// number `sends`.
    pub(super) fn take(&mut self, sends: u64) -> Option<(u64, u64)> {
        if self.due == 0 {
            return None;
        }
        let told = Told {
            after: sends,
            lost: self.due,
            through: self.through,
        };
        self.told.push_back(told);
        self.due = 0;
        self.through = 0;
        Some((told.lost, told.through))
    }

    /// The consumer settled delivery number `sent`: every gap sent before
    /// that delivery was read.
    pub(super) fn read_past(&mut self, sent: u64) {
        while self.told.front().is_some_and(|t| t.after < sent) {
            self.told.pop_front();
        }
    }

    /// The consumer left (or another took its place): what it was told and
    /// did not read past is due again.
    pub(super) fn retell(&mut self) {
        for t in self.told.drain(..) {
            self.due += t.lost;
            self.through = self.through.max(t.through);
        }
    }

    /// Losses not yet read past (due or told): what is stored.
    pub(super) fn unreported(&self) -> u64 {
        self.due + self.told.iter().map(|t| t.lost).sum::<u64>()
    }

    /// Forgets everything (a seek: what was lost before is not reported).
    pub(super) fn clear(&mut self) {
        *self = Gaps::default();
    }
}

impl Subscription {
    /// Where delivery resumes after a gap whose highest lost seq is
    /// `through`: the first event still pending above it, else after the
    /// head. Unknown (0): the first unsent event.
    pub(super) fn resume_after(&self, through: u64, head: u64) -> u64 {
        let next = if through > 0 {
            self.pending
                .iter()
                .find(|e| e.event.seq > through && e.slot.get() != Slot::Acked)
        } else {
            self.pending.iter().find(|e| e.slot.get() == Slot::Unsent)
        };
        next.map_or(head.max(through) + 1, |e| e.event.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_told_and_not_read_past_is_due_again_after_the_consumer_leaves() {
        let mut g = Gaps::default();
        g.lost(3, Some(7));
        assert_eq!(g.take(10), Some((3, 7)));
        assert!(!g.is_due());
        assert_eq!(g.unreported(), 3);
        // A delivery made before the gap proves nothing.
        g.read_past(10);
        assert_eq!(g.unreported(), 3);
        g.lost(2, Some(12));
        assert_eq!(g.take(11), Some((2, 12)));
        g.retell();
        assert_eq!(g.take(11), Some((5, 12)));
        // Read past both.
        g.read_past(12);
        assert_eq!(g.unreported(), 0);
        assert_eq!(g.take(12), None);
    }

    #[test]
    fn reading_past_one_gap_leaves_a_later_one_told() {
        let mut g = Gaps::default();
        g.lost(1, Some(4));
        g.take(5);
        g.lost(1, Some(9));
        g.take(8);
        g.read_past(7);
        assert_eq!(g.unreported(), 1);
        g.retell();
        assert_eq!(g.take(8), Some((1, 9)));
        g.clear();
        assert_eq!(g.unreported(), 0);
    }
}
