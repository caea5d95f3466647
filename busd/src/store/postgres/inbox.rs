//! The inbox (`dws_inbox`): how a host that does not own the cluster's log
//! publishes. It [`push`]es the event (a [`NewEvent`], as JSON); the owner
//! [`take`]s pending rows, appends them through its hub, and [`finish`]es
//! them with what the append said ([`InboxResult`]); the publisher reads its
//! row's [`result`] once the owner's notification (channel
//! [`DONE_CHANNEL`], payload: the cluster) or its polling says so.
//!
//! Taking claims rows for the taker's epoch (`taken_epoch`), under
//! `FOR UPDATE SKIP LOCKED`: two takers never get the same row while the
//! epoch stands, and the claim is checked against the cluster's epoch in the
//! same transaction, so a fenced owner cannot take anything. A row stays
//! pending (`done = false`) until it is finished: when the owner dies
//! between taking and finishing, the next owner (a new epoch) takes it
//! again. **Such an event may then be appended twice** — unless it has an
//! event id, which the log's dedup catches. [`push`] also notifies
//! [`PUSH_CHANNEL`] (payload: the cluster), so the owner need not poll.
//!
//! `event` is `json`, not `jsonb`: `jsonb` refuses a `\u0000` in a string,
//! which an event's data may hold.

use std::time::Duration;

use tokio_postgres::{types::Type, Client, GenericClient};

use super::{log::from_db, log::to_db, PgError};
use crate::eventlog::NewEvent;

/// Notified (payload: the cluster) when the owner finished rows.
pub const DONE_CHANNEL: &str = "dws_inbox";
/// Notified (payload: the cluster) when a host pushed a row.
pub const PUSH_CHANNEL: &str = "dws_inbox_new";

/// What became of a pushed event: its seq (the original's for a
/// duplicate), or why it was refused (`error`; then `seq` is 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxResult {
    pub seq: u64,
    pub duplicate: bool,
    pub event_id: String,
    pub error: Option<String>,
}

fn q(e: tokio_postgres::Error) -> PgError {
    PgError::query(&e)
}

const PUSH_SQL: &str = "WITH ins AS (
        INSERT INTO dws_inbox (cluster, host, event) VALUES ($1, $2, $3::json) RETURNING id
    )
    SELECT id, pg_notify('dws_inbox_new', $1) FROM ins";

/// Hands `event` to the owner; returns the row's id.
pub async fn push(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
    event: &NewEvent,
) -> Result<i64, PgError> {
    let json = serde_json::to_string(event)
        .map_err(|e| PgError::Other(format!("cannot encode the event for the inbox: {e}")))?;
    let row = client
        .query_typed_one(
            PUSH_SQL,
            &[
                (&cluster, Type::TEXT),
                (&host, Type::TEXT),
                (&json, Type::TEXT),
            ],
        )
        .await
        .map_err(q)?;
    row.try_get(0).map_err(q)
}

const EPOCH_SQL: &str = "SELECT epoch FROM dws_cluster WHERE cluster = $1 FOR SHARE";
const TAKE_SQL: &str = "UPDATE dws_inbox SET taken_epoch = $2
     WHERE cluster = $1 AND id IN (
        SELECT id FROM dws_inbox
        WHERE cluster = $1 AND NOT done AND taken_epoch IS DISTINCT FROM $2
        ORDER BY id LIMIT $3
        FOR UPDATE SKIP LOCKED)
     RETURNING id, event::text";

/// Takes up to `limit` pending rows, oldest first, for the owner of
/// `epoch` (see the module doc). A row whose event cannot be read (written
/// by a newer busd) is finished at once with the reason, never returned.
pub async fn take(
    client: &mut Client,
    cluster: &str,
    epoch: i64,
    limit: i64,
) -> Result<Vec<(i64, NewEvent)>, PgError> {
    if epoch <= 0 {
        return Err(PgError::Fenced(super::log::NO_LEASE.into()));
    }
    let tx = client.transaction().await.map_err(q)?;
    let current: Option<i64> = match tx
        .query_typed_opt(EPOCH_SQL, &[(&cluster, Type::TEXT)])
        .await
        .map_err(q)?
    {
        Some(row) => Some(row.try_get(0).map_err(q)?),
        None => None,
    };
    if let Some(why) = super::lease::fenced(epoch, current) {
        return Err(PgError::Fenced(why));
    }
    let rows = tx
        .query_typed(
            TAKE_SQL,
            &[
                (&cluster, Type::TEXT),
                (&epoch, Type::INT8),
                (&limit, Type::INT8),
            ],
        )
        .await
        .map_err(q)?;
    let mut taken = Vec::with_capacity(rows.len());
    let mut unreadable = vec![];
    for row in rows {
        let id: i64 = row.try_get(0).map_err(q)?;
        let json: String = row.try_get(1).map_err(q)?;
        match serde_json::from_str::<NewEvent>(&json) {
            Ok(ev) => taken.push((id, ev)),
            Err(e) => unreadable.push((
                id,
                InboxResult {
                    seq: 0,
                    duplicate: false,
                    event_id: String::new(),
                    error: Some(format!("the owner cannot read this inbox event: {e}")),
                },
            )),
        }
    }
    if !unreadable.is_empty() {
        finish(&tx, cluster, &unreadable).await?;
    }
    tx.commit().await.map_err(q)?;
    taken.sort_by_key(|(id, _)| *id);
    Ok(taken)
}

