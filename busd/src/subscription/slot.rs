//! Where one pending event stands ([`Slot`]), and how a pending entry holds
//! it: packed into 8 bytes ([`Packed`]: the state in the low two bits, the
//! instant as nanoseconds from a process-wide origin in the rest), so that
//! a subscription's entry per retained event stays at 32 bytes.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

/// Where one pending event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Unsent,
    /// Selected by its keys, waiting for its `--where` verdict (the
    /// filter runs off the hub lock: `crate::filter`); delivery stops here.
    Filtering,
    InFlight {
        since: Instant,
    },
    /// Acked while an earlier event is still unacked (explicit acks).
    Acked,
    /// Nacked: not to be delivered again before `until`.
    Delayed {
        until: Instant,
    },
}

/// The origin of packed instants: far enough back that no instant of
/// this process is before it (about 68 years, where the platform allows).
fn origin() -> Instant {
    // process-wide: a constant, set once (what packed instants count from).
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(|| {
        let now = Instant::now();
        [1u64 << 31, 1 << 20, 1 << 10]
            .iter()
            .find_map(|&s| now.checked_sub(Duration::from_secs(s)))
            .unwrap_or(now)
    })
}

const TAG: u64 = 0b11;
const MAX_NANOS: u64 = u64::MAX >> 2;

fn pack_at(at: Instant, tag: u64) -> u64 {
    let nanos = at.saturating_duration_since(origin()).as_nanos();
    (u64::try_from(nanos).unwrap_or(MAX_NANOS).min(MAX_NANOS) << 2) | tag
}

fn unpack_at(p: u64) -> Instant {
    origin() + Duration::from_nanos(p >> 2)
}

/// A [`Slot`] in 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Packed(u64);

impl Packed {
    pub(super) fn get(self) -> Slot {
        match self.0 & TAG {
            0 if self.0 == 0 => Slot::Unsent,
            0 => Slot::Filtering,
            1 => Slot::InFlight {
                since: unpack_at(self.0),
            },
            2 => Slot::Acked,
            _ => Slot::Delayed {
                until: unpack_at(self.0),
            },
        }
    }

    pub(super) fn set(&mut self, s: Slot) {
        *self = s.into();
    }

    /// Whether it is [`Slot::InFlight`], without reading its instant.
    pub(super) fn is_in_flight(self) -> bool {
        self.0 & TAG == 1
    }

    /// Whether it is [`Slot::Acked`].
    pub(super) fn is_acked(self) -> bool {
        self.0 == 2
    }
}

impl From<Slot> for Packed {
    fn from(s: Slot) -> Packed {
        Packed(match s {
            Slot::Unsent => 0,
            Slot::Filtering => 4,
            Slot::InFlight { since } => pack_at(since, 1),
            Slot::Acked => 2,
            Slot::Delayed { until } => pack_at(until, 3),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_slot_gives_back_what_it_was_given() {
        let now = Instant::now();
        let slots = [
            Slot::Unsent,
            Slot::Filtering,
            Slot::Acked,
            Slot::InFlight { since: now },
            Slot::Delayed {
                until: now + Duration::from_secs(3600),
            },
            Slot::InFlight {
                since: now - Duration::from_millis(1),
            },
        ];
        for s in slots {
            let p = Packed::from(s);
            assert_eq!(p.get(), s);
            assert_eq!(p.is_in_flight(), matches!(s, Slot::InFlight { .. }));
            assert_eq!(p.is_acked(), s == Slot::Acked);
        }
        assert_eq!(std::mem::size_of::<Packed>(), 8);
        // One per retained event per subscription that matched it.
        assert!(std::mem::size_of::<super::super::Entry>() <= 32);
    }
}
