//! The cluster store's schema, created and migrated by busd itself.
//!
//! [`migrate`] runs one transaction that takes a transaction-scoped advisory
//! lock ([`MIGRATION_LOCK_KEY`]), creates `dws_schema_version` if missing and
//! applies every migration newer than the recorded version, in order: two
//! hosts starting at once serialize on the lock, and the second finds the
//! work done. A database whose version is newer than this binary knows is
//! refused untouched (an older busd must not write a schema it does not
//! understand). Migrations are append-only: a released one never changes.
//!
//! Every table is keyed by `cluster` first, so clusters share a database
//! without seeing each other. The hot path (appending events) touches
//! `dws_cluster` (one row, locked `FOR UPDATE` for the epoch check and the
//! head's update, `super::log::append`) and `dws_event`; nothing on it has a
//! foreign key.
//!
//! Vacuum: `dws_event` is insert-only and shrinks from its low end
//! (retention deletes old seqs in batches), which autovacuum handles; the
//! small, often-updated tables (`dws_cluster`, `dws_host`, `dws_cursor`,
//! `dws_host_snapshot`, `dws_inbox`, `dws_claim`) are what autovacuum must
//! keep up with — keep it on.

use tokio_postgres::Client;

use super::PgError;

/// The newest schema version this busd knows.
pub const SCHEMA_VERSION: u32 = 6;

/// The advisory lock that serializes migrations ("dws-schm" in ASCII). A
/// busd before schema version 4 held a session advisory lock keyed by
/// `hashtextextended(cluster, 0)` as its lease; a collision with this
/// constant would only make a migration wait for such a lease holder.
pub const MIGRATION_LOCK_KEY: i64 = 0x6477_732d_7363_686d;

/// How long a start waits for another host's migration.
const LOCK_TIMEOUT: &str = "30s";

/// Migration 1: the tables of the cluster store. (Its comment on
/// `dws_claim` predates migration 3: claims are taken by insert, see
/// `cluster::db::claims`; a released migration's text never changes.)
const V1: &str = r#"
-- One row per cluster: the log's head, and the upstream owner's lease.
-- `epoch` is bumped by every acquisition of the lease (lease.rs); an append
-- made for the upstream checks it FOR SHARE in its own transaction.
CREATE TABLE dws_cluster (
    cluster     text PRIMARY KEY,
    head_seq    bigint NOT NULL DEFAULT 0,
    epoch       bigint NOT NULL DEFAULT 0,
    owner_host  text,
    owner_since timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The log: one row per event, seqs consecutive per cluster. The columns are
-- the disk store's event record (store/record.rs): `encoded` is the
-- `v1::Event` encoded once (payload, source id and headers live in it; the
-- bus never interprets a payload), the others are what routing, dedup and
-- retention need without decoding it. `scope` is the dedup scope, '' for an
-- event that is not deduplicated; `route` the upstream subscription it was
-- routed to, '' for routing by type only.
CREATE TABLE dws_event (
    cluster          text   NOT NULL,
    seq              bigint NOT NULL,
    scope            text   NOT NULL DEFAULT '',
    event_id         text   NOT NULL,
    event_type       text   NOT NULL,
    route            text   NOT NULL DEFAULT '',
    received_unix_ms bigint NOT NULL,
    encoded          bytea  NOT NULL,
    PRIMARY KEY (cluster, seq)
);
-- Dedup across hosts and owners: an event redelivered by the upstream after
-- a failover is refused by the log itself, for as long as it is retained.
CREATE UNIQUE INDEX dws_event_dedup ON dws_event (cluster, scope, event_id)
    WHERE scope <> '';

-- The hosts of a cluster (for status): refreshed by a heartbeat, removed by
-- a clean exit.
CREATE TABLE dws_host (
    cluster      text        NOT NULL,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    build        text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, host)
);

-- The named subscriptions: `record` is the `store::SubRecord` as created
-- (its spec — patterns, filter, TTL, poison policy — is authoritative
-- here); `delivery` is the mode.
CREATE TABLE dws_subscription (
    cluster    text  NOT NULL,
    id         text  NOT NULL,
    delivery   text  NOT NULL CHECK (delivery IN ('per-host', 'shared')),
    record     jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, id)
);

