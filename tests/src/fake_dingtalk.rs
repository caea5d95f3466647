//! A loopback fake of the DingTalk Stream gateway (protocol note §7): the
//! *app* stream, for conformance tests of the bus's `dingtalk` source and
//! for the demo, and the *personal* stream (ticket endpoint and subscription
//! control plane, see [`personal`]) for the `personal` source.
//!
//! One listener on `127.0.0.1:<port>` serves:
//!
//! - `POST /v1.0/gateway/connections/open`: checks `clientId`,
//!   `clientSecret` and `subscriptions` (extra fields and `SYSTEM` entries
//!   accepted), answers `{endpoint, ticket}` with a UUID ticket and an
//!   endpoint `ws://127.0.0.1:<port>/connect` (path and query configurable);
//!   wrong credentials → 401 `authFailed`, a bad body → 400 `systemError`.
//! - `GET <endpoint path>?ticket=…` (WebSocket): the ticket must be known,
//!   unused and younger than its TTL (90 s), else the upgrade is refused
//!   with HTTP 401.
//! - `POST /stream/connections/ticket`, `POST /dws/subscription/user`,
//!   `GET /dws/event/sublist`, `POST /dws/subscription/cancel`: the personal
//!   stream ([`personal`]).
//! - `POST /_fake/push` (`{"eventType","eventId"?,"data"?}`),
//!   `/_fake/disconnect` (`{"reason"?}`), `/_fake/drop`, `/_fake/state`:
//!   control endpoints for scripts (the demo), see
//!   [`FakeDingTalk::push_event`] & co.
//!
//! Frames follow the strictest common denominator of the official clients:
//! upper-case `type`, every header value a string, always `messageId`,
//! `contentType: application/json` and `time`, EVENT `topic` `*`, `data` a
//! string. EVENTs are tracked until acked with code 200 and no `LATER`
//! status: pushed while no connection is live they wait for one; still
//! unacked when their connection ends (or after the ack timeout) they are
//! redelivered — same `messageId`, same `eventId` — on the newest live
//! connection. A connection that received `disconnect` gets no more pushes
//! and is closed by the server after a delay (10 s by default).
//!
//! The server runs on its own thread and tokio runtime, so tests (which are
//! synchronous) drive it with plain method calls, observe it under a lock
//! ([`FakeDingTalk::with_state`]) and block on conditions with bounded
//! waits ([`FakeDingTalk::wait`]). Faults: failing opens (status/body, a
//! reset connection, empty `endpoint`/`ticket`), a slow open, rejected
//! handshakes, `disconnect`, a dropped TCP connection, a connection that
//! stops answering (and reading), server WebSocket pings.

use std::{
    collections::{HashMap, VecDeque},
    hash::{BuildHasher, RandomState},
    net::SocketAddr,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot},
};
pub mod personal;

use tokio_tungstenite::tungstenite::{
    handshake::server::{ErrorResponse, Request, Response},
    http, Message,
};

/// The open call's path.
pub const OPEN_PATH: &str = "/v1.0/gateway/connections/open";

/// Settings fixed at start.
#[derive(Debug, Clone)]
pub struct Options {
    pub client_id: String,
    pub client_secret: String,
    /// A ticket older than this is refused at the handshake.
    pub ticket_ttl: Duration,
    /// After `disconnect`, the server closes the socket after this delay.
    pub disconnect_close_after: Duration,
    /// An EVENT not acked within this time is sent again; `None` = only on
    /// a new connection.
    pub ack_timeout: Option<Duration>,
    /// Send a SYSTEM `ping` on every live connection this often.
    pub system_ping_every: Option<Duration>,
    /// Print one line per open, handshake, push and ack on stderr.
    pub verbose: bool,
    /// Port to listen on (0 = any free port).
    pub port: u16,
    /// The personal stream's valid user access token.
    pub user_token: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            client_id: "fake-client-id".into(),
            client_secret: "fake-client-secret".into(),
            ticket_ttl: Duration::from_secs(90),
            disconnect_close_after: Duration::from_secs(10),
            ack_timeout: Some(Duration::from_secs(60)),
            system_ping_every: None,
            verbose: false,
            port: 0,
            user_token: "fake-user-token".into(),
        }
    }
}

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
    pub acked: bool,
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

enum ConnCmd {
    Send(String),
    Ping(Vec<u8>),
    Disconnect(String),
    Drop,
    Freeze,
}

struct Ticket {
    issued: Instant,
    used: bool,
}

/// Everything the fake knows. Observation fields are public; read them
/// under [`FakeDingTalk::with_state`] or in a [`FakeDingTalk::wait`] predicate.
pub struct FakeState {
    pub opens: Vec<OpenRecord>,
    /// Open requests being answered right now, and the most ever at once.
    pub opens_in_flight: u32,
    pub max_opens_in_flight: u32,
    pub handshakes: Vec<HandshakeRecord>,
    pub conns: Vec<ConnRecord>,
    pub acks: Vec<Ack>,
    /// EVENTs by push order.
    pub outbox: Vec<Outgoing>,
    options: Options,
    open_faults: VecDeque<OpenFault>,
    open_delay: Duration,
    reject_handshakes: u32,
    endpoint_path: String,
    tickets: HashMap<String, Ticket>,
    senders: HashMap<u64, mpsc::UnboundedSender<ConnCmd>>,
    next_conn: u64,
    next_message: u64,
    local: SocketAddr,
    /// The personal stream: requests, subscriptions, faults.
    pub personal: personal::PersonalState,
}

