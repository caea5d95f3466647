//! Unit tests of exact delivery: cumulative acks settle in delivery order
//! (an event replayed behind higher seqs is not settled by their ack), a
//! gap counts as reported only once the consumer read past it, and a gap
//! names the seq delivery resumes at above every lost one.

use super::*;
use bytes::Bytes;

/// An `a.x` event at `seq` (also the slow and verb tests' event).
pub(super) fn ev(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "a.x".into(),
        encoded: Bytes::from_static(b"x").into(),
        ..LoggedEvent::default()
    })
}

fn now() -> (Instant, i64) {
    (Instant::now(), 1_000)
}

/// A test's subscription `s` on `a.*`, a minute's TTL, starting after
/// `start_after`, made at `now`, with credit `window` (also the other
/// subscription tests').
pub(super) fn on_a(start_after: u64, now: (Instant, i64), window: usize) -> Subscription {
    let sel = Selector::new(&["a.*".into()], "").unwrap();
    Subscription::new(
        "s".into(),
        sel,
        false,
        Duration::from_secs(60),
        None,
        start_after,
        now,
        window,
    )
}

fn sub(window: usize) -> Subscription {
    let mut s = on_a(0, now(), window);
    s.on_poison = PoisonPolicy::PoisonPark;
    s
}

fn sent(p: &Pulled) -> Vec<u64> {
    p.events.iter().map(|(e, _, _)| e.seq).collect()
}

/// 1..=5 offered, attached; 1 delivered and termed (parked).
fn with_one_parked(window: usize) -> Subscription {
    let mut s = sub(window);
    for i in 1..=5 {
        s.offer(&ev(i));
    }
    s.attach(1, window, None);
    assert_eq!(sent(&s.pull(1, 5, Instant::now())), [1]);
    assert!(s.term(1, "later"));
    s
}

#[test]
fn a_cumulative_ack_does_not_settle_a_lower_seq_sent_after_it() {
    let mut s = with_one_parked(10);
    assert_eq!(sent(&s.pull(10, 5, Instant::now())), [2, 3, 4, 5]);
    assert_eq!(s.replay_parked(&[]), 1);
    assert_eq!(sent(&s.pull(10, 5, Instant::now())), [1]);
    // The consumer wrote 2..=5, not yet 1: an ack of 5 settles only those.
    assert_eq!(s.ack(5), [2, 3, 4, 5]);
    assert_eq!(s.in_flight(), 1);
    assert_eq!(s.cursor(5), 0, "1 is still unacked");
    // Then 1 is written and acked, although its seq is lower.
    assert_eq!(s.ack(1), [1]);
    assert_eq!((s.in_flight(), s.pending_len(), s.cursor(5)), (0, 0, 5));
    assert_eq!(s.counters.acked, 5);
}

#[test]
fn a_cumulative_ack_of_the_late_event_settles_everything_sent_before_it() {
    let mut s = with_one_parked(10);
    s.pull(10, 5, Instant::now());
    s.replay_parked(&[]);
    s.pull(10, 5, Instant::now());
    assert_eq!(s.ack(1), [1, 2, 3, 4, 5], "all were delivered before 1");
    assert_eq!(s.cursor(5), 5);
}

#[test]
fn a_cumulative_ack_of_a_seq_not_in_flight_settles_nothing() {
    let mut s = sub(10);
    for i in 1..=3 {
        s.offer(&ev(i));
    }
    s.attach(1, 10, None);
    s.pull(2, 3, Instant::now());
    assert!(s.ack(3).is_empty(), "3 was never sent");
    assert!(s.ack(9).is_empty(), "9 is not pending");
    assert_eq!(s.in_flight(), 2);
    assert_eq!(s.ack(2), [1, 2]);
}

#[test]
fn exact_acks_settle_a_replayed_event_whatever_its_seq() {
    let mut s = with_one_parked(10);
    s.pull(10, 5, Instant::now());
    s.replay_parked(&[]);
    s.pull(10, 5, Instant::now());
    for seq in [2, 3, 4, 5, 1] {
        assert!(s.ack_one(seq), "seq {seq}");
    }
    assert_eq!((s.in_flight(), s.pending_len(), s.cursor(5)), (0, 0, 5));
}

#[test]
fn a_run_acks_exactly_its_seqs_in_flight_and_costs_the_queue_not_its_width() {
    let mut s = with_one_parked(10);
    s.pull(10, 5, Instant::now());
    s.replay_parked(&[]);
    s.pull(10, 5, Instant::now());
    // 2..=5 and the replayed 1 in flight: a run of 3..=4 acks only those.
    let mut seqs = vec![];
    assert_eq!(s.ack_run(3, 4, Some(&mut seqs)), 2);
    assert_eq!(seqs, [3, 4]);
    assert_eq!(s.in_flight(), 3);
    assert_eq!(s.ack_run(7, 9, None), 0, "nothing pending there");
    // The widest run walks the queue once: 1, 2 and 5 are acked.
    assert_eq!(s.ack_run(0, u64::MAX, None), 3);
    assert_eq!((s.in_flight(), s.pending_len(), s.cursor(5)), (0, 0, 5));
    assert_eq!(s.counters.acked, 5);
    assert_eq!(s.ack_run(1, 5, None), 0, "acked once");
}

