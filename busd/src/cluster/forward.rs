//! Publishes across hosts, through the inbox table:
//! - a follower's [`Link::forward`] queues the event; one task per host
//!   ([`forwarder`]) inserts it, wakes the owner (`NOTIFY dws_inbox_new`)
//!   and waits for its answer (`LISTEN dws_inbox`, and a poll), which the
//!   connection then sends as the publish's reply;
//! - the owner's [`drain`] takes inbox rows in order, appends each through
//!   the hub like a local publish (dedup, seq), waits until they are in the
//!   log, and writes the answers back.
//!
//! A forwarded publish is answered only once the owner appended it, so a
//! reply means what it means on one host: the event is in the cluster log.
//! An owner that dies between taking rows and answering leaves them for the
//! next owner: such an event is appended again unless it has an id (then
//! the dedup window catches it).

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use proto::v1::{self, ErrorCode};
use tokio::sync::mpsc;
use tokio_postgres::Client;

use super::{Answer, Link};
use crate::{
    hub::NewEvent,
    shutdown::Shutdown,
    store::postgres::{self, inbox, PgError},
};

/// How long a forwarded publish waits for the owner.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// How often unanswered forwards are looked up without a notification.
const ANSWER_POLL: Duration = Duration::from_millis(250);
/// Inbox rows the owner takes per round.
const DRAIN_BATCH: i64 = 256;
/// The owner's wait before it reads the inbox again after a failure,
/// doubling up to the maximum while the failures go on.
const DRAIN_BACKOFF_MIN: Duration = Duration::from_millis(100);
const DRAIN_BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Link {
    /// Hands `event` to the cluster's owner; returns the ticket whose answer
    /// [`Link::take_answer`] gives once [`Link::is_answered`].
    pub fn forward(self: &Arc<Self>, event: NewEvent) -> u64 {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        super::lock(&self.answers).insert(ticket, None);
        let tx = super::lock(&self.forwards)
            .get_or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(forwarder(self.clone(), rx));
                tx
            })
            .clone();
        if tx.send((ticket, event)).is_err() {
            self.answer(ticket, Err(unavailable("the forwarder stopped")));
        }
        ticket
    }
}

fn unavailable(why: impl std::fmt::Display) -> (ErrorCode, String) {
    (
        ErrorCode::Internal,
        format!("cannot hand the event to the cluster's owner: {why}"),
    )
}

/// One forward waiting for the owner.
struct Waiting {
    ticket: u64,
    id: i64,
    deadline: Instant,
}

/// The follower's forwarding task (see the module doc).
async fn forwarder(link: Arc<Link>, mut rx: mpsc::UnboundedReceiver<(u64, NewEvent)>) {
    let s = link.settings.clone();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut session = None;
    // A publish that arrived while the database was unreachable: tried on
    // the next session.
    let mut next: Option<(u64, NewEvent)> = None;
    loop {
        if session.is_none() {
            match postgres::listen(&s, "forward", &["dws_inbox"]).await {
                Ok(sess) => session = Some(sess),
                Err(e) => {
                    // Everything queued or waiting fails now; the next
                    // publish tries a new session.
                    let queued = next
                        .take()
                        .into_iter()
                        .chain(std::iter::from_fn(|| rx.try_recv().ok()));
                    for (ticket, _) in queued {
                        link.answer(ticket, Err(unavailable(&e)));
                    }
                    for w in waiting.drain(..) {
                        link.answer(w.ticket, Err(unavailable(&e)));
                    }
                    match rx.recv().await {
                        Some(item) => next = Some(item),
                        None => return,
                    }
                    continue;
                }
            }
        }
        let Some((client, _driver, notified)) = &mut session else {
            continue;
        };
        if let Some((ticket, event)) = next.take() {
            push(&link, client, ticket, event, &mut waiting).await;
        }
        let poll = if waiting.is_empty() {
            Duration::from_secs(3600)
        } else {
            ANSWER_POLL
        };
        tokio::select! {
            got = rx.recv() => match got {
                Some((ticket, event)) => push(&link, client, ticket, event, &mut waiting).await,
                None => return,
            },
            n = notified.recv() => if n.is_none() {
                session = None;
                continue;
            },
            _ = tokio::time::sleep(poll) => {}
        }
        if let Err(e) = collect(&link, client, &mut waiting).await {
            tracing::warn!(cause = %e, "cannot read forwarded publishes' answers; reconnecting");
            session = None;
        }
    }
}

