//! The upstream owner's lease: which host of a cluster holds the upstream
//! connection.
//!
//! The lease is a session advisory lock, `pg_try_advisory_lock` on a key the
//! server derives from the cluster name (`hashtextextended(cluster, 0)`, so
//! every busd version computes the same key), held by a dedicated connection
//! ([`LeaseSession`]) — never one shared with other work, and never through a
//! pooler, which would hand the session lock to whoever gets the backend
//! next. PostgreSQL releases the lock when that session ends for any reason:
//! the host's process died (at once), `pg_terminate_backend`, a server
//! restart, or a silent network loss (within the keepalive bound of
//! `super::LOSS_BOUND`, set on the server's end by `super::connect`).
//!
//! Winning the lock bumps `dws_cluster.epoch` in one statement and records
//! the owner; the new epoch fences the previous owner: an append
//! (`super::log::append`) locks the cluster's row `FOR UPDATE` and compares
//! the epoch ([`fenced`]); other work done for the owner calls
//! [`check_epoch`], which locks it `FOR SHARE` — either way an acquisition's
//! epoch bump waits for the transactions in flight, and one after it sees
//! the new epoch and fails.
//!
//! While held, a heartbeat ([`Lease::lost`]) asks the session every
//! [`LeaseTiming::heartbeat`] for its backend pid and the cluster's epoch,
//! and reports the lease lost when the session broke, did not answer within
//! [`LeaseTiming::answer_within`], moved to another backend (a pooler) or
//! when the epoch moved on. Losing it closes the session, so a lock the
//! server still holds for us is released. The decisions are pure
//! ([`judge`], [`fenced`]) and unit-tested.

use std::{sync::Arc, time::Duration};

use tokio::{sync::watch, task::JoinHandle};
use tokio_postgres::{Client, Transaction};

use super::{connect, Driver, PgError, PgSettings};

/// `pg_try_advisory_lock` on the cluster's key.
const TRY_LOCK_SQL: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))";
const UNLOCK_SQL: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";
/// Bumps the epoch (creating the cluster's row) and records the owner.
const TAKE_SQL: &str = "INSERT INTO dws_cluster (cluster, epoch, owner_host, owner_since)
     VALUES ($1, 1, $2, now())
     ON CONFLICT (cluster) DO UPDATE
        SET epoch = dws_cluster.epoch + 1, owner_host = $2, owner_since = now()
     RETURNING epoch";
const HEARTBEAT_SQL: &str =
    "SELECT pg_backend_pid(), (SELECT epoch FROM dws_cluster WHERE cluster = $1)";
const RESIGN_SQL: &str = "UPDATE dws_cluster SET owner_host = NULL, owner_since = NULL
     WHERE cluster = $1 AND epoch = $2";

/// What an append transaction runs to check that its host still owns the
/// upstream: the epoch, with the row locked against a concurrent takeover.
pub const CHECK_EPOCH_SQL: &str = "SELECT epoch FROM dws_cluster WHERE cluster = $1 FOR SHARE";

/// The lease's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How often a contender tries the lock.
    pub retry: Duration,
    /// How often the owner checks its session.
    pub heartbeat: Duration,
    /// How long a heartbeat may go unanswered before the lease counts as lost.
    pub answer_within: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            retry: Duration::from_millis(500),
            heartbeat: Duration::from_secs(1),
            answer_within: Duration::from_secs(5),
        }
    }
}

/// A dedicated connection contending for the cluster's lease.
pub struct LeaseSession {
    client: Client,
    driver: Driver,
    backend_pid: i32,
    settings: PgSettings,
}

impl LeaseSession {
    /// Opens the dedicated connection (`application_name`
    /// `busd/<cluster>/<host>/lease`). The schema must exist
    /// (`schema::migrate`).
    pub async fn open(settings: &PgSettings) -> Result<LeaseSession, PgError> {
        let (client, driver) = connect(settings, "lease").await?;
        let backend_pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| PgError::query(&e))?
            .get(0);
        Ok(LeaseSession {
            client,
            driver,
            backend_pid,
            settings: settings.clone(),
        })
    }

    /// One try: the lease with its new epoch, or this session back when
    /// another host holds it.
    pub async fn try_acquire(self, timing: LeaseTiming) -> Result<Result<Lease, Self>, PgError> {
        let q = |e: tokio_postgres::Error| PgError::query(&e);
        let cluster = self.settings.cluster.as_str();
        let won: bool = self
            .client
            .query_one(TRY_LOCK_SQL, &[&cluster])
            .await
            .map_err(q)?
            .get(0);
        if !won {
            return Ok(Err(self));
        }
        // On failure the session is dropped, and the lock with it.
        let epoch: i64 = self
            .client
            .query_one(TAKE_SQL, &[&cluster, &self.settings.host])
            .await
            .map_err(q)?
            .get(0);
        Ok(Ok(Lease::start(self, epoch, timing)))
    }
}

/// The cluster's upstream lease, held. Dropping it closes its session, which
/// releases the lock; [`Lease::release`] also clears the owner.
pub struct Lease {
    client: Arc<Client>,
    cluster: String,
    epoch: i64,
    lost: watch::Receiver<Option<String>>,
    heartbeat: JoinHandle<()>,
    driver: tokio::task::AbortHandle,
}

