//! What `status` shows of a cluster beyond the log: its hosts (`dws_host`:
//! [`register`] at start, with the incarnation of this run, [`heartbeat`] while running, [`unregister`] at a
//! clean exit, [`list`]), the named subscriptions' definitions
//! ([`definitions`], [`definition`], [`claim_definition`]) and every host's cursor of them
//! ([`cursors`]).

use tokio_postgres::{types::Type, GenericClient, Row};

use super::PgError;
use crate::store::SubRecord;

/// One host of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRow {
    pub host: String,
    pub pid: i32,
    pub build: String,
    pub started_at_unix_ms: i64,
    /// How long ago its last heartbeat was, by the database's clock.
    pub heartbeat_age_ms: i64,
}

/// One host's cursor of a named subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorRow {
    pub subscription: String,
    /// `per-host` (v1), or `shared`.
    pub delivery: String,
    pub host: String,
    pub cursor: u64,
    pub saved_at_unix_ms: i64,
}

/// A named subscription as the cluster knows it: the record its first
/// host saved (the spec — patterns, filter, TTL, poison policy — is what
/// counts; its delivery state is that host's at the time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    pub id: String,
    pub delivery: String,
    pub record: SubRecord,
    pub created_at_unix_ms: i64,
}

fn q(e: tokio_postgres::Error) -> PgError {
    PgError::query(&e)
}

const REGISTER_SQL: &str =
    "INSERT INTO dws_host (cluster, host, pid, build, incarnation) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (cluster, host) DO UPDATE
        SET pid = $3, build = $4, incarnation = $5, started_at = now(), heartbeat_at = now()";

/// Records this host and its incarnation (this busd run, whose shared
/// delivery claims are its own); again after a restart: the row is
/// replaced.
pub async fn register(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
    pid: i32,
    build: &str,
    incarnation: &str,
) -> Result<(), PgError> {
    client
        .execute_typed(
            REGISTER_SQL,
            &[
                (&cluster, Type::TEXT),
                (&host, Type::TEXT),
                (&pid, Type::INT4),
                (&build, Type::TEXT),
                (&incarnation, Type::TEXT),
            ],
        )
        .await
        .map_err(q)?;
    Ok(())
}

/// Refreshes this host's heartbeat; `false` when its row is gone (removed
/// by hand, or by a clean exit of a namesake): register again.
pub async fn heartbeat(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
) -> Result<bool, PgError> {
    let n = client
        .execute_typed(
            "UPDATE dws_host SET heartbeat_at = now() WHERE cluster = $1 AND host = $2",
            &[(&cluster, Type::TEXT), (&host, Type::TEXT)],
        )
        .await
        .map_err(q)?;
    Ok(n > 0)
}

/// Removes this host (a clean exit).
pub async fn unregister(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
) -> Result<(), PgError> {
    client
        .execute_typed(
            "DELETE FROM dws_host WHERE cluster = $1 AND host = $2",
            &[(&cluster, Type::TEXT), (&host, Type::TEXT)],
        )
        .await
        .map_err(q)?;
    Ok(())
}

