//! A loopback fake of the DingTalk Stream gateway (protocol note §7): the
//! *app* stream, for conformance tests of the bus's `dingtalk` source and
//! for the demo, and the *personal* stream (ticket endpoint and subscription
//! control plane, see [`personal`]) for the `personal` source.
//!
//! One listener on `127.0.0.1:<port>` serves:
//!
//! - `POST /v1.0/gateway/connections/open`: requires `Accept:
//!   application/json` (else 406), checks `clientId`,
//!   `clientSecret` and `subscriptions` (extra fields and `SYSTEM` entries
//!   accepted), answers `{endpoint, ticket}` with a UUID ticket and an
//!   endpoint `ws://127.0.0.1:<port>/connect` (path and query configurable);
//!   wrong credentials → 401 `authFailed`, a bad body → 400 `systemError`.
//! - `GET <endpoint path>?ticket=…` (WebSocket): the ticket must be known,
//!   unused and younger than its TTL (90 s), else the upgrade is refused
//!   with HTTP 401; over the per-user limit of live connections
//!   ([`FakeDingTalk::limit_live_connections`]) with HTTP 403.
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
//! string. An ack must have `headers.contentType: application/json` and a
//! string `data` (the SDKs' shape; anything else is a bad frame that
//! settles nothing). EVENTs are tracked until acked with code 200 and no
//! `LATER` status: pushed while no connection is live they wait for one; still
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

mod app;
mod http;
pub mod personal;
pub mod profile;
mod records;
#[cfg(test)]
mod tests;
mod ws;

use std::{
    collections::{HashMap, VecDeque},
    hash::{BuildHasher, RandomState},
    net::SocketAddr,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Value};
use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot},
};

pub use self::profile::{dingtalk_env, fast_backoff_with, personal_profile_at, FAST_BACKOFF};
pub use self::records::{Ack, ConnRecord, Event, HandshakeRecord, OpenFault, OpenRecord, Outgoing};

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
    /// The gateway's per-user limit of live connections (a draining one
    /// counts until it is closed): a handshake over it is refused with
    /// HTTP 403 `tooManyConnections`.
    max_live_conns: Option<usize>,
    /// The scheme and authority of the WebSocket endpoint handed out
    /// (default `ws://127.0.0.1:<port>`): a TLS front's `wss://…`.
    ws_base: Option<String>,
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

    /// Pushed EVENTs not acked yet (nor given up after a diagnostic ack).
    pub fn unacked(&self) -> usize {
        self.outbox.iter().filter(|o| !o.settled()).count()
    }

    /// The WebSocket endpoint handed out with a ticket.
    fn endpoint(&self) -> String {
        let base = self
            .ws_base
            .clone()
            .unwrap_or_else(|| format!("ws://{}", self.local));
        format!("{base}{}", self.endpoint_path)
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
        self.enqueue_frame(message_id, event_id, Some("EVENT"), headers, data);
    }

    /// Queues a frame of type `kind` (none when `None`) for delivery until
    /// acked.
    fn enqueue_frame(
        &mut self,
        message_id: &str,
        event_id: &str,
        kind: Option<&str>,
        headers: serde_json::Map<String, Value>,
        data: &str,
    ) {
        let mut frame = json!({"specVersion": "1.0", "headers": headers, "data": data});
        if let Some(k) = kind {
            frame["type"] = json!(k);
        }
        let frame = frame.to_string();
        self.outbox.push(Outgoing {
            message_id: message_id.to_owned(),
            event_id: event_id.to_owned(),
            frame,
            conn: None,
            sent_at: None,
            sends: 0,
            acked: false,
            diagnosed: None,
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
            .filter(|o| !o.settled() && o.conn.is_none())
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
    /// Refresh calls wait while this is `true`.
    refreshes_held: tokio::sync::watch::Sender<bool>,
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
                max_live_conns: None,
                ws_base: None,
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
            refreshes_held: tokio::sync::watch::channel(false).0,
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
                    tokio::spawn(ws::housekeeping(sh.clone(), ack_timeout, ping_every));
                    tokio::select! {
                        _ = ws::accept_loop(listener, sh) => {}
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
