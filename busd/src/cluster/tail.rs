//! The follower's tail: reads the shared log past this host's head into the
//! hub ([`ReplicaPort::replicated`](crate::hub::ReplicaPort::replicated)), woken by
//! `NOTIFY dws_log` (one per committed batch) and by a poll every
//! [`TAIL_POLL`] that also covers notifications missed while the listening
//! session was down. It stops when this host becomes the owner (the lease
//! task then reads the rest itself, see `lease`). A broken session — or
//! one whose statement got no answer within its bound
//! (`postgres::STATEMENT_BOUND`: a path that swallows bytes looks healthy to
//! TCP) — is reopened with a backoff; meanwhile the host's consumers are
//! told the source is `reconnecting` (within the poll plus that bound of
//! the cut), and `connected` again once the tail has read on from where it
//! was, so nothing is skipped.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use proto::v1;

use super::{Link, TAIL_POLL};
use crate::{
    pg::{self, log, Client, PgError},
    shutdown::Shutdown,
};

/// Rows read per query.
const BATCH: i64 = 1000;

/// Runs the tail until this host takes over (or the bus stops), then says
/// it stopped: the lease task reads the rest of the log only after that, so
/// no batch of the tail can land after the new owner's own first append.
pub(super) async fn run(link: Arc<Link>, shutdown: Shutdown) {
    follow(&link, shutdown).await;
    link.tail_running.store(false, Ordering::SeqCst);
    link.tail_stopped.notify_waiters();
}

async fn follow(link: &Arc<Link>, mut shutdown: Shutdown) {
    let link = link.clone();
    let mut backoff = Duration::from_millis(100);
    let mut down = false;
    while !link.taking_over() {
        let session = pg::listen(&link.settings, "tail", &["dws_log"]).await;
        let (client, _driver, mut notified) = match session {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(cause = %e, "cannot read the cluster log; retrying");
                if !down && !link.is_owner() {
                    down = true;
                    follower_state(
                        &link,
                        v1::SourceStatus::Reconnecting,
                        format!("the cluster store is reconnecting: {e}"),
                    );
                }
                tokio::select! {
                    _ = shutdown.recv() => return,
                    _ = link.became_owner.notified() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        loop {
            if link.taking_over() {
                return;
            }
            if let Err(e) = catch_up(&link, &client, true).await {
                tracing::warn!(cause = %e, "reading the cluster log failed; reconnecting");
                // The consumers hear at once that events stopped arriving
                // (a path that swallows bytes shows only as a statement
                // without an answer, after its bound), not after the
                // reconnect's own bound.
                if !down && !link.is_owner() {
                    down = true;
                    follower_state(
                        &link,
                        v1::SourceStatus::Reconnecting,
                        format!("the cluster store is reconnecting: {e}"),
                    );
                }
                break;
            }
            if down && !link.is_owner() {
                down = false;
                follower_state(&link, v1::SourceStatus::Connected, super::FOLLOWER.into());
            }
            tokio::select! {
                _ = shutdown.recv() => return,
                _ = link.became_owner.notified() => return,
                n = notified.recv() => if n.is_none() { break },
                _ = tokio::time::sleep(TAIL_POLL) => {}
            }
        }
    }
}

/// A follower's source state: its upstream is the cluster log.
fn follower_state(link: &Link, status: v1::SourceStatus, reason: String) {
    link.hub.set_source_state(
        v1::SourceState {
            state: status as i32,
            reason,
            since_unix_ms: crate::clock::now_ms(),
            ..Default::default()
        },
        None,
    );
}

/// Reads the log past the hub's head until there is nothing more — or,
/// for the tail (`yield_to_takeover`), until this host starts taking over.
pub(super) async fn catch_up(
    link: &Link,
    client: &Client,
    yield_to_takeover: bool,
) -> Result<u64, PgError> {
    let cluster = &link.settings.cluster;
    let mut read = 0;
    loop {
        if yield_to_takeover && link.taking_over() {
            return Ok(read);
        }
        let head = link.hub.head_seq();
        let rows = log::read_after(client, cluster, head, BATCH).await?;
        let n = rows.len();
        read += n as u64;
        if n == 0 {
            return Ok(read);
        }
        let batch = rows
            .into_iter()
            .map(|r| Arc::new(r.into_logged()))
            .collect();
        link.hub.replicated(batch);
        if (n as i64) < BATCH {
            return Ok(read);
        }
    }
}
