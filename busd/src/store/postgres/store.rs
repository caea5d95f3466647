//! [`PgStore`]: the storage boundary ([`crate::store::Store`]) over a
//! PostgreSQL cluster (see the parent module for the model).
//!
//! - **Its own runtime, one connection.** The committer is a plain thread,
//!   so the store owns a current-thread tokio runtime and blocks on it; when
//!   it is called from inside another runtime (`recover` and the first
//!   `save` run in busd's start-up task) the call runs on a scoped thread.
//!   One connection (`application_name` `busd/<cluster>/<host>/store`),
//!   opened by the first call; a call that fails closes it (so the server
//!   ends the session and releases its locks) and returns the error, and the
//!   next call connects again. A call that finds the connection broken
//!   (the server closed it while it was idle) connects again and runs once
//!   more.
//! - **Append** only for the owner: the epoch handle is set by the lease
//!   holder, 0 meaning "not the owner". A fenced append (epoch 0, or the
//!   cluster's epoch moved on) fails with a message starting with
//!   [`FENCED_PREFIX`]: the bus stops, as it must — a fenced owner must not
//!   ack anything more upstream.
//! - **Save** is per host: this host's `Snapshot` (`dws_host_snapshot`),
//!   the definitions of the subscriptions it holds (`dws_subscription`, as
//!   [`instance_for_host`] records them; inserted if missing) and its cursor
//!   of each (`dws_cursor`). A subscription this host dropped loses its
//!   cursor row; its definition goes once no host has a cursor of it (a
//!   copy that expired unused on one host must not take the subscription
//!   from the others).
//! - **Recover** returns every event still in the log, this host's
//!   snapshot, and the cluster's definitions this host never had, as fresh
//!   instances ([`instance_for_host`]) that start at the definition's cursor.

use std::{
    collections::BTreeSet,
    future::Future,
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
};

use tokio::runtime::Runtime;

use super::{
    connect, definitions, log, schema,
    session::{close, ensure},
    Driver, PgError, PgSettings,
};
use crate::{
    clock::now_ms,
    eventlog::LoggedEvent,
    pg::{sql, Client, Refusal, Type},
    store::{Recovered, Snapshot, Store, StoreError, StoreInfo, SubRecord, SNAPSHOT_FORMAT},
};

/// How a fenced append's error message starts.
pub const FENCED_PREFIX: &str = "lost the cluster's upstream lease";
/// Events read per query while recovering.
const RECOVER_PAGE: i64 = 10_000;
/// Attempts of a save that hit a deadlock, a serialization failure or a
/// definition deleted under it by another host.
const SAVE_ATTEMPTS: usize = 3;

/// The PostgreSQL store of one host.
pub struct PgStore {
    settings: PgSettings,
    epoch: Arc<AtomicI64>,
    rt: Option<Runtime>,
    conn: Option<(Client, Driver)>,
    /// The subscriptions of the last saved snapshot (after `recover`: the
    /// recovered ones).
    saved: BTreeSet<String>,
    /// Most events the log keeps below its head for other hosts'
    /// subscriptions (see [`PgStore::with_hold_cap`]).
    hold_cap: u64,
    /// The oldest seq in the log, as last read (`Store::retained_from`).
    retained_from: Option<u64>,
}

/// The hard cap of what hosts' subscriptions hold back, in multiples of the
/// retention: [`PgStore::with_hold_cap`].
pub const HOLD_FACTOR: u64 = 10;

/// Connects, migrates and ensures the cluster's row: what busd checks
/// before its ready line, so a bad URL, bad credentials or missing
/// permissions fail the start with the right exit code.
pub async fn preflight(settings: &PgSettings) -> Result<(), PgError> {
    let (mut client, _driver) = connect(settings, "preflight").await?;
    schema::migrate(&mut client).await?;
    log::cluster_row(&client, &settings.cluster).await?;
    Ok(())
}

