//! The stored form of a subscription: [`Subscription::record`] (what the
//! committer saves in `subscriptions.json`) and [`Subscription::restore`]
//! (rebuilding it from that record and the recovered log, marking pending
//! events redelivered after a crash). A delayed event's due time is stored
//! on the wall clock and comes back as a delay from the restart's `now`.

use std::collections::{HashMap, HashSet};

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use proto::v1::PoisonPolicy;

use super::{
    poison_name,
    slow::{instant_at, wall_ms},
    Entry, Parked, Slot, State, Subscription,
};
use crate::{
    eventlog::LoggedEvent,
    pattern::Selector,
    store::{ParkedRecord, SubRecord},
};

impl Subscription {
    /// Rebuilds a stored subscription. `events` is the recovered log (seq
    /// order); `snap` is the snapshot's (log floor, head, clean). After a
    /// crash (`clean == false`) every pending event counts as possibly sent,
    /// so it comes again marked redelivered.
    pub fn restore(
        rec: &SubRecord,
        selector: Selector,
        events: &[Arc<LoggedEvent>],
        snap: (u64, u64, bool),
        now: (Instant, i64),
        window: usize,
    ) -> Subscription {
        let (snap_floor, snap_head, clean) = snap;
        let detached_ms = rec.detached_since_unix_ms.unwrap_or(now.1).min(now.1);
        let ago = Duration::from_millis((now.1 - detached_ms).max(0) as u64);
        let mut sub = Subscription::new(
            rec.id.clone(),
            selector,
            false,
            proto::limits::ttl_from_ms(rec.ttl_ms).unwrap_or(Duration::ZERO),
            rec.upstream_id.clone(),
            rec.cursor,
            (now.0.checked_sub(ago).unwrap_or(now.0), detached_ms),
            window,
        );
        sub.created_at_ms = rec.created_at_unix_ms;
        sub.max_sent_seq = rec.max_sent_seq;
        sub.gaps = super::gap::Gaps::restored(rec.gap_lost);
        sub.counters = rec.counters;
        sub.max_deliver = rec.max_deliver;
        sub.shared = rec.shared;
        sub.backoff = rec
            .backoff_ms
            .iter()
            .map(|&ms| Duration::from_millis(ms))
            .collect();
        sub.ack_wait = rec.ack_wait_ms.map(Duration::from_millis);
        sub.shared_from = if rec.shared {
            rec.shared_from
        } else {
            rec.cursor
        };
        sub.on_poison = if rec.on_poison == "park" {
            PoisonPolicy::PoisonPark
        } else {
            PoisonPolicy::PoisonHalt
        };
        sub.state = match (rec.state.as_str(), &rec.halt) {
            ("halted", Some(h)) => State::Halted(h.clone()),
            ("disabled", _) => State::Disabled,
            _ => State::Active,
        };
        let find = |seq: u64| {
            events
                .binary_search_by_key(&seq, |e| e.seq)
                .ok()
                .map(|i| events[i].clone())
        };
        for p in &rec.parked {
            if let Some(event) = find(p.seq) {
                sub.parked.push_back(Parked {
                    event,
                    deliveries: p.deliveries,
                    parked_at_ms: p.parked_at_unix_ms,
                    reason: p.reason.clone(),
                });
            }
        }
        // Looked up once per recovered event: sets and maps, not scans.
        let parked: HashSet<u64> = rec.parked.iter().map(|p| p.seq).collect();
        let acked: HashSet<u64> = rec.acked.iter().copied().collect();
        let counts: HashMap<u64, u32> = rec.deliveries.iter().copied().collect();
        let due: HashMap<u64, i64> = rec.delayed.iter().copied().collect();
        let judged = sub.selector.has_where();
        sub.counted_through = snap_head;
        for e in events.iter().filter(|e| e.seq > rec.cursor) {
            let wanted = if e.seq < snap_floor {
                rec.pinned.binary_search(&e.seq).is_ok()
            } else {
                sub.selects(e) && !parked.contains(&e.seq) && !acked.contains(&e.seq)
            };
            if wanted {
                let deliveries = counts.get(&e.seq).copied().unwrap_or(0);
                // Pinned, delivered or delayed: it matched before the
                // restart. Anything else a `--where` judges again, off the
                // hub lock, once the bus runs: a start never waits on it.
                let slot = match due.get(&e.seq) {
                    Some(&ms) => Slot::Delayed {
                        until: instant_at(ms, now),
                    },
                    None if judged && e.seq >= snap_floor && deliveries == 0 && !e.damaged => {
                        sub.filtering += 1;
                        Slot::Filtering
                    }
                    None => Slot::Unsent,
                };
                sub.pending.push_back(Entry {
                    event: e.clone(),
                    slot: slot.into(),
                    deliveries,
                    sent: 0,
                    owner: 0,
                });
                if e.seq > snap_head && slot != Slot::Filtering {
                    sub.counters.matched += 1;
                }
            }
        }
        if !clean {
            let last = events.last().map_or(0, |e| e.seq);
            sub.max_sent_seq = sub.max_sent_seq.max(last);
        }
        sub
    }

    /// The stored form. `log_floor` is the oldest seq still in the log;
    /// `now` on both clocks turns delays into wall-clock due times.
    pub fn record(&self, log_floor: u64, head: u64, now: (Instant, i64)) -> SubRecord {
        SubRecord {
            id: self.id.clone(),
            patterns: self.selector.pattern_strings(),
            filter: self.selector.filter_str().to_owned(),
            ttl_ms: proto::limits::ttl_to_ms(self.ttl),
            created_at_unix_ms: self.created_at_ms,
            upstream_id: self.upstream_id.clone(),
            cursor: self.cursor(head),
            pinned: self
                .pending
                .iter()
                .filter(|e| !matches!(e.slot.get(), Slot::Acked | Slot::Filtering))
                .map(|e| e.event.seq)
                .take_while(|&s| s < log_floor)
                .collect(),
            max_sent_seq: self.max_sent_seq,
            gap_lost: self.gaps.unreported(),
            detached_since_unix_ms: if self.consumer().is_some() {
                None
            } else {
                self.detached_at.map(|(_, ms)| ms)
            },
            counters: self.counters,
            max_deliver: self.max_deliver,
            on_poison: poison_name(self.on_poison).into(),
            state: self.state.name().into(),
            halt: match &self.state {
                State::Halted(h) => Some(h.clone()),
                _ => None,
            },
            deliveries: self
                .pending
                .iter()
                .filter(|e| e.deliveries > 0 && e.slot.get() != Slot::Acked)
                .map(|e| (e.event.seq, e.deliveries))
                .collect(),
            parked: self
                .parked
                .iter()
                .map(|p| ParkedRecord {
                    seq: p.event.seq,
                    deliveries: p.deliveries,
                    parked_at_unix_ms: p.parked_at_ms,
                    reason: p.reason.clone(),
                })
                .collect(),
            acked: self
                .pending
                .iter()
                .filter(|e| e.slot.get() == Slot::Acked)
                .map(|e| e.event.seq)
                .collect(),
            shared: self.shared,
            backoff_ms: self.backoff.iter().map(|d| d.as_millis() as u64).collect(),
            delayed: self
                .pending
                .iter()
                .filter_map(|e| match e.slot.get() {
                    Slot::Delayed { until } => Some((e.event.seq, wall_ms(until, now))),
                    _ => None,
                })
                .collect(),
            shared_from: if self.shared { self.shared_from } else { 0 },
            where_exprs: self.selector.where_strs().to_vec(),
            ack_wait_ms: self.ack_wait.map(|d| d.as_millis() as u64),
        }
    }
}
