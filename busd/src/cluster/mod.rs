//! A host's part in a cluster (`store = "postgres"`): everything that runs
//! beside the hub to keep it in step with the other hosts. The hub itself
//! does not know about the cluster beyond [`ReplicaPort::replicated`] (events another
//! host appended) and the [`Link`] its connections forward publishes through.
//!
//! Roles, decided by the upstream lease (`cluster::db::lease`):
//! - the **owner** holds the lease: it runs the upstream source, its hub
//!   assigns seqs and its committer appends them to the shared log (each
//!   append checks the lease's epoch, so an owner that lost the lease cannot
//!   append), and it drains the inbox of the other hosts' publishes;
//! - a **follower** tails the shared log into its hub (`LISTEN dws_log`, and
//!   a poll that also covers notifications missed while reconnecting), and
//!   forwards its publishes to the owner through the inbox.
//!
//! Takeover ([`lease`]): a follower that gets the lease first reads the log
//! to its head (the epoch bump waited for the old owner's last append), then
//! switches to owner; only then does it open the upstream. The old owner's
//! lease loss stops its bus (its pending replies are answered with the
//! error), so it cannot ack upstream what it could not append.
//!
//! Status ([`refresh`]): every second the link reads the cluster's row, its
//! hosts and their cursors into the hub's status document.

pub mod db;
mod define;
mod forward;
pub use forward::OUTCOME_UNKNOWN;
mod lease;
mod shared;
mod tail;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use proto::{
    status::{ClusterCursorDoc, ClusterDoc, ClusterHostDoc, ClusterLeaseDoc},
    v1::{self, ErrorCode},
};
use tokio::sync::Notify;

use self::db::hosts;
use crate::{
    hub::ReplicaPort,
    pg::{self, definitions, Client, PgError, PgSettings, Type},
    shutdown::Shutdown,
    source::{Source, SourceContext},
    store::SubRecord,
};

/// The source state's reason on a follower.
const FOLLOWER: &str = "cluster follower: another host holds the upstream";

/// How often the status is refreshed and the host's heartbeat written.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// How often a follower reads the log without a notification.
const TAIL_POLL: Duration = Duration::from_secs(1);

/// What a forwarded publish got back: the owner's ack, or an error.
pub type Answer = Result<v1::PublishAck, (ErrorCode, String)>;

/// A host's link to its cluster, shared by the hub's connections and the
/// cluster tasks.
pub struct Link {
    settings: PgSettings,
    /// This busd run in the cluster (registered with the host): shared
    /// delivery's claims are the incarnation's, never a later run's, and
    /// with a ticket it makes a forwarded publish's idempotency key.
    incarnation: String,
    hub: ReplicaPort,
    /// The epoch this host appends under; 0 while it is a follower. The
    /// store reads it for every append.
    epoch: Arc<AtomicI64>,
    owner: AtomicBool,
    /// Wakes the follower's tail to stop (this host became the owner).
    became_owner: Notify,
    /// This host got the lease and is taking over: the tail must stop.
    taking_over: AtomicBool,
    /// The tail task runs (set before it is spawned), and says when it
    /// stopped.
    tail_running: AtomicBool,
    tail_stopped: Notify,
    next_ticket: AtomicU64,
    answers: Mutex<HashMap<u64, Option<Answer>>>,
    /// The forwarder task's queue, started by the first forward. Bounded by
    /// the connections: each holds at most so many replies waiting.
    forwards:
        Mutex<Option<tokio::sync::mpsc::UnboundedSender<(u64, String, crate::hub::NewEvent)>>>,
}

impl Link {
    pub fn new(settings: PgSettings, hub: ReplicaPort, epoch: Arc<AtomicI64>) -> Arc<Link> {
        Arc::new(Link {
            settings,
            incarnation: shared::new_incarnation(),
            hub,
            epoch,
            owner: AtomicBool::new(false),
            became_owner: Notify::new(),
            taking_over: AtomicBool::new(false),
            tail_running: AtomicBool::new(false),
            tail_stopped: Notify::new(),
            next_ticket: AtomicU64::new(1),
            answers: Mutex::new(HashMap::new()),
            forwards: Mutex::new(None),
        })
    }

    /// Whether this host holds the lease and appends to the log itself.
    pub fn is_owner(&self) -> bool {
        self.owner.load(Ordering::Acquire)
    }

    fn taking_over(&self) -> bool {
        self.taking_over.load(Ordering::SeqCst)
    }

    /// Stops the tail and waits until it did (bounded: a read in progress
    /// finishes first).
    async fn start_takeover(&self) {
        self.taking_over.store(true, Ordering::SeqCst);
        self.became_owner.notify_waiters();
        loop {
            let stopped = self.tail_stopped.notified();
            tokio::pin!(stopped);
            stopped.as_mut().enable();
            if !self.tail_running.load(Ordering::SeqCst) {
                return;
            }
            // The flag is rechecked after every wake (and every second).
            let _ = tokio::time::timeout(Duration::from_secs(1), stopped).await;
        }
    }

