//! The `dingtalk` source: the DingTalk Stream *app* protocol.
//!
//! 1. `POST {open_api}/v1.0/gateway/connections/open` with the app's
//!    `clientId`/`clientSecret` and the subscriptions (`EVENT *`, plus the
//!    `SYSTEM` topics) → `{endpoint, ticket}`. Exactly one open request is in
//!    flight at a time; an empty `endpoint` or `ticket` is a failure.
//! 2. WebSocket to `endpoint` with the query parameter `ticket` set (other
//!    path and query parts kept). A ticket is used once, never reused.
//! 3. Every push with a `messageId` is acknowledged:
//!    - `SYSTEM ping`: 200, the push's `data` (`{"opaque":…}`) echoed;
//!    - `EVENT`: appended to the bus log ([`Hub::append`] is synchronous and
//!      deduplicates by `(dingtalk, eventId)`), *then* acked 200 SUCCESS —
//!      a duplicate is acked again and delivered once;
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
//!    any other frame) has arrived for `keepalive` + 5 s the connection is
//!    dead: it is closed and replaced. Server pings are answered.
//! 6. Reconnects use exponential backoff with jitter, 1 s doubling to 60 s,
//!    reset after a healthy connection (one that received at least one
//!    frame, a pong included, or lasted 30 s). `max_attempts` consecutive
//!    failed attempts (open failed, handshake failed, or a connection that
//!    ended unhealthy; 0 = unlimited) make the source `lost`: the bus then
//!    ends with Bye SOURCE_LOST.
//!
//! Secrets: the client secret and the tickets are never logged, never put in
//! a state reason or an error. Every message that leaves this module passes
//! through [`Scrub`], which replaces them should a peer ever echo them.
//!
//! Test-only knobs (environment of the bus), all in milliseconds:
//! `DWS_DINGTALK_BACKOFF_MIN_MS` (default 1000), `DWS_DINGTALK_BACKOFF_MAX_MS`
//! (60000), `DWS_DINGTALK_PONG_TIMEOUT_MS` (5000: the "+ 5 s" above) and
//! `DWS_DINGTALK_DRAIN_GRACE_MS` (15000: how long a socket that received
//! `disconnect` is kept for the server to close it).

pub mod frame;
pub mod net;

use std::{
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
use super::{Source, SourceContext, SourceFuture};
use crate::{
    hub::{now_ms, Hub, NewEvent},
    profile::DingTalkConfig,
    shutdown::Shutdown,
};

/// Dedup scope of DingTalk app events in the bus log.
pub const SCOPE: &str = "dingtalk";
/// Path of the open call, below the configured `open_api` base.
pub const OPEN_PATH: &str = "/v1.0/gateway/connections/open";
/// Whole open exchange (connect, TLS, request, response).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP + TLS + WebSocket handshake (the ticket is valid for 90 s).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// Close handshake on the way out.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest message accepted from the gateway (its frames are ≤ 256 KiB).
const MAX_MESSAGE: usize = 4 * 1024 * 1024;
/// A connection that lasted this long counts as healthy even if it never
/// received a frame (keepalive disabled, a quiet app).
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type WsSink = SplitSink<Ws, Message>;
type WsStream = SplitStream<Ws>;

pub struct DingTalkSource {
    pub config: DingTalkConfig,
}

/// Timings; the defaults are the protocol's, tests shorten them via env.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub pong_timeout: Duration,
    pub drain_grace: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            pong_timeout: Duration::from_secs(5),
            drain_grace: Duration::from_secs(15),
        }
    }
}

impl Tuning {
    pub fn from_env() -> Tuning {
        let ms = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        let d = Tuning::default();
        let backoff_min = ms("DWS_DINGTALK_BACKOFF_MIN_MS")
            .unwrap_or(d.backoff_min)
            .max(Duration::from_millis(1));
        let backoff_max = ms("DWS_DINGTALK_BACKOFF_MAX_MS")
            .unwrap_or(d.backoff_max)
            .max(backoff_min);
        Tuning {
            backoff_min,
            backoff_max,
            pong_timeout: ms("DWS_DINGTALK_PONG_TIMEOUT_MS").unwrap_or(d.pong_timeout),
            drain_grace: ms("DWS_DINGTALK_DRAIN_GRACE_MS").unwrap_or(d.drain_grace),
        }
    }
}

