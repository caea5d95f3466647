//! Reading a subscription's state for status, the store and housekeeping:
//! its expiry, cursor, what is pending and in flight, the oldest unacked
//! event.

use std::{sync::Arc, time::Instant};

use super::{Slot, Subscription};
use crate::eventlog::LoggedEvent;

impl Subscription {
    pub fn expires_at(&self) -> Option<Instant> {
        match (self.consumer(), self.detached_at) {
            // A TTL of `never` (Duration::MAX) overflows: no expiry.
            (None, Some((at, _))) => at.checked_add(self.ttl),
            _ => None,
        }
    }

    /// Wall-clock time it was left without a consumer, while it is.
    pub fn detached_since_ms(&self) -> Option<i64> {
        self.detached_at
            .filter(|_| self.consumer().is_none())
            .map(|(_, ms)| ms)
    }

    /// Every matching event at or below the cursor has been acked (or
    /// reported lost): the seq before the oldest unacked one, or the head.
    pub fn cursor(&self, head: u64) -> u64 {
        self.pending
            .iter()
            .find(|e| e.slot.get() != Slot::Acked)
            .map_or(head, |e| e.event.seq - 1)
    }

    /// Matched events not yet acked (parked ones excluded, and those
    /// still waiting for their `--where` verdict).
    pub fn pending_len(&self) -> usize {
        self.pending.len() - self.acked_in_queue - self.filtering
    }

    /// Events waiting for their `--where` verdict.
    pub fn filtering_len(&self) -> usize {
        self.filtering
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The entries whose slot is in flight, counted (what `in_flight`
    /// must always equal).
    #[cfg(test)]
    pub(super) fn in_flight_slots(&self) -> usize {
        self.pending
            .iter()
            .filter(|e| matches!(e.slot.get(), Slot::InFlight { .. }))
            .count()
    }

    /// The encoded bytes of the entries whose slot is in flight (what
    /// `in_flight_bytes` must always equal).
    #[cfg(test)]
    pub(super) fn in_flight_slot_bytes(&self) -> usize {
        self.pending
            .iter()
            .filter(|e| matches!(e.slot.get(), Slot::InFlight { .. }))
            .map(|e| e.event.encoded.len())
            .sum()
    }

    pub fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// The oldest unacked event and how many times it was delivered.
    pub fn oldest_pending(&self) -> Option<(&Arc<LoggedEvent>, u32)> {
        self.pending
            .iter()
            .find(|e| !matches!(e.slot.get(), Slot::Acked | Slot::Filtering))
            .map(|e| (&e.event, e.deliveries))
    }

    /// Whether a consumer attached to it acks one by one.
    pub fn explicit_ack(&self) -> bool {
        self.workers.iter().any(|w| w.explicit.is_some())
    }
}
