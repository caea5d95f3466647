//! Subscribing: creating and attaching subscriptions (the takeover, window
//! and ack-mode rules), binding a new one to an upstream subscription and
//! releasing that binding, removing subscriptions, and stopping their
//! consumers.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use proto::{
    limits::MAX_SUBSCRIPTIONS,
    v1::{self, ByeReason, ErrorCode},
};

use super::{ConnId, Hub};
use crate::{
    clock::now_ms,
    pattern::Selector,
    subscription::{self, Subscription},
    upstream::{Refusal, UpstreamControl, UpstreamId},
};

/// Shared delivery claims events by scanning the log on every round; with
/// `--where` each round would evaluate every retained event again.
const WHERE_NOT_SHARED: &str =
    "--where cannot be combined with --delivery shared on a cluster (yet); on one host it can";

/// The credit window of a shared subscription's consumer that names none
/// (`consume --max-in-flight`): small, so that a slow worker holds few
/// events and the others take the rest.
pub const SHARED_WINDOW: u32 = 16;

impl Hub {
    /// The upstream control plane, when a Subscribe for `req` must first
    /// bind an upstream subscription: the source has one and `req` would
    /// create a new local subscription.
    pub(super) fn upstream_for(&self, req: &v1::Subscribe) -> Option<Arc<dyn UpstreamControl>> {
        let upstream = self.shared.upstream.clone()?;
        let exists =
            !req.subscription_id.is_empty() && self.state().registry.contains(&req.subscription_id);
        (!exists && !req.must_exist).then_some(upstream)
    }

    pub(super) fn has_upstream_control(&self) -> bool {
        self.shared.upstream.is_some()
    }

    /// Named subscriptions another cluster host created: each one unknown
    /// here gets this host's own instance, starting where it was created
    /// (per-host delivery: every host's consumers get every event).
    /// Returns how many were new.
    pub(super) fn adopt(&self, records: Vec<crate::store::SubRecord>) -> usize {
        let mut st = self.state();
        let events: Vec<_> = st.log.events().cloned().collect();
        let head = st.log.head_seq();
        let floor = st.log.oldest_seq().unwrap_or(head + 1);
        let now = (Instant::now(), now_ms());
        let window = self.shared.config.default_window as usize;
        let mut added = 0;
        for rec in records {
            if st.registry.contains(&rec.id) || st.registry.len() >= MAX_SUBSCRIPTIONS {
                continue;
            }
            let Ok(sel) = Selector::stored(&rec.patterns, &rec.filter)
                .and_then(|s| s.with_where(&rec.where_exprs))
            else {
                continue;
            };
            let mut sub =
                Subscription::restore(&rec, sel, &events, (floor, head, true), now, window);
            sub.set_claimed(self.shared.config.clustered);
            tracing::info!(subscription = %rec.id, cursor = rec.cursor, "subscription created on another cluster host");
            st.registry.insert(sub);
            added += 1;
        }
        if added > 0 {
            self.mark_subs_dirty(&mut st);
            st.registry.touch();
        }
        added
    }

    /// Whether this host holds the subscription `id`.
    pub(super) fn has_subscription(&self, id: &str) -> bool {
        self.state().registry.contains(id)
    }

    /// Creates or attaches a subscription. `upstream_id` binds a newly
    /// created one to an upstream subscription (see [`Hub::upstream_for`]);
    /// if the subscription is not created after all, the binding is released.
    /// With the reply comes the subscription generation that must be saved
    /// before it is sent (a named subscription was created).
    pub(super) fn subscribe(
        &self,
        conn: ConnId,
        req: &v1::Subscribe,
        upstream_id: Option<UpstreamId>,
    ) -> Result<(v1::Subscribed, Option<u64>), Refusal> {
        let result = self.subscribe_locked(conn, req, upstream_id.clone());
        if let (Some(up), Some(ctl)) = (&upstream_id, &self.shared.upstream) {
            if !result.as_ref().is_ok_and(|(r, _)| r.created) {
                ctl.release(up);
            }
        }
        result
    }