// ------------------------------------------------------------------ secrets

/// Replaces secrets (the client secret, tickets) in text that is about to be
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
        if value.len() >= 4 {
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

// ------------------------------------------------------------------ source

impl Source for DingTalkSource {
    fn kind(&self) -> &'static str {
        "dingtalk"
    }

    fn run(self: Box<Self>, ctx: SourceContext) -> SourceFuture {
        Box::pin(async move {
            let tuning = Tuning::from_env();
            Runner::new(self.config, tuning, ctx).run().await;
        })
    }
}

/// How a live connection ended.
enum ConnEnd {
    /// The bus is shutting down.
    Shutdown,
    /// The server sent `disconnect`: the old socket drains on its own task;
    /// open a replacement now.
    Disconnect { reason: String },
    /// The connection is gone; `healthy` if it had received a frame or
    /// lasted [`HEALTHY_AFTER`].
    Lost { why: String, healthy: bool },
}

/// A ticketed WebSocket endpoint from the open call.
struct Ticket {
    endpoint: Url,
    ticket: String,
}

struct Runner {
    config: DingTalkConfig,
    tuning: Tuning,
    hub: Hub,
    shutdown: Shutdown,
    scrub: Scrub,
    user_agent: String,
    /// Consecutive failed attempts.
    failures: u32,
    backoff: Backoff,
    /// Connections opened so far (for log lines).
    conn_seq: u64,
}

