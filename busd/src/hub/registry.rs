//! The hub's registry: the subscriptions this host holds, the connections
//! and the subscription each one consumes, the activity generation the
//! idle and TTL timers watch, and the TTL removals ([`Expired`]) status
//! lists. Bookkeeping only, under the hub's lock: attaching, detaching,
//! removing and expiring decide here and say what changed ([`Detached`],
//! the removed subscription and the consumer to tell); the `Hub` method
//! that called wakes, saves and releases.

use std::{
    collections::{btree_map, BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Instant,
};

use proto::{
    status::{ConsumerDoc, ExpiredDoc, ExpiredSubDoc},
    v1::ByeReason,
};
use tokio::sync::Notify;

use super::lock;
use crate::{
    clock::now_ms,
    subscription::{ConnId, Subscription},
};

/// The per-connection end of the hub: how the hub wakes a connection task and
/// tells it to leave.
#[derive(Debug, Default)]
pub struct ConnHandle {
    pub wake: Notify,
    kick: Mutex<Option<ByeReason>>,
}

impl ConnHandle {
    /// Asks the connection to send `Bye{reason}` and close.
    pub(super) fn kick(&self, reason: ByeReason) {
        *lock(&self.kick) = Some(reason);
        self.wake.notify_one();
    }

    pub fn take_kick(&self) -> Option<ByeReason> {
        lock(&self.kick).take()
    }
}

/// How many TTL removals status lists (the total counts them all).
pub const RECENT_EXPIRED: usize = 16;

/// Subscriptions removed by their TTL since the bus started: a count and
/// the most recent ones, for status.
#[derive(Debug, Default)]
pub struct Expired {
    total: u64,
    recent: VecDeque<ExpiredSubDoc>,
}

impl Expired {
    fn record(&mut self, sub: &Subscription, at_unix_ms: i64) {
        self.total += 1;
        if self.recent.len() == RECENT_EXPIRED {
            self.recent.pop_front();
        }
        self.recent.push_back(ExpiredSubDoc {
            id: sub.id.clone(),
            owned: sub.owned,
            ttl_ms: proto::limits::ttl_to_ms(sub.ttl),
            expired_at_unix_ms: at_unix_ms,
            pending: sub.pending_len() as u64,
        });
    }

    /// The status document's part.
    pub fn doc(&self) -> ExpiredDoc {
        ExpiredDoc {
            total: self.total,
            recent: self.recent.iter().cloned().collect(),
        }
    }
}

/// One connection as the hub knows it.
#[derive(Debug)]
pub(super) struct Conn {
    id: ConnId,
    pid: u32,
    name: String,
    handle: Arc<ConnHandle>,
    attached: Option<String>,
    connected_at_ms: i64,
    delivered: u64,
    redelivered: u64,
    acked: u64,
    /// It did something that keeps the bus up (see [`Registry::busy`]).
    active: bool,
}

impl Conn {
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    pub(super) fn handle(&self) -> &Arc<ConnHandle> {
        &self.handle
    }

    /// The subscription this connection consumes.
    pub(super) fn attached(&self) -> Option<&str> {
        self.attached.as_deref()
    }

    /// `n` deliveries, `again` of them redeliveries.
    pub(super) fn count_delivered(&mut self, n: u64, again: u64) {
        self.delivered += n;
        self.redelivered += again;
    }

    pub(super) fn count_acked(&mut self, n: u64) {
        self.acked += n;
    }

    /// The status row of a consumer (`None` when it consumes nothing);
    /// `in_flight(subscription, connection)`: what it has in flight.
    pub(super) fn consumer_doc(
        &self,
        in_flight: impl Fn(&str, ConnId) -> usize,
    ) -> Option<ConsumerDoc> {
        let sub = self.attached.as_ref()?;
        Some(ConsumerDoc {
            pid: self.pid,
            client: self.name.clone(),
            subscription_id: sub.clone(),
            connected_at_unix_ms: self.connected_at_ms,
            delivered: self.delivered,
            redelivered: self.redelivered,
            acked: self.acked,
            in_flight: in_flight(sub, self.id) as u64,
        })
    }
}

/// What detaching a consumer changed (see [`Registry::detach`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Detached {
    /// A named subscription's state changed: it must be saved.
    pub(super) named: bool,
    /// A shared subscription's events given back (the claims must learn).
    pub(super) given_back: Option<(String, Vec<u64>)>,
    /// A shared subscription whose other consumers must pull: what the one
    /// that left had in flight is theirs now.
    pub(super) others_take: Option<String>,
}

