//! Property test of the operator verbs between deliveries: random
//! sequences of publish, pull, acks, term, immediate nacks, `seek` (to the
//! earliest or a given seq, the log offered again as the hub does),
//! `replay-parked` (all or one), `skip` and `restart`, under random
//! `max_deliver` and poison policies. Whatever the order: a seq is pending
//! at most once and parked at most once, never both; an ack counts each
//! settled seq once; an acked event is not delivered again until a seek
//! offers it again; and a subscription never halts at an event acked since
//! it was last offered.

use std::collections::BTreeSet;

use super::exact_tests::{ev as event, on_a};
use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Publish,
    Pull(usize),
    AckAll,
    AckOne(usize),
    Term(usize),
    NackNow(usize),
    SeekEarliest,
    SeekTo(u64),
    ReplayAll,
    ReplayOne(usize),
    Skip,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => Just(Op::Publish),
        4 => (1usize..6).prop_map(Op::Pull),
        2 => Just(Op::AckAll),
        2 => (1usize..4).prop_map(Op::AckOne),
        2 => (1usize..4).prop_map(Op::Term),
        1 => (1usize..4).prop_map(Op::NackNow),
        1 => Just(Op::SeekEarliest),
        1 => (0u64..20).prop_map(Op::SeekTo),
        2 => Just(Op::ReplayAll),
        1 => (0usize..4).prop_map(Op::ReplayOne),
        1 => Just(Op::Skip),
        1 => Just(Op::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn verbs_never_duplicate_a_seq_nor_halt_at_an_acked_one(
        ops in prop::collection::vec(op(), 1..150),
        window in 1usize..5,
        max_deliver in 0u32..3,
        park in any::<bool>(),
    ) {
        let mut s = on_a(0, (Instant::now(), 0), window);
        s.max_deliver = max_deliver;
        if park {
            s.on_poison = PoisonPolicy::PoisonPark;
        }
        s.attach(1, window, None);
        let mut log: Vec<Arc<LoggedEvent>> = vec![];
        // In flight, in delivery order.
        let mut in_flight: Vec<u64> = vec![];
        // Acked since the log last offered them.
        let mut acked: BTreeSet<u64> = BTreeSet::new();
        for op in ops {
            match op {
                Op::Publish => {
                    let e = event(log.len() as u64 + 1);
                    s.offer(&e);
                    log.push(e);
                }
                Op::Pull(n) => {
                    let p = s.pull(n, log.len() as u64, Instant::now());
                    let mut seen = BTreeSet::new();
                    for (e, _, _) in &p.events {
                        prop_assert!(seen.insert(e.seq), "seq {} twice in one pull", e.seq);
                        prop_assert!(!acked.contains(&e.seq), "acked seq {} delivered again", e.seq);
                        in_flight.retain(|&q| q != e.seq);
                        in_flight.push(e.seq);
                    }
                }
                Op::AckAll if !in_flight.is_empty() => {
                    let before = s.counters.acked;
                    let last = *in_flight.last().unwrap_or(&0);
                    let settled = s.ack(last);
                    let distinct: BTreeSet<u64> = settled.iter().copied().collect();
                    prop_assert_eq!(distinct.len(), settled.len(), "an ack settled a seq twice");
                    prop_assert_eq!(s.counters.acked - before, settled.len() as u64);
                    acked.extend(settled.iter().copied());
                    in_flight.retain(|q| !distinct.contains(q));
                }
                Op::AckOne(k) if k <= in_flight.len() => {
                    let seq = in_flight.remove(k - 1);
                    let before = s.counters.acked;
                    if s.ack_one(seq) {
                        prop_assert_eq!(s.counters.acked - before, 1);
                        acked.insert(seq);
                    }
                }
                Op::Term(k) if k <= in_flight.len() => {
                    let seq = in_flight.remove(k - 1);
                    s.term(seq, "no");
                }
                Op::NackNow(k) if k <= in_flight.len() => {
                    let seq = in_flight.remove(k - 1);
                    s.nack(seq, Instant::now());
                }
                Op::SeekEarliest | Op::SeekTo(_) => {
                    let from = match op {
                        Op::SeekTo(to) => to.clamp(1, log.len() as u64 + 1),
                        _ => 1,
                    };
                    s.seek(from - 1);
                    for e in log.iter().filter(|e| e.seq >= from) {
                        s.offer(e);
                    }
                    acked.retain(|&q| q < from);
                    in_flight.clear();
                }
                Op::ReplayAll => {
                    s.replay_parked(&[]);
                }
                Op::ReplayOne(i) => {
                    let seq = s.parked().nth(i).map(|p| p.event.seq);
                    if let Some(seq) = seq {
                        s.replay_parked(&[seq]);
                    }
                }
                Op::Skip => {
                    let _ = s.skip();
                }
                Op::Restart => {
                    let _ = s.restart();
                }
                _ => {}
            }
            let pending: Vec<u64> = s.pending.iter().map(|e| e.event.seq).collect();
            prop_assert!(pending.windows(2).all(|w| w[0] < w[1]), "a seq pending twice: {:?}", pending);
            let parked: Vec<u64> = s.parked().map(|p| p.event.seq).collect();
            let parked_set: BTreeSet<u64> = parked.iter().copied().collect();
            prop_assert_eq!(parked_set.len(), parked.len(), "a seq parked twice: {:?}", parked);
            for q in &parked {
                prop_assert!(!pending.contains(q), "seq {} pending and parked", q);
            }
            if let State::Halted(h) = &s.state {
                prop_assert!(!acked.contains(&h.seq), "halted at seq {}, which was acked", h.seq);
            }
        }
    }
}

/// The case: three events termed (parked), `seek --to earliest`,
/// `replay-parked`: each is pending once, delivered once, acked once, and
/// with `--max-deliver 1 --on-poison halt` nothing halts.
#[test]
fn seek_then_replay_parked_delivers_each_event_once() {
    let mut s = on_a(0, (Instant::now(), 0), 10);
    s.max_deliver = 1;
    s.attach(1, 10, None);
    let log: Vec<_> = (1..=3).map(event).collect();
    for e in &log {
        s.offer(e);
    }
    for (e, _, _) in s.pull(10, 3, Instant::now()).events {
        assert!(s.term(e.seq, "no"));
    }
    s.seek(0);
    for e in &log {
        s.offer(e);
    }
    s.replay_parked(&[]);
    assert_eq!(s.pending_len(), 3, "pending once each");
    let p = s.pull(10, 3, Instant::now());
    let seqs: Vec<u64> = p.events.iter().map(|(e, _, _)| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    let acked_before = s.counters.acked;
    assert_eq!(s.ack(3).len(), 3);
    assert_eq!(s.counters.acked - acked_before, 3);
    let p = s.pull(10, 3, Instant::now());
    assert!(p.events.is_empty() && p.halted.is_none(), "{p:?}");
    assert_eq!(s.state, State::Active);
}