impl Runner {
    fn new(config: DingTalkConfig, tuning: Tuning, ctx: SourceContext) -> Runner {
        let scrub = Scrub::new(config.client_secret.expose());
        let backoff = Backoff::new(tuning.backoff_min, tuning.backoff_max);
        Runner {
            config,
            tuning,
            hub: ctx.hub,
            shutdown: ctx.shutdown,
            scrub,
            user_agent: format!("dws-busd/{}", proto::BUILD),
            failures: 0,
            backoff,
            conn_seq: 0,
        }
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

    /// Records a failed attempt; `false` when the source is now lost.
    fn failed(&mut self, why: &str) -> bool {
        self.failures += 1;
        tracing::warn!(attempt = self.failures, cause = %why, "dingtalk: attempt failed");
        let max = self.config.max_attempts;
        if max > 0 && self.failures >= max {
            let n = self.failures;
            let plural = if n == 1 { "" } else { "s" };
            let reason =
                format!("{why} ({n} consecutive failed attempt{plural}; max_attempts = {max})");
            tracing::error!(reason = %reason, "dingtalk: giving up, the source is lost");
            self.set_state(
                v1::SourceStatus::Lost,
                self.failures,
                0,
                &reason,
                Some(reason.clone()),
            );
            self.hub
                .shutdown_trigger()
                .trigger(v1::ByeReason::SourceLost);
            return false;
        }
        true
    }

    async fn run(mut self) {
        let tls = match net::tls_config() {
            Ok(t) => t,
            Err(e) => {
                self.set_state(v1::SourceStatus::Lost, 0, 0, &e, Some(e.clone()));
                self.hub
                    .shutdown_trigger()
                    .trigger(v1::ByeReason::SourceLost);
                return;
            }
        };
        let open_url = match Url::parse(&format!("{}{OPEN_PATH}", self.config.open_api)) {
            Ok(u) => u,
            Err(e) => {
                let reason = format!("invalid open_api URL: {e}");
                self.set_state(v1::SourceStatus::Lost, 0, 0, &reason, Some(reason.clone()));
                self.hub
                    .shutdown_trigger()
                    .trigger(v1::ByeReason::SourceLost);
                return;
            }
        };
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
                tracing::info!(retry_in = ?delay, attempt = self.failures + 1, "dingtalk: reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = self.shutdown.recv() => return,
                }
            }
            wait = true;
            let mut stop = self.shutdown.clone();
            let attempt = tokio::select! {
                r = self.connect(&open_url, &tls) => r,
                _ = stop.recv() => return,
            };
            let (ws, ticket_scrub) = match attempt {
                Ok(v) => v,
                Err(why) => {
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
                    tracing::info!(reason = %why, "dingtalk: opening a replacement connection");
                    self.set_state(v1::SourceStatus::Reconnecting, 1, now_ms(), &why, None);
                    last_reason = why;
                }
                ConnEnd::Lost { why, healthy } => {
                    let healthy = healthy || connected_at.elapsed() >= HEALTHY_AFTER;
                    tracing::warn!(cause = %why, healthy, "dingtalk: connection lost");
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

    /// One attempt: open call, then WebSocket handshake. The error is
    /// already scrubbed.
    async fn connect(
        &self,
        open_url: &Url,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Result<(Ws, Scrub), String> {
        tracing::info!(attempt = self.failures + 1, url = %open_url.redacted(), "dingtalk: opening a connection");
        let t = self
            .open(open_url, tls)
            .await
            .map_err(|e| self.scrub.clean(&e))?;
        let mut scrub = self.scrub.clone();
        scrub.add(&t.ticket);
        let url = t.endpoint.with_query_param("ticket", &t.ticket);
        let ws = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.handshake(&url, tls))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no WebSocket handshake within {}s",
                    HANDSHAKE_TIMEOUT.as_secs()
                ))
            })
            .map_err(|e| {
                scrub.clean(&format!("connect to {} failed: {e}", t.endpoint.redacted()))
            })?;
        tracing::info!(endpoint = %t.endpoint.redacted(), "dingtalk: connected");
        Ok((ws, scrub))
    }

    /// `POST …/connections/open` → endpoint and ticket.
    async fn open(&self, url: &Url, tls: &Arc<rustls::ClientConfig>) -> Result<Ticket, String> {
        let body = serde_json::json!({
            "clientId": self.config.client_id,
            "clientSecret": self.config.client_secret.expose(),
            "subscriptions": [
                {"type": "EVENT", "topic": "*"},
                {"type": "SYSTEM", "topic": "ping"},
                {"type": "SYSTEM", "topic": "disconnect"},
            ],
            "ua": self.user_agent,
        });
        let body = serde_json::to_vec(&body)
            .map_err(|e| format!("open failed: cannot encode the request: {e}"))?;
        let resp = net::post_json(url, &body, &self.user_agent, tls, OPEN_TIMEOUT)
            .await
            .map_err(|e| format!("open failed: {e}"))?;
        let json: Option<serde_json::Value> = serde_json::from_slice(&resp.body).ok();
        if resp.status != 200 {
            let text = |k: &str| {
                json.as_ref()
                    .and_then(|j| j.get(k))
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_owned()
            };
            let (code, message) = (text("code"), text("message"));
            let detail = if code.is_empty() && message.is_empty() {
                one_line(&String::from_utf8_lossy(&resp.body), 200)
            } else {
                one_line(&format!("{code}: {message}"), 200)
            };
            return Err(format!("open failed: {} {detail}", resp.status)
                .trim_end()
                .to_owned());
        }
        let Some(json) = json else {
            return Err("open failed: 200 but the response is not JSON".into());
        };
        let field = |k: &str| {
            json.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        let (endpoint, ticket) = (field("endpoint"), field("ticket"));
        if endpoint.is_empty() {
            return Err("open failed: 200 but the response has no endpoint".into());
        }
        if ticket.is_empty() {
            return Err("open failed: 200 but the response has no ticket".into());
        }
        let endpoint =
            Url::parse(&endpoint).map_err(|e| format!("open failed: invalid endpoint: {e}"))?;
        if !matches!(endpoint.scheme.as_str(), "ws" | "wss") {
            return Err(format!(
                "open failed: endpoint scheme {:?} is not ws/wss",
                endpoint.scheme
            ));
        }
        endpoint
            .check_transport()
            .map_err(|e| format!("open failed: endpoint: {e}"))?;
        Ok(Ticket { endpoint, ticket })
    }

    async fn handshake(&self, url: &Url, tls: &Arc<rustls::ClientConfig>) -> Result<Ws, String> {
        let mut req = url
            .to_string()
            .into_client_request()
            .map_err(|e| format!("invalid endpoint: {e}"))?;
        if let Ok(ua) = self.user_agent.parse() {
            req.headers_mut().insert("User-Agent", ua);
        }
        let ws_config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        match tokio_tungstenite::connect_async_tls_with_config(
            req,
            Some(ws_config),
            true,
            Some(Connector::Rustls(tls.clone())),
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
        let keepalive = self.config.keepalive;
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
        let mut healthy = false;
        let mut ping_seq: u64 = 0;
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
                        return ConnEnd::Lost { why: scrub.clean(&format!("sending a keepalive ping failed: {e}")), healthy };
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
                        healthy,
                    };
                }
            };
            let msg = match msg {
                None => {
                    return ConnEnd::Lost {
                        why: "connection closed by the server".into(),
                        healthy,
                    }
                }
                Some(Err(e)) => {
                    return ConnEnd::Lost {
                        why: scrub.clean(&format!("connection failed: {e}")),
                        healthy,
                    }
                }
                Some(Ok(m)) => m,
            };
            last_alive = Instant::now();
            healthy = true;
            match msg {
                Message::Text(text) => match handle_text(&self.hub, text.as_str(), conn) {
                    Outcome::Nothing => {}
                    Outcome::Reply(ack) => {
                        if let Err(e) = send(&mut sink, Message::text(ack), write_timeout).await {
                            return ConnEnd::Lost {
                                why: scrub.clean(&format!("sending an ack failed: {e}")),
                                healthy,
                            };
                        }
                    }
                    Outcome::Disconnect { reply, reason } => {
                        if let Some(ack) = reply {
                            let _ = send(&mut sink, Message::text(ack), write_timeout).await;
                        }
                        let grace = self.tuning.drain_grace;
                        let shutdown = self.shutdown.clone();
                        tokio::spawn(drain(sink, stream, grace, shutdown, conn));
                        return ConnEnd::Disconnect {
                            reason: scrub.clean(&reason),
                        };
                    }
                },
                Message::Binary(b) => self
                    .hub
                    .source_malformed(&format!("binary WebSocket frame ({} bytes)", b.len())),
                // tungstenite queues the pong; flush it out now.
                Message::Ping(_) => {
                    if let Err(e) = timeout_flush(&mut sink, write_timeout).await {
                        return ConnEnd::Lost {
                            why: scrub.clean(&format!("answering a ping failed: {e}")),
                            healthy,
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
                        healthy,
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
    Disconnect {
        reply: Option<String>,
        reason: String,
    },
}

/// Handles one text frame synchronously: decode, append, decide the ack.
fn handle_text(hub: &Hub, text: &str, conn: u64) -> Outcome {
    let f = match frame::parse(text) {
        Ok(f) => f,
        Err(why) => {
            hub.source_malformed(&format!("dingtalk frame skipped: {why}"));
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
    match f.kind.as_str() {
        "EVENT" => {
            let Some(ev) = to_event(&f) else {
                hub.source_malformed(&format!(
                    "dingtalk EVENT {mid:?} skipped: missing or invalid eventType"
                ));
                return reply(frame::ack(
                    &mid,
                    400,
                    "invalid eventType",
                    r#"{"message":"invalid eventType"}"#,
                ));
            };
            let a = hub.append(ev);
            tracing::debug!(conn, message_id = %mid, event_id = %a.event_id, seq = a.seq, duplicate = a.duplicate, "dingtalk: event");
            reply(frame::event_success(&mid))
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
                tracing::info!(conn, reason = %reason, "dingtalk: server sent disconnect");
                Outcome::Disconnect {
                    reply: (!mid.is_empty()).then(|| frame::ack(&mid, 200, "OK", "")),
                    reason,
                }
            }
            topic => {
                if topic != "ping" {
                    tracing::debug!(conn, topic, "dingtalk: unknown SYSTEM topic acked");
                }
                reply(frame::ack(&mid, 200, "OK", &f.data))
            }
        },
        "CALLBACK" => {
            tracing::info!(conn, topic = %one_line(f.topic(), 100), "dingtalk: CALLBACK for an unregistered topic: 404");
            reply(frame::ack(
                &mid,
                404,
                "topic not exist",
                r#"{"response":null}"#,
            ))
        }
        other => {
            tracing::info!(conn, kind = %one_line(other, 50), "dingtalk: frame of unknown type: 404");
            reply(frame::ack(&mid, 404, "type not exist", ""))
        }
    }
}

/// The bus event for an EVENT frame; `None` without a usable `eventType`.
fn to_event(f: &Frame) -> Option<NewEvent> {
    let event_type = f.header("eventType");
    if !proto::pattern::is_valid_event_type(event_type) {
        return None;
    }
    let ms = |k: &str| f.header(k).trim().parse::<i64>().ok().filter(|v| *v > 0);
    Some(NewEvent {
        scope: SCOPE.into(),
        event_id: f.header("eventId").to_owned(),
        event_type: event_type.to_owned(),
        event_born_time: ms("eventBornTime")
            .or_else(|| ms("time"))
            .unwrap_or_else(now_ms),
        event_corp_id: f.header("eventCorpId").to_owned(),
        event_unified_app_id: f.header("eventUnifiedAppId").to_owned(),
        source_id: SCOPE.into(),
        data: f.data.clone(),
        headers: f.headers.clone(),
        ..NewEvent::default()
    })
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
                    if f.kind == "SYSTEM" && f.topic() == "ping" && !f.message_id().is_empty() =>
                {
                    let ack = frame::ack(f.message_id(), 200, "OK", &f.data);
                    let _ = send(&mut sink, Message::text(ack), grace).await;
                }
                Ok(f) => {
                    tracing::info!(conn, kind = %one_line(&f.kind, 50), "dingtalk: frame on a draining connection left unacked")
                }
                Err(_) => {}
            },
            Some(Ok(Message::Ping(_))) => {
                let _ = timeout_flush(&mut sink, grace).await;
            }
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                tracing::debug!(conn, "dingtalk: drained connection closed by the server");
                close(&mut sink).await;
                return;
            }
            Some(Ok(_)) => {}
        }
    }
    tracing::debug!(conn, "dingtalk: closing the drained connection");
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

/// `s` on one line (runs of whitespace and control characters become one
/// space), at most `max` characters.
fn one_line(s: &str, max: usize) -> String {
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
    fn tls_config_builds_with_ring_and_roots() {
        let cfg = net::tls_config().unwrap();
        assert!(cfg.alpn_protocols.is_empty());
    }

    #[test]
    fn one_line_truncates() {
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("  <p>\n   x\t\r y </p> ", 20), "<p> x y </p>");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }

    #[test]
    fn events_need_a_valid_type() {
        let f = frame::parse(
            r#"{"type":"EVENT","headers":{"messageId":"m","eventId":"e1","eventType":"user_add_org","eventBornTime":"1700000000100","eventCorpId":"c","eventUnifiedAppId":"u","x-extra":"1"},"data":"{}"}"#,
        )
        .unwrap();
        let e = to_event(&f).unwrap();
        assert_eq!(
            (
                e.event_id.as_str(),
                e.event_type.as_str(),
                e.event_born_time
            ),
            ("e1", "user_add_org", 1_700_000_000_100)
        );
        assert_eq!(
            (
                e.event_corp_id.as_str(),
                e.event_unified_app_id.as_str(),
                e.scope.as_str()
            ),
            ("c", "u", SCOPE)
        );
        assert_eq!(e.headers["x-extra"], "1");
        let f =
            frame::parse(r#"{"type":"EVENT","headers":{"messageId":"m","eventType":"bad type"}}"#)
                .unwrap();
        assert!(to_event(&f).is_none());
    }
}
