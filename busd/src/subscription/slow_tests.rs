//! Unit tests of the words of slow consumers: `progress` moves the ack
//! wait, `term` parks at once with its reason, the backoff spaces
//! redeliveries (last step repeating), delayed events survive a restore
//! with their due time and are kept from retention within a bound.

use super::*;

use super::exact_tests::{ev, on_a};

const S: Duration = Duration::from_secs(1);

/// An attached subscription with explicit acks, `wait` and `backoff`, and
/// events 1..=n offered.
fn slow(n: u64, wait: Duration, backoff: &[u64]) -> Subscription {
    let mut s = on_a(0, (Instant::now(), 1_000), 10);
    s.backoff = backoff
        .iter()
        .map(|&secs| Duration::from_secs(secs))
        .collect();
    s.attach(1, 10, Some(wait));
    for i in 1..=n {
        s.offer(&ev(i));
    }
    s
}

fn sent(p: &Pulled) -> Vec<(u64, bool, u32)> {
    p.events.iter().map(|(e, r, d)| (e.seq, *r, *d)).collect()
}

#[test]
fn progress_restarts_the_ack_wait_without_counting_a_delivery() {
    let mut s = slow(1, 30 * S, &[]);
    let t = Instant::now();
    assert_eq!(sent(&s.pull(10, 1, t)), [(1, false, 1)]);
    assert!(s.progress(1, t + 25 * S));
    assert!(s.progress(1, t + 50 * S), "any number of times");
    let p = s.pull(10, 1, t + 60 * S);
    assert!(p.events.is_empty(), "its wait started again at t+50s");
    assert_eq!(p.next_due, Some(t + 80 * S));
    assert_eq!(sent(&s.pull(10, 1, t + 80 * S)), [(1, true, 2)]);
    assert!(!s.progress(7, t), "unknown");
    s.ack_one(1);
    assert!(!s.progress(1, t), "settled");
}

#[test]
fn term_parks_at_once_with_its_reason_and_delivery_count() {
    let mut s = slow(3, 30 * S, &[]);
    let t = Instant::now();
    s.pull(10, 3, t);
    assert!(s.term(2, "  bad schema "));
    assert!(s.term(1, ""));
    assert!(!s.term(2, "again"), "already parked");
    assert!(!s.term(9, "x"), "unknown");
    assert_eq!(s.in_flight(), 1);
    assert_eq!(s.cursor(3), 2, "both parked: the cursor moves past them");
    let parked: Vec<_> = s
        .parked()
        .map(|p| (p.event.seq, p.deliveries, p.reason.clone()))
        .collect();
    assert_eq!(
        parked,
        [(2, 1, Some("bad schema".into())), (1, 1, None)],
        "whatever max_deliver says (unlimited here)"
    );
    let long = "é".repeat(1000);
    assert!(s.term(3, &long));
    let kept = s.parked().last().and_then(|p| p.reason.clone()).unwrap();
    assert!(kept.chars().count() < 300, "clipped");
    let rec = s.record(1, 3, (t, 5_000));
    assert_eq!(rec.parked[0].reason.as_deref(), Some("bad schema"));
    let sel = Selector::new(&rec.patterns, &rec.filter).unwrap();
    let log: Vec<_> = (1..=3).map(ev).collect();
    let r = Subscription::restore(&rec, sel, &log, (1, 3, true), (t, 5_000), 10);
    assert_eq!(
        r.parked().next().and_then(|p| p.reason.as_deref()),
        Some("bad schema")
    );
}

#[test]
fn the_backoff_spaces_redeliveries_after_an_expiry_and_its_last_step_repeats() {
    let mut s = slow(1, 10 * S, &[1, 5]);
    let t = Instant::now();
    assert_eq!(sent(&s.pull(10, 1, t)), [(1, false, 1)]);
    // Expired at t+10: the 1st redelivery waits 1 s more.
    let p = s.pull(10, 1, t + 10 * S);
    assert!(p.events.is_empty());
    assert!(p.expired, "the hub saves the due time");
    assert_eq!(p.next_due, Some(t + 11 * S));
    assert_eq!(s.delayed(), (1, Some(t + 11 * S)));
    assert_eq!(sent(&s.pull(10, 1, t + 11 * S)), [(1, true, 2)]);
    // Expired at t+21: the 2nd waits 5 s, and so does the 3rd.
    assert_eq!(s.pull(10, 1, t + 21 * S).next_due, Some(t + 26 * S));
    assert_eq!(sent(&s.pull(10, 1, t + 26 * S)), [(1, true, 3)]);
    assert_eq!(s.pull(10, 1, t + 36 * S).next_due, Some(t + 41 * S));
    assert_eq!(s.delayed().0, 1);
    assert_eq!(sent(&s.pull(10, 1, t + 41 * S)), [(1, true, 4)]);
    assert_eq!(s.delayed(), (0, None));
}

