//! [`FilterHandle`]: the part of the hub the `--where` filter thread may use
//! (`crate::where_filter::runner`) — take a batch of one subscription's
//! events waiting for a verdict, hand the verdicts back — and
//! [`FilterQueue`], the subscriptions that have such events. The filter
//! holds this type, never a [`Hub`], and nothing it does waits on anyone
//! but the lock (held for a batch's bookkeeping, never for an evaluation).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use super::{Hub, State};
use crate::{
    eventlog::LoggedEvent,
    where_filter::{Verdict, Wheres},
};

/// Subscriptions that may have events the filter was not given yet.
#[derive(Debug, Default)]
pub(super) struct FilterQueue {
    ids: BTreeSet<String>,
}

impl FilterQueue {
    /// `id` has events to judge.
    pub(super) fn want(&mut self, id: &str) {
        if !self.ids.contains(id) {
            self.ids.insert(id.to_owned());
        }
    }
}

/// One subscription's events to judge, in seq order, and its expressions.
pub struct FilterBatch {
    pub subscription: String,
    pub wheres: Wheres,
    pub events: Vec<Arc<LoggedEvent>>,
}

/// What the filter thread holds of the hub.
#[derive(Clone)]
pub struct FilterHandle {
    hub: Hub,
}

impl Hub {
    /// The handle the filter thread runs with.
    pub(super) fn filter_handle(&self) -> FilterHandle {
        FilterHandle { hub: self.clone() }
    }

    /// Tells the filter that `st`'s subscription `id` has events to judge.
    pub(super) fn want_filter(&self, st: &mut State, id: &str) {
        st.filter_queue.want(id);
        self.shared.filter_wake.notify_one();
    }
}

impl FilterHandle {
    /// Waits for a subscription with events to judge and takes a batch of
    /// them: `choose` picks among the ids with work and says how many
    /// events at most (and `max_bytes` encoded, at least one). `None` once
    /// the bus shuts down.
    pub fn next_batch(
        &self,
        choose: &mut dyn FnMut(&[&str]) -> (usize, usize),
        max_bytes: usize,
    ) -> Option<FilterBatch> {
        let shared = &self.hub.shared;
        let mut st = self.hub.state();
        loop {
            if shared.shutdown.fired() {
                return None;
            }
            let State {
                registry,
                filter_queue,
                ..
            } = &mut *st;
            filter_queue
                .ids
                .retain(|id| registry.get(id).is_some_and(|s| s.has_filter_jobs()));
            if filter_queue.ids.is_empty() {
                // The shutdown is looked at again every second.
                st = shared
                    .filter_wake
                    .wait_timeout(st, Duration::from_secs(1))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            let ids: Vec<&str> = filter_queue.ids.iter().map(String::as_str).collect();
            let (i, n) = choose(&ids);
            let id = ids[i.min(ids.len() - 1)].to_owned();
            let n = n.max(1);
            let Some(sub) = registry.get_mut(&id) else {
                continue;
            };
            let Some(wheres) = sub.wheres().cloned() else {
                filter_queue.ids.remove(&id);
                continue;
            };
            let events = sub.filter_jobs(n, max_bytes);
            if events.is_empty() {
                filter_queue.ids.remove(&id);
                continue;
            }
            return Some(FilterBatch {
                subscription: id,
                wheres,
                events,
            });
        }
    }

    /// The verdicts on `batch`'s events, in order. Dropped when the
    /// subscription is gone or is another one now (made again under its
    /// id); the consumer is woken when something became sendable, or a
    /// failure past a limit must be told.
    pub fn judged(&self, batch: &FilterBatch, verdicts: &[Verdict]) {
        let mut st = self.hub.state();
        let State {
            registry, persist, ..
        } = &mut *st;
        let Some(sub) = registry.get_mut(&batch.subscription) else {
            return;
        };
        if !sub.wheres().is_some_and(|w| w.same(&batch.wheres)) {
            return;
        }
        let mut wake = false;
        for (e, v) in batch.events.iter().zip(verdicts) {
            wake |= sub.judged(e.seq, *v);
        }
        wake |= sub.where_notice_due();
        let named = !sub.owned;
        let handles = registry
            .get(&batch.subscription)
            .map(|s| registry.handles_of(s))
            .unwrap_or_default();
        // Counters and the cursor moved: a named subscription is saved.
        let newly_dirty = named && persist.mark_dirty();
        drop(st);
        if newly_dirty {
            self.hub.shared.commit_wake.notify_one();
        }
        if wake {
            for h in handles {
                h.wake.notify_one();
            }
        }
    }
}
