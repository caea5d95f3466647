//! The app stream's test controls: open faults, handshake refusals,
//! endpoint shape, and pushes (EVENTs, raw frames, SYSTEM pings,
//! `disconnect`, dropped or frozen connections, WebSocket pings).

use std::time::Duration;

use serde_json::{json, Value};

use super::{http::push_event, now_ms, ConnCmd, Event, FakeDingTalk, OpenFault};

impl FakeDingTalk {
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

    /// Hands out WebSocket endpoints under `base` (`wss://localhost:<port>`
    /// of a TLS front forwarding to this fake) instead of
    /// `ws://127.0.0.1:<port>`.
    pub fn set_ws_base(&self, base: &str) {
        self.shared.update(|s| s.ws_base = Some(base.to_owned()));
    }

    /// At most `n` live connections at once (the user's or the app's
    /// limit): a handshake over it is refused with HTTP 403 and its ticket
    /// spent. A connection that received `disconnect` counts until closed.
    pub fn limit_live_connections(&self, n: usize) {
        self.shared.update(|s| s.max_live_conns = Some(n));
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
}