const LIST_SQL: &str = "SELECT host, pid, build,
            (extract(epoch FROM started_at) * 1000)::bigint,
            (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint
     FROM dws_host WHERE cluster = $1 ORDER BY host";

/// The cluster's hosts, by name.
pub async fn list(client: &impl GenericClient, cluster: &str) -> Result<Vec<HostRow>, PgError> {
    let rows = client
        .query_typed(LIST_SQL, &[(&cluster, Type::TEXT)])
        .await
        .map_err(q)?;
    rows.iter()
        .map(|r| {
            Ok(HostRow {
                host: r.try_get(0).map_err(q)?,
                pid: r.try_get(1).map_err(q)?,
                build: r.try_get(2).map_err(q)?,
                started_at_unix_ms: r.try_get(3).map_err(q)?,
                heartbeat_age_ms: r.try_get(4).map_err(q)?,
            })
        })
        .collect()
}

const CURSORS_SQL: &str = "SELECT c.subscription, s.delivery, c.host, c.record->>'cursor',
            (extract(epoch FROM c.saved_at) * 1000)::bigint
     FROM dws_cursor c
     JOIN dws_subscription s ON s.cluster = c.cluster AND s.id = c.subscription
     WHERE c.cluster = $1 ORDER BY c.subscription, c.host";

/// Every host's cursor of every named subscription, by subscription then
/// host.
pub async fn cursors(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<Vec<CursorRow>, PgError> {
    let rows = client
        .query_typed(CURSORS_SQL, &[(&cluster, Type::TEXT)])
        .await
        .map_err(q)?;
    rows.iter()
        .map(|r| {
            let subscription: String = r.try_get(0).map_err(q)?;
            let cursor: Option<String> = r.try_get(3).map_err(q)?;
            let cursor = cursor.and_then(|c| c.parse::<u64>().ok()).ok_or_else(|| {
                PgError::Other(format!(
                    "the stored cursor of subscription {subscription} is not a seq"
                ))
            })?;
            Ok(CursorRow {
                subscription,
                delivery: r.try_get(1).map_err(q)?,
                host: r.try_get(2).map_err(q)?,
                cursor,
                saved_at_unix_ms: r.try_get(4).map_err(q)?,
            })
        })
        .collect()
}

const DEFINITIONS_SQL: &str = "SELECT id, delivery, record::text,
            (extract(epoch FROM created_at) * 1000)::bigint
     FROM dws_subscription WHERE cluster = $1 AND ($2::text IS NULL OR id = $2)
     ORDER BY created_at, id";

fn definition_of(r: &Row) -> Result<Definition, PgError> {
    let id: String = r.try_get(0).map_err(q)?;
    let json: String = r.try_get(2).map_err(q)?;
    let record = serde_json::from_str(&json).map_err(|e| {
        PgError::Other(format!(
            "the stored definition of subscription {id} cannot be read: {e}"
        ))
    })?;
    Ok(Definition {
        id,
        delivery: r.try_get(1).map_err(q)?,
        record,
        created_at_unix_ms: r.try_get(3).map_err(q)?,
    })
}

/// The cluster's named subscriptions, oldest first.
pub async fn definitions(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<Vec<Definition>, PgError> {
    let none: Option<&str> = None;
    let rows = client
        .query_typed(
            DEFINITIONS_SQL,
            &[(&cluster, Type::TEXT), (&none, Type::TEXT)],
        )
        .await
        .map_err(q)?;
    rows.iter().map(definition_of).collect()
}

const CLAIM_SQL: &str = "INSERT INTO dws_subscription (cluster, id, delivery, record)
     VALUES ($1, $2, $3, $4::jsonb) ON CONFLICT (cluster, id) DO NOTHING";

/// Makes `record_json` the definition of subscription `id` unless the
/// cluster has one; returns whether it did, and the cluster's definition:
/// ours, or the one that was there (or won a concurrent insert: the primary
/// key decides, and the read after the insert sees the winner's committed
/// row).
pub async fn claim_definition(
    client: &impl GenericClient,
    cluster: &str,
    id: &str,
    shared: bool,
    record_json: &str,
) -> Result<(bool, SubRecord), PgError> {
    let delivery = if shared { "shared" } else { "per-host" };
    let inserted = client
        .execute_typed(
            CLAIM_SQL,
            &[
                (&cluster, Type::TEXT),
                (&id, Type::TEXT),
                (&delivery, Type::TEXT),
                (&record_json, Type::TEXT),
            ],
        )
        .await
        .map_err(q)?;
    definition(client, cluster, id)
        .await?
        .map(|d| (inserted > 0, d.record))
        .ok_or_else(|| PgError::Other(format!("the definition of {id} vanished as it was made")))
}

const RELEASE_SQL: &str = "DELETE FROM dws_subscription s WHERE s.cluster = $1 AND s.id = $2
       AND NOT EXISTS (SELECT 1 FROM dws_cursor c WHERE c.cluster = $1 AND c.subscription = $2)";

/// Removes the definition of `id` unless a host has a cursor of it.
pub async fn release_definition(
    client: &impl GenericClient,
    cluster: &str,
    id: &str,
) -> Result<(), PgError> {
    client
        .execute_typed(RELEASE_SQL, &[(&cluster, Type::TEXT), (&id, Type::TEXT)])
        .await
        .map_err(q)?;
    Ok(())
}

/// One named subscription of the cluster, if it exists (a consumer on this
/// host attaching to a subscription created elsewhere: give its record to
/// [`super::store::instance_for_host`]).
pub async fn definition(
    client: &impl GenericClient,
    cluster: &str,
    id: &str,
) -> Result<Option<Definition>, PgError> {
    let id = Some(id);
    let rows = client
        .query_typed(
            DEFINITIONS_SQL,
            &[(&cluster, Type::TEXT), (&id, Type::TEXT)],
        )
        .await
        .map_err(q)?;
    rows.first().map(definition_of).transpose()
}
