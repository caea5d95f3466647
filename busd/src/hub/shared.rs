//! The hub's side of shared delivery (a cluster's `--delivery shared`
//! subscriptions; the claims themselves are `crate::cluster::shared`'s):
//! which events a shared subscription wants claimed now
//! ([`Hub::shared_wants`]), the events this host claimed
//! ([`Hub::offer_claimed`]), what this host holds ([`Hub::shared_held`], the
//! claims it renews), what the claims must learn — events acked here, events
//! given back when a consumer left, events retention evicted here that may
//! be lost ([`Hub::take_shared_work`]) — and losses to report
//! ([`Hub::shared_lost`]).
//!
//! A shared subscription's instance on this host holds only what this host
//! claimed; `offer` never fills it. Claiming happens only while a consumer
//! is attached here, within its window, so a host without consumers never
//! holds events another host could deliver.

use std::{collections::BTreeMap, sync::Arc};

use super::Hub;
use crate::eventlog::LoggedEvent;

/// Per shared subscription: seqs acked here, seqs given back, and seqs
/// retention evicted here before this host held them (lost unless another
/// host delivered them).
#[derive(Debug, Default)]
pub struct SharedWork {
    pub acked: BTreeMap<String, Vec<u64>>,
    pub released: BTreeMap<String, Vec<u64>>,
    pub evicted: BTreeMap<String, Vec<u64>>,
}

impl SharedWork {
    /// Adds `other`'s work to this (work not yet done is kept until it is).
    pub fn merge(&mut self, other: SharedWork) {
        for (mine, theirs) in [
            (&mut self.acked, other.acked),
            (&mut self.released, other.released),
            (&mut self.evicted, other.evicted),
        ] {
            for (id, seqs) in theirs {
                mine.entry(id).or_default().extend(seqs);
            }
        }
    }

    pub(super) fn evicted(&mut self, id: &str, seq: u64) {
        self.evicted.entry(id.to_owned()).or_default().push(seq);
    }

    pub(super) fn acked(&mut self, id: &str, seqs: Vec<u64>) {
        self.acked.entry(id.to_owned()).or_default().extend(seqs);
    }

    pub(super) fn released(&mut self, id: &str, seqs: Vec<u64>) {
        if !seqs.is_empty() {
            self.released.entry(id.to_owned()).or_default().extend(seqs);
        }
    }
}

/// What one shared subscription would claim now.
#[derive(Debug)]
pub struct SharedWant {
    pub subscription: String,
    /// Matching events in the log, oldest first, not held here and not
    /// skipped by the caller; at most the subscription's free window.
    pub seqs: Vec<u64>,
}

impl Hub {
    /// For every shared subscription with a consumer attached here and room
    /// in its window: the matching events it could claim, skipping those
    /// `skip` says another host holds or finished.
    pub(super) fn shared_wants(&self, skip: impl Fn(&str, u64) -> bool) -> Vec<SharedWant> {
        let st = self.state();
        let mut wants = Vec::new();
        for sub in st.registry.subs().values() {
            if !sub.claimed || sub.consumer().is_none() {
                continue;
            }
            let room = sub.claim_room();
            if room == 0 {
                continue;
            }
            let seqs: Vec<u64> = st
                .log
                .events()
                .filter(|e| e.seq > sub.shared_from() && !e.damaged && sub.selects(e))
                .map(|e| e.seq)
                .filter(|&s| !sub.holds(s) && !skip(&sub.id, s))
                .take(room)
                .collect();
            if !seqs.is_empty() {
                wants.push(SharedWant {
                    subscription: sub.id.clone(),
                    seqs,
                });
            }
        }
        wants
    }

    /// Events of `subscription` this host claimed, with their delivery
    /// counts: queued for its consumer here. Returns how many were taken
    /// (an event no longer in the log, or a consumer gone, takes none: the
    /// caller gives those claims back).
    pub(super) fn offer_claimed(&self, subscription: &str, claimed: &[(u64, u32)]) -> Vec<u64> {
        let mut st = self.state();
        let events: Vec<(Arc<LoggedEvent>, u32)> = claimed
            .iter()
            .filter_map(|&(seq, n)| st.log.get(seq).map(|e| (e, n)))
            .collect();
        let mut taken = Vec::new();
        let Some(sub) = st.registry.get_mut(subscription) else {
            return taken;
        };
        if !sub.claimed || sub.consumer().is_none() {
            return taken;
        }
        for (event, n) in events {
            let seq = event.seq;
            if sub.push_claimed(event, n) {
                taken.push(seq);
            }
        }
        let sub_id = sub.id.clone();
        let wake = st
            .registry
            .get(&sub_id)
            .map(|s| st.registry.handles_of(s))
            .unwrap_or_default();
        drop(st);
        for h in wake {
            h.wake.notify_one();
        }
        taken
    }

    /// Per shared subscription, the seqs this host holds claims for.
    pub(super) fn shared_held(&self) -> BTreeMap<String, Vec<u64>> {
        self.state()
            .registry
            .subs()
            .values()
            .filter(|s| s.claimed)
            .map(|s| (s.id.clone(), s.held_seqs()))
            .filter(|(_, seqs)| !seqs.is_empty())
            .collect()
    }

    /// The shared subscriptions this host has an instance of.
    pub(super) fn shared_ids(&self) -> Vec<String> {
        self.state()
            .registry
            .subs()
            .values()
            .filter(|s| s.claimed)
            .map(|s| s.id.clone())
            .collect()
    }

    /// The shared subscriptions with a consumer attached here.
    pub(super) fn shared_attached(&self) -> Vec<String> {
        self.state()
            .registry
            .subs()
            .values()
            .filter(|s| s.claimed && s.consumer().is_some())
            .map(|s| s.id.clone())
            .collect()
    }

    /// `n` events of `subscription` that no host delivered before retention
    /// took them: a gap for the next consumer here, counted lost.
    pub(super) fn shared_lost(&self, subscription: &str, n: u64) {
        if n == 0 {
            return;
        }
        let mut st = self.state();
        let Some(sub) = st.registry.get_mut(subscription) else {
            return;
        };
        sub.lost_shared(n);
        let wake = st
            .registry
            .get(subscription)
            .map(|s| st.registry.handles_of(s))
            .unwrap_or_default();
        st.persist.mark_dirty();
        drop(st);
        for h in wake {
            h.wake.notify_one();
        }
    }

    /// What the claims must learn since the last call.
    pub(super) fn take_shared_work(&self) -> SharedWork {
        std::mem::take(&mut self.state().shared_work)
    }
}