    fn subscribe_locked(
        &self,
        conn: ConnId,
        req: &v1::Subscribe,
        upstream_id: Option<UpstreamId>,
    ) -> Result<(v1::Subscribed, Option<u64>), Refusal> {
        let cfg = &self.shared.config;
        if !req.subscription_id.is_empty() && !proto::is_valid_id(&req.subscription_id) {
            return Err(Refusal::new(
                ErrorCode::BadRequest,
                format!(
                    "invalid subscription id {:?}: use 1-64 characters from A-Z a-z 0-9 . _ -",
                    req.subscription_id
                ),
            ));
        }
        let patterns_given = !req.patterns.is_empty();
        let selector = if patterns_given || !req.must_exist {
            Some(
                Selector::new(&req.patterns, &req.filter)
                    .and_then(|s| s.with_where(&req.where_exprs))
                    .map_err(|m| Refusal::new(ErrorCode::BadRequest, m.to_string()))?,
            )
        } else {
            None
        };
        let mut kicked = None;
        let mut save_gen = None;
        let mut st = self.state();
        let head = st.log.head_seq();
        let existing = st.registry.get(&req.subscription_id);
        let created = existing.is_none();
        if let Some(sub) = existing {
            if let Some(sel) = &selector {
                if !sub.selector.same_spec(sel) {
                    return Err(Refusal::new(
                        ErrorCode::BadRequest,
                        format!(
                            "subscription {} exists with event keys {} and filter {:?}{}; \
                             this request asks for {} and {:?}{}",
                            sub.id,
                            sub.selector.pattern_strings().join(","),
                            sub.selector.filter_str(),
                            sub.selector.where_note(sel),
                            sel.pattern_strings().join(","),
                            sel.filter_str(),
                            sel.where_note(&sub.selector),
                        ),
                    ));
                }
            }
        } else if req.must_exist {
            return Err(Refusal::new(
                ErrorCode::NotFound,
                format!("subscription {} not found", req.subscription_id),
            ));
        }
        let id = if req.subscription_id.is_empty() {
            st.registry.generate_id(std::process::id())
        } else {
            req.subscription_id.clone()
        };
        if created && st.registry.len() >= MAX_SUBSCRIPTIONS {
            return Err(Refusal::new(
                ErrorCode::ResourceExhausted,
                format!("too many subscriptions ({MAX_SUBSCRIPTIONS}); unsubscribe some first"),
            ));
        }
        if created {
            let Some(selector) = selector else {
                return Err(Refusal::new(
                    ErrorCode::BadRequest,
                    "at least one event key is required",
                ));
            };
            let start_from = match v1::StartPosition::try_from(req.start).unwrap_or_default() {
                v1::StartPosition::StartLatest => head + 1,
                v1::StartPosition::StartEarliest => 0,
                v1::StartPosition::StartSeq => req.start_seq,
                v1::StartPosition::StartTime => {
                    super::control::first_at_or_after(&st.log, req.start_unix_ms)
                }
            };
            let ttl = super::requested_ttl(req, cfg.default_ttl);
            let mut sub = Subscription::new(
                id.clone(),
                selector,
                req.owned,
                ttl,
                upstream_id,
                start_from.saturating_sub(1),
                (Instant::now(), now_ms()),
                cfg.default_window as usize,
            );
            sub.max_deliver = req.max_deliver;
            sub.on_poison = v1::PoisonPolicy::try_from(req.on_poison).unwrap_or_default();
            if let Err(why) = proto::limits::check_backoff(&req.backoff_ms) {
                return Err(Refusal::new(ErrorCode::BadRequest, why));
            }
            sub.backoff = req
                .backoff_ms
                .iter()
                .map(|&ms| Duration::from_millis(ms))
                .collect();
            sub.ack_wait = (req.default_ack_wait_ms > 0)
                .then(|| Duration::from_millis(req.default_ack_wait_ms));
            if req.shared {
                if req.owned {
                    return Err(Refusal::new(
                        ErrorCode::BadRequest,
                        "shared delivery is for named subscriptions (dws event subscribe --id)",
                    ));
                }
                if cfg.clustered && !req.where_exprs.is_empty() {
                    return Err(Refusal::new(ErrorCode::BadRequest, WHERE_NOT_SHARED));
                }
                sub.shared = true;
                sub.set_claimed(cfg.clustered);
            }
            for e in st.log.since(start_from) {
                sub.offer(e);
            }
            let filter = sub.has_filter_jobs();
            let sub_id = sub.id.clone();
            st.registry.insert(sub);
            if filter {
                self.want_filter(&mut st, &sub_id);
            }
            if !req.owned {
                save_gen = Some(st.persist.must_save());
            }
        }
        if req.attach {
            let Some(sub) = st.registry.get(&id) else {
                return Err(Refusal::new(ErrorCode::Internal, "subscription vanished"));
            };
            if sub.state == subscription::State::Disabled {
                return Err(Refusal::new(
                    ErrorCode::FailedPrecondition,
                    format!(
                        "subscription {id} is disabled: it collects events but delivers none \
                         (dws event subscription enable {id})"
                    ),
                ));
            }
            // Shared delivery: every consumer joins the others (up to a
            // bound; `--takeover` means nothing there); otherwise one at a
            // time.
            let joins = sub.shared;
            if joins && !sub.has_room_for_a_worker() && !sub.has_consumer(conn) {
                return Err(Refusal::new(
                    ErrorCode::ResourceExhausted,
                    format!(
                        "subscription {id} already has {} consumers, the most one shared \
                         subscription takes",
                        subscription::MAX_WORKERS
                    ),
                ));
            }
            let holder = sub.consumer().filter(|c| *c != conn && !joins);
            let shared = sub.shared;
            if let Some(holder) = holder {
                if !req.takeover {
                    let pid = st.registry.conn(holder).map_or(0, |c| c.pid());
                    return Err(Refusal::new(
                        ErrorCode::AlreadyAttached,
                        format!(
                            "subscription {id} is already attached to a consumer (pid {pid}); \
                             use --takeover to replace it"
                        ),
                    ));
                }
                let _ = st.detach(holder);
                kicked = st.registry.handle(Some(holder));
            }
            // A connection consumes one subscription at a time.
            if st.registry.conn(conn).and_then(|c| c.attached()) != Some(id.as_str()) {
                let _ = st.detach(conn);
            }
            // A shared subscription's consumers take a small window unless
            // they name one: a slow one then holds few events, and the
            // others take the rest.
            let window = match (req.window, shared) {
                (0, true) => SHARED_WINDOW.min(cfg.default_window),
                (0, false) => cfg.default_window,
                (w, _) => w.min(proto::limits::MAX_WINDOW),
            };
            let sub = st
                .registry
                .get_mut(&id)
                .ok_or_else(|| Refusal::new(ErrorCode::Internal, "subscription vanished"))?;
            // 0: the subscription's own default (`subscribe --ack-wait`).
            let explicit = req.explicit_ack.then(|| match req.ack_wait_ms {
                0 => sub.ack_wait.unwrap_or(proto::limits::DEFAULT_ACK_WAIT),
                ms => Duration::from_millis(ms),
            });
            sub.attach(conn, window as usize, explicit);
            st.registry.set_attached(conn, &id);
        }
        let Some(sub) = st.registry.get(&id) else {
            return Err(Refusal::new(ErrorCode::Internal, "subscription vanished"));
        };
        let reply = v1::Subscribed {
            request_id: req.request_id,
            subscription_id: id.clone(),
            created,
            patterns: sub.selector.pattern_strings(),
            filter: sub.selector.filter_str().to_owned(),
            where_exprs: sub.selector.where_strs().to_vec(),
            cursor: sub.cursor(head),
            head_seq: head,
            attached: req.attach,
            upstream_subscription_id: sub.upstream_id.clone().unwrap_or_default(),
        };
        let wake = req.attach.then(|| st.registry.handle(Some(conn))).flatten();
        self.mark_subs_dirty(&mut st);
        self.touch(&mut st);
        drop(st);
        if save_gen.is_some() {
            self.shared.commit_wake.notify_one();
        }
        if let Some(k) = kicked {
            k.kick(ByeReason::TakenOver);
        }
        if let Some(w) = wake {
            w.wake.notify_one();
        }
        Ok((reply, save_gen))
    }

