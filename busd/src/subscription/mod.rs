//! [`Subscription`]: the delivery state of one subscription — what it
//! selects, what is pending, what is in flight, what was lost or parked,
//! whether it is active, halted or disabled — as a pure state machine. No
//! I/O, no locks, no clocks of its own: the hub calls it under its lock and
//! passes the time in.
//!
//! `pending` holds the matched events not yet acked, in seq order, each in a
//! [`Slot`]: unsent, in flight to the attached consumer, acked out of order
//! (explicit acks; dropped once everything before it is acked too), or
//! waiting out a delay (a nack's or a backoff step's). In-flight events are
//! pinned: retention does not take them from the subscription (at most one
//! window of them), so they can be delivered again if the consumer goes away
//! without acking; delayed ones are pinned too, up to
//! [`MAX_DELAYED_PINNED`]. Everything else in `pending` is also in the log;
//! when retention evicts it before it was sent, it is dropped and counted as
//! lost, and reported by a gap until a consumer read past it (`gap`).
//!
//! Deliveries are numbered (`Entry::sent`): a cumulative ack settles what
//! was delivered up to the acked event's delivery, in delivery order, since
//! a replayed or redelivered event goes out behind higher seqs.
//!
//! Every delivery of an event is counted. With `max_deliver`, an event about
//! to be delivered again after that many deliveries is poison: the
//! subscription halts at it (`halt`) or moves it to its parked list (`park`).
//!
//! Here: the state, fan-out, eviction, attach/detach, pull and nacks; acks
//! (cumulative, one by one, by runs) in `acks`. The
//! stored form (`record`, `restore`) is in `record`, the operator verbs in
//! `verbs`, shared delivery's claimed events in `shared`, the words of slow
//! consumers (progress, term, backoff, delayed events kept from retention)
//! in `slow`, unreported losses in `gap`; unit tests in `tests`,
//! `slow_tests` and `exact_tests`, the property tests against a model in
//! `model` and `verbs_model`.

mod acks;
mod check;
#[cfg(test)]
mod exact_tests;
mod gap;
mod hole;
#[cfg(test)]
mod model;
mod position;
mod reading;
mod record;
mod selecting;
mod shared;
mod slot;
mod slow;
#[cfg(test)]
mod slow_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_shared;
#[cfg(test)]
mod tests_where;
#[cfg(test)]
mod tests_workers;
mod verbs;
#[cfg(test)]
mod verbs_model;
mod workers;

pub use check::{check_snapshot, SnapshotError};
pub use selecting::Offered;
pub use slow::{wall_ms, MAX_DELAYED_PINNED};
pub use workers::{WorkerMut, MAX_WORKERS};

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use proto::v1::{self, PoisonPolicy};

use self::gap::Gaps;
use self::slot::{Packed, Slot};
use crate::{
    eventlog::{LoggedEvent, Name},
    pattern::Selector,
    store::{HaltRecord, SubCounters},
};

pub type ConnId = u64;

/// Most events one subscription keeps parked; past it the oldest is dropped
/// (and counted in `parked_dropped`).
pub const MAX_PARKED: usize = 1000;

#[derive(Debug, Clone)]
struct Entry {
    event: Arc<LoggedEvent>,
    /// A [`Slot`], packed.
    slot: Packed,
    deliveries: u32,
    /// Which delivery of the subscription sent it last (its `sends` then):
    /// orders deliveries, which seqs do not (a replayed or nacked event
    /// goes out behind higher seqs).
    sent: u64,
    /// While in flight: the worker it went to (`workers`); else 0.
    owner: u32,
}

/// An event on the parked (dead-letter) list.
#[derive(Debug, Clone)]
pub struct Parked {
    pub event: Arc<LoggedEvent>,
    pub deliveries: u32,
    pub parked_at_ms: i64,
    /// Why, when the consumer parked it itself (`term`).
    pub reason: Option<String>,
}

