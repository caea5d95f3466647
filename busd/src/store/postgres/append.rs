//! The owner's append, riding out a PostgreSQL outage: a batch that could
//! not be written because the server went away (a restart, a network cut)
//! is tried again with a backoff for up to [`OUTAGE_BOUND`], while the
//! committer (and so every reply and upstream ack behind the batch) waits.
//!
//! The lease dies with the server's sessions: meanwhile the epoch reads
//! [`REGAINING`] (the cluster task is taking the lease back) and the append
//! waits for the new epoch. It may go on under it only because the cluster
//! task checked that no other host held the lease in between (the epoch
//! moved by exactly one); otherwise the epoch drops to 0 and the append is
//! fenced like any append of a host that lost the lease.
//!
//! A batch whose `COMMIT` reached the server but whose answer was lost is
//! found in the log on the next attempt (same seqs, byte for byte the same
//! records — a generated event id alone is not enough: two hosts started in
//! the same millisecond generate the same id for the same seq) and
//! counts as written: never written twice, never reported lost — also when
//! that next attempt finds the lease taken by another host meanwhile (the
//! batch committed under this host's epoch before the takeover), so a
//! publish is never told it failed while its event is in the log.

use std::{
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use super::{
    log,
    session::{close, ensure},
    Driver, PgError, PgSettings,
};
use crate::{eventlog::LoggedEvent, pg::Client};

pub use crate::pg::{fence::REGAINING, OUTAGE_BOUND};

/// Whether a failure may pass with the outage: see [`PgError::is_transient`].
pub fn transient(e: &PgError) -> bool {
    e.is_transient()
}

/// What the store says when an append may or may not have committed: the
/// publishers of its batch are told so, never that it failed.
pub const OUTCOME_UNKNOWN: &str = "its outcome is unknown";

/// Appends `events` under the current epoch on `conn` (opened or reopened
/// as needed), waiting out an outage (see the module doc) — the whole
/// batch, lost answers included, within [`OUTAGE_BOUND`] (plus one
/// statement's bound). An attempt whose answer was lost is looked for in
/// the log before the batch is reported failed; when the log cannot be
/// read in time, the error says [`OUTCOME_UNKNOWN`].
pub(super) async fn append_through_outage(
    epoch: &AtomicI64,
    conn: &mut Option<(Client, Driver)>,
    settings: &PgSettings,
    events: &[Arc<LoggedEvent>],
) -> Result<(), PgError> {
    let deadline = Instant::now() + OUTAGE_BOUND;
    let mut backoff = Duration::from_millis(100);
    let mut failed_once = false;
    loop {
        let e = epoch.load(Ordering::Acquire);
        let fenced = if e == REGAINING && Instant::now() >= deadline {
            Some(PgError::Fenced(format!(
                "the lease was not regained within {}s",
                OUTAGE_BOUND.as_secs()
            )))
        } else if e == REGAINING {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        } else if e <= 0 {
            Some(PgError::Fenced(log::NO_LEASE.to_owned()))
        } else {
            None
        };
        if let Some(err) = fenced {
            return settle(conn, settings, events, failed_once, deadline, err).await;
        }
        let result = match ensure(conn, settings).await {
            Ok(client) => log::append(client, &settings.cluster, e, events).await,
            Err(err) => Err(err),
        };
        let err = match result {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        close(conn.take()).await;
        if !transient(&err) || Instant::now() >= deadline {
            // Refused as a gap, or fenced, or out of time: did an attempt
            // whose answer was lost commit (under this epoch, before another
            // host took the lease)? Then the batch is durable and its
            // publishers are told so; only what is not in the log is
            // reported failed.
            return settle(conn, settings, events, failed_once, deadline, err).await;
        }
        failed_once = true;
        tracing::warn!(cause = %err, retry_in_ms = backoff.as_millis() as u64, "the cluster store is unreachable; the append waits");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The batch's last word once no attempt may follow: `err`, unless an
/// attempt whose answer was lost committed it (then it is durable), or
/// nobody can tell in time (then [`OUTCOME_UNKNOWN`]). The lost attempt
/// cannot commit any more by now: it gave up after [`super::STATEMENT_BOUND`],
/// longer than its transaction may sit idle on the server.
pub(super) async fn settle(
    conn: &mut Option<(Client, Driver)>,
    settings: &PgSettings,
    events: &[Arc<LoggedEvent>],
    failed_once: bool,
    deadline: Instant,
    err: PgError,
) -> Result<(), PgError> {
    if !failed_once {
        return Err(err);
    }
    match found_after_lost_answer(conn, settings, events, deadline).await {
        Some(true) => Ok(()),
        Some(false) => Err(err),
        None => {
            let (first, last) = (
                events.first().map_or(0, |e| e.seq),
                events.last().map_or(0, |e| e.seq),
            );
            tracing::error!(
                first,
                last,
                "cannot tell whether an append whose answer was lost committed; its publishers \
                 are told its outcome is unknown"
            );
            Err(PgError::Unreachable(format!(
                "the cluster store cannot tell whether the append of seqs {first}-{last} \
                 committed, so {OUTCOME_UNKNOWN} ({err})"
            )))
        }
    }
}

/// Whether an attempt whose answer was lost committed the batch: asked until
/// the server answers, since a failure to ask is no answer (sessions may
/// still be terminated around a lost lease), until `deadline` (at least
/// once); `None` when no answer came.
async fn found_after_lost_answer(
    conn: &mut Option<(Client, Driver)>,
    settings: &PgSettings,
    events: &[Arc<LoggedEvent>],
    deadline: Instant,
) -> Option<bool> {
    let mut backoff = Duration::from_millis(50);
    loop {
        // Each try within one statement's bound, the connect included.
        let tried = tokio::time::timeout(super::STATEMENT_BOUND, async {
            let client = ensure(conn, settings).await?;
            already_in(client, settings, events).await
        })
        .await;
        match tried {
            Ok(Ok(found)) => return Some(found),
            _ => close(conn.take()).await,
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Whether the log already holds exactly this batch: the same records at
/// the same seqs, encoded bytes and receive time included. Ids and seqs
/// alone could be another owner's batch: a generated id is the bus's start
/// time and the seq, which two hosts can share.
async fn already_in(
    client: &Client,
    settings: &PgSettings,
    events: &[Arc<LoggedEvent>],
) -> Result<bool, PgError> {
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return Ok(true);
    };
    let n = (last.seq - first.seq + 1) as i64;
    let rows = log::read_after(client, &settings.cluster, first.seq - 1, n).await?;
    Ok(rows.len() == events.len()
        && rows.iter().zip(events).all(|(r, e)| {
            r.seq == e.seq
                && r.event_id == e.event_id
                && r.scope == e.scope
                && r.received_at_unix_ms == e.received_at_unix_ms
                && e.encoded().is_ok_and(|b| b[..] == r.encoded[..])
        }))
}
