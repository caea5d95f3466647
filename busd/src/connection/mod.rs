//! One client connection: reads `ClientFrame`s, answers them through its
//! [`Session`] of the hub, and streams deliveries to an attached consumer.
//!
//! This module owns [`serve`]: the `select!` loop of one connection, its
//! deadlines and the buffering of its input with the bounds on it. The rest
//! is split by job:
//! - `requests`: frame dispatch (Hello, subscribe, publish, stop, status,
//!   subscription control) and bad frames;
//! - `replies`: replies that wait for the store (`Waiting`) — a
//!   publisher's and a subscriber's, and a publish forwarded through the
//!   cluster's `Link`;
//! - `consumer`: an attached consumer's own state (`Consumer`, made when
//!   it attaches: its frames' form, its ring holds, freed on drop);
//! - `delivery`: the outbound buffer — events pulled from the hub, NDJSON
//!   line batches, source-state changes, `Error` and `Bye`;
//! - `line_frames`: the frames of lines rendered once for every consumer
//!   (`crate::lines`): `LineBatch` bytes, or `RingBatch` for a consumer
//!   that reads the line ring, and the ring handed to one that asks;
//!   `outbox`: the outbound buffer, which queues shared bytes without
//!   copying them.
//!
//! Each connection owns an outbound buffer. Frames are appended to it and the
//! buffer is written with one `write` per wake-up, so a burst of events costs
//! one syscall (and one reader wake-up) instead of one per frame. Reading,
//! writing, hub wake-ups and the shutdown signal are all arms of one
//! `select!`, so a consumer that stops reading only stalls its own writes: the
//! connection still sees shutdown and kicks, and the hub never waits for it.
//!
//! A bad frame (oversized, undecodable, truncated, wrong version) gets an
//! `Error` frame where the socket still allows it, then the connection is
//! closed. Nothing a peer sends can take down the bus or another connection.
//!
//! Every resource a client can make a connection spend is bounded: requests
//! are neither read nor decoded while [`OUT_READ_PAUSE`] bytes of replies
//! wait unread — checked before every frame, so requests pipelined in one
//! read stop there too and wait in the input buffer (a client that never
//! reads stalls itself); input is buffered as it arrives,
//! never by the length a frame announces, and what all connections hold
//! beyond their first 64 KiB is charged to one global bound; a client must
//! say Hello within [`HELLO_DEADLINE`] and finish a started frame within
//! [`FRAME_DEADLINE`].

mod consumer;
mod delivery;
mod line_frames;
mod outbox;
mod replies;
mod requests;
mod socket;

use std::{sync::Arc, time::Duration};

use bytes::BytesMut;
use consumer::Consumer;
use outbox::Outbox;
use proto::{time::sleep_until_opt, v1::ErrorCode, CodecError, ServerCodec};
use tokio::{net::UnixStream, time::Instant};
use tokio_util::codec::Decoder;

use crate::{
    cluster::Link,
    hub::{ConnId, RefusedKind, Session},
    lines::Lines,
    ratelimit::LogLimit,
    shutdown::Shutdown,
    warn_limited,
};

use replies::Waiting;

/// How long a closing connection may take to flush its final frames (Bye)
/// before it is dropped. Bounds the whole bus's shutdown drain.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Read buffer size: read the socket in large chunks.
const READ_CAPACITY: usize = 64 * 1024;

/// Requests are not read while this many bytes of output wait unread.
pub const OUT_READ_PAUSE: usize = 1 << 20;
/// Requests are not read while this many publishes wait for the disk.
const MAX_AWAITING: usize = 65_536;
/// A client must send Hello within this.
pub const HELLO_DEADLINE: Duration = Duration::from_secs(10);
/// A frame, once its first byte arrived, must be complete within this.
pub const FRAME_DEADLINE: Duration = Duration::from_secs(10);

/// How long a closing connection waits for its peer's EOF (reading and
/// discarding), so its last frames are not lost to a reset.
const CLOSE_LINGER: Duration = Duration::from_millis(200);

enum Phase {
    AwaitHello,
    Ready,
}

pub struct Connection {
    /// This connection's end of the hub (unregisters it when dropped).
    session: Session,
    /// `store = "postgres"`: where publishes go while this host does not
    /// own the cluster's log (the hub itself knows nothing of the cluster).
    link: Option<Arc<Link>>,
    id: ConnId,
    out: Outbox,
    phase: Phase,
    /// Set once the connection is going away; it then only flushes.
    closing: bool,
    source_gen: u64,
    /// A publisher's or a subscriber's replies waiting for the store (see
    /// `replies`).
    waiting: Waiting,
    /// Made when the connection attaches as a consumer (see `consumer`).
    consumer: Option<Consumer>,
    /// The bus's renderings (shared by every connection).
    rendered: Lines,
    /// A descriptor to pass with the next write (the ring, to a consumer
    /// that asked for it).
    pass_fd: Option<std::os::fd::OwnedFd>,
    /// The limit of every connection's warnings together.
    warnings: Arc<LogLimit>,
}

