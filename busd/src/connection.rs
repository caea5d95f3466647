//! One client connection: reads `ClientFrame`s, answers them through the
//! [`Hub`], and streams deliveries to an attached consumer.
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
//! are not read while [`OUT_READ_PAUSE`] bytes of replies wait unread (a
//! client that never reads stalls itself); input is buffered as it arrives,
//! never by the length a frame announces, and what all connections hold
//! beyond their first 64 KiB is charged to one global bound; a client must
//! say Hello within [`HELLO_DEADLINE`] and finish a started frame within
//! [`FRAME_DEADLINE`].

use std::{collections::VecDeque, time::Duration};

use bytes::BytesMut;
use proto::{
    codec::{encode_event_frame, encode_frame},
    limits::MAX_EVENT_ID_LEN,
    ndjson,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S, ByeReason, ErrorCode},
    CodecError, ServerCodec,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    sync::watch,
    time::Instant,
};
use tokio_util::codec::Decoder;

use std::sync::Arc;

use crate::{
    eventlog::LoggedEvent,
    hub::{ConnId, Durable, Hub, NewEvent, RefusedKind},
    pattern::Pattern,
    ratelimit::LogLimit,
    shutdown::Shutdown,
    warn_limited,
};

/// How long a closing connection may take to flush its final frames (Bye)
/// before it is dropped. Bounds the whole bus's shutdown drain.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Stop pulling events into the outbound buffer above this many bytes: the
/// consumer is not keeping up, and the credit window already bounds what is
/// in flight.
const OUT_HIGH_WATER: usize = 256 * 1024;

/// Read buffer size: read the socket in large chunks.
const READ_CAPACITY: usize = 64 * 1024;

/// Events pulled from the hub per wake-up.
const PULL_BATCH: usize = 256;

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

/// One `bus.log` line per interval for clients refused or dropped.
static CLIENT_WARNINGS: LogLimit = LogLimit::new(Duration::from_secs(10));

/// A reply that may only be sent once the store has caught up with the
/// change it answers: a published event is durable, or a subscription change
/// is saved. Waiting here, instead of in the request handler, keeps the
/// connection reading, so pipelined requests share one fsync.
struct Awaited {
    request_id: u64,
    until: Until,
    reply: S,
}

enum Until {
    Seq(u64),
    SubsGen(u64),
}

impl Until {
    fn reached(&self, d: &Durable) -> bool {
        match *self {
            Until::Seq(seq) => d.seq >= seq,
            Until::SubsGen(gen) => d.subs_gen >= gen,
        }
    }
}

enum Phase {
    AwaitHello,
    Ready,
}

pub struct Connection {
    hub: Hub,
    id: ConnId,
    out: BytesMut,
    phase: Phase,
    /// Set once the connection is going away; it then only flushes.
    closing: bool,
    source_gen: u64,
    /// Replies waiting for the store, in request order (see [`Awaited`]).
    awaiting: VecDeque<Awaited>,
    durable: watch::Receiver<Durable>,
    /// When an event held back (a nack's delay, an explicit ack's wait)
    /// becomes deliverable: the connection wakes then.
    redeliver_at: Option<std::time::Instant>,
    /// The consumer takes NDJSON lines rendered here (`EventLines`).
    lines: bool,
    /// Reused buffer for a batch of lines.
    line_buf: Vec<u8>,
}

