//! The client end of the bus socket: discover-or-spawn, the Hello handshake,
//! and request/reply helpers over the frame codec.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S, ByeReason},
    ClientCodec,
};
use tokio::{
    io::AsyncReadExt,
    net::{
        unix::{OwnedReadHalf, OwnedWriteHalf},
        UnixStream,
    },
    time::Instant,
};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::{
    exit::{CliError, Result},
    spawn::{spawn_bus, Spawned},
};

/// How long discover-or-spawn keeps trying before it gives up. Covers a bus
/// that is exiting (its successor waits for the lock) and a slow start. It
/// bounds every dial as a whole (connect, Hello, HelloAck): a listener that
/// accepts but never answers fails the command instead of hanging it.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

/// However little of [`CONNECT_DEADLINE`] is left, one dial gets at least
/// this long (a bus spawned at the end of the budget still gets to answer).
const DIAL_FLOOR: Duration = Duration::from_secs(2);

/// How long [`BusConn::bye`] waits for the bus to close its end.
const BYE_DRAIN: Duration = Duration::from_secs(1);

/// Whether a first request may be sent again to a fresh bus when the bus
/// went away without answering it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// Always (subscribe, status: doing them twice is harmless).
    Always,
    /// Only if it was never written (a publish without an id: a bus that
    /// died after reading it may have appended it).
    UnlessSent,
}

/// An open, greeted connection to the bus.
pub struct BusConn {
    pub reader: FramedRead<OwnedReadHalf, ClientCodec>,
    pub writer: FramedWrite<OwnedWriteHalf, ClientCodec>,
    pub hello: v1::HelloAck,
    next_request: u64,
}

/// Why a dial did not produce a connection.
enum DialError {
    /// No bus listens on the socket.
    NotRunning,
    /// A bus answered but went away before the handshake finished (it was
    /// exiting, e.g. idle): try again.
    Gone,
    Fatal(CliError),
}

/// Server frames that are not replies and may arrive at any time. Events
/// skipped while waiting for a reply were not written, so never acked: a
/// subscription that outlives this run gets them again.
fn is_unsolicited(kind: &S) -> bool {
    matches!(
        kind,
        S::SourceState(_)
            | S::Heartbeat(_)
            | S::Event(_)
            | S::EventLines(_)
            | S::LineBatch(_)
            | S::Gap(_)
            | S::WhereNotice(_)
    )
}

impl BusConn {
    /// Connects to a running bus; `Ok(None)` if none is running. Never spawns.
    pub async fn open(endpoint: &Endpoint) -> Result<Option<BusConn>> {
        let deadline = Instant::now() + CONNECT_DEADLINE;
        loop {
            match dial(endpoint, deadline).await {
                Ok(c) => return Ok(Some(c)),
                Err(DialError::NotRunning) => return Ok(None),
                Err(DialError::Gone) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(DialError::Gone) => return Ok(None),
                Err(DialError::Fatal(e)) => return Err(e),
            }
        }
    }

