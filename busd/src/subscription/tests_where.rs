//! Unit tests of events a `--where` judges: they wait in `pending` for
//! their verdict, delivery stops at the first one still waiting, a match
//! keeps its place in seq order, no match and failures leave (failures
//! counted, the first past a limit told once per attach), retention counts
//! a waiting event lost, a seek hands everything to the filter again, and
//! a restart judges again what was not delivered.

use super::*;
use crate::where_filter::{Verdict, WhereFailure};
use bytes::Bytes;

fn ev(seq: u64) -> Arc<LoggedEvent> {
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

fn judged_sub() -> Subscription {
    let sel = Selector::new(&["a.*".into()], "")
        .unwrap()
        .with_where(&[".seq > 0".into()])
        .unwrap();
    Subscription::new(
        "w".into(),
        sel,
        false,
        Duration::from_secs(60),
        None,
        0,
        now(),
        10,
    )
}

fn pulled(s: &mut Subscription) -> Vec<u64> {
    s.pull(10, 100, Instant::now())
        .events
        .iter()
        .map(|(e, _, _)| e.seq)
        .collect()
}

fn handed(s: &mut Subscription, max: usize) -> Vec<u64> {
    s.filter_jobs(max, usize::MAX)
        .iter()
        .map(|e| e.seq)
        .collect()
}

#[test]
fn delivery_waits_for_each_verdict_in_seq_order() {
    let mut s = judged_sub();
    s.attach(1, 10, None);
    for i in 1..=4 {
        assert_eq!(s.offer(&ev(i)), Offered::ToFilter);
    }
    assert_eq!(s.filtering_len(), 4);
    assert_eq!(s.pending_len(), 0, "not pending until judged");
    assert_eq!(s.counters.matched, 0);
    assert!(!s.has_unsent());
    assert_eq!(handed(&mut s, 2), [1, 2]);
    assert_eq!(handed(&mut s, 10), [3, 4], "each event handed out once");
    assert!(!s.has_filter_jobs());
    // 2 is judged before 1: nothing goes out past 1, still waiting.
    assert!(s.judged(2, Verdict::Match));
    assert_eq!(pulled(&mut s), Vec::<u64>::new());
    assert_eq!(s.cursor(4), 0);
    assert!(!s.judged(1, Verdict::NoMatch));
    assert_eq!(pulled(&mut s), [2]);
    assert!(s.judged(4, Verdict::Match));
    assert!(!s.judged(3, Verdict::Failed(WhereFailure::Raised)));
    assert_eq!(pulled(&mut s), [4]);
    assert_eq!(s.counters.matched, 2);
    assert_eq!(s.counters.where_errors, 1);
    assert_eq!(s.filtering_len(), 0);
    // A verdict given twice, or for an event not waiting, changes nothing.
    assert!(!s.judged(4, Verdict::Match));
    assert!(!s.judged(99, Verdict::Match));
    assert_eq!(s.ack(4), [2, 4]);
    assert_eq!(s.cursor(4), 4);
}

#[test]
fn the_first_failure_past_a_limit_is_told_once_per_attach() {
    let mut s = judged_sub();
    for i in 1..=3 {
        s.offer(&ev(i));
    }
    handed(&mut s, 10);
    s.judged(1, Verdict::Failed(WhereFailure::Raised));
    assert!(
        !s.where_notice_due(),
        "an error of the expression is not told"
    );
    s.judged(2, Verdict::Failed(WhereFailure::Cpu));
    s.judged(3, Verdict::Failed(WhereFailure::Memory));
    assert!(!s.where_notice_due(), "nobody to tell while detached");
    assert_eq!(
        s.where_last_limit().unwrap(),
        format!("seq 3: {}", WhereFailure::Memory)
    );
    s.attach(1, 10, None);
    assert!(s.where_notice_due());
    let p = s.pull(10, 3, Instant::now());
    assert_eq!(
        p.where_failed,
        Some((2, WhereFailure::Cpu)),
        "the first one"
    );
    assert!(s.pull(10, 3, Instant::now()).where_failed.is_none());
    s.offer(&ev(4));
    handed(&mut s, 10);
    s.judged(4, Verdict::Failed(WhereFailure::Steps));
    assert!(!s.where_notice_due(), "told once per attach");
    s.detach(now());
    s.attach(2, 10, None);
    s.offer(&ev(5));
    handed(&mut s, 10);
    s.judged(5, Verdict::Failed(WhereFailure::Stalled));
    assert_eq!(
        s.pull(10, 5, Instant::now()).where_failed,
        Some((5, WhereFailure::Stalled))
    );
    assert_eq!(s.counters.where_errors, 5);
}

#[test]
fn an_event_evicted_before_its_verdict_is_lost_and_reported() {
    let mut s = judged_sub();
    s.attach(1, 10, None);
    s.offer(&ev(1));
    s.offer(&ev(2));
    assert_eq!(handed(&mut s, 1), [1]);
    s.evicted(1);
    s.evicted(2);
    assert_eq!(s.filtering_len(), 0);
    assert_eq!(s.counters.lost, 2);
    // The verdict that arrives afterwards finds nothing.
    assert!(!s.judged(1, Verdict::Match));
    let p = s.pull(10, 2, Instant::now());
    assert_eq!(p.gap.map(|g| g.lost), Some(2));
}

#[test]
fn a_seek_hands_every_event_to_the_filter_again() {
    let mut s = judged_sub();
    for i in 1..=3 {
        s.offer(&ev(i));
    }
    assert_eq!(handed(&mut s, 10), [1, 2, 3]);
    s.seek(0);
    for i in 1..=3 {
        s.offer(&ev(i));
    }
    assert_eq!(s.filtering_len(), 3);
    assert_eq!(handed(&mut s, 10), [1, 2, 3]);
}

#[test]
fn a_restart_judges_again_what_was_not_delivered_and_counts_it_once() {
    let mut s = judged_sub();
    s.attach(1, 10, None);
    for i in 1..=3 {
        s.offer(&ev(i));
    }
    handed(&mut s, 10);
    for i in 1..=3 {
        s.judged(i, Verdict::Match);
    }
    // 1 delivered (in flight when the bus stopped), 2 and 3 not yet.
    s.pull(1, 3, Instant::now());
    let rec = s.record(1, 3, now());
    let events: Vec<_> = (1..=3).map(ev).collect();
    let sel = s.selector.clone();
    let mut r = Subscription::restore(&rec, sel, &events, (1, 3, false), now(), 10);
    // The delivered one matched before: it is not judged again.
    assert_eq!(r.pending_len(), 1);
    assert_eq!(r.filtering_len(), 2);
    assert_eq!(handed(&mut r, 10), [2, 3]);
    r.judged(2, Verdict::Match);
    r.judged(3, Verdict::NoMatch);
    assert_eq!(r.counters.matched, 3, "counted before the restart already");
    r.attach(1, 10, None);
    assert_eq!(pulled(&mut r), [1, 2]);
}
