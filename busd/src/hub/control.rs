//! The operator verbs (`dws event subscription VERB ID`): show and parked
//! read the subscription as it is; restart, skip, disable, enable, seek and
//! replay-parked are applied to a copy of it, so a dry run or a refused
//! verb changes nothing.

use super::{
    status::{subscription_doc, SeekDoc, VerbDoc},
    Hub,
};
use crate::upstream::Refusal;
use proto::v1::{self, ErrorCode};

/// The seq of the first retained event received at or after `ms` (unix
/// ms), or the next seq when there is none: where `seek --to TIME` and
/// `consume --from TIME` start. A time older than the log gives its oldest
/// event (what went before is not known by time, so no gap is counted).
pub(super) fn first_at_or_after(log: &crate::eventlog::EventLog, ms: i64) -> u64 {
    log.since(0)
        .find(|e| e.received_at_unix_ms >= ms)
        .map_or(log.head_seq() + 1, |e| e.seq)
}

impl Hub {
    /// [`first_at_or_after`] on this hub's log: where a subscription
    /// created with `START_TIME` starts.
    pub(super) fn seq_at_time(&self, ms: i64) -> u64 {
        first_at_or_after(&self.state().log, ms)
    }

    /// `dws event get SEQ`: the retained event with this seq, without its
    /// per-delivery fields; `None` when it is not retained or damaged.
    pub(super) fn get_event(&self, seq: u64) -> Option<v1::Event> {
        let logged = self.state().log.get(seq)?;
        if logged.damaged {
            return None;
        }
        prost::Message::decode(logged.encoded().ok()?).ok()
    }

    /// `dws event subscription VERB ID`: applies the verb (or, with
    /// `dry_run`, shows what it would do) and returns the subscription's
    /// state after it, with the generation to save before replying.
    pub(super) fn control(
        &self,
        req: &v1::SubscriptionControl,
    ) -> Result<(serde_json::Value, Option<u64>), Refusal> {
        use crate::subscription::State as S;
        let mut st = self.state();
        let head = st.log.head_seq();
        let oldest = st.log.oldest_seq().unwrap_or(head + 1);
        let Some(current) = st.registry.get(&req.subscription_id) else {
            return Err(Refusal::new(
                ErrorCode::NotFound,
                format!(
                    "subscription {} not found",
                    proto::limits::clip(&req.subscription_id)
                ),
            ));
        };
        if matches!(req.verb.as_str(), "show" | "parked") {
            // Read-only: shown from the subscription itself, never a copy
            // (a copy of a large backlog on every verb stalled every client).
            let doc = VerbDoc {
                subscription: subscription_doc(current, head, req.verb == "parked"),
                verb: &req.verb,
                dry_run: req.dry_run,
                changed: false,
                skipped_seq: None,
                seek: None,
                replayed: None,
            }
            .to_json();
            return Ok((doc, None));
        }
        let mut sub = current.clone();
        let refuse = |m: String| Refusal::new(ErrorCode::BadRequest, m);
        let not_now = |m: String| Refusal::new(ErrorCode::FailedPrecondition, m);
        let (mut skipped_seq, mut seek, mut replayed) = (None, None, None);
        let mut filter = false;
        let changed = match req.verb.as_str() {
            "restart" => sub.restart().map(|()| true).map_err(not_now)?,
            "skip" => {
                let seq = sub.skip().map_err(not_now)?;
                skipped_seq = Some(seq);
                true
            }
            "disable" => {
                let was = sub.state == S::Disabled;
                sub.disable().map_err(not_now)?;
                !was
            }
            "enable" => {
                let was = sub.state == S::Active;
                sub.enable().map_err(not_now)?;
                !was
            }
            "seek" => {
                let start = match req.target.as_str() {
                    "earliest" => 0,
                    "latest" => head + 1,
                    t => match t.strip_prefix("t:") {
                        Some(ms) => {
                            let ms: i64 = ms.parse().map_err(|_| {
                                refuse(format!("seek: bad time {:?}", proto::limits::clip(t)))
                            })?;
                            first_at_or_after(&st.log, ms)
                        }
                        None => t.parse::<u64>().map_err(|_| {
                            refuse(format!(
                                "seek: target {} is not earliest, latest, a seq or a time",
                                proto::limits::quoted(t)
                            ))
                        })?,
                    },
                };
                let from = start.max(oldest).min(head + 1);
                let gone = from.saturating_sub(start.max(1));
                sub.seek(from.saturating_sub(1));
                for e in st.log.since(from) {
                    sub.offer(e);
                }
                filter = sub.has_filter_jobs();
                seek = Some(SeekDoc {
                    requested: &req.target,
                    from_seq: from,
                    gone,
                });
                true
            }
            "replay-parked" => {
                let n = sub.replay_parked(&req.seqs);
                replayed = Some(n);
                n > 0
            }
            other => {
                return Err(refuse(format!(
                    "unknown verb {}: use restart, skip, disable, enable, seek, parked or replay-parked",
                    proto::limits::quoted(other)
                )))
            }
        };
        let doc = VerbDoc {
            subscription: subscription_doc(&sub, head, req.verb == "parked"),
            verb: &req.verb,
            dry_run: req.dry_run,
            changed,
            skipped_seq,
            seek,
            replayed,
        }
        .to_json();
        if req.dry_run || !changed {
            return Ok((doc, None));
        }
        tracing::info!(subscription = %sub.id, verb = %req.verb, "subscription changed by an operator");
        let wake = st.registry.handles_of(&sub);
        let named = !sub.owned;
        let id = sub.id.clone();
        st.registry.insert(sub);
        if filter {
            self.want_filter(&mut st, &id);
        }
        let gen = named.then(|| st.persist.must_save());
        drop(st);
        if gen.is_some() {
            self.shared.commit_wake.notify_one();
        }
        for w in wake {
            w.wake.notify_one();
        }
        Ok((doc, gen))
    }
}
