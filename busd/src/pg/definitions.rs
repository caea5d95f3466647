//! The named subscriptions' definitions (`dws_subscription`): every host's
//! store reads them at recovery ([`definitions`]) so it adopts what other
//! hosts created; a host creating one claims it first
//! ([`claim_definition`], one winner by the primary key), gives back a claim
//! its request did not use ([`release_definition`]), and reads one
//! ([`definition`]). A definition's record is JSON here, read as whatever
//! record type the caller names (the store's `SubRecord`): this layer knows
//! the table, not the store.

use serde::de::DeserializeOwned;
use tokio_postgres::{types::Type, GenericClient, Row};

use crate::pg::{self, Params, PgError};

fn q(e: tokio_postgres::Error) -> PgError {
    PgError::query(&e)
}

/// A named subscription as the cluster knows it: the record its first
/// host saved (the spec — patterns, filter, TTL, poison policy — is what
/// counts; its delivery state is that host's at the time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition<R> {
    pub id: String,
    pub delivery: String,
    pub record: R,
    pub created_at_unix_ms: i64,
}

const DEFINITIONS_SQL: &str = "SELECT id, delivery, record::text,
            (extract(epoch FROM created_at) * 1000)::bigint
     FROM dws_subscription WHERE cluster = $1 AND ($2::text IS NULL OR id = $2)
     ORDER BY created_at, id";

fn definition_of<R: DeserializeOwned>(r: &Row) -> Result<Definition<R>, PgError> {
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
pub async fn definitions<R: DeserializeOwned>(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<Vec<Definition<R>>, PgError> {
    let none: Option<&str> = None;
    let params: Params = &[(&cluster, Type::TEXT), (&none, Type::TEXT)];
    let rows = pg::query(client, "definitions", DEFINITIONS_SQL, params).await?;
    rows.iter().map(definition_of).collect()
}

const CLAIM_SQL: &str = "INSERT INTO dws_subscription (cluster, id, delivery, record)
     VALUES ($1, $2, $3, $4::jsonb) ON CONFLICT (cluster, id) DO NOTHING";

/// Makes `record_json` the definition of subscription `id` unless the
/// cluster has one; returns whether it did, and the cluster's definition:
/// ours, or the one that was there (or won a concurrent insert: the primary
/// key decides, and the read after the insert sees the winner's committed
/// row).
pub async fn claim_definition<R: DeserializeOwned>(
    client: &impl GenericClient,
    cluster: &str,
    id: &str,
    shared: bool,
    record_json: &str,
) -> Result<(bool, R), PgError> {
    pg::bounded("claim_definition", async move {
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
        definition::<R>(client, cluster, id)
            .await?
            .map(|d| (inserted > 0, d.record))
            .ok_or_else(|| {
                PgError::Other(format!("the definition of {id} vanished as it was made"))
            })
    })
    .await
}

const RELEASE_SQL: &str = "DELETE FROM dws_subscription s WHERE s.cluster = $1 AND s.id = $2
       AND NOT EXISTS (SELECT 1 FROM dws_cursor c WHERE c.cluster = $1 AND c.subscription = $2)";

/// Removes the definition of `id` unless a host has a cursor of it.
pub async fn release_definition(
    client: &impl GenericClient,
    cluster: &str,
    id: &str,
) -> Result<(), PgError> {
    let params: Params = &[(&cluster, Type::TEXT), (&id, Type::TEXT)];
    pg::execute(client, "release_definition", RELEASE_SQL, params).await?;
    Ok(())
}

/// One named subscription of the cluster, if it exists (a consumer on this
/// host attaching to a subscription created elsewhere: its record becomes
/// this host's instance, `SubRecord::instance_for_host`).
pub async fn definition<R: DeserializeOwned>(
    client: &impl GenericClient,
    cluster: &str,
    id: &str,
) -> Result<Option<Definition<R>>, PgError> {
    let id = Some(id);
    let params: Params = &[(&cluster, Type::TEXT), (&id, Type::TEXT)];
    let rows = pg::query(client, "definition", DEFINITIONS_SQL, params).await?;
    rows.first().map(definition_of).transpose()
}
