//! The upstream owner's lease: which host of a cluster holds the upstream
//! connection.
//!
//! The lease is a row, time-bounded on the **database's clock**:
//! `dws_cluster` records the owner (`owner_host`), the backend of its
//! dedicated lease session (`owner_pid`, `owner_backend_start`) and
//! `lease_expires_at`. A contender ([`LeaseSession`], a dedicated
//! connection — never one shared with other work, never through a pooler)
//! takes the row with one `UPDATE` when the lease is free: no owner, the
//! lease expired (`lease_expires_at < clock_timestamp()`), or the owner's
//! lease session is gone from `pg_stat_activity` (its process died, its
//! session was terminated, the server restarted: a takeover within the
//! contender's retry, as the session advisory lock this row replaced
//! allowed). The session is named by its backend pid and start time; a
//! contender connected as another role sees no start time of it (NULL) and
//! goes by the pid alone. A session that is gone because the *server*
//! restarted since it began (`pg_postmaster_start_time()`) does not free
//! the lease for other hosts before it expires: its owner is probably
//! alive and reconnecting, and takes it back at once (its own host name
//! may). Taking it bumps `dws_cluster.epoch`.
//!
//! The owner renews the row every [`LeaseTiming::heartbeat`]
//! ([`Lease::lost`]): `lease_expires_at = clock_timestamp() + bound`, only
//! while the epoch is its own, its session is the recorded one and the
//! lease has not expired. A frozen, stalled or cut-off owner therefore
//! loses the lease after the bound even though its TCP session lives, and
//! it is fenced in the same transaction as any append: an append
//! (`super::log::append`) locks the cluster's row `FOR UPDATE` and requires
//! both its epoch and an unexpired lease ([`fenced_at`]); other work done
//! for the owner calls [`check_epoch`], which locks it `FOR SHARE`. A
//! takeover's `UPDATE` waits for the transactions in flight, and one after
//! it sees the new epoch and fails.
//!
//! The heartbeat reports the lease lost when the session broke, did not
//! answer within [`LeaseTiming::answer_within`], moved to another backend
//! (a pooler), or the renewal was refused (the epoch moved on, or the lease
//! expired before it came). Losing it closes the session. The decisions are
//! pure ([`judge`], [`fenced`], [`fenced_at`]) and unit-tested.

use std::{sync::Arc, time::Duration};

use crate::pg::{
    connect, fence::fenced, settings::LEASE_DEFAULT, sql, Client, Driver, PgError, PgSettings, Type,
};
use tokio::{sync::watch, task::JoinHandle};

/// Creates the cluster's row if missing (no owner, epoch 0).
const ENSURE_SQL: &str = "INSERT INTO dws_cluster (cluster) VALUES ($1) ON CONFLICT DO NOTHING";
/// Takes the lease when it is free (see the module doc): bumps the epoch,
/// records the owner, its session and the expiry ($3: the bound in seconds).
const TAKE_SQL: &str = "UPDATE dws_cluster c
     SET epoch = c.epoch + 1, owner_host = $2, owner_since = now(),
         lease_expires_at = clock_timestamp() + make_interval(secs => $3),
         owner_pid = pg_backend_pid(),
         owner_backend_start = (SELECT backend_start FROM pg_stat_activity
                                WHERE pid = pg_backend_pid())
     WHERE c.cluster = $1
       AND (c.owner_host IS NULL OR c.lease_expires_at IS NULL
            OR c.lease_expires_at < clock_timestamp()
            OR (NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                            WHERE a.pid = c.owner_pid
                              AND (a.backend_start IS NULL
                                   OR a.backend_start = c.owner_backend_start))
                AND (c.owner_host = $2 OR c.owner_backend_start IS NULL
                     OR c.owner_backend_start >= pg_postmaster_start_time())))
     RETURNING c.epoch";
/// Renews the lease if it is still this session's (see the module doc);
/// answers the backend pid, the cluster's epoch and whether it renewed.
const HEARTBEAT_SQL: &str = "WITH r AS (
        UPDATE dws_cluster
        SET lease_expires_at = clock_timestamp() + make_interval(secs => $3)
        WHERE cluster = $1 AND epoch = $2 AND owner_pid = pg_backend_pid()
          AND lease_expires_at > clock_timestamp()
        RETURNING 1
    )
    SELECT pg_backend_pid(), (SELECT epoch FROM dws_cluster WHERE cluster = $1),
           (SELECT count(*) FROM r) > 0";
const RESIGN_SQL: &str = "UPDATE dws_cluster
     SET owner_host = NULL, owner_since = NULL, lease_expires_at = NULL,
         owner_pid = NULL, owner_backend_start = NULL
     WHERE cluster = $1 AND epoch = $2";

