//! [`Subscription`]: the delivery state of one subscription — what it
//! selects, what is pending, what is in flight, what was lost or parked,
//! whether it is active, halted or disabled — as a pure state machine. No
//! I/O, no locks, no clocks of its own: the hub calls it under its lock and
//! passes the time in.
//!
//! `pending` holds the matched events not yet acked, in seq order, each in a
//! [`Slot`]: unsent, in flight to the attached consumer, acked out of order
//! (explicit acks; dropped once everything before it is acked too), or
//! nacked with a delay. In-flight events are pinned: retention does not take
//! them from the subscription (at most one window of them), so they can be
//! delivered again if the consumer goes away without acking. Everything else
//! in `pending` is also in the log; when retention evicts it before it was
//! sent, it is dropped and counted as lost, and the next consumer to read
//! past it gets a gap.
//!
//! Every delivery of an event is counted. With `max_deliver`, an event about
//! to be delivered again after that many deliveries is poison: the
//! subscription halts at it (`halt`) or moves it to its parked list (`park`).

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use proto::v1::{self, PoisonPolicy};

use crate::{
    eventlog::LoggedEvent,
    pattern::Selector,
    store::{HaltRecord, ParkedRecord, SubCounters, SubRecord},
};

pub type ConnId = u64;

/// Most events one subscription keeps parked; past it the oldest is dropped
/// (and counted in `parked_dropped`).
pub const MAX_PARKED: usize = 1000;

/// Where one pending event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Unsent,
    InFlight {
        since: Instant,
    },
    /// Acked while an earlier event is still unacked (explicit acks).
    Acked,
    /// Nacked: not to be delivered again before `until`.
    Delayed {
        until: Instant,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    event: Arc<LoggedEvent>,
    slot: Slot,
    deliveries: u32,
}

/// An event on the parked (dead-letter) list.
#[derive(Debug, Clone)]
pub struct Parked {
    pub event: Arc<LoggedEvent>,
    pub deliveries: u32,
    pub parked_at_ms: i64,
}

/// Whether a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Active,
    /// Stopped at a poison event until `restart` or `skip`.
    Halted(HaltRecord),
    /// Collects (bounded by retention, gaps reported) but delivers nothing.
    Disabled,
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Active => "active",
            State::Halted(_) => "halted",
            State::Disabled => "disabled",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Subscription {
    pub id: String,
    pub selector: Selector,
    /// Created by one `consume` run and removed by it: never stored.
    pub owned: bool,
    pub ttl: Duration,
    pub created_at_ms: i64,
    /// The upstream subscription this one is bound to (personal stream).
    pub upstream_id: Option<String>,
    pub max_deliver: u32,
    pub on_poison: PoisonPolicy,
    pub state: State,
    pending: VecDeque<Entry>,
    /// Entries in `pending` that are `Acked`.
    acked_in_queue: usize,
    in_flight: usize,
    parked: VecDeque<Parked>,
    /// Highest seq ever sent: anything at or below it that is sent again is
    /// marked redelivered.
    max_sent_seq: u64,
    /// Every matching event at or below it was acked or reported lost.
    acked_through: u64,
    consumer: Option<ConnId>,
    window: usize,
    /// The consumer acks event by event; unacked events in flight longer
    /// than `ack_wait` are delivered again.
    explicit: Option<Duration>,
    /// When it was last left without a consumer (for the TTL; wall clock for
    /// status and the store).
    detached_at: Option<(Instant, i64)>,
    /// Unsent events evicted by retention since the last gap was reported.
    gap_lost: u64,
    pub counters: SubCounters,
}

/// What [`Subscription::pull`] hands a consumer.
#[derive(Debug, Default)]
pub struct Pulled {
    pub gap: Option<v1::Gap>,
    /// Events with their redelivered mark and delivery count.
    pub events: Vec<(Arc<LoggedEvent>, bool, u32)>,
    /// The next event to deliver is damaged in the store and everything
    /// before it is acked: delivery stops here.
    pub damaged_at: Option<u64>,
    /// The subscription halted at a poison event during this pull.
    pub halted: Option<HaltRecord>,
    /// When something not deliverable now becomes deliverable (a nack's
    /// delay, an explicit ack's wait): the connection wakes then.
    pub next_due: Option<Instant>,
}

/// Why an operator verb does not apply.
pub type VerbError = String;