    /// Connects to the profile's bus, spawning one if none answers. Any
    /// number of clients may do this at once: the bus's lock makes exactly
    /// one of the spawned daemons win, and the others report "already running".
    pub async fn open_or_spawn(endpoint: &Endpoint) -> Result<BusConn> {
        let deadline = Instant::now() + CONNECT_DEADLINE;
        let mut last_err = String::from("no bus answered");
        loop {
            match dial(endpoint, deadline).await {
                Ok(c) => return Ok(c),
                Err(DialError::Fatal(e)) => return Err(e),
                Err(DialError::NotRunning) | Err(DialError::Gone) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CliError::runtime(format!(
                    "cannot reach the bus at {}: {last_err}",
                    endpoint.socket_path.display()
                )));
            }
            match spawn_bus(&endpoint.profile, left).await? {
                Spawned::Ready => {}
                Spawned::AlreadyRunning => {
                    last_err = "a bus holds the lock but does not accept connections".into();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Discover-or-spawn, then the first request. If the bus goes away
    /// before answering (it was exiting just as we arrived), start over on a
    /// fresh bus, within [`CONNECT_DEADLINE`].
    pub async fn open_and_request(
        endpoint: &Endpoint,
        build: impl FnMut(u64) -> C,
    ) -> Result<(BusConn, S)> {
        Self::open_and_request_with(endpoint, Resend::Always, build).await
    }

    /// [`BusConn::open_and_request`] for a request that must not be sent
    /// twice unless `resend` says so: once it was written, a bus that went
    /// away without answering may have acted on it (a publish appended
    /// before the bus died), so it is resent only when that is harmless.
    pub async fn open_and_request_with(
        endpoint: &Endpoint,
        resend: Resend,
        mut build: impl FnMut(u64) -> C,
    ) -> Result<(BusConn, S)> {
        let deadline = Instant::now() + CONNECT_DEADLINE;
        // A request sent to a bus that went away may have been acted on: if
        // no later attempt gets an answer, the failure must say so (the
        // cluster's fault suite saw `--id` publishes appended by a bus that
        // died, then told "cannot start the bus").
        let mut sent_before = false;
        let unknown = |e: CliError| {
            CliError::runtime(format!(
                "{}; the request had been sent, so its outcome is unknown",
                e.message
            ))
        };
        loop {
            let mut conn = match BusConn::open_or_spawn(endpoint).await {
                Ok(c) => c,
                Err(e) if sent_before => return Err(unknown(e)),
                Err(e) => return Err(e),
            };
            let id = conn.request_id();
            let (result, sent) = match conn.send(build(id)).await {
                Err(e) => (Err(e), false),
                Ok(()) => (conn.reply().await, true),
            };
            match result {
                Ok(reply) => return Ok((conn, reply)),
                Err(e) if e.bus_gone && sent && resend == Resend::UnlessSent => {
                    return Err(unknown(e))
                }
                Err(e) if e.bus_gone && Instant::now() < deadline => {
                    sent_before |= sent;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) if sent_before || (sent && e.bus_gone) => return Err(unknown(e)),
                Err(e) => return Err(e),
            }
        }
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    pub async fn send(&mut self, mut kind: C) -> Result<()> {
        fit_to(&mut kind, &self.hello.features);
        if let Some(feature) = needs(&kind) {
            if !self.hello.features.iter().any(|f| f == feature) {
                return Err(CliError::runtime(format!(
                    "the running bus (build {}) does not know {}: it is older than this dws; \
                     `dws event restart` runs the installed one",
                    crate::exit::clip(&self.hello.bus_build),
                    match feature {
                        proto::FEATURE_START_TIME => "--from TIME",
                        proto::FEATURE_ACK_WAIT_DEFAULT => "`subscribe --ack-wait`",
                        _ => "`dws event get`",
                    }
                )));
            }
        }
        self.writer
            .send(v1::ClientFrame { kind: Some(kind) })
            .await
            .map_err(|e| CliError::bus_gone(format!("lost the connection to the bus: {e}")))
    }

    /// The next frame; `Ok(None)` when the bus closed the connection. A
    /// connection that failed (reset) or ended in the middle of a frame (the
    /// bus died while writing) is an error with `bus_gone` set.
    pub async fn next(&mut self) -> Result<Option<S>> {
        loop {
            match self.reader.next().await {
                None => return Ok(None),
                Some(Err(proto::CodecError::Io(e))) => {
                    return Err(CliError::bus_gone(format!(
                        "lost the connection to the bus: {e}"
                    )))
                }
                Some(Err(proto::CodecError::Truncated)) => {
                    return Err(CliError::bus_gone(
                        "lost the connection to the bus in the middle of a frame",
                    ))
                }
                Some(Err(e)) => {
                    return Err(CliError::runtime(format!("bad frame from the bus: {e}")))
                }
                Some(Ok(v1::ServerFrame { kind: None })) => continue,
                Some(Ok(v1::ServerFrame { kind: Some(k) })) => return Ok(Some(k)),
            }
        }
    }

    /// Sends a request built with a fresh request id and waits for its reply
    /// (skipping unsolicited frames). An `Error` reply becomes a [`CliError`].
    pub async fn request(&mut self, build: impl FnOnce(u64) -> C) -> Result<S> {
        let id = self.request_id();
        self.send(build(id)).await?;
        self.reply().await
    }

    /// The reply to the request just sent (skipping unsolicited frames).
    async fn reply(&mut self) -> Result<S> {
        loop {
            match self.next().await? {
                None => {
                    return Err(CliError::bus_gone(
                        "the bus closed the connection before replying",
                    ))
                }
                Some(S::Error(e)) => return Err(CliError::from_bus(e.code, &e.message)),
                Some(S::Bye(b)) => {
                    let reason = ByeReason::try_from(b.reason).unwrap_or(ByeReason::Unspecified);
                    return Err(CliError::bus_gone(format!(
                        "the bus closed the connection before replying (reason: {})",
                        proto::bye_reason_name(reason)
                    )));
                }
                Some(k) if is_unsolicited(&k) => continue,
                Some(k) => return Ok(k),
            }
        }
    }

    /// Says goodbye (best effort: the bus may already be gone), then reads
    /// and drops what the bus still sends until it closes its end, within
    /// [`BYE_DRAIN`]. The bus closes once it has read everything before the
    /// Bye: closing first could leave the bus's write to us failing before
    /// it read our last frames (the last acks of a run, lost, and their
    /// events delivered again).
    pub async fn bye(&mut self) {
        let sent = self
            .send(C::Bye(v1::Bye {
                reason: ByeReason::ClientDone as i32,
                message: String::new(),
            }))
            .await;
        if sent.is_err() {
            return;
        }
        let reader = self.reader.get_mut();
        let _ = tokio::time::timeout(BYE_DRAIN, async {
            let mut buf = vec![0u8; 64 * 1024];
            while matches!(reader.read(&mut buf).await, Ok(n) if n > 0) {}
        })
        .await;
    }
}

/// Connects and greets, all within `deadline` (but at least [`DIAL_FLOOR`]).
async fn dial(endpoint: &Endpoint, deadline: Instant) -> std::result::Result<BusConn, DialError> {
    use std::io::ErrorKind as K;
    let deadline = deadline.max(Instant::now() + DIAL_FLOOR);
    let socket = endpoint.socket_path.display();
    let connected =
        tokio::time::timeout_at(deadline, UnixStream::connect(&endpoint.socket_path)).await;
    let stream = match connected {
        Ok(Ok(s)) => s,
        Err(_) => {
            return Err(DialError::Fatal(CliError::runtime(format!(
                "the bus at {socket} did not accept the connection within {}s",
                CONNECT_DEADLINE.as_secs()
            ))))
        }
        Ok(Err(e)) if matches!(e.kind(), K::NotFound | K::ConnectionRefused) => {
            return Err(DialError::NotRunning)
        }
        // The listener closed under us: the bus is exiting. Try again (the
        // next round finds no socket and starts a successor).
        Ok(Err(e)) if matches!(e.kind(), K::ConnectionReset | K::ConnectionAborted) => {
            return Err(DialError::Gone)
        }
        Ok(Err(e)) if e.kind() == K::PermissionDenied => {
            return Err(DialError::Fatal(CliError::permission(format!(
                "permission denied connecting to {socket}"
            ))))
        }
        Ok(Err(e)) => {
            return Err(DialError::Fatal(CliError::runtime(format!(
                "cannot connect to {socket}: {e}"
            ))))
        }
    };
    if let Ok(cred) = stream.peer_cred() {
        let me = nix::unistd::geteuid().as_raw();
        if cred.uid() != me {
            return Err(DialError::Fatal(CliError::permission(format!(
                "the process on {socket} runs as uid {}, not as uid {me}; refusing it",
                cred.uid()
            ))));
        }
    }
    match tokio::time::timeout_at(deadline, handshake(stream)).await {
        Ok(greeted) => greeted,
        Err(_) => Err(DialError::Fatal(CliError::runtime(format!(
            "the bus at {socket} accepted the connection but did not answer within {}s",
            CONNECT_DEADLINE.as_secs()
        )))),
    }
}

/// `kind` as a bus that lists `features` reads it: an older bus reads an
/// ack wait of 0 as 1 ms (the default is named), and skips `Ack.runs`,
/// acking nothing (the runs are spelled out as `Ack.seqs`).
fn fit_to(kind: &mut C, features: &[String]) {
    let has = |feature: &str| features.iter().any(|f| f == feature);
    match kind {
        C::Subscribe(s)
            if s.explicit_ack && s.ack_wait_ms == 0 && !has(proto::FEATURE_ACK_WAIT_DEFAULT) =>
        {
            s.ack_wait_ms = proto::limits::DEFAULT_ACK_WAIT.as_millis() as u64;
        }
        C::Ack(a) if !a.runs.is_empty() && !has(proto::FEATURE_ACK_RUNS) => {
            a.seqs
                .extend(a.runs.drain(..).flat_map(|r| r.first..=r.last));
        }
        _ => {}
    }
}

/// The `HelloAck.features` entry a bus must list before `kind` is sent to
/// it (an older bus would misread or refuse it), if any.
fn needs(kind: &C) -> Option<&'static str> {
    match kind {
        C::Subscribe(s) if s.start == v1::StartPosition::StartTime as i32 => {
            Some(proto::FEATURE_START_TIME)
        }
        C::GetEvent(_) => Some(proto::FEATURE_GET_EVENT),
        C::Subscribe(s) if s.default_ack_wait_ms > 0 => Some(proto::FEATURE_ACK_WAIT_DEFAULT),
        _ => None,
    }
}

/// Hello, then the bus's first answer: HelloAck (greeted), Bye (it is
/// exiting: try again) or Error (a refusal, e.g. a full connection table:
/// fatal, another bus would not help).
async fn handshake(stream: UnixStream) -> std::result::Result<BusConn, DialError> {
    let (rd, wr) = stream.into_split();
    let mut conn = BusConn {
        reader: FramedRead::with_capacity(rd, ClientCodec::new(), 256 * 1024),
        writer: FramedWrite::new(wr, ClientCodec::new()),
        hello: v1::HelloAck::default(),
        next_request: 0,
    };
    let hello = C::Hello(v1::Hello {
        protocol_version: proto::PROTOCOL_VERSION,
        client_pid: std::process::id(),
        client_name: "dws".into(),
        build: proto::BUILD.into(),
    });
    // A failed send is not the verdict yet: a bus that refuses us may have
    // written its Error and closed before our Hello arrived (EPIPE). What it
    // sent is still readable.
    let _ = conn.send(hello).await;
    loop {
        match conn.reader.next().await {
            None | Some(Err(_)) => return Err(DialError::Gone),
            Some(Ok(f)) => match f.kind {
                Some(S::HelloAck(ack)) => {
                    conn.hello = ack;
                    return Ok(conn);
                }
                Some(S::Bye(_)) => return Err(DialError::Gone),
                Some(S::Error(e)) => {
                    return Err(DialError::Fatal(CliError::from_bus(e.code, &e.message)))
                }
                _ => continue,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{v1::ErrorCode, ServerCodec};

    fn frame(kind: S) -> v1::ServerFrame {
        v1::ServerFrame { kind: Some(kind) }
    }

    /// Deliveries still arriving while a consumer waits for the reply to
    /// its Unsubscribe are skipped, whatever their form: a LineBatch taken
    /// for the reply left the owned subscription behind.
    #[test]
    fn every_delivery_frame_is_unsolicited() {
        for k in [
            S::Event(Default::default()),
            S::EventLines(Default::default()),
            S::LineBatch(Default::default()),
            S::Gap(Default::default()),
            S::WhereNotice(Default::default()),
            S::Heartbeat(Default::default()),
            S::SourceState(Default::default()),
        ] {
            assert!(is_unsolicited(&k), "{k:?}");
        }
        assert!(!is_unsolicited(&S::Unsubscribed(Default::default())));
    }

    async fn handshake_against(
        frames: Vec<v1::ServerFrame>,
    ) -> std::result::Result<BusConn, DialError> {
        let (client, server) = UnixStream::pair().expect("socketpair");
        let mut w = FramedWrite::new(server, ServerCodec::new());
        for f in frames {
            w.send(f).await.expect("write frame");
        }
        // Closed before the client's Hello: its send fails with EPIPE.
        drop(w);
        handshake(client).await
    }

    #[tokio::test]
    async fn an_error_sent_before_closing_is_reported_even_if_hello_could_not_be_sent() {
        let refused = handshake_against(vec![frame(S::Error(v1::Error {
            request_id: 0,
            code: ErrorCode::ResourceExhausted as i32,
            message: "too many connections (1024 open); try again later".into(),
        }))])
        .await;
        match refused {
            Err(DialError::Fatal(e)) => {
                assert_eq!(e.code, crate::exit::RUNTIME);
                assert!(!e.bus_gone);
                assert_eq!(
                    e.message,
                    "too many connections (1024 open); try again later"
                );
            }
            Err(DialError::Gone) => panic!("an Error frame was taken for a bus that went away"),
            Err(DialError::NotRunning) => panic!("NotRunning"),
            Ok(_) => panic!("greeted"),
        }
    }

    #[tokio::test]
    async fn hello_ack_greets_and_a_silent_close_is_gone() {
        let ack = v1::HelloAck {
            bus_pid: 42,
            ..v1::HelloAck::default()
        };
        match handshake_against(vec![frame(S::HelloAck(ack))]).await {
            Ok(conn) => assert_eq!(conn.hello.bus_pid, 42),
            Err(_) => panic!("a HelloAck must greet"),
        }
        assert!(matches!(
            handshake_against(Vec::new()).await,
            Err(DialError::Gone)
        ));
    }

    #[test]
    fn an_older_bus_gets_acks_by_runs_spelled_out() {
        let runs = || {
            C::Ack(v1::Ack {
                runs: vec![
                    v1::SeqRun { first: 7, last: 9 },
                    v1::SeqRun { first: 3, last: 3 },
                ],
                ..v1::Ack::default()
            })
        };
        let mut old = runs();
        fit_to(&mut old, &[]);
        let C::Ack(a) = old else { unreachable!() };
        assert_eq!((a.seqs, a.runs.len()), (vec![7, 8, 9, 3], 0));
        let mut new = runs();
        fit_to(&mut new, &[proto::FEATURE_ACK_RUNS.to_owned()]);
        let C::Ack(a) = new else { unreachable!() };
        assert_eq!((a.seqs.len(), a.runs.len()), (0, 2));
    }

    #[tokio::test]
    async fn a_bus_without_a_feature_is_never_sent_what_it_would_misread() {
        let greet = |features: Vec<String>| {
            handshake_against(vec![frame(S::HelloAck(v1::HelloAck {
                bus_build: "0.9.0".into(),
                features,
                ..v1::HelloAck::default()
            }))])
        };
        let by_time = C::Subscribe(v1::Subscribe {
            start: v1::StartPosition::StartTime as i32,
            ..v1::Subscribe::default()
        });
        let get = C::GetEvent(v1::GetEvent::default());
        let Ok(mut old) = greet(Vec::new()).await else {
            panic!("a HelloAck must greet")
        };
        for (kind, what) in [(by_time, "--from TIME"), (get, "`dws event get`")] {
            let e = old.send(kind).await.expect_err("refused before sending");
            assert_eq!(e.code, crate::exit::RUNTIME);
            assert!(!e.bus_gone);
            assert_eq!(
                e.message,
                format!(
                    "the running bus (build 0.9.0) does not know {what}: it is older than \
                     this dws; `dws event restart` runs the installed one"
                )
            );
        }
        // Everything else goes out as before (here: to a closed socket).
        let e = old
            .send(C::StatusRequest(v1::StatusRequest::default()))
            .await;
        assert!(e.as_ref().map_or_else(|e| e.bus_gone, |()| true), "{e:?}");
        // A bus that lists the features is sent both.
        let all = proto::FEATURES.iter().map(|f| (*f).to_owned()).collect();
        let Ok(mut new) = greet(all).await else {
            panic!("a HelloAck must greet")
        };
        let get = C::GetEvent(v1::GetEvent::default());
        let e = new.send(get).await;
        assert!(e.as_ref().map_or_else(|e| e.bus_gone, |()| true), "{e:?}");
    }
}
