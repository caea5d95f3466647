//! What `status` shows of a cluster beyond the log: its hosts (`dws_host`:
//! [`register`] at start, with the incarnation of this run, [`heartbeat`]
//! while running, [`unregister`] at a clean exit, [`list`]) and every
//! host's cursor of the named subscriptions ([`cursors`]), and the lease
//! and the head as the database has them ([`lease`]). The definitions
//! themselves are the store's (`store::postgres::definitions`).

use crate::pg::{self, sql, GenericClient, Params, PgError, Type};

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

/// The cluster's row as `status` shows it, from one snapshot on the
/// database's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRow {
    pub head_seq: u64,
    pub epoch: i64,
    /// The host the lease row names, expired or not.
    pub holder: Option<String>,
    pub since_unix_ms: Option<i64>,
    pub expires_at_unix_ms: Option<i64>,
    /// Negative once it has expired.
    pub expires_in_ms: Option<i64>,
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
    let params: Params = &[
        (&cluster, Type::TEXT),
        (&host, Type::TEXT),
        (&pid, Type::INT4),
        (&build, Type::TEXT),
        (&incarnation, Type::TEXT),
    ];
    pg::execute(client, "register", REGISTER_SQL, params).await?;
    Ok(())
}

/// Refreshes this host's heartbeat; `false` when its row is gone (removed
/// by hand, or by a clean exit of a namesake): register again.
pub async fn heartbeat(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
) -> Result<bool, PgError> {
    let n = pg::execute(
        client,
        "heartbeat",
        "UPDATE dws_host SET heartbeat_at = now() WHERE cluster = $1 AND host = $2",
        &[(&cluster, Type::TEXT), (&host, Type::TEXT)],
    )
    .await?;
    Ok(n > 0)
}

/// Removes this host (a clean exit).
pub async fn unregister(
    client: &impl GenericClient,
    cluster: &str,
    host: &str,
) -> Result<(), PgError> {
    pg::execute(
        client,
        "unregister",
        "DELETE FROM dws_host WHERE cluster = $1 AND host = $2",
        &[(&cluster, Type::TEXT), (&host, Type::TEXT)],
    )
    .await?;
    Ok(())
}

const LIST_SQL: &str = "SELECT host, pid, build,
            (extract(epoch FROM started_at) * 1000)::bigint,
            (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint
     FROM dws_host WHERE cluster = $1 ORDER BY host";

/// The cluster's hosts, by name.
pub async fn list(client: &impl GenericClient, cluster: &str) -> Result<Vec<HostRow>, PgError> {
    let rows = pg::query(client, "list", LIST_SQL, &[(&cluster, Type::TEXT)]).await?;
    rows.iter()
        .map(|r| {
            Ok(HostRow {
                host: sql::get(r, 0)?,
                pid: sql::get(r, 1)?,
                build: sql::get(r, 2)?,
                started_at_unix_ms: sql::get(r, 3)?,
                heartbeat_age_ms: sql::get(r, 4)?,
            })
        })
        .collect()
}

/// A plain `SELECT`: it never waits for a lock (an owner stopped in the
/// middle of an append holds the row's until its session ends).
const LEASE_SQL: &str = "SELECT head_seq, epoch, owner_host,
            (extract(epoch FROM owner_since) * 1000)::bigint,
            (extract(epoch FROM lease_expires_at) * 1000)::bigint,
            (extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000)::bigint
     FROM dws_cluster WHERE cluster = $1";

/// The head, the epoch and the lease (holder, since when, expiry) as the
/// database has them; `None` before the cluster's row exists.
pub async fn lease(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<Option<LeaseRow>, PgError> {
    let Some(r) = sql::query_opt(client, LEASE_SQL, &[(&cluster, Type::TEXT)]).await? else {
        return Ok(None);
    };
    Ok(Some(LeaseRow {
        head_seq: crate::pg::from_db(sql::get(&r, 0)?)?,
        epoch: sql::get(&r, 1)?,
        holder: sql::get(&r, 2)?,
        since_unix_ms: sql::get(&r, 3)?,
        expires_at_unix_ms: sql::get(&r, 4)?,
        expires_in_ms: sql::get(&r, 5)?,
    }))
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
    let rows = pg::query(client, "cursors", CURSORS_SQL, &[(&cluster, Type::TEXT)]).await?;
    rows.iter()
        .map(|r| {
            let subscription: String = sql::get(r, 0)?;
            let cursor: Option<String> = sql::get(r, 3)?;
            let cursor = cursor.and_then(|c| c.parse::<u64>().ok()).ok_or_else(|| {
                PgError::Other(format!(
                    "the stored cursor of subscription {subscription} is not a seq"
                ))
            })?;
            Ok(CursorRow {
                subscription,
                delivery: sql::get(r, 1)?,
                host: sql::get(r, 2)?,
                cursor,
                saved_at_unix_ms: sql::get(r, 4)?,
            })
        })
        .collect()
}