/// Runs `fut` to completion on `rt`: directly on a thread without a
/// runtime (the committer), on a scoped thread inside one.
fn block<F>(rt: &Runtime, fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return rt.block_on(fut);
    }
    std::thread::scope(|s| {
        s.spawn(|| rt.block_on(fut))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn io(e: PgError) -> StoreError {
    match e {
        PgError::Fenced(why) => StoreError::Io(format!("{FENCED_PREFIX}: {why}")),
        other if schema::is_too_new(&other) => StoreError::Refused(other.to_string()),
        other => StoreError::Io(other.to_string()),
    }
}

/// What recovery reads, before it is merged.
struct Loaded {
    cluster: log::ClusterRow,
    snapshot: Option<String>,
    dropped: Vec<String>,
    definitions: Vec<definitions::Definition<SubRecord>>,
    events: Vec<Arc<LoggedEvent>>,
}

const LOAD_SNAPSHOT_SQL: &str =
    "SELECT snapshot::text, dropped FROM dws_host_snapshot WHERE cluster = $1 AND host = $2";

async fn load(client: &mut Client, settings: &PgSettings) -> Result<Loaded, PgError> {
    let cluster = settings.cluster.as_str();
    schema::migrate(client).await?;
    let row = log::cluster_row(&*client, cluster).await?;
    let found = crate::pg::query_opt(
        &*client,
        "reading this host's snapshot",
        LOAD_SNAPSHOT_SQL,
        &[(&cluster, Type::TEXT), (&settings.host, Type::TEXT)],
    )
    .await?;
    let (snapshot, dropped) = match found {
        Some(r) => (Some(sql::get(&r, 0)?), sql::get(&r, 1)?),
        None => (None, vec![]),
    };
    let definitions = definitions::definitions::<SubRecord>(&*client, cluster).await?;
    let mut events = vec![];
    let mut after = 0;
    loop {
        let page = log::read_after(&*client, cluster, after, RECOVER_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        events.extend(page.into_iter().map(|r| Arc::new(r.into_logged())));
    }
    Ok(Loaded {
        cluster: row,
        snapshot,
        dropped,
        definitions,
        events,
    })
}

/// This host's snapshot with the cluster's definitions it never had merged
/// in, and the notes for `bus.log`.
fn merge(loaded: Loaded, host: &str, now: i64) -> Result<Recovered, StoreError> {
    let mut notes = vec![];
    let mut snapshot = match &loaded.snapshot {
        None => None,
        Some(json) => {
            let snap: Snapshot = serde_json::from_str(json).map_err(|e| {
                StoreError::Refused(format!(
                    "cannot read the subscriptions of host {host} in the cluster's database: {e}"
                ))
            })?;
            if snap.format != SNAPSHOT_FORMAT {
                return Err(StoreError::Refused(format!(
                    "the subscriptions of host {host} in the cluster's database have format {}, \
                     which this busd does not know; refusing to touch them",
                    snap.format
                )));
            }
            Some(snap)
        }
    };
    let held: BTreeSet<String> = snapshot
        .iter()
        .flat_map(|s| s.subscriptions.iter().map(|r| r.id.clone()))
        .collect();
    let mut merged = vec![];
    for d in loaded.definitions {
        if held.contains(&d.id) || loaded.dropped.contains(&d.id) {
            continue;
        }
        notes.push(format!(
            "subscription {} was created on another host of the cluster: this host's instance \
             starts at seq {}",
            d.id, d.record.cursor
        ));
        merged.push(d.record.instance_for_host(now));
    }
    let last = loaded.events.last().map_or(0, |e| e.seq);
    let head = loaded.cluster.head_seq;
    // What this host's subscriptions needed and the hard cap let go.
    let first_kept = loaded.events.first().map_or(head + 1, |e| e.seq);
    if let Some(snap) = snapshot.as_mut() {
        notes.extend(super::lost::report_lost(
            &mut snap.subscriptions,
            first_kept,
        ));
    }
    let behind = head > last && snapshot.as_ref().is_none_or(|s| s.head_seq < head);
    if !merged.is_empty() || behind {
        let snap = snapshot.get_or_insert_with(|| Snapshot {
            format: SNAPSHOT_FORMAT,
            clean: true,
            head_seq: 0,
            log_floor: 0,
            saved_at_unix_ms: now,
            subscriptions: vec![],
        });
        snap.subscriptions.extend(merged);
        if behind {
            notes.push(format!(
                "the cluster's head is seq {head}, but its log ends at {last}: \
                 the seqs in between are gone"
            ));
            snap.head_seq = head;
        }
    }
    Ok(Recovered {
        events: loaded.events,
        snapshot,
        notes,
        lost: vec![],
    })
}

const SAVE_SNAPSHOT_SQL: &str = "INSERT INTO dws_host_snapshot (cluster, host, snapshot, saved_at)
     VALUES ($1, $2, $3::jsonb, now())
     ON CONFLICT (cluster, host) DO UPDATE
        SET snapshot = excluded.snapshot, saved_at = excluded.saved_at,
            dropped = ARRAY(
                SELECT DISTINCT d FROM unnest(dws_host_snapshot.dropped || $4::text[]) AS d
                WHERE d <> ALL($5::text[])
                  AND EXISTS (SELECT 1 FROM dws_subscription s
                              WHERE s.cluster = $1 AND s.id = d))";

/// Definitions (inserted when missing) and this host's cursors: one
/// statement; the foreign keys are checked at its end, after the insert.
const SAVE_SUBS_SQL: &str = "WITH u AS (
        SELECT * FROM unnest($3::text[], $4::text[], $5::text[]) AS u(id, def, rec)
    ), defs AS (
        INSERT INTO dws_subscription (cluster, id, delivery, record)
        SELECT $1, id,
               CASE WHEN coalesce((def::jsonb->>'shared')::boolean, false)
                    THEN 'shared' ELSE 'per-host' END,
               def::jsonb FROM u
        ON CONFLICT (cluster, id) DO NOTHING
    )
    INSERT INTO dws_cursor (cluster, subscription, host, record, saved_at)
    SELECT $1, id, $2, rec::jsonb, now() FROM u
    ON CONFLICT (cluster, subscription, host) DO UPDATE
        SET record = excluded.record, saved_at = excluded.saved_at";

const DROP_CURSORS_SQL: &str =
    "DELETE FROM dws_cursor WHERE cluster = $1 AND host = $2 AND subscription = ANY($3)";
const DROP_DEFINITIONS_SQL: &str = "DELETE FROM dws_subscription s
     WHERE s.cluster = $1 AND s.id = ANY($2)
       AND NOT EXISTS (SELECT 1 FROM dws_cursor c WHERE c.cluster = $1 AND c.subscription = s.id)";

/// The encoded parts of one save.
struct SaveArgs {
    snapshot: String,
    ids: Vec<String>,
    definitions: Vec<String>,
    records: Vec<String>,
    gone: Vec<String>,
}

async fn save_tx(client: &mut Client, settings: &PgSettings, a: &SaveArgs) -> Result<(), PgError> {
    let (cluster, host) = (settings.cluster.as_str(), settings.host.as_str());
    let tx = sql::begin(client).await?;
    if !a.gone.is_empty() {
        let (c, h, g) = (&cluster, &host, &a.gone);
        sql::execute(
            &tx,
            DROP_CURSORS_SQL,
            &[(c, Type::TEXT), (h, Type::TEXT), (g, Type::TEXT_ARRAY)],
        )
        .await?;
        sql::execute(
            &tx,
            DROP_DEFINITIONS_SQL,
            &[(c, Type::TEXT), (g, Type::TEXT_ARRAY)],
        )
        .await?;
    }
    if !a.ids.is_empty() {
        sql::execute(
            &tx,
            SAVE_SUBS_SQL,
            &[
                (&cluster, Type::TEXT),
                (&host, Type::TEXT),
                (&a.ids, Type::TEXT_ARRAY),
                (&a.definitions, Type::TEXT_ARRAY),
                (&a.records, Type::TEXT_ARRAY),
            ],
        )
        .await?;
    }
    sql::execute(
        &tx,
        SAVE_SNAPSHOT_SQL,
        &[
            (&cluster, Type::TEXT),
            (&host, Type::TEXT),
            (&a.snapshot, Type::TEXT),
            (&a.gone, Type::TEXT_ARRAY),
            (&a.ids, Type::TEXT_ARRAY),
        ],
    )
    .await?;
    sql::commit(tx).await
}

/// Worth another attempt: the transaction lost a race with another host's.
fn retryable(e: &PgError) -> bool {
    [
        Refusal::Deadlock,
        Refusal::Serialization,
        Refusal::ForeignKey,
        Refusal::Unique,
    ]
    .into_iter()
    .any(|why| e.refused(why))
}

impl PgStore {
    /// A store for `settings`; connects on its first call. `epoch` is the
    /// lease holder's epoch, 0 while this host does not own the log.
    pub fn new(settings: PgSettings, epoch: Arc<AtomicI64>) -> PgStore {
        PgStore {
            settings,
            epoch,
            rt: None,
            conn: None,
            saved: BTreeSet::new(),
            hold_cap: u64::MAX,
            retained_from: None,
        }
    }

    /// Retention never deletes what a host's named subscription still
    /// needs, unless the log would hold more than `cap` events below its
    /// head (busd passes [`HOLD_FACTOR`] times the retention).
    pub fn with_hold_cap(mut self, cap: u64) -> PgStore {
        self.hold_cap = cap.max(1);
        self
    }

    /// The runtime (started on first use), the connection slot and the
    /// settings, borrowed apart for one call.
    #[allow(clippy::type_complexity)]
    fn parts(
        &mut self,
    ) -> Result<(&Runtime, &mut Option<(Client, Driver)>, &PgSettings), StoreError> {
        if self.rt.is_none() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Io(format!("cannot start the store's runtime: {e}")))?;
            self.rt = Some(rt);
        }
        match self.rt.as_ref() {
            Some(rt) => Ok((rt, &mut self.conn, &self.settings)),
            None => Err(StoreError::Io("the store's runtime is gone".into())),
        }
    }
}

