//! The fake's WebSocket side: the accept loop (a `GET` that is not a
//! control-plane call is an upgrade), ticket checks at the handshake, one
//! task per connection (pushes, acks, pings, `disconnect`, drops, freezes),
//! and the housekeeping that redelivers unacked EVENTs and sends SYSTEM
//! pings.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_tungstenite::tungstenite::{
    handshake::server::{ErrorResponse, Request, Response},
    http, Message,
};

use super::{
    http::serve_http, new_uuid, now_ms, parse_query, personal, Ack, ConnCmd, ConnRecord,
    HandshakeRecord, Shared,
};

pub(super) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
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

pub(super) async fn housekeeping(
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
                for o in s.outbox.iter_mut().filter(|o| !o.settled()) {
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

async fn serve_ws(stream: TcpStream, shared: Arc<Shared>) {
    let verdict: Arc<Mutex<Option<(u64, String)>>> = Arc::new(Mutex::new(None));
    let v2 = verdict.clone();
    let sh = shared.clone();
    // The signature is tungstenite's `Callback`; its error type is its own.
    #[allow(clippy::result_large_err)]
    let callback = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let user_agent = req
            .headers()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let ticket = parse_query(&query)
            .into_iter()
            .find(|(k, _)| k == "ticket")
            .map(|(_, v)| v)
            .unwrap_or_default();
        let result = sh.update(|s| {
            let want_path = s.endpoint_path.split('?').next().unwrap_or("").to_owned();
            let ttl = s.options.ticket_ttl;
            let live = s.live_conns();
            let mut status = http::StatusCode::UNAUTHORIZED;
            let refusal = if path != want_path {
                format!("unknown path {path}")
            } else if s.max_live_conns.is_some_and(|max| live >= max) {
                // The gateway's per-user limit: the ticket is spent.
                if let Some(t) = s.tickets.get_mut(&ticket) {
                    t.used = true;
                }
                status = http::StatusCode::FORBIDDEN;
                format!("too many connections for this user ({live} live)")
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
                user_agent: user_agent.clone(),
                accepted: conn.is_some(),
                refusal: refusal.clone(),
                conn,
            });
            conn.ok_or((status, refusal))
        });
        match result {
            Ok(conn) => {
                *v2.lock().unwrap_or_else(|e| e.into_inner()) = Some((conn, ticket));
                Ok(resp)
            }
            Err((status, refusal)) => {
                let code = if status == http::StatusCode::FORBIDDEN {
                    "tooManyConnections"
                } else {
                    "ticketInvalid"
                };
                let mut r =
                    ErrorResponse::new(Some(json!({"code": code, "message": refusal}).to_string()));
                *r.status_mut() = status;
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
            .filter(|o| !o.settled() && o.conn == Some(id))
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
    // The shape every client sends (the SDKs' `DataFrameResponse`):
    // `headers.contentType` `application/json` and `data` a string.
    let shaped = ack.content_type == "application/json" && v["data"].is_string();
    shared.update(|st| {
        if ack.message_id.is_empty() || !shaped {
            if let Some(c) = st.conn_mut(conn) {
                c.bad_frames += 1;
            }
        }
        if !shaped {
            // Not an ack the gateway takes: recorded, never settles.
            st.acks.push(ack);
            return;
        }
        st.log(|| {
            format!(
                "ack {} code={} status={:?} (conn {conn})",
                ack.message_id, ack.code, ack.status
            )
        });
        // 200 without LATER is delivered; a 4xx is a diagnostic: logged,
        // never redelivered; LATER and 5xx stay unacked and are redelivered
        // by the ack-timeout sweep.
        if let Some(o) = st
            .outbox
            .iter_mut()
            .find(|o| o.message_id == ack.message_id && !o.settled())
        {
            if ack.code == 200 && ack.status.as_deref() != Some("LATER") {
                o.acked = true;
            } else if (400..500).contains(&ack.code) {
                o.diagnosed = Some(ack.code);
            }
        }
        st.acks.push(ack);
    });
}
