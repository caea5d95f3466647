//! What the two DingTalk Stream sources share: the frame protocol
//! ([`frame`]), URLs, TLS and HTTP ([`net`]), and the connection runner —
//! get a ticket, dial the WebSocket, serve it, reconnect with backoff.
//!
//! A source plugs in through [`Upstream`]: how a ticket is obtained (the app
//! stream's `connections/open`, the personal stream's ticket endpoint) and
//! how an EVENT frame becomes a bus event. Everything else is here:
//!
//! 1. One ticket request in flight at a time; a ticket is used once. A
//!    [`TicketError::Fatal`] makes the source `lost` at once; a
//!    [`TicketError::Retry`] is a failed attempt.
//! 2. WebSocket to `endpoint` with the query parameter `ticket` set (other
//!    path and query parts kept).
//! 3. Every push with a `messageId` is acknowledged:
//!    - `SYSTEM ping`: 200, the push's `data` (`{"opaque":…}`) echoed;
//!    - `EVENT`: turned into a bus event by [`Upstream::event`] and
//!      appended ([`Hub::append`] is synchronous and deduplicates), *then*
//!      acked 200 SUCCESS — a duplicate is acked again and delivered once;
//!      an EVENT that is no event is counted malformed and acked 400;
//!    - `CALLBACK` (no callback topic is registered): 404 `topic not exist`;
//!    - other `SYSTEM` topics: 200 with the data echoed; unknown `type`: 404;
//!    - a text frame that is not a frame (not JSON, no `type`/`headers`), or
//!      a binary frame: skipped, counted as malformed, not acked; the
//!      connection is kept.
//! 4. `SYSTEM disconnect`: acked; the old socket takes no more work (any
//!    EVENT it still carries is left unacked, so the server redelivers it)
//!    and is left to the server to close (bounded by a grace timer), while a
//!    replacement connection with a fresh ticket is opened at once
//!    (make-before-break).
//! 5. Liveness: a WebSocket ping every `keepalive`; when nothing (pong or
//!    any other frame) has arrived for `keepalive` + the pong timeout the
//!    connection is dead: it is closed and replaced. Server pings are
//!    answered.
//! 6. Reconnects use exponential backoff with jitter (`backoff_min`
//!    doubling to `backoff_max`), reset after a healthy connection (see
//!    [`Healthy`]). `max_attempts` consecutive failed attempts (ticket
//!    failed, handshake failed, or a connection that ended unhealthy; 0 =
//!    unlimited) make the source `lost`: the bus then ends with Bye
//!    SOURCE_LOST.
//!
//! Secrets: credentials and tickets are never logged, never put in a state
//! reason or an error. Every message that leaves this module passes through
//! [`Scrub`], which replaces them should a peer ever echo them.
//!
//! Test-only knobs (environment of the bus), all in milliseconds, for both
//! sources: `DWS_DINGTALK_BACKOFF_MIN_MS`, `DWS_DINGTALK_BACKOFF_MAX_MS`,
//! `DWS_DINGTALK_PONG_TIMEOUT_MS` (default 5000: the "+ pong timeout"
//! above) and `DWS_DINGTALK_DRAIN_GRACE_MS` (15000: how long a socket that
//! received `disconnect` is kept for the server to close it).

pub mod frame;
pub mod net;

