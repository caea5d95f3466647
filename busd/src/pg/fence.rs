//! Fencing: whether a host may still write as the upstream's owner — the
//! rule the cluster store's log and the cluster's coordination tables share. Every append (`log::append`, under `FOR UPDATE`) and
//! every other owner's write ([`check_epoch`], `FOR SHARE`) compares, in its
//! own transaction, the host's epoch with the cluster's and requires the
//! lease to be unexpired on the database's clock — read *after* the row
//! lock was granted, in a later statement (issue 35: read in the locking
//! statement, the clock was the one before the wait). The lease itself (taking,
//! renewing, losing it) is the cluster's coordination
//! (`cluster::db::lease`); this is the part every owner's write needs.

use tokio_postgres::Transaction;

use super::PgError;

/// Locks the cluster's row `FOR SHARE` against a concurrent takeover and
/// reads its epoch.
const LOCK_EPOCH_SQL: &str = "SELECT epoch FROM dws_cluster WHERE cluster = $1 FOR SHARE";
/// Whether the lease is unexpired on the database's clock, read in a
/// statement after [`LOCK_EPOCH_SQL`]: in the same statement the clock
/// would be read before a wait for the lock (a holder that changed nothing
/// hands the waiter the row as it was before), so a lease that expired
/// meanwhile would pass.
const LIVE_SQL: &str =
    "SELECT coalesce(lease_expires_at > clock_timestamp(), false) FROM dws_cluster WHERE cluster = $1";

/// The epoch while the cluster task takes the lease back after losing its
/// session: the owner's appends wait for the new epoch (see
/// `store::postgres::append`).
pub const REGAINING: i64 = -1;

/// Why epoch 0 (or below) cannot append or take: it is nobody's.
pub(crate) const NO_LEASE: &str =
    "this host does not hold the cluster's upstream lease (epoch 0), so it does not own the log";

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
    super::bounded("check_epoch", async move {
        let q = |e: tokio_postgres::Error| PgError::query(&e);
        let locked: Option<i64> = tx
            .query_opt(LOCK_EPOCH_SQL, &[&cluster])
            .await
            .map_err(q)?
            .map(|row| row.get(0));
        let current = match locked {
            Some(e) => {
                let live: bool = tx.query_one(LIVE_SQL, &[&cluster]).await.map_err(q)?.get(0);
                Some((e, live))
            }
            None => None,
        };
        match fenced_at(epoch, current) {
            None => Ok(()),
            Some(why) => Err(PgError::Fenced(why)),
        }
    })
    .await
}