/// Whether a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Active,
    /// Stopped at a poison event until `restart` or `skip`.
    Halted(HaltRecord),
    /// Collects (bounded by retention, gaps reported) but delivers nothing.
    Disabled,
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Active => "active",
            State::Halted(_) => "halted",
            State::Disabled => "disabled",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Subscription {
    pub id: String,
    pub selector: Selector,
    /// The event type the keys judged last at fan-out, and the verdict:
    /// a run of events of one type is judged once.
    last_type: Option<(Name, bool)>,
    /// Created by one `consume` run and removed by it: never stored.
    pub owned: bool,
    pub ttl: Duration,
    pub created_at_ms: i64,
    /// The upstream subscription this one is bound to (personal stream).
    pub upstream_id: Option<String>,
    pub max_deliver: u32,
    pub on_poison: PoisonPolicy,
    /// The delay before the Nth redelivery after an ack-wait expiry or a
    /// nack without a delay is `backoff[N-1]`, the last step repeating;
    /// empty: at once.
    pub backoff: Vec<Duration>,
    /// The ack wait of an explicit-ack consumer that names none.
    pub ack_wait: Option<Duration>,
    pub state: State,
    /// Shared delivery (`--delivery shared`): several consumers, each
    /// event to one of them.
    pub shared: bool,
    /// Shared delivery on a cluster host: events enter `pending` only when
    /// this host claimed them ([`Subscription::push_claimed`]), never by
    /// `offer` ([`Subscription::set_claimed`]).
    pub claimed: bool,
    /// Shared delivery: the subscription starts after this seq, on every
    /// host (the head when it was created, for `--from latest`).
    shared_from: u64,
    pending: VecDeque<Entry>,
    /// Every entry of `pending` before this index is `InFlight` or `Acked`:
    /// where [`Subscription::pull`] and [`Subscription::has_unsent`] start
    /// looking, so a full window is not walked again for every pull. Lowered
    /// by whatever makes an earlier entry sendable (see [`Self::reopen`]).
    scan_from: usize,
    /// Entries in `pending` that are `Acked`.
    acked_in_queue: usize,
    /// Entries in `pending` that are `Filtering` (waiting for their
    /// `--where` verdict; see `selecting`).
    filtering: usize,
    /// Every `Filtering` entry at or below this seq was handed to the
    /// filter already ([`Subscription::filter_jobs`]).
    filter_handed: u64,
    /// The first `--where` failure past a limit not yet told to a consumer.
    where_notice: Option<(u64, crate::where_filter::WhereFailure)>,
    /// The last `--where` failure past a limit (for status).
    where_last: Option<(u64, crate::where_filter::WhereFailure)>,
    /// Verdicts on events at or below it were counted before a restart
    /// (the stored counters have them): not counted again.
    counted_through: u64,
    in_flight: usize,
    /// The encoded bytes of the events in flight (they are pinned).
    in_flight_bytes: usize,
    /// Shared delivery: past this many bytes in flight no worker takes
    /// more (but one event) until some are acked (retention's byte bound).
    max_in_flight_bytes: usize,
    parked: VecDeque<Parked>,
    /// Highest seq ever sent: anything at or below it that is sent again is
    /// marked redelivered.
    max_sent_seq: u64,
    /// Every matching event at or below it was acked or reported lost.
    acked_through: u64,
    /// The consumers attached (several only with shared delivery).
    workers: workers::Workers,
    /// The credit window of a consumer that names none.
    window: usize,
    /// When it was last left without a consumer (for the TTL; wall clock for
    /// status and the store).
    detached_at: Option<(Instant, i64)>,
    /// Losses not yet reported to a consumer that read past them.
    gaps: Gaps,
    /// Deliveries so far (numbers [`Entry::sent`]).
    sends: u64,
    pub counters: SubCounters,
}

/// What [`Subscription::pull`] hands a consumer.
#[derive(Debug, Default)]
pub struct Pulled {
    pub gap: Option<v1::Gap>,
    /// Events with their redelivered mark and delivery count.
    pub events: Vec<(Arc<LoggedEvent>, bool, u32)>,
    /// The next event to deliver is damaged in the store and everything
    /// before it is acked: delivery stops here.
    pub damaged_at: Option<u64>,
    /// The subscription halted at a poison event during this pull.
    pub halted: Option<HaltRecord>,
    /// When something not deliverable now becomes deliverable (a nack's
    /// delay, an explicit ack's wait): the connection wakes then.
    pub next_due: Option<Instant>,
    /// An ack wait ran out during this pull (what is stored changed: a
    /// delivery count, a backoff's due time).
    pub expired: bool,
    /// Shared delivery: events are left that this worker did not take (past
    /// its share, or expired on it): the others with credit must pull.
    pub left_for_others: bool,
    /// The first event the subscription's `--where` gave no answer for
    /// within a limit, and which limit: told once per attach.
    pub where_failed: Option<(u64, crate::where_filter::WhereFailure)>,
}

