//! The connection runner shared by the stream sources (the numbered rules
//! are in the module docs of [`super`]): ticket → WebSocket → frames acked
//! per [`super::dispatch`] → disconnect/keepalive/backoff → lost.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::{
    stream::{SplitSink, SplitStream},
    SinkExt, StreamExt,
};
use proto::v1;
use tokio::{net::TcpStream, time::Instant};
use tokio_tungstenite::{
    tungstenite::{self, client::IntoClientRequest, protocol::WebSocketConfig, Message},
    Connector, MaybeTlsStream, WebSocketStream,
};

use super::{
    dispatch::{self, Decision, Frames, Unroutable},
    net, one_line, source_lost, Backoff, Healthy, Policy, Scrub, TicketError, Tuning, Upstream,
    Url,
};
use crate::{
    clock::now_ms, hub::SourceHandle, ratelimit::LogLimit, shutdown::Shutdown,
    source::SourceContext,
};

/// TCP + TLS + WebSocket handshake (a ticket is valid for 90 s).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// Close handshake on the way out.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest message accepted from the gateway (its frames are ≤ 256 KiB).
const MAX_MESSAGE: usize = 4 * 1024 * 1024;
/// With [`Healthy::Frame`], a connection that lasted this long counts as
/// healthy even if it never received a frame (keepalive disabled, a quiet
/// app).
const HEALTHY_AFTER: Duration = Duration::from_secs(30);
/// One log line per reason of unroutable frames per this interval.
const UNROUTABLE_LOG_EVERY: Duration = Duration::from_secs(60);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type WsSink = SplitSink<Ws, Message>;
type WsStream = SplitStream<Ws>;

/// Counts unroutable frames per reason and logs each reason at most once a
/// minute (with the number held back).
#[derive(Default)]
struct Unroutables {
    limits: Mutex<HashMap<&'static str, Arc<LogLimit>>>,
}

impl Unroutables {
    fn record(&self, hub: &SourceHandle, source: &'static str, why: &Unroutable) {
        let limit = self
            .limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(why.reason)
            .or_insert_with(|| Arc::new(LogLimit::new(UNROUTABLE_LOG_EVERY)))
            .clone();
        crate::warn_limited!(
            limit,
            source,
            reason = why.reason,
            detail = %why.detail,
            "unroutable frame acked and dropped"
        );
        count_unroutable(hub, why);
    }
}

/// Counts one unroutable frame in `status`. (Until the hub counts them per
/// reason, they are counted with the malformed input, the reason in
/// `last_error`.)
fn count_unroutable(hub: &SourceHandle, why: &Unroutable) {
    hub.source_unroutable(why.reason, &why.detail);
}

/// Runs the connection loop of `upstream` until shutdown or until the
/// source is lost.
pub async fn run<U: Upstream>(
    upstream: U,
    policy: Policy,
    tuning: Tuning,
    tls: Arc<rustls::ClientConfig>,
    ctx: SourceContext,
) {
    let backoff = Backoff::new(tuning.backoff_min, tuning.backoff_max);
    Runner {
        unroutables: Unroutables::default(),
        upstream,
        policy,
        tuning,
        tls,
        hub: ctx.hub,
        shutdown: ctx.shutdown,
        failures: 0,
        backoff,
        conn_seq: 0,
    }
    .run()
    .await;
}

/// How a live connection ended.
enum ConnEnd {
    /// The bus is shutting down.
    Shutdown,
    /// The server sent `disconnect`: with [`Frames::Sdk`] the old socket
    /// drains on its own task; with [`Frames::AckAll`] it is closed already
    /// (by the server, or by us after the grace). Open a replacement now.
    Disconnect { reason: String },
    /// The connection is gone; `healthy` per [`Policy::healthy`].
    Lost { why: String, healthy: bool },
}

struct Runner<U> {
    upstream: U,
    policy: Policy,
    tuning: Tuning,
    tls: Arc<rustls::ClientConfig>,
    hub: SourceHandle,
    shutdown: Shutdown,
    /// Consecutive failed attempts.
    failures: u32,
    backoff: Backoff,
    /// Connections opened so far (for log lines).
    conn_seq: u64,
    unroutables: Unroutables,
}