impl FakeState {
    /// The connection new pushes go to: the newest live one that is neither
    /// draining nor frozen.
    pub fn target(&self) -> Option<u64> {
        self.conns
            .iter()
            .rev()
            .find(|c| c.closed_at.is_none() && !c.draining && !c.frozen)
            .map(|c| c.id)
    }

    pub fn live_conns(&self) -> usize {
        self.conns.iter().filter(|c| c.closed_at.is_none()).count()
    }

    pub fn conn(&self, id: u64) -> Option<&ConnRecord> {
        self.conns.iter().find(|c| c.id == id)
    }

    pub fn acks_for(&self, message_id: &str) -> Vec<&Ack> {
        self.acks
            .iter()
            .filter(|a| a.message_id == message_id)
            .collect()
    }

    /// The EVENT with this `eventId` has been acked (200, not LATER).
    pub fn event_acked(&self, event_id: &str) -> bool {
        self.outbox
            .iter()
            .any(|o| o.event_id == event_id && o.acked)
    }

    /// Pushed EVENTs not acked yet.
    pub fn unacked(&self) -> usize {
        self.outbox.iter().filter(|o| !o.acked).count()
    }

    fn conn_mut(&mut self, id: u64) -> Option<&mut ConnRecord> {
        self.conns.iter_mut().find(|c| c.id == id)
    }

    fn message_id(&mut self) -> String {
        self.next_message += 1;
        format!("msg-{:04}-{}", self.next_message, &new_uuid()[..8])
    }

    fn send_to(&self, conn: u64, cmd: ConnCmd) -> bool {
        self.senders
            .get(&conn)
            .is_some_and(|tx| tx.send(cmd).is_ok())
    }

    /// Queues an EVENT frame with `headers` and `data` for delivery until acked.
    fn enqueue_event(
        &mut self,
        message_id: &str,
        event_id: &str,
        headers: serde_json::Map<String, Value>,
        data: &str,
    ) {
        let frame =
            json!({"specVersion": "1.0", "type": "EVENT", "headers": headers, "data": data})
                .to_string();
        self.outbox.push(Outgoing {
            message_id: message_id.to_owned(),
            event_id: event_id.to_owned(),
            frame,
            conn: None,
            sent_at: None,
            sends: 0,
            acked: false,
        });
        self.flush_outbox();
    }

    /// Sends every unacked EVENT that is not in flight to the target.
    fn flush_outbox(&mut self) {
        let Some(target) = self.target() else { return };
        let now = Instant::now();
        let mut sends = vec![];
        for o in self
            .outbox
            .iter_mut()
            .filter(|o| !o.acked && o.conn.is_none())
        {
            o.conn = Some(target);
            o.sent_at = Some(now);
            o.sends += 1;
            sends.push(o.frame.clone());
        }
        for f in sends {
            self.send_to(target, ConnCmd::Send(f));
        }
    }

    fn log(&self, line: impl FnOnce() -> String) {
        if self.options.verbose {
            eprintln!("[fake-dingtalk] {}", line());
        }
    }
}

struct Shared {
    state: Mutex<FakeState>,
    changed: Condvar,
    /// Personal ticket requests wait while this is `true`.
    tickets_held: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Runs `f` on the state and wakes every waiter.
    fn update<T>(&self, f: impl FnOnce(&mut FakeState) -> T) -> T {
        let mut st = self.lock();
        let r = f(&mut st);
        drop(st);
        self.changed.notify_all();
        r
    }
}

/// A running fake gateway. Dropping it stops the server and closes every
/// connection.
pub struct FakeDingTalk {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeDingTalk {
    /// Starts a fake with the default [`Options`] on a free loopback port.
    pub fn start() -> FakeDingTalk {
        Self::start_with(Options::default())
    }

