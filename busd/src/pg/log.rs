//! The cluster's log as every host reads it: the events after a seq
//! ([`read_after`]: an owner's recovery, a follower's tail) and the
//! cluster's row ([`cluster_row`]: head, epoch, owner). The owner's writes
//! (append, retention) are the store's (`store::postgres::log`).

use tokio_postgres::{types::Type, GenericClient};

use super::{bounded, from_db, to_db, PgError};
use crate::eventlog::stored::EventRecord;

fn q(e: tokio_postgres::Error) -> PgError {
    PgError::query(&e)
}

/// The cluster's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRow {
    pub head_seq: u64,
    /// 0 until a host first took the upstream lease.
    pub epoch: i64,
    pub owner_host: Option<String>,
    pub owner_since_unix_ms: Option<i64>,
}

const READ_SQL: &str = "SELECT seq, received_unix_ms, scope, event_id, event_type, route, encoded
     FROM dws_event WHERE cluster = $1 AND seq > $2 ORDER BY seq LIMIT $3";

/// Up to `limit` events with seq above `after`, in seq order. The first
/// may be above `after + 1` when retention deleted the ones in between.
pub async fn read_after(
    client: &impl GenericClient,
    cluster: &str,
    after: u64,
    limit: i64,
) -> Result<Vec<EventRecord>, PgError> {
    bounded("read_after", async move {
        let after = to_db(after)?;
        let rows = client
            .query_typed(
                READ_SQL,
                &[
                    (&cluster, Type::TEXT),
                    (&after, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )
            .await
            .map_err(q)?;
        rows.iter()
            .map(|row| {
                Ok(EventRecord {
                    seq: from_db(row.try_get(0).map_err(q)?)?,
                    received_at_unix_ms: row.try_get(1).map_err(q)?,
                    scope: row.try_get(2).map_err(q)?,
                    event_id: row.try_get(3).map_err(q)?,
                    event_type: row.try_get(4).map_err(q)?,
                    route: row.try_get(5).map_err(q)?,
                    encoded: row.try_get(6).map_err(q)?,
                    place: Default::default(),
                })
            })
            .collect()
    })
    .await
}

const ENSURE_SQL: &str = "INSERT INTO dws_cluster (cluster) VALUES ($1) ON CONFLICT DO NOTHING";
const ROW_SQL: &str = "SELECT head_seq, epoch, owner_host,
            (extract(epoch FROM owner_since) * 1000)::bigint
     FROM dws_cluster WHERE cluster = $1";

/// The cluster's row, created (head 0, epoch 0, no owner) if missing.
pub async fn cluster_row(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<ClusterRow, PgError> {
    bounded("cluster_row", async move {
        client
            .execute_typed(ENSURE_SQL, &[(&cluster, Type::TEXT)])
            .await
            .map_err(q)?;
        let row = client
            .query_typed_opt(ROW_SQL, &[(&cluster, Type::TEXT)])
            .await
            .map_err(q)?
            .ok_or_else(|| {
                PgError::Other(format!(
                    "the row of cluster {cluster} vanished while it was read"
                ))
            })?;
        Ok(ClusterRow {
            head_seq: from_db(row.try_get(0).map_err(q)?)?,
            epoch: row.try_get(1).map_err(q)?,
            owner_host: row.try_get(2).map_err(q)?,
            owner_since_unix_ms: row.try_get(3).map_err(q)?,
        })
    })
    .await
}