-- Delivery state of a subscription (`record`: a `store::SubRecord`, saved
-- lazily like the disk store's): one row per host for a per-host
-- subscription; one row with host '' (the cluster's cursor) for a shared one.
CREATE TABLE dws_cursor (
    cluster      text  NOT NULL,
    subscription text  NOT NULL,
    host         text  NOT NULL,
    record       jsonb NOT NULL,
    saved_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, subscription, host),
    FOREIGN KEY (cluster, subscription) REFERENCES dws_subscription (cluster, id)
        ON DELETE CASCADE
);

-- Events of a shared subscription handed to one host and not yet acked:
-- taken with FOR UPDATE SKIP LOCKED; a claim past `claimed_until` is
-- released and delivered again (`deliveries` counts them).
CREATE TABLE dws_claim (
    cluster       text        NOT NULL,
    subscription  text        NOT NULL,
    seq           bigint      NOT NULL,
    host          text        NOT NULL,
    claimed_until timestamptz NOT NULL,
    deliveries    integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (cluster, subscription, seq),
    FOREIGN KEY (cluster, subscription) REFERENCES dws_subscription (cluster, id)
        ON DELETE CASCADE
);
"#;

/// Migration 2: the inbox (publishes from hosts that do not own the log)
/// and each host's subscriptions snapshot.
const V2: &str = r#"
-- Events published on a host that does not own the log, for the owner to
-- append (inbox.rs). `event` is a busd NewEvent as JSON (`json`: `jsonb`
-- refuses \u0000, which an event's data may hold). A row is pending until
-- the owner finishes it with the append's result; `taken_epoch` is the
-- epoch of the owner that took it last (a new owner takes it again).
CREATE TABLE dws_inbox (
    cluster     text        NOT NULL,
    id          bigserial,
    host        text        NOT NULL,
    event       json        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    taken_epoch bigint,
    done        boolean     NOT NULL DEFAULT false,
    done_at     timestamptz,
    seq         bigint,
    duplicate   boolean,
    event_id    text,
    error       text,
    PRIMARY KEY (cluster, id)
);
CREATE INDEX dws_inbox_pending ON dws_inbox (cluster, id) WHERE NOT done;

-- Each host's named subscriptions (a `store::Snapshot`), saved by its
-- committer. `dropped`: subscriptions this host removed while another host
-- still had them, so that its next start does not take them back from the
-- cluster's definitions.
CREATE TABLE dws_host_snapshot (
    cluster  text        NOT NULL,
    host     text        NOT NULL,
    snapshot jsonb       NOT NULL,
    dropped  text[]      NOT NULL DEFAULT '{}',
    saved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, host)
);
"#;

/// Every migration, in order; entry `i` brings the schema to version `i + 1`.
/// Migration 3: shared delivery. A claim is `done` once its event was acked
/// (kept, so no other host claims it again); a claim of a host is renewed
/// while the host lives and expires when it does not.
const V3: &str = r#"
ALTER TABLE dws_claim ADD COLUMN done boolean NOT NULL DEFAULT false;
CREATE INDEX dws_claim_held ON dws_claim (cluster, host) WHERE NOT done;
"#;

/// Migration 4: the upstream lease as a time-bounded row (lease.rs), and
/// the idempotency key of a forwarded publish (inbox.rs).
const V4: &str = r#"
-- lease: the owner's lease expires on the database's clock unless renewed;
-- owner_pid/owner_backend_start name its lease session, whose end frees it.
ALTER TABLE dws_cluster ADD COLUMN lease_expires_at timestamptz;
ALTER TABLE dws_cluster ADD COLUMN owner_pid integer;
ALTER TABLE dws_cluster ADD COLUMN owner_backend_start timestamptz;
-- A forwarded publish's idempotency key, chosen by the publishing host: a
-- push whose answer was lost is found again by it, never pushed twice.
ALTER TABLE dws_inbox ADD COLUMN key text;
CREATE UNIQUE INDEX dws_inbox_key ON dws_inbox (cluster, key) WHERE key IS NOT NULL;
"#;

/// Migration 5: shared delivery under faults. A claim belongs to one host
/// *incarnation* (a random id per busd start, registered in `dws_host`): a
/// restarted host never renews its dead incarnation's claims, they expire.
/// A claim row can also record a loss: an event retention evicted before
/// any host delivered it (`lost`, done), reported once by a gap on the
/// host that takes it (`reported`).
const V5: &str = r#"
-- shared: claims per host incarnation; losses to retention as claim rows.
ALTER TABLE dws_host ADD COLUMN incarnation text NOT NULL DEFAULT '';
ALTER TABLE dws_claim ADD COLUMN incarnation text NOT NULL DEFAULT '';
ALTER TABLE dws_claim ADD COLUMN lost boolean NOT NULL DEFAULT false;
ALTER TABLE dws_claim ADD COLUMN reported boolean NOT NULL DEFAULT false;
DROP INDEX dws_claim_held;
CREATE INDEX dws_claim_held ON dws_claim (cluster, incarnation) WHERE NOT done;
CREATE INDEX dws_claim_unreported ON dws_claim (cluster, subscription)
    WHERE lost AND NOT reported;
"#;

/// Migration 6: a definition's record may carry `--where` expressions
/// (`"where"`, an array of strings). The version is what matters: a busd
/// older than this one would ignore the field and deliver what the
/// expressions exclude, so it must refuse the database (`too_new`).
const V6: &str = r#"
-- i25-where: definitions carry `--where` in record->'where'; older hosts must not adopt them.
ALTER TABLE dws_subscription ADD CONSTRAINT dws_subscription_where_is_array
    CHECK (jsonb_typeof(coalesce(record->'where', '[]'::jsonb)) = 'array');
"#;

pub(crate) const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6];