use std::{
    future::Future,
    hash::{BuildHasher, RandomState},
    sync::Arc,
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

use self::{frame::Frame, net::Url};
use super::SourceContext;
use crate::{
    hub::{now_ms, Hub, NewEvent},
    shutdown::Shutdown,
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

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type WsSink = SplitSink<Ws, Message>;
type WsStream = SplitStream<Ws>;

/// The `User-Agent` of every upstream request.
pub fn user_agent() -> String {
    format!("dws-busd/{}", proto::BUILD)
}

// ------------------------------------------------------------------ plug-in

/// A ticketed WebSocket endpoint.
pub struct Ticket {
    pub endpoint: Url,
    pub ticket: String,
}

/// Why no ticket was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketError {
    /// A failed attempt: back off and try again.
    Retry(String),
    /// The upstream will not have us (bad credentials, a malformed answer):
    /// the source is lost now.
    Fatal(String),
}

/// What a stream source adds to the shared runner.
pub trait Upstream: Send + Sync + 'static {
    /// Name in log lines and messages (`dingtalk`, `personal`).
    fn name(&self) -> &'static str;

    /// Obtains a fresh ticket. Messages need not be scrubbed: the runner
    /// passes them through [`Upstream::scrub`].
    fn ticket(&self) -> impl Future<Output = Result<Ticket, TicketError>> + Send;

    /// The bus event for an EVENT frame, or why the frame is not one.
    fn event(&self, f: &Frame) -> Result<NewEvent, String>;

    /// The secrets known so far (credentials; tickets are added by the runner).
    fn scrub(&self) -> Scrub;
}

/// When a connection counts as healthy, which resets the backoff and the
/// count of consecutive failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Healthy {
    /// It received any frame (a pong included) or lasted 30 s.
    Frame,
    /// It acknowledged at least one push.
    Acked,
}

/// Per-source behaviour of the runner.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Interval of client WebSocket pings; zero = none.
    pub keepalive: Duration,
    /// Consecutive failed attempts before the source is lost; 0 = never.
    pub max_attempts: u32,
    pub healthy: Healthy,
    /// Match the frame `type` case-insensitively (`event` = `EVENT`).
    pub lenient_type: bool,
}

/// Timings; the defaults are the protocol's, tests shorten them via env.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub pong_timeout: Duration,
    pub drain_grace: Duration,
}

impl Tuning {
    /// Backoff from `backoff_min` to `backoff_max`, a 5 s pong timeout and
    /// a 15 s drain grace.
    pub fn new(backoff_min: Duration, backoff_max: Duration) -> Tuning {
        Tuning {
            backoff_min,
            backoff_max,
            pong_timeout: Duration::from_secs(5),
            drain_grace: Duration::from_secs(15),
        }
    }

    /// `self`, overridden by the test knobs in the environment.
    pub fn with_env(self) -> Tuning {
        let ms = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        let backoff_min = ms("DWS_DINGTALK_BACKOFF_MIN_MS")
            .unwrap_or(self.backoff_min)
            .max(Duration::from_millis(1));
        let backoff_max = ms("DWS_DINGTALK_BACKOFF_MAX_MS")
            .unwrap_or(self.backoff_max)
            .max(backoff_min);
        Tuning {
            backoff_min,
            backoff_max,
            pong_timeout: ms("DWS_DINGTALK_PONG_TIMEOUT_MS").unwrap_or(self.pong_timeout),
            drain_grace: ms("DWS_DINGTALK_DRAIN_GRACE_MS").unwrap_or(self.drain_grace),
        }
    }
}

// ------------------------------------------------------------------ secrets

/// Replaces secrets (credentials, tickets) in text that is about to be
/// logged, stored in the source state or shown to a consumer.
#[derive(Clone, Default)]
pub struct Scrub {
    needles: Vec<String>,
}

impl Scrub {
    pub fn new(secret: &str) -> Scrub {
        let mut s = Scrub::default();
        s.add(secret);
        s
    }

    /// Adds a value to hide (with its percent-encoded form, as it appears in
    /// a URL). Very short values are not worth mangling messages for.
    pub fn add(&mut self, value: &str) {
        if value.len() >= 4 && !self.needles.iter().any(|n| n == value) {
            let enc = net::percent_encode(value);
            if enc != value {
                self.needles.push(enc);
            }
            self.needles.push(value.to_owned());
        }
    }

    pub fn clean(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for n in &self.needles {
            if out.contains(n.as_str()) {
                out = out.replace(n.as_str(), "<redacted>");
            }
        }
        out
    }
}

// ------------------------------------------------------------------ backoff