    pub fn start_with(options: Options) -> FakeDingTalk {
        let std_listener = std::net::TcpListener::bind(("127.0.0.1", options.port))
            .expect("fake-dingtalk: bind 127.0.0.1");
        std_listener
            .set_nonblocking(true)
            .expect("fake-dingtalk: set_nonblocking");
        let addr = std_listener
            .local_addr()
            .expect("fake-dingtalk: local_addr");
        let ping_every = options.system_ping_every;
        let ack_timeout = options.ack_timeout;
        let shared = Arc::new(Shared {
            state: Mutex::new(FakeState {
                opens: vec![],
                opens_in_flight: 0,
                max_opens_in_flight: 0,
                handshakes: vec![],
                conns: vec![],
                acks: vec![],
                outbox: vec![],
                options,
                open_faults: VecDeque::new(),
                open_delay: Duration::ZERO,
                reject_handshakes: 0,
                endpoint_path: "/connect".into(),
                tickets: HashMap::new(),
                senders: HashMap::new(),
                next_conn: 0,
                next_message: 0,
                local: addr,
                personal: personal::PersonalState::default(),
            }),
            changed: Condvar::new(),
            tickets_held: tokio::sync::watch::channel(false).0,
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let sh = shared.clone();
        let thread = thread::Builder::new()
            .name("fake-dingtalk".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fake-dingtalk: tokio runtime");
                rt.block_on(async move {
                    let listener =
                        TcpListener::from_std(std_listener).expect("fake-dingtalk: listener");
                    tokio::spawn(housekeeping(sh.clone(), ack_timeout, ping_every));
                    tokio::select! {
                        _ = accept_loop(listener, sh) => {}
                        _ = stop_rx => {}
                    }
                });
                // Dropping the runtime cancels every connection task, which
                // closes their sockets.
                drop(rt);
            })
            .expect("fake-dingtalk: spawn thread");
        FakeDingTalk {
            shared,
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:<port>`: the `open_api` base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn client_id(&self) -> String {
        self.shared.lock().options.client_id.clone()
    }

    pub fn client_secret(&self) -> String {
        self.shared.lock().options.client_secret.clone()
    }

    // ------------------------------------------------------------ faults

    /// The next `n` open requests are answered `status` with `body`.
    pub fn fail_next_opens(&self, n: usize, status: u16, body: &str) {
        self.queue_open_faults(n, OpenFault::Status(status, body.to_owned()));
    }

    /// The next `n` open requests get their connection closed unanswered.
    pub fn reset_next_opens(&self, n: usize) {
        self.queue_open_faults(n, OpenFault::Reset);
    }

    /// The next `n` open requests get 200 with an empty endpoint and/or ticket.
    pub fn empty_next_opens(&self, n: usize, endpoint: bool, ticket: bool) {
        self.queue_open_faults(n, OpenFault::Empty { endpoint, ticket });
    }

    pub fn queue_open_faults(&self, n: usize, fault: OpenFault) {
        self.shared
            .update(|s| s.open_faults.extend((0..n).map(|_| fault.clone())));
    }

    /// Open requests wait this long before they are answered.
    pub fn set_open_delay(&self, d: Duration) {
        self.shared.update(|s| s.open_delay = d);
    }

    /// The endpoint handed out is `ws://127.0.0.1:<port><path_and_query>`
    /// (default `/connect`); the handshake must use that path.
    pub fn set_endpoint_path(&self, path_and_query: &str) {
        self.shared
            .update(|s| s.endpoint_path = path_and_query.to_owned());
    }

    /// The next `n` handshakes with otherwise valid tickets are refused
    /// (HTTP 401); their tickets are spent.
    pub fn reject_handshakes(&self, n: u32) {
        self.shared.update(|s| s.reject_handshakes += n);
    }

    // ------------------------------------------------------------ pushes

    /// Pushes an EVENT (topic `*`); returns its `messageId`. It goes to the
    /// newest live connection, or waits for one; it is redelivered until
    /// acked.
    pub fn push_event(&self, ev: &Event) -> String {
        push_event(&self.shared, ev)
    }

    /// Sends `text` as one text frame on the target connection (not
    /// tracked for redelivery). `false` if there is no target.
    pub fn push_raw(&self, text: &str) -> bool {
        let st = self.shared.lock();
        match st.target() {
            Some(c) => st.send_to(c, ConnCmd::Send(text.to_owned())),
            None => false,
        }
    }

    /// Sends `text` on connection `conn`, whatever its state (draining
    /// included). `false` if it is gone.
    pub fn push_raw_to(&self, conn: u64, text: &str) -> bool {
        self.shared
            .lock()
            .send_to(conn, ConnCmd::Send(text.to_owned()))
    }

    /// Sends a frame built by the test (see [`FakeDingTalk::frame`]).
    pub fn push_frame(&self, frame: &Value) -> bool {
        self.push_raw(&frame.to_string())
    }

    /// A well-formed push: `type`, `topic`, a fresh `messageId`, content
    /// type and time, `data`; returns it with its `messageId`.
    pub fn frame(&self, kind: &str, topic: &str, data: &str) -> (Value, String) {
        let mid = self.shared.update(|s| s.message_id());
        let f = json!({
            "specVersion": "1.0",
            "type": kind,
            "headers": {"topic": topic, "messageId": mid, "contentType": "application/json", "time": now_ms().to_string()},
            "data": data,
        });
        (f, mid)
    }

    /// Sends a SYSTEM `ping` with `{"opaque": opaque}`; returns the
    /// `messageId`, or `None` without a target connection.
    pub fn send_system_ping(&self, opaque: &str) -> Option<String> {
        let (f, mid) = self.frame("SYSTEM", "ping", &json!({"opaque": opaque}).to_string());
        self.push_frame(&f).then_some(mid)
    }

    /// Sends SYSTEM `disconnect` on the target connection, which then gets
    /// no more pushes and is closed after `disconnect_close_after`. Returns
    /// the connection id.
    pub fn send_disconnect(&self, reason: &str) -> Option<u64> {
        self.shared.update(|s| {
            let c = s.target()?;
            s.send_to(c, ConnCmd::Disconnect(reason.to_owned()))
                .then_some(c)
        })
    }

    /// Drops the target connection's TCP stream without a close frame.
    pub fn drop_tcp(&self) -> Option<u64> {
        self.shared.update(|s| {
            let c = s.target()?;
            s.send_to(c, ConnCmd::Drop).then_some(c)
        })
    }

    /// The target connection stops reading (so it answers no WebSocket ping
    /// and reads no ack) and sends nothing more, while its TCP connection
    /// stays open: a dead peer.
    pub fn stop_answering_pings(&self) -> Option<u64> {
        self.shared.update(|s| {
            let c = s.target()?;
            if let Some(r) = s.conn_mut(c) {
                r.frozen = true;
            }
            s.send_to(c, ConnCmd::Freeze).then_some(c)
        })
    }

    /// Sends a WebSocket ping with `payload` on the target connection.
    pub fn ws_ping(&self, payload: &[u8]) -> Option<u64> {
        let st = self.shared.lock();
        let c = st.target()?;
        st.send_to(c, ConnCmd::Ping(payload.to_vec())).then_some(c)
    }

    // ------------------------------------------------------------ observation

    /// Runs `f` on the current state.
    pub fn with_state<T>(&self, f: impl FnOnce(&FakeState) -> T) -> T {
        f(&self.shared.lock())
    }

    /// Blocks until `f` returns `Some`, re-checking on every state change.
    /// Panics after `timeout`, naming `what` and summarizing the state.
    pub fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&FakeState) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            if let Some(v) = f(&st) {
                return v;
            }
            let now = Instant::now();
            if now >= deadline {
                let summary = summarize(&st);
                drop(st);
                panic!("fake-dingtalk: timed out after {timeout:?} waiting for: {what}\n{summary}");
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, (deadline - now).min(Duration::from_millis(200)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Like [`FakeDingTalk::wait`] for a plain condition.
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut(&FakeState) -> bool,
    ) {
        self.wait(what, timeout, |s| cond(s).then_some(()));
    }

    pub fn open_count(&self) -> usize {
        self.with_state(|s| s.opens.len())
    }

    pub fn opens(&self) -> Vec<OpenRecord> {
        self.with_state(|s| s.opens.clone())
    }

    pub fn handshakes(&self) -> Vec<HandshakeRecord> {
        self.with_state(|s| s.handshakes.clone())
    }

    pub fn connections(&self) -> Vec<ConnRecord> {
        self.with_state(|s| s.conns.clone())
    }

    pub fn acks(&self) -> Vec<Ack> {
        self.with_state(|s| s.acks.clone())
    }

    /// Every ticket issued so far, in order.
    pub fn tickets(&self) -> Vec<String> {
        self.with_state(|s| s.opens.iter().filter_map(|o| o.ticket.clone()).collect())
    }

    /// Waits for the first ack of `message_id` and returns it.
    pub fn wait_ack(&self, message_id: &str, timeout: Duration) -> Ack {
        self.wait(&format!("an ack for {message_id}"), timeout, |s| {
            s.acks_for(message_id).first().map(|a| (*a).clone())
        })
    }

    /// Waits until a connection is live and takes pushes; returns its id.
    pub fn wait_connected(&self, timeout: Duration) -> u64 {
        self.wait("a live connection", timeout, |s| s.target())
    }

    /// A short description of the state, for failure messages.
    pub fn summary(&self) -> String {
        summarize(&self.shared.lock())
    }
}

impl Drop for FakeDingTalk {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn summarize(s: &FakeState) -> String {
    let mut out = format!(
        "fake-dingtalk state: {} open(s) (statuses {:?}), {} handshake(s) (accepted {:?}), {} ack(s), {} unacked event(s)\n",
        s.opens.len(),
        s.opens.iter().map(|o| o.status).collect::<Vec<_>>(),
        s.handshakes.len(),
        s.handshakes.iter().map(|h| h.accepted).collect::<Vec<_>>(),
        s.acks.len(),
        s.unacked()
    );
    for c in &s.conns {
        out.push_str(&format!(
            "  conn {}: live={} draining={} frozen={} pings={} pongs={} end={:?}\n",
            c.id,
            c.closed_at.is_none(),
            c.draining,
            c.frozen,
            c.client_pings,
            c.pongs.len(),
            c.end
        ));
    }
    out
}

// ------------------------------------------------------------------ server

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve(stream, shared.clone()));
    }
}

/// WebSocket upgrade (`GET`) or plain HTTP (anything else), decided by
/// peeking at the first bytes.
async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    // Enough for `GET /dws/` (a control-plane GET, not a WebSocket).
    let mut head = [0u8; 9];
    let peeked = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.peek(&mut head).await {
                Ok(n) if n >= head.len() => return true,
                Ok(0) | Err(_) => return false,
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await;
    if peeked != Ok(true) {
        return;
    }
    if head.starts_with(b"GET ") && !head[4..].starts_with(personal::CONTROL_BASE_PATH.as_bytes()) {
        serve_ws(stream, shared).await;
    } else {
        serve_http(stream, shared).await;
    }
}

async fn housekeeping(
    shared: Arc<Shared>,
    ack_timeout: Option<Duration>,
    ping_every: Option<Duration>,
) {
    let mut last_ping = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        shared.update(|s| {
            let now = Instant::now();
            if let Some(t) = ack_timeout {
                let mut requeued = false;
                for o in s.outbox.iter_mut().filter(|o| !o.acked) {
                    if o.sent_at.is_some_and(|at| now.duration_since(at) >= t) {
                        o.conn = None;
                        o.sent_at = None;
                        requeued = true;
                    }
                }
                if requeued {
                    s.flush_outbox();
                }
            }
            if let Some(every) = ping_every {
                if now.duration_since(last_ping) >= every {
                    last_ping = now;
                    let live: Vec<u64> = s
                        .conns
                        .iter()
                        .filter(|c| c.closed_at.is_none() && !c.frozen && !c.draining)
                        .map(|c| c.id)
                        .collect();
                    for c in live {
                        let mid = s.message_id();
                        let f = json!({
                            "specVersion": "1.0", "type": "SYSTEM",
                            "headers": {"topic": "ping", "messageId": mid, "contentType": "application/json", "time": now_ms().to_string()},
                            "data": json!({"opaque": new_uuid()}).to_string(),
                        });
                        s.send_to(c, ConnCmd::Send(f.to_string()));
                    }
                }
            }
        });
    }
}

// ------------------------------------------------------------------ HTTP

struct HttpRequest {
    method: String,
    /// Path and query, as in the request line.
    path: String,
    /// Header names lower-cased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_http_request(stream: &mut TcpStream) -> Option<HttpRequest> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let len = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| {
                        std::str::from_utf8(h.value)
                            .ok()?
                            .trim()
                            .parse::<usize>()
                            .ok()
                    })
                    .unwrap_or(0);
                if len > 1024 * 1024 {
                    return None;
                }
                let method = req.method.unwrap_or("").to_owned();
                let path = req.path.unwrap_or("").to_owned();
                let headers: Vec<(String, String)> = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).trim().to_owned(),
                        )
                    })
                    .collect();
                while buf.len() < n + len {
                    let r = stream.read(&mut chunk).await.ok()?;
                    if r == 0 {
                        return None;
                    }
                    buf.extend_from_slice(&chunk[..r]);
                }
                return Some(HttpRequest {
                    method,
                    path,
                    headers,
                    body: buf[n..n + len].to_vec(),
                });
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return None,
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let r = stream.read(&mut chunk).await.ok()?;
        if r == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..r]);
    }
}