async fn push(
    link: &Link,
    client: &Client,
    ticket: u64,
    event: NewEvent,
    waiting: &mut Vec<Waiting>,
) {
    let s = &link.settings;
    match inbox::push(client, &s.cluster, &s.host, &event).await {
        Ok(id) => {
            // `push` woke the owner (`NOTIFY dws_inbox_new`).
            waiting.push(Waiting {
                ticket,
                id,
                deadline: Instant::now() + ANSWER_WITHIN,
            });
        }
        Err(e) => link.answer(ticket, Err(unavailable(&e))),
    }
}

/// Answers every waiting forward whose row the owner finished, and those
/// past their deadline.
async fn collect(link: &Link, client: &Client, waiting: &mut Vec<Waiting>) -> Result<(), PgError> {
    if waiting.is_empty() {
        return Ok(());
    }
    let now = Instant::now();
    let ids: Vec<i64> = waiting.iter().map(|w| w.id).collect();
    let mut found: std::collections::HashMap<i64, Option<inbox::InboxResult>> =
        inbox::results(client, &link.settings.cluster, &ids)
            .await?
            .into_iter()
            .collect();
    let mut still = Vec::with_capacity(waiting.len());
    for w in waiting.drain(..) {
        match found.remove(&w.id).flatten() {
            Some(r) => link.answer(w.ticket, answer_of(r)),
            None if now >= w.deadline => link.answer(
                w.ticket,
                Err(unavailable(format!(
                    "no owner answered within {}s",
                    ANSWER_WITHIN.as_secs()
                ))),
            ),
            None => still.push(w),
        }
    }
    *waiting = still;
    Ok(())
}

/// An error travels through the inbox as `"<code> <message>"`.
fn answer_of(r: inbox::InboxResult) -> Answer {
    match r.error {
        None => Ok(v1::PublishAck {
            request_id: 0,
            seq: r.seq,
            event_id: r.event_id,
            duplicate: r.duplicate,
        }),
        Some(e) => {
            let (code, message) = e.split_once(' ').unwrap_or(("0", e.as_str()));
            let code = code
                .parse::<i32>()
                .ok()
                .and_then(|c| ErrorCode::try_from(c).ok())
                .unwrap_or(ErrorCode::Internal);
            Err((code, message.to_owned()))
        }
    }
}

/// The owner's side: takes inbox rows, appends them, answers.
pub(super) async fn drain(link: Arc<Link>, mut shutdown: Shutdown) {
    let s = link.settings.clone();
    let mut backoff = DRAIN_BACKOFF_MIN;
    loop {
        match postgres::listen(&s, "inbox", &["dws_inbox_new"]).await {
            Err(e) => tracing::warn!(cause = %e, "cannot read the cluster inbox; retrying"),
            Ok((mut client, _driver, mut notified)) => loop {
                match drain_once(&link, &mut client).await {
                    Ok(n) => {
                        backoff = DRAIN_BACKOFF_MIN;
                        if n as i64 >= DRAIN_BATCH {
                            continue;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(cause = %e, "draining the cluster inbox failed; reconnecting");
                        break;
                    }
                }
                tokio::select! {
                    _ = shutdown.recv() => return,
                    n = notified.recv() => if n.is_none() { break },
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            },
        }
        // A failure that lasts (a refused statement, an epoch this host does
        // not hold) must not become a new session every few milliseconds.
        tokio::select! {
            _ = shutdown.recv() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(DRAIN_BACKOFF_MAX);
    }
}

async fn drain_once(link: &Link, client: &mut Client) -> Result<usize, PgError> {
    let cluster = &link.settings.cluster;
    let epoch = link.epoch.load(Ordering::Acquire);
    let rows = inbox::take(client, cluster, epoch, DRAIN_BATCH).await?;
    let n = rows.len();
    if n == 0 {
        return Ok(0);
    }
    let mut answers = Vec::with_capacity(n);
    let mut last = 0;
    for (id, event) in rows {
        let result = match link.hub.append(event) {
            Ok(a) => {
                last = last.max(a.seq);
                inbox::InboxResult {
                    seq: a.seq,
                    duplicate: a.duplicate,
                    event_id: a.event_id,
                    error: None,
                }
            }
            Err(r) => inbox::InboxResult {
                seq: 0,
                duplicate: false,
                event_id: String::new(),
                error: Some(format!("{} {}", r.code as i32, r.message)),
            },
        };
        answers.push((id, result));
    }
    if last > 0 {
        link.hub
            .wait_durable(last)
            .await
            .map_err(|e| PgError::Other(format!("the bus is stopping: {e}")))?;
    }
    inbox::finish(client, cluster, &answers).await?;
    Ok(n)
}