/// Serves one accepted connection until it closes. Errors stay here.
pub async fn serve(
    stream: UnixStream,
    session: Session,
    link: Option<Arc<Link>>,
    rendered: Lines,
    warnings: Arc<LogLimit>,
    mut shutdown: Shutdown,
) {
    let id = session.id();
    let durable = session.durable();
    let mut conn = Connection {
        session,
        link,
        id,
        out: Outbox::with_capacity(8 * 1024),
        phase: Phase::AwaitHello,
        closing: false,
        source_gen: 0,
        waiting: Waiting::new(durable),
        consumer: None,
        rendered,
        pass_fd: None,
        warnings,
    };
    let peer_ok = stream
        .peer_cred()
        .map(|cred| cred.uid() == nix::unistd::geteuid().as_raw());
    match peer_ok {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!("refused a connection from a foreign uid");
            conn.error(
                0,
                ErrorCode::PermissionDenied,
                "connection from another user refused",
            );
            conn.closing = true;
        }
        Err(e) => {
            tracing::warn!(cause = %e, "cannot read peer credentials");
            conn.closing = true;
        }
    }
    let (rd, mut wr) = match socket::split(stream) {
        Ok(halves) => halves,
        Err(e) => {
            tracing::warn!(conn = id, cause = %e, "cannot set up the connection's socket");
            return;
        }
    };
    let mut codec = ServerCodec::new();
    let mut input = BytesMut::with_capacity(READ_CAPACITY);
    let mut charged = 0;
    let mut frame_started: Option<Instant> = None;
    let mut paused = false;
    // Complete frames wait in `input`, undecoded, because a bound was reached.
    let mut held = false;
    let hello_deadline = Instant::now() + HELLO_DEADLINE;
    let mut drain_deadline = conn.closing.then(|| Instant::now() + DRAIN_TIMEOUT);
    let mut write_failed = false;

    loop {
        conn.answer_durable();
        if !conn.closing {
            if let Some(reason) = conn.session.take_kick() {
                conn.bye(reason);
            } else if matches!(conn.phase, Phase::Ready) {
                conn.fill();
            }
        }
        if conn.closing {
            drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN_TIMEOUT);
            // Publishes still waiting for the disk are answered first.
            if conn.out.is_empty() && conn.waiting.is_empty() {
                let _ = wr.shutdown();
                // Close with nothing unread: a socket closed with unread
                // input resets the peer, which could lose our last frames
                // (an Error it has not read yet). Linger briefly for its EOF.
                let _ = tokio::time::timeout(CLOSE_LINGER, async {
                    while matches!(rd.discard().await, Ok(n) if n > 0) {}
                })
                .await;
                break;
            }
        }
        // Frames read but left undecoded at a bound are taken up again as
        // soon as the client has read enough of its replies.
        if held && !conn.closing && may_decode(conn.out.len(), conn.waiting.len()) {
            held = conn
                .decode_input(&mut codec, &mut input, &mut frame_started)
                .await;
        }
        let backed_up = !may_decode(conn.out.len(), conn.waiting.len());
        let can_read = !conn.closing && !backed_up && !held;
        let pause = backed_up && !conn.closing;
        if pause != paused {
            conn.session.reader_paused(pause);
            paused = pause;
        }
        let client_deadline = if conn.closing {
            None
        } else {
            let hello = matches!(conn.phase, Phase::AwaitHello).then_some(hello_deadline);
            let frame = frame_started.map(|t| t + FRAME_DEADLINE);
            hello.into_iter().chain(frame).min()
        };
        let deadline = drain_deadline.into_iter().chain(client_deadline).min();
        let redeliver_at = conn.redeliver_at();
        tokio::select! {
            reason = shutdown.recv(), if !conn.closing => conn.bye(reason),
            res = conn.out.write_to(&mut wr, conn.pass_fd.as_ref()), if !conn.out.is_empty() => {
                match res {
                    // The descriptor went with the first byte written.
                    Ok(_) => conn.pass_fd = None,
                    Err(e) => {
                        tracing::debug!(conn = id, cause = %e, "write failed");
                        write_failed = true;
                        break;
                    }
                }
            }
            res = rd.read_buf(&mut input), if can_read => match res {
                Ok(0) => {
                    // The client is done sending; answer what it asked, then close.
                    if !input.is_empty() {
                        conn.bad_frame(&CodecError::Truncated);
                    }
                    conn.closing = true;
                }
                // The shutdown fired while this task slept, and the select
                // took the read first: answer nothing of it, say Bye. A
                // client that arrived as the bus began to exit (a consumer
                // about to subscribe) goes to the successor instead of
                // printing ready on a bus that is going away.
                Ok(_) if shutdown.reason().is_some() => {
                    if let Some(reason) = shutdown.reason() {
                        conn.bye(reason);
                    }
                }
                Ok(_) => {
                    held = conn
                        .decode_input(&mut codec, &mut input, &mut frame_started)
                        .await;
                    let over = input.capacity().saturating_sub(READ_CAPACITY);
                    if !conn.session.charge_input(&mut charged, over) {
                        warn_limited!(conn.warnings, conn = id, "input bound reached; client refused");
                        conn.session.count_refused(RefusedKind::InputBudget);
                        conn.error(
                            0,
                            ErrorCode::ResourceExhausted,
                            format!(
                                "the bus holds too much partially received input ({} MiB across \
                                 all connections); this connection is closed, try again later",
                                crate::hub::MAX_BUFFERED_INPUT >> 20
                            ),
                        );
                        conn.closing = true;
                    }
                }
                Err(e) => {
                    tracing::debug!(conn = id, cause = %e, "read failed");
                    break;
                }
            },
            _ = conn.session.wake().notified() => {}
            _ = conn.waiting.changed(), if !conn.waiting.is_empty() => {}
            _ = sleep_until_opt(redeliver_at.map(Instant::from_std)), if !conn.closing => {}
            _ = sleep_until_opt(deadline) => {
                if conn.closing {
                    warn_limited!(conn.warnings, conn = id, "drain timed out; dropping connection");
                    break;
                }
                conn.session.count_refused(RefusedKind::SlowClient);
                let message = if matches!(conn.phase, Phase::AwaitHello) {
                    format!("no Hello within {}s; closing", HELLO_DEADLINE.as_secs())
                } else {
                    format!(
                        "a frame was started but not completed within {}s; closing",
                        FRAME_DEADLINE.as_secs()
                    )
                };
                warn_limited!(conn.warnings, conn = id, "slow client: {message}");
                conn.error(0, ErrorCode::BadRequest, message);
                conn.closing = true;
            }
        }
    }
    if write_failed {
        // Gone while the bus wrote to it: the acks it sent before, read or
        // still in the socket, count (else what it wrote comes again).
        let _ = tokio::time::timeout(CLOSE_LINGER, async {
            while conn.acks_left(&mut codec, &mut input)
                && matches!(rd.read_buf(&mut input).await, Ok(n) if n > 0)
            {}
        })
        .await;
    }
    conn.session.charge_input(&mut charged, 0);
    if paused {
        conn.session.reader_paused(false);
    }
    drop(wr);
    // Dropping the connection frees what its consumer was told of in the
    // ring and unregisters its session.
}

