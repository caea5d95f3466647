//! The accept loop. Each accepted connection runs in its own task, tracked so
//! shutdown can wait for the drain; a connection's errors never reach here.

use std::{sync::Arc, time::Duration};

use proto::v1::ByeReason;
use tokio::{net::UnixListener, sync::Semaphore};
use tokio_util::task::TaskTracker;

use crate::{connection, hub::Hub, shutdown::Shutdown};

/// Most simultaneous connections. Each costs a task and two small buffers;
/// far more than any number of local agents, small enough to bound memory.
pub const MAX_CONNECTIONS: usize = 1024;

/// Accepts until the shutdown fires; returns its reason.
pub async fn run(
    listener: UnixListener,
    hub: Hub,
    mut shutdown: Shutdown,
    tracker: &TaskTracker,
) -> ByeReason {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return ByeReason::Shutdown,
            },
            r = shutdown.recv() => return r,
        };
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    let hub = hub.clone();
                    let sd = shutdown.clone();
                    tracker.spawn(async move {
                        connection::serve(stream, hub, sd).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(cause = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            r = shutdown.recv() => return r,
        }
    }
}
