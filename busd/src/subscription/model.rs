//! Property test of the state machine against a simple model: random
//! sequences of publish, attach, detach, pull, ack, eviction, takeover,
//! term, progress and nacks with a long delay. Whatever happens: nothing
//! acked or termed is delivered again; nothing is delivered twice without
//! the redelivered mark; every matched event is acked, pending, parked, or
//! counted lost (and a gap reported); in flight never exceeds the window; a
//! detached backlog stays within retention plus one window plus what waits
//! out a delay.

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
    Term(usize),
    Progress(usize),
    NackLater(usize),
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
        1 => (1usize..4).prop_map(Op::Term),
        1 => (1usize..4).prop_map(Op::Progress),
        1 => (1usize..4).prop_map(Op::NackLater),
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
        let mut termed: BTreeSet<u64> = BTreeSet::new();
        let hour = Duration::from_secs(3600);
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
                    prop_assert!(!termed.contains(&e.seq), "termed seq {} delivered again", e.seq);
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
                Op::Term(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    let seq = in_flight.remove(k - 1);
                    prop_assert!(s.term(seq, "no"));
                    termed.insert(seq);
                }
                Op::Progress(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    prop_assert!(s.progress(in_flight[k - 1], Instant::now()));
                }
                Op::NackLater(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    let seq = in_flight.remove(k - 1);
                    prop_assert!(s.nack_after(seq, hour, Instant::now()));
                }
                _ => {}
            }
            let c = s.counters;
            prop_assert_eq!(c.matched, c.acked + s.pending_len() as u64 + c.lost + c.parked);
            prop_assert_eq!(c.acked, acked.len() as u64);
            prop_assert!(s.pending_len() <= retention + window + s.delayed().0);
            prop_assert_eq!(c.parked, termed.len() as u64);
            prop_assert!(gap_total <= c.lost);
        }
        // Attach and drain: every loss is reported by a gap by the end.
        s.detach(now);
        s.attach(conn + 1, window, None);
        for _ in 0..1000 {
            let p = s.pull(usize::MAX, next - 1, Instant::now() + 2 * hour);
            if let Some(g) = p.gap { gap_total += g.lost; }
            let Some((last, _, _)) = p.events.last() else { break };
            s.ack(last.seq);
        }
        prop_assert_eq!(gap_total, s.counters.lost);
        prop_assert_eq!(s.pending_len(), 0);
    }
}
