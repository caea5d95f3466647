//! The consumers attached to a [`Subscription`]: one, or with shared
//! delivery (`--delivery shared`, a work queue) several, each with its own
//! credit window, ack mode and in-flight count ([`Worker`]). An entry in
//! flight names the worker it went to (`Entry::owner`); pulls, acks, nacks,
//! progress, terms and ack-wait expiries are made through one worker
//! ([`Subscription::worker_mut`] gives a [`WorkerMut`]) and touch only that
//! worker's entries, so one worker never settles another's event. (Inside
//! this module the worker a call is for is `Workers::acting`, which only
//! `WorkerMut`, `attach` and `detach_conn` set.) A worker that leaves gives back
//! what it had in flight: the others take it, marked redelivered.
//!
//! Dispatch: a worker pulls at most its share ([`Workers::share`]) of the
//! unsent events, water-filled over every worker with credit (the least
//! loaded first, ties to the one pulling), so idle workers get work before
//! a busy one takes more; the hub wakes the others for the rest. An event
//! whose ack wait ran out on one worker keeps that worker's id
//! (`Entry::owner`, while it waits to go again) and goes to another: back to
//! the same worker only when it is the only one attached.

use std::{
    ops::Deref,
    time::{Duration, Instant},
};

use super::{ConnId, Pulled, Slot, Subscription};

/// Most consumers one shared subscription takes at once.
pub const MAX_WORKERS: usize = 256;

/// One attached consumer.
#[derive(Debug, Clone)]
pub(super) struct Worker {
    pub(super) conn: ConnId,
    /// Names its entries in flight (`Entry::owner`); never 0, never reused
    /// in this subscription.
    pub(super) id: u32,
    pub(super) window: usize,
    /// It acks event by event; what it leaves unacked that long comes again.
    pub(super) explicit: Option<Duration>,
    pub(super) in_flight: usize,
    /// Told that the subscription is halted.
    pub(super) halt_told: bool,
    /// Told of a `--where` failure past a limit.
    pub(super) where_told: bool,
    /// An event's ack wait ran out on it, and it acked nothing since
    /// (hung, stopped, or slow without `progress`): it takes work only
    /// when no other worker has room.
    pub(super) stalled: bool,
}

/// The attached consumers, and which one a call acts for.
#[derive(Debug, Clone, Default)]
pub(super) struct Workers {
    list: Vec<Worker>,
    acting: usize,
    next_id: u32,
}

impl Workers {
    pub(super) fn acting(&self) -> Option<&Worker> {
        self.list.get(self.acting)
    }

    pub(super) fn acting_mut(&mut self) -> Option<&mut Worker> {
        self.list.get_mut(self.acting)
    }

    /// The acting worker's id (0: nobody attached).
    pub(super) fn acting_id(&self) -> u32 {
        self.acting().map_or(0, |w| w.id)
    }