async fn respond(stream: &mut TcpStream, status: u16, body: &str) {
    respond_with(stream, status, body, &[]).await
}

async fn respond_with(
    stream: &mut TcpStream,
    status: u16,
    body: &str,
    extra_headers: &[(String, String)],
) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let extra: String = extra_headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let text = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(text.as_bytes()).await;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
}

async fn serve_http(mut stream: TcpStream, shared: Arc<Shared>) {
    let Some(req) = tokio::time::timeout(Duration::from_secs(10), read_http_request(&mut stream))
        .await
        .ok()
        .flatten()
    else {
        return;
    };
    let path = req.path.split('?').next().unwrap_or("").to_owned();
    match (req.method.as_str(), path.as_str()) {
        ("POST", OPEN_PATH) => handle_open(stream, shared, req.body).await,
        ("POST", personal::TICKET_PATH) => personal::handle_ticket(stream, shared, req).await,
        (_, p) if p.starts_with(personal::CONTROL_BASE_PATH) => {
            personal::handle_control(stream, shared, req).await
        }
        ("POST", p) if p.starts_with("/_fake/") => {
            let (status, body) = control(&shared, p, &req.body);
            respond(&mut stream, status, &body).await;
        }
        _ => {
            respond(
                &mut stream,
                404,
                r#"{"code":"notFound","message":"not found"}"#,
            )
            .await
        }
    }
}