const FINISH_SQL: &str = "WITH upd AS (
        UPDATE dws_inbox i
        SET done = true, done_at = now(), seq = u.seq, duplicate = u.dup,
            event_id = u.eid, error = u.err
        FROM unnest($2::bigint[], $3::bigint[], $4::bool[], $5::text[], $6::text[])
             AS u(id, seq, dup, eid, err)
        WHERE i.cluster = $1 AND i.id = u.id AND NOT i.done
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM upd), pg_notify('dws_inbox', $1)";

/// Records the results of taken rows and notifies [`DONE_CHANNEL`]; returns
/// how many rows were still pending (a row finished already keeps its first
/// result).
pub async fn finish(
    client: &impl GenericClient,
    cluster: &str,
    results: &[(i64, InboxResult)],
) -> Result<u64, PgError> {
    let ids: Vec<i64> = results.iter().map(|(id, _)| *id).collect();
    let seqs = results
        .iter()
        .map(|(_, r)| to_db(r.seq))
        .collect::<Result<Vec<i64>, _>>()?;
    let dups: Vec<bool> = results.iter().map(|(_, r)| r.duplicate).collect();
    let eids: Vec<&str> = results.iter().map(|(_, r)| r.event_id.as_str()).collect();
    let errs: Vec<Option<&str>> = results.iter().map(|(_, r)| r.error.as_deref()).collect();
    let row = client
        .query_typed_one(
            FINISH_SQL,
            &[
                (&cluster, Type::TEXT),
                (&ids, Type::INT8_ARRAY),
                (&seqs, Type::INT8_ARRAY),
                (&dups, Type::BOOL_ARRAY),
                (&eids, Type::TEXT_ARRAY),
                (&errs, Type::TEXT_ARRAY),
            ],
        )
        .await
        .map_err(q)?;
    let n: i64 = row.try_get(0).map_err(q)?;
    Ok(n.max(0) as u64)
}

const RESULT_SQL: &str = "SELECT id, done, coalesce(seq, 0), coalesce(duplicate, false),
            coalesce(event_id, ''), error
     FROM dws_inbox WHERE cluster = $1 AND id = ANY($2) ORDER BY id";

fn row_result(row: &tokio_postgres::Row) -> Result<(i64, Option<InboxResult>), PgError> {
    let id: i64 = row.try_get(0).map_err(q)?;
    let done: bool = row.try_get(1).map_err(q)?;
    if !done {
        return Ok((id, None));
    }
    Ok((
        id,
        Some(InboxResult {
            seq: from_db(row.try_get(2).map_err(q)?)?,
            duplicate: row.try_get(3).map_err(q)?,
            event_id: row.try_get(4).map_err(q)?,
            error: row.try_get(5).map_err(q)?,
        }),
    ))
}

/// The result of row `id`: `None` while it is pending; an error when the
/// row does not exist (never pushed, or purged).
pub async fn result(
    client: &impl GenericClient,
    cluster: &str,
    id: i64,
) -> Result<Option<InboxResult>, PgError> {
    let found = results(client, cluster, &[id]).await?;
    match found.into_iter().next() {
        Some((_, r)) => Ok(r),
        None => Err(PgError::Other(format!(
            "inbox row {id} of cluster {cluster} does not exist"
        ))),
    }
}

/// [`result`] of several rows in one query: the rows that exist, each with
/// its result (`None`: pending), in id order. A missing id is left out.
pub async fn results(
    client: &impl GenericClient,
    cluster: &str,
    ids: &[i64],
) -> Result<Vec<(i64, Option<InboxResult>)>, PgError> {
    let rows = client
        .query_typed(
            RESULT_SQL,
            &[(&cluster, Type::TEXT), (&ids, Type::INT8_ARRAY)],
        )
        .await
        .map_err(q)?;
    rows.iter().map(row_result).collect()
}

const PURGE_SQL: &str = "DELETE FROM dws_inbox
     WHERE cluster = $1 AND done AND done_at < now() - make_interval(secs => $2)";

/// Deletes finished rows older than `older_than`; returns how many.
pub async fn purge_done(
    client: &impl GenericClient,
    cluster: &str,
    older_than: Duration,
) -> Result<u64, PgError> {
    let secs = older_than.as_secs_f64();
    client
        .execute_typed(PURGE_SQL, &[(&cluster, Type::TEXT), (&secs, Type::FLOAT8)])
        .await
        .map_err(q)
}
