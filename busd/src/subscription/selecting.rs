//! Fan-out's selection of an event: [`Subscription::selects`], with an
//! event whose `--where` evaluation failed (an error, or past the step
//! bound) counted in `where_errors` and not taken.

use super::Subscription;
use crate::eventlog::LoggedEvent;

impl Subscription {
    /// Whether fan-out takes `e`; counts a failed `--where` evaluation.
    pub(super) fn takes(&mut self, e: &LoggedEvent) -> bool {
        let verdict = self.selector.selects(e, self.upstream_id.as_deref());
        if verdict.is_err() {
            self.counters.where_errors += 1;
        }
        verdict == Ok(true)
    }
}
