//! Events a subscription never saw because they were gone before this host
//! read them: a cluster follower whose tail fell behind the owner's
//! retention finds a hole in the shared log. Every seq of the hole that the
//! subscription had not acked past is counted lost and reported with the
//! next delivery as a gap, like an event retention evicted unsent.

use super::Subscription;

impl Subscription {
    /// The seqs `from..=to` were deleted before this host read them: counts
    /// the ones above what this subscription acked as lost (their types are
    /// unknown, so each could have matched). Returns how many it counted. A
    /// subscription fed by a cluster's claims counts nothing: its events
    /// come through claims.
    pub fn missed(&mut self, from: u64, to: u64) -> u64 {
        let start = from.max(self.acked_through.saturating_add(1));
        if self.claimed || start > to {
            return 0;
        }
        let n = to - start + 1;
        self.gaps.lost(n, Some(to));
        self.counters.lost += n;
        self.acked_through = to;
        n
    }
}
