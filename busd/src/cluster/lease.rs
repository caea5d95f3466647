//! The lease task: contends for the cluster's upstream lease; once this host
//! holds it, reads the log to its head, becomes the owner (the store appends
//! under the lease's epoch from then on), opens the upstream source and
//! drains the other hosts' publishes. A lost lease stops the bus: the store
//! is marked failed, so every waiting reply is answered with the reason and
//! nothing more is appended or acked upstream. The lease is held until the
//! process ends (its session closes with it, which frees it at once).

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use super::{forward, run_source, tail, Link};
use crate::{
    shutdown::Shutdown,
    source::Source,
    store::postgres::{
        self,
        lease::{Lease, LeaseTiming},
    },
};

pub(super) async fn run(link: Arc<Link>, source: Box<dyn Source>, mut shutdown: Shutdown) {
    let timing = LeaseTiming::default();
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
    // Everything the previous owner appended is in the log now (the epoch
    // bump waited for its last append): read it before sequencing anything.
    let caught_up = match postgres::connect(&link.settings, "takeover").await {
        Ok((client, _driver)) => tail::catch_up(&link, &client).await,
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
    run_source(&link, source, shutdown.clone());
    tokio::spawn(forward::drain(link.clone(), shutdown.clone()));
    tokio::select! {
        reason = lease.lost() => {
            link.epoch.store(0, Ordering::Release);
            link.hub.store_failed(format!("lost the cluster's upstream lease: {reason}"));
        }
        _ = shutdown.recv() => {
            // Held until the process ends: the final flush still appends.
            std::future::pending::<()>().await;
        }
    }
    drop(lease);
}
