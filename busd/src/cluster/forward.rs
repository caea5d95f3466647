//! Publishes across hosts, through the inbox table:
//! - a follower's [`Link::forward`] queues the event under a fresh
//!   idempotency key; one task per host ([`forwarder`]) inserts it (by key:
//!   a push whose answer was lost is pushed again and finds its row), wakes
//!   the owner (`NOTIFY dws_inbox_new`) and waits for its answer (`LISTEN
//!   dws_inbox`, and a poll), which the connection then sends as the
//!   publish's reply;
//! - the owner's [`drain`] takes inbox rows in order, appends each through
//!   the hub like a local publish (dedup, seq), waits until they are in the
//!   log, and writes the answers back.
//!
//! A forwarded publish is answered only once the owner appended it, so a
//! reply means what it means on one host: the event is in the cluster log.
//! An event published without an id gets its key as its id, so a row taken
//! again (the owner died or lost its session before answering) is a
//! duplicate of the first append, answered with its seq, never appended
//! twice. "Failed" is said only of what will never be appended: a push
//! that never reached the database, or a row withdrawn (deleted while no
//! owner had taken it) when no owner answered within [`ANSWER_WITHIN`]. A
//! row an owner took is waited for up to [`TAKEN_WITHIN`] more; after that
//! the reply says the outcome is unknown ([`OUTCOME_UNKNOWN`]).

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use proto::v1::{self, ErrorCode};
use tokio::sync::mpsc;

use super::db::inbox;
use super::{Answer, Link};
use crate::{
    hub::NewEvent,
    pg::{self, Client, PgError},
    shutdown::Shutdown,
};

/// How long a forwarded publish waits for an owner to take it.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// How much longer it waits once an owner took it.
const TAKEN_WITHIN: Duration = Duration::from_secs(60);
/// What the reply of a publish says when the bus cannot tell whether the
/// owner appended it.
pub const OUTCOME_UNKNOWN: &str = "its outcome is unknown";
/// How often a forwarder retries the database while publishes wait.
const RECONNECT_EVERY: Duration = Duration::from_millis(250);
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
    pub fn forward(self: &Arc<Self>, mut event: NewEvent) -> u64 {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let key = forward_key(&self.settings.host, &self.incarnation, ticket);
        if event.event_id.is_empty() {
            // Deduplicated by the owner under its key (see the module doc).
            event.event_id = key.clone();
        }
        super::lock(&self.answers).insert(ticket, None);
        let tx = super::lock(&self.forwards)
            .get_or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(forwarder(self.clone(), rx));
                tx
            })
            .clone();
        if tx.send((ticket, key, event)).is_err() {
            self.answer(ticket, Err(unavailable("the forwarder stopped")));
        }
        ticket
    }
}

/// A forwarded publish's idempotency key: unique per host incarnation
/// (a random id per busd start) and ticket.
pub(super) fn forward_key(host: &str, incarnation: &str, ticket: u64) -> String {
    format!("fwd-{host}-{incarnation}-{ticket}")
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
    key: String,
    event: NewEvent,
    /// Its inbox row, once a push was answered.
    id: Option<i64>,
    /// A push was sent (it may have reached the database unanswered).
    sent: bool,
    /// An owner took its row (found when withdrawing it).
    taken: bool,
    deadline: Instant,
}

/// Answers a forward that will not be appended (never pushed, or withdrawn).
fn fail(link: &Link, w: Waiting, why: impl std::fmt::Display) {
    link.answer(w.ticket, Err(unavailable(why)));
}

/// Answers a forward whose row may still be appended.
fn unknown(link: &Link, w: Waiting, why: impl std::fmt::Display) {
    link.answer(
        w.ticket,
        Err((
            ErrorCode::Internal,
            format!(
                "the event was handed to the cluster's owner but {OUTCOME_UNKNOWN}: {why}; \
                 publishing it again may append it twice unless it has an --id"
            ),
        )),
    );
}

/// The follower's forwarding task (see the module doc).
async fn forwarder(link: Arc<Link>, mut rx: mpsc::UnboundedReceiver<(u64, String, NewEvent)>) {
    let s = link.settings.clone();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut session = None;
    loop {
        if session.is_none() {
            // While publishes wait, a connect that hangs (a path that
            // swallows bytes) must not hold their answers past their
            // deadlines: it is given up at the first one.
            let opened = match waiting.iter().map(|w| w.deadline).min() {
                Some(first) => {
                    let left = first.saturating_duration_since(Instant::now());
                    tokio::time::timeout(
                        left.max(RECONNECT_EVERY),
                        pg::listen(&s, "forward", &["dws_inbox"]),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(PgError::Unreachable(
                            "PostgreSQL did not accept a session in time".into(),
                        ))
                    })
                }
                None => pg::listen(&s, "forward", &["dws_inbox"]).await,
            };
            match opened {
                Ok(sess) => session = Some(sess),
                Err(e) => {
                    // What was never sent fails now; what was sent waits
                    // for the database until its deadline.
                    let now = Instant::now();
                    for w in std::mem::take(&mut waiting) {
                        match (w.sent, now >= w.deadline) {
                            (false, _) => fail(&link, w, &e),
                            (true, true) => unknown(&link, w, &e),
                            (true, false) => waiting.push(w),
                        }
                    }
                    if waiting.is_empty() {
                        match rx.recv().await {
                            Some(item) => waiting.push(queued(item)),
                            None => return,
                        }
                    } else {
                        tokio::select! {
                            got = rx.recv() => match got {
                                Some(item) => waiting.push(queued(item)),
                                None => return,
                            },
                            _ = tokio::time::sleep(RECONNECT_EVERY) => {}
                        }
                    }
                    continue;
                }
            }
        }
        let Some((client, _driver, notified)) = &mut session else {
            continue;
        };
        if let Err(e) = push_pending(&link, client, &mut waiting).await {
            tracing::warn!(cause = %e, "cannot hand forwarded publishes to the inbox; reconnecting");
            session = None;
            continue;
        }
        let poll = if waiting.is_empty() {
            Duration::from_secs(3600)
        } else {
            ANSWER_POLL
        };
        tokio::select! {
            got = rx.recv() => match got {
                Some(item) => waiting.push(queued(item)),
                None => return,
            },
            n = notified.recv() => if n.is_none() {
                session = None;
                continue;
            },
            _ = tokio::time::sleep(poll) => {}
        }
        if let Err(e) = push_pending(&link, client, &mut waiting).await {
            tracing::warn!(cause = %e, "cannot hand forwarded publishes to the inbox; reconnecting");
            session = None;
            continue;
        }
        if let Err(e) = collect(&link, client, &mut waiting).await {
            tracing::warn!(cause = %e, "cannot read forwarded publishes' answers; reconnecting");
            session = None;
        }
    }
}