fn error_body(code: &str, message: &str) -> String {
    json!({"requestid": new_uuid(), "code": code, "message": message}).to_string()
}

async fn handle_open(mut stream: TcpStream, shared: Arc<Shared>, body: Vec<u8>) {
    let delay = shared.update(|s| {
        s.opens_in_flight += 1;
        s.max_opens_in_flight = s.max_opens_in_flight.max(s.opens_in_flight);
        s.open_delay
    });
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (status, answer) = shared.update(|s| {
        s.opens_in_flight -= 1;
        let fault = s.open_faults.pop_front();
        let mut ticket = None;
        let (status, answer) = match fault {
            Some(OpenFault::Status(st, b)) => (st, Some(b)),
            Some(OpenFault::Reset) => (0, None),
            other => match validate_open(&s.options, &parsed) {
                Err((st, b)) => (st, Some(b)),
                Ok(()) => {
                    let t = new_uuid();
                    let endpoint = format!("ws://{}{}", s.local, s.endpoint_path);
                    s.tickets.insert(
                        t.clone(),
                        Ticket {
                            issued: Instant::now(),
                            used: false,
                        },
                    );
                    let (no_endpoint, no_ticket) = match other {
                        Some(OpenFault::Empty { endpoint, ticket }) => (endpoint, ticket),
                        _ => (false, false),
                    };
                    if !no_ticket {
                        ticket = Some(t.clone());
                    }
                    let body = json!({
                        "endpoint": if no_endpoint { String::new() } else { endpoint },
                        "ticket": if no_ticket { String::new() } else { t },
                    });
                    (200, Some(body.to_string()))
                }
            },
        };
        s.log(|| format!("open #{} -> {status}", s.opens.len() + 1));
        s.opens.push(OpenRecord {
            at: Instant::now(),
            body: parsed.clone(),
            status,
            ticket,
        });
        (status, answer)
    });
    match answer {
        Some(b) => respond(&mut stream, status, &b).await,
        None => {
            // A reset: close without a byte of response (linger 0 → RST).
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
            drop(stream);
        }
    }
}

