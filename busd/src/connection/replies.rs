//! Replies that may only leave once the store has caught up with the change
//! they answer: a published event is durable, or a subscription change is
//! saved. They wait here, in request order, instead of in the request
//! handler, so the connection keeps reading and pipelined requests share one
//! fsync. If the store fails, every waiting request is answered with the
//! error and the connection closes.

use std::collections::VecDeque;

use proto::v1::{self, server_frame::Kind as S, ErrorCode};
use tokio::sync::watch;

use super::Connection;
use crate::{cluster::Link, hub::Durable};

/// One connection's replies waiting for the store, in request order.
pub(super) struct Waiting {
    queue: VecDeque<Awaited>,
    /// Of `queue`, the publishes forwarded to the cluster's owner.
    forwards: usize,
    /// What the store has reached.
    durable: watch::Receiver<Durable>,
}

impl Waiting {
    pub(super) fn new(durable: watch::Receiver<Durable>) -> Waiting {
        Waiting {
            queue: VecDeque::new(),
            forwards: 0,
            durable,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Once the store reached something new (or its sender is gone).
    pub(super) async fn changed(&mut self) {
        let _ = self.durable.changed().await;
    }
}

/// A reply waiting for the store (see the module doc).
pub(super) struct Awaited {
    request_id: u64,
    until: Until,
    reply: S,
}

/// What the store must have reached before an [`Awaited`] reply leaves.
pub(super) enum Until {
    /// Every event up to this seq is durable.
    Seq(u64),
    /// Every subscription change up to this generation is saved.
    SubsGen(u64),
    /// The cluster's owner answered this forwarded publish (`crate::cluster`);
    /// the reply is the owner's answer, not the placeholder.
    Forwarded(u64),
}

impl Until {
    fn reached(&self, d: &Durable, link: Option<&Link>) -> bool {
        match *self {
            Until::Seq(seq) => d.seq >= seq,
            Until::SubsGen(gen) => d.subs_gen >= gen,
            Until::Forwarded(ticket) => link.is_none_or(|l| l.is_answered(ticket)),
        }
    }
}

impl Connection {
    /// Whether a publish of this connection still waits for the cluster's
    /// owner: its later publishes must follow it through the inbox, or they
    /// would get earlier seqs (the host became the owner meanwhile).
    pub(super) fn forwards_pending(&self) -> bool {
        self.waiting.forwards > 0
    }

    /// Sends `reply` now, or queues it until the store reaches `until`
    /// (replies leave in request order).
    pub(super) fn reply_after(&mut self, request_id: u64, until: Option<Until>, reply: S) {
        if until.is_none() && self.waiting.queue.is_empty() {
            return self.send(reply);
        }
        if matches!(until, Some(Until::Forwarded(_))) {
            self.waiting.forwards += 1;
        }
        self.waiting.queue.push_back(Awaited {
            request_id,
            until: until.unwrap_or(Until::Seq(0)),
            reply,
        });
        self.answer_durable();
    }

    /// Sends the replies the store has caught up with, in order; if the store
    /// failed, answers every waiting request with the error.
    pub(super) fn answer_durable(&mut self) {
        if self.waiting.queue.is_empty() {
            return;
        }
        let d = self.waiting.durable.borrow_and_update().clone();
        let link = self.link.clone();
        while self
            .waiting
            .queue
            .front()
            .is_some_and(|a| a.until.reached(&d, link.as_deref()))
        {
            let Some(a) = self.waiting.queue.pop_front() else {
                break;
            };
            if matches!(a.until, Until::Forwarded(_)) {
                self.waiting.forwards -= 1;
            }
            match (a.until, &link) {
                (Until::Forwarded(ticket), Some(link)) => match link.take_answer(ticket) {
                    Ok(ack) => self.send(S::PublishAck(v1::PublishAck {
                        request_id: a.request_id,
                        ..ack
                    })),
                    Err((code, message)) => self.error(a.request_id, code, message),
                },
                _ => self.send(a.reply),
            }
        }
        if let Some(why) = &d.failed {
            self.waiting.forwards = 0;
            // "Failed" only for what will never be appended: an event the
            // store made durable before it failed gets its reply, and a
            // forwarded publish the owner has not answered may still be
            // appended by it (its inbox row outlives this bus).
            for a in std::mem::take(&mut self.waiting.queue) {
                match (&a.until, link.as_deref()) {
                    (Until::Forwarded(ticket), Some(l)) if l.is_answered(*ticket) => {
                        match l.take_answer(*ticket) {
                            Ok(ack) => self.send(S::PublishAck(v1::PublishAck {
                                request_id: a.request_id,
                                ..ack
                            })),
                            Err((code, message)) => self.error(a.request_id, code, message),
                        }
                    }
                    (Until::Forwarded(_), _) => self.error(
                        a.request_id,
                        ErrorCode::Internal,
                        forward_unknown_message(why),
                    ),
                    (until, l) if until.reached(&d, l) => self.send(a.reply),
                    _ => self.error(a.request_id, ErrorCode::Internal, store_failed_message(why)),
                }
            }
            self.closing = true;
        }
    }
}

/// What a client is told when the store failed while its forwarded publish
/// waited for the cluster's owner.
fn forward_unknown_message(why: &str) -> String {
    format!(
        "the bus stopped before the cluster's owner answered this forwarded publish, so {}: \
         its store failed ({why}); publishing it again may append it twice unless it has an --id",
        crate::cluster::OUTCOME_UNKNOWN
    )
}

/// What a client is told when the store failed under it.
pub(super) fn store_failed_message(why: &str) -> String {
    format!(
        "the bus stopped: its store failed ({why}); events acknowledged before are safe on \
         disk, and the next start recovers them"
    )
}