/// Frames one connection decodes and handles before the serving thread
/// turns to the other tasks, and the longest such turn.
const TURN_FRAMES: usize = 64;
const TURN_TIME: Duration = Duration::from_millis(2);

/// The decode-stop rule: the next frame already read is decoded (and
/// answered) only while the client has less than [`OUT_READ_PAUSE`] bytes of
/// output unread and fewer than [`MAX_AWAITING`] replies wait for the store.
/// Checked before every frame, not once per read: one read can hold
/// thousands of small requests whose replies are each far larger.
fn may_decode(out_len: usize, awaiting: usize) -> bool {
    out_len < OUT_READ_PAUSE && awaiting < MAX_AWAITING
}

impl Connection {
    /// Decodes and handles the frames in `input` until it holds no complete
    /// frame, the connection closes, or [`may_decode`] says stop. Whether
    /// complete frames were left undecoded (held until the client reads).
    async fn decode_input(
        &mut self,
        codec: &mut ServerCodec,
        input: &mut BytesMut,
        frame_started: &mut Option<Instant>,
    ) -> bool {
        let mut decoded = false;
        let mut held = false;
        let mut turn = (Instant::now(), 0usize);
        while !self.closing {
            if !may_decode(self.out.len(), self.waiting.len()) {
                held = !input.is_empty();
                break;
            }
            match codec.decode(input) {
                Ok(Some(frame)) => {
                    decoded = true;
                    self.handle(frame).await;
                    // Pipelined requests take their turn with everyone
                    // else's: the one serving thread goes round the other
                    // tasks after a turn's frames or time.
                    turn.1 += 1;
                    if turn.1 >= TURN_FRAMES || turn.0.elapsed() >= TURN_TIME {
                        tokio::task::yield_now().await;
                        turn = (Instant::now(), 0);
                    }
                }
                Ok(None) => break,
                Err(e) => self.bad_frame(&e),
            }
        }
        // The frame deadline is for a client that started a frame and did
        // not finish it, never for one whose frames wait for it to read.
        *frame_started = match (input.is_empty() || held, *frame_started) {
            (true, _) => None,
            (false, Some(t)) if !decoded => Some(t),
            (false, _) => Some(Instant::now()),
        };
        if input.is_empty() && input.capacity() > READ_CAPACITY {
            *input = BytesMut::with_capacity(READ_CAPACITY);
        } else if !held && input.capacity() - input.len() < READ_CAPACITY / 4 {
            input.reserve(READ_CAPACITY);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::{may_decode, MAX_AWAITING, OUT_READ_PAUSE};

    #[test]
    fn decoding_stops_at_either_bound_and_resumes_below_both() {
        assert!(may_decode(0, 0));
        assert!(may_decode(OUT_READ_PAUSE - 1, MAX_AWAITING - 1));
        assert!(!may_decode(OUT_READ_PAUSE, 0), "unread output");
        assert!(
            !may_decode(0, MAX_AWAITING),
            "replies waiting for the store"
        );
        assert!(
            !may_decode(OUT_READ_PAUSE + (4 << 20), 0),
            "one large reply over it"
        );
    }
}
