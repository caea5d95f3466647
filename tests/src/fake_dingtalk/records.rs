//! What the fake records (opens, handshakes, connections, acks, EVENTs in
//! flight) and what a test asks it to push or fail.

use std::time::Instant;

use serde_json::Value;

use super::parse_query;

/// One open request as received.
#[derive(Debug, Clone)]
pub struct OpenRecord {
    pub at: Instant,
    /// The JSON body (`Value::Null` if it was not JSON).
    pub body: Value,
    /// The status answered (0: the connection was reset without an answer).
    pub status: u16,
    /// The ticket issued, if any.
    pub ticket: Option<String>,
}

/// One WebSocket upgrade request.
#[derive(Debug, Clone)]
pub struct HandshakeRecord {
    pub at: Instant,
    pub path: String,
    /// Raw query string (without `?`).
    pub query: String,
    /// The decoded `ticket` parameter ("" if absent).
    pub ticket: String,
    /// The `User-Agent` header ("" if absent).
    pub user_agent: String,
    pub accepted: bool,
    /// Why it was refused ("" when accepted).
    pub refusal: String,
    /// The connection id, when accepted.
    pub conn: Option<u64>,
}

impl HandshakeRecord {
    /// Decoded query parameters, in order.
    pub fn params(&self) -> Vec<(String, String)> {
        parse_query(&self.query)
    }
}

/// One accepted WebSocket connection.
#[derive(Debug, Clone)]
pub struct ConnRecord {
    pub id: u64,
    pub ticket: String,
    pub opened_at: Instant,
    pub closed_at: Option<Instant>,
    /// How it ended ("client closed", "dropped by test", …).
    pub end: String,
    /// `disconnect` was sent on it.
    pub draining: bool,
    pub disconnect_sent_at: Option<Instant>,
    /// The test froze it: it no longer reads (so answers no ping) or writes.
    pub frozen: bool,
    /// WebSocket pings received from the client.
    pub client_pings: u64,
    /// Payloads of pongs received from the client.
    pub pongs: Vec<Vec<u8>>,
    /// Text frames received that were not valid acks.
    pub bad_frames: u64,
}

/// One ack (response frame) received from the client.
#[derive(Debug, Clone)]
pub struct Ack {
    pub at: Instant,
    pub conn: u64,
    pub message_id: String,
    pub code: i64,
    pub message: String,
    /// `headers.contentType`.
    pub content_type: String,
    /// `data`, as sent (JSON text).
    pub data: String,
    /// `data.status` when `data` is a JSON object with one.
    pub status: Option<String>,
    pub raw: String,
}

/// An EVENT the fake delivers until it is acked.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub message_id: String,
    pub event_id: String,
    pub frame: String,
    /// The connection it is in flight on.
    pub conn: Option<u64>,
    pub sent_at: Option<Instant>,
    /// How many times it was sent.
    pub sends: u32,
    /// Acked 200 (not LATER): delivered.
    pub acked: bool,
    /// Acked with a diagnostic code (4xx): not delivered, not sent again
    /// (the protocol note: 400/404 acks are diagnostics only).
    pub diagnosed: Option<i64>,
}

impl Outgoing {
    /// Nothing more will be sent for it.
    pub fn settled(&self) -> bool {
        self.acked || self.diagnosed.is_some()
    }
}

/// An EVENT to push.
#[derive(Debug, Clone)]
pub struct Event {
    pub event_id: String,
    pub event_type: String,
    /// Payload JSON text (sent as the `data` string).
    pub data: String,
    /// Extra or overriding headers.
    pub extra_headers: Vec<(String, String)>,
}

impl Event {
    pub fn new(
        event_id: impl Into<String>,
        event_type: impl Into<String>,
        data: impl Into<String>,
    ) -> Event {
        Event {
            event_id: event_id.into(),
            event_type: event_type.into(),
            data: data.into(),
            extra_headers: vec![],
        }
    }

    pub fn header(mut self, k: impl Into<String>, v: impl Into<String>) -> Event {
        self.extra_headers.push((k.into(), v.into()));
        self
    }
}

/// How the next open request fails.
#[derive(Debug, Clone)]
pub enum OpenFault {
    /// Answer this status and body.
    Status(u16, String),
    /// Close the TCP connection without answering.
    Reset,
    /// Answer 200 with an empty `endpoint` and/or `ticket`.
    Empty { endpoint: bool, ticket: bool },
}
