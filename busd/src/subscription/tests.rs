//! Unit tests of the subscription state machine: selection, the window,
//! detach and redelivery, retention and gaps, damaged events, the stored
//! record, explicit acks and nacks, poison, and the operator verbs.

use super::exact_tests::on_a;
use super::*;
use bytes::Bytes;

fn ev(seq: u64, t: &str) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: t.into(),
        encoded: Bytes::from_static(b"x").into(),
        ..LoggedEvent::default()
    })
}

fn now() -> (Instant, i64) {
    (Instant::now(), 1_000)
}

fn sub(window: usize) -> Subscription {
    on_a(0, now(), window)
}

fn seqs(p: &Pulled) -> Vec<(u64, bool)> {
    p.events.iter().map(|(e, r, _)| (e.seq, *r)).collect()
}

#[test]
fn offer_selects_by_pattern_and_route() {
    let mut s = sub(10);
    assert!(s.offer(&ev(1, "a.x")).taken());
    assert!(!s.offer(&ev(2, "b.x")).taken());
    let routed = Arc::new(LoggedEvent {
        seq: 3,
        event_type: "a.y".into(),
        route: "up-1".into(),
        ..LoggedEvent::default()
    });
    assert!(
        !s.offer(&routed).taken(),
        "routed to another upstream subscription"
    );
    s.upstream_id = Some("up-1".into());
    assert!(s.offer(&routed).taken());
    assert_eq!(s.counters.matched, 2);
}

#[test]
fn a_run_of_one_interned_type_is_judged_once_and_judged_right() {
    let mut names = crate::eventlog::Interner::default();
    let typed = |seq: u64, t: &Name| {
        Arc::new(LoggedEvent {
            seq,
            event_type: t.clone(),
            ..LoggedEvent::default()
        })
    };
    let (ax, bx) = (names.name("a.x"), names.name("b.x"));
    let mut s = sub(10);
    let taken: Vec<bool> = [(1, &ax), (2, &ax), (3, &bx), (4, &bx), (5, &ax)]
        .into_iter()
        .map(|(seq, t)| s.offer(&typed(seq, t)).taken())
        .collect();
    assert_eq!(taken, [true, true, false, false, true]);
    // Equal types that are not one allocation are judged again.
    assert!(s.offer(&ev(6, "a.x")).taken());
    assert!(!s.offer(&ev(7, "b.x")).taken());
    assert!(!s.offer(&typed(8, &Name::default())).taken(), "no type");
    assert_eq!(s.counters.matched, 4);
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
    assert_eq!(s.ack(1), [1]);
    assert_eq!(seqs(&s.pull(100, 3, Instant::now())), vec![(3, false)]);
    assert_eq!(s.ack(3), [2, 3]);
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
    let rec = s.record(1, 5, now());
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
    let mut rec = s.record(1, 0, now());
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
        !s.offer(&ev(1, "a.x")).taken(),
        "at or before the target: not taken"
    );
    assert!(s.offer(&ev(2, "a.x")).taken());
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
    let rec = s.record(1, 2, now());
    assert_eq!(rec.state, "halted");
    assert_eq!(rec.deliveries, vec![(1, 1)]);
    let sel = Selector::new(&rec.patterns, &rec.filter).unwrap();
    let r = Subscription::restore(&rec, sel, &log, (1, 2, true), now(), 10);
    assert_eq!(r.state.name(), "halted");
    assert_eq!(r.max_deliver, 1);
    assert_eq!(r.oldest_pending().map(|(e, n)| (e.seq, n)), Some((1, 1)));
}

#[test]
fn a_hole_before_the_subscription_read_it_is_reported_as_one_gap() {
    let mut s = sub(10);
    s.offer(&ev(1, "a.x"));
    s.attach(1, 10, None);
    assert_eq!(s.missed(2, 250), 249);
    s.offer(&ev(251, "a.x"));
    let p = s.pull(10, 251, Instant::now());
    let gap = p.gap.as_ref().expect("a gap");
    assert_eq!(gap.lost, 249);
    assert_eq!(seqs(&p), [(1, false), (251, false)]);
    assert_eq!(s.counters.lost, 249);
    assert_eq!(s.missed(100, 200), 0, "nothing below what it passed");
}

#[test]
fn a_hole_counts_only_past_where_the_subscription_starts() {
    let mut s = on_a(100, now(), 10);
    assert_eq!(s.missed(50, 120), 20);
    s.shared = true;
    s.set_claimed(true);
    assert_eq!(
        s.missed(121, 130),
        0,
        "a shared one gets its events by claim"
    );
}

#[test]
fn a_pull_stops_at_its_byte_budget_but_always_takes_one_event() {
    let mut s = sub(100);
    for seq in 1..=3 {
        s.offer(&Arc::new(LoggedEvent {
            seq,
            event_type: "a.x".into(),
            encoded: Bytes::from(vec![0u8; 100_000]).into(),
            ..LoggedEvent::default()
        }));
    }
    s.attach(7, 100, None);
    let t = Instant::now();
    // 100 kB taken, under 150 kB: one more; then over: stop.
    assert_eq!(s.pull_within(256, 150_000, 3, t).events.len(), 2);
    // A budget smaller than one event still takes one.
    assert_eq!(s.pull_within(256, 10, 3, t).events.len(), 1);
}
