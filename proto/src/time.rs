//! Timer helpers shared by `busd` and `dws`: one rule for an optional
//! deadline in a `select!` loop.

use tokio::time::Instant;

/// Sleeps until `deadline`; never resolves when there is none, so a
/// `select!` arm with no deadline simply never fires.
pub async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