/// Exponential backoff with jitter: the n-th delay is `b + U[0, b/4]` with
/// `b = min·2ⁿ`, never more than `max`. Delays never decrease until
/// [`Backoff::reset`].
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    base: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            base: min,
        }
    }

    pub fn reset(&mut self) {
        self.base = self.min;
    }

    pub fn next_delay(&mut self) -> Duration {
        let b = self.base;
        let jitter_ms = (b.as_millis() / 4) as u64;
        let jitter = if jitter_ms == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(random_u64() % (jitter_ms + 1))
        };
        self.base = (b * 2).min(self.max);
        (b + jitter).min(self.max)
    }
}

fn random_u64() -> u64 {
    RandomState::new().hash_one((std::process::id(), now_ms(), Instant::now()))
}

// ------------------------------------------------------------------ helpers

/// `s` on one line (runs of whitespace and control characters become one
/// space), at most `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let flat = s
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out: String = flat.chars().take(max).collect();
    if flat.chars().count() > max {
        out.push('…');
    }
    out
}

/// A WebSocket endpoint handed out with a ticket: `ws`/`wss` with a host,
/// plain `ws` only to loopback.
pub fn parse_endpoint(endpoint: &str) -> Result<Url, String> {
    let url = Url::parse(endpoint).map_err(|e| format!("invalid endpoint: {e}"))?;
    if !matches!(url.scheme.as_str(), "ws" | "wss") {
        return Err(format!("endpoint scheme {:?} is not ws/wss", url.scheme));
    }
    url.check_transport()
        .map_err(|e| format!("endpoint: {e}"))?;
    Ok(url)
}

/// Reports the source lost and ends the bus with SOURCE_LOST.
pub fn source_lost(hub: &Hub, attempt: u32, reason: &str) {
    hub.set_source_state(
        v1::SourceState {
            state: v1::SourceStatus::Lost as i32,
            attempt,
            reason: reason.to_owned(),
            since_unix_ms: now_ms(),
            ..Default::default()
        },
        Some(reason.to_owned()),
    );
    hub.shutdown_trigger().trigger(v1::ByeReason::SourceLost);
}

// ------------------------------------------------------------------ runner

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
    /// The server sent `disconnect`: the old socket drains on its own task;
    /// open a replacement now.
    Disconnect { reason: String },
    /// The connection is gone; `healthy` per [`Policy::healthy`].
    Lost { why: String, healthy: bool },
}

