//! Shared delivery's claims (`dws_claim`): which host delivers which event
//! of a shared subscription. A host claims the matching events it wants to
//! deliver; `INSERT … ON CONFLICT DO UPDATE … WHERE` gives each event to
//! one host (a concurrent claimer waits on the row and then finds it held),
//! and takes over a claim only once it expired (its host stopped renewing
//! it) — counting the delivery again. An acked event's claim is `done`, so
//! nobody claims it again; a host that lets a consumer go releases what it
//! held so another host takes it at once.

use std::time::Duration;

use tokio_postgres::{types::Type, GenericClient};

use super::PgError;

fn q(e: tokio_postgres::Error) -> PgError {
    PgError::query(&e)
}

fn seqs_db(seqs: &[u64]) -> Vec<i64> {
    seqs.iter().map(|&s| s as i64).collect()
}

const CLAIM_SQL: &str = "
INSERT INTO dws_claim (cluster, subscription, seq, host, claimed_until, deliveries)
SELECT $1, $2, s, $3, now() + make_interval(secs => $5), 1 FROM unnest($4::bigint[]) AS s
ON CONFLICT (cluster, subscription, seq) DO UPDATE
    SET host = EXCLUDED.host, claimed_until = EXCLUDED.claimed_until,
        deliveries = dws_claim.deliveries + 1
    WHERE NOT dws_claim.done AND dws_claim.claimed_until < now()
RETURNING seq, deliveries";

/// Claims for `host` those of `seqs` (events of `subscription`) that nobody
/// holds, or whose holder's claim expired; returns `(seq, deliveries)` of
/// the ones now ours (deliveries counts this one).
pub async fn claim(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
    host: &str,
    seqs: &[u64],
    hold: Duration,
) -> Result<Vec<(u64, u32)>, PgError> {
    if seqs.is_empty() {
        return Ok(vec![]);
    }
    let seqs = seqs_db(seqs);
    let secs = hold.as_secs_f64();
    let rows = client
        .query_typed(
            CLAIM_SQL,
            &[
                (&cluster, Type::TEXT),
                (&subscription, Type::TEXT),
                (&host, Type::TEXT),
                (&seqs, Type::INT8_ARRAY),
                (&secs, Type::FLOAT8),
            ],
        )
        .await
        .map_err(q)?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i32>(1).max(1) as u32))
        .collect())
}

/// Of `seqs`, those another host finished (acked): never claimable again.
pub async fn done_of(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
    seqs: &[u64],
) -> Result<Vec<u64>, PgError> {
    if seqs.is_empty() {
        return Ok(vec![]);
    }
    let seqs = seqs_db(seqs);
    let rows = client
        .query_typed(
            "SELECT seq FROM dws_claim WHERE cluster = $1 AND subscription = $2 \
             AND seq = ANY($3) AND done",
            &[
                (&cluster, Type::TEXT),
                (&subscription, Type::TEXT),
                (&seqs, Type::INT8_ARRAY),
            ],
        )
        .await
        .map_err(q)?;
    Ok(rows.iter().map(|r| r.get::<_, i64>(0) as u64).collect())
}

/// Keeps every open claim of `host` alive for another `hold`.
pub async fn renew(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
    hold: Duration,
) -> Result<u64, PgError> {
    let secs = hold.as_secs_f64();
    client
        .execute_typed(
            "UPDATE dws_claim SET claimed_until = now() + make_interval(secs => $3) \
             WHERE cluster = $1 AND host = $2 AND NOT done",
            &[
                (&cluster, Type::TEXT),
                (&host, Type::TEXT),
                (&secs, Type::FLOAT8),
            ],
        )
        .await
        .map_err(q)
}

/// Marks `seqs` of `subscription` acked (only claims `host` holds).
pub async fn finish(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
    host: &str,
    seqs: &[u64],
) -> Result<u64, PgError> {
    set(client, "done = true", cluster, subscription, host, seqs).await
}

/// Gives `seqs` back: expired at once, so another host claims them.
pub async fn release(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
    host: &str,
    seqs: &[u64],
) -> Result<u64, PgError> {
    set(
        client,
        "claimed_until = now() - interval '1 second'",
        cluster,
        subscription,
        host,
        seqs,
    )
    .await
}

async fn set(
    client: &impl GenericClient,
    what: &str,
    cluster: &str,
    subscription: &str,
    host: &str,
    seqs: &[u64],
) -> Result<u64, PgError> {
    if seqs.is_empty() {
        return Ok(0);
    }
    let seqs = seqs_db(seqs);
    client
        .execute_typed(
            &format!(
                "UPDATE dws_claim SET {what} WHERE cluster = $1 AND subscription = $2 \
                 AND host = $3 AND seq = ANY($4) AND NOT done"
            ),
            &[
                (&cluster, Type::TEXT),
                (&subscription, Type::TEXT),
                (&host, Type::TEXT),
                (&seqs, Type::INT8_ARRAY),
            ],
        )
        .await
        .map_err(q)
}
