//! Property test of the state machine against a simple model: random
//! sequences of publish, attach, detach, pull, cumulative and exact acks,
//! eviction, takeover, term, progress, nacks with a long delay and nacks due
//! at once (delivered again behind higher seqs). Whatever happens: nothing
//! acked or termed is delivered again; nothing is delivered twice without
//! the redelivered mark; a cumulative ack settles exactly what was
//! delivered up to it, in delivery order; every matched event is acked,
//! pending, parked, or counted lost (and a gap reported, counting once a
//! consumer read past it); in flight never exceeds the window; a detached
//! backlog stays within retention plus one window plus what waits out a
//! delay.

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
    AckOne(usize),
    AckRun(usize),
    NackNow(usize),
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
        2 => (1usize..4).prop_map(Op::AckOne),
        2 => (1usize..6).prop_map(Op::AckRun),
        1 => (1usize..4).prop_map(Op::NackNow),
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
        // In delivery order, with each delivery's number.
        let mut in_flight: Vec<(u64, u64)> = vec![];
        let mut sends = 0u64;
        // Gaps told to the consumer, with the number of deliveries before
        // each; and the losses a consumer read past.
        let mut told: Vec<(u64, u64)> = vec![];
        let mut gap_total = 0u64;
        let mut termed: BTreeSet<u64> = BTreeSet::new();
        let hour = Duration::from_secs(3600);
        for op in ops {
            match op {
                Op::Publish { matching } => {
                    let e = Arc::new(LoggedEvent {
                        seq: next,
                        event_type: if matching { "a.x" } else { "b.x" }.into(),
                        encoded: Bytes::from_static(b"e").into(),
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
                    told.clear();
                }
                Op::Takeover => {
                    s.detach(now);
                    conn += 1;
                    s.attach(conn, window, None);
                    in_flight.clear();
                    told.clear();
                }
                Op::Detach if s.consumer().is_some() => {
                    s.detach(now);
                    in_flight.clear();
                    told.clear();
                }
                Op::Pull(n) if s.consumer().is_some() => {
                    let head = next - 1;
                    let p = s.pull(n, head, Instant::now());
                    if let Some(g) = p.gap { told.push((sends, g.lost)); }
                    for (e, redelivered, _) in p.events {
                        prop_assert!(!acked.contains(&e.seq), "acked seq {} delivered again", e.seq);
                    prop_assert!(!termed.contains(&e.seq), "termed seq {} delivered again", e.seq);
                        let times = delivered.entry(e.seq).or_default();
                        prop_assert!(*times == 0 || redelivered, "seq {} delivered twice unmarked", e.seq);
                        *times += 1;
                        sends += 1;
                        in_flight.push((e.seq, sends));
                    }
                    prop_assert!(s.in_flight() <= window);
                }
                Op::AckAll if s.consumer().is_some() && !in_flight.is_empty() => {
                    let k = in_flight.len();
                    ack_upto(&mut s, &mut in_flight, k, &mut acked, &mut told, &mut gap_total)?;
                }
                Op::AckSome(k) if s.consumer().is_some() && k > 0 && k <= in_flight.len() => {
                    ack_upto(&mut s, &mut in_flight, k, &mut acked, &mut told, &mut gap_total)?;
                }
                Op::AckOne(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    let (seq, n) = in_flight.remove(k - 1);
                    prop_assert!(s.ack_one(seq));
                    acked.insert(seq);
                    read_past(&mut told, n, &mut gap_total);
                }
                Op::AckRun(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    // The seqs from the lowest to the highest of the first
                    // k in flight: every event in flight in that run.
                    let seqs = in_flight[..k].iter().map(|&(seq, _)| seq);
                    let (first, last) = (seqs.clone().min().unwrap_or(0), seqs.max().unwrap_or(0));
                    let mut got = vec![];
                    let n = s.ack_run(first, last, Some(&mut got));
                    let (hit, kept): (Vec<_>, Vec<_>) = in_flight
                        .iter()
                        .partition(|&&(seq, _)| (first..=last).contains(&seq));
                    let mut want: Vec<u64> = hit.iter().map(|&(seq, _)| seq).collect();
                    got.sort_unstable();
                    want.sort_unstable();
                    prop_assert_eq!(n as usize, want.len());
                    prop_assert_eq!(&got, &want, "a run acks exactly its seqs in flight");
                    for &(_, d) in &hit {
                        read_past(&mut told, d, &mut gap_total);
                    }
                    acked.extend(want);
                    in_flight = kept;
                }
                Op::Term(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    let (seq, n) = in_flight.remove(k - 1);
                    prop_assert!(s.term(seq, "no"));
                    termed.insert(seq);
                    read_past(&mut told, n, &mut gap_total);
                }
                Op::Progress(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    let (seq, n) = in_flight[k - 1];
                    prop_assert!(s.progress(seq, Instant::now()));
                    read_past(&mut told, n, &mut gap_total);
                }
                Op::NackLater(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    let (seq, n) = in_flight.remove(k - 1);
                    prop_assert!(s.nack_after(seq, hour, Instant::now()));
                    read_past(&mut told, n, &mut gap_total);
                }
                Op::NackNow(k) if s.consumer().is_some() && k <= in_flight.len() => {
                    // Due at once: the next pull sends it behind the others.
                    let (seq, n) = in_flight.remove(k - 1);
                    prop_assert!(s.nack(seq, Instant::now()));
                    read_past(&mut told, n, &mut gap_total);
                }
                _ => {}
            }
            let c = s.counters;
            // What `ack` and `expire_in_flight` stop by.
            prop_assert_eq!(s.in_flight(), s.in_flight_slots());
            prop_assert_eq!(s.in_flight_bytes(), s.in_flight_slot_bytes());
            prop_assert_eq!(c.matched, c.acked + s.pending_len() as u64 + c.lost + c.parked);
            prop_assert_eq!(c.acked, acked.len() as u64);
            prop_assert!(s.pending_len() <= retention + window + s.delayed().0);
            prop_assert_eq!(c.parked, termed.len() as u64);
            let told_sum: u64 = told.iter().map(|t| t.1).sum();
            prop_assert!(gap_total + told_sum <= c.lost);
        }
        // Attach and drain: every loss is reported by a gap by the end.
        s.detach(now);
        s.attach(conn + 1, window, None);
        let mut last_told = 0;
        for _ in 0..1000 {
            let p = s.pull(usize::MAX, next - 1, Instant::now() + 2 * hour);
            if let Some(g) = p.gap { last_told += g.lost; }
            let Some((last, _, _)) = p.events.last() else { break };
            // Acking what came after a gap reads past it.
            gap_total += std::mem::take(&mut last_told);
            s.ack(last.seq);
        }
        prop_assert_eq!(gap_total + last_told, s.counters.lost);
        prop_assert_eq!(s.pending_len(), 0);
    }
}

/// A cumulative ack of the `k`-th event in flight (delivery order): it
/// settles exactly the first `k`, and reads past every gap told before the
/// `k`-th delivery.
fn ack_upto(
    s: &mut Subscription,
    in_flight: &mut Vec<(u64, u64)>,
    k: usize,
    acked: &mut BTreeSet<u64>,
    told: &mut Vec<(u64, u64)>,
    gap_total: &mut u64,
) -> Result<(), TestCaseError> {
    let (seq, n) = in_flight[k - 1];
    let mut settled = s.ack(seq);
    settled.sort_unstable();
    let mut want: Vec<u64> = in_flight.drain(..k).map(|(s, _)| s).collect();
    want.sort_unstable();
    prop_assert_eq!(
        settled,
        want.clone(),
        "a cumulative ack settles in delivery order"
    );
    acked.extend(want);
    read_past(told, n, gap_total);
    Ok(())
}

/// The consumer spoke about delivery `n`: every gap told before it is read.
fn read_past(told: &mut Vec<(u64, u64)>, n: u64, gap_total: &mut u64) {
    told.retain(|&(after, lost)| {
        let read = after < n;
        if read {
            *gap_total += lost;
        }
        !read
    });
}
