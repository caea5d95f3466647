//! The PostgreSQL cluster store (issue 11): connecting ([`connect`],
//! [`listen`]), the schema ([`schema`]), the cluster's log ([`log`]) and
//! the owner's appends to it ([`append`], fenced by [`fence`]), the named
//! subscriptions' definitions ([`definitions`]), the profile keys
//! ([`settings`]) and the [`store::PgStore`] behind the storage boundary.
//! The cluster's coordination tables — the upstream owner's lease, the
//! inbox through which other hosts publish, shared delivery's claims and the
//! hosts status shows — are `crate::cluster::db`'s, never the store's.
//!
//! The cluster model (v1):
//! - **One cluster, one log.** Several hosts, each running its own per-user
//!   `busd`, share one *cluster* (a name, by default the profile's): one
//!   ordered event log (`dws_event`, seq per cluster) and its dedup keys.
//!   Every table is keyed by the cluster name, so several clusters can share
//!   one database ([`schema`]).
//! - **One owner.** Exactly one host holds the cluster's upstream
//!   connection and appends to the log: the holder of the lease row, a
//!   time-bounded lease on the database's clock renewed from a dedicated
//!   connection (`cluster::db::lease`). Each acquisition bumps the cluster's *epoch*;
//!   every append checks it and the lease's expiry inside its transaction
//!   ([`log::append`]), so a host that lost its lease (or could not renew
//!   it: frozen, stalled, cut off) cannot append, hence cannot ack upstream
//!   what it did not store.
//! - **Followers.** The other hosts never append: their log is fed from the
//!   database ([`log::read_after`], woken by [`log::LOG_CHANNEL`]); their
//!   publishes go through the inbox (`cluster::db::inbox`) to the owner.
//! - **Subscriptions per host.** Each host keeps its own named
//!   subscriptions (its `store::Snapshot`, in `dws_host_snapshot`); their
//!   definitions are published cluster-wide (`dws_subscription`) and every
//!   host's cursors too (`dws_cursor`), for status and so that a consumer on
//!   another host can attach to a subscription created elsewhere. Shared
//!   subscriptions' events go to one host incarnation at a time through
//!   their claims (`dws_claim`, `cluster::db::claims`).
//!
//! It reaches PostgreSQL through `crate::pg`, the one door to it (settings,
//! errors, connections, TLS, the statement bound, the schema).

pub mod append;
pub mod log;
pub mod lost;
mod session;
pub mod store;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_claims;
#[cfg(test)]
mod tests_fence;
#[cfg(test)]
mod tests_log;
#[cfg(test)]
mod tests_store;

// What this store's files take from the PostgreSQL layer.
pub(crate) use crate::pg::{
    bounded, connect, definitions, fence, no_answer, schema, Driver, PgError, PgSettings,
    IDLE_IN_TRANSACTION_BOUND, STATEMENT_BOUND,
};
#[cfg(test)]
pub(crate) use crate::pg::{config, listen};
