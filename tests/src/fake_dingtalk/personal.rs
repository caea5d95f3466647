//! The personal stream of the fake (protocol note §6, §7): the ticket
//! endpoint, the subscription control plane and personal EVENT pushes.
//!
//! - `POST /stream/connections/ticket`: requires `x-user-access-token` equal
//!   to [`super::Options::user_token`] (else 401) and a body with `sourceId`
//!   and `mode` (else 400); answers `{"success":true,"result":{endpoint,
//!   ticket}}` (or under `data`, or bare: [`TicketShape`]) with a ticket for
//!   the same `/connect` WebSocket as the app stream.
//! - `POST /dws/subscription/user` (create), `GET /dws/event/sublist`
//!   (list, paged), `POST /dws/subscription/cancel`: require
//!   `Authorization: Bearer <token>` and `x-user-access-token` (else 401);
//!   create checks the body (`clientId`, `eventKey`, `filterRule` a JSON
//!   string holding an object, `deliveryPref: realtime`, `ext.ruleType`;
//!   else 400 `INVALID_PARAM`) and answers `{"success":true,"result":
//!   ["sub-…"]}`; cancel of an unknown or cancelled id answers
//!   `{"success":false,"errorCode":"PERSONAL_EVENT_NOT_FOUND"}`.
//! - Faults: the next ticket calls fail with a status and body; the next
//!   calls of one control operation get a given status, body and headers
//!   (`Retry-After`); ticket requests can be held until released.
//! - Pushes: [`PersonalEvent`] frames carry the data envelope
//!   (`eventId`, `eventKey`, `occurredAtMs`, `subId`, `ext.ruleType`,
//!   `payload`), wrapped in 0–2 JSON strings, with one of the header
//!   spellings of [`HeaderStyle`]; they are tracked and redelivered like app
//!   EVENTs.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{json, Map, Value};
use tokio::net::TcpStream;

use super::{
    new_uuid, now_ms, parse_query, respond_with, FakeDingTalk, FakeState, HttpRequest, Shared,
    Ticket,
};

pub const TICKET_PATH: &str = "/stream/connections/ticket";
/// Every control-plane path starts with this.
pub const CONTROL_BASE_PATH: &str = "/dws/";
pub const CREATE_PATH: &str = "/dws/subscription/user";
pub const LIST_PATH: &str = "/dws/event/sublist";
pub const CANCEL_PATH: &str = "/dws/subscription/cancel";