fn queued((ticket, key, event): (u64, String, NewEvent)) -> Waiting {
    Waiting {
        ticket,
        key,
        event,
        id: None,
        sent: false,
        taken: false,
        deadline: Instant::now() + ANSWER_WITHIN,
    }
}

/// Pushes every waiting forward without a row id (idempotent by key). A
/// broken session is returned (the caller reconnects and pushes again); a
/// refusal fails the forward — or leaves its outcome unknown when an
/// earlier push of it may have reached the database.
async fn push_pending(
    link: &Link,
    client: &Client,
    waiting: &mut Vec<Waiting>,
) -> Result<(), PgError> {
    let s = &link.settings;
    let mut i = 0;
    while i < waiting.len() {
        if waiting[i].id.is_some() {
            i += 1;
            continue;
        }
        let w = &mut waiting[i];
        let was_sent = w.sent;
        w.sent = true;
        match inbox::push(client, &s.cluster, &s.host, &w.key, &w.event).await {
            Ok(id) => {
                // `push` woke the owner (`NOTIFY dws_inbox_new`).
                w.id = Some(id);
                i += 1;
            }
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => {
                let w = waiting.remove(i);
                if was_sent {
                    unknown(link, w, &e);
                } else {
                    fail(link, w, &e);
                }
            }
        }
    }
    Ok(())
}

/// Answers every waiting forward whose row the owner finished; withdraws
/// those past their deadline (see the module doc).
async fn collect(link: &Link, client: &Client, waiting: &mut Vec<Waiting>) -> Result<(), PgError> {
    if waiting.is_empty() {
        return Ok(());
    }
    let cluster = &link.settings.cluster;
    let now = Instant::now();
    let ids: Vec<i64> = waiting.iter().filter_map(|w| w.id).collect();
    let mut found: std::collections::HashMap<i64, Option<inbox::InboxResult>> =
        inbox::results(client, cluster, &ids)
            .await?
            .into_iter()
            .collect();
    let mut still = Vec::with_capacity(waiting.len());
    let mut rest = std::mem::take(waiting).into_iter();
    while let Some(mut w) = rest.next() {
        if let Some(r) = w.id.and_then(|id| found.remove(&id).flatten()) {
            link.answer(w.ticket, answer_of(r));
            continue;
        }
        if now < w.deadline {
            still.push(w);
            continue;
        }
        if w.taken {
            unknown(
                link,
                w,
                format!(
                    "an owner took it and did not answer within {}s",
                    (ANSWER_WITHIN + TAKEN_WITHIN).as_secs()
                ),
            );
            continue;
        }
        match inbox::withdraw(client, cluster, &w.key).await {
            Ok(inbox::Withdrawal::Withdrawn | inbox::Withdrawal::Absent) => fail(
                link,
                w,
                format!(
                    "no owner took it within {}s; it was withdrawn and will not be appended",
                    ANSWER_WITHIN.as_secs()
                ),
            ),
            Ok(inbox::Withdrawal::Taken) => {
                w.taken = true;
                w.deadline = now + TAKEN_WITHIN;
                still.push(w);
            }
            Err(e) => {
                still.push(w);
                still.extend(rest);
                *waiting = still;
                return Err(e);
            }
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
        match pg::listen(&s, "inbox", &["dws_inbox_new"]).await {
            Err(e) => tracing::warn!(cause = %e, "cannot read the cluster inbox; retrying"),
            Ok((mut client, _driver, mut notified)) => {
                let mut again = true;
                loop {
                    match drain_once(&link, &mut client, again).await {
                        Ok(n) => {
                            again = false;
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
                }
            }
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

/// One round of the owner's drain; `again`: the first of a new session,
/// which also takes the rows an earlier session took and did not finish.
async fn drain_once(link: &Link, client: &mut Client, again: bool) -> Result<usize, PgError> {
    let cluster = &link.settings.cluster;
    let epoch = link.epoch.load(Ordering::Acquire);
    let rows = inbox::take(client, cluster, epoch, DRAIN_BATCH, again).await?;
    let n = rows.len();
    if n == 0 {
        return Ok(0);
    }
    let mut answers = Vec::with_capacity(n);
    let mut last = 0;
    for (id, key, event) in rows {
        // Its id is its key: a duplicate is this publish taken again.
        let keyed = key.as_deref() == Some(event.event_id.as_str());
        let result = match link.hub.append(event) {
            Ok(a) => {
                last = last.max(a.seq);
                inbox::InboxResult {
                    seq: a.seq,
                    duplicate: a.duplicate && !keyed,
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