/// The wake-up handles of the connections, beside the subscriptions being
/// changed (see [`Registry::split_mut`]).
pub(super) struct Handles<'a>(&'a HashMap<ConnId, Conn>);

impl Handles<'_> {
    /// The handle of `conn` (a subscription's consumer), if it is connected.
    pub(super) fn of(&self, conn: Option<ConnId>) -> Option<Arc<ConnHandle>> {
        conn.and_then(|c| self.0.get(&c)).map(|c| c.handle.clone())
    }

    /// The handles of every consumer of `sub` (several with shared delivery).
    pub(super) fn all_of<'a>(
        &'a self,
        sub: &'a Subscription,
    ) -> impl Iterator<Item = Arc<ConnHandle>> + 'a {
        sub.consumers()
            .filter_map(|c| self.0.get(&c).map(|c| c.handle.clone()))
    }
}

/// Subscriptions, connections and who consumes what.
pub(super) struct Registry {
    subs: BTreeMap<String, Subscription>,
    conns: HashMap<ConnId, Conn>,
    next_conn: ConnId,
    next_generated: u64,
    /// Bumped on every change that matters to the idle and TTL timers.
    activity_gen: u64,
    /// Subscriptions removed by their TTL, for status.
    expired: Expired,
}

impl Registry {
    pub(super) fn new(subs: BTreeMap<String, Subscription>) -> Registry {
        Registry {
            subs,
            conns: HashMap::new(),
            next_conn: 1,
            next_generated: 1,
            activity_gen: 0,
            expired: Expired::default(),
        }
    }

    // ---------------------------------------------------------------- activity

    /// Something the idle and TTL timers care about changed.
    pub(super) fn touch(&mut self) {
        self.activity_gen += 1;
    }

    pub(super) fn activity(&self) -> u64 {
        self.activity_gen
    }

    /// The bus is not idle: a connection did something that counts (a
    /// consumer, a publisher, a change — not a client that only reads
    /// status), or, when `subs_hold`, a subscription exists.
    pub(super) fn busy(&self, subs_hold: bool) -> bool {
        self.conns.values().any(|c| c.active) || (subs_hold && !self.subs.is_empty())
    }

    /// `conn` did something that keeps the bus up; `true` the first time.
    pub(super) fn mark_active(&mut self, conn: ConnId) -> bool {
        match self.conns.get_mut(&conn) {
            Some(c) if !c.active => {
                c.active = true;
                true
            }
            _ => false,
        }
    }