/// One request to a personal endpoint, as received and answered.
#[derive(Debug, Clone)]
pub struct HttpRecord {
    pub at: Instant,
    pub method: String,
    /// Without the query.
    pub path: String,
    /// Decoded query parameters.
    pub query: Vec<(String, String)>,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Value::Null` if none or not JSON).
    pub body: Value,
    pub status: u16,
    /// The ticket issued or the subscription created, if any.
    pub issued: Option<String>,
}

impl HttpRecord {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An upstream subscription the fake holds.
#[derive(Debug, Clone)]
pub struct FakeSubscription {
    pub sub_id: String,
    pub client_id: String,
    pub source_id: String,
    pub event_key: String,
    pub rule_type: String,
    /// As sent: a JSON string.
    pub filter_rule: String,
    pub delivery_pref: String,
    pub expires_at: String,
    pub ext: Value,
    pub active: bool,
}

/// How a personal push spells its identity headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// SDK headers (`eventId`, `eventType`, `eventBornTime`, …) plus `SUB_ID`.
    #[default]
    Sdk,
    /// `MESSAGE_ID`, `EVENT_TYPE`, `SUB_ID`, `SOURCE_ID`, `RULE_TYPE`.
    Upper,
    /// `eventId`, `eventType`, `subscribeId`, `ruleType`, `sourceId`.
    Camel,
    /// Only `topic`, `messageId`, `contentType`, `time`: the identity is in
    /// the data envelope.
    DataOnly,
}

/// The shape of a successful ticket answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TicketShape {
    /// `{"success":true,"result":{endpoint,ticket}}`
    #[default]
    Result,
    /// `{"success":true,"data":{endpoint,ticket}}`
    Data,
    /// `{endpoint,ticket}`
    Bare,
}

/// A control-plane operation, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlOp {
    Create,
    List,
    Cancel,
}

/// An injected control-plane answer.
#[derive(Debug, Clone)]
pub struct ControlFault {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl ControlFault {
    pub fn new(status: u16, body: impl Into<String>) -> ControlFault {
        ControlFault {
            status,
            body: body.into(),
            headers: vec![],
        }
    }

    pub fn header(mut self, k: impl Into<String>, v: impl Into<String>) -> ControlFault {
        self.headers.push((k.into(), v.into()));
        self
    }
}

/// A personal EVENT to push.
#[derive(Debug, Clone)]
pub struct PersonalEvent {
    pub event_id: String,
    pub event_key: String,
    pub sub_id: String,
    pub rule_type: String,
    pub source_id: String,
    /// The envelope's `payload`.
    pub payload: Value,
    /// Overrides the fake's current style / wrapping for this push.
    pub style: Option<HeaderStyle>,
    pub wrap: Option<u8>,
}

impl PersonalEvent {
    pub fn new(
        event_id: impl Into<String>,
        event_key: impl Into<String>,
        sub_id: impl Into<String>,
        payload: Value,
    ) -> PersonalEvent {
        PersonalEvent {
            event_id: event_id.into(),
            event_key: event_key.into(),
            sub_id: sub_id.into(),
            rule_type: String::new(),
            source_id: "open".into(),
            payload,
            style: None,
            wrap: None,
        }
    }

    pub fn style(mut self, s: HeaderStyle) -> PersonalEvent {
        self.style = Some(s);
        self
    }

    pub fn wrap(mut self, levels: u8) -> PersonalEvent {
        self.wrap = Some(levels);
        self
    }

    pub fn rule_type(mut self, r: impl Into<String>) -> PersonalEvent {
        self.rule_type = r.into();
        self
    }
}

/// The personal half of the fake's state.
#[derive(Debug, Default)]
pub struct PersonalState {
    /// Ticket requests held right now ([`FakeDingTalk::hold_tickets`]).
    pub tickets_waiting: u32,
    pub ticket_requests: Vec<HttpRecord>,
    pub creates: Vec<HttpRecord>,
    pub lists: Vec<HttpRecord>,
    pub cancels: Vec<HttpRecord>,
    pub subscriptions: Vec<FakeSubscription>,
    ticket_faults: VecDeque<(u16, String)>,
    control_faults: HashMap<ControlOp, VecDeque<ControlFault>>,
    ticket_shape: TicketShape,
    header_style: HeaderStyle,
    data_wrap: u8,
    /// The server's page size for lists (default: the requested one, ≤ 100).
    list_page_size: Option<usize>,
    next_sub: u64,
}

impl PersonalState {
    pub fn active(&self) -> Vec<&FakeSubscription> {
        self.subscriptions.iter().filter(|s| s.active).collect()
    }

    fn new_sub_id(&mut self) -> String {
        self.next_sub += 1;
        format!("sub-{:04}-{}", self.next_sub, &new_uuid()[..6])
    }
}

impl FakeDingTalk {
    /// The valid user access token.
    pub fn user_token(&self) -> String {
        self.shared.lock().options.user_token.clone()
    }

    /// From now on only `token` is accepted.
    pub fn set_user_token(&self, token: &str) {
        self.shared
            .update(|s| s.options.user_token = token.to_owned());
    }

    /// The next `n` ticket requests are answered `status` with `body`.
    pub fn fail_next_tickets(&self, n: usize, status: u16, body: &str) {
        self.shared.update(|s| {
            s.personal
                .ticket_faults
                .extend((0..n).map(|_| (status, body.to_owned())))
        });
    }

    pub fn set_ticket_shape(&self, shape: TicketShape) {
        self.shared.update(|s| s.personal.ticket_shape = shape);
    }

    /// While held, ticket requests wait (up to 60 s) before being answered.
    pub fn hold_tickets(&self, held: bool) {
        self.shared.tickets_held.send_replace(held);
        self.shared.update(|_| ());
    }

    /// The next `n` calls of `op` get `fault` (recorded, no other effect).
    pub fn fail_next_control(&self, op: ControlOp, n: usize, fault: ControlFault) {
        self.shared.update(|s| {
            s.personal
                .control_faults
                .entry(op)
                .or_default()
                .extend((0..n).map(|_| fault.clone()))
        });
    }

    /// Header spelling of the next personal pushes.
    pub fn set_header_style(&self, style: HeaderStyle) {
        self.shared.update(|s| s.personal.header_style = style);
    }

    /// Extra JSON-string wrapping levels of the next personal pushes' data.
    pub fn set_data_wrap(&self, levels: u8) {
        self.shared.update(|s| s.personal.data_wrap = levels);
    }

    /// Lists answer pages of this size, whatever was asked.
    pub fn set_list_page_size(&self, n: usize) {
        self.shared
            .update(|s| s.personal.list_page_size = Some(n.max(1)));
    }

    /// Adds `n` active subscriptions for `client_id`/`source_id` directly;
    /// returns their ids.
    pub fn seed_subscriptions(&self, n: usize, client_id: &str, source_id: &str) -> Vec<String> {
        self.shared.update(|s| {
            (0..n)
                .map(|i| {
                    let id = s.personal.new_sub_id();
                    s.personal.subscriptions.push(FakeSubscription {
                        sub_id: id.clone(),
                        client_id: client_id.to_owned(),
                        source_id: source_id.to_owned(),
                        event_key: format!("user_seeded_{i}"),
                        rule_type: "all".into(),
                        filter_rule: "{}".into(),
                        delivery_pref: "realtime".into(),
                        expires_at: String::new(),
                        ext: json!({"ruleType": "all"}),
                        active: true,
                    });
                    id
                })
                .collect()
        })
    }

    /// Drops a subscription server-side (as if it expired); `false` if unknown.
    pub fn expire_subscription(&self, sub_id: &str) -> bool {
        self.shared.update(|s| {
            s.personal
                .subscriptions
                .iter_mut()
                .find(|x| x.sub_id == sub_id && x.active)
                .map(|x| x.active = false)
                .is_some()
        })
    }

    pub fn ticket_requests(&self) -> Vec<HttpRecord> {
        self.with_state(|s| s.personal.ticket_requests.clone())
    }

    pub fn creates(&self) -> Vec<HttpRecord> {
        self.with_state(|s| s.personal.creates.clone())
    }

    pub fn cancels(&self) -> Vec<HttpRecord> {
        self.with_state(|s| s.personal.cancels.clone())
    }

    pub fn lists(&self) -> Vec<HttpRecord> {
        self.with_state(|s| s.personal.lists.clone())
    }

    pub fn subscriptions(&self) -> Vec<FakeSubscription> {
        self.with_state(|s| s.personal.subscriptions.clone())
    }

    /// Pushes a personal EVENT (tracked until acked, like
    /// [`FakeDingTalk::push_event`]); returns its `messageId`.
    pub fn push_personal(&self, ev: &PersonalEvent) -> String {
        self.shared.update(|s| {
            let mid = s.message_id();
            let now = now_ms().to_string();
            let style = ev.style.unwrap_or(s.personal.header_style);
            let wrap = ev.wrap.unwrap_or(s.personal.data_wrap);
            let mut headers = Map::new();
            let mut put = |k: &str, v: &str| {
                headers.insert(k.to_owned(), Value::String(v.to_owned()));
            };
            for (k, v) in [
                ("topic", "*"),
                ("messageId", mid.as_str()),
                ("contentType", "application/json"),
                ("time", now.as_str()),
            ] {
                put(k, v);
            }
            let rule = ev.rule_type.as_str();
            match style {
                HeaderStyle::Sdk => {
                    put("eventId", &ev.event_id);
                    put("eventType", &ev.event_key);
                    put("eventBornTime", &now);
                    put("eventCorpId", "dingfakecorp");
                    put("SUB_ID", &ev.sub_id);
                }
                HeaderStyle::Upper => {
                    put("MESSAGE_ID", &ev.event_id);
                    put("EVENT_TYPE", &ev.event_key);
                    put("SUB_ID", &ev.sub_id);
                    put("SOURCE_ID", &ev.source_id);
                    put("RULE_TYPE", rule);
                }
                HeaderStyle::Camel => {
                    put("eventId", &ev.event_id);
                    put("eventType", &ev.event_key);
                    put("subscribeId", &ev.sub_id);
                    put("ruleType", rule);
                    put("sourceId", &ev.source_id);
                }
                HeaderStyle::DataOnly => {}
            }
            headers.retain(|_, v| v.as_str().is_some_and(|v| !v.is_empty()));
            let mut data = json!({
                "eventId": ev.event_id,
                "eventKey": ev.event_key,
                "occurredAtMs": now_ms(),
                "subId": ev.sub_id,
                "ext": {"ruleType": rule},
                "payload": ev.payload,
            })
            .to_string();
            for _ in 0..wrap {
                data = Value::String(data).to_string();
            }
            s.log(|| {
                format!(
                    "push personal EVENT {mid} eventId={} key={} sub={} style={style:?} wrap={wrap}",
                    ev.event_id, ev.event_key, ev.sub_id
                )
            });
            s.enqueue_event(&mid, &ev.event_id, headers, &data);
            mid
        })
    }
}

fn record(req: &HttpRequest, status: u16, issued: Option<String>) -> HttpRecord {
    let (path, query) = req.path.split_once('?').unwrap_or((&req.path, ""));
    HttpRecord {
        at: Instant::now(),
        method: req.method.clone(),
        path: path.to_owned(),
        query: parse_query(query),
        headers: req.headers.clone(),
        body: serde_json::from_slice(&req.body).unwrap_or(Value::Null),
        status,
        issued,
    }
}

fn envelope_error(code: &str, message: &str) -> String {
    json!({"success": false, "errorCode": code, "errorMsg": message}).to_string()
}

/// `POST /stream/connections/ticket`.
pub(super) async fn handle_ticket(mut stream: TcpStream, shared: Arc<Shared>, req: HttpRequest) {
    let mut held = shared.tickets_held.subscribe();
    if *held.borrow() {
        shared.update(|s| s.personal.tickets_waiting += 1);
        let _ = tokio::time::timeout(Duration::from_secs(60), held.wait_for(|h| !*h)).await;
        shared.update(|s| s.personal.tickets_waiting -= 1);
    }
    let (status, body) = shared.update(|s| {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let token_ok = req.header("x-user-access-token") == Some(s.options.user_token.as_str());
        let body_ok = body.get("sourceId").and_then(Value::as_str).is_some()
            && body.get("mode").and_then(Value::as_str).is_some();
        let (status, answer, ticket) = match s.personal.ticket_faults.pop_front() {
            Some((st, b)) => (st, b, None),
            None if !token_ok => (
                401,
                envelope_error("UNAUTHORIZED", "invalid user access token"),
                None,
            ),
            None if !body_ok => (
                400,
                envelope_error("INVALID_PARAM", "sourceId and mode are required"),
                None,
            ),
            None => {
                let t = new_uuid();
                s.tickets.insert(
                    t.clone(),
                    Ticket {
                        issued: Instant::now(),
                        used: false,
                    },
                );
                let pair = json!({
                    "endpoint": format!("ws://{}{}", s.local, s.endpoint_path),
                    "ticket": t,
                });
                let answer = match s.personal.ticket_shape {
                    TicketShape::Result => json!({"success": true, "result": pair}),
                    TicketShape::Data => json!({"success": true, "data": pair}),
                    TicketShape::Bare => pair,
                };
                (200, answer.to_string(), Some(t))
            }
        };
        s.log(|| {
            format!(
                "personal ticket #{} -> {status}",
                s.personal.ticket_requests.len() + 1
            )
        });
        s.personal
            .ticket_requests
            .push(record(&req, status, ticket));
        (status, answer)
    });
    respond_with(&mut stream, status, &body, &[]).await;
}

/// `/dws/…`: create, list, cancel.
pub(super) async fn handle_control(mut stream: TcpStream, shared: Arc<Shared>, req: HttpRequest) {
    let path = req.path.split('?').next().unwrap_or("").to_owned();
    let op = match (req.method.as_str(), path.as_str()) {
        ("POST", CREATE_PATH) => Some(ControlOp::Create),
        ("GET", LIST_PATH) => Some(ControlOp::List),
        ("POST", CANCEL_PATH) => Some(ControlOp::Cancel),
        _ => None,
    };
    let Some(op) = op else {
        respond_with(
            &mut stream,
            404,
            &envelope_error("NOT_FOUND", "no such endpoint"),
            &[],
        )
        .await;
        return;
    };
    let (status, body, headers) = shared.update(|s| {
        let (status, body, headers, issued) = control(s, op, &req);
        s.log(|| format!("personal {op:?} -> {status}"));
        let rec = record(&req, status, issued);
        match op {
            ControlOp::Create => s.personal.creates.push(rec),
            ControlOp::List => s.personal.lists.push(rec),
            ControlOp::Cancel => s.personal.cancels.push(rec),
        }
        (status, body, headers)
    });
    respond_with(&mut stream, status, &body, &headers).await;
}

type Answer = (u16, String, Vec<(String, String)>, Option<String>);

fn control(s: &mut FakeState, op: ControlOp, req: &HttpRequest) -> Answer {
    if let Some(f) = s
        .personal
        .control_faults
        .get_mut(&op)
        .and_then(VecDeque::pop_front)
    {
        return (f.status, f.body, f.headers, None);
    }
    let token = s.options.user_token.clone();
    let bearer = format!("Bearer {token}");
    if req.header("authorization") != Some(bearer.as_str())
        || req.header("x-user-access-token") != Some(token.as_str())
    {
        let body = json!({"success": false, "error": {"code": "UNAUTHORIZED", "message": "invalid user token"}});
        return (401, body.to_string(), vec![], None);
    }
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let ok = |v: Value| (200, v.to_string(), vec![], None);
    match op {
        ControlOp::Create => match validate_create(&body) {
            Err(m) => {
                let e = json!({"success": false, "error": {"code": "INVALID_PARAM", "message": m}});
                (400, e.to_string(), vec![], None)
            }
            Ok(()) => {
                let text = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                let id = s.personal.new_sub_id();
                s.personal.subscriptions.push(FakeSubscription {
                    sub_id: id.clone(),
                    client_id: text("clientId"),
                    source_id: text("sourceId"),
                    event_key: text("eventKey"),
                    rule_type: body["ext"]["ruleType"].as_str().unwrap_or("").to_owned(),
                    filter_rule: text("filterRule"),
                    delivery_pref: text("deliveryPref"),
                    expires_at: text("expiresAt"),
                    ext: body["ext"].clone(),
                    active: true,
                });
                (
                    200,
                    json!({"success": true, "result": [id]}).to_string(),
                    vec![],
                    Some(id),
                )
            }
        },
        ControlOp::List => {
            let (_, query) = req.path.split_once('?').unwrap_or(("", ""));
            let q = parse_query(query);
            let param = |k: &str| {
                q.iter()
                    .find(|(n, _)| n == k)
                    .and_then(|(_, v)| v.parse::<usize>().ok())
            };
            let size = s
                .personal
                .list_page_size
                .unwrap_or_else(|| param("pageSize").unwrap_or(100).clamp(1, 100));
            let page_no = param("pageNo").unwrap_or(1).max(1);
            let active = s.personal.active();
            let items: Vec<Value> = active
                .iter()
                .skip((page_no - 1) * size)
                .take(size)
                .map(|x| {
                    json!({"subId": x.sub_id, "eventKey": x.event_key, "ruleType": x.rule_type,
                           "clientId": x.client_id, "sourceId": x.source_id,
                           "deliveryPref": x.delivery_pref, "status": 1, "gmtCreate": now_ms()})
                })
                .collect();
            ok(json!({"success": true, "result": {
                "total": active.len(), "pageNo": page_no, "pageSize": size, "items": items,
            }}))
        }
        ControlOp::Cancel => {
            let id = body.get("subId").and_then(Value::as_str).unwrap_or("");
            match s
                .personal
                .subscriptions
                .iter_mut()
                .find(|x| x.sub_id == id && x.active)
            {
                Some(x) => {
                    x.active = false;
                    ok(json!({"success": true}))
                }
                None => (
                    200,
                    envelope_error("PERSONAL_EVENT_NOT_FOUND", "subscription not found"),
                    vec![],
                    None,
                ),
            }
        }
    }
}

fn validate_create(body: &Value) -> Result<(), String> {
    let text = |k: &str| {
        body.get(k)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    text("clientId").ok_or("clientId is required")?;
    text("eventKey").ok_or("eventKey is required")?;
    let rule = text("filterRule").ok_or("filterRule must be a JSON string")?;
    match serde_json::from_str::<Value>(rule) {
        Ok(Value::Object(_)) => {}
        _ => return Err("filterRule must hold a JSON object".into()),
    }
    if text("deliveryPref") != Some("realtime") {
        return Err("deliveryPref must be realtime".into());
    }
    body.get("ext")
        .and_then(|e| e.get("ruleType"))
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .ok_or("ext.ruleType is required")?;
    Ok(())
}
