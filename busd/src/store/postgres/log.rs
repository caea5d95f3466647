//! The cluster's event log in PostgreSQL (`dws_event`, head and epoch in
//! `dws_cluster`): the owner's [`append`] and retention ([`delete_below`], held back
//! by what the hosts' named subscriptions still need: [`held_from`],
//! [`retention_floor`]). What every host reads — the events after a seq
//! and the cluster's row — is `pg::log`'s.
//!
//! Rules the functions keep:
//! - **One writer, gapless.** [`append`] locks the cluster's row
//!   `FOR UPDATE` (not `FOR SHARE`: the same transaction advances
//!   `head_seq` in that row, and two share-lockers that both upgrade would
//!   deadlock), refuses a stale epoch ([`PgError::Fenced`]), a lease
//!   expired on the database's clock when its insert runs (read after the
//!   lock was granted, never before the wait for it) and a batch that
//!   does not start at `head + 1`. Appends are therefore serialized and
//!   commit in seq order, so a reader never sees a later batch without the
//!   earlier ones.
//! - **One statement per batch.** The rows go in with one
//!   `INSERT … SELECT … FROM unnest(…)`, in the same statement as the head's
//!   update and the one `NOTIFY` of the batch (channel [`LOG_CHANNEL`],
//!   payload `cluster:head`, delivered at commit). Every statement is sent
//!   with its parameter types (`query_typed`): one round trip, no prepare;
//!   every call gives up after `STATEMENT_BOUND` (`bound.rs`).
//! - **The head event stays.** [`delete_below`] never deletes the newest
//!   event, so the log always carries the seq counter, like the disk
//!   store's newest segment. It deletes in batches of [`DELETE_BATCH`] rows,
//!   each its own short transaction.
//! - **Retention waits for every host.** The owner deletes nothing that a
//!   host's per-host named subscription still needs as saved in
//!   `dws_cursor` (everything after its cursor, and its parked events),
//!   unless the log would then hold more than the hard cap (see
//!   [`retention_floor`]); a host that needed what the cap deleted reports
//!   it as a gap when it reads on or recovers.

use std::sync::Arc;

use super::PgError;
use crate::{
    eventlog::LoggedEvent,
    pg::{sql, Client, GenericClient, Refusal, Refused, Type},
};

/// The channel of the one notification per committed batch.
pub const LOG_CHANNEL: &str = "dws_log";
/// Rows one retention statement deletes at most.
pub const DELETE_BATCH: i64 = 10_000;

pub use crate::pg::log::{cluster_row, read_after, ClusterRow};
pub(crate) use crate::pg::{fence::NO_LEASE, from_db, to_db};

/// The payload of the log's notification: `cluster:head`.
pub fn notify_payload(cluster: &str, head: u64) -> String {
    format!("{cluster}:{head}")
}

/// The head a [`LOG_CHANNEL`] payload announces, if it is `cluster`'s.
pub fn parse_notify(payload: &str, cluster: &str) -> Option<u64> {
    let (c, head) = payload.rsplit_once(':')?;
    (c == cluster).then(|| head.parse().ok()).flatten()
}

/// Locks the cluster's row; the lease's expiry is read only after the lock
/// is granted, by [`APPEND_SQL`] (a lock holder that changed nothing gives
/// a waiter the row as it was before the wait, clock included).
const LOCK_SQL: &str = "SELECT head_seq, epoch FROM dws_cluster WHERE cluster = $1 FOR UPDATE";

/// The rows, the head and the notification: one statement, run only while
/// the lease is unexpired on the database's clock *now*, with the row
/// locked (`live`, read once: a `WITH` of volatile functions is
/// materialized). It also bounds how long the transaction may then sit
/// idle before its `COMMIT` arrives to what is left of the lease (at most
/// `$11` ms): a `COMMIT` held up on the way past the expiry finds its
/// session ended by the server, so an append never commits after its
/// lease ran out. A data-modifying `WITH` runs to completion whether or
/// not the outer query reads it.
const APPEND_SQL: &str = "WITH live AS (
        SELECT t.now < c.lease_expires_at AS ok,
               CASE WHEN t.now < c.lease_expires_at THEN
                   set_config('idle_in_transaction_session_timeout',
                       greatest(1, least($11, floor(extract(epoch FROM
                           c.lease_expires_at - t.now) * 1000)))::bigint::text, true)
               END AS idle
        FROM dws_cluster c, (SELECT clock_timestamp() AS now) t
        WHERE c.cluster = $1 AND c.lease_expires_at IS NOT NULL
    ), ins AS (
        INSERT INTO dws_event
            (cluster, seq, scope, event_id, event_type, route, received_unix_ms, encoded)
        SELECT $1, u.* FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[],
                                   $7::bigint[], $8::bytea[]) AS u, live
        WHERE live.ok
    ), head AS (
        UPDATE dws_cluster SET head_seq = $9 FROM live WHERE cluster = $1 AND live.ok
    )
    SELECT coalesce((SELECT ok FROM live), false),
           (SELECT CASE WHEN ok THEN pg_notify('dws_log', $10) END FROM live)";