/// The lease's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How often a contender tries the lock.
    pub retry: Duration,
    /// How often the owner checks its session.
    pub heartbeat: Duration,
    /// How long a heartbeat may go unanswered before the lease counts as lost.
    pub answer_within: Duration,
    /// How long the lease lasts without a renewal (database clock).
    pub bound: Duration,
}

impl LeaseTiming {
    /// The clocks of a lease of `bound`: contenders try every half second
    /// (a takeover within about 2 s of the bound), the owner renews every
    /// second (at most a quarter of the bound) and counts the lease lost
    /// when a renewal takes half the bound.
    pub fn for_bound(bound: Duration) -> LeaseTiming {
        LeaseTiming {
            retry: Duration::from_millis(500),
            heartbeat: (bound / 4).min(Duration::from_secs(1)),
            answer_within: (bound / 2).min(Duration::from_secs(5)),
            bound,
        }
    }
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming::for_bound(LEASE_DEFAULT)
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
        crate::pg::bounded("open", async move {
            let (client, driver) = connect(settings, "lease").await?;
            sql::execute(&client, ENSURE_SQL, &[(&settings.cluster, Type::TEXT)]).await?;
            let row = sql::query_one(&client, "SELECT pg_backend_pid()", &[]).await?;
            let backend_pid: i32 = sql::get(&row, 0)?;
            Ok(LeaseSession {
                client,
                driver,
                backend_pid,
                settings: settings.clone(),
            })
        })
        .await
    }

    /// One try: the lease with its new epoch, or this session back when
    /// another host holds it.
    pub async fn try_acquire(self, timing: LeaseTiming) -> Result<Result<Lease, Self>, PgError> {
        crate::pg::bounded("try_acquire", async move {
            let cluster = self.settings.cluster.as_str();
            let secs = timing.bound.as_secs_f64();
            let params: crate::pg::Params = &[
                (&cluster, Type::TEXT),
                (&self.settings.host, Type::TEXT),
                (&secs, Type::FLOAT8),
            ];
            let took = sql::query_opt(&self.client, TAKE_SQL, params).await?;
            match took {
                Some(row) => {
                    let epoch: i64 = sql::get(&row, 0)?;
                    Ok(Ok(Lease::start(self, epoch, timing)))
                }
                None => Ok(Err(self)),
            }
        })
        .await
    }
}

/// The cluster's upstream lease, held. Dropping it closes its session, which
/// frees the lease at once (its backend leaves `pg_stat_activity`);
/// [`Lease::release`] also clears the owner.
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

    /// Gives the lease up cleanly: clears the owner (if still ours) and
    /// closes the session.
    pub async fn release(self) -> Result<(), PgError> {
        crate::pg::bounded("release", async move {
            self.heartbeat.abort();
            let params: crate::pg::Params =
                &[(&self.cluster, Type::TEXT), (&self.epoch, Type::INT8)];
            sql::execute(&*self.client, RESIGN_SQL, params).await?;
            Ok(())
        })
        .await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.heartbeat.abort();
        self.driver.abort();
    }
}

/// Whether a heartbeat's answer means the lease is lost: the session moved
/// to another backend (a pooler in between), the epoch is not ours, or the
/// renewal was refused (the lease expired before it came).
pub fn judge(
    our_pid: i32,
    our_epoch: i64,
    backend_pid: i32,
    epoch: Option<i64>,
    renewed: bool,
) -> Option<String> {
    if backend_pid != our_pid {
        return Some(format!(
            "the lease session moved from backend {our_pid} to {backend_pid}: \
             a connection pooler is in between; give busd a direct connection"
        ));
    }
    fenced(our_epoch, epoch).or_else(|| {
        (!renewed).then(|| {
            format!(
                "the upstream lease (epoch {our_epoch}) expired before this host renewed it \
                 (the host or its database session stalled)"
            )
        })
    })
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
    let secs = timing.bound.as_secs_f64();
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
                    renew(&client, &cluster, epoch, secs),
                )
                .await;
                match answer {
                    Err(_) => break format!(
                        "the lease session did not answer within {:?}",
                        timing.answer_within
                    ),
                    Ok(Err(e)) => break format!("the lease session failed: {e}"),
                    Ok(Ok((pid, current, renewed))) => {
                        if let Some(why) = judge(backend_pid, epoch, pid, current, renewed) {
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

/// One renewal ([`HEARTBEAT_SQL`]): the session's backend, the cluster's
/// epoch and whether the lease was renewed.
async fn renew(
    client: &Client,
    cluster: &str,
    epoch: i64,
    secs: f64,
) -> Result<(i32, Option<i64>, bool), PgError> {
    let params: crate::pg::Params = &[
        (&cluster, Type::TEXT),
        (&epoch, Type::INT8),
        (&secs, Type::FLOAT8),
    ];
    let row = sql::query_one(client, HEARTBEAT_SQL, params).await?;
    Ok((sql::get(&row, 0)?, sql::get(&row, 1)?, sql::get(&row, 2)?))
}