/// Checks an open request body like the real gateway would.
fn validate_open(opts: &Options, body: &Value) -> Result<(), (u16, String)> {
    let bad = || (400, error_body("systemError", "system error"));
    let obj = body.as_object().ok_or_else(bad)?;
    let id = obj
        .get("clientId")
        .and_then(Value::as_str)
        .ok_or_else(bad)?;
    let secret = obj
        .get("clientSecret")
        .and_then(Value::as_str)
        .ok_or_else(bad)?;
    let subs = obj
        .get("subscriptions")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    for sub in subs {
        let ok = sub.get("type").and_then(Value::as_str).is_some()
            && sub.get("topic").and_then(Value::as_str).is_some();
        if !ok {
            return Err(bad());
        }
    }
    if id != opts.client_id || secret != opts.client_secret {
        return Err((401, error_body("authFailed", "auth failed")));
    }
    Ok(())
}

/// `/_fake/*` control endpoints (for scripts).
fn control(shared: &Shared, path: &str, body: &[u8]) -> (u16, String) {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    match path {
        "/_fake/push" => {
            let event_type = s("eventType").unwrap_or_else(|| "demo_event".into());
            let event_id = s("eventId").unwrap_or_else(|| new_uuid().replace('-', ""));
            let data = match v.get("data") {
                Some(Value::String(d)) => d.clone(),
                Some(other) => other.to_string(),
                None => "{}".into(),
            };
            let mid = push_event(shared, &Event::new(event_id.clone(), event_type, data));
            (
                200,
                json!({"messageId": mid, "eventId": event_id}).to_string(),
            )
        }
        "/_fake/disconnect" => {
            let reason = s("reason").unwrap_or_else(|| "connection is expired".into());
            let st = shared.lock();
            let c = st
                .target()
                .filter(|c| st.send_to(*c, ConnCmd::Disconnect(reason)));
            (200, json!({"conn": c}).to_string())
        }
        "/_fake/drop" => {
            let st = shared.lock();
            let c = st.target().filter(|c| st.send_to(*c, ConnCmd::Drop));
            (200, json!({"conn": c}).to_string())
        }
        "/_fake/state" => {
            let summary = summarize(&shared.lock());
            (200, json!({"summary": summary}).to_string())
        }
        _ => (404, error_body("notFound", "unknown control endpoint")),
    }
}

fn push_event(shared: &Shared, ev: &Event) -> String {
    shared.update(|s| {
        let mid = s.message_id();
        let now = now_ms().to_string();
        let mut headers = serde_json::Map::new();
        for (k, v) in [
            ("topic", "*"),
            ("messageId", &mid),
            ("contentType", "application/json"),
            ("time", &now),
            ("eventId", &ev.event_id),
            ("eventType", &ev.event_type),
            ("eventBornTime", &now),
            ("eventCorpId", "dingfakecorp"),
            ("eventUnifiedAppId", "fake-unified-app"),
            ("appId", "fake-app"),
        ] {
            headers.insert(k.into(), Value::String(v.to_owned()));
        }
        for (k, v) in &ev.extra_headers {
            headers.insert(k.clone(), Value::String(v.clone()));
        }
        s.log(|| {
            format!(
                "push EVENT {mid} eventId={} type={}",
                ev.event_id, ev.event_type
            )
        });
        s.enqueue_event(&mid, &ev.event_id, headers, &ev.data);
        mid
    })
}

// ------------------------------------------------------------------ WebSocket

