//! [`WriteAcks`]: the acks of `--ack write`. The seqs formatted for stdout
//! are queued in delivery order; when the stdout writer reports how many
//! events it wrote, exactly those seqs are acked, by name: a run of
//! consecutive seqs at a time (`Ack.runs`), so a stream's ack costs a few
//! bytes whatever its count (`BusConn::send` spells the runs out as
//! `Ack.seqs` for a bus that does not list `ack_runs`).
//!
//! Never a cumulative seq: the bus may deliver a lower seq behind higher
//! ones (a parked event replayed, an event delivered again), so "the last
//! written seq" neither settles such a late event once it is written nor
//! stops a higher ack from settling it before it is. Pure; unit-tested.

use std::collections::VecDeque;

use proto::v1;

/// Most seqs one Ack frame names (a burst larger than that is acked in
/// several frames; each stays far below the frame size bound, even spelled
/// out one by one).
pub(super) const MAX_SEQS_PER_ACK: usize = 8192;

#[derive(Debug, Default)]
pub(super) struct WriteAcks {
    /// Formatted and not yet acked, in delivery order.
    queued: VecDeque<u64>,
    /// Events acked so far (what the writer's count is compared with).
    acked: u64,
}

impl WriteAcks {
    /// Events formatted for stdout, in the order they will be written.
    pub(super) fn formatted(&mut self, seqs: impl IntoIterator<Item = u64>) {
        self.queued.extend(seqs);
    }

    /// How many written events wait for an ack, given the writer's count.
    pub(super) fn waiting(&self, written: u64) -> u64 {
        written
            .saturating_sub(self.acked)
            .min(self.queued.len() as u64)
    }

    /// The acks of every event written (`written`: the writer's count) and
    /// not acked yet, oldest first; empty when there is none.
    pub(super) fn take(&mut self, written: u64) -> Vec<v1::Ack> {
        let mut n = self.waiting(written) as usize;
        self.acked += n as u64;
        let mut acks = Vec::new();
        while n > 0 {
            let k = n.min(MAX_SEQS_PER_ACK);
            acks.push(v1::Ack {
                runs: runs(self.queued.drain(..k)),
                ..v1::Ack::default()
            });
            n -= k;
        }
        acks
    }
}

/// `seqs`, in their order, as runs of consecutive ascending seqs.
fn runs(seqs: impl IntoIterator<Item = u64>) -> Vec<v1::SeqRun> {
    let mut out: Vec<v1::SeqRun> = Vec::new();
    for seq in seqs {
        match out.last_mut() {
            Some(r) if r.last.checked_add(1) == Some(seq) => r.last = seq,
            _ => out.push(v1::SeqRun {
                first: seq,
                last: seq,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(acks: &[v1::Ack]) -> Vec<Vec<u64>> {
        acks.iter()
            .map(|a| a.runs.iter().flat_map(|r| r.first..=r.last).collect())
            .collect()
    }

    #[test]
    fn consecutive_seqs_go_as_one_run_in_delivery_order() {
        let mut w = WriteAcks::default();
        w.formatted([7, 8, 9, 3, 10, 11, 13, u64::MAX]);
        let acks = w.take(8);
        let runs: Vec<(u64, u64)> = acks[0].runs.iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(
            runs,
            [(7, 9), (3, 3), (10, 11), (13, 13), (u64::MAX, u64::MAX)]
        );
        assert!(acks[0].seqs.is_empty());
    }

    #[test]
    fn exactly_the_written_events_are_acked_in_delivery_order() {
        let mut w = WriteAcks::default();
        w.formatted([7, 8, 9]);
        assert!(w.take(0).is_empty());
        assert_eq!(w.waiting(2), 2);
        assert_eq!(seqs(&w.take(2)), [vec![7, 8]]);
        // A replayed event comes behind higher seqs: acked once written.
        w.formatted([3]);
        assert_eq!(seqs(&w.take(3)), [vec![9]]);
        assert_eq!(w.waiting(3), 0);
        assert_eq!(seqs(&w.take(4)), [vec![3]]);
        assert!(w.take(4).iter().all(|a| a.seq == 0), "never cumulative");
        assert!(w.take(4).is_empty());
    }

    #[test]
    fn a_count_past_what_was_formatted_acks_only_what_was() {
        let mut w = WriteAcks::default();
        w.formatted([1]);
        assert_eq!(w.waiting(5), 1);
        assert_eq!(seqs(&w.take(5)), [vec![1]]);
        w.formatted([2]);
        assert_eq!(w.waiting(5), 1);
    }

    #[test]
    fn a_huge_burst_is_acked_in_bounded_frames() {
        let mut w = WriteAcks::default();
        let n = MAX_SEQS_PER_ACK as u64 * 2 + 1;
        w.formatted(1..=n);
        let acks = w.take(n);
        assert_eq!(acks.len(), 3);
        assert!(seqs(&acks).iter().all(|s| s.len() <= MAX_SEQS_PER_ACK));
        assert_eq!(seqs(&acks)[2], [n]);
        assert!(acks.iter().all(|a| a.runs.len() == 1), "one run per frame");
    }
}