async fn save_with_retries(
    client: &mut Client,
    settings: &PgSettings,
    args: &SaveArgs,
) -> Result<(), PgError> {
    let mut attempt = 1;
    loop {
        let saved =
            tokio::time::timeout(super::STATEMENT_BOUND, save_tx(client, settings, args)).await;
        let Ok(saved) = saved else {
            return Err(super::no_answer(
                super::STATEMENT_BOUND,
                "saving the subscriptions",
            ));
        };
        match saved {
            Err(e) if attempt < SAVE_ATTEMPTS && retryable(&e) => attempt += 1,
            r => return r,
        }
    }
}

/// Runs `$body` (a future using `$client: &mut Client` and `$settings`) on
/// the store's runtime and connection. A failure closes the connection; a
/// connection that turns out broken when reused is replaced and the body
/// run once more (every body here is safe to repeat: an append that did
/// commit is then refused by the log's gap check, the rest are idempotent).
macro_rules! on_conn {
    ($self:ident, |$client:ident, $settings:ident| $body:expr) => {{
        let (rt, conn, $settings) = $self.parts()?;
        block(rt, async move {
            let mut retried = false;
            loop {
                let reused = conn.is_some();
                let result = match ensure(conn, $settings).await {
                    Ok($client) => $body.await,
                    Err(e) => Err(e),
                };
                match result {
                    Ok(v) => return Ok(v),
                    Err(e) => {
                        close(conn.take()).await;
                        if reused && !retried && matches!(e, PgError::Unreachable(_)) {
                            retried = true;
                            continue;
                        }
                        return Err(e);
                    }
                }
            }
        })
        .map_err(io)
    }};
}