/// Serves one accepted connection until it closes. Errors stay here.
pub async fn serve(stream: UnixStream, hub: Hub, mut shutdown: Shutdown) {
    let (id, handle) = hub.register_conn();
    let mut conn = Connection {
        hub: hub.clone(),
        id,
        out: BytesMut::with_capacity(8 * 1024),
        phase: Phase::AwaitHello,
        closing: false,
        source_gen: 0,
        awaiting: VecDeque::new(),
        durable: hub.durable(),
        redeliver_at: None,
        lines: false,
        line_buf: Vec::new(),
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
    let (mut rd, mut wr) = stream.into_split();
    let mut codec = ServerCodec::new();
    let mut input = BytesMut::with_capacity(READ_CAPACITY);
    let mut charged = 0;
    let mut frame_started: Option<Instant> = None;
    let hello_deadline = Instant::now() + HELLO_DEADLINE;
    let mut drain_deadline = conn.closing.then(|| Instant::now() + DRAIN_TIMEOUT);

    loop {
        conn.answer_durable();
        if !conn.closing {
            if let Some(reason) = handle.take_kick() {
                conn.bye(reason);
            } else if matches!(conn.phase, Phase::Ready) {
                conn.fill();
            }
        }
        if conn.closing {
            drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN_TIMEOUT);
            // Publishes still waiting for the disk are answered first.
            if conn.out.is_empty() && conn.awaiting.is_empty() {
                let _ = wr.shutdown().await;
                // Close with nothing unread: a socket closed with unread
                // input resets the peer, which could lose our last frames
                // (an Error it has not read yet). Linger briefly for its EOF.
                let mut scratch = [0u8; 16 * 1024];
                let _ = tokio::time::timeout(CLOSE_LINGER, async {
                    while matches!(rd.read(&mut scratch).await, Ok(n) if n > 0) {}
                })
                .await;
                break;
            }
        }
        let can_read =
            !conn.closing && conn.out.len() < OUT_READ_PAUSE && conn.awaiting.len() < MAX_AWAITING;
        let client_deadline = if conn.closing {
            None
        } else {
            let hello = matches!(conn.phase, Phase::AwaitHello).then_some(hello_deadline);
            let frame = frame_started.map(|t| t + FRAME_DEADLINE);
            hello.into_iter().chain(frame).min()
        };
        let deadline = drain_deadline.into_iter().chain(client_deadline).min();
        tokio::select! {
            reason = shutdown.recv(), if !conn.closing => conn.bye(reason),
            res = wr.write_buf(&mut conn.out), if !conn.out.is_empty() => {
                if let Err(e) = res {
                    tracing::debug!(conn = id, cause = %e, "write failed");
                    break;
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
                Ok(_) => {
                    let mut decoded = false;
                    while !conn.closing {
                        match codec.decode(&mut input) {
                            Ok(Some(frame)) => {
                                decoded = true;
                                conn.handle(frame).await;
                            }
                            Ok(None) => break,
                            Err(e) => conn.bad_frame(&e),
                        }
                    }
                    frame_started = match (input.is_empty(), frame_started) {
                        (true, _) => None,
                        (false, Some(t)) if !decoded => Some(t),
                        (false, _) => Some(Instant::now()),
                    };
                    if input.is_empty() && input.capacity() > READ_CAPACITY {
                        input = BytesMut::with_capacity(READ_CAPACITY);
                    } else if input.capacity() - input.len() < READ_CAPACITY / 4 {
                        input.reserve(READ_CAPACITY);
                    }
                    let over = input.capacity().saturating_sub(READ_CAPACITY);
                    if !hub.charge_input(&mut charged, over) {
                        warn_limited!(CLIENT_WARNINGS, conn = id, "input bound reached; client refused");
                        hub.count_refused(RefusedKind::InputBudget);
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
            _ = handle.wake.notified() => {}
            _ = conn.durable.changed(), if !conn.awaiting.is_empty() => {}
            _ = sleep_until_opt(conn.redeliver_at.map(Instant::from_std)), if !conn.closing => {}
            _ = sleep_until_opt(deadline) => {
                if conn.closing {
                    warn_limited!(CLIENT_WARNINGS, conn = id, "drain timed out; dropping connection");
                    break;
                }
                hub.count_refused(RefusedKind::SlowClient);
                let message = if matches!(conn.phase, Phase::AwaitHello) {
                    format!("no Hello within {}s; closing", HELLO_DEADLINE.as_secs())
                } else {
                    format!(
                        "a frame was started but not completed within {}s; closing",
                        FRAME_DEADLINE.as_secs()
                    )
                };
                warn_limited!(CLIENT_WARNINGS, conn = id, "slow client: {message}");
                conn.error(0, ErrorCode::BadRequest, message);
                conn.closing = true;
            }
        }
    }
    hub.charge_input(&mut charged, 0);
    drop(wr);
    hub.unregister_conn(id);
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Connection {
    fn send(&mut self, kind: S) {
        let frame = v1::ServerFrame { kind: Some(kind) };
        if let Err(e) = encode_frame(&frame, &mut self.out) {
            // Only a reply over MAX_FRAME_LEN can fail here.
            tracing::error!(conn = self.id, cause = %e, "cannot encode a reply");
        }
    }

    fn error(&mut self, request_id: u64, code: ErrorCode, message: impl Into<String>) {
        self.send(S::Error(v1::Error {
            request_id,
            code: code as i32,
            message: message.into(),
        }));
    }

    /// Sends the source state if it changed since this connection last saw it.
    /// The generation is read without the hub lock: this runs on every wake-up.
    fn source_state_if_changed(&mut self) {
        if self.hub.source_gen() != self.source_gen {
            let (state, gen) = self.hub.source_state();
            self.source_gen = gen;
            self.send(S::SourceState(state));
        }
    }

    fn bye(&mut self, reason: ByeReason) {
        // A bus stopped by its store says so: it is an error, not a goodbye.
        if let Some(why) = self.hub.store_error() {
            self.error(0, ErrorCode::Internal, store_failed_message(&why));
            self.closing = true;
            return;
        }
        // A source that was lost says why before the Bye that follows it.
        if matches!(self.phase, Phase::Ready) {
            self.source_state_if_changed();
        }
        self.send(S::Bye(v1::Bye {
            reason: reason as i32,
            message: String::new(),
        }));
        self.closing = true;
    }

    fn bad_frame(&mut self, e: &CodecError) {
        warn_limited!(CLIENT_WARNINGS, conn = self.id, cause = %e, "bad frame; closing connection");
        self.hub.count_refused(RefusedKind::BadFrame);
        match e {
            CodecError::TooLarge => self.error(0, ErrorCode::FrameTooLarge, e.to_string()),
            CodecError::Decode(_) | CodecError::Truncated => {
                self.error(0, ErrorCode::BadRequest, e.to_string())
            }
            CodecError::Io(_) => {}
        }
        self.closing = true;
    }

    /// Moves deliverable events (and gaps, and source-state changes) from the
    /// hub into the outbound buffer, within the high-water mark.
    fn fill(&mut self) {
        self.source_state_if_changed();
        self.redeliver_at = None;
        while self.out.len() < OUT_HIGH_WATER {
            let (d, next_due) = self.hub.pull(self.id, PULL_BATCH);
            self.redeliver_at = next_due;
            let Some(d) = d else {
                break;
            };
            if let Some(gap) = d.gap {
                self.send(S::Gap(gap));
            }
            let damaged = d.damaged;
            let n = d.events.len();
            if self.lines {
                self.send_lines(&d.subscription_id, &d.events);
            } else {
                for (event, redelivered, delivery) in &d.events {
                    self.send_event(event, &d.subscription_id, *redelivered, *delivery);
                }
            }
            if let Some(why) = damaged {
                tracing::error!(conn = self.id, "{why}");
                self.error(0, ErrorCode::Internal, why);
                self.closing = true;
                break;
            }
            if let Some(line) = d.halted {
                self.send(S::Bye(v1::Bye {
                    reason: ByeReason::Halted as i32,
                    message: line,
                }));
                self.hub.detach(self.id);
                self.closing = true;
                break;
            }
            if n < PULL_BATCH {
                break;
            }
        }
    }

    fn send_event(
        &mut self,
        event: &LoggedEvent,
        subscription_id: &str,
        redelivered: bool,
        delivery: u32,
    ) {
        if let Err(e) = encode_event_frame(
            &event.encoded,
            subscription_id,
            redelivered,
            delivery,
            &mut self.out,
        ) {
            tracing::error!(conn = self.id, seq = event.seq, cause = %e, "cannot encode event");
        }
    }

    /// One `EventLines` frame for a pulled batch: each event's line is its
    /// shared rendered parts plus this delivery's fields. A line too large
    /// for a frame goes as an `Event` frame (the client formats it).
    fn send_lines(&mut self, subscription_id: &str, events: &[(Arc<LoggedEvent>, bool, u32)]) {
        const FRAME_BUDGET: usize = 1 << 20;
        let mut seqs = Vec::with_capacity(events.len());
        let mut buf = std::mem::take(&mut self.line_buf);
        buf.clear();
        for (event, redelivered, delivery) in events {
            let (head, tail) = event.line_parts();
            let start = buf.len();
            ndjson::write_line(
                &mut buf,
                head,
                subscription_id,
                tail,
                *redelivered,
                *delivery,
            );
            if buf.len() - start > proto::MAX_FRAME_LEN - 4096 {
                buf.truncate(start);
                self.flush_lines(&mut seqs, &mut buf);
                self.send_event(event, subscription_id, *redelivered, *delivery);
                continue;
            }
            seqs.push(event.seq);
            if buf.len() >= FRAME_BUDGET {
                self.flush_lines(&mut seqs, &mut buf);
            }
        }
        self.flush_lines(&mut seqs, &mut buf);
        self.line_buf = buf;
    }

    fn flush_lines(&mut self, seqs: &mut Vec<u64>, buf: &mut Vec<u8>) {
        if seqs.is_empty() {
            return;
        }
        self.send(S::EventLines(v1::EventLines {
            seqs: std::mem::take(seqs),
            lines: std::mem::take(buf),
        }));
    }

    async fn handle(&mut self, frame: v1::ClientFrame) {
        let Some(kind) = frame.kind else {
            self.error(0, ErrorCode::BadRequest, "empty frame: no message set");
            self.closing = true;
            return;
        };
        if let Phase::AwaitHello = self.phase {
            let C::Hello(hello) = kind else {
                self.error(0, ErrorCode::BadRequest, "the first frame must be Hello");
                self.closing = true;
                return;
            };
            return self.hello(hello);
        }
        match kind {
            C::Hello(_) => self.error(0, ErrorCode::BadRequest, "Hello sent twice"),
            C::Subscribe(req) => self.subscribe(req).await,
            C::Unsubscribe(req) => {
                let (removed, not_found, save) =
                    self.hub.unsubscribe(self.id, &req.subscription_ids);
                let reply = S::Unsubscribed(v1::Unsubscribed {
                    request_id: req.request_id,
                    removed,
                    not_found,
                });
                self.reply_after(req.request_id, save.map(Until::SubsGen), reply);
            }
            C::Ack(ack) => self.hub.ack(self.id, &ack),
            C::SubscriptionControl(req) => match self.hub.control(&req) {
                Ok((doc, save)) => {
                    let reply = S::SubscriptionState(v1::SubscriptionState {
                        request_id: req.request_id,
                        json: doc.to_string(),
                    });
                    self.reply_after(req.request_id, save.map(Until::SubsGen), reply);
                }
                Err(r) => self.error(req.request_id, r.code, r.message),
            },
            C::Bye(_) => {
                self.hub.detach(self.id);
                self.closing = true;
            }
            C::StatusRequest(req) => {
                let json = self.status_that_fits();
                self.send(S::StatusReply(v1::StatusReply {
                    request_id: req.request_id,
                    json,
                }));
            }
            C::StopRequest(req) => self.stop(req),
            C::Publish(req) => self.publish(req),
            C::Heartbeat(_) => self.send(S::Heartbeat(v1::Heartbeat {
                unix_ms: crate::hub::now_ms(),
            })),
        }
    }

    /// Subscribe, binding an upstream subscription first when the source has
    /// a control plane. That call may take a while (it is HTTP); it stalls
    /// only this connection, and its refusal is this request's `Error`.
    async fn subscribe(&mut self, req: v1::Subscribe) {
        let mut upstream_id = None;
        match (self.hub.upstream_for(&req), &req.upstream) {
            (Some(ctl), Some(spec)) => {
                // Only an explicit TTL bounds the upstream subscription: the
                // bus's default TTL is about detached *local* subscriptions,
                // and an attached consumer must not lose its upstream at it.
                // Without one, the last local release cancels it.
                let ttl = Duration::from_millis(req.ttl_ms);
                match ctl.acquire(&req.patterns, spec, ttl).await {
                    Ok(id) => upstream_id = Some(id),
                    Err(r) => return self.error(req.request_id, r.code, r.message),
                }
            }
            (Some(_), None) => {
                return self.error(
                    req.request_id,
                    ErrorCode::BadRequest,
                    format!(
                        "the {} source needs an upstream rule for a new subscription (--rule and its target)",
                        self.hub.config().source_kind
                    ),
                )
            }
            (None, Some(_)) if !self.hub.has_upstream_control() => {
                return self.error(
                    req.request_id,
                    ErrorCode::BadRequest,
                    format!(
                        "the {} source has no upstream subscriptions: --rule, --user, --open-dingtalk-id, \
                         --group, --query and --filter-json apply to the personal source",
                        self.hub.config().source_kind
                    ),
                )
            }
            (None, _) => {}
        }
        match self.hub.subscribe(self.id, &req, upstream_id) {
            // A named subscription is on disk before anyone is told it exists.
            Ok((reply, save)) => {
                self.lines = req.attach && req.ndjson_lines;
                self.reply_after(
                    req.request_id,
                    save.map(Until::SubsGen),
                    S::Subscribed(reply),
                )
            }
            Err(r) => self.error(req.request_id, r.code, r.message),
        }
    }

    fn hello(&mut self, hello: v1::Hello) {
        if hello.protocol_version != proto::PROTOCOL_VERSION {
            self.error(
                0,
                ErrorCode::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported; this bus (busd {}) speaks version {}",
                    hello.protocol_version,
                    proto::BUILD,
                    proto::PROTOCOL_VERSION
                ),
            );
            self.closing = true;
            return;
        }
        self.hub
            .identify_conn(self.id, hello.client_pid, &hello.client_name);
        let (state, gen) = self.hub.source_state();
        self.source_gen = gen;
        let cfg = self.hub.config();
        self.send(S::HelloAck(v1::HelloAck {
            protocol_version: proto::PROTOCOL_VERSION,
            bus_pid: std::process::id(),
            bus_build: proto::BUILD.to_owned(),
            idle_timeout_ms: cfg.idle_timeout.as_millis() as u64,
            source_kind: cfg.source_kind.clone(),
            source_state: Some(state),
        }));
        self.phase = Phase::Ready;
    }

    fn stop(&mut self, req: v1::StopRequest) {
        if req.subscription_ids.is_empty() {
            let reply = v1::StopReply {
                request_id: req.request_id,
                consumer_pids: self.hub.consumer_pids(),
                bus_stopping: !req.dry_run,
                ..Default::default()
            };
            self.send(S::StopReply(reply));
            if !req.dry_run {
                tracing::info!("stop requested by a client");
                self.hub.shutdown_trigger().trigger(ByeReason::StopRequest);
            }
        } else {
            let mut reply = self.hub.stop_consumers(&req.subscription_ids, req.dry_run);
            reply.request_id = req.request_id;
            self.send(S::StopReply(reply));
        }
    }

    /// The status document, with its lists cut until it fits in one frame.
    fn status_that_fits(&self) -> String {
        let mut listed = usize::MAX;
        loop {
            let json = self.hub.status_json(listed).to_string();
            if json.len() + 64 <= proto::MAX_FRAME_LEN || listed == 0 {
                return json;
            }
            let doc = self.hub.status_json(usize::MAX);
            let n = doc["subscriptions"]
                .as_array()
                .map_or(0, Vec::len)
                .max(doc["consumers"].as_array().map_or(0, Vec::len));
            listed = listed.min(n) / 2;
        }
    }

    fn publish(&mut self, req: v1::Publish) {
        if let Err(m) = Pattern::parse(&req.event_type).and_then(|p| match p {
            Pattern::Exact(_) => Ok(()),
            _ => Err(format!(
                "invalid event type {:?}: wildcards are for subscribing",
                req.event_type
            )),
        }) {
            return self.error(
                req.request_id,
                ErrorCode::BadRequest,
                m.replace("event key", "event type"),
            );
        }
        if req.event_id.len() > MAX_EVENT_ID_LEN {
            return self.error(
                req.request_id,
                ErrorCode::BadRequest,
                format!("event id longer than {MAX_EVENT_ID_LEN} bytes"),
            );
        }
        let appended = self.hub.append(NewEvent {
            scope: "local".into(),
            event_id: req.event_id,
            event_type: req.event_type,
            source_id: "local".into(),
            data: req.data,
            headers: req.headers.into_iter().collect(),
            event_born_time: crate::hub::now_ms(),
            ..NewEvent::default()
        });
        let appended = match appended {
            Ok(a) => a,
            Err(r) => return self.error(req.request_id, r.code, r.message),
        };
        // The reply waits until the event is durable; later requests are not
        // held up meanwhile.
        let reply = S::PublishAck(v1::PublishAck {
            request_id: req.request_id,
            seq: appended.seq,
            event_id: appended.event_id,
            duplicate: appended.duplicate,
        });
        self.reply_after(req.request_id, Some(Until::Seq(appended.seq)), reply);
    }

    /// Sends `reply` now, or queues it until the store reaches `until`
    /// (replies leave in request order).
    fn reply_after(&mut self, request_id: u64, until: Option<Until>, reply: S) {
        if until.is_none() && self.awaiting.is_empty() {
            return self.send(reply);
        }
        self.awaiting.push_back(Awaited {
            request_id,
            until: until.unwrap_or(Until::Seq(0)),
            reply,
        });
        self.answer_durable();
    }

    /// Sends the replies the store has caught up with, in order; if the store
    /// failed, answers every waiting request with the error.
    fn answer_durable(&mut self) {
        if self.awaiting.is_empty() {
            return;
        }
        let d = self.durable.borrow_and_update().clone();
        while self.awaiting.front().is_some_and(|a| a.until.reached(&d)) {
            if let Some(a) = self.awaiting.pop_front() {
                self.send(a.reply);
            }
        }
        if let Some(why) = &d.failed {
            for a in std::mem::take(&mut self.awaiting) {
                self.error(a.request_id, ErrorCode::Internal, store_failed_message(why));
            }
            self.closing = true;
        }
    }
}

/// What a client is told when the store failed under it.
fn store_failed_message(why: &str) -> String {
    format!(
        "the bus stopped: its store failed ({why}); events acknowledged before are safe on \
         disk, and the next start recovers them"
    )
}