struct Runner<U> {
    upstream: U,
    policy: Policy,
    tuning: Tuning,
    tls: Arc<rustls::ClientConfig>,
    hub: Hub,
    shutdown: Shutdown,
    /// Consecutive failed attempts.
    failures: u32,
    backoff: Backoff,
    /// Connections opened so far (for log lines).
    conn_seq: u64,
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
        let url = t.endpoint.with_query_param("ticket", &t.ticket);
        let ws = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.handshake(&url))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no WebSocket handshake within {}s",
                    HANDSHAKE_TIMEOUT.as_secs()
                ))
            })
            .map_err(|e| {
                TicketError::Retry(
                    scrub.clean(&format!("connect to {} failed: {e}", t.endpoint.redacted())),
                )
            })?;
        tracing::info!(source = self.name(), endpoint = %t.endpoint.redacted(), "connected");
        Ok((ws, scrub))
    }

    async fn handshake(&self, url: &Url) -> Result<Ws, String> {
        let mut req = url
            .to_string()
            .into_client_request()
            .map_err(|e| format!("invalid endpoint: {e}"))?;
        if let Ok(ua) = user_agent().parse() {
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
            Err(tungstenite::Error::Http(resp)) => {
                Err(format!("handshake rejected: HTTP {}", resp.status()))
            }
            Err(e) => Err(e.to_string()),
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
                m = stream.next() => m,
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
                    match handle_text(&self.hub, &self.upstream, &self.policy, text.as_str(), conn)
                    {
                        Outcome::Nothing => {}
                        Outcome::ReplyWhenDurable(ack, seq) => {
                            if let Err(e) = self.hub.wait_durable(seq).await {
                                // The store failed: the bus is stopping, and
                                // this event stays unacked (the upstream
                                // redelivers it to the next bus).
                                tracing::warn!(source = self.name(), conn, cause = %e, "event left unacked: the store failed");
                                return ConnEnd::Shutdown;
                            }
                            if let Err(e) = send(&mut sink, Message::text(ack), write_timeout).await
                            {
                                return ConnEnd::Lost {
                                    why: scrub.clean(&format!("sending an ack failed: {e}")),
                                    healthy: healthy(received, acked),
                                };
                            }
                            acked += 1;
                        }
                        Outcome::Reply(ack) => {
                            if let Err(e) = send(&mut sink, Message::text(ack), write_timeout).await
                            {
                                return ConnEnd::Lost {
                                    why: scrub.clean(&format!("sending an ack failed: {e}")),
                                    healthy: healthy(received, acked),
                                };
                            }
                            acked += 1;
                        }
                        Outcome::Disconnect { reply, reason } => {
                            if let Some(ack) = reply {
                                let _ = send(&mut sink, Message::text(ack), write_timeout).await;
                            }
                            let grace = self.tuning.drain_grace;
                            let shutdown = self.shutdown.clone();
                            let lenient = self.policy.lenient_type;
                            let name = self.name();
                            tokio::spawn(drain(sink, stream, grace, shutdown, conn, lenient, name));
                            return ConnEnd::Disconnect {
                                reason: scrub.clean(&reason),
                            };
                        }
                    }
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

/// What to do after a text frame.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Nothing,
    Reply(String),
    /// Send this ack once the event (seq) is durable: an upstream ack is a
    /// promise the event will not be lost.
    ReplyWhenDurable(String, u64),
    Disconnect {
        reply: Option<String>,
        reason: String,
    },
}

/// The frame's `type`, upper-cased when the policy is lenient.
fn kind_of(f: &Frame, lenient: bool) -> String {
    if lenient {
        f.kind.to_ascii_uppercase()
    } else {
        f.kind.clone()
    }
}

/// Handles one text frame synchronously: decode, append, decide the ack.
fn handle_text<U: Upstream>(
    hub: &Hub,
    upstream: &U,
    policy: &Policy,
    text: &str,
    conn: u64,
) -> Outcome {
    let name = upstream.name();
    let f = match frame::parse(text) {
        Ok(f) => f,
        Err(why) => {
            hub.source_malformed(&format!("{name} frame skipped: {why}"));
            return Outcome::Nothing;
        }
    };
    let mid = f.message_id().to_owned();
    let reply = |ack: String| {
        if mid.is_empty() {
            Outcome::Nothing
        } else {
            Outcome::Reply(ack)
        }
    };
    match kind_of(&f, policy.lenient_type).as_str() {
        "EVENT" => {
            let ev = match upstream.event(&f) {
                Ok(ev) => ev,
                Err(why) => {
                    hub.source_malformed(&format!("{name} EVENT {mid:?} skipped: {why}"));
                    let data = serde_json::json!({ "message": why }).to_string();
                    return reply(frame::ack(&mid, 400, &why, &data));
                }
            };
            let a = match hub.append(ev) {
                Ok(a) => a,
                Err(r) => {
                    hub.source_malformed(&format!("{name} EVENT {mid:?} refused: {}", r.message));
                    let data = serde_json::json!({ "message": r.message }).to_string();
                    return reply(frame::ack(&mid, 400, &r.message, &data));
                }
            };
            tracing::debug!(source = name, conn, message_id = %mid, event_id = %a.event_id, seq = a.seq, duplicate = a.duplicate, "event");
            match reply(frame::event_success(&mid)) {
                Outcome::Reply(ack) => Outcome::ReplyWhenDurable(ack, a.seq),
                other => other,
            }
        }
        "SYSTEM" => match f.topic() {
            "disconnect" => {
                let reason = serde_json::from_str::<serde_json::Value>(&f.data)
                    .ok()
                    .and_then(|v| {
                        v.get("reason")
                            .and_then(|r| r.as_str())
                            .map(|r| one_line(r, 200))
                    })
                    .unwrap_or_else(|| "no reason given".into());
                tracing::info!(source = name, conn, reason = %reason, "server sent disconnect");
                Outcome::Disconnect {
                    reply: (!mid.is_empty()).then(|| frame::ack(&mid, 200, "OK", "")),
                    reason,
                }
            }
            topic => {
                if topic != "ping" {
                    tracing::debug!(source = name, conn, topic, "unknown SYSTEM topic acked");
                }
                reply(frame::ack(&mid, 200, "OK", &f.data))
            }
        },
        "CALLBACK" => {
            tracing::info!(source = name, conn, topic = %one_line(f.topic(), 100), "CALLBACK for an unregistered topic: 404");
            reply(frame::ack(
                &mid,
                404,
                "topic not exist",
                r#"{"response":null}"#,
            ))
        }
        other => {
            tracing::info!(source = name, conn, kind = %one_line(other, 50), "frame of unknown type: 404");
            reply(frame::ack(&mid, 404, "type not exist", ""))
        }
    }
}

/// After `disconnect`: keep the old socket for the server to close, answer
/// its pings, take no new work (EVENTs stay unacked and are redelivered on
/// the replacement connection), close it ourselves after `grace`.
async fn drain(
    mut sink: WsSink,
    mut stream: WsStream,
    grace: Duration,
    mut shutdown: Shutdown,
    conn: u64,
    lenient: bool,
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
            Some(Ok(Message::Text(t))) => match frame::parse(t.as_str()) {
                Ok(f)
                    if kind_of(&f, lenient) == "SYSTEM"
                        && f.topic() == "ping"
                        && !f.message_id().is_empty() =>
                {
                    let ack = frame::ack(f.message_id(), 200, "OK", &f.data);
                    let _ = send(&mut sink, Message::text(ack), grace).await;
                }
                Ok(f) => {
                    tracing::info!(source = name, conn, kind = %one_line(&f.kind, 50), "frame on a draining connection left unacked")
                }
                Err(_) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut prev = Duration::ZERO;
        let mut seen = vec![];
        for _ in 0..12 {
            let d = b.next_delay();
            assert!(d >= prev, "{seen:?} then {d:?}");
            assert!(d <= Duration::from_secs(60));
            seen.push(d);
            prev = d;
        }
        assert!(
            seen[0] >= Duration::from_secs(1) && seen[0] <= Duration::from_millis(1250),
            "{seen:?}"
        );
        assert!(
            seen[1] >= Duration::from_secs(2) && seen[1] <= Duration::from_millis(2500),
            "{seen:?}"
        );
        assert_eq!(*seen.last().unwrap(), Duration::from_secs(60));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(1250));
    }

    #[test]
    fn scrub_hides_secrets_and_their_url_form() {
        let mut s = Scrub::new("s3cr3t/+=");
        s.add("tick-et 1");
        s.add("abc"); // too short to bother
        let text = "a s3cr3t/+= b s3cr3t%2F%2B%3D c tick-et%201 d tick-et 1 abc";
        assert_eq!(
            s.clean(text),
            "a <redacted> b <redacted> c <redacted> d <redacted> abc"
        );
    }

    #[test]
    fn tls_config_builds_with_ring_and_roots_and_feeds_the_http_client() {
        let cfg = net::tls_config().unwrap();
        assert!(cfg.alpn_protocols.is_empty());
        net::http_client(&cfg, &user_agent(), Duration::from_secs(1)).unwrap();
    }

    #[test]
    fn one_line_truncates() {
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("  <p>\n   x\t\r y </p> ", 20), "<p> x y </p>");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }

    #[test]
    fn endpoints_must_be_websocket_urls() {
        assert!(parse_endpoint("wss://gw.example.com/connect").is_ok());
        assert!(parse_endpoint("ws://127.0.0.1:9/connect").is_ok());
        assert!(parse_endpoint("ws://gw.example.com/connect").is_err());
        assert!(parse_endpoint("https://gw.example.com/connect").is_err());
        assert!(parse_endpoint("wss:///connect").is_err());
        assert!(parse_endpoint("").is_err());
    }
}
