//! [`Subscription`]: the delivery state of one subscription — what it
//! selects, what is pending, what is in flight, what was lost — as a pure
//! state machine. No I/O, no locks, no clocks of its own: the hub calls it
//! under its lock and passes the time in.
//!
//! `pending` holds the matched events not yet acked, oldest first; the first
//! `sent` of them are in flight to the attached consumer. In-flight events
//! are pinned: retention does not take them from the subscription (at most
//! one window of them), so they can be delivered again if the consumer goes
//! away without acking. Everything else in `pending` is also in the log;
//! when retention evicts it before it was sent, it is dropped and counted as
//! lost, and the next consumer to read past it gets a gap.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use proto::v1;

use crate::{
    eventlog::LoggedEvent,
    pattern::Selector,
    store::{SubCounters, SubRecord},
};

pub type ConnId = u64;

#[derive(Debug)]
pub struct Subscription {
    pub id: String,
    pub selector: Selector,
    /// Created by one `consume` run and removed by it: never stored.
    pub owned: bool,
    pub ttl: Duration,
    pub created_at_ms: i64,
    /// The upstream subscription this one is bound to (personal stream).
    pub upstream_id: Option<String>,
    pending: VecDeque<Arc<LoggedEvent>>,
    sent: usize,
    /// Highest seq ever sent: anything at or below it that is sent again is
    /// marked redelivered.
    max_sent_seq: u64,
    /// Every matching event at or below it was acked or reported lost.
    acked_through: u64,
    consumer: Option<ConnId>,
    window: usize,
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
    pub events: Vec<(Arc<LoggedEvent>, bool)>,
    /// The next event to deliver is damaged in the store and everything
    /// before it is acked: delivery stops here.
    pub damaged_at: Option<u64>,
}