impl<U: Upstream> Runner<U> {
    fn name(&self) -> &'static str {
        self.upstream.name()
    }

    fn set_state(
        &self,
        status: v1::SourceStatus,
        attempt: u32,
        next_retry_at: i64,
        reason: &str,
        error: Option<String>,
    ) {
        self.hub.set_source_state(
            v1::SourceState {
                state: status as i32,
                attempt,
                next_retry_at_unix_ms: next_retry_at,
                reason: reason.to_owned(),
                since_unix_ms: now_ms(),
            },
            error,
        );
    }

    fn lost(&self, reason: &str) {
        tracing::error!(source = self.name(), reason = %reason, "giving up, the source is lost");
        source_lost(&self.hub, self.failures, reason);
    }

    /// Records a failed attempt; `false` when the source is now lost.
    fn failed(&mut self, why: &str) -> bool {
        self.failures += 1;
        tracing::warn!(source = self.name(), attempt = self.failures, cause = %why, "attempt failed");
        let max = self.policy.max_attempts;
        if max > 0 && self.failures >= max {
            let n = self.failures;
            let plural = if n == 1 { "" } else { "s" };
            self.lost(&format!(
                "{why} ({n} consecutive failed attempt{plural}; max_attempts = {max})"
            ));
            return false;
        }
        true
    }

    async fn run(mut self) {
        self.set_state(v1::SourceStatus::Connecting, 1, 0, "", None);
        // Why the last attempt/connection ended; empty before the first.
        let mut last_reason = String::new();
        let mut wait = false;
        loop {
            if wait {
                let delay = self.backoff.next_delay();
                let next = now_ms() + delay.as_millis() as i64;
                let error = (!last_reason.is_empty()).then(|| last_reason.clone());
                self.set_state(
                    v1::SourceStatus::Reconnecting,
                    self.failures + 1,
                    next,
                    &last_reason,
                    error,
                );
                tracing::info!(source = self.name(), retry_in = ?delay, attempt = self.failures + 1, "reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = self.shutdown.recv() => return,
                }
            }
            wait = true;
            let mut stop = self.shutdown.clone();
            let attempt = tokio::select! {
                r = self.connect() => r,
                _ = stop.recv() => return,
            };
            let (ws, ticket_scrub) = match attempt {
                Ok(v) => v,
                Err(TicketError::Fatal(why)) => {
                    self.failures += 1;
                    self.lost(&why);
                    return;
                }
                Err(TicketError::Retry(why)) => {
                    if !self.failed(&why) {
                        return;
                    }
                    last_reason = why;
                    continue;
                }
            };
            self.conn_seq += 1;
            let connected_at = Instant::now();
            self.set_state(v1::SourceStatus::Connected, 0, 0, "", None);
            match self.run_connection(ws, ticket_scrub).await {
                ConnEnd::Shutdown => return,
                ConnEnd::Disconnect { reason } => {
                    self.failures = 0;
                    self.backoff.reset();
                    wait = false;
                    let why = format!("server requested reconnect (disconnect: {reason})");
                    tracing::info!(source = self.name(), reason = %why, "opening a replacement connection");
                    self.set_state(v1::SourceStatus::Reconnecting, 1, now_ms(), &why, None);
                    last_reason = why;
                }
                ConnEnd::Lost { why, healthy } => {
                    let healthy = healthy
                        || (self.policy.healthy == Healthy::Frame
                            && connected_at.elapsed() >= HEALTHY_AFTER);
                    tracing::warn!(source = self.name(), cause = %why, healthy, "connection lost");
                    if healthy {
                        self.failures = 0;
                        self.backoff.reset();
                    } else if !self.failed(&why) {
                        return;
                    }
                    last_reason = why;
                }
            }
        }
    }

    /// One attempt: ticket, then WebSocket handshake. The error is already
    /// scrubbed.
    async fn connect(&self) -> Result<(Ws, Scrub), TicketError> {
        tracing::info!(
            source = self.name(),
            attempt = self.failures + 1,
            "requesting a ticket"
        );
        let t = match self.upstream.ticket().await {
            Ok(t) => t,
            Err(e) => {
                let scrub = self.upstream.scrub();
                return Err(match e {
                    TicketError::Retry(m) => TicketError::Retry(scrub.clean(&m)),
                    TicketError::Fatal(m) => TicketError::Fatal(scrub.clean(&m)),
                });
            }
        };
        let mut scrub = self.upstream.scrub();
        scrub.add(&t.ticket);
        let url = net::with_ticket(&t.endpoint, &t.ticket, t.keep_embedded);
        let endpoint = net::redacted(&t.endpoint);
        let ws = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.handshake(&url))
            .await
            .unwrap_or_else(|_| {
                Err((
                    None,
                    format!(
                        "no WebSocket handshake within {}s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ),
                ))
            })
            .map_err(|(status, e)| {
                let why = scrub.clean(&format!("connect to {endpoint} failed: {e}"));
                match status {
                    Some(s) if self.upstream.handshake_refusal_is_fatal(s) => {
                        TicketError::Fatal(why)
                    }
                    _ => TicketError::Retry(why),
                }
            })?;
        tracing::info!(source = self.name(), endpoint = %endpoint, "connected");
        Ok((ws, scrub))
    }

    /// The handshake; the error carries the HTTP status of a refusal.
    async fn handshake(&self, url: &Url) -> Result<Ws, (Option<u16>, String)> {
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| (None, format!("invalid endpoint: {e}")))?;
        if let Ok(ua) = self.upstream.ws_user_agent().parse() {
            req.headers_mut().insert("User-Agent", ua);
        }
        let ws_config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        match tokio_tungstenite::connect_async_tls_with_config(
            req,
            Some(ws_config),
            true,
            Some(Connector::Rustls(self.tls.clone())),
        )
        .await
        {
            Ok((ws, _resp)) => Ok(ws),
            Err(tungstenite::Error::Http(resp)) => Err((
                Some(resp.status().as_u16()),
                format!("handshake rejected: HTTP {}", resp.status()),
            )),
            Err(e) => Err((None, e.to_string())),
        }
    }

    /// Serves one live connection until it ends.
    async fn run_connection(&mut self, ws: Ws, scrub: Scrub) -> ConnEnd {
        let conn = self.conn_seq;
        let (mut sink, mut stream) = ws.split();
        let keepalive = self.policy.keepalive;
        let alive_on = !keepalive.is_zero();
        let period = if alive_on {
            keepalive
        } else {
            Duration::from_secs(3600)
        };
        let mut pings = tokio::time::interval_at(Instant::now() + period, period);
        pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let write_timeout = period + self.tuning.pong_timeout;
        let mut last_alive = Instant::now();
        let mut received = false;
        let mut acked: u64 = 0;
        let mut ping_seq: u64 = 0;
        // Acks waiting for their event to be durable, in arrival order: the
        // connection keeps reading meanwhile, so the events of a burst share
        // one fsync instead of one each.
        let mut pending: VecDeque<(u64, String)> = VecDeque::new();
        let mut durable = self.hub.durable();
        // [`Frames::AckAll`] after `disconnect`: when we stop waiting for the
        // server to close, and the reason it gave.
        let mut draining: Option<(Instant, String)> = None;
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        let healthy_rule = self.policy.healthy;
        let healthy = |received: bool, acked: u64| match healthy_rule {
            Healthy::Frame => received,
            Healthy::Acked => acked > 0,
        };
        loop {
            let dead_at = last_alive + keepalive + self.tuning.pong_timeout;
            let msg = tokio::select! {
                biased;
                _ = self.shutdown.recv() => {
                    close(&mut sink).await;
                    return ConnEnd::Shutdown;
                }
                _ = durable.changed(), if !pending.is_empty() => {
                    let d = durable.borrow_and_update().clone();
                    if let Some(e) = &d.failed {
                        // The store failed: the bus is stopping, and these
                        // events stay unacked (the upstream redelivers them
                        // to the next bus).
                        tracing::warn!(source = self.name(), conn, cause = %e, unacked = pending.len(), "events left unacked: the store failed");
                        return ConnEnd::Shutdown;
                    }
                    while pending.front().is_some_and(|(seq, _)| *seq <= d.seq) {
                        let Some((_, ack)) = pending.pop_front() else { break };
                        if let Err(e) = send(&mut sink, Message::text(ack), write_timeout).await {
                            return ConnEnd::Lost {
                                why: scrub.clean(&format!("sending an ack failed: {e}")),
                                healthy: healthy(received, acked),
                            };
                        }
                        acked += 1;
                    }
                    continue;
                }
                m = stream.next() => m,
                _ = tokio::time::sleep_until(draining.as_ref().map_or(far, |d| d.0)), if draining.is_some() => {
                    // The server never closed it: acks already durable go
                    // out, the rest are redelivered on the next connection.
                    let done = durable.borrow().seq;
                    while pending.front().is_some_and(|(s, _)| *s <= done) {
                        if let Some((_, ack)) = pending.pop_front() {
                            let _ = send(&mut sink, Message::text(ack), write_timeout).await;
                        }
                    }
                    tracing::info!(source = self.name(), conn, unacked = pending.len(), "closing a connection the server did not close after disconnect");
                    close(&mut sink).await;
                    let reason = draining.map(|d| d.1).unwrap_or_default();
                    return ConnEnd::Disconnect { reason };
                }
                _ = pings.tick(), if alive_on => {
                    ping_seq += 1;
                    let payload = bytes::Bytes::from(format!("dws-{ping_seq}"));
                    if let Err(e) = send(&mut sink, Message::Ping(payload), write_timeout).await {
                        return ConnEnd::Lost { why: scrub.clean(&format!("sending a keepalive ping failed: {e}")), healthy: healthy(received, acked) };
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(dead_at), if alive_on => {
                    close(&mut sink).await;
                    return ConnEnd::Lost {
                        why: format!(
                            "connection dead: nothing received (no pong) for {}s",
                            (keepalive + self.tuning.pong_timeout).as_secs_f64()
                        ),
                        healthy: healthy(received, acked),
                    };
                }
            };
            let closed = matches!(msg, None | Some(Err(_)) | Some(Ok(Message::Close(_))));
            if closed && draining.is_some() {
                if matches!(msg, Some(Ok(Message::Close(_)))) {
                    close(&mut sink).await;
                }
                // The server closed the connection it asked us to leave.
                if !pending.is_empty() {
                    tracing::info!(source = self.name(), conn, unacked = pending.len(), "connection closed after disconnect with acks not sent: the server redelivers those events");
                }
                let reason = draining.map(|d| d.1).unwrap_or_default();
                return ConnEnd::Disconnect { reason };
            }
            let msg = match msg {
                None => {
                    return ConnEnd::Lost {
                        why: "connection closed by the server".into(),
                        healthy: healthy(received, acked),
                    }
                }
                Some(Err(e)) => {
                    return ConnEnd::Lost {
                        why: scrub.clean(&format!("connection failed: {e}")),
                        healthy: healthy(received, acked),
                    }
                }
                Some(Ok(m)) => m,
            };
            last_alive = Instant::now();
            received = true;
            match msg {
                Message::Text(text) => {
                    let name = self.name();
                    let (ack, durable_seq) = match dispatch::decide(
                        &self.upstream,
                        self.policy.frames,
                        text.as_str(),
                    ) {
                        Decision::Skip(why) => {
                            self.hub
                                .source_malformed(&format!("{name} frame skipped: {why}"));
                            continue;
                        }
                        Decision::Reply(ack) => (ack, None),
                        Decision::Unroutable { why, ack } => {
                            self.unroutables.record(&self.hub, name, &why);
                            (ack, None)
                        }
                        Decision::Append { event, ack } => match self.hub.append(*event) {
                            Ok(a) => {
                                tracing::debug!(source = name, conn, event_id = %a.event_id, seq = a.seq, duplicate = a.duplicate, "event");
                                (ack, Some(a.seq))
                            }
                            Err(r) => {
                                let why = Unroutable::new("refused by the bus", r.message);
                                self.unroutables.record(&self.hub, name, &why);
                                (ack, None)
                            }
                        },
                        Decision::Disconnect { reply, reason }
                            if self.policy.frames == Frames::AckAll =>
                        {
                            // The reference: ack it, keep reading (and
                            // acking) until the server closes, then
                            // reconnect — never two connections at once.
                            tracing::info!(source = name, conn, reason = %reason, "server sent disconnect; serving until it closes the connection");
                            if draining.is_none() {
                                let until = Instant::now() + self.tuning.drain_grace;
                                draining = Some((until, scrub.clean(&reason)));
                            }
                            (reply, None)
                        }
                        Decision::Disconnect { reply, reason } => {
                            // Acks already durable go out first; the rest
                            // are redelivered on the new connection (and
                            // deduplicated).
                            let done = durable.borrow().seq;
                            while pending.front().is_some_and(|(s, _)| *s <= done) {
                                if let Some((_, ack)) = pending.pop_front() {
                                    let _ =
                                        send(&mut sink, Message::text(ack), write_timeout).await;
                                }
                            }
                            if let Some(ack) = reply {
                                let _ = send(&mut sink, Message::text(ack), write_timeout).await;
                            }
                            tracing::info!(source = name, conn, reason = %reason, "server sent disconnect");
                            let grace = self.tuning.drain_grace;
                            let shutdown = self.shutdown.clone();
                            let frames = self.policy.frames;
                            tokio::spawn(drain(sink, stream, grace, shutdown, conn, frames, name));
                            return ConnEnd::Disconnect {
                                reason: scrub.clean(&reason),
                            };
                        }
                    };
                    let Some(ack) = ack else { continue };
                    // An upstream ack is a promise the event will not be
                    // lost: it waits for the disk (behind earlier acks).
                    let needs = durable_seq.unwrap_or(0);
                    if !pending.is_empty() || needs > durable.borrow().seq {
                        pending.push_back((needs, ack));
                        durable.mark_changed();
                        continue;
                    }
                    if let Err(e) = send(&mut sink, Message::text(ack), write_timeout).await {
                        return ConnEnd::Lost {
                            why: scrub.clean(&format!("sending an ack failed: {e}")),
                            healthy: healthy(received, acked),
                        };
                    }
                    acked += 1;
                }
                Message::Binary(b) => self.hub.source_malformed(&format!(
                    "{}: binary WebSocket frame ({} bytes)",
                    self.name(),
                    b.len()
                )),
                // tungstenite queues the pong; flush it out now.
                Message::Ping(_) => {
                    if let Err(e) = timeout_flush(&mut sink, write_timeout).await {
                        return ConnEnd::Lost {
                            why: scrub.clean(&format!("answering a ping failed: {e}")),
                            healthy: healthy(received, acked),
                        };
                    }
                }
                Message::Pong(_) | Message::Frame(_) => {}
                Message::Close(frame) => {
                    let detail = frame
                        .map(|f| {
                            format!(
                                " (code {}, {:?})",
                                u16::from(f.code),
                                one_line(&f.reason, 100)
                            )
                        })
                        .unwrap_or_default();
                    close(&mut sink).await;
                    return ConnEnd::Lost {
                        why: scrub.clean(&format!("connection closed by the server{detail}")),
                        healthy: healthy(received, acked),
                    };
                }
            }
        }
    }
}

/// After `disconnect`: keep the old socket for the server to close, answer
/// its pings, take no new work (events stay unacked and are redelivered on
/// the replacement connection), close it ourselves after `grace`.
async fn drain(
    mut sink: WsSink,
    mut stream: WsStream,
    grace: Duration,
    mut shutdown: Shutdown,
    conn: u64,
    frames: Frames,
    name: &'static str,
) {
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    loop {
        let msg = tokio::select! {
            _ = &mut deadline => break,
            _ = shutdown.recv() => break,
            m = stream.next() => m,
        };
        match msg {
            Some(Ok(Message::Text(t))) => match dispatch::ping_ack(frames, t.as_str()) {
                Some(ack) => {
                    let _ = send(&mut sink, Message::text(ack), grace).await;
                }
                None => {
                    tracing::info!(
                        source = name,
                        conn,
                        "frame on a draining connection left unacked"
                    )
                }
            },
            Some(Ok(Message::Ping(_))) => {
                let _ = timeout_flush(&mut sink, grace).await;
            }
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                tracing::debug!(
                    source = name,
                    conn,
                    "drained connection closed by the server"
                );
                close(&mut sink).await;
                return;
            }
            Some(Ok(_)) => {}
        }
    }
    tracing::debug!(source = name, conn, "closing the drained connection");
    close(&mut sink).await;
}

async fn send(sink: &mut WsSink, msg: Message, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, sink.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("write blocked for {}s", timeout.as_secs_f64())),
    }
}

async fn timeout_flush(sink: &mut WsSink, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, sink.flush()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("write blocked for {}s", timeout.as_secs_f64())),
    }
}

/// Best-effort close handshake, bounded.
async fn close(sink: &mut WsSink) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.close()).await;
}