async fn serve_ws(stream: TcpStream, shared: Arc<Shared>) {
    let verdict: Arc<Mutex<Option<(u64, String)>>> = Arc::new(Mutex::new(None));
    let v2 = verdict.clone();
    let sh = shared.clone();
    // The signature is tungstenite's `Callback`; its error type is its own.
    #[allow(clippy::result_large_err)]
    let callback = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let ticket = parse_query(&query)
            .into_iter()
            .find(|(k, _)| k == "ticket")
            .map(|(_, v)| v)
            .unwrap_or_default();
        let result = sh.update(|s| {
            let want_path = s.endpoint_path.split('?').next().unwrap_or("").to_owned();
            let ttl = s.options.ticket_ttl;
            let refusal = if path != want_path {
                format!("unknown path {path}")
            } else {
                match s.tickets.get_mut(&ticket) {
                    None => "unknown ticket".to_owned(),
                    Some(t) if t.used => "ticket already used".to_owned(),
                    Some(t) if t.issued.elapsed() > ttl => {
                        t.used = true;
                        "ticket expired".to_owned()
                    }
                    Some(t) => {
                        t.used = true;
                        if s.reject_handshakes > 0 {
                            s.reject_handshakes -= 1;
                            "rejected by test".to_owned()
                        } else {
                            String::new()
                        }
                    }
                }
            };
            let conn = refusal.is_empty().then(|| {
                s.next_conn += 1;
                s.next_conn
            });
            s.log(|| format!("handshake conn={conn:?} refusal={refusal:?}"));
            s.handshakes.push(HandshakeRecord {
                at: Instant::now(),
                path: path.clone(),
                query: query.clone(),
                ticket: ticket.clone(),
                accepted: conn.is_some(),
                refusal: refusal.clone(),
                conn,
            });
            conn.ok_or(refusal)
        });
        match result {
            Ok(conn) => {
                *v2.lock().unwrap_or_else(|e| e.into_inner()) = Some((conn, ticket));
                Ok(resp)
            }
            Err(refusal) => {
                let mut r = ErrorResponse::new(Some(
                    json!({"code": "ticketInvalid", "message": refusal}).to_string(),
                ));
                *r.status_mut() = http::StatusCode::UNAUTHORIZED;
                Err(r)
            }
        }
    };
    let Ok(Ok(ws)) = tokio::time::timeout(
        Duration::from_secs(20),
        tokio_tungstenite::accept_hdr_async(stream, callback),
    )
    .await
    else {
        return;
    };
    let Some((id, ticket)) = verdict.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    shared.update(|s| {
        s.conns.push(ConnRecord {
            id,
            ticket,
            opened_at: Instant::now(),
            closed_at: None,
            end: String::new(),
            draining: false,
            disconnect_sent_at: None,
            frozen: false,
            client_pings: 0,
            pongs: vec![],
            bad_frames: 0,
        });
        s.senders.insert(id, tx);
        s.flush_outbox();
    });
    let end = run_conn(ws, rx, id, &shared).await;
    shared.update(|s| {
        s.senders.remove(&id);
        if let Some(c) = s.conn_mut(id) {
            c.closed_at = Some(Instant::now());
            c.end = end.clone();
        }
        s.log(|| format!("conn {id} ended: {end}"));
        for o in s
            .outbox
            .iter_mut()
            .filter(|o| !o.acked && o.conn == Some(id))
        {
            o.conn = None;
            o.sent_at = None;
        }
        s.flush_outbox();
    });
}

async fn run_conn(
    mut ws: tokio_tungstenite::WebSocketStream<TcpStream>,
    mut rx: mpsc::UnboundedReceiver<ConnCmd>,
    id: u64,
    shared: &Arc<Shared>,
) -> String {
    let close_after = shared.lock().options.disconnect_close_after;
    let mut frozen = false;
    let mut close_at: Option<tokio::time::Instant> = None;
    loop {
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400);
        tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { return "server stopped".into() };
                if frozen && !matches!(cmd, ConnCmd::Drop) {
                    continue;
                }
                let r = match cmd {
                    ConnCmd::Send(text) => ws.send(Message::text(text)).await,
                    ConnCmd::Ping(p) => ws.send(Message::Ping(p.into())).await,
                    ConnCmd::Disconnect(reason) => {
                        let mid = shared.update(|s| {
                            if let Some(c) = s.conn_mut(id) {
                                c.draining = true;
                                c.disconnect_sent_at = Some(Instant::now());
                            }
                            s.message_id()
                        });
                        close_at = Some(tokio::time::Instant::now() + close_after);
                        let f = json!({
                            "specVersion": "1.0", "type": "SYSTEM",
                            "headers": {"topic": "disconnect", "messageId": mid, "contentType": "application/json", "time": now_ms().to_string()},
                            "data": json!({"reason": reason}).to_string(),
                        });
                        let r = ws.send(Message::text(f.to_string())).await;
                        // Pushes that were waiting go to another connection.
                        shared.update(|s| s.flush_outbox());
                        r
                    }
                    ConnCmd::Drop => {
                        // Linger 0: the close sends RST, no close frame, no FIN.
                        #[allow(deprecated)]
                        let _ = ws.get_ref().set_linger(Some(Duration::ZERO));
                        return "dropped by test".into();
                    }
                    ConnCmd::Freeze => {
                        frozen = true;
                        Ok(())
                    }
                };
                if let Err(e) = r {
                    return format!("write failed: {e}");
                }
            }
            msg = ws.next(), if !frozen => {
                match msg {
                    None => return "client closed (EOF)".into(),
                    Some(Err(e)) => return format!("read failed: {e}"),
                    Some(Ok(Message::Text(t))) => record_ack(shared, id, t.as_str()),
                    Some(Ok(Message::Ping(_))) => {
                        shared.update(|s| if let Some(c) = s.conn_mut(id) { c.client_pings += 1 });
                        // tungstenite queued the pong: push it out.
                        if ws.flush().await.is_err() {
                            return "write failed".into();
                        }
                    }
                    Some(Ok(Message::Pong(p))) => {
                        shared.update(|s| if let Some(c) = s.conn_mut(id) { c.pongs.push(p.to_vec()) });
                    }
                    Some(Ok(Message::Close(_))) => {
                        let _ = ws.flush().await;
                        return "client sent close".into();
                    }
                    Some(Ok(_)) => {
                        shared.update(|s| if let Some(c) = s.conn_mut(id) { c.bad_frames += 1 });
                    }
                }
            }
            _ = tokio::time::sleep_until(close_at.unwrap_or(far)), if close_at.is_some() => {
                // The server closes the drained socket (TCP, no close frame).
                return "closed by server after disconnect".into();
            }
        }
    }
}