    /// Whether `conn` ever counted as activity.
    pub(super) fn was_active(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.active)
    }

    // ------------------------------------------------------------- connections

    pub(super) fn register(&mut self) -> (ConnId, Arc<ConnHandle>) {
        let id = self.next_conn;
        self.next_conn += 1;
        let handle = Arc::new(ConnHandle::default());
        self.conns.insert(
            id,
            Conn {
                id,
                pid: 0,
                name: String::new(),
                handle: handle.clone(),
                attached: None,
                connected_at_ms: now_ms(),
                delivered: 0,
                redelivered: 0,
                acked: 0,
                active: false,
            },
        );
        (id, handle)
    }

    pub(super) fn identify(&mut self, conn: ConnId, pid: u32, name: &str) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.pid = pid;
            c.name = name.chars().take(64).collect();
        }
    }

    /// Detaches `conn` and forgets it.
    pub(super) fn unregister(&mut self, conn: ConnId) -> Detached {
        let detached = self.detach(conn);
        self.conns.remove(&conn);
        detached
    }

    /// Detaches `conn` from its subscription: what it had in flight is
    /// pending again; a shared subscription gives back what it held.
    pub(super) fn detach(&mut self, conn: ConnId) -> Detached {
        let mut out = Detached::default();
        let Some(id) = self.conns.get_mut(&conn).and_then(|c| c.attached.take()) else {
            return out;
        };
        if let Some(sub) = self.subs.get_mut(&id) {
            let held = sub.in_flight_of(conn);
            if sub.detach_conn(conn, (Instant::now(), now_ms())) {
                if held > 0 && sub.consumer().is_some() {
                    out.others_take = Some(id.clone());
                }
                // A cluster host with no consumer left gives its claims back.
                if sub.claimed && sub.consumer().is_none() {
                    out.given_back = Some((id, sub.release_all()));
                }
                out.named = !sub.owned;
            }
        }
        out
    }

    /// Records that `conn` now consumes subscription `id` (the subscription
    /// itself was attached by the caller).
    pub(super) fn set_attached(&mut self, conn: ConnId, id: &str) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.attached = Some(id.to_owned());
        }
    }

    pub(super) fn conn(&self, conn: ConnId) -> Option<&Conn> {
        self.conns.get(&conn)
    }

    pub(super) fn conns(&self) -> impl Iterator<Item = &Conn> {
        self.conns.values()
    }

    pub(super) fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// The handle of `conn` (a subscription's consumer), if connected.
    pub(super) fn handle(&self, conn: Option<ConnId>) -> Option<Arc<ConnHandle>> {
        Handles(&self.conns).of(conn)
    }

    /// The handles of every connection consuming a subscription.
    pub(super) fn consumer_handles(&self) -> Vec<Arc<ConnHandle>> {
        self.conns
            .values()
            .filter(|c| c.attached.is_some())
            .map(|c| c.handle.clone())
            .collect()
    }

    /// Pids of every consumer attached.
    pub(super) fn consumer_pids(&self) -> Vec<u32> {
        self.conns
            .values()
            .filter(|c| c.attached.is_some())
            .map(|c| c.pid)
            .collect()
    }

    /// `conn` and the subscription it consumes.
    pub(super) fn attached_mut(&mut self, conn: ConnId) -> Option<(&mut Conn, &mut Subscription)> {
        let c = self.conns.get_mut(&conn)?;
        let sub = self.subs.get_mut(c.attached.as_ref()?)?;
        Some((c, sub))
    }

    // ----------------------------------------------------------- subscriptions

    pub(super) fn subs(&self) -> &BTreeMap<String, Subscription> {
        &self.subs
    }

    pub(super) fn get(&self, id: &str) -> Option<&Subscription> {
        self.subs.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &str) -> Option<&mut Subscription> {
        self.subs.get_mut(id)
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.subs.contains_key(id)
    }

    pub(super) fn len(&self) -> usize {
        self.subs.len()
    }

    /// Every subscription, to change, with the connections' handles beside.
    pub(super) fn split_mut(
        &mut self,
    ) -> (btree_map::ValuesMut<'_, String, Subscription>, Handles<'_>) {
        (self.subs.values_mut(), Handles(&self.conns))
    }

    /// Adds (or replaces) a subscription under its id.
    pub(super) fn insert(&mut self, sub: Subscription) {
        self.subs.insert(sub.id.clone(), sub);
    }

    /// An id for a subscription the client did not name, unused here.
    pub(super) fn generate_id(&mut self, pid: u32) -> String {
        loop {
            let id = format!("sub-{pid}-{}", self.next_generated);
            self.next_generated += 1;
            if !self.subs.contains_key(&id) {
                return id;
            }
        }
    }

    /// Removes subscription `id`; its consumers consume nothing any more.
    /// Returns it with the handles of those consumers that are not
    /// `requester` (they are told to leave).
    pub(super) fn remove(
        &mut self,
        id: &str,
        requester: ConnId,
    ) -> Option<(Subscription, Vec<Arc<ConnHandle>>)> {
        let sub = self.subs.remove(id)?;
        let mut kicks = Vec::new();
        for c in sub.consumers() {
            if let Some(conn) = self.conns.get_mut(&c) {
                conn.attached = None;
                if c != requester {
                    kicks.push(conn.handle.clone());
                }
            }
        }
        Some((sub, kicks))
    }

    /// The handles of every consumer of `sub`.
    pub(super) fn handles_of(&self, sub: &Subscription) -> Vec<Arc<ConnHandle>> {
        Handles(&self.conns).all_of(sub).collect()
    }

    /// Removes the subscriptions whose TTL ran out by `now`, recording each
    /// for status; returns them (oldest id first).
    pub(super) fn expire(&mut self, now: Instant, now_ms: i64) -> Vec<Subscription> {
        let ids: Vec<String> = self
            .subs
            .values()
            .filter(|s| s.expires_at().is_some_and(|t| t <= now))
            .map(|s| s.id.clone())
            .collect();
        let removed: Vec<_> = ids.iter().filter_map(|id| self.subs.remove(id)).collect();
        for sub in &removed {
            self.expired.record(sub, now_ms);
        }
        if !removed.is_empty() {
            self.touch();
        }
        removed
    }

    /// When the next detached subscription's TTL runs out.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.subs
            .values()
            .filter_map(Subscription::expires_at)
            .min()
    }

    pub(super) fn expired_doc(&self) -> ExpiredDoc {
        self.expired.doc()
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
