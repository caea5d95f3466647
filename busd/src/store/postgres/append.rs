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
//! found in the log on the next attempt (same seqs, same event ids) and
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

use tokio_postgres::Client;

use super::{
    log,
    session::{close, ensure},
    Driver, PgError, PgSettings,
};
use crate::eventlog::LoggedEvent;

/// The epoch while the cluster task takes the lease back after losing its
/// session (see the module doc).
pub const REGAINING: i64 = -1;

/// How long an append waits for the server (and the lease) to come back.
pub const OUTAGE_BOUND: Duration = Duration::from_secs(60);

/// Whether a failure may pass with the outage: the server or the session
/// went away, not a refusal (credentials, schema, a fenced epoch, a gap).
pub fn transient(e: &PgError) -> bool {
    matches!(e, PgError::Unreachable(_))
}

/// Appends `events` under the current epoch on `conn` (opened or reopened
/// as needed), waiting out an outage (see the module doc).
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
            Some(format!(
                "the lease was not regained within {}s",
                OUTAGE_BOUND.as_secs()
            ))
        } else if e == REGAINING {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        } else if e <= 0 {
            Some(log::NO_LEASE.to_owned())
        } else {
            None
        };
        if let Some(why) = fenced {
            // An attempt whose answer was lost may have committed before
            // the lease went: then the batch is durable, and so reported.
            if failed_once && found_after_lost_answer(conn, settings, events).await {
                return Ok(());
            }
            return Err(PgError::Fenced(why));
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
        if failed_once && matches!(err, PgError::Other(_) | PgError::Fenced(_)) {
            // Refused as a gap, or fenced: did the attempt whose answer was
            // lost commit (under this epoch, before another host took the
            // lease)? Then the batch is durable and its publishers are told
            // so; only what is not in the log is reported failed.
            if found_after_lost_answer(conn, settings, events).await {
                return Ok(());
            }
        }
        if !transient(&err) || Instant::now() >= deadline {
            return Err(err);
        }
        failed_once = true;
        tracing::warn!(cause = %err, retry_in_ms = backoff.as_millis() as u64, "the cluster store is unreachable; the append waits");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Whether an attempt whose answer was lost committed the batch: asked until
/// the server answers, since a failure to ask is no answer (sessions may
/// still be terminated around a lost lease), for up to [`OUTAGE_BOUND`];
/// `false` only when the log does not hold the batch or no answer came.
async fn found_after_lost_answer(
    conn: &mut Option<(Client, Driver)>,
    settings: &PgSettings,
    events: &[Arc<LoggedEvent>],
) -> bool {
    let deadline = Instant::now() + OUTAGE_BOUND;
    let mut backoff = Duration::from_millis(50);
    loop {
        if let Ok(client) = ensure(conn, settings).await {
            match already_in(client, settings, events).await {
                Ok(found) => return found,
                Err(_) => close(conn.take()).await,
            }
        }
        if Instant::now() >= deadline {
            tracing::error!(
                "cannot tell whether an append whose answer was lost committed; its publishers \
                 are told it failed"
            );
            return false;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Whether the log already holds exactly this batch (same seqs, same ids).
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
        && rows
            .iter()
            .zip(events)
            .all(|(r, e)| r.seq == e.seq && r.event_id == e.event_id && r.scope == e.scope))
}