    /// Removes subscriptions. A consumer attached to one (other than the
    /// requester itself) gets `Bye{UNSUBSCRIBED}`.
    /// Returns the removed and unknown ids, and the subscription generation
    /// to save before replying (a named subscription was removed).
    pub(super) fn unsubscribe(
        &self,
        requester: ConnId,
        ids: &[String],
    ) -> (Vec<String>, Vec<String>, Option<u64>) {
        let mut removed = vec![];
        let mut save_gen = None;
        let mut not_found = vec![];
        let mut kicks = vec![];
        let mut released = vec![];
        let mut st = self.state();
        for id in ids {
            match st.registry.remove(id, requester) {
                Some((sub, kick)) => {
                    if !sub.owned {
                        save_gen = Some(st.persist.must_save());
                    }
                    released.extend(sub.upstream_id);
                    kicks.extend(kick);
                    removed.push(id.clone());
                }
                None => not_found.push(id.clone()),
            }
        }
        self.touch(&mut st);
        drop(st);
        if save_gen.is_some() {
            self.shared.commit_wake.notify_one();
        }
        for k in kicks {
            k.kick(ByeReason::Unsubscribed);
        }
        self.release_upstream(released);
        (removed, not_found, save_gen)
    }

    /// Releases upstream bindings whose local subscriptions are gone.
    pub(super) fn release_upstream(&self, ids: Vec<UpstreamId>) {
        if let Some(ctl) = &self.shared.upstream {
            for id in ids {
                ctl.release(&id);
            }
        }
    }

    /// Closes the consumers attached to `ids` (Bye SUBSCRIPTION_STOPPED) and
    /// leaves the subscriptions in place.
    pub(super) fn stop_consumers(&self, ids: &[String], dry_run: bool) -> v1::StopReply {
        let mut reply = v1::StopReply::default();
        let mut kicks = vec![];
        let mut st = self.state();
        for id in ids {
            // Every consumer: a shared subscription has several.
            let Some(holders) = st
                .registry
                .get(id)
                .map(|s| s.consumers().collect::<Vec<_>>())
            else {
                reply.not_found.push(id.clone());
                continue;
            };
            reply.subscription_ids.push(id.clone());
            for c in holders {
                if let Some(conn) = st.registry.conn(c) {
                    reply.consumer_pids.push(conn.pid());
                    kicks.push(conn.handle().clone());
                }
                if !dry_run {
                    // The others are being stopped too: none to wake.
                    let _ = self.detach_and_mark(&mut st, c);
                }
            }
        }
        if !dry_run {
            self.touch(&mut st);
        }
        drop(st);
        if !dry_run {
            for k in kicks {
                k.kick(ByeReason::SubscriptionStopped);
            }
        }
        reply
    }

    /// Pids of every consumer currently attached (for a dry-run stop).
    pub(super) fn consumer_pids(&self) -> Vec<u32> {
        self.state().registry.consumer_pids()
    }
}