impl Subscription {
    /// A new subscription, detached, whose backlog starts after `start_after`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        selector: Selector,
        owned: bool,
        ttl: Duration,
        upstream_id: Option<String>,
        start_after: u64,
        now: (Instant, i64),
        window: usize,
    ) -> Subscription {
        Subscription {
            id,
            selector,
            owned,
            ttl,
            created_at_ms: now.1,
            upstream_id,
            max_deliver: 0,
            on_poison: PoisonPolicy::PoisonHalt,
            state: State::Active,
            pending: VecDeque::new(),
            acked_in_queue: 0,
            in_flight: 0,
            parked: VecDeque::new(),
            max_sent_seq: 0,
            acked_through: start_after,
            consumer: None,
            window: window.max(1),
            explicit: None,
            detached_at: Some(now),
            gap_lost: 0,
            counters: SubCounters::default(),
        }
    }

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
            Duration::from_millis(rec.ttl_ms),
            rec.upstream_id.clone(),
            rec.cursor,
            (now.0.checked_sub(ago).unwrap_or(now.0), detached_ms),
            window,
        );
        sub.created_at_ms = rec.created_at_unix_ms;
        sub.max_sent_seq = rec.max_sent_seq;
        sub.gap_lost = rec.gap_lost;
        sub.counters = rec.counters;
        sub.max_deliver = rec.max_deliver;
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
                });
            }
        }
        let parked: Vec<u64> = rec.parked.iter().map(|p| p.seq).collect();
        for e in events.iter().filter(|e| e.seq > rec.cursor) {
            let wanted = if e.seq < snap_floor {
                rec.pinned.binary_search(&e.seq).is_ok()
            } else {
                sub.selects(e) && !parked.contains(&e.seq) && !rec.acked.contains(&e.seq)
            };
            if wanted {
                let deliveries = rec
                    .deliveries
                    .iter()
                    .find(|(s, _)| *s == e.seq)
                    .map_or(0, |(_, n)| *n);
                sub.pending.push_back(Entry {
                    event: e.clone(),
                    slot: Slot::Unsent,
                    deliveries,
                });
                if e.seq > snap_head {
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

    /// The stored form. `log_floor` is the oldest seq still in the log.
    pub fn record(&self, log_floor: u64, head: u64) -> SubRecord {
        SubRecord {
            id: self.id.clone(),
            patterns: self.selector.pattern_strings(),
            filter: self.selector.filter_str().to_owned(),
            ttl_ms: self.ttl.as_millis() as u64,
            created_at_unix_ms: self.created_at_ms,
            upstream_id: self.upstream_id.clone(),
            cursor: self.cursor(head),
            pinned: self
                .pending
                .iter()
                .filter(|e| e.slot != Slot::Acked)
                .map(|e| e.event.seq)
                .take_while(|&s| s < log_floor)
                .collect(),
            max_sent_seq: self.max_sent_seq,
            gap_lost: self.gap_lost,
            detached_since_unix_ms: if self.consumer.is_some() {
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
                .filter(|e| e.deliveries > 0 && e.slot != Slot::Acked)
                .map(|e| (e.event.seq, e.deliveries))
                .collect(),
            parked: self
                .parked
                .iter()
                .map(|p| ParkedRecord {
                    seq: p.event.seq,
                    deliveries: p.deliveries,
                    parked_at_unix_ms: p.parked_at_ms,
                })
                .collect(),
            acked: self
                .pending
                .iter()
                .filter(|e| e.slot == Slot::Acked)
                .map(|e| e.event.seq)
                .collect(),
        }
    }

    /// The lowest seq this subscription needs kept in the store beyond the
    /// log: pinned in-flight events and parked ones.
    pub fn oldest_kept(&self) -> Option<u64> {
        let pending = self.pending.front().map(|e| e.event.seq);
        let parked = self.parked.iter().map(|p| p.event.seq).min();
        pending.into_iter().chain(parked).min()
    }

    /// Whether this subscription wants `e` (a damaged placeholder's type is
    /// unknown: every subscription must stop at it).
    pub fn selects(&self, e: &LoggedEvent) -> bool {
        e.damaged
            || (e.routed_to(self.upstream_id.as_deref()) && self.selector.matches(&e.event_type))
    }

    /// Fan-out: takes `e` if it matches. Returns whether it did.
    pub fn offer(&mut self, e: &Arc<LoggedEvent>) -> bool {
        if e.seq <= self.acked_through || !self.selects(e) {
            return false;
        }
        self.pending.push_back(Entry {
            event: e.clone(),
            slot: Slot::Unsent,
            deliveries: 0,
        });
        self.counters.matched += 1;
        true
    }

    /// Retention evicted `seq` from the log. If it was pending and not in
    /// flight it is lost, and reported with the next delivery.
    pub fn evicted(&mut self, seq: u64) {
        if let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) {
            match self.pending[i].slot {
                Slot::Unsent | Slot::Delayed { .. } => {
                    self.pending.remove(i);
                    self.gap_lost += 1;
                    self.counters.lost += 1;
                    self.acked_through = self.acked_through.max(seq);
                }
                Slot::InFlight { .. } | Slot::Acked => {}
            }
        }
    }

    pub fn consumer(&self) -> Option<ConnId> {
        self.consumer
    }

    /// `explicit`: the consumer acks one by one, and what it leaves unacked
    /// for that long is delivered again.
    pub fn attach(&mut self, conn: ConnId, window: usize, explicit: Option<Duration>) {
        self.consumer = Some(conn);
        self.detached_at = None;
        self.window = window.max(1);
        self.explicit = explicit;
        self.unsend_in_flight(|_| true);
    }

    /// The consumer left: what was in flight is pending again, and stays
    /// pinned until it is acked or the subscription ends.
    pub fn detach(&mut self, now: (Instant, i64)) {
        self.consumer = None;
        self.explicit = None;
        self.unsend_in_flight(|_| true);
        self.detached_at = Some(now);
    }

    fn unsend_in_flight(&mut self, mut which: impl FnMut(Instant) -> bool) {
        for e in self.pending.iter_mut() {
            if let Slot::InFlight { since } = e.slot {
                if which(since) {
                    e.slot = Slot::Unsent;
                    self.in_flight -= 1;
                }
            }
        }
    }

    /// Up to `max` events within the window, and a gap first if one is due.
    pub fn pull(&mut self, max: usize, head: u64, now: Instant) -> Pulled {
        let mut out = Pulled::default();
        if self.gap_lost > 0 {
            let resume_seq = self
                .pending
                .iter()
                .find(|e| e.slot == Slot::Unsent)
                .map_or(head + 1, |e| e.event.seq);
            out.gap = Some(v1::Gap {
                subscription_id: self.id.clone(),
                lost: self.gap_lost,
                resume_seq,
            });
            self.gap_lost = 0;
        }
        // Explicit acks: what waited too long goes out again.
        if let Some(wait) = self.explicit {
            self.unsend_in_flight(|since| since + wait <= now);
        }
        let mut i = 0;
        while i < self.pending.len() {
            let entry = &self.pending[i];
            let due = match entry.slot {
                Slot::Unsent => true,
                Slot::Delayed { until } if until <= now => true,
                Slot::Delayed { until } => {
                    out.next_due = Some(out.next_due.map_or(until, |d| d.min(until)));
                    false
                }
                Slot::InFlight { since } => {
                    if let Some(wait) = self.explicit {
                        let at = since + wait;
                        out.next_due = Some(out.next_due.map_or(at, |d| d.min(at)));
                    }
                    false
                }
                Slot::Acked => false,
            };
            if !due {
                i += 1;
                continue;
            }
            if self.state != State::Active
                || self.in_flight >= self.window
                || out.events.len() >= max
            {
                break;
            }
            if entry.event.damaged {
                // Reported only once everything before it is acked, so the
                // consumer has written every good event before it stops.
                if self.in_flight == 0 && out.events.is_empty() {
                    out.damaged_at = Some(entry.event.seq);
                }
                break;
            }
            if self.max_deliver > 0 && entry.deliveries >= self.max_deliver {
                let halt = HaltRecord {
                    seq: entry.event.seq,
                    event_id: entry.event.event_id.clone(),
                    deliveries: entry.deliveries,
                    since_unix_ms: crate::hub::now_ms(),
                };
                if self.on_poison == PoisonPolicy::PoisonPark {
                    self.park_at(i);
                    continue;
                }
                self.state = State::Halted(halt.clone());
                out.halted = Some(halt);
                break;
            }
            let entry = &mut self.pending[i];
            entry.slot = Slot::InFlight { since: now };
            entry.deliveries += 1;
            let redelivered = entry.event.seq <= self.max_sent_seq || entry.deliveries > 1;
            if redelivered {
                self.counters.redelivered += 1;
            }
            self.max_sent_seq = self.max_sent_seq.max(entry.event.seq);
            out.events
                .push((entry.event.clone(), redelivered, entry.deliveries));
            self.in_flight += 1;
            i += 1;
        }
        self.counters.delivered += out.events.len() as u64;
        out
    }

    /// Moves `pending[i]` to the parked list.
    fn park_at(&mut self, i: usize) {
        let Some(entry) = self.pending.remove(i) else {
            return;
        };
        if let Slot::InFlight { .. } = entry.slot {
            self.in_flight -= 1;
        }
        self.acked_through = self.acked_through.max(entry.event.seq);
        self.counters.parked += 1;
        if self.parked.len() >= MAX_PARKED {
            self.parked.pop_front();
            self.counters.parked_dropped += 1;
        }
        self.parked.push_back(Parked {
            event: entry.event,
            deliveries: entry.deliveries,
            parked_at_ms: crate::hub::now_ms(),
        });
    }

    /// Drops acked events from the front; returns how many were acked now.
    fn settle(&mut self, newly: u64) -> u64 {
        while self.pending.front().is_some_and(|e| e.slot == Slot::Acked) {
            if let Some(e) = self.pending.pop_front() {
                self.acked_in_queue -= 1;
                self.acked_through = self.acked_through.max(e.event.seq);
            }
        }
        self.counters.acked += newly;
        newly
    }

    fn ack_entry(&mut self, i: usize) -> bool {
        if let Slot::InFlight { .. } = self.pending[i].slot {
            self.pending[i].slot = Slot::Acked;
            self.in_flight -= 1;
            self.acked_in_queue += 1;
            true
        } else {
            false
        }
    }

    /// Cumulative ack: every in-flight event with seq <= `seq` is done.
    /// Returns how many were acked.
    pub fn ack(&mut self, seq: u64) -> u64 {
        let mut n = 0;
        for i in 0..self.pending.len() {
            if self.pending[i].event.seq > seq {
                break;
            }
            n += u64::from(self.ack_entry(i));
        }
        self.settle(n)
    }

    /// Acks one in-flight event (explicit acks). Returns whether it was one.
    pub fn ack_one(&mut self, seq: u64) -> bool {
        let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) else {
            return false;
        };
        let acked = self.ack_entry(i);
        self.settle(u64::from(acked));
        acked
    }

    /// Nack: the in-flight event `seq` is delivered again, not before `until`.
    pub fn nack(&mut self, seq: u64, until: Instant) -> bool {
        let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) else {
            return false;
        };
        if let Slot::InFlight { .. } = self.pending[i].slot {
            self.pending[i].slot = Slot::Delayed { until };
            self.in_flight -= 1;
            true
        } else {
            false
        }
    }

    /// Whether there is something to send now (or a gap to report).
    pub fn has_unsent(&self) -> bool {
        self.gap_lost > 0
            || (self.state == State::Active
                && self.in_flight < self.window
                && self.pending.iter().any(|e| e.slot == Slot::Unsent))
    }

    // ------------------------------------------------------------ operator verbs

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
            self.park_at(i);
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
    /// redelivered mark.
    pub fn seek(&mut self, start_after: u64) {
        self.pending.clear();
        self.in_flight = 0;
        self.acked_in_queue = 0;
        self.gap_lost = 0;
        self.acked_through = start_after;
    }

    /// The parked list, oldest first.
    pub fn parked(&self) -> impl Iterator<Item = &Parked> {
        self.parked.iter()
    }

    /// Moves parked events (those in `seqs`, or all) back to pending, in seq
    /// order, with their delivery counts reset. Returns how many.
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
            let at = self
                .pending
                .binary_search_by_key(&event.seq, |e| e.event.seq)
                .unwrap_or_else(|i| i);
            self.pending.insert(
                at,
                Entry {
                    event: event.clone(),
                    slot: Slot::Unsent,
                    deliveries: 0,
                },
            );
        }
        moved.len()
    }

    // ------------------------------------------------------------ reading

    pub fn expires_at(&self) -> Option<Instant> {
        match (self.consumer, self.detached_at) {
            (None, Some((at, _))) => Some(at + self.ttl),
            _ => None,
        }
    }

    /// Wall-clock time it was left without a consumer, while it is.
    pub fn detached_since_ms(&self) -> Option<i64> {
        self.detached_at
            .filter(|_| self.consumer.is_none())
            .map(|(_, ms)| ms)
    }

    /// Every matching event at or below the cursor has been acked (or
    /// reported lost): the seq before the oldest unacked one, or the head.
    pub fn cursor(&self, head: u64) -> u64 {
        self.pending
            .iter()
            .find(|e| e.slot != Slot::Acked)
            .map_or(head, |e| e.event.seq - 1)
    }

    /// Matched events not yet acked (parked ones excluded).
    pub fn pending_len(&self) -> usize {
        self.pending.len() - self.acked_in_queue
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// The oldest unacked event and how many times it was delivered.
    pub fn oldest_pending(&self) -> Option<(&Arc<LoggedEvent>, u32)> {
        self.pending
            .iter()
            .find(|e| e.slot != Slot::Acked)
            .map(|e| (&e.event, e.deliveries))
    }

    pub fn explicit_ack(&self) -> bool {
        self.explicit.is_some()
    }
}

