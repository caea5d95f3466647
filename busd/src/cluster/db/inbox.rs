//! The inbox (`dws_inbox`): how a host that does not own the cluster's log
//! publishes. It [`push`]es the event (a [`NewEvent`], as JSON); the owner
//! [`take`]s pending rows, appends them through its hub, and [`finish`]es
//! them with what the append said ([`InboxResult`]); the publisher reads its
//! row's [`result`] once the owner's notification (channel
//! [`DONE_CHANNEL`], payload: the cluster) or its polling says so.
//!
//! Taking marks rows with the taker's epoch (`taken_epoch`), under
//! `FOR UPDATE SKIP LOCKED`, checked against the cluster's epoch and lease
//! in the same transaction, so a fenced owner cannot take anything. A row
//! stays pending (`done = false`) until it is finished: when the owner dies
//! (or its session breaks) between taking and finishing, the row is taken
//! again. That is safe because every pushed row carries an **idempotency
//! key** (`key`, unique per cluster) chosen by the publishing host: a push
//! is idempotent by it (a push whose answer was lost is pushed again and
//! finds its row), and an event published without an id gets the key as
//! its id, so the owner's dedup answers a second take with the first
//! append's seq instead of appending it twice. A publisher that gives up
//! [`withdraw`]s its row — only while no owner has taken it. [`push`] also
//! notifies [`PUSH_CHANNEL`] (payload: the cluster), so the owner need not
//! poll.
//!
//! `event` is `json`, not `jsonb`: `jsonb` refuses a `\u0000` in a string,
//! which an event's data may hold.

use std::time::Duration;

use crate::eventlog::NewEvent;
use crate::pg::{
    self,
    fence::{check_epoch, NO_LEASE},
    from_db, sql, to_db, Client, GenericClient, Params, PgError, Row, Type,
};

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

const PUSH_SQL: &str = "WITH ins AS (
        INSERT INTO dws_inbox (cluster, host, event, key) VALUES ($1, $2, $3::json, $4)
        ON CONFLICT (cluster, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING id
    ), found AS (
        SELECT id FROM ins
        UNION ALL
        SELECT id FROM dws_inbox WHERE cluster = $1 AND key = $4
    )
    SELECT (SELECT id FROM found LIMIT 1), pg_notify('dws_inbox_new', $1)";

/// Hands `event` to the owner under the idempotency key `key`; returns the
/// row's id — the existing row's when `key` was pushed already.
pub async fn push(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
    key: &str,
    event: &NewEvent,
) -> Result<i64, PgError> {
    let json = serde_json::to_string(event)
        .map_err(|e| PgError::Other(format!("cannot encode the event for the inbox: {e}")))?;
    let params: Params = &[
        (&cluster, Type::TEXT),
        (&host, Type::TEXT),
        (&json, Type::TEXT),
        (&key, Type::TEXT),
    ];
    let row = pg::query_one(client, "push", PUSH_SQL, params).await?;
    let id: Option<i64> = sql::get(&row, 0)?;
    id.ok_or_else(|| {
        PgError::Other(format!(
            "inbox key {key} of cluster {cluster} was withdrawn while it was pushed again"
        ))
    })
}

/// What [`withdraw`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// The row was pending and untaken: deleted, it will never be appended.
    Withdrawn,
    /// No row has the key: it was never pushed (or was purged).
    Absent,
    /// An owner took (or finished) it: its outcome is the owner's.
    Taken,
}

const WITHDRAW_SQL: &str = "WITH d AS (
        DELETE FROM dws_inbox
        WHERE cluster = $1 AND key = $2 AND NOT done AND taken_epoch IS NULL
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM d) > 0,
           EXISTS (SELECT 1 FROM dws_inbox WHERE cluster = $1 AND key = $2)";

/// Takes back the row of `key` unless an owner took it (the row lock of a
/// take in progress is waited for, and a row withdrawn is skipped by
/// takers): a publisher that gives up says "failed" only of what will never
/// be appended.
pub async fn withdraw(
    client: &impl GenericClient,
    cluster: &str,
    key: &str,
) -> Result<Withdrawal, PgError> {
    let params: Params = &[(&cluster, Type::TEXT), (&key, Type::TEXT)];
    let row = pg::query_one(client, "withdraw", WITHDRAW_SQL, params).await?;
    let deleted: bool = sql::get(&row, 0)?;
    let existed: bool = sql::get(&row, 1)?;
    Ok(match (deleted, existed) {
        (true, _) => Withdrawal::Withdrawn,
        (false, false) => Withdrawal::Absent,
        (false, true) => Withdrawal::Taken,
    })
}