#[test]
fn a_run_leaves_what_was_never_sent() {
    let mut s = sub(2);
    for i in 1..=4 {
        s.offer(&ev(i));
    }
    s.attach(1, 2, None);
    assert_eq!(sent(&s.pull(10, 4, Instant::now())), [1, 2]);
    assert_eq!(s.ack_run(1, 4, None), 2, "3 and 4 are unsent");
    assert_eq!(sent(&s.pull(10, 4, Instant::now())), [3, 4]);
}

/// Window 2: 1 and 2 in flight, 3..=6 unsent and evicted with 1..=2.
fn with_a_gap_behind_the_window() -> Subscription {
    let mut s = sub(2);
    for i in 1..=7 {
        s.offer(&ev(i));
    }
    s.attach(1, 2, None);
    assert_eq!(sent(&s.pull(10, 7, Instant::now())), [1, 2]);
    for i in 1..=6 {
        s.evicted(i);
    }
    assert_eq!(s.counters.lost, 4);
    s
}

#[test]
fn a_gap_sent_to_a_consumer_that_died_before_reading_past_it_goes_to_the_next() {
    let mut s = with_a_gap_behind_the_window();
    let gap = s.pull(10, 7, Instant::now()).gap.expect("the gap is sent");
    assert_eq!((gap.lost, gap.resume_seq), (4, 7));
    // The first consumer dies without acking anything delivered after it.
    s.ack(2);
    s.detach(now());
    assert_eq!(s.record(7, 7, now()).gap_lost, 4, "stored as unreported");
    s.attach(2, 2, None);
    let p = s.pull(10, 7, Instant::now());
    let gap = p.gap.clone().expect("told again");
    assert_eq!((gap.lost, gap.resume_seq), (4, 7));
    assert_eq!(sent(&p), [7]);
    // Read past: acking an event delivered after the gap.
    s.ack_one(7);
    s.detach(now());
    s.attach(3, 2, None);
    assert!(
        s.pull(10, 7, Instant::now()).gap.is_none(),
        "reported once read"
    );
    assert_eq!(s.record(7, 7, now()).gap_lost, 0);
}

#[test]
fn acking_events_delivered_before_the_gap_does_not_count_as_reading_it() {
    let mut s = with_a_gap_behind_the_window();
    assert!(s.pull(10, 7, Instant::now()).gap.is_some());
    assert_eq!(s.ack(2), [1, 2], "both delivered before the gap");
    s.detach(now());
    s.attach(2, 2, None);
    assert_eq!(s.pull(10, 7, Instant::now()).gap.map(|g| g.lost), Some(4));
}

#[test]
fn a_nack_or_progress_after_the_gap_counts_as_reading_it() {
    let mut s = with_a_gap_behind_the_window();
    let p = s.pull(10, 7, Instant::now());
    assert!(p.gap.is_some());
    s.ack(2);
    assert_eq!(sent(&s.pull(10, 7, Instant::now())), [7]);
    assert!(s.nack(7, Instant::now() + Duration::from_secs(60)));
    s.detach(now());
    s.attach(2, 2, None);
    assert!(s.pull(10, 7, Instant::now()).gap.is_none());
}

#[test]
fn a_gap_found_while_detached_names_the_seq_above_the_loss() {
    // 1 and 2 pinned in flight, back to unsent when the consumer left; 3..=6
    // evicted unsent afterwards.
    let mut s = sub(2);
    for i in 1..=7 {
        s.offer(&ev(i));
    }
    s.attach(1, 2, None);
    s.pull(10, 7, Instant::now());
    s.evicted(1);
    s.evicted(2);
    s.detach(now());
    for i in 3..=6 {
        s.evicted(i);
    }
    s.attach(2, 2, None);
    let p = s.pull(10, 7, Instant::now());
    let gap = p.gap.clone().expect("a gap");
    assert_eq!((gap.lost, gap.resume_seq), (4, 7));
    assert_eq!(sent(&p), [1, 2]);
}

#[test]
fn a_lost_delayed_event_names_the_seq_after_it() {
    // Past MAX_DELAYED_PINNED delayed events, one more is lost to retention.
    let n = MAX_DELAYED_PINNED as u64 + 1;
    let mut s = sub(n as usize + 1);
    for i in 1..=n + 1 {
        s.offer(&ev(i));
    }
    s.attach(1, n as usize + 1, None);
    let later = Instant::now() + Duration::from_secs(3600);
    assert_eq!(
        s.pull(usize::MAX, n + 1, Instant::now()).events.len() as u64,
        n + 1
    );
    for i in 1..=n {
        assert!(s.nack(i, later));
    }
    for i in 1..=n {
        s.evicted(i);
    }
    assert_eq!(s.counters.lost, 1);
    s.detach(now());
    s.attach(2, 1, None);
    let gap = s.pull(1, n + 1, Instant::now()).gap.expect("a gap");
    assert_eq!((gap.lost, gap.resume_seq), (1, n + 1));
}
