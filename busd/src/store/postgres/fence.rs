//! Fencing in the cluster store: whether a host may still write as the
//! upstream's owner. Every append (`log::append`, under `FOR UPDATE`) and
//! every other owner's write ([`check_epoch`], `FOR SHARE`) compares, in its
//! own transaction, the host's epoch with the cluster's and requires the
//! lease to be unexpired on the database's clock. The lease itself (taking,
//! renewing, losing it) is the cluster's coordination
//! (`cluster::db::lease`); this is the part the log needs.

use tokio_postgres::Transaction;

use super::PgError;

/// What an append transaction runs to check that its host still owns the
/// upstream: the epoch and whether the lease is unexpired on the database's
/// clock, with the row locked against a concurrent takeover.
pub const CHECK_EPOCH_SQL: &str =
    "SELECT epoch, coalesce(lease_expires_at > clock_timestamp(), false)
     FROM dws_cluster WHERE cluster = $1 FOR SHARE";

/// [`fenced`], and the lease's expiry: `current` is the cluster's epoch
/// and whether its lease is unexpired on the database's clock.
pub fn fenced_at(our_epoch: i64, current: Option<(i64, bool)>) -> Option<String> {
    fenced(our_epoch, current.map(|(e, _)| e)).or_else(|| match current {
        Some((_, false)) => Some(format!(
            "the upstream lease (epoch {our_epoch}) expired on the database's clock \
             before this append: the owner did not renew it in time"
        )),
        _ => None,
    })
}

/// Whether an append under `our_epoch` must be refused, given the cluster's
/// current epoch (`None`: the cluster has no row).
pub fn fenced(our_epoch: i64, current: Option<i64>) -> Option<String> {
    match current {
        Some(e) if e == our_epoch => None,
        Some(e) => Some(format!(
            "the upstream lease moved on (epoch {e}, this host held {our_epoch}): \
             another host owns the upstream now"
        )),
        None => Some(format!(
            "the cluster's row is gone (this host held epoch {our_epoch})"
        )),
    }
}

/// In an append transaction: fails with [`PgError::Fenced`] unless the
/// cluster's epoch is still `epoch` and its lease unexpired. Locks the cluster's row `FOR SHARE`
/// until the transaction ends, so no takeover commits in between. (An
/// append that will also advance `head_seq` in that row should lock it
/// `FOR UPDATE` instead and compare with [`fenced`]: two `FOR SHARE`
/// holders that both upgrade would deadlock.)
pub async fn check_epoch(tx: &Transaction<'_>, cluster: &str, epoch: i64) -> Result<(), PgError> {
    let current: Option<(i64, bool)> = tx
        .query_opt(CHECK_EPOCH_SQL, &[&cluster])
        .await
        .map_err(|e| PgError::query(&e))?
        .map(|row| (row.get(0), row.get(1)));
    match fenced_at(epoch, current) {
        None => Ok(()),
        Some(why) => Err(PgError::Fenced(why)),
    }
}
