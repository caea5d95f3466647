//! The cluster store's one working session (the committer's): opened
//! when there is none or the server closed it while idle ([`ensure`]), and
//! ended for good so the server drops its locks ([`close`]). Shared by the
//! store's calls (`store.rs`) and the owner's append through an outage
//! (`append.rs`).

use super::{connect, Driver, PgError, PgSettings};
use crate::pg::Client;

/// How long a closed connection may take to say goodbye.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The connection, opened (again) when there is none or the server closed
/// it while it was idle.
pub(super) async fn ensure<'c>(
    conn: &'c mut Option<(Client, Driver)>,
    settings: &PgSettings,
) -> Result<&'c mut Client, PgError> {
    if conn.as_ref().is_some_and(|(c, _)| c.is_closed()) {
        close(conn.take()).await;
    }
    if conn.is_none() {
        *conn = Some(connect(settings, "store").await?);
    }
    match conn.as_mut() {
        Some((client, _)) => Ok(client),
        None => Err(PgError::Unreachable("PostgreSQL: no connection".into())),
    }
}

/// Ends a session for good: the client is dropped and its driver given
/// [`CLOSE_WAIT`] to send what is queued (a transaction's `ROLLBACK`, then
/// `Terminate`), else aborted, which closes the socket. Either way the
/// server ends the session and its locks go with it — a connection merely
/// dropped would live on while the store's runtime is not driven.
pub(super) async fn close(conn: Option<(Client, Driver)>) {
    let Some((client, mut driver)) = conn else {
        return;
    };
    drop(client);
    if tokio::time::timeout(CLOSE_WAIT, &mut driver).await.is_err() {
        driver.abort();
        let _ = driver.await;
    }
}
