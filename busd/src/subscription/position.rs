//! Where an acked seq sits in a subscription's pending queue: acks come in
//! delivery order, for the events at its front, so the queue is first read
//! at the index the seq would have if the seqs from the front were
//! consecutive (one look), and searched only when that misses.

use super::Subscription;

impl Subscription {
    /// `binary_search` of `seq` in `pending`, with a direct look first.
    pub(super) fn position(&self, seq: u64) -> Result<usize, usize> {
        let guess = self
            .pending
            .front()
            .and_then(|f| seq.checked_sub(f.event.seq))
            .and_then(|d| usize::try_from(d).ok());
        if let Some(i) = guess {
            if self.pending.get(i).is_some_and(|e| e.event.seq == seq) {
                return Ok(i);
            }
        }
        self.pending.binary_search_by_key(&seq, |e| e.event.seq)
    }
}