impl Subscription {
    /// A new subscription, detached, with `backlog` (already matched, from
    /// its start position) pending.
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
            pending: VecDeque::new(),
            sent: 0,
            max_sent_seq: 0,
            acked_through: start_after,
            consumer: None,
            window: window.max(1),
            detached_at: Some(now),
            gap_lost: 0,
            counters: SubCounters::default(),
        }
    }

    /// Rebuilds a stored subscription. `events` is the recovered log (seq
    /// order); `log_floor` is where the retained log starts. After a crash
    /// (`clean == false`) every pending event counts as possibly sent, so it
    /// comes again marked redelivered.
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
        let mut sub = Subscription {
            id: rec.id.clone(),
            selector,
            owned: false,
            ttl: Duration::from_millis(rec.ttl_ms),
            created_at_ms: rec.created_at_unix_ms,
            upstream_id: rec.upstream_id.clone(),
            pending: VecDeque::new(),
            sent: 0,
            max_sent_seq: rec.max_sent_seq,
            acked_through: rec.cursor,
            consumer: None,
            window: window.max(1),
            detached_at: Some((now.0.checked_sub(ago).unwrap_or(now.0), detached_ms)),
            gap_lost: rec.gap_lost,
            counters: rec.counters,
        };
        for e in events.iter().filter(|e| e.seq > rec.cursor) {
            let wanted = if e.seq < snap_floor {
                rec.pinned.binary_search(&e.seq).is_ok()
            } else {
                sub.selects(e)
            };
            if wanted {
                sub.pending.push_back(e.clone());
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
                .map(|e| e.seq)
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
        }
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
        self.pending.push_back(e.clone());
        self.counters.matched += 1;
        true
    }

    /// Retention evicted `seq` from the log. If it was pending and not in
    /// flight it is lost, and reported with the next delivery.
    pub fn evicted(&mut self, seq: u64) {
        if let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.seq) {
            if i >= self.sent {
                self.pending.remove(i);
                self.gap_lost += 1;
                self.counters.lost += 1;
                self.acked_through = self.acked_through.max(seq);
            }
        }
    }

    pub fn consumer(&self) -> Option<ConnId> {
        self.consumer
    }

    pub fn attach(&mut self, conn: ConnId, window: usize) {
        self.consumer = Some(conn);
        self.detached_at = None;
        self.sent = 0;
        self.window = window.max(1);
    }

    /// The consumer left: what was in flight is pending again, and stays
    /// pinned until it is acked or the subscription ends.
    pub fn detach(&mut self, now: (Instant, i64)) {
        self.consumer = None;
        self.sent = 0;
        self.detached_at = Some(now);
    }

    /// Up to `max` events within the window, and a gap first if one is due.
    pub fn pull(&mut self, max: usize, head: u64) -> Pulled {
        let mut out = Pulled::default();
        if self.gap_lost > 0 {
            let resume_seq = self.pending.get(self.sent).map_or(head + 1, |e| e.seq);
            out.gap = Some(v1::Gap {
                subscription_id: self.id.clone(),
                lost: self.gap_lost,
                resume_seq,
            });
            self.gap_lost = 0;
        }
        let credit = self.window.saturating_sub(self.sent).min(max);
        let end = (self.sent + credit).min(self.pending.len());
        for e in self.pending.range(self.sent..end) {
            if e.damaged {
                // Reported only once everything before it is acked, so the
                // consumer has written every good event before it stops.
                if self.sent == 0 && out.events.is_empty() {
                    out.damaged_at = Some(e.seq);
                }
                break;
            }
            let redelivered = e.seq <= self.max_sent_seq;
            if redelivered {
                self.counters.redelivered += 1;
            }
            out.events.push((e.clone(), redelivered));
        }
        self.sent += out.events.len();
        if let Some((last, _)) = out.events.last() {
            self.max_sent_seq = self.max_sent_seq.max(last.seq);
        }
        self.counters.delivered += out.events.len() as u64;
        out
    }

    /// Cumulative ack: every in-flight event with seq <= `seq` is done.
    /// Returns how many were acked.
    pub fn ack(&mut self, seq: u64) -> u64 {
        let mut n = 0;
        while self.sent > 0 && self.pending.front().is_some_and(|e| e.seq <= seq) {
            if let Some(e) = self.pending.pop_front() {
                self.acked_through = self.acked_through.max(e.seq);
            }
            self.sent -= 1;
            n += 1;
        }
        self.counters.acked += n;
        n
    }

    /// Whether there is something to send now.
    pub fn has_unsent(&self) -> bool {
        self.pending.len() > self.sent || self.gap_lost > 0
    }

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
        self.pending.front().map_or(head, |e| e.seq - 1)
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    pub fn in_flight(&self) -> usize {
        self.sent
    }

    pub fn oldest_pending(&self) -> Option<&Arc<LoggedEvent>> {
        self.pending.front()
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
        p.events.iter().map(|(e, r)| (e.seq, *r)).collect()
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
        s.attach(7, 2);
        assert!(s.expires_at().is_none());
        assert_eq!(seqs(&s.pull(100, 3)), vec![(1, false), (2, false)]);
        assert!(s.pull(100, 3).events.is_empty(), "window full");
        assert_eq!(s.ack(1), 1);
        assert_eq!(seqs(&s.pull(100, 3)), vec![(3, false)]);
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
        s.attach(1, 10);
        s.pull(100, 3);
        s.ack(1);
        s.detach(now());
        assert_eq!(s.cursor(3), 1);
        s.attach(2, 10);
        assert_eq!(seqs(&s.pull(100, 3)), vec![(2, true), (3, true)]);
        assert_eq!(s.counters.redelivered, 2);
    }

    #[test]
    fn takeover_is_detach_then_attach() {
        let mut s = sub(10);
        s.offer(&ev(1, "a.x"));
        s.attach(1, 10);
        s.pull(100, 1);
        s.detach(now());
        s.attach(2, 10);
        assert_eq!(s.consumer(), Some(2));
        assert_eq!(seqs(&s.pull(100, 1)), vec![(1, true)]);
    }

    #[test]
    fn eviction_of_unsent_events_is_a_gap_and_in_flight_ones_are_pinned() {
        let mut s = sub(2);
        for i in 1..=5 {
            s.offer(&ev(i, "a.x"));
        }
        s.attach(1, 2);
        s.pull(100, 5); // 1 and 2 in flight
        for i in 1..=4 {
            s.evicted(i);
        }
        assert_eq!(s.pending_len(), 3, "1 and 2 pinned, 5 pending");
        assert_eq!(s.counters.lost, 2);
        s.ack(2);
        let p = s.pull(100, 5);
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
        s.attach(1, 10);
        s.pull(100, 10);
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
        s.attach(1, 10);
        s.detach(now());
        s.attach(2, 10);
        let p = s.pull(100, 3);
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
        s.attach(1, 10);
        let p = s.pull(100, 3);
        assert_eq!(seqs(&p), vec![(1, false)]);
        assert_eq!(p.damaged_at, None, "not before 1 is acked");
        assert_eq!(s.pull(100, 3).damaged_at, None);
        s.ack(1);
        let p = s.pull(100, 3);
        assert!(p.events.is_empty());
        assert_eq!(p.damaged_at, Some(2));
        assert_eq!(s.pull(100, 3).damaged_at, Some(2));
    }

    #[test]
    fn a_record_round_trips_and_a_crash_marks_pending_redelivered() {
        let mut s = sub(10);
        let log: Vec<_> = (1..=5).map(|i| ev(i, "a.x")).collect();
        for e in &log {
            s.offer(e);
        }
        s.attach(1, 10);
        s.pull(2, 5);
        s.ack(1);
        let rec = s.record(1, 5);
        assert_eq!(rec.cursor, 1);
        assert_eq!(rec.max_sent_seq, 2);
        let sel = Selector::new(&rec.patterns, &rec.filter).unwrap();
        let clean = Subscription::restore(&rec, sel.clone(), &log, (1, 5, true), now(), 10);
        assert_eq!(clean.pending_len(), 4);
        let mut clean = clean;
        clean.attach(9, 10);
        assert_eq!(
            seqs(&clean.pull(100, 5)),
            vec![(2, true), (3, false), (4, false), (5, false)]
        );
        let mut crashed = Subscription::restore(&rec, sel, &log, (1, 5, false), now(), 10);
        crashed.attach(9, 10);
        assert!(crashed.pull(100, 5).events.iter().all(|(_, r)| *r));
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
                        s.attach(conn, window);
                        in_flight.clear();
                    }
                    Op::Takeover => {
                        s.detach(now);
                        conn += 1;
                        s.attach(conn, window);
                        in_flight.clear();
                    }
                    Op::Detach if s.consumer().is_some() => {
                        s.detach(now);
                        in_flight.clear();
                    }
                    Op::Pull(n) if s.consumer().is_some() => {
                        let head = next - 1;
                        let p = s.pull(n, head);
                        if let Some(g) = p.gap { gap_total += g.lost; }
                        for (e, redelivered) in p.events {
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
                prop_assert_eq!(c.matched, c.acked + s.pending_len() as u64 + c.lost);
                prop_assert_eq!(c.acked, acked.len() as u64);
                prop_assert!(s.pending_len() <= retention + window);
                prop_assert!(gap_total <= c.lost);
            }
            // Attach and drain: every loss is reported by a gap by the end.
            s.detach(now);
            s.attach(conn + 1, window);
            for _ in 0..1000 {
                let p = s.pull(usize::MAX, next - 1);
                if let Some(g) = p.gap { gap_total += g.lost; }
                let Some((last, _)) = p.events.last() else { break };
                s.ack(last.seq);
            }
            prop_assert_eq!(gap_total, s.counters.lost);
            prop_assert_eq!(s.pending_len(), 0);
        }
    }
}