    /// Whether the forwarded publish `ticket` has its answer.
    pub fn is_answered(&self, ticket: u64) -> bool {
        lock(&self.answers).get(&ticket).is_none_or(|a| a.is_some())
    }

    /// Takes the answer of `ticket` (once).
    pub fn take_answer(&self, ticket: u64) -> Answer {
        lock(&self.answers)
            .remove(&ticket)
            .flatten()
            .unwrap_or_else(|| {
                Err((
                    ErrorCode::Internal,
                    "the forwarded publish has no answer".into(),
                ))
            })
    }

    fn answer(&self, ticket: u64, answer: Answer) {
        lock(&self.answers).insert(ticket, Some(answer));
        self.hub.nudge_waiters();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the cluster tasks of this host: the follower's tail, the lease
/// contention (which runs `source` once this host owns the upstream), and
/// the status refresh with the host's heartbeat. They end with `shutdown`.
pub fn spawn(link: Arc<Link>, source: SourceFactory, shutdown: Shutdown) {
    // Until this host owns the upstream, its events come from the owner
    // through the log: for its consumers that is a connected source.
    link.hub.set_source_state(
        v1::SourceState {
            state: v1::SourceStatus::Connected as i32,
            reason: FOLLOWER.into(),
            since_unix_ms: crate::clock::now_ms(),
            ..Default::default()
        },
        None,
    );
    link.tail_running.store(true, Ordering::SeqCst);
    tokio::spawn(tail::run(link.clone(), shutdown.clone()));
    tokio::spawn(shared::run(link.clone(), shutdown.clone()));
    tokio::spawn(lease::run(link.clone(), source, shutdown.clone()));
    tokio::spawn(refresh(link, shutdown));
}

/// Registers this host, then every [`REFRESH_EVERY`] writes its heartbeat
/// and reads the cluster for status; unregisters at the end.
async fn refresh(link: Arc<Link>, mut shutdown: Shutdown) {
    let s = &link.settings;
    let mut conn = None;
    // The definitions looked at so far; `None` until the first read.
    let mut seen: Option<HashSet<String>> = None;
    // The last good read, shown (aged, with the error) while reads fail.
    let mut last: Option<ClusterDoc> = None;
    loop {
        if conn.is_none() {
            conn = match pg::connect(s, "status").await {
                Ok((client, _driver)) => {
                    let pid = std::process::id() as i32;
                    if let Err(e) = hosts::register(
                        &client,
                        &s.cluster,
                        &s.host,
                        pid,
                        proto::BUILD,
                        &link.incarnation,
                    )
                    .await
                    {
                        tracing::warn!(cause = %e, "cannot register this host in the cluster");
                    }
                    Some(client)
                }
                Err(e) => {
                    link.hub
                        .set_cluster_status(doc_error(&link, last.as_ref(), e));
                    None
                }
            };
        }
        if let Some(client) = &conn {
            let adopted = adopt(&link, client, &mut seen).await;
            if let Err(e) = &adopted {
                tracing::warn!(cause = %e, "cannot read the cluster's subscriptions");
            }
            let read = match adopted {
                Err(e @ PgError::Unreachable(_)) => Err(e),
                _ => read_cluster(&link, client).await,
            };
            match read {
                Ok(doc) => {
                    link.hub.set_cluster_status(doc.clone());
                    last = Some(doc);
                }
                Err(e) => {
                    link.hub
                        .set_cluster_status(doc_error(&link, last.as_ref(), e));
                    conn = None;
                }
            }
        }
        tokio::select! {
            _ = shutdown.recv() => break,
            _ = tokio::time::sleep(REFRESH_EVERY) => {}
        }
    }
    if let Some(client) = conn {
        let _ = hosts::unregister(&client, &s.cluster, &s.host).await;
    }
}

/// This host's `dropped` list: subscriptions it removed while another
/// host still had them (`store::postgres::store` keeps it up to date).
const DROPPED_SQL: &str = "SELECT dropped FROM dws_host_snapshot WHERE cluster = $1 AND host = $2";

/// Gives this host its own instance of every subscription created on
/// another host that it neither holds nor dropped: on the first call every
/// such definition (one created between this host's recovery and now is
/// not missed; the hub skips the ones it holds), later only definitions not
/// seen before (so one this host drops later is not taken back).
async fn adopt(
    link: &Link,
    client: &Client,
    seen: &mut Option<HashSet<String>>,
) -> Result<(), PgError> {
    let s = &link.settings;
    let defs = definitions::definitions::<SubRecord>(client, &s.cluster).await?;
    let dropped: Vec<String> = if seen.is_none() {
        let params: pg::Params = &[(&s.cluster, Type::TEXT), (&s.host, Type::TEXT)];
        let row = pg::query_opt(
            client,
            "reading the dropped subscriptions",
            DROPPED_SQL,
            params,
        )
        .await?;
        row.map(|row| pg::sql::get(&row, 0))
            .transpose()?
            .unwrap_or_default()
    } else {
        vec![]
    };
    let seen = seen.get_or_insert_with(HashSet::new);
    let now = crate::clock::now_ms();
    let fresh: Vec<_> = defs
        .into_iter()
        .filter(|d| seen.insert(d.id.clone()) && !dropped.contains(&d.id))
        .map(|d| d.record.instance_for_host(now))
        .collect();
    if !fresh.is_empty() {
        link.hub.adopt(fresh);
    }
    Ok(())
}

/// The cluster as the database has it now: the lease and the head from one
/// snapshot (never waiting for a lock), the hosts, the cursors. The read's
/// time is taken first, so the ages shown later are never too young.
async fn read_cluster(link: &Link, client: &Client) -> Result<ClusterDoc, PgError> {
    let s = &link.settings;
    let read_at = crate::clock::now_ms();
    hosts::heartbeat(client, &s.cluster, &s.host).await?;
    let row = hosts::lease(client, &s.cluster).await?.unwrap_or_default();
    let hosts = hosts::list(client, &s.cluster).await?;
    let cursors = hosts::cursors(client, &s.cluster).await?;
    let doc = ClusterDoc {
        name: s.cluster.clone(),
        host: s.host.clone(),
        role: role_name(link.is_owner()).into(),
        owner: row.holder.clone(),
        owner_since_unix_ms: row.since_unix_ms,
        epoch: row.epoch,
        head_seq: row.head_seq,
        hosts: hosts
            .into_iter()
            .map(|h| ClusterHostDoc {
                host: h.host,
                pid: h.pid as u32,
                version: h.build,
                started_at_unix_ms: h.started_at_unix_ms,
                heartbeat_age_ms: h.heartbeat_age_ms.max(0) as u64,
            })
            .collect(),
        cursors: cursors
            .into_iter()
            .map(|c| ClusterCursorDoc {
                lag: row.head_seq.saturating_sub(c.cursor),
                subscription: c.subscription,
                delivery: c.delivery,
                host: c.host,
                cursor: c.cursor,
                saved_at_unix_ms: c.saved_at_unix_ms,
            })
            .collect(),
        last_error: None,
        lease: Some(ClusterLeaseDoc {
            holder: row.holder,
            epoch: row.epoch,
            expires_at_unix_ms: row.expires_at_unix_ms,
            expires_in_ms: row.expires_in_ms,
            expired: false,
        }),
        read_at_unix_ms: read_at,
        read_age_ms: 0,
    };
    // Judges the lease at the read (an expired one names no owner).
    Ok(doc.aged(0))
}

/// The cluster after a failed read: the last good read (aged when shown:
/// a lease it named runs out), or nothing known, with the error.
fn doc_error(link: &Link, last: Option<&ClusterDoc>, e: PgError) -> ClusterDoc {
    let mut doc = last.cloned().unwrap_or_else(|| ClusterDoc {
        name: link.settings.cluster.clone(),
        host: link.settings.host.clone(),
        read_at_unix_ms: crate::clock::now_ms(),
        ..ClusterDoc::default()
    });
    doc.role = role_name(link.is_owner()).into();
    doc.last_error = Some(e.to_string());
    doc
}

fn role_name(owner: bool) -> &'static str {
    if owner {
        "owner"
    } else {
        "follower"
    }
}

/// Builds the profile's upstream source: once for every time this host
/// becomes the owner (a source runs once).
pub type SourceFactory = Box<dyn Fn() -> Box<dyn Source> + Send + Sync>;

/// An owner's running upstream source, stoppable on its own (a lost lease)
/// as well as by the bus's shutdown.
struct RunningSource {
    stop: crate::shutdown::ShutdownTrigger,
    task: tokio::task::JoinHandle<()>,
}

impl RunningSource {
    /// Stops the source and waits (bounded) until it closed its upstream
    /// connection, so the next owner's never overlaps it.
    async fn stop(self) {
        self.stop.trigger(v1::ByeReason::Shutdown);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

/// Runs the upstream source of an owner (see [`lease`]).
fn run_source(link: &Link, source: Box<dyn Source>, mut bus: Shutdown) -> RunningSource {
    let (stop, shutdown) = crate::shutdown::channel();
    let forward = stop.clone();
    tokio::spawn(async move { forward.trigger(bus.recv().await) });
    let task = tokio::spawn(source.run(SourceContext {
        hub: link.hub.source_handle(),
        shutdown,
    }));
    RunningSource { stop, task }
}
