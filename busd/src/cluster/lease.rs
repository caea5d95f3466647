//! The lease task: contends for the cluster's upstream lease; once this host
//! holds it, reads the log to its head, becomes the owner (the store appends
//! under the lease's epoch from then on), opens the upstream source and
//! drains the other hosts' publishes. A lease whose session died, or whose
//! renewal came too late (it expired on the database's clock), is taken
//! back ([`regain`]) if no other host took it meanwhile — a PostgreSQL
//! restart is ridden out; otherwise the bus stops: the store is marked
//! failed, so every waiting reply is answered with the reason and nothing
//! more is appended or acked upstream. The lease is held until the
//! process ends (its session closes with it, which frees it at once).

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use proto::v1;

use super::{
    db::lease::{Lease, LeaseSession, LeaseTiming},
    forward, run_source, tail, Link, SourceFactory,
};
use crate::{
    pg::{self, fence::REGAINING, log, OUTAGE_BOUND},
    shutdown::Shutdown,
};

pub(super) async fn run(link: Arc<Link>, source: SourceFactory, mut shutdown: Shutdown) {
    let timing = LeaseTiming::for_bound(link.settings.lease);
    let mut backoff = Duration::from_millis(200);
    let lease = loop {
        tokio::select! {
            _ = shutdown.recv() => return,
            got = Lease::acquire_or_wait(&link.settings, timing) => match got {
                Ok(lease) => break lease,
                Err(e) => {
                    tracing::warn!(cause = %e, "cannot contend for the cluster's upstream lease; retrying");
                    tokio::select! {
                        _ = shutdown.recv() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            },
        }
    };
    let started = Instant::now();
    // The tail stops first (it could otherwise add a batch after this
    // host's own first append).
    link.start_takeover().await;
    // Everything the previous owner appended is in the log now (the epoch
    // bump waited for its last append): read it before sequencing anything.
    let caught_up = match pg::connect(&link.settings, "takeover").await {
        Ok((client, _driver)) => tail::catch_up(&link, &client, false).await,
        Err(e) => Err(e),
    };
    if let Err(e) = caught_up {
        link.hub.store_failed(format!(
            "took the cluster's upstream lease but cannot read the log: {e}"
        ));
        return;
    }
    link.epoch.store(lease.epoch(), Ordering::Release);
    link.owner.store(true, Ordering::Release);
    link.became_owner.notify_waiters();
    tracing::info!(
        cluster = %link.settings.cluster,
        host = %link.settings.host,
        epoch = lease.epoch(),
        head_seq = link.hub.head_seq(),
        catch_up_ms = started.elapsed().as_millis() as u64,
        "this host owns the cluster's upstream"
    );
    let mut running = Some(run_source(&link, source(), shutdown.clone()));
    tokio::spawn(forward::drain(link.clone(), shutdown.clone()));
    let mut lease = lease;
    loop {
        tokio::select! {
            reason = lease.lost() => {
                // Not the owner until the lease is back: the upstream
                // closes now, so another owner's never overlaps it.
                link.epoch.store(REGAINING, Ordering::Release);
                if let Some(r) = running.take() {
                    r.stop().await;
                }
                match regain(&link, lease.epoch(), &reason).await {
                    Ok(again) => {
                        lease = again;
                        running = Some(run_source(&link, source(), shutdown.clone()));
                    }
                    Err(why) => {
                        link.epoch.store(0, Ordering::Release);
                        link.hub.lease_lost(format!("lost the cluster's upstream lease: {why}"));
                        return;
                    }
                }
            }
            _ = shutdown.recv() => {
                // Held until the process ends: the final flush still appends.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The lease's session died (the server restarted, the network broke, or
/// someone ended it): appends wait ([`REGAINING`]) while this host takes the
/// lease back. It may go on as the owner only if no other host held the
/// lease in between — its new epoch is exactly one above the old — so no
/// one else appended. Otherwise, or after [`OUTAGE_BOUND`], it is fenced.
/// Contends for the lease again until [`OUTAGE_BOUND`] — but gives up at
/// once when the cluster's epoch moved past `old_epoch`: another host took
/// the lease, and this one is fenced (its source and appends must stop now,
/// not when the bound runs out).
async fn take_back(link: &Link, old_epoch: i64, reason: &str) -> Result<Lease, String> {
    let s = &link.settings;
    let deadline = Instant::now() + OUTAGE_BOUND;
    let mut probe: Option<pg::Client> = None;
    let mut session: Option<LeaseSession> = None;
    let pause = || tokio::time::sleep(Duration::from_millis(250));
    loop {
        if Instant::now() >= deadline {
            return Err(format!(
                "{reason}; not regained within {}s",
                OUTAGE_BOUND.as_secs()
            ));
        }
        if probe.is_none() {
            probe = pg::connect(s, "regain").await.ok().map(|(c, _driver)| c);
        }
        let Some(client) = &probe else {
            pause().await;
            continue;
        };
        match log::cluster_row(client, &s.cluster).await {
            Ok(row) if row.epoch > old_epoch => {
                return Err(format!(
                    "{reason}; {} took it (epoch {old_epoch} → {})",
                    row.owner_host.as_deref().unwrap_or("another host"),
                    row.epoch
                ))
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(cause = %e, "the cluster store is still unreachable");
                probe = None;
                session = None;
                pause().await;
                continue;
            }
        }
        let contender = match session.take() {
            Some(sess) => Ok(sess),
            None => LeaseSession::open(s).await,
        };
        match contender {
            Ok(sess) => match sess.try_acquire(LeaseTiming::for_bound(s.lease)).await {
                Ok(Ok(lease)) => return Ok(lease),
                Ok(Err(back)) => session = Some(back),
                Err(e) => tracing::debug!(cause = %e, "taking the lease back failed"),
            },
            Err(e) => tracing::debug!(cause = %e, "the cluster store is still unreachable"),
        }
        pause().await;
    }
}

/// How long a host that lost its lease's session waits before taking it
/// back (see [`regain`]).
const REGAIN_GRACE: Duration = Duration::from_secs(1);

async fn regain(link: &Link, old_epoch: i64, reason: &str) -> Result<Lease, String> {
    link.epoch.store(REGAINING, Ordering::Release);
    tracing::warn!(cause = %reason, "lost the cluster's upstream lease; taking it back");
    // A live follower (it retries every half second) gets the first chance:
    // a session ended on purpose, or a lease that expired because this host
    // stalled, moves the upstream; after a server restart the followers may
    // not take the unexpired lease (`cluster::db::lease`), so this host
    // takes it back.
    tokio::time::sleep(REGAIN_GRACE).await;
    let state = |status: v1::SourceStatus, why: String| {
        link.hub.set_source_state(
            v1::SourceState {
                state: status as i32,
                reason: why,
                since_unix_ms: crate::clock::now_ms(),
                ..Default::default()
            },
            None,
        )
    };
    state(
        v1::SourceStatus::Reconnecting,
        format!("the cluster store is reconnecting: {reason}"),
    );
    let got = take_back(link, old_epoch, reason).await?;
    if got.epoch() != old_epoch + 1 {
        return Err(format!(
            "{reason}; another host held it meanwhile (epoch {old_epoch} → {})",
            got.epoch()
        ));
    }
    link.epoch.store(got.epoch(), Ordering::Release);
    state(
        v1::SourceStatus::Connected,
        "the cluster store is connected again".into(),
    );
    tracing::info!(
        epoch = got.epoch(),
        "took the cluster's upstream lease back"
    );
    Ok(got)
}
