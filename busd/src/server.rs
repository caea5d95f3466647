//! The accept loop. Each accepted connection runs in its own task, tracked so
//! shutdown can wait for the drain; a connection's errors never reach here.
//!
//! Over [`MAX_CONNECTIONS`] a new client is not left hanging: it is accepted,
//! told `Error{RESOURCE_EXHAUSTED}` with one non-blocking write, and closed,
//! while everyone already connected is served. A failing `accept` (out of
//! file descriptors) backs off, doubling up to a second, and is logged at
//! most once per interval.

use std::{sync::Arc, time::Duration};

use bytes::BytesMut;
use proto::v1::{self, server_frame::Kind as S, ByeReason, ErrorCode};
use tokio::{
    net::{UnixListener, UnixStream},
    sync::Semaphore,
};
use tokio_util::task::TaskTracker;

use crate::{
    cluster::Link,
    connection,
    hub::{RefusedKind, Sessions},
    lines::Lines,
    ratelimit::LogLimit,
    shutdown::Shutdown,
    warn_limited,
};

/// Most simultaneous connections. Each costs a task and two small buffers;
/// far more than any number of local agents, small enough to bound memory.
pub const MAX_CONNECTIONS: usize = 1024;

/// Accepts until the shutdown fires; returns its reason.
pub async fn run(
    listener: UnixListener,
    sessions: Sessions,
    link: Option<Arc<Link>>,
    mut shutdown: Shutdown,
    tracker: &TaskTracker,
) -> ByeReason {
    // The bus's renderings of its lines, shared by every connection, and
    // the limits of their warnings and of the accept loop's.
    let rendered = Lines::with_a_ring(sessions.line_bytes());
    let client_warnings = Arc::new(LogLimit::new(Duration::from_secs(10)));
    let accept_warnings = LogLimit::new(Duration::from_secs(10));
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let mut backoff = Duration::ZERO;
    loop {
        tokio::select! {
            // Shutdown first: once it fired, no client is accepted here, so
            // one arriving now finds no socket and starts a successor.
            biased;
            r = shutdown.recv() => return r,
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    backoff = Duration::ZERO;
                    match permits.clone().try_acquire_owned() {
                        Ok(permit) => {
                            let session = sessions.open();
                            let link = link.clone();
                            let rendered = rendered.clone();
                            let warnings = client_warnings.clone();
                            let sd = shutdown.clone();
                            tracker.spawn(async move {
                                connection::serve(stream, session, link, rendered, warnings, sd)
                                    .await;
                                drop(permit);
                            });
                        }
                        Err(_) => refuse(stream, &sessions, &refusals, &accept_warnings),
                    }
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    warn_limited!(accept_warnings, cause = %e, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        r = shutdown.recv() => return r,
                    }
                }
            },
        }
    }
}

/// Refused connections lingering at once to let their Error frame be read.
const MAX_REFUSALS: usize = 64;
/// How long a refused connection lingers.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// Tells a client over the connection limit why, without waiting for it:
/// one non-blocking write, then (within [`MAX_REFUSALS`]) a short linger
/// that reads and discards what the client sent, since closing a socket
/// with unread input would reset it and could lose the Error frame.
fn refuse(stream: UnixStream, sessions: &Sessions, refusals: &Arc<Semaphore>, warnings: &LogLimit) {
    sessions.count_refused(RefusedKind::Connections);
    warn_limited!(
        warnings,
        limit = MAX_CONNECTIONS,
        "connection refused: too many connections"
    );
    let frame = v1::ServerFrame {
        kind: Some(S::Error(v1::Error {
            request_id: 0,
            code: ErrorCode::ResourceExhausted as i32,
            message: format!("too many connections ({MAX_CONNECTIONS} open); try again later"),
        })),
    };
    let mut buf = BytesMut::new();
    if proto::encode_frame(&frame, &mut buf).is_ok() {
        // A fresh socket's buffer takes this small frame whole; if not, the
        // client sees the connection close, which is still not a hang.
        let _ = stream.try_write(&buf);
    }
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let mut scratch = [0u8; 4096];
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            while matches!(stream.read(&mut scratch).await, Ok(n) if n > 0) {}
        })
        .await;
        drop(permit);
    });
}

/// Raises the soft limit on open files to the hard limit, so the connection
/// limit, not the fd limit, is what clients meet.
pub fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(cause = %e, soft, hard, "cannot raise the open-files limit");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(cause = %e, "cannot read the open-files limit"),
    }
}