/// Why an operator verb does not apply.
pub type VerbError = String;

impl Subscription {
    /// A new subscription, detached, whose backlog starts after `start_after`
    /// (its consumers' credit window `window` unless they name one).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        selector: Selector,
        owned: bool,
        ttl: Duration,
        upstream_id: Option<String>,
        start_after: u64,
        now: (Instant, i64),
        window: usize,
    ) -> Subscription {
        Subscription {
            id,
            selector,
            last_type: None,
            owned,
            ttl,
            created_at_ms: now.1,
            upstream_id,
            max_deliver: 0,
            on_poison: PoisonPolicy::PoisonHalt,
            backoff: Vec::new(),
            ack_wait: None,
            state: State::Active,
            shared: false,
            claimed: false,
            shared_from: start_after,
            pending: VecDeque::new(),
            scan_from: 0,
            acked_in_queue: 0,
            filtering: 0,
            filter_handed: 0,
            where_notice: None,
            where_last: None,
            counted_through: 0,
            in_flight: 0,
            in_flight_bytes: 0,
            max_in_flight_bytes: usize::MAX,
            parked: VecDeque::new(),
            max_sent_seq: 0,
            acked_through: start_after,
            workers: Default::default(),
            window: window.max(1),
            detached_at: Some(now),
            gaps: Gaps::default(),
            sends: 0,
            counters: SubCounters::default(),
        }
    }

    /// The lowest seq this subscription needs kept in the store beyond the
    /// log: pinned in-flight events and parked ones.
    pub fn oldest_kept(&self) -> Option<u64> {
        let pending = self.pending.front().map(|e| e.event.seq);
        let parked = self.parked.iter().map(|p| p.event.seq).min();
        pending.into_iter().chain(parked).min()
    }

    /// Whether this subscription wants `e` by its route, keys and
    /// `--filter` (a damaged placeholder's type is unknown: every
    /// subscription must stop at it). Its `--where` is not run here: see
    /// [`Subscription::offer`].
    pub fn selects(&self, e: &LoggedEvent) -> bool {
        self.selector.selects_keys(e, self.upstream_id.as_deref())
    }

    /// [`Self::selects`], the keys' verdict on `e`'s type reused while
    /// the events offered share one interned type.
    fn selects_at_fan_out(&mut self, e: &LoggedEvent) -> bool {
        let (selector, last) = (&self.selector, &mut self.last_type);
        crate::pattern::selects_by(e, self.upstream_id.as_deref(), |t| match last {
            Some((seen, verdict)) if seen.same(t) => *verdict,
            _ => {
                let verdict = selector.matches(t);
                *last = Some((t.clone(), verdict));
                verdict
            }
        })
    }

    /// Fan-out: takes `e` if it matches. An event this subscription's
    /// `--where` must judge waits in `pending` for the verdict (delivery
    /// stops at it), which the filter gives off the hub lock.
    pub fn offer(&mut self, e: &Arc<LoggedEvent>) -> Offered {
        if self.claimed || e.seq <= self.acked_through || !self.selects_at_fan_out(e) {
            return Offered::No;
        }
        let judged = self.selector.has_where() && !e.damaged;
        self.pending.push_back(Entry {
            event: e.clone(),
            slot: if judged {
                Slot::Filtering
            } else {
                Slot::Unsent
            }
            .into(),
            deliveries: 0,
            sent: 0,
            owner: 0,
        });
        if judged {
            self.filtering += 1;
            Offered::ToFilter
        } else {
            self.counters.matched += 1;
            Offered::Taken
        }
    }

    /// Retention evicted `seq` from the log. If it was pending and not in
    /// flight (or waiting out a delay, within [`MAX_DELAYED_PINNED`]) it is
    /// lost, and reported with the next delivery.
    pub fn evicted(&mut self, seq: u64) {
        if let Ok(i) = self.pending.binary_search_by_key(&seq, |e| e.event.seq) {
            let slot = self.pending[i].slot.get();
            match slot {
                Slot::Delayed { .. } if self.keeps_delayed(i) => {}
                // Not judged yet: it may have matched, so it counts lost.
                Slot::Unsent | Slot::Delayed { .. } | Slot::Filtering => {
                    if slot == Slot::Filtering {
                        self.filtering -= 1;
                    }
                    self.pending.remove(i);
                    self.removed_at(i);
                    self.gaps.lost(1, Some(seq));
                    self.counters.lost += 1;
                    self.acked_through = self.acked_through.max(seq);
                }
                Slot::InFlight { .. } | Slot::Acked => {}
            }
        }
    }

    /// `pending[i]` became sendable (unsent or delayed): the scan must
    /// start at it again.
    pub(super) fn reopen(&mut self, i: usize) {
        self.scan_from = self.scan_from.min(i);
    }

    /// `pending[i]` was removed: later entries moved one place up.
    fn removed_at(&mut self, i: usize) {
        if i < self.scan_from {
            self.scan_from -= 1;
        }
    }

    /// `pending` was rebuilt or reordered: scan it all again.
    pub(super) fn rescan(&mut self) {
        self.scan_from = 0;
    }

    /// Up to `max` events within the window, and a gap first if one is due.
    pub(super) fn pull(&mut self, max: usize, head: u64, now: Instant) -> Pulled {
        self.pull_within(max, usize::MAX, head, now)
    }

    /// [`Self::pull`] that also stops once the events taken reach
    /// `max_bytes` (encoded; at least one event is taken).
    pub(super) fn pull_within(
        &mut self,
        max: usize,
        max_bytes: usize,
        head: u64,
        now: Instant,
    ) -> Pulled {
        let mut out = Pulled::default();
        let mut bytes = 0usize;
        if let Some((lost, through)) = self.gaps.take(self.sends) {
            out.gap = Some(v1::Gap {
                subscription_id: self.id.clone(),
                lost,
                resume_seq: self.resume_after(through, head),
            });
        }
        // A consumer attaching to a halted subscription is told so (and ends
        // with reason `halted`) instead of waiting for nothing.
        let halted = match &self.state {
            State::Halted(h) => Some(h.clone()),
            _ => None,
        };
        let notice = self.where_notice;
        if let Some(w) = self.workers.acting_mut() {
            if !w.halt_told {
                out.halted = halted;
            }
            w.halt_told |= out.halted.is_some();
            if !w.where_told && notice.is_some() {
                out.where_failed = notice;
                w.where_told = true;
            }
        }
        if out.where_failed.is_some() {
            self.where_notice = None;
        }
        // Explicit acks: what waited too long goes out again (after its
        // backoff step), whichever worker it waited on.
        let me = self.workers.acting_id();
        if self.workers.any_explicit() {
            out.expired = self.expire_in_flight(now);
        }
        // Several workers: this one takes its share of the fresh events,
        // and none that expired on it while another is attached.
        let others = self.workers.len() > 1;
        let mut fresh_left = if others {
            let fresh = self.fresh_sendable(me, now);
            self.workers.share(fresh)
        } else {
            usize::MAX
        };
        // Every event of this pull goes in flight at `now`: packed once.
        let in_flight_now = Packed::from(Slot::InFlight { since: now });
        let mut i = self.scan_from.min(self.pending.len());
        // The first entry passed that stays sendable (a delayed one).
        let mut still_open: Option<usize> = None;
        while i < self.pending.len() {
            let entry = &self.pending[i];
            if entry.slot.is_in_flight() || entry.slot.is_acked() {
                i += 1;
                continue;
            }
            let due = match entry.slot.get() {
                Slot::Unsent => true,
                Slot::Delayed { until } if until <= now => true,
                Slot::Delayed { until } => {
                    out.next_due = Some(out.next_due.map_or(until, |d| d.min(until)));
                    still_open.get_or_insert(i);
                    false
                }
                Slot::InFlight { .. } | Slot::Acked => false,
                // In seq order: nothing after it goes before its verdict.
                Slot::Filtering => break,
            };
            if !due {
                i += 1;
                continue;
            }
            // Not back to the worker it expired on, while another is here.
            if others && entry.owner == me && me != 0 {
                out.left_for_others = true;
                still_open.get_or_insert(i);
                i += 1;
                continue;
            }
            if self.state != State::Active
                || !self.has_credit()
                || out.events.len() >= max
                || bytes >= max_bytes
            {
                break;
            }
            // Shared: the subscription's pinned bytes are bounded (one
            // event always goes).
            let len = entry.event.encoded.len();
            if self.in_flight_bytes > 0
                && self.in_flight_bytes.saturating_add(len) > self.max_in_flight_bytes
            {
                break;
            }
            // An event past this worker's share is left for the others.
            if fresh_left == 0 {
                out.left_for_others = true;
                break;
            }
            if entry.event.damaged {
                // Reported only once everything before it is acked, so the
                // consumer has written every good event before it stops.
                if self.in_flight == 0 && out.events.is_empty() {
                    out.damaged_at = Some(entry.event.seq);
                }
                break;
            }
            if self.max_deliver > 0 && entry.deliveries >= self.max_deliver {
                let halt = HaltRecord {
                    seq: entry.event.seq,
                    event_id: entry.event.shown_id(),
                    deliveries: entry.deliveries,
                    since_unix_ms: crate::clock::now_ms(),
                };
                if self.on_poison == PoisonPolicy::PoisonPark {
                    self.park_at(i, None);
                    continue;
                }
                self.state = State::Halted(halt.clone());
                if let Some(w) = self.workers.acting_mut() {
                    w.halt_told = true;
                }
                out.halted = Some(halt);
                break;
            }
            let entry = &mut self.pending[i];
            entry.slot = in_flight_now;
            entry.deliveries += 1;
            self.sends += 1;
            entry.sent = self.sends;
            let redelivered = entry.event.seq <= self.max_sent_seq || entry.deliveries > 1;
            if redelivered {
                self.counters.redelivered += 1;
            }
            self.max_sent_seq = self.max_sent_seq.max(entry.event.seq);
            bytes = bytes.saturating_add(entry.event.encoded.len());
            out.events
                .push((entry.event.clone(), redelivered, entry.deliveries));
            self.took_flight(i);
            fresh_left = fresh_left.saturating_sub(1);
            i += 1;
        }
        // With explicit acks, the first of this worker's waits to run out.
        if let Some(at) = self.next_expiry_here() {
            out.next_due = Some(out.next_due.map_or(at, |d| d.min(at)));
        }
        // Everything before `i` is now in flight or acked, but for a delayed
        // entry passed on the way.
        self.scan_from = still_open.unwrap_or(i).min(i);
        self.counters.delivered += out.events.len() as u64;
        out
    }

    /// Nack: the in-flight event `seq` is delivered again, not before `until`.
    pub(super) fn nack(&mut self, seq: u64, until: Instant) -> bool {
        let Ok(i) = self.position(seq) else {
            return false;
        };
        if self.in_flight_here(i) {
            self.pending[i].slot.set(Slot::Delayed { until });
            self.left_flight(i);
            self.gaps.read_past(self.pending[i].sent);
            self.reopen(i);
            true
        } else {
            false
        }
    }

    /// Whether there is something to send now (or a gap to report).
    pub(super) fn has_unsent(&self) -> bool {
        self.gaps.is_due()
            || (self.state == State::Active
                && self.has_credit()
                && self
                    .pending
                    .range(self.scan_from.min(self.pending.len())..)
                    .map(|e| e.slot.get())
                    .take_while(|s| *s != Slot::Filtering)
                    .any(|s| s == Slot::Unsent))
    }
}

pub fn poison_name(p: PoisonPolicy) -> &'static str {
    match p {
        PoisonPolicy::PoisonHalt => "halt",
        PoisonPolicy::PoisonPark => "park",
    }
}
