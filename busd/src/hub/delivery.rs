//! The event path through the hub: staging an upstream event ([`Hub::append`]:
//! size check, dedup, seq, per-type counters), fanning a committed batch out
//! to the subscriptions and applying retention ([`Hub::committed`]), and a
//! consumer's side of delivery ([`Hub::pull`], [`Hub::ack`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use proto::v1;

use super::{
    ingest::{Appended, NotStaged},
    ConnHandle, ConnId, Hub, RefusedKind, State,
};
use crate::{
    eventlog::{LoggedEvent, NewEvent},
    store::StoreInfo,
    subscription::Offered,
    upstream::Refusal,
};

/// What a consumer connection should send next.
#[derive(Debug, Default)]
pub struct Delivery {
    pub subscription_id: String,
    pub gap: Option<v1::Gap>,
    /// Events with their redelivered mark and delivery count.
    pub events: Vec<(Arc<LoggedEvent>, bool, u32)>,
    /// Delivery stopped at an event the store found damaged: why.
    pub damaged: Option<String>,
    /// The subscription halted at a poison event: the consumer's last words.
    pub halted: Option<String>,
    /// Its `--where` gave no answer for an event within a limit (the first
    /// since this consumer attached).
    pub where_notice: Option<v1::WhereNotice>,
}

impl Hub {
    /// Accepts an event unless its id is in the dedup window: gives it the
    /// next seq and stages it for the committer. Never waits for anyone. The
    /// event is durable (and delivered) once [`Hub::wait_durable`] for its
    /// seq returns; a duplicate's seq is the original's, which may itself be
    /// still staged, so callers wait on duplicates too.
    ///
    /// An event whose deliveries would not fit in a frame is refused here,
    /// at the door, so nothing is ever acked that cannot be delivered.
    pub(super) fn append(&self, ev: NewEvent) -> Result<Appended, Refusal> {
        let mut st = self.state();
        let appended = match st.ingest.stage(ev, self.shared.started_at_ms) {
            Ok(a) => a,
            Err(not) => {
                if matches!(not, NotStaged::TooLarge(_)) {
                    st.refused.count(RefusedKind::TooLargeEvent);
                }
                return Err(not.into_refusal());
            }
        };
        if appended.duplicate {
            return Ok(appended);
        }
        if self.shared.config.inline_commit {
            let batch = st.ingest.take_staged(usize::MAX);
            let (wake, head) = fan_out_locked(&mut st, batch, &self.shared.filter_wake);
            drop(st);
            self.after_fan_out(wake, head);
        } else {
            let first = st.ingest.staged_len() == 1;
            drop(st);
            if first {
                self.shared.commit_wake.notify_one();
            }
        }
        Ok(appended)
    }

    /// A batch is durable: append it to the log, fan it out, apply
    /// retention, and tell the waiters.
    pub(super) fn committed(&self, batch: Vec<Arc<LoggedEvent>>, info: StoreInfo) {
        let mut st = self.state();
        st.persist.set_info(info);
        let (wake, head) = fan_out_locked(&mut st, batch, &self.shared.filter_wake);
        drop(st);
        self.after_fan_out(wake, head);
    }

    /// Events another cluster host appended to the shared log (the tail of a
    /// host that does not own it): they are durable already. Appended to the
    /// log and fanned out like a committed batch; the seq counter and the
    /// dedup window follow them, so this host can take over the log later.
    /// Events at or below the head (seen already) are skipped. A batch that
    /// does not start right after the head found a hole (the owner's
    /// retention deleted those seqs before this host read them): every
    /// subscription counts them lost and reports a gap, never a silent skip.
    pub(super) fn replicated(&self, batch: Vec<Arc<LoggedEvent>>) {
        let mut st = self.state();
        let head = st.log.head_seq();
        let batch: Vec<_> = batch.into_iter().filter(|e| e.seq > head).collect();
        let Some(first) = batch.first().map(|e| e.seq) else {
            return;
        };
        // The consumers of subscriptions told about a hole.
        let mut told = vec![];
        if first > head + 1 {
            tracing::warn!(
                from_seq = head + 1,
                to_seq = first - 1,
                "the cluster log no longer holds these seqs (the owner's retention deleted them \
                 before this host read them); its subscriptions report them as a gap"
            );
            let (subs, conns) = st.registry.split_mut();
            for sub in subs {
                if sub.missed(head + 1, first - 1) > 0 {
                    told.extend(conns.all_of(sub));
                }
            }
        }
        st.ingest.replicated(&batch);
        let was_dirty = st.persist.is_dirty();
        let (mut wake, head) = fan_out_locked(&mut st, batch, &self.shared.filter_wake);
        wake.append(&mut told);
        if st.persist.is_dirty() && !was_dirty {
            self.wake_committer();
        }
        drop(st);
        self.after_fan_out(wake, head);
    }

    /// Subscriptions became dirty while the committer may sleep without a
    /// deadline (nothing else to do): it saves them within the save
    /// interval. Costs one wake-up per save interval at most.
    fn wake_committer(&self) {
        self.shared.commit_wake.notify_one();
    }