/// Retention on the owner: deletes below `wanted`, held back by what the
/// hosts' named subscriptions still need, within `cap` (see
/// [`log::retention_floor`]).
async fn release(client: &Client, cluster: &str, wanted: u64, cap: u64) -> Result<(), PgError> {
    let (head, held) = log::held_from(client, cluster).await?;
    let floor = log::retention_floor(wanted, held, head, cap);
    if floor < wanted {
        tracing::debug!(
            wanted,
            floor,
            "retention held back by a host's subscription"
        );
    }
    log::delete_below(client, cluster, floor).await.map(|_| ())
}

impl Store for PgStore {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        let loaded = on_conn!(self, |client, settings| load(client, settings))?;
        let recovered = merge(loaded, &self.settings.host, now_ms())?;
        self.saved = recovered
            .snapshot
            .iter()
            .flat_map(|s| s.subscriptions.iter().map(|r| r.id.clone()))
            .collect();
        Ok(recovered)
    }

    fn append(&mut self, events: &[Arc<LoggedEvent>]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let epoch = self.epoch.clone();
        let (rt, conn, settings) = self.parts()?;
        block(
            rt,
            super::append::append_through_outage(&epoch, conn, settings, events),
        )
        .map_err(io)
    }

    fn save(&mut self, snapshot: &Snapshot) -> Result<(), StoreError> {
        let enc = |what: &str, e: serde_json::Error| {
            StoreError::Io(format!("cannot encode the {what}: {e}"))
        };
        let now = now_ms();
        let mut args = SaveArgs {
            snapshot: serde_json::to_string(snapshot).map_err(|e| enc("subscriptions", e))?,
            ids: vec![],
            definitions: vec![],
            records: vec![],
            gone: vec![],
        };
        for r in &snapshot.subscriptions {
            args.ids.push(r.id.clone());
            let def = r.instance_for_host(now);
            args.definitions
                .push(serde_json::to_string(&def).map_err(|e| enc("subscription", e))?);
            args.records
                .push(serde_json::to_string(r).map_err(|e| enc("subscription", e))?);
        }
        let now_held: BTreeSet<String> = args.ids.iter().cloned().collect();
        args.gone = self.saved.difference(&now_held).cloned().collect();
        let args = &args;
        // Like an append, a save waits out an outage of the server (the
        // cursors it carries are saved lazily anyway; a reply that waits
        // for it waits longer). A follower's waits as long as the outage
        // (or partition) lasts: it appends nothing, so nothing it could
        // ack hangs on it, and its consumers keep what they have; only its
        // last save, at a clean stop, is bounded.
        let follower = self.epoch.load(Ordering::Acquire) == 0 && !snapshot.clean;
        let deadline = std::time::Instant::now() + super::append::OUTAGE_BOUND;
        let mut backoff = std::time::Duration::from_millis(100);
        loop {
            let (rt, conn, settings) = self.parts()?;
            let saved = block(rt, async move {
                let r = match ensure(conn, settings).await {
                    Ok(client) => save_with_retries(client, settings, args).await,
                    Err(e) => Err(e),
                };
                if r.is_err() {
                    close(conn.take()).await;
                }
                r
            });
            match saved {
                Ok(()) => break,
                Err(e)
                    if super::append::transient(&e)
                        && (follower || std::time::Instant::now() < deadline) =>
                {
                    tracing::warn!(cause = %e, retry_in_ms = backoff.as_millis() as u64, "the cluster store is unreachable; the save waits");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
                }
                Err(e) => return Err(io(e)),
            }
        }
        self.saved = now_held;
        Ok(())
    }

    fn release_below(&mut self, seq: u64) -> Result<(), StoreError> {
        // Only the owner deletes; every host learns where the log starts
        // (its dedup window keeps the ids of what is still there).
        let owner = self.epoch.load(Ordering::Acquire) > 0;
        let cap = self.hold_cap;
        let oldest = on_conn!(self, |client, settings| async move {
            if owner {
                release(&*client, &settings.cluster, seq, cap).await?;
            }
            log::oldest_seq(&*client, &settings.cluster).await
        })?;
        if oldest.is_some() {
            self.retained_from = oldest;
        }
        Ok(())
    }

    fn retained_from(&self) -> Option<u64> {
        self.retained_from
    }

    fn info(&self) -> StoreInfo {
        StoreInfo {
            kind: "postgres",
            durability: "postgres",
            path: None,
            segments: 0,
            bytes: 0,
            damaged: vec![],
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.conn = None;
        // Never blocks, so it is safe inside busd's runtime too.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