impl Lease {
    /// Contends until this host owns the lease: tries every `timing.retry`
    /// on one dedicated session. Errors (the session broke, the server went
    /// away) are returned; retrying with a backoff is the caller's choice.
    /// Cancel-safe: dropping the future closes the session.
    pub async fn acquire_or_wait(
        settings: &PgSettings,
        timing: LeaseTiming,
    ) -> Result<Lease, PgError> {
        let mut session = LeaseSession::open(settings).await?;
        loop {
            match session.try_acquire(timing).await? {
                Ok(lease) => return Ok(lease),
                Err(back) => session = back,
            }
            tokio::time::sleep(timing.retry).await;
        }
    }

    fn start(session: LeaseSession, epoch: i64, timing: LeaseTiming) -> Lease {
        let LeaseSession {
            client,
            driver,
            backend_pid,
            settings,
        } = session;
        let client = Arc::new(client);
        let (tx, lost) = watch::channel(None);
        let abort = driver.abort_handle();
        let heartbeat = tokio::spawn(heartbeat(
            client.clone(),
            driver,
            settings.cluster.clone(),
            epoch,
            backend_pid,
            timing,
            tx,
        ));
        Lease {
            client,
            cluster: settings.cluster,
            epoch,
            lost,
            heartbeat,
            driver: abort,
        }
    }

    /// The epoch this acquisition got: what [`check_epoch`] compares.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Why the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost.borrow().clone()
    }

    /// Resolves with the reason once the lease is lost. The owner must then
    /// stop appending and acking; its appends would fail [`check_epoch`]
    /// anyway.
    pub fn lost(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut rx = self.lost.clone();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or_default(),
                Err(_) => "the lease's heartbeat stopped".into(),
            }
        }
    }

    /// Gives the lease up cleanly: clears the owner (if still ours), unlocks,
    /// closes the session.
    pub async fn release(self) -> Result<(), PgError> {
        let q = |e: tokio_postgres::Error| PgError::query(&e);
        self.heartbeat.abort();
        self.client
            .execute(RESIGN_SQL, &[&self.cluster, &self.epoch])
            .await
            .map_err(q)?;
        self.client
            .execute(UNLOCK_SQL, &[&self.cluster])
            .await
            .map_err(q)?;
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.heartbeat.abort();
        self.driver.abort();
    }
}

/// Whether a heartbeat's answer means the lease is lost: the session moved
/// to another backend (a pooler in between), or the epoch is not ours.
pub fn judge(our_pid: i32, our_epoch: i64, backend_pid: i32, epoch: Option<i64>) -> Option<String> {
    if backend_pid != our_pid {
        return Some(format!(
            "the lease session moved from backend {our_pid} to {backend_pid}: \
             a connection pooler is in between; give busd a direct connection"
        ));
    }
    fenced(our_epoch, epoch)
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
/// cluster's epoch is still `epoch`. Locks the cluster's row `FOR SHARE`
/// until the transaction ends, so no takeover commits in between. (An
/// append that will also advance `head_seq` in that row should lock it
/// `FOR UPDATE` instead and compare with [`fenced`]: two `FOR SHARE`
/// holders that both upgrade would deadlock.)
pub async fn check_epoch(tx: &Transaction<'_>, cluster: &str, epoch: i64) -> Result<(), PgError> {
    let current: Option<i64> = tx
        .query_opt(CHECK_EPOCH_SQL, &[&cluster])
        .await
        .map_err(|e| PgError::query(&e))?
        .map(|row| row.get(0));
    match fenced(epoch, current) {
        None => Ok(()),
        Some(why) => Err(PgError::Fenced(why)),
    }
}

/// The owner's heartbeat; sends the reason on `lost` once, closes the
/// session and ends.
async fn heartbeat(
    client: Arc<Client>,
    mut driver: Driver,
    cluster: String,
    epoch: i64,
    backend_pid: i32,
    timing: LeaseTiming,
    lost: watch::Sender<Option<String>>,
) {
    let mut tick = tokio::time::interval(timing.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let reason = loop {
        tokio::select! {
            ended = &mut driver => {
                break match ended {
                    Ok(Err(e)) => format!("the lease session ended: {e}"),
                    _ => "the lease session ended".into(),
                };
            }
            _ = tick.tick() => {
                let answer = tokio::time::timeout(
                    timing.answer_within,
                    client.query_one(HEARTBEAT_SQL, &[&cluster]),
                )
                .await;
                match answer {
                    Err(_) => break format!(
                        "the lease session did not answer within {:?}",
                        timing.answer_within
                    ),
                    Ok(Err(e)) => break format!("the lease session failed: {}", PgError::query(&e)),
                    Ok(Ok(row)) => {
                        if let Some(why) = judge(backend_pid, epoch, row.get(0), row.get(1)) {
                            break why;
                        }
                    }
                }
            }
        }
    };
    driver.abort();
    tracing::warn!(target: "busd::postgres", "upstream lease of cluster {cluster} lost: {reason}");
    let _ = lost.send(Some(reason));
}
