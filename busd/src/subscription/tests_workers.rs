//! Unit tests of shared delivery on one host (a work queue): several
//! consumers attached at once, each event to one of them within each one's
//! own window, an ack settling only the acker's events, a consumer leaving
//! giving its events back (marked redelivered for whoever takes them), ack
//! waits per consumer, and poison handled per event.

use super::*;
use bytes::Bytes;

fn ev(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "job.x".into(),
        encoded: Bytes::from_static(b"x").into(),
        ..LoggedEvent::default()
    })
}

fn now() -> (Instant, i64) {
    (Instant::now(), 1_000)
}

fn queue(events: u64) -> Subscription {
    let sel = Selector::new(&["job.*".into()], "").unwrap();
    let mut s = Subscription::new(
        "work".into(),
        sel,
        false,
        Duration::from_secs(60),
        None,
        0,
        now(),
        16,
    );
    s.shared = true;
    s.set_claimed(false);
    for i in 1..=events {
        assert!(
            s.offer(&ev(i)).taken(),
            "a local shared subscription is fed"
        );
    }
    s
}

fn pull_as(s: &mut Subscription, conn: ConnId, at: Instant) -> Vec<(u64, bool)> {
    s.worker_mut(conn)
        .expect("attached")
        .pull(100, 100, at)
        .events
        .iter()
        .map(|(e, r, _)| (e.seq, *r))
        .collect()
}

fn seqs(v: &[(u64, bool)]) -> Vec<u64> {
    v.iter().map(|(s, _)| *s).collect()
}

#[test]
fn consumers_split_the_events_each_within_its_own_window() {
    let mut s = queue(10);
    s.attach(1, 2, None);
    s.attach(2, 3, None);
    s.attach(3, 10, None);
    assert_eq!(s.consumers().collect::<Vec<_>>(), [1, 2, 3]);
    let t = Instant::now();
    assert_eq!(seqs(&pull_as(&mut s, 1, t)), [1, 2]);
    assert_eq!(seqs(&pull_as(&mut s, 2, t)), [3, 4, 5]);
    assert_eq!(seqs(&pull_as(&mut s, 3, t)), [6, 7, 8, 9, 10]);
    assert_eq!(
        (s.in_flight_of(1), s.in_flight_of(2), s.in_flight_of(3)),
        (2, 3, 5)
    );
    // An ack settles only the acker's events.
    let mut two = s.worker_mut(2).expect("attached");
    assert!(!two.ack_one(1), "consumer 1's event");
    assert_eq!(two.ack(5), [3, 4, 5], "cumulative, its own deliveries only");
    let mut one = s.worker_mut(1).expect("attached");
    assert!(one.ack_one(2));
    assert!(!one.nack(6, t), "consumer 3's event");
    assert!(!one.progress(6, t));
    assert!(!one.term(6, "not mine"));
    assert!(one.ack_one(1));
    assert!(s.worker_mut(4).is_none(), "not attached");
    assert_eq!(s.cursor(10), 5);
    assert_eq!(s.in_flight(), 5);
}

#[test]
fn a_consumer_that_leaves_gives_its_events_to_the_others_marked_redelivered() {
    let mut s = queue(6);
    s.attach(1, 3, None);
    s.attach(2, 3, None);
    let t = Instant::now();
    assert_eq!(seqs(&pull_as(&mut s, 1, t)), [1, 2, 3]);
    assert_eq!(seqs(&pull_as(&mut s, 2, t)), [4, 5, 6]);
    assert!(s.detach_conn(1, now()));
    assert!(!s.detach_conn(1, now()), "gone already");
    assert_eq!(s.consumer(), Some(2));
    assert_eq!(s.worker_mut(2).expect("attached").ack(6), [4, 5, 6]);
    assert_eq!(
        pull_as(&mut s, 2, t),
        [(1, true), (2, true), (3, true)],
        "given back, delivered again marked"
    );
    assert!(s.detach_conn(2, now()));
    assert!(s.detached_since_ms().is_some(), "nobody left");
    // What the last one had waits for the next consumer.
    s.attach(3, 10, None);
    assert_eq!(seqs(&pull_as(&mut s, 3, t)), [1, 2, 3]);
}

#[test]
fn each_consumer_has_its_own_ack_wait_and_what_expires_goes_to_another() {
    let mut s = queue(4);
    let t = Instant::now();
    s.attach(1, 2, Some(Duration::from_secs(1)));
    s.attach(2, 2, Some(Duration::from_secs(60)));
    assert_eq!(seqs(&pull_as(&mut s, 1, t)), [1, 2]);
    assert_eq!(seqs(&pull_as(&mut s, 2, t)), [3, 4]);
    let later = t + Duration::from_secs(5);
    // Whoever pulls expires what waited past its own worker's wait:
    // consumer 1's, not 2's (its wait is a minute).
    assert!(
        pull_as(&mut s, 2, later).is_empty(),
        "no room in 2's window"
    );
    assert_eq!((s.in_flight_of(1), s.in_flight_of(2)), (0, 2));
    // Consumer 1 does not take back what expired on it while 2 is here.
    let p = s.worker_mut(1).expect("attached").pull(10, 100, later);
    assert!(p.events.is_empty() && p.left_for_others);
    assert_eq!(s.others_with_credit().count(), 0, "2's window is full");
    // 2 acks: it takes them, marked redelivered.
    assert_eq!(s.worker_mut(2).expect("attached").ack(4), [3, 4]);
    assert_eq!(pull_as(&mut s, 2, later), [(1, true), (2, true)]);
    // Alone, a consumer gets back what expired on it.
    let mut one = queue(1);
    one.attach(1, 2, Some(Duration::from_secs(1)));
    assert_eq!(seqs(&pull_as(&mut one, 1, t)), [1]);
    assert_eq!(pull_as(&mut one, 1, later), [(1, true)]);
}

