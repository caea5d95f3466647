//! The fake's plain HTTP side: request parsing and answers, the app
//! stream's `connections/open`, the `/_fake/*` control endpoints for
//! scripts, and the routing of the personal endpoints ([`super::personal`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::{
    new_uuid, now_ms, personal, summarize, ConnCmd, Event, OpenFault, OpenRecord, Options, Shared,
    Ticket, OPEN_PATH,
};

pub(super) struct HttpRequest {
    pub(super) method: String,
    /// Path and query, as in the request line.
    pub(super) path: String,
    /// Header names lower-cased.
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
}

impl HttpRequest {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
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

pub(super) async fn respond(stream: &mut TcpStream, status: u16, body: &str) {
    respond_with(stream, status, body, &[]).await
}

pub(super) async fn respond_with(
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

pub(super) async fn serve_http(mut stream: TcpStream, shared: Arc<Shared>) {
    let Some(req) = tokio::time::timeout(Duration::from_secs(10), read_http_request(&mut stream))
        .await
        .ok()
        .flatten()
    else {
        return;
    };
    let path = req.path.split('?').next().unwrap_or("").to_owned();
    match (req.method.as_str(), path.as_str()) {
        ("POST", OPEN_PATH) => {
            // The SDKs and the bus send `Accept: application/json`.
            let accepts = req
                .header("accept")
                .is_some_and(|a| a.contains("application/json"));
            if accepts {
                handle_open(stream, shared, req.body).await
            } else {
                shared.update(|s| {
                    s.opens.push(OpenRecord {
                        at: Instant::now(),
                        body: serde_json::from_slice(&req.body).unwrap_or(Value::Null),
                        status: 406,
                        ticket: None,
                    })
                });
                let e = error_body("notAcceptable", "Accept: application/json is required");
                respond(&mut stream, 406, &e).await;
            }
        }
        ("POST", personal::TICKET_PATH) => personal::handle_ticket(stream, shared, req).await,
        ("POST", personal::REFRESH_PATH) => personal::handle_refresh(stream, shared, req).await,
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
                    let endpoint = s.endpoint();
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

pub(super) fn push_event(shared: &Shared, ev: &Event) -> String {
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