/// Pending rows not taken under this epoch — with `$4`, those too (the
/// taker's session broke before it finished them): the keys make a second
/// append a duplicate.
const TAKE_SQL: &str = "UPDATE dws_inbox SET taken_epoch = $2
     WHERE cluster = $1 AND id IN (
        SELECT id FROM dws_inbox
        WHERE cluster = $1 AND NOT done AND (taken_epoch IS DISTINCT FROM $2 OR $4)
        ORDER BY id LIMIT $3
        FOR UPDATE SKIP LOCKED)
     RETURNING id, event::text, key";

/// A taken row: its id, its idempotency key (`None` from a busd before
/// keys) and its event.
pub type Taken = (i64, Option<String>, NewEvent);

/// Takes up to `limit` pending rows, oldest first, for the owner of
/// `epoch` (see the module doc); with `again`, also the rows this epoch
/// took before without finishing them (the first take of a new session).
/// A row whose event cannot be read (written by a newer busd) is finished
/// at once with the reason, never returned.
pub async fn take(
    client: &mut Client,
    cluster: &str,
    epoch: i64,
    limit: i64,
    again: bool,
) -> Result<Vec<Taken>, PgError> {
    crate::pg::bounded("take", async move {
        if epoch <= 0 {
            return Err(PgError::Fenced(NO_LEASE.into()));
        }
        let tx = sql::begin(client).await?;
        check_epoch(&tx, cluster, epoch).await?;
        let rows = sql::query(
            &tx,
            TAKE_SQL,
            &[
                (&cluster, Type::TEXT),
                (&epoch, Type::INT8),
                (&limit, Type::INT8),
                (&again, Type::BOOL),
            ],
        )
        .await?;
        let mut taken = Vec::with_capacity(rows.len());
        let mut unreadable = vec![];
        for row in rows {
            let id: i64 = sql::get(&row, 0)?;
            let json: String = sql::get(&row, 1)?;
            let key: Option<String> = sql::get(&row, 2)?;
            match serde_json::from_str::<NewEvent>(&json) {
                Ok(ev) => taken.push((id, key, ev)),
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
        sql::commit(tx).await?;
        taken.sort_by_key(|(id, _, _)| *id);
        Ok(taken)
    })
    .await
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
    crate::pg::bounded("finish", async move {
        let ids: Vec<i64> = results.iter().map(|(id, _)| *id).collect();
        let seqs = results
            .iter()
            .map(|(_, r)| to_db(r.seq))
            .collect::<Result<Vec<i64>, _>>()?;
        let dups: Vec<bool> = results.iter().map(|(_, r)| r.duplicate).collect();
        let eids: Vec<&str> = results.iter().map(|(_, r)| r.event_id.as_str()).collect();
        let errs: Vec<Option<&str>> = results.iter().map(|(_, r)| r.error.as_deref()).collect();
        let row = sql::query_one(
            client,
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
        .await?;
        let n: i64 = sql::get(&row, 0)?;
        Ok(n.max(0) as u64)
    })
    .await
}

const RESULT_SQL: &str = "SELECT id, done, coalesce(seq, 0), coalesce(duplicate, false),
            coalesce(event_id, ''), error
     FROM dws_inbox WHERE cluster = $1 AND id = ANY($2) ORDER BY id";

fn row_result(row: &Row) -> Result<(i64, Option<InboxResult>), PgError> {
    let id: i64 = sql::get(row, 0)?;
    let done: bool = sql::get(row, 1)?;
    if !done {
        return Ok((id, None));
    }
    Ok((
        id,
        Some(InboxResult {
            seq: from_db(sql::get(row, 2)?)?,
            duplicate: sql::get(row, 3)?,
            event_id: sql::get(row, 4)?,
            error: sql::get(row, 5)?,
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
    let params: Params = &[(&cluster, Type::TEXT), (&ids, Type::INT8_ARRAY)];
    let rows = pg::query(client, "results", RESULT_SQL, params).await?;
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
    let params: Params = &[(&cluster, Type::TEXT), (&secs, Type::FLOAT8)];
    pg::execute(client, "purge_done", PURGE_SQL, params).await
}
