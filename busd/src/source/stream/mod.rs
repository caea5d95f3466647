//! What the two DingTalk Stream sources share: the frame protocol
//! ([`frame`]) and what to do with each frame ([`dispatch`]), URLs, TLS and
//! HTTP ([`net`]), secret redaction ([`scrub`]), the backoff ([`backoff`]),
//! and the connection runner ([`run`]) — get a ticket, dial the WebSocket,
//! serve it, reconnect with backoff.
//!
//! A source plugs in through [`Upstream`]: how a ticket is obtained (the app
//! stream's `connections/open`, the personal stream's and the portal's
//! ticket endpoint) and how a frame becomes a bus event. Everything else is
//! here:
//!
//! 1. One ticket request in flight at a time; a ticket is used once. A
//!    [`TicketError::Fatal`] makes the source `lost` at once; a
//!    [`TicketError::Retry`] is a failed attempt.
//! 2. WebSocket to `endpoint` with the query parameter `ticket` set (other
//!    path and query parts kept; an embedded ticket kept when
//!    [`Ticket::keep_embedded`]).
//! 3. Frames are acked per [`dispatch::Frames`]; an event is acked only
//!    after it is appended *and durable* ([`SourceHandle::wait_durable`](crate::hub::SourceHandle::wait_durable)): a
//!    duplicate is acked again and delivered once; a frame that cannot be
//!    routed is acked and counted per reason, logged once per reason per
//!    minute.
//! 4. `SYSTEM disconnect`: acked. With [`Frames::AckAll`] (the personal
//!    stream and portal mode) as the reference CLI does
//!    (`internal/event/source/personal.go` `runAttempt`: it reads until the
//!    server closes): the connection is served as before — every frame
//!    acked, events acked once durable — until the server closes it, and
//!    only then is a new one opened, so there are never two at once (a
//!    gateway may allow one per user). A server that has not closed it
//!    after the grace timer gets it closed by the bus. With [`Frames::Sdk`]
//!    (the app stream): the old socket takes no more work (any event it
//!    still carries is left unacked, so the server redelivers it) and is
//!    left to the server to close (bounded by the grace timer), while a
//!    replacement connection with a fresh ticket is opened at once
//!    (make-before-break).
//! 5. Liveness (only when [`Policy::keepalive`] is set: the app stream; the
//!    reference CLI sends no pings on the personal stream): a WebSocket ping
//!    every `keepalive`; when nothing (pong or any other frame) has arrived
//!    for `keepalive` + the pong timeout the connection is dead: it is
//!    closed and replaced. Server pings are always answered.
//! 6. Reconnects use [`Backoff`] (`backoff_min` doubling to `backoff_max`,
//!    with jitter), reset after a healthy connection (see [`Healthy`]).
//!    `max_attempts` consecutive failed attempts (ticket failed, handshake
//!    failed, or a connection that ended unhealthy; 0 = unlimited) make the
//!    source `lost`: the bus then ends with Bye SOURCE_LOST.
//!
//! Secrets: credentials and tickets are never logged, never put in a state
//! reason or an error. Every message that leaves this module passes through
//! [`Scrub`], which replaces them should a peer ever echo them.
//!
//! Test-only knobs (environment of the bus), all in milliseconds, for both
//! sources: `DWS_DINGTALK_BACKOFF_MIN_MS`, `DWS_DINGTALK_BACKOFF_MAX_MS`,
//! `DWS_DINGTALK_PONG_TIMEOUT_MS` (default 5000: the "+ pong timeout"
//! above) and `DWS_DINGTALK_DRAIN_GRACE_MS` (15000: how long a socket that
//! received `disconnect` is kept for the server to close it); and
//! `DWS_DINGTALK_EXTRA_CA_FILE` (a PEM file of extra root certificates, so
//! a loopback `https://`/`wss://` fake with a test CA is trusted).

pub mod backoff;
pub mod dispatch;
pub mod frame;
pub mod net;
mod runner;
pub mod scrub;

use std::{future::Future, time::Duration};

use proto::v1;

use self::frame::Frame;
pub use self::{
    backoff::Backoff,
    dispatch::{Frames, Unroutable},
    net::Url,
    runner::run,
    scrub::Scrub,
};
use crate::{
    clock::now_ms,
    hub::{NewEvent, SourceHandle},
};

/// The `User-Agent` of every upstream request.
pub fn user_agent() -> String {
    format!("dws-busd/{}", proto::BUILD)
}

// ------------------------------------------------------------------ plug-in

/// A ticketed WebSocket endpoint.
pub struct Ticket {
    pub endpoint: Url,
    pub ticket: String,
    /// A non-empty `ticket` already in `endpoint`'s query is kept (the
    /// reference CLI's personal stream); otherwise it is replaced.
    pub keep_embedded: bool,
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

    /// The bus event for a frame, or why it cannot be routed.
    fn event(&self, f: &Frame) -> Result<NewEvent, Unroutable>;

    /// The secrets known so far (credentials; tickets are added by the runner).
    fn scrub(&self) -> Scrub;

    /// The `User-Agent` of the WebSocket handshake.
    fn ws_user_agent(&self) -> String {
        user_agent()
    }

    /// Whether a handshake refused with HTTP `status` ends the source
    /// (otherwise it is a failed attempt).
    fn handshake_refusal_is_fatal(&self, _status: u16) -> bool {
        false
    }
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
    /// Which frames are acked how, and which are offered as events.
    pub frames: Frames,
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
pub fn parse_endpoint(endpoint: &str) -> Result<Url, EndpointError> {
    let url = net::parse(endpoint).map_err(EndpointError::Invalid)?;
    if !matches!(url.scheme(), "ws" | "wss") {
        return Err(EndpointError::Scheme(url.scheme().to_owned()));
    }
    net::check_transport(&url).map_err(EndpointError::Transport)?;
    Ok(url)
}

/// Why a handed-out endpoint cannot be dialled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("invalid endpoint: {0}")]
    Invalid(crate::urls::UrlError),
    #[error("endpoint scheme {0:?} is not ws/wss")]
    Scheme(String),
    #[error("endpoint: {0}")]
    Transport(crate::urls::UrlError),
}

/// Reports the source lost and ends the bus with SOURCE_LOST.
pub fn source_lost(hub: &SourceHandle, attempt: u32, reason: &str) {
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
    hub.trigger_shutdown(v1::ByeReason::SourceLost);
}

#[cfg(test)]
mod tests {
    use super::*;

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