pub fn poison_name(p: PoisonPolicy) -> &'static str {
    match p {
        PoisonPolicy::PoisonHalt => "halt",
        PoisonPolicy::PoisonPark => "park",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ev(seq: u64, t: &str) -> Arc<LoggedEvent> {
        Arc::new(LoggedEvent {
            seq,
            event_type: t.into(),
            encoded: Bytes::from_static(b"x"),
            ..LoggedEvent::default()
        })
    }

    fn now() -> (Instant, i64) {
        (Instant::now(), 1_000)
    }

    fn sub(window: usize) -> Subscription {
        let sel = Selector::new(&["a.*".into()], "").unwrap();
        Subscription::new(
            "s".into(),
            sel,
            false,
            Duration::from_secs(60),
            None,
            0,
            now(),
            window,
        )
    }

    fn seqs(p: &Pulled) -> Vec<(u64, bool)> {
        p.events.iter().map(|(e, r, _)| (e.seq, *r)).collect()
    }

    #[test]
    fn offer_selects_by_pattern_and_route() {
        let mut s = sub(10);
        assert!(s.offer(&ev(1, "a.x")));
        assert!(!s.offer(&ev(2, "b.x")));
        let routed = Arc::new(LoggedEvent {
            seq: 3,
            event_type: "a.y".into(),
            route: "up-1".into(),
            ..LoggedEvent::default()
        });
        assert!(!s.offer(&routed), "routed to another upstream subscription");
        s.upstream_id = Some("up-1".into());
        assert!(s.offer(&routed));
        assert_eq!(s.counters.matched, 2);
    }

    #[test]
    fn attach_pull_ack_within_the_window() {
        let mut s = sub(2);
        for i in 1..=3 {
            s.offer(&ev(i, "a.x"));
        }
        assert!(s.expires_at().is_some(), "detached: the TTL runs");
        s.attach(7, 2, None);
        assert!(s.expires_at().is_none());
        assert_eq!(
            seqs(&s.pull(100, 3, Instant::now())),
            vec![(1, false), (2, false)]
        );
        assert!(
            s.pull(100, 3, Instant::now()).events.is_empty(),
            "window full"
        );
        assert_eq!(s.ack(1), 1);
        assert_eq!(seqs(&s.pull(100, 3, Instant::now())), vec![(3, false)]);
        assert_eq!(s.ack(3), 2);
        assert_eq!(s.cursor(3), 3);
        assert_eq!(s.counters.acked, 3);
    }

    #[test]
    fn detach_then_reattach_redelivers_marked() {
        let mut s = sub(10);
        for i in 1..=3 {
            s.offer(&ev(i, "a.x"));
        }
        s.attach(1, 10, None);
        s.pull(100, 3, Instant::now());
        s.ack(1);
        s.detach(now());
        assert_eq!(s.cursor(3), 1);
        s.attach(2, 10, None);
        assert_eq!(
            seqs(&s.pull(100, 3, Instant::now())),
            vec![(2, true), (3, true)]
        );
        assert_eq!(s.counters.redelivered, 2);
    }

    #[test]
    fn takeover_is_detach_then_attach() {
        let mut s = sub(10);
        s.offer(&ev(1, "a.x"));
        s.attach(1, 10, None);
        s.pull(100, 1, Instant::now());
        s.detach(now());
        s.attach(2, 10, None);
        assert_eq!(s.consumer(), Some(2));
        assert_eq!(seqs(&s.pull(100, 1, Instant::now())), vec![(1, true)]);
    }

    #[test]
    fn eviction_of_unsent_events_is_a_gap_and_in_flight_ones_are_pinned() {
        let mut s = sub(2);
        for i in 1..=5 {
            s.offer(&ev(i, "a.x"));
        }
        s.attach(1, 2, None);
        s.pull(100, 5, Instant::now()); // 1 and 2 in flight
        for i in 1..=4 {
            s.evicted(i);
        }
        assert_eq!(s.pending_len(), 3, "1 and 2 pinned, 5 pending");
        assert_eq!(s.counters.lost, 2);
        s.ack(2);
        let p = s.pull(100, 5, Instant::now());
        let gap = p.gap.clone().unwrap();
        assert_eq!((gap.lost, gap.resume_seq), (2, 5));
        assert_eq!(seqs(&p), vec![(5, false)]);
    }

    #[test]
    fn a_detached_backlog_stays_bounded_by_retention() {
        // The regression: pinned events evicted from the log used to block
        // every later eviction once their consumer was gone.
        let mut s = sub(10);
        for i in 1..=10 {
            s.offer(&ev(i, "a.x"));
        }
        s.attach(1, 10, None);
        s.pull(100, 10, Instant::now());
        for i in 1..=10 {
            s.evicted(i); // pinned: kept
        }
        s.detach(now());
        for i in 11..=1010 {
            s.offer(&ev(i, "a.x"));
            if i > 100 {
                s.evicted(i - 100);
            }
        }
        assert!(s.pending_len() <= 100 + 10, "{}", s.pending_len());
        let c = s.counters;
        assert_eq!(c.matched, c.acked + s.pending_len() as u64 + c.lost);
    }

    #[test]
    fn a_gap_is_reported_to_whichever_consumer_reads_next() {
        let mut s = sub(10);
        for i in 1..=3 {
            s.offer(&ev(i, "a.x"));
        }
        s.evicted(1);
        s.attach(1, 10, None);
        s.detach(now());
        s.attach(2, 10, None);
        let p = s.pull(100, 3, Instant::now());
        assert_eq!(p.gap.map(|g| g.lost), Some(1));
    }

    #[test]
    fn delivery_stops_at_a_damaged_event() {
        let mut s = sub(10);
        s.offer(&ev(1, "a.x"));
        s.offer(&Arc::new(LoggedEvent {
            seq: 2,
            damaged: true,
            ..LoggedEvent::default()
        }));
        s.offer(&ev(3, "a.x"));
        s.attach(1, 10, None);
        let p = s.pull(100, 3, Instant::now());
        assert_eq!(seqs(&p), vec![(1, false)]);
        assert_eq!(p.damaged_at, None, "not before 1 is acked");
        assert_eq!(s.pull(100, 3, Instant::now()).damaged_at, None);
        s.ack(1);
        let p = s.pull(100, 3, Instant::now());
        assert!(p.events.is_empty());
        assert_eq!(p.damaged_at, Some(2));
        assert_eq!(s.pull(100, 3, Instant::now()).damaged_at, Some(2));
    }

    #[test]
    fn a_record_round_trips_and_a_crash_marks_pending_redelivered() {
        let mut s = sub(10);
        let log: Vec<_> = (1..=5).map(|i| ev(i, "a.x")).collect();
        for e in &log {
            s.offer(e);
        }
        s.attach(1, 10, None);
        s.pull(2, 5, Instant::now());
        s.ack(1);
        let rec = s.record(1, 5);
        assert_eq!(rec.cursor, 1);
        assert_eq!(rec.max_sent_seq, 2);
        let sel = Selector::new(&rec.patterns, &rec.filter).unwrap();
        let clean = Subscription::restore(&rec, sel.clone(), &log, (1, 5, true), now(), 10);
        assert_eq!(clean.pending_len(), 4);
        let mut clean = clean;
        clean.attach(9, 10, None);
        assert_eq!(
            seqs(&clean.pull(100, 5, Instant::now())),
            vec![(2, true), (3, false), (4, false), (5, false)]
        );
        let mut crashed = Subscription::restore(&rec, sel, &log, (1, 5, false), now(), 10);
        crashed.attach(9, 10, None);
        assert!(crashed
            .pull(100, 5, Instant::now())
            .events
            .iter()
            .all(|(_, r, _)| *r));
    }

    #[test]
    fn the_ttl_clock_keeps_running_across_a_restore() {
        let s = sub(10);
        let mut rec = s.record(1, 0);
        rec.detached_since_unix_ms = Some(1_000);
        let sel = Selector::new(&rec.patterns, &rec.filter).unwrap();
        let at = Instant::now();
        let r = Subscription::restore(&rec, sel, &[], (1, 0, true), (at, 31_000), 10);
        let left = r.expires_at().unwrap().saturating_duration_since(at);
        assert!(left <= Duration::from_secs(30), "{left:?}");
    }

    fn explicit(window: usize, wait: Duration) -> Subscription {
        let mut s = sub(window);
        s.attach(1, window, Some(wait));
        s
    }

    fn deliveries(p: &Pulled) -> Vec<(u64, bool, u32)> {
        p.events.iter().map(|(e, r, d)| (e.seq, *r, *d)).collect()
    }

    #[test]
    fn explicit_acks_out_of_order_move_the_cursor_only_past_a_contiguous_prefix() {
        let mut s = explicit(10, Duration::from_secs(30));
        for i in 1..=4 {
            s.offer(&ev(i, "a.x"));
        }
        let t = Instant::now();
        assert_eq!(s.pull(10, 4, t).events.len(), 4);
        assert!(s.ack_one(3));
        assert!(!s.ack_one(3), "twice is a no-op");
        assert_eq!(s.cursor(4), 0);
        assert_eq!(s.pending_len(), 3);
        assert!(s.ack_one(1));
        assert_eq!(s.cursor(4), 1);
        assert!(s.ack_one(2));
        assert_eq!(
            s.cursor(4),
            3,
            "3 was acked before: the cursor jumps past it"
        );
        assert_eq!(s.counters.acked, 3);
        assert_eq!(s.in_flight(), 1);
    }

    #[test]
    fn an_unacked_event_comes_again_after_the_ack_wait_counted_and_marked() {
        let mut s = explicit(10, Duration::from_secs(30));
        s.offer(&ev(1, "a.x"));
        let t = Instant::now();
        assert_eq!(deliveries(&s.pull(10, 1, t)), vec![(1, false, 1)]);
        let p = s.pull(10, 1, t + Duration::from_secs(10));
        assert!(p.events.is_empty());
        assert_eq!(p.next_due, Some(t + Duration::from_secs(30)));
        let p = s.pull(10, 1, t + Duration::from_secs(31));
        assert_eq!(deliveries(&p), vec![(1, true, 2)]);
    }

    #[test]
    fn a_nack_with_a_delay_redelivers_after_it() {
        let mut s = explicit(10, Duration::from_secs(30));
        s.offer(&ev(1, "a.x"));
        s.offer(&ev(2, "a.x"));
        let t = Instant::now();
        s.pull(10, 2, t);
        assert!(s.nack(1, t + Duration::from_secs(5)));
        s.ack_one(2);
        let p = s.pull(10, 2, t + Duration::from_secs(1));
        assert!(p.events.is_empty());
        assert_eq!(p.next_due, Some(t + Duration::from_secs(5)));
        assert_eq!(
            deliveries(&s.pull(10, 2, t + Duration::from_secs(5))),
            vec![(1, true, 2)]
        );
    }

    #[test]
    fn poison_halts_then_restart_retries_and_skip_parks() {
        let mut s = explicit(10, Duration::from_secs(1));
        s.max_deliver = 2;
        s.offer(&ev(1, "a.x"));
        s.offer(&ev(2, "a.x"));
        let t = Instant::now();
        s.pull(1, 2, t); // 1 delivered once
        s.nack(1, t);
        s.pull(1, 2, t); // twice
        s.nack(1, t);
        let p = s.pull(1, 2, t);
        assert!(p.events.is_empty());
        let h = p.halted.expect("halted");
        assert_eq!((h.seq, h.deliveries), (1, 2));
        assert_eq!(s.state.name(), "halted");
        assert!(
            s.pull(10, 2, t).events.is_empty(),
            "a halted subscription delivers nothing"
        );
        assert!(s.enable().is_err());
        s.restart().unwrap();
        assert!(s.restart().is_err(), "not halted any more");
        assert_eq!(deliveries(&s.pull(1, 2, t)), vec![(1, true, 1)]);
        s.nack(1, t);
        s.pull(1, 2, t);
        s.nack(1, t);
        assert!(s.pull(1, 2, t).halted.is_some());
        assert_eq!(s.skip().unwrap(), 1);
        assert_eq!(s.parked_len(), 1);
        assert_eq!(deliveries(&s.pull(10, 2, t)), vec![(2, false, 1)]);
        let c = s.counters;
        assert_eq!(
            c.matched,
            c.acked + s.pending_len() as u64 + c.lost + c.parked
        );
    }

    #[test]
    fn poison_with_park_moves_on_and_parked_events_can_be_replayed() {
        let mut s = explicit(10, Duration::from_secs(1));
        s.max_deliver = 1;
        s.on_poison = PoisonPolicy::PoisonPark;
        s.offer(&ev(1, "a.x"));
        s.offer(&ev(2, "a.x"));
        let t = Instant::now();
        s.pull(10, 2, t);
        s.nack(1, t);
        s.ack_one(2);
        let p = s.pull(10, 2, t);
        assert!(p.events.is_empty() && p.halted.is_none());
        assert_eq!(s.parked().map(|p| p.event.seq).collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.cursor(2), 2);
        assert_eq!(s.replay_parked(&[]), 1);
        assert_eq!(deliveries(&s.pull(10, 2, t)), vec![(1, true, 1)]);
    }

    #[test]
    fn a_disabled_subscription_collects_but_delivers_nothing() {
        let mut s = sub(10);
        s.disable().unwrap();
        s.offer(&ev(1, "a.x"));
        s.attach(1, 10, None);
        assert!(s.pull(10, 1, Instant::now()).events.is_empty());
        assert!(!s.has_unsent());
        s.enable().unwrap();
        assert_eq!(s.pull(10, 1, Instant::now()).events.len(), 1);
    }

    #[test]
    fn seek_forgets_pending_and_restarts_from_the_target() {
        let mut s = sub(10);
        for i in 1..=3 {
            s.offer(&ev(i, "a.x"));
        }
        s.attach(1, 10, None);
        s.pull(10, 3, Instant::now());
        s.seek(1);
        assert_eq!(s.pending_len(), 0);
        assert_eq!(s.in_flight(), 0);
        assert!(
            !s.offer(&ev(1, "a.x")),
            "at or before the target: not taken"
        );
        assert!(s.offer(&ev(2, "a.x")));
        assert_eq!(
            deliveries(&s.pull(10, 3, Instant::now())),
            vec![(2, true, 1)]
        );
    }

    #[test]
    fn delivery_counts_and_the_halt_survive_a_record_round_trip() {
        let mut s = explicit(10, Duration::from_secs(1));
        s.max_deliver = 1;
        let log: Vec<_> = (1..=2).map(|i| ev(i, "a.x")).collect();
        for e in &log {
            s.offer(e);
        }
        let t = Instant::now();
        s.pull(1, 2, t);
        s.nack(1, t);
        assert!(s.pull(1, 2, t).halted.is_some());
        let rec = s.record(1, 2);
        assert_eq!(rec.state, "halted");
        assert_eq!(rec.deliveries, vec![(1, 1)]);
        let sel = Selector::new(&rec.patterns, &rec.filter).unwrap();
        let r = Subscription::restore(&rec, sel, &log, (1, 2, true), now(), 10);
        assert_eq!(r.state.name(), "halted");
        assert_eq!(r.max_deliver, 1);
        assert_eq!(r.oldest_pending().map(|(e, n)| (e.seq, n)), Some((1, 1)));
    }
}