    /// The count of the log's rendered line parts (they count against
    /// retention's bytes), for those who render them (`crate::lines`).
    pub(super) fn line_bytes(&self) -> crate::eventlog::LineBytes {
        self.state().log.line_bytes()
    }

    /// The oldest seq still in this host's log.
    pub(super) fn oldest_seq(&self) -> Option<u64> {
        self.state().log.oldest_seq()
    }

    /// The newest seq in this host's log.
    pub(super) fn head_seq(&self) -> u64 {
        self.state().log.head_seq()
    }

    /// Takes what `conn` may send now: a pending Gap and up to its credit of
    /// events, at most `max_events` and, past the first, `max_bytes`
    /// encoded. Marks them in flight.
    pub(super) fn pull(
        &self,
        conn: ConnId,
        max_events: usize,
        max_bytes: usize,
    ) -> (Option<Delivery>, Option<Instant>) {
        let mut st = self.state();
        let head = st.log.head_seq();
        let State {
            registry, persist, ..
        } = &mut *st;
        let Some((c, sub)) = registry.attached_mut(conn) else {
            return (None, None);
        };
        let Some(mut sub) = sub.worker_mut(conn) else {
            return (None, None);
        };
        sub.bound_in_flight_bytes(self.shared.config.retention.max_bytes);
        let pulled = sub.pull_within(max_events, max_bytes, head, Instant::now());
        // Events left for the other workers of a shared subscription (past
        // this one's share, or expired on it): those with room pull now.
        let others: Vec<ConnId> = if pulled.left_for_others {
            sub.others_with_credit().collect()
        } else {
            Vec::new()
        };
        let again = pulled.events.iter().filter(|(_, r, _)| *r).count() as u64;
        c.count_delivered(pulled.events.len() as u64, again);
        let mut newly_dirty = false;
        let damaged = pulled.damaged_at.map(|seq| {
            let at = persist
                .info()
                .damaged
                .iter()
                .find(|d| (d.from_seq..=d.to_seq).contains(&seq))
                .map(|d| format!(" ({} at offset {})", d.file, d.offset))
                .unwrap_or_default();
            format!(
                "the bus's store is damaged: event seq {seq} of subscription {} failed its \
                 checksum{at}; it is never delivered, and this subscription cannot read past it \
                 (see `dws event status`)",
                sub.id
            )
        });
        let halted = pulled.halted.map(|h| {
            tracing::warn!(subscription = %sub.id, seq = h.seq, deliveries = h.deliveries, "subscription halted at a poison event");
            newly_dirty |= persist.mark_dirty();
            halted_line(&sub.id, h.seq, h.deliveries)
        });
        if (!pulled.events.is_empty() || pulled.expired) && !sub.owned {
            // Delivery counts and due times are stored.
            newly_dirty |= persist.mark_dirty();
        }
        let next_due = pulled.next_due;
        if newly_dirty {
            self.wake_committer();
        }
        let where_notice = pulled.where_failed.map(|(seq, why)| v1::WhereNotice {
            subscription_id: sub.id.clone(),
            seq,
            reason: why.to_string(),
        });
        if pulled.gap.is_none()
            && pulled.events.is_empty()
            && damaged.is_none()
            && halted.is_none()
            && where_notice.is_none()
        {
            let wake: Vec<_> = others
                .into_iter()
                .filter_map(|c| registry.handle(Some(c)))
                .collect();
            drop(st);
            super::wake_all(wake);
            return (None, next_due);
        }
        // A shared subscription that halted: its other consumers are told
        // at their next pull, which this wakes.
        let others_told = halted.is_some() && sub.shared;
        let d = Delivery {
            subscription_id: sub.id.clone(),
            gap: pulled.gap,
            events: pulled.events,
            damaged,
            halted,
            where_notice,
        };
        let mut wake: Vec<_> = others
            .into_iter()
            .filter_map(|c| registry.handle(Some(c)))
            .collect();
        if others_told {
            if let Some(s) = registry.get(&d.subscription_id) {
                wake.extend(registry.handles_of(s));
            }
        }
        drop(st);
        super::wake_all(wake);
        (Some(d), next_due)
    }

    /// `conn` takes nothing now (its outbound buffer is full): what waited
    /// past its ack wait still expires, and goes to the other consumers.
    /// Returns when `conn`'s next in-flight event's wait runs out.
    pub(super) fn expire_held(&self, conn: ConnId) -> Option<Instant> {
        let mut st = self.state();
        let State {
            registry, persist, ..
        } = &mut *st;
        let (_, sub) = registry.attached_mut(conn)?;
        let mut sub = sub.worker_mut(conn)?;
        let (expired, next) = sub.expire_held(Instant::now());
        if !expired {
            return next;
        }
        let named = !sub.owned;
        // Its consumers, collected before the registry is borrowed again.
        let conns: Vec<_> = sub.consumers().collect();
        let wake: Vec<_> = conns
            .into_iter()
            .filter_map(|c| registry.handle(Some(c)))
            .collect();
        if named && persist.mark_dirty() {
            self.wake_committer();
        }
        drop(st);
        super::wake_all(wake);
        next
    }

