//! The hub's side of shared delivery (a cluster's `--delivery shared`
//! subscriptions; the claims themselves are `crate::cluster::shared`'s):
//! which events a shared subscription wants claimed now
//! ([`Hub::shared_wants`]), the events this host claimed
//! ([`Hub::offer_claimed`]), and what the claims must learn — events acked
//! here, and events given back when a consumer left
//! ([`Hub::take_shared_work`]).
//!
//! A shared subscription's instance on this host holds only what this host
//! claimed; `offer` never fills it. Claiming happens only while a consumer
//! is attached here, within its window, so a host without consumers never
//! holds events another host could deliver.

use std::{collections::BTreeMap, sync::Arc};

use super::Hub;
use crate::eventlog::LoggedEvent;

/// Per shared subscription: seqs acked here, and seqs given back.
#[derive(Debug, Default)]
pub struct SharedWork {
    pub acked: BTreeMap<String, Vec<u64>>,
    pub released: BTreeMap<String, Vec<u64>>,
}

impl SharedWork {
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
    pub fn shared_wants(&self, skip: impl Fn(&str, u64) -> bool) -> Vec<SharedWant> {
        let st = self.state();
        let mut wants = Vec::new();
        for sub in st.subs.values() {
            if !sub.shared || sub.consumer().is_none() {
                continue;
            }
            let room = sub.claim_room();
            if room == 0 {
                continue;
            }
            let seqs: Vec<u64> = st
                .log
                .events()
                .filter(|e| !e.damaged && sub.selects(e))
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
    pub fn offer_claimed(&self, subscription: &str, claimed: &[(u64, u32)]) -> Vec<u64> {
        let mut st = self.state();
        let events: Vec<(Arc<LoggedEvent>, u32)> = claimed
            .iter()
            .filter_map(|&(seq, n)| st.log.get(seq).map(|e| (e, n)))
            .collect();
        let mut taken = Vec::new();
        let Some(sub) = st.subs.get_mut(subscription) else {
            return taken;
        };
        if !sub.shared || sub.consumer().is_none() {
            return taken;
        }
        for (event, n) in events {
            let seq = event.seq;
            if sub.push_claimed(event, n) {
                taken.push(seq);
            }
        }
        let wake = sub
            .consumer()
            .and_then(|c| st.conns.get(&c))
            .map(|c| c.handle.clone());
        drop(st);
        if let Some(h) = wake {
            h.wake.notify_one();
        }
        taken
    }

    /// What the claims must learn since the last call.
    pub fn take_shared_work(&self) -> SharedWork {
        std::mem::take(&mut self.state().shared_work)
    }
}