/// Why a batch cannot be appended after `head`, if it cannot.
pub fn check_batch(head: u64, events: &[Arc<LoggedEvent>]) -> Option<String> {
    let first = events.first()?.seq;
    if first != head + 1 {
        return Some(format!(
            "the batch starts at seq {first}, but the cluster's log ends at {head}: \
             appending it would leave the log with a gap or an overlap (the owner's \
             hub is not caught up with the log)"
        ));
    }
    events
        .iter()
        .zip(first..)
        .find(|(e, want)| e.seq != *want)
        .map(|(e, want)| {
            format!(
                "the batch is not consecutive: seq {} where {want} belongs",
                e.seq
            )
        })
}

/// Appends `events` (consecutive seqs, starting at the log's head + 1) as
/// the owner of `epoch`, in one transaction; returns the new head. Refuses
/// with [`PgError::Fenced`] when the cluster's epoch is not `epoch` (or the
/// cluster has no row, or `epoch` is 0: nobody's), with
/// [`PgError::Unreachable`] when the epoch's lease expired on the database's
/// clock (retried once the lease is back), and with [`PgError::Other`] when the batch does not
/// continue the log or repeats a retained event id of its dedup scope.
pub async fn append(
    client: &mut Client,
    cluster: &str,
    epoch: i64,
    events: &[Arc<LoggedEvent>],
) -> Result<u64, PgError> {
    crate::store::postgres::bounded("append", async move {
        if epoch <= 0 {
            return Err(PgError::Fenced(NO_LEASE.into()));
        }
        let tx = sql::begin(client).await?;
        let row = sql::query_opt(&tx, LOCK_SQL, &[(&cluster, Type::TEXT)]).await?;
        let (head, current): (i64, i64) = match row {
            Some(row) => (sql::get(&row, 0)?, sql::get(&row, 1)?),
            None => {
                return Err(PgError::Fenced(
                    super::fence::fenced(epoch, None).unwrap_or_default(),
                ))
            }
        };
        if let Some(why) = super::fence::fenced(epoch, Some(current)) {
            return Err(PgError::Fenced(why));
        }
        let head = from_db(head)?;
        let Some(last) = events.last() else {
            return Ok(head);
        };
        if let Some(why) = check_batch(head, events) {
            return Err(PgError::Other(format!(
                "cannot append to the log of cluster {cluster}: {why}"
            )));
        }
        let new_head = to_db(last.seq)?;
        let mut seqs = Vec::with_capacity(events.len());
        let mut received = Vec::with_capacity(events.len());
        for e in events {
            seqs.push(to_db(e.seq)?);
            received.push(e.received_at_unix_ms);
        }
        let scopes: Vec<&str> = events.iter().map(|e| e.scope.as_str()).collect();
        let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
        let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        let routes: Vec<&str> = events.iter().map(|e| e.route.as_str()).collect();
        // Events on their way in are resident: a read cannot fail here.
        let bodies: Vec<bytes::Bytes> = events
            .iter()
            .map(|e| e.encoded().unwrap_or_default())
            .collect();
        let encoded: Vec<&[u8]> = bodies.iter().map(|b| &b[..]).collect();
        let payload = notify_payload(cluster, last.seq);
        let idle_ms = super::IDLE_IN_TRANSACTION_BOUND.as_millis() as i64;
        let row = sql::query_one(
            &tx,
            APPEND_SQL,
            &[
                (&cluster, Type::TEXT),
                (&seqs, Type::INT8_ARRAY),
                (&scopes, Type::TEXT_ARRAY),
                (&ids, Type::TEXT_ARRAY),
                (&types, Type::TEXT_ARRAY),
                (&routes, Type::TEXT_ARRAY),
                (&received, Type::INT8_ARRAY),
                (&encoded, Type::BYTEA_ARRAY),
                (&new_head, Type::INT8),
                (&payload, Type::TEXT),
                (&idle_ms, Type::INT8),
            ],
        )
        .await
        .map_err(|e| append_error(e, cluster))?;
        let live: bool = sql::get(&row, 0)?;
        if !live {
            // Still this host's epoch, but the lease ran out: the lease task
            // takes it back (same epoch + 1) unless another host took it;
            // the append waits for that like for an outage. Nothing was
            // written; the transaction rolls back.
            return Err(PgError::Unreachable(
                super::fence::fenced_at(epoch, Some((epoch, false))).unwrap_or_default(),
            ));
        }
        sql::commit(tx).await?;
        Ok(last.seq)
    })
    .await
}