    /// An ack from `conn`: cumulative (`seq`), event by event (`seqs`, or a
    /// run of consecutive seqs at a time: `runs`),
    /// nacks (deliver again after a delay or the backoff step), progress
    /// (still working: the ack wait starts again) and terms (parked now).
    pub(super) fn ack(&self, conn: ConnId, ack: &v1::Ack) {
        let mut st = self.state();
        let State {
            registry,
            shared_work,
            ..
        } = &mut *st;
        let Some((c, sub)) = registry.attached_mut(conn) else {
            return;
        };
        let Some(mut sub) = sub.worker_mut(conn) else {
            return;
        };
        // A cumulative ack settles what was delivered up to that seq's
        // delivery (delivery order); `seqs` name events one by one.
        let mut shared_acked = if ack.seq > 0 {
            sub.ack(ack.seq)
        } else {
            Vec::new()
        };
        let mut n = shared_acked.len() as u64;
        // The claims of a cluster host learn what was acked here.
        if !sub.claimed {
            shared_acked.clear();
        }
        for &seq in &ack.seqs {
            let acked = sub.ack_one(seq);
            n += u64::from(acked);
            if acked && sub.claimed {
                shared_acked.push(seq);
            }
        }
        let claimed = sub.claimed;
        for run in &ack.runs {
            let out = claimed.then_some(&mut shared_acked);
            n += sub.ack_run(run.first, run.last, out);
        }
        let now = Instant::now();
        let mut freed = false;
        for nack in &ack.nacks {
            freed |= sub.nack_after(nack.seq, Duration::from_millis(nack.delay_ms), now);
        }
        for &seq in &ack.progress {
            // The connection wakes at the old deadline, finds nothing due
            // and sleeps until the new one.
            sub.progress(seq, now);
        }
        for term in &ack.terms {
            let parked = sub.term(term.seq, &term.reason);
            if parked {
                tracing::info!(subscription = %sub.id, seq = term.seq, "event parked by its consumer (term)");
                if sub.claimed {
                    // Done for the cluster: no other host delivers it again.
                    shared_acked.push(term.seq);
                }
            }
            freed |= parked;
        }
        if !shared_acked.is_empty() {
            shared_work.acked(&sub.id, shared_acked);
        }
        c.count_acked(n);
        let more = sub.has_unsent() || freed;
        let named = !sub.owned;
        let handle = c.handle().clone();
        // An event given back (a nack, a term) may go to any consumer of a
        // shared subscription.
        let others = if freed && sub.shared {
            let sub_id = sub.id.clone();
            st.registry
                .get(&sub_id)
                .map(|s| st.registry.handles_of(s))
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if named && (n > 0 || freed) && st.persist.mark_dirty() {
            self.wake_committer();
        }
        drop(st);
        if more {
            handle.wake.notify_one();
        }
        for h in others {
            h.wake.notify_one();
        }
    }
}

/// The consumer's line when its subscription halts (also in the Bye).
pub fn halted_line(id: &str, seq: u64, deliveries: u32) -> String {
    format!(
        "[event] subscription {id} halted at seq {seq}: delivered {deliveries} times without ack"
    )
}

/// Appends a durable batch to the log, offers it to every subscription and
/// applies retention. Returns the connections to wake and the new head.
fn fan_out_locked(
    st: &mut State,
    batch: Vec<Arc<LoggedEvent>>,
    filter_wake: &std::sync::Condvar,
) -> (Vec<Arc<ConnHandle>>, u64) {
    let mut wake = vec![];
    let State {
        registry,
        log,
        shared_work,
        filter_queue,
        ..
    } = st;
    // Subscription by subscription: each takes its matches of the batch in
    // seq order, and its consumer is woken once per batch (or, for events
    // a `--where` judges, the filter thread).
    let (subs, conns) = registry.split_mut();
    for sub in subs {
        let mut took = false;
        let mut to_filter = false;
        for e in &batch {
            match sub.offer(e) {
                Offered::No => {}
                Offered::Taken => took = true,
                Offered::ToFilter => to_filter = true,
            }
        }
        if took {
            wake.extend(conns.all_of(sub));
        }
        if to_filter {
            filter_queue.want(&sub.id);
            filter_wake.notify_one();
        }
    }
    for e in batch {
        log.append(e);
    }
    // Retention: evict from the front; a subscription loses an evicted
    // event only if it had not been sent yet, and is told with a Gap.
    let mut evicted = false;
    while let Some(old) = log.evict_one() {
        evicted = true;
        for sub in registry.split_mut().0 {
            sub.evicted(old.seq);
            if sub.may_lose_shared(&old) {
                shared_work.evicted(&sub.id, old.seq);
            }
        }
        // Still held (in flight): its segment may go, its bytes may not.
        if Arc::strong_count(&old) > 1 {
            old.keep_resident();
        }
    }
    let head = log.head_seq();
    // Cursors of named subscriptions and the log floor moved.
    if evicted || st.registry.subs().values().any(|s| !s.owned) {
        st.persist.mark_dirty();
    }
    (wake, head)
}