#[test]
fn a_nack_without_a_delay_takes_the_backoff_step_and_one_with_a_delay_its_own() {
    let mut s = slow(2, 30 * S, &[4]);
    let t = Instant::now();
    s.pull(10, 2, t);
    assert!(s.nack_after(1, Duration::ZERO, t));
    assert!(s.nack_after(2, 2 * S, t));
    assert_eq!(s.delayed(), (2, Some(t + 2 * S)));
    assert_eq!(sent(&s.pull(10, 2, t + 2 * S)), [(2, true, 2)]);
    assert_eq!(sent(&s.pull(10, 2, t + 4 * S)), [(1, true, 2)]);
    let mut plain = slow(1, 30 * S, &[]);
    plain.pull(10, 1, t);
    assert!(plain.nack_after(1, Duration::ZERO, t));
    assert_eq!(
        sent(&plain.pull(10, 1, t)),
        [(1, true, 2)],
        "no backoff: at once"
    );
}

#[test]
fn a_delayed_event_keeps_its_due_time_across_a_restore() {
    let mut s = slow(2, 30 * S, &[]);
    let t = Instant::now();
    s.pull(10, 2, t);
    s.nack_after(1, 60 * S, t);
    let rec = s.record(1, 2, (t, 100_000));
    assert_eq!(rec.delayed, [(1, 160_000)]);
    let sel = Selector::new(&rec.patterns, &rec.filter).unwrap();
    let log: Vec<_> = (1..=2).map(ev).collect();
    // Restarted 20 s (wall clock) later, after a crash: 40 s left.
    let later = Instant::now();
    let mut r = Subscription::restore(&rec, sel, &log, (1, 2, false), (later, 120_000), 10);
    assert_eq!(r.delayed(), (1, Some(later + 40 * S)));
    r.attach(2, 10, Some(30 * S));
    let p = r.pull(10, 2, later);
    assert_eq!(
        sent(&p),
        [(2, true, 2)],
        "the one in flight comes again at once"
    );
    assert_eq!(
        p.next_due,
        Some(later + 30 * S),
        "2's ack wait (from now) comes before 1's due time"
    );
    let p = r.pull(10, 2, later);
    assert_eq!(p.next_due, Some(later + 30 * S), "2's ack wait comes first");
    assert!(r.ack_one(2));
    assert_eq!(sent(&r.pull(10, 2, later + 40 * S)), [(1, true, 2)]);
}

#[test]
fn retention_keeps_delayed_events_within_a_bound() {
    let n = MAX_DELAYED_PINNED as u64 + 2;
    let mut s = on_a(0, (Instant::now(), 1_000), n as usize);
    s.attach(1, n as usize, Some(30 * S));
    for i in 1..=n + 1 {
        s.offer(&ev(i));
    }
    let t = Instant::now();
    assert_eq!(s.pull(n as usize, n + 1, t).events.len(), n as usize);
    for i in 1..=n {
        s.nack_after(i, 3600 * S, t);
    }
    for i in 1..=n + 1 {
        s.evicted(i);
    }
    assert_eq!(s.delayed().0, MAX_DELAYED_PINNED, "the rest was lost");
    assert_eq!(s.counters.lost, 3, "two delayed past the bound, one unsent");
    let p = s.pull(10, n + 1, t);
    assert_eq!(p.gap.map(|g| g.lost), Some(3));
    assert_eq!(s.oldest_kept(), Some(1));
}

#[test]
fn a_record_stored_before_these_fields_existed_still_loads() {
    let old = r#"{"id":"s","patterns":["a.*"],"ttl_ms":1000,"created_at_unix_ms":1,
        "cursor":0,"max_sent_seq":0,"gap_lost":0,"detached_since_unix_ms":null,
        "counters":{"matched":0,"delivered":0,"acked":0,"redelivered":0,"lost":0},
        "parked":[{"seq":3,"deliveries":2,"parked_at_unix_ms":5}]}"#;
    let rec: crate::store::SubRecord = serde_json::from_str(old).unwrap();
    assert!(rec.backoff_ms.is_empty() && rec.delayed.is_empty());
    assert_eq!(rec.parked[0].reason, None);
    let text = serde_json::to_string(&rec).unwrap();
    assert!(
        !text.contains("backoff_ms") && !text.contains("reason"),
        "absent fields stay absent: {text}"
    );
}