#[test]
fn a_job_goes_to_the_least_loaded_consumer() {
    // Twelve jobs one by one to three consumers that never ack: 4 each,
    // whoever pulls first.
    let mut s = queue(0);
    for c in 1..=3 {
        s.attach(c, 16, Some(Duration::from_secs(60)));
    }
    let t = Instant::now();
    let mut got = [0usize; 3];
    for seq in 1..=12u64 {
        assert!(s.offer(&ev(seq)).taken());
        // Each is woken; the order they pull in turns.
        for k in 0..3 {
            let c = (seq as usize + k) % 3 + 1;
            got[c - 1] += pull_as(&mut s, c as ConnId, t).len();
        }
    }
    assert_eq!(got, [4, 4, 4]);
    // A batch of 9 to the same three: 3 each, those left told to wake.
    let mut s = queue(9);
    for c in 1..=3 {
        s.attach(c, 16, None);
    }
    let p = s.worker_mut(1).expect("attached").pull(100, 100, t);
    assert_eq!(p.events.len(), 3);
    assert!(p.left_for_others);
    assert_eq!(s.others_with_credit().collect::<Vec<_>>(), [2, 3]);
    assert_eq!(pull_as(&mut s, 3, t).len(), 3);
    assert_eq!(pull_as(&mut s, 2, t).len(), 3);
    // A full consumer does not count: the one with room takes the rest.
    let mut s = queue(10);
    s.attach(1, 2, None);
    s.attach(2, 16, None);
    assert_eq!(
        pull_as(&mut s, 1, t).len(),
        2,
        "its window: its share is more"
    );
    assert_eq!(pull_as(&mut s, 2, t).len(), 8);
}

#[test]
fn poison_is_parked_per_event_and_a_halt_told_to_each_consumer() {
    let mut s = queue(2);
    s.max_deliver = 1;
    s.on_poison = PoisonPolicy::PoisonPark;
    s.attach(1, 1, None);
    s.attach(2, 1, None);
    let t = Instant::now();
    assert_eq!(seqs(&pull_as(&mut s, 1, t)), [1]);
    assert!(s.detach_conn(1, now()));
    // Seq 1 was delivered once: poison now, parked; seq 2 goes on.
    assert_eq!(seqs(&pull_as(&mut s, 2, t)), [2]);
    assert_eq!(s.parked_len(), 1);
    let mut h = queue(1);
    h.max_deliver = 1;
    h.attach(1, 1, None);
    h.attach(2, 1, None);
    pull_as(&mut h, 1, t);
    assert!(h.detach_conn(1, now()));
    h.attach(3, 1, None);
    assert!(
        h.worker_mut(2)
            .expect("attached")
            .pull(10, 1, t)
            .halted
            .is_some(),
        "the consumer that met it"
    );
    let mut three = h.worker_mut(3).expect("attached");
    assert!(three.pull(10, 1, t).halted.is_some(), "and every other one");
    assert!(three.pull(10, 1, t).halted.is_none(), "once each");
}

#[test]
fn a_consumer_that_attaches_again_on_its_connection_is_one_consumer() {
    let mut s = queue(2);
    s.attach(1, 5, None);
    pull_as(&mut s, 1, Instant::now());
    s.attach(1, 5, None);
    assert_eq!(s.consumers().count(), 1);
    assert_eq!(s.in_flight(), 0, "its events came back");
}

#[test]
fn a_worker_whose_event_expired_takes_work_only_when_no_other_has_room_until_it_acks() {
    let mut s = queue(1);
    let t = Instant::now();
    s.attach(1, 4, Some(Duration::from_secs(1)));
    assert_eq!(seqs(&pull_as(&mut s, 1, t)), [1]);
    s.attach(2, 1, Some(Duration::from_secs(60)));
    s.attach(3, 4, Some(Duration::from_secs(60)));
    let later = t + Duration::from_secs(2);
    // 1's event expires; 3 takes it (2 has room too: ties to the puller).
    assert_eq!(pull_as(&mut s, 3, later), [(1, true)]);
    for seq in 2..=4 {
        assert!(s.offer(&ev(seq)).taken());
    }
    // Stalled, 1 takes nothing while 2 and 3 have room, though it has
    // the fewest in flight.
    assert!(pull_as(&mut s, 1, later).is_empty());
    assert_eq!(s.others_with_credit().collect::<Vec<_>>(), [2, 3]);
    assert_eq!(seqs(&pull_as(&mut s, 2, later)), [2]);
    assert_eq!(seqs(&pull_as(&mut s, 3, later)), [3, 4]);
    // 2 is full; 3 has room: 1 still waits. 3 full: then 1 may.
    assert!(s.offer(&ev(5)).taken());
    assert!(pull_as(&mut s, 1, later).is_empty());
    assert_eq!(seqs(&pull_as(&mut s, 3, later)), [5]);
    assert!(s.offer(&ev(6)).taken());
    assert_eq!(seqs(&pull_as(&mut s, 1, later)), [6], "no other has room");
    // An ack: 1 is alive again and takes its share.
    assert!(s.ack_one(6));
    assert!(s.offer(&ev(7)).taken());
    assert_eq!(seqs(&pull_as(&mut s, 1, later)), [7]);
}