/// Property test of the state machine against a simple model: random
/// sequences of publish, attach, detach, pull, ack, eviction and takeover.
/// Whatever happens: nothing acked is delivered again; nothing is delivered
/// twice without the redelivered mark; every matched event is acked,
/// pending, or counted lost (and a gap reported); in flight never exceeds
/// the window; a detached backlog stays within retention plus one window.
#[cfg(test)]
mod model {
    use std::collections::{BTreeSet, HashMap};

    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Publish { matching: bool },
        Attach,
        Detach,
        Takeover,
        Pull(usize),
        AckAll,
        AckSome(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => any::<bool>().prop_map(|m| Op::Publish { matching: m }),
            1 => Just(Op::Attach),
            1 => Just(Op::Detach),
            1 => Just(Op::Takeover),
            3 => (1usize..8).prop_map(Op::Pull),
            2 => Just(Op::AckAll),
            2 => (0usize..4).prop_map(Op::AckSome),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn the_state_machine_keeps_its_promises(
            ops in prop::collection::vec(op(), 1..200),
            window in 1usize..6,
            retention in 1usize..12,
        ) {
            let sel = Selector::new(&["a.*".into()], "").unwrap();
            let now = (Instant::now(), 0);
            let mut s = Subscription::new("s".into(), sel, false, Duration::from_secs(60), None, 0, now, window);
            let mut log: VecDeque<Arc<LoggedEvent>> = VecDeque::new();
            let mut next = 1u64;
            let mut conn = 0u64;
            let mut acked: BTreeSet<u64> = BTreeSet::new();
            let mut delivered: HashMap<u64, u32> = HashMap::new();
            let mut in_flight: Vec<u64> = vec![];
            let mut gap_total = 0u64;
            for op in ops {
                match op {
                    Op::Publish { matching } => {
                        let e = Arc::new(LoggedEvent {
                            seq: next,
                            event_type: if matching { "a.x" } else { "b.x" }.into(),
                            encoded: Bytes::from_static(b"e"),
                            ..LoggedEvent::default()
                        });
                        next += 1;
                        s.offer(&e);
                        log.push_back(e);
                        while log.len() > retention {
                            if let Some(old) = log.pop_front() {
                                s.evicted(old.seq);
                            }
                        }
                    }
                    Op::Attach if s.consumer().is_none() => {
                        conn += 1;
                        s.attach(conn, window, None);
                        in_flight.clear();
                    }
                    Op::Takeover => {
                        s.detach(now);
                        conn += 1;
                        s.attach(conn, window, None);
                        in_flight.clear();
                    }
                    Op::Detach if s.consumer().is_some() => {
                        s.detach(now);
                        in_flight.clear();
                    }
                    Op::Pull(n) if s.consumer().is_some() => {
                        let head = next - 1;
                        let p = s.pull(n, head, Instant::now());
                        if let Some(g) = p.gap { gap_total += g.lost; }
                        for (e, redelivered, _) in p.events {
                            prop_assert!(!acked.contains(&e.seq), "acked seq {} delivered again", e.seq);
                            let times = delivered.entry(e.seq).or_default();
                            prop_assert!(*times == 0 || redelivered, "seq {} delivered twice unmarked", e.seq);
                            *times += 1;
                            in_flight.push(e.seq);
                        }
                        prop_assert!(s.in_flight() <= window);
                    }
                    Op::AckAll if s.consumer().is_some() => {
                        if let Some(&last) = in_flight.last() {
                            s.ack(last);
                            acked.extend(in_flight.drain(..));
                        }
                    }
                    Op::AckSome(k) if s.consumer().is_some() && k > 0 && k <= in_flight.len() => {
                        s.ack(in_flight[k - 1]);
                        acked.extend(in_flight.drain(..k));
                    }
                    _ => {}
                }
                let c = s.counters;
                prop_assert_eq!(c.matched, c.acked + s.pending_len() as u64 + c.lost + c.parked);
                prop_assert_eq!(c.acked, acked.len() as u64);
                prop_assert!(s.pending_len() <= retention + window);
                prop_assert!(gap_total <= c.lost);
            }
            // Attach and drain: every loss is reported by a gap by the end.
            s.detach(now);
            s.attach(conn + 1, window, None);
            for _ in 0..1000 {
                let p = s.pull(usize::MAX, next - 1, Instant::now());
                if let Some(g) = p.gap { gap_total += g.lost; }
                let Some((last, _, _)) = p.events.last() else { break };
                s.ack(last.seq);
            }
            prop_assert_eq!(gap_total, s.counters.lost);
            prop_assert_eq!(s.pending_len(), 0);
        }
    }
}
