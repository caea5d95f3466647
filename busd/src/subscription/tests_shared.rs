//! Unit tests of a subscription's shared-delivery side: what it holds (and
//! renews), where it starts, which evictions may be losses, and losses
//! reported as a gap; the start survives the stored record.

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

fn shared(start_after: u64) -> Subscription {
    let sel = Selector::new(&["a.*".into()], "").unwrap();
    let mut s = Subscription::new(
        "w".into(),
        sel,
        false,
        Duration::from_secs(60),
        None,
        start_after,
        (Instant::now(), 1_000),
        10,
    );
    s.shared = true;
    s.set_claimed(true);
    s
}

#[test]
fn a_shared_subscription_holds_what_it_claimed_until_acked() {
    let mut s = shared(0);
    s.attach(1, 10, None);
    assert!(!s.offer(&ev(1, "a.x")).taken(), "never filled by fan-out");
    assert!(s.push_claimed(ev(2, "a.x"), 1));
    assert!(s.push_claimed(ev(1, "a.x"), 2));
    assert_eq!(s.held_seqs(), vec![1, 2]);
    let p = s.pull(10, 2, Instant::now());
    assert_eq!(
        p.events
            .iter()
            .map(|(e, r, _)| (e.seq, *r))
            .collect::<Vec<_>>(),
        vec![(1, true), (2, false)],
        "a claim taken over is a redelivery"
    );
    s.ack(1);
    assert_eq!(s.held_seqs(), vec![2]);
}

#[test]
fn evictions_after_the_start_not_held_here_may_be_losses() {
    let mut s = shared(5);
    s.attach(1, 10, None);
    assert!(s.push_claimed(ev(7, "a.x"), 1));
    assert!(!s.may_lose_shared(&ev(4, "a.x")), "before the start");
    assert!(!s.may_lose_shared(&ev(6, "b.x")), "not selected");
    assert!(!s.may_lose_shared(&ev(7, "a.x")), "held here");
    assert!(s.may_lose_shared(&ev(8, "a.x")));
    s.shared = false;
    s.set_claimed(false);
    assert!(!s.may_lose_shared(&ev(8, "a.x")), "per-host: its own rule");
}

#[test]
fn shared_losses_are_a_gap_and_counted() {
    let mut s = shared(0);
    s.attach(1, 10, None);
    s.lost_shared(150);
    let p = s.pull(10, 200, Instant::now());
    assert_eq!(p.gap.map(|g| g.lost), Some(150));
    assert_eq!(s.counters.lost, 150);
}

#[test]
fn the_shared_start_survives_the_record() {
    let s = shared(42);
    assert_eq!(s.shared_from(), 42);
    let rec = s.record(0, 100, (Instant::now(), 2_000));
    assert_eq!(rec.shared_from, 42);
    let sel = Selector::new(&["a.*".into()], "").unwrap();
    let back = Subscription::restore(&rec, sel, &[], (0, 100, true), (Instant::now(), 2_000), 10);
    assert_eq!(back.shared_from(), 42);
}
