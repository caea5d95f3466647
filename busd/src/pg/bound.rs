//! The client-side bound of every statement busd sends to PostgreSQL
//! (issue 35): a statement, or a call's few statements, that gets no answer
//! within it is given up — the caller closes the session and counts the work
//! as an outage. Without it, a path that swallows bytes while TCP sees
//! nothing wrong held every statement on it for as long as the partition
//! lasted. [`query`], [`query_one`], [`query_opt`] and [`execute`] run one
//! typed statement within it; [`sql`] runs one with no bound of its own,
//! inside a [`bounded`] call of several.

use std::time::Duration;

use tokio_postgres::{
    types::{ToSql, Type},
    GenericClient, Row,
};

use super::PgError;

/// One statement's parameters, each with its type (`query_typed`): no
/// round trip to prepare it.
pub type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// The rows of one statement, within [`STATEMENT_BOUND`] (`what` names it
/// in the outage).
pub async fn query(
    client: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, PgError> {
    bounded(what, sql::query(client, sql, params)).await
}

/// The one row of one statement, within [`STATEMENT_BOUND`].
pub async fn query_one(
    client: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Row, PgError> {
    bounded(what, sql::query_one(client, sql, params)).await
}

/// The row, if any, of one statement, within [`STATEMENT_BOUND`].
pub async fn query_opt(
    client: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<Row>, PgError> {
    bounded(what, sql::query_opt(client, sql, params)).await
}

/// How many rows one statement changed, within [`STATEMENT_BOUND`].
pub async fn execute(
    client: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, PgError> {
    bounded(what, sql::execute(client, sql, params)).await
}

/// One typed statement (or a transaction's start and end), its failure a
/// [`PgError`], with no bound of its own: for the statements of one call
/// that [`bounded`] bounds together, or that a caller bounds with its own
/// timing (the lease's heartbeat).
pub mod sql {
    use tokio_postgres::{types::FromSql, Client, GenericClient, Row, Transaction};

    use super::{Params, PgError};

    fn failed(e: tokio_postgres::Error) -> PgError {
        PgError::query(&e)
    }

    /// The rows of one statement.
    pub async fn query(
        client: &impl GenericClient,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, PgError> {
        client.query_typed(sql, params).await.map_err(failed)
    }

    /// The one row of one statement (none, or more, fail).
    pub async fn query_one(
        client: &impl GenericClient,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Row, PgError> {
        client.query_typed_one(sql, params).await.map_err(failed)
    }

    /// The row, if any, of one statement (more than one fail).
    pub async fn query_opt(
        client: &impl GenericClient,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Option<Row>, PgError> {
        client.query_typed_opt(sql, params).await.map_err(failed)
    }

    /// How many rows one statement changed.
    pub async fn execute(
        client: &impl GenericClient,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, PgError> {
        client.execute_typed(sql, params).await.map_err(failed)
    }

    /// Starts a transaction (rolled back when dropped uncommitted).
    pub async fn begin(client: &mut Client) -> Result<Transaction<'_>, PgError> {
        client.transaction().await.map_err(failed)
    }

    /// Commits `tx`.
    pub async fn commit(tx: Transaction<'_>) -> Result<(), PgError> {
        tx.commit().await.map_err(failed)
    }

    /// Column `idx` of `row`, as `T`.
    pub fn get<'a, T: FromSql<'a>>(row: &'a Row, idx: usize) -> Result<T, PgError> {
        row.try_get(idx).map_err(failed)
    }
}

/// The client-side bound of every statement (or short transaction) busd
/// sends: past it the answer is given up for lost — the session is closed
/// and the work counts as an outage ([`PgError::Unreachable`]). TCP alone
/// cannot tell a path that swallows bytes without resetting (a stuck
/// middlebox, a proxy, a half-open route: its keepalives are answered)
/// from a slow server, so without it a statement on such a path waits for
/// as long as the partition lasts. Far above a healthy statement's time;
/// above [`super::IDLE_IN_TRANSACTION_BOUND`], so by the time an append that gave
/// up is looked for in the log, its transaction either committed or never
/// will.
pub const STATEMENT_BOUND: Duration = Duration::from_secs(5);
/// How long an owner's append waits for the server (and the lease) to come
/// back before it fails, and the cluster task contends for the lease again.
pub const OUTAGE_BOUND: Duration = Duration::from_secs(60);
/// [`STATEMENT_BOUND`] of a schema migration, which may wait for another
/// host's (`schema::migrate` bounds that wait at 30 s itself).
pub const MIGRATION_BOUND: Duration = Duration::from_secs(40);
/// Runs `work` (the statements of one call) within [`STATEMENT_BOUND`];
/// past it, an outage naming `what` — the caller must close the session.
pub async fn bounded<T>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, PgError>>,
) -> Result<T, PgError> {
    bounded_by(STATEMENT_BOUND, what, work).await
}

/// [`bounded`] with another bound.
pub async fn bounded_by<T>(
    bound: Duration,
    what: &str,
    work: impl std::future::Future<Output = Result<T, PgError>>,
) -> Result<T, PgError> {
    match tokio::time::timeout(bound, work).await {
        Ok(r) => r,
        Err(_) => Err(no_answer(bound, what)),
    }
}

/// How a statement that got no answer within `bound` fails.
pub fn no_answer(bound: Duration, what: &str) -> PgError {
    PgError::Unreachable(format!(
        "PostgreSQL did not answer within {}s ({what}): the server or the network to it is stuck",
        bound.as_secs_f64()
    ))
}