fn record_ack(shared: &Arc<Shared>, conn: u64, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let data = s(&v["data"]);
    let status = serde_json::from_str::<Value>(&data)
        .ok()
        .and_then(|d| d.get("status").and_then(Value::as_str).map(str::to_owned));
    let ack = Ack {
        at: Instant::now(),
        conn,
        message_id: s(&v["headers"]["messageId"]),
        code: v["code"].as_i64().unwrap_or(-1),
        message: s(&v["message"]),
        content_type: s(&v["headers"]["contentType"]),
        data,
        status,
        raw: text.to_owned(),
    };
    shared.update(|st| {
        if ack.message_id.is_empty() {
            if let Some(c) = st.conn_mut(conn) {
                c.bad_frames += 1;
            }
        }
        st.log(|| {
            format!(
                "ack {} code={} status={:?} (conn {conn})",
                ack.message_id, ack.code, ack.status
            )
        });
        // 200 without LATER is delivered; anything else (LATER, 5xx, 404)
        // stays unacked and is redelivered by the ack-timeout sweep.
        if ack.code == 200 && ack.status.as_deref() != Some("LATER") {
            if let Some(o) = st
                .outbox
                .iter_mut()
                .find(|o| o.message_id == ack.message_id)
            {
                o.acked = true;
            }
        }
        st.acks.push(ack);
    });
}

// ------------------------------------------------------------------ helpers

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A random version-4-style UUID (`[0-9a-f-]`), good enough for tickets.
pub fn new_uuid() -> String {
    let a = RandomState::new().hash_one((now_ms(), Instant::now(), 1u8));
    let b = RandomState::new().hash_one((now_ms(), Instant::now(), 2u8));
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// Decodes `a=1&b=%20x` (also `+` as space).
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
                {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_uuid() {
        assert_eq!(
            parse_query("a=1&ticket=x%2By+z&e"),
            vec![
                ("a".into(), "1".into()),
                ("ticket".into(), "x+y z".into()),
                ("e".into(), "".into())
            ]
        );
        assert_eq!(percent_decode("100%"), "100%");
        let u = new_uuid();
        assert_eq!(u.len(), 36, "{u}");
        assert!(u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'), "{u}");
        assert_ne!(new_uuid(), new_uuid());
    }

    /// A blocking HTTP/1.1 POST (std only), for the server-side checks.
    fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, Value) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let status = text[9..12].parse().unwrap();
        let json = text.split("\r\n\r\n").nth(1).unwrap_or("");
        (status, serde_json::from_str(json).unwrap_or(Value::Null))
    }

    /// A WebSocket handshake; `Err(status)` when refused.
    fn dial(url: &str) -> Result<(), u16> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let hostport = url
                .trim_start_matches("ws://")
                .split('/')
                .next()
                .unwrap()
                .to_owned();
            let tcp = TcpStream::connect(hostport).await.unwrap();
            match tokio_tungstenite::client_async(url, tcp).await {
                Ok(_) => Ok(()),
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
                Err(e) => panic!("{e}"),
            }
        })
    }

    /// OPEN-1, OPEN-2, TKT-1, TKT-2: the fake behaves like the gateway.
    #[test]
    fn open_and_ticket_rules() {
        let fake = FakeDingTalk::start_with(Options {
            ticket_ttl: Duration::from_millis(300),
            ..Options::default()
        });
        let ok_body = json!({
            "clientId": fake.client_id(), "clientSecret": fake.client_secret(),
            "subscriptions": [{"type": "EVENT", "topic": "*"}, {"type": "SYSTEM", "topic": "ping"}],
            "ua": "", "extras": null, "unknown": 1,
        })
        .to_string();
        let (st, v) = post(fake.addr(), OPEN_PATH, &ok_body);
        assert_eq!(st, 200, "{v}");
        let endpoint = v["endpoint"].as_str().unwrap().to_owned();
        let ticket = v["ticket"].as_str().unwrap().to_owned();
        assert_eq!(endpoint, format!("ws://{}/connect", fake.addr()));
        assert_eq!(ticket.len(), 36);
        let url = format!("{endpoint}?ticket={ticket}");
        assert_eq!(dial(&url), Ok(()));
        assert_eq!(dial(&url), Err(401), "TKT-1: a ticket is single-use");
        assert_eq!(dial(&format!("{endpoint}?ticket=nope")), Err(401));

        let (_, v) = post(fake.addr(), OPEN_PATH, &ok_body);
        std::thread::sleep(Duration::from_millis(400));
        let late = format!("{endpoint}?ticket={}", v["ticket"].as_str().unwrap());
        assert_eq!(dial(&late), Err(401), "TKT-2: an expired ticket is refused");

        let wrong = ok_body.replace(&fake.client_secret(), "wrong");
        let (st, v) = post(fake.addr(), OPEN_PATH, &wrong);
        assert_eq!((st, v["code"].as_str()), (401, Some("authFailed")), "{v}");
        let (st, v) = post(fake.addr(), OPEN_PATH, r#"{"clientId":"x"}"#);
        assert_eq!((st, v["code"].as_str()), (400, Some("systemError")), "{v}");
        assert_eq!(fake.open_count(), 4);
        assert_eq!(fake.with_state(|s| s.conns.len()), 1);
    }
}