/// A failed insert: a repeated event id is named as such.
fn append_error(e: PgError, cluster: &str) -> PgError {
    match e {
        PgError::Refused(Refused {
            why: Refusal::Unique,
            constraint,
            detail,
            ..
        }) => {
            let what = match constraint.as_deref() {
                Some("dws_event_dedup") => {
                    "an event id of the batch is already in the log (same dedup scope): \
                     the owner's dedup window missed it"
                }
                _ => "a seq of the batch is already in the log",
            };
            PgError::Other(format!(
                "cannot append to the log of cluster {cluster}: {what} ({detail})"
            ))
        }
        e => e,
    }
}

const OLDEST_SQL: &str = "SELECT min(seq) FROM dws_event WHERE cluster = $1";

/// The oldest seq the log holds (`None`: it is empty).
pub async fn oldest_seq(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<Option<u64>, PgError> {
    let row =
        crate::pg::query_one(client, "oldest_seq", OLDEST_SQL, &[(&cluster, Type::TEXT)]).await?;
    sql::get::<Option<i64>>(&row, 0)?.map(from_db).transpose()
}

/// One batch: the oldest rows below `$2`, never the head's.
const DELETE_SQL: &str = "DELETE FROM dws_event WHERE cluster = $1 AND seq IN (
        SELECT seq FROM dws_event
        WHERE cluster = $1 AND seq < $2
          AND seq < (SELECT head_seq FROM dws_cluster WHERE cluster = $1)
        ORDER BY seq LIMIT $3)";

/// Deletes the events below `seq` (except the newest event, which stays),
/// [`DELETE_BATCH`] rows per statement; returns how many rows went.
pub async fn delete_below(
    client: &impl GenericClient,
    cluster: &str,
    seq: u64,
) -> Result<u64, PgError> {
    let below = to_db(seq)?;
    let mut total = 0;
    loop {
        let params: crate::pg::Params = &[
            (&cluster, Type::TEXT),
            (&below, Type::INT8),
            (&DELETE_BATCH, Type::INT8),
        ];
        let n = crate::pg::execute(client, "deleting old events", DELETE_SQL, params).await?;
        total += n;
        if n < DELETE_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// The cluster's head, and the lowest seq any host's per-host named
/// subscription still needs as its host last saved it: the seq after its
/// cursor, or its oldest parked event. Shared subscriptions hold nothing
/// here (their events go through claims).
const HELD_SQL: &str = "SELECT
        (SELECT head_seq FROM dws_cluster WHERE cluster = $1),
        (SELECT min(LEAST(
            (c.record->>'cursor')::bigint + 1,
            (SELECT min((p->>'seq')::bigint) FROM jsonb_array_elements(
                CASE WHEN jsonb_typeof(c.record->'parked') = 'array'
                     THEN c.record->'parked' ELSE '[]'::jsonb END) AS p)))
         FROM dws_cursor c
         JOIN dws_subscription s ON s.cluster = c.cluster AND s.id = c.subscription
         WHERE c.cluster = $1 AND s.delivery <> 'shared')";

/// The cluster's head (0 without its row) and the lowest seq some host's
/// named subscription still needs (see [`HELD_SQL`]), if any holds one.
pub async fn held_from(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<(u64, Option<u64>), PgError> {
    let row =
        crate::pg::query_one(client, "held_from", HELD_SQL, &[(&cluster, Type::TEXT)]).await?;
    let head: Option<i64> = sql::get(&row, 0)?;
    let held: Option<i64> = sql::get(&row, 1)?;
    Ok((
        from_db(head.unwrap_or(0))?,
        held.map(|h| from_db(h.max(0))).transpose()?,
    ))
}

/// Where retention may delete up to (exclusive): what the owner itself no
/// longer needs (`wanted`), held back to what the hosts still need
/// (`held`), but never so far that the log keeps more than `cap` events
/// below its head.
pub fn retention_floor(wanted: u64, held: Option<u64>, head: u64, cap: u64) -> u64 {
    let held = held.map_or(wanted, |h| h.min(wanted));
    let capped = (head + 1).saturating_sub(cap);
    held.max(capped).min(wanted)
}

#[cfg(test)]
mod floor_tests {
    use super::retention_floor;

    #[test]
    fn retention_waits_for_the_hosts_up_to_the_cap() {
        assert_eq!(retention_floor(250, None, 300, 500), 250, "nobody holds");
        assert_eq!(retention_floor(250, Some(4), 300, 500), 4, "a host needs 4");
        assert_eq!(
            retention_floor(250, Some(280), 300, 500),
            250,
            "past the owner's"
        );
        assert_eq!(retention_floor(250, Some(4), 300, 100), 201, "the cap wins");
        assert_eq!(
            retention_floor(150, Some(4), 300, 100),
            150,
            "never above wanted"
        );
        assert_eq!(retention_floor(0, Some(4), 3, 100), 0);
    }
}