/// The refusal of a database newer than this binary.
pub(crate) fn too_new(found: u32) -> Option<PgError> {
    (found > SCHEMA_VERSION).then(|| {
        PgError::Other(format!(
            "the cluster's database has schema version {found}, {TOO_NEW} ({SCHEMA_VERSION}): \
             another host runs a newer busd; upgrade this one"
        ))
    })
}

const TOO_NEW: &str = "newer than this busd knows";

/// Whether `e` is [`migrate`]'s refusal of a newer schema (the store
/// refuses to start on it rather than failing).
pub(crate) fn is_too_new(e: &PgError) -> bool {
    matches!(e, PgError::Other(m) if m.contains(TOO_NEW))
}

/// Brings the schema to [`SCHEMA_VERSION`] and returns it. Safe to run from
/// several hosts at once; refuses a newer schema without touching it.
pub async fn migrate(client: &mut Client) -> Result<u32, PgError> {
    super::bounded_by(
        super::MIGRATION_BOUND,
        "the schema migration",
        migrate_now(client),
    )
    .await
}

async fn migrate_now(client: &mut Client) -> Result<u32, PgError> {
    let q = |e: tokio_postgres::Error| PgError::query(&e);
    let tx = client.transaction().await.map_err(q)?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        .await
        .map_err(q)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .map_err(|e| match e.code() {
            Some(c) if *c == tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE => {
                PgError::Other(format!(
                    "PostgreSQL: another host held the schema migration lock for over {LOCK_TIMEOUT}"
                ))
            }
            _ => q(e),
        })?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS dws_schema_version (
             version    integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(q)?;
    let found: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM dws_schema_version",
            &[],
        )
        .await
        .map_err(q)?
        .get(0);
    let found = u32::try_from(found).unwrap_or(0);
    if let Some(e) = too_new(found) {
        return Err(e);
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = i as i32 + 1;
        tx.batch_execute(sql).await.map_err(q)?;
        tx.execute(
            "INSERT INTO dws_schema_version (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(q)?;
        tracing::info!(target: "busd::postgres", "schema migrated to version {version}");
    }
    tx.commit().await.map_err(q)?;
    Ok(SCHEMA_VERSION)
}