    pub(super) fn by_id_mut(&mut self, id: u32) -> Option<&mut Worker> {
        self.list.iter_mut().find(|w| w.id == id)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Worker> {
        self.list.iter()
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Worker> {
        self.list.iter_mut()
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// The ack wait of worker `id`, when it acks one by one (ids are
    /// pushed rising and never reused: the list is sorted by id).
    pub(super) fn wait_of(&self, id: u32) -> Option<Duration> {
        let i = self.list.binary_search_by_key(&id, |w| w.id).ok()?;
        self.list[i].explicit
    }

    /// Some worker acks one by one (its events can expire).
    pub(super) fn any_explicit(&self) -> bool {
        self.list.iter().any(|w| w.explicit.is_some())
    }

    /// How many of `fresh` sendable events the acting worker takes now:
    /// its part when they are water-filled over every worker with credit
    /// (each next event to the one with the fewest in flight, within its
    /// window; ties to the acting worker), but for the stalled ones
    /// ([`Worker::stalled`]): they take only when no other worker has
    /// room. At least one when the acting worker is the least loaded of
    /// those and `fresh > 0`.
    pub(super) fn share(&self, fresh: usize) -> usize {
        let Some(me) = self.acting() else {
            return 0;
        };
        let room = me.window.saturating_sub(me.in_flight);
        let with_room = |w: &&Worker| w.in_flight < w.window;
        let mut open: Vec<(usize, usize)> = self
            .list
            .iter()
            .filter(with_room)
            .filter(|w| !w.stalled)
            .map(|w| (w.in_flight, w.window))
            .collect();
        if me.stalled {
            if !open.is_empty() {
                return 0;
            }
            open = self
                .list
                .iter()
                .filter(with_room)
                .map(|w| (w.in_flight, w.window))
                .collect();
        }
        if room == 0 || open.len() <= 1 {
            return room.min(fresh);
        }
        // Events given out once every open worker is filled up to `level`.
        let filled = |level: usize| -> usize {
            open.iter()
                .map(|&(f, w)| level.clamp(f, w) - f)
                .sum::<usize>()
        };
        let (mut lo, mut hi) = (
            open.iter().map(|o| o.0).min().unwrap_or(0),
            open.iter().map(|o| o.1).max().unwrap_or(0),
        );
        if filled(hi) <= fresh {
            return room;
        }
        // The highest level whose fill fits in `fresh` (filled(lo) = 0).
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if filled(mid) <= fresh {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let mut mine = lo.clamp(me.in_flight, me.window) - me.in_flight;
        // What is left goes one each to those at the level: the acting
        // worker first.
        if fresh > filled(lo) && me.in_flight <= lo && lo < me.window {
            mine += 1;
        }
        mine.min(room)
    }
}

impl Subscription {
    /// The consumers other than the one acted for that have room in their
    /// window (to wake when events are left for them): those not stalled,
    /// or when none is, the stalled ones.
    pub fn others_with_credit(&self) -> impl Iterator<Item = ConnId> + '_ {
        let me = self.workers.acting_id();
        let room = move |w: &&Worker| w.id != me && w.in_flight < w.window;
        let live = self.workers.iter().filter(room).any(|w| !w.stalled);
        self.workers
            .iter()
            .filter(room)
            .filter(move |w| !live || !w.stalled)
            .map(|w| w.conn)
    }

    /// The consumer attached, or with shared delivery the first of them.
    pub fn consumer(&self) -> Option<ConnId> {
        self.workers.iter().next().map(|w| w.conn)
    }

    /// Every consumer attached.
    pub fn consumers(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.workers.iter().map(|w| w.conn)
    }

    /// Whether `conn` consumes this subscription.
    pub fn has_consumer(&self, conn: ConnId) -> bool {
        self.workers.iter().any(|w| w.conn == conn)
    }

    /// Whether another consumer may attach beside those attached (shared
    /// delivery, below [`MAX_WORKERS`]).
    pub fn has_room_for_a_worker(&self) -> bool {
        self.shared && self.workers.iter().count() < MAX_WORKERS
    }

    /// `conn`'s worker, through which its pulls, acks, nacks, progress,
    /// terms and expiries are made; `None` when `conn` is not attached.
    pub fn worker_mut(&mut self, conn: ConnId) -> Option<WorkerMut<'_>> {
        let at = self.workers.list.iter().position(|w| w.conn == conn)?;
        Some(WorkerMut { sub: self, at })
    }

    /// Attaches `conn` with its credit `window`; `explicit`: it acks one
    /// by one, and what it leaves unacked for that long is delivered
    /// again. Without shared delivery it replaces whoever was attached
    /// (the hub detached them first); with it, it joins the others.
    pub fn attach(&mut self, conn: ConnId, window: usize, explicit: Option<Duration>) {
        if !self.shared {
            self.workers.list.clear();
            self.unsend_in_flight(|_, _| true);
        } else if self.has_consumer(conn) {
            // The same connection attaching again: as if it came anew.
            self.detach_conn(conn, (Instant::now(), crate::clock::now_ms()));
        }
        self.workers.next_id += 1;
        self.workers.list.push(Worker {
            conn,
            id: self.workers.next_id,
            window: window.max(1),
            explicit,
            in_flight: 0,
            halt_told: false,
            where_told: false,
            stalled: false,
        });
        self.workers.acting = self.workers.list.len() - 1;
        self.detached_at = None;
        self.gaps.retell();
    }

    /// The consumer left (with shared delivery, the one acted for): what
    /// it had in flight is pending again, and stays pinned until it is
    /// acked or the subscription ends.
    pub(super) fn detach(&mut self, now: (Instant, i64)) {
        if let Some(conn) = self.workers.acting().map(|w| w.conn) {
            self.detach_conn(conn, now);
        }
    }

    /// `conn` left; `false` when it was not attached. What it had in
    /// flight goes back to the others (or waits for the next consumer).
    pub fn detach_conn(&mut self, conn: ConnId, now: (Instant, i64)) -> bool {
        let Some(i) = self.workers.list.iter().position(|w| w.conn == conn) else {
            return false;
        };
        let gone = self.workers.list.remove(i);
        self.unsend_in_flight(|_, owner| owner == gone.id);
        self.workers.acting = 0;
        self.gaps.retell();
        if self.workers.is_empty() {
            self.detached_at = Some(now);
        }
        true
    }

    /// Makes entries in flight that `which(since, owner)` says sendable
    /// again; their owners' counts follow.
    pub(super) fn unsend_in_flight(&mut self, mut which: impl FnMut(Instant, u32) -> bool) {
        let mut first = None;
        for i in 0..self.pending.len() {
            let e = &self.pending[i];
            if let Slot::InFlight { since } = e.slot.get() {
                if which(since, e.owner) {
                    self.pending[i].slot.set(Slot::Unsent);
                    self.left_flight(i);
                    first.get_or_insert(i);
                }
            }
        }
        if let Some(i) = first {
            self.reopen(i);
        }
    }

    /// Sendable events worker `me` may take (all but those that expired on
    /// it), counted up to what the workers' windows have room for: what
    /// [`Workers::share`] splits.
    pub(super) fn fresh_sendable(&self, me: u32, now: Instant) -> usize {
        let room: usize = self
            .workers
            .iter()
            .map(|w| w.window.saturating_sub(w.in_flight))
            .sum();
        let mut n = 0;
        for e in self.pending.range(self.scan_from.min(self.pending.len())..) {
            if n >= room {
                break;
            }
            let due = match e.slot.get() {
                Slot::Filtering => break,
                Slot::Unsent => true,
                Slot::Delayed { until } => until <= now,
                _ => false,
            };
            if due && (e.owner == 0 || e.owner != me) {
                n += 1;
            }
        }
        n
    }

    /// Worker `id` let an event's ack wait run out: stalled until it acks.
    pub(super) fn stalled(&mut self, id: u32) {
        if let Some(w) = self.workers.by_id_mut(id) {
            w.stalled = true;
        }
    }

    /// The worker acted for acked or showed progress: not stalled.
    pub(super) fn alive(&mut self) {
        if let Some(w) = self.workers.acting_mut() {
            w.stalled = false;
        }
    }

    /// `pending[i]` is in flight to the worker acted for.
    pub(super) fn in_flight_here(&self, i: usize) -> bool {
        let e = &self.pending[i];
        e.slot.is_in_flight() && e.owner == self.workers.acting_id()
    }

    /// `pending[i]` is no longer in flight (its slot is being changed by
    /// the caller): the counts of the subscription and of its owner.
    pub(super) fn left_flight(&mut self, i: usize) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.in_flight_bytes = self
            .in_flight_bytes
            .saturating_sub(self.pending[i].event.encoded.len());
        let owner = std::mem::take(&mut self.pending[i].owner);
        if let Some(w) = self.workers.by_id_mut(owner) {
            w.in_flight = w.in_flight.saturating_sub(1);
        }
    }

    /// `pending[i]` goes out now to the worker acted for.
    pub(super) fn took_flight(&mut self, i: usize) {
        self.in_flight += 1;
        self.in_flight_bytes += self.pending[i].event.encoded.len();
        let id = self.workers.acting_id();
        self.pending[i].owner = id;
        if let Some(w) = self.workers.acting_mut() {
            w.in_flight += 1;
        }
    }

    /// Nothing is in flight any more (a seek, a shared subscription giving
    /// back what it held).
    pub(super) fn none_in_flight(&mut self) {
        self.in_flight = 0;
        self.in_flight_bytes = 0;
        for w in self.workers.iter_mut() {
            w.in_flight = 0;
        }
    }

    /// The worker acted for has room in its window.
    pub(super) fn has_credit(&self) -> bool {
        self.workers
            .acting()
            .is_some_and(|w| w.in_flight < w.window)
    }

    /// The ack wait of the worker acted for, when it acks one by one.
    pub(super) fn explicit_wait(&self) -> Option<Duration> {
        self.workers.acting().and_then(|w| w.explicit)
    }

    /// The credit windows of every worker together (what a shared
    /// subscription on a cluster host may claim), or the default one.
    pub(super) fn windows(&self) -> usize {
        if self.workers.is_empty() {
            return self.window;
        }
        self.workers.iter().map(|w| w.window).sum()
    }

    /// Shared delivery: the events in flight to all its workers together
    /// stay within `max` encoded bytes (but one event), however many
    /// workers and windows; a worker finds no more until some are acked.
    pub fn bound_in_flight_bytes(&mut self, max: usize) {
        if self.shared {
            self.max_in_flight_bytes = max.max(1);
        }
    }

    /// The encoded bytes of the events in flight.
    pub fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    /// `conn`'s events in flight.
    pub fn in_flight_of(&self, conn: ConnId) -> usize {
        self.workers
            .iter()
            .find(|w| w.conn == conn)
            .map_or(0, |w| w.in_flight)
    }
}

/// One attached worker of a subscription, named by the caller: what it
/// takes and settles. Reads of the whole subscription go through `Deref`.
pub struct WorkerMut<'a> {
    sub: &'a mut Subscription,
    /// The worker's place in the list, which cannot change while this
    /// borrows the subscription (only [`WorkerMut::detach`], which ends it).
    at: usize,
}

