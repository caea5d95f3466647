//! The words of slow consumers on one subscription: `progress` (an event
//! in flight is still being worked on: its ack wait starts again), `term`
//! (it will never succeed: parked at once, with the consumer's reason), the
//! redelivery backoff (the delay before the Nth redelivery after an ack-wait
//! expiry or a nack without a delay), and what waits out a delay: how many,
//! until when, and how many of them retention leaves alone.

use std::time::{Duration, Instant};

use super::{Slot, Subscription};

/// Most events waiting out a delay (a nack's or a backoff step's) that one
/// subscription keeps past retention; a delayed event retention reaches
/// beyond that is lost and reported as a gap, like an unsent one.
pub const MAX_DELAYED_PINNED: usize = 1000;

impl Subscription {
    /// The delay before delivering again an event delivered `deliveries`
    /// times, after an ack-wait expiry or a nack without a delay: the
    /// backoff step for that redelivery, the last one repeating; zero
    /// without a backoff. No jitter (as JetStream's `BackOff`): the due time
    /// is predictable, and shown in status.
    pub fn backoff_step(&self, deliveries: u32) -> Duration {
        let n = (deliveries.max(1) - 1) as usize;
        self.backoff
            .get(n)
            .or(self.backoff.last())
            .copied()
            .unwrap_or(Duration::ZERO)
    }

    /// Explicit acks: in-flight events whose wait ran out at `now` (each
    /// by the wait of the worker it went to, whoever pulls) are delivered
    /// again, after their backoff step (counted from the expiry). With
    /// other workers attached, an expired event keeps the id of the one it
    /// expired on (`Entry::owner`): it goes to another. Returns whether any
    /// expired.
    pub(super) fn expire_in_flight(&mut self, now: Instant) -> bool {
        let mut first = None;
        let others = self.workers.len() > 1;
        // In-flight events are at most the windows: stop after the last
        // one instead of walking a backlog of unsent events on every pull
        // (a work queue's backlog made each pull O(backlog)).
        let mut left = self.in_flight;
        let mut i = 0;
        while left > 0 && i < self.pending.len() {
            i += 1;
            let Slot::InFlight { since } = self.pending[i - 1].slot.get() else {
                continue;
            };
            left -= 1;
            let i = i - 1;
            let owner = self.pending[i].owner;
            let Some(wait) = self.workers.wait_of(owner) else {
                continue;
            };
            if since + wait > now {
                continue;
            }
            let step = self.backoff_step(self.pending[i].deliveries);
            self.pending[i].slot.set(if step.is_zero() {
                Slot::Unsent
            } else {
                Slot::Delayed {
                    until: since + wait + step,
                }
            });
            self.left_flight(i);
            self.stalled(owner);
            if others {
                self.pending[i].owner = owner;
            }
            first.get_or_insert(i);
        }
        if let Some(i) = first {
            self.reopen(i);
        }
        first.is_some()
    }

    /// What a consumer that takes nothing now (its connection's buffer is
    /// full) still needs: in-flight events past their wait expire (as in a
    /// pull), and when the next of the acting worker's does. Returns
    /// whether any expired, and that time.
    pub(super) fn expire_held(&mut self, now: Instant) -> (bool, Option<Instant>) {
        let expired = self.workers.any_explicit() && self.expire_in_flight(now);
        (expired, self.next_expiry_here())
    }

    /// When the first in-flight event of the worker acted for runs out of
    /// its ack wait (explicit acks; `None` otherwise or without one). Its
    /// connection wakes then, however little it takes.
    pub(super) fn next_expiry_here(&self) -> Option<Instant> {
        let wait = self.explicit_wait()?;
        let mut next: Option<Instant> = None;
        let mut left = self.in_flight;
        for i in 0..self.pending.len() {
            if left == 0 {
                break;
            }
            if let Slot::InFlight { since } = self.pending[i].slot.get() {
                left -= 1;
                if self.in_flight_here(i) {
                    next = Some(next.map_or(since + wait, |n| n.min(since + wait)));
                }
            }
        }
        next
    }

    /// Nack of the in-flight event `seq`: delivered again after `delay`, or
    /// (a delay of zero) after its backoff step. Returns whether it was one.
    pub(super) fn nack_after(&mut self, seq: u64, delay: Duration, now: Instant) -> bool {
        let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) else {
            return false;
        };
        let delay = if delay.is_zero() {
            self.backoff_step(self.pending[i].deliveries)
        } else {
            delay
        };
        self.nack(seq, now + delay)
    }

    /// `progress`: the in-flight event `seq` is still being worked on; its
    /// ack wait starts again at `now`. The delivery count does not change.
    /// Returns whether it was in flight.
    pub(super) fn progress(&mut self, seq: u64, now: Instant) -> bool {
        let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) else {
            return false;
        };
        let sent = self.pending[i].sent;
        if !self.in_flight_here(i) {
            return false;
        }
        self.pending[i].slot.set(Slot::InFlight { since: now });
        self.gaps.read_past(sent);
        self.alive();
        true
    }

    /// `term`: the event `seq` will never succeed; it goes to the parked
    /// list now, whatever `max_deliver` says, with `reason` and its delivery
    /// count. Applies to an event delivered and not acked (in flight, or
    /// waiting to come again). Returns whether it was parked.
    pub(super) fn term(&mut self, seq: u64, reason: &str) -> bool {
        let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) else {
            return false;
        };
        let e = &self.pending[i];
        // Not another worker's event in flight (shared delivery).
        let elsewhere = matches!(e.slot.get(), Slot::InFlight { .. }) && !self.in_flight_here(i);
        if e.slot.get() == Slot::Acked || e.deliveries == 0 || elsewhere {
            return false;
        }
        self.gaps.read_past(e.sent);
        let reason = proto::limits::clip_to(reason.trim(), proto::limits::MAX_TERM_REASON_CHARS);
        self.park_at(i, (!reason.is_empty()).then_some(reason));
        true
    }

    /// How many events wait out a delay, and the earliest due time.
    pub fn delayed(&self) -> (usize, Option<Instant>) {
        self.pending
            .iter()
            .filter_map(|e| match e.slot.get() {
                Slot::Delayed { until } => Some(until),
                _ => None,
            })
            .fold((0, None), |(n, first), until| {
                (n + 1, Some(first.map_or(until, |f: Instant| f.min(until))))
            })
    }

    /// Whether retention leaves the delayed `pending[i]` alone: fewer than
    /// [`MAX_DELAYED_PINNED`] delayed events before it (they were all
    /// evicted from the log already, retention goes in seq order).
    pub(super) fn keeps_delayed(&self, i: usize) -> bool {
        self.pending
            .range(..i)
            .filter(|e| matches!(e.slot.get(), Slot::Delayed { .. }))
            .count()
            < MAX_DELAYED_PINNED
    }
}

/// `until` as a wall-clock time in unix ms, given one `now` on both clocks
/// (for status and the store). The time ahead is rounded up to the
/// millisecond, so a due time shown is not a millisecond earlier than the
/// one the bus keeps.
pub fn wall_ms(until: Instant, now: (Instant, i64)) -> i64 {
    match until.checked_duration_since(now.0) {
        Some(ahead) => now
            .1
            .saturating_add(ahead.as_micros().div_ceil(1000) as i64),
        None => now.1 - now.0.duration_since(until).as_millis() as i64,
    }
}

/// The inverse of [`wall_ms`]: a stored due time back on the monotonic
/// clock (a time already past is due now).
pub fn instant_at(ms: i64, now: (Instant, i64)) -> Instant {
    now.0 + Duration::from_millis((ms - now.1).max(0) as u64)
}