impl Deref for WorkerMut<'_> {
    type Target = Subscription;

    fn deref(&self) -> &Subscription {
        self.sub
    }
}

impl WorkerMut<'_> {
    /// The subscription, acting for this worker.
    fn here(&mut self) -> &mut Subscription {
        self.sub.workers.acting = self.at;
        self.sub
    }

    /// Up to `max` events within its window, and a gap first if one is due.
    pub fn pull(&mut self, max: usize, head: u64, now: Instant) -> Pulled {
        self.here().pull(max, head, now)
    }

    /// [`Self::pull`] that also stops at `max_bytes` (see
    /// `Subscription::pull_within`).
    pub fn pull_within(&mut self, max: usize, max_bytes: usize, head: u64, now: Instant) -> Pulled {
        self.here().pull_within(max, max_bytes, head, now)
    }

    /// Cumulative ack of its deliveries up to `seq`'s: the seqs acked.
    pub fn ack(&mut self, seq: u64) -> Vec<u64> {
        self.here().ack(seq)
    }

    /// Acks one of its events in flight; whether it was one.
    pub fn ack_one(&mut self, seq: u64) -> bool {
        self.here().ack_one(seq)
    }

    /// Acks its events in flight with a seq in `first..=last`: how many
    /// (their seqs pushed on `acked` when given).
    pub fn ack_run(&mut self, first: u64, last: u64, acked: Option<&mut Vec<u64>>) -> u64 {
        self.here().ack_run(first, last, acked)
    }

    /// Its event `seq` comes again, not before `until`.
    pub fn nack(&mut self, seq: u64, until: Instant) -> bool {
        self.here().nack(seq, until)
    }

    /// Its event `seq` comes again after `delay` (or the backoff step).
    pub fn nack_after(&mut self, seq: u64, delay: Duration, now: Instant) -> bool {
        self.here().nack_after(seq, delay, now)
    }

    /// It is still working on `seq`: the ack wait starts again.
    pub fn progress(&mut self, seq: u64, now: Instant) -> bool {
        self.here().progress(seq, now)
    }

    /// It gives up on `seq`: parked now.
    pub fn term(&mut self, seq: u64, reason: &str) -> bool {
        self.here().term(seq, reason)
    }

    /// What waited on it past its ack wait goes to the others; whether any
    /// did, and when its next one runs out.
    pub fn expire_held(&mut self, now: Instant) -> (bool, Option<Instant>) {
        self.here().expire_held(now)
    }

    /// Whether it has something to take now (or a gap to report).
    pub fn has_unsent(&mut self) -> bool {
        self.here().has_unsent()
    }

    /// Shared delivery's bound on the bytes in flight (see
    /// `Subscription::bound_in_flight_bytes`).
    pub fn bound_in_flight_bytes(&mut self, max: usize) {
        self.sub.bound_in_flight_bytes(max);
    }

    /// It left: what it had in flight is pending again.
    pub fn detach(mut self, now: (Instant, i64)) {
        self.here().detach(now);
    }
}
