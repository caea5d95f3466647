//! The personal endpoints of the fake: ticket, control plane, OAuth
//! refresh (the rules are listed in [`super`]).

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::{
    reference, ControlOp, FakeIdentity, FakeSubscription, HttpRecord, TicketShape, CANCEL_PATH,
    CREATE_PATH, LIST_PATH,
};
use crate::fake_dingtalk::{
    http::{respond_with, HttpRequest},
    new_uuid, now_ms, parse_query, FakeState, Shared, Ticket,
};

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

type Answer = (u16, String, Option<String>);

/// `POST /stream/connections/ticket`.
pub(in crate::fake_dingtalk) async fn handle_ticket(
    mut stream: TcpStream,
    shared: Arc<Shared>,
    req: HttpRequest,
) {
    let mut held = shared.tickets_held.subscribe();
    if *held.borrow() {
        shared.update(|s| s.personal.tickets_waiting += 1);
        let _ = tokio::time::timeout(Duration::from_secs(60), held.wait_for(|h| !*h)).await;
        shared.update(|s| s.personal.tickets_waiting -= 1);
    }
    let (status, body) = shared.update(|s| {
        let (status, answer, ticket) = match s.personal.ticket_faults.pop_front() {
            Some((st, b)) => (st, b, None),
            None => ticket(s, &req),
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

fn ticket(s: &mut FakeState, req: &HttpRequest) -> Answer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let text = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("");
    if req.header("x-user-access-token") != Some(s.options.user_token.as_str()) {
        let e = envelope_error("UNAUTHORIZED", "invalid user access token");
        return (401, e, None);
    }
    let mode = text("mode");
    if text("sourceId").is_empty() || !matches!(mode, "normal" | "custom") {
        let e = envelope_error(
            "INVALID_PARAM",
            "sourceId and mode (normal|custom) are required",
        );
        return (400, e, None);
    }
    let portal = body.get("channelType").is_some();
    if portal && text("channelType") != text("sourceId") {
        let e = envelope_error("INVALID_PARAM", "channelType must repeat sourceId");
        return (400, e, None);
    }
    if !portal
        && req
            .header("x-dws-client-id")
            .is_none_or(|v| v.trim().is_empty())
    {
        let e = envelope_error("CLIENT_ID_REQUIRED", "X-DWS-Client-Id is required");
        return (400, e, None);
    }
    // The reference's personal ticket call also sends `Authorization:
    // Bearer`, `X-DWS-Source-Id` and `Accept` (personal.go:262-267).
    if !portal {
        let bearer = format!("Bearer {}", s.options.user_token);
        if req.header("authorization") != Some(bearer.as_str()) {
            let e = envelope_error("UNAUTHORIZED", "Authorization: Bearer <token> is required");
            return (401, e, None);
        }
        if req.header("x-dws-source-id") != Some(text("sourceId")) {
            let e = envelope_error("INVALID_PARAM", "X-DWS-Source-Id must repeat sourceId");
            return (400, e, None);
        }
    }
    if !req
        .header("accept")
        .is_some_and(|a| a.contains("application/json"))
    {
        let e = envelope_error("INVALID_PARAM", "Accept: application/json is required");
        return (406, e, None);
    }
    if mode == "custom" {
        if text("clientId").is_empty() || text("clientSecret").is_empty() {
            let e = envelope_error(
                "CLIENT_ID_REQUIRED",
                "custom mode needs clientId and clientSecret",
            );
            return (400, e, None);
        }
        if text("clientId") != s.options.client_id
            || text("clientSecret") != s.options.client_secret
        {
            return (
                403,
                envelope_error("INVALID_APP", "app credentials refused"),
                None,
            );
        }
    }
    let t = new_uuid();
    s.tickets.insert(
        t.clone(),
        Ticket {
            issued: Instant::now(),
            used: false,
        },
    );
    let base = s.endpoint();
    let pair = if s.personal.ticket_in_endpoint && !portal {
        let sep = if base.contains('?') { '&' } else { '?' };
        json!({"endpoint": format!("{base}{sep}ticket={t}"), "ticket": format!("decoy-{}", new_uuid())})
    } else {
        json!({"endpoint": base, "ticket": t})
    };
    let answer = match s.personal.ticket_shape {
        TicketShape::Result => json!({"success": true, "result": pair}),
        TicketShape::Data => json!({"success": true, "data": pair}),
        TicketShape::Bare => pair,
    };
    (200, answer.to_string(), Some(t))
}

/// `POST /oauth2/refreshToken`.
pub(in crate::fake_dingtalk) async fn handle_refresh(
    mut stream: TcpStream,
    shared: Arc<Shared>,
    req: HttpRequest,
) {
    let mut held = shared.refreshes_held.subscribe();
    if *held.borrow() {
        shared.update(|s| s.personal.refreshes_waiting += 1);
        let _ = tokio::time::timeout(Duration::from_secs(60), held.wait_for(|h| !*h)).await;
        shared.update(|s| s.personal.refreshes_waiting -= 1);
    }
    let (status, body) = shared.update(|s| {
        let (status, answer, issued) = match s.personal.refresh_faults.pop_front() {
            Some((st, b)) => (st, b, None),
            None => refresh(s, &req),
        };
        s.log(|| format!("personal token refresh -> {status}"));
        s.personal.refreshes.push(record(&req, status, issued));
        (status, answer)
    });
    respond_with(&mut stream, status, &body, &[]).await;
}

fn refresh(s: &mut FakeState, req: &HttpRequest) -> Answer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let text = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("");
    if text("clientId").is_empty() {
        return (
            400,
            envelope_error("CLIENT_ID_REQUIRED", "clientId is required"),
            None,
        );
    }
    if text("grantType") != "refresh_token" {
        return (
            400,
            envelope_error("INVALID_PARAM", "grantType must be refresh_token"),
            None,
        );
    }
    if body.get("clientSecret").is_some() {
        // `refreshViaMCP` sends clientId, refreshToken and grantType only.
        return (
            400,
            envelope_error(
                "INVALID_PARAM",
                "clientSecret is not a parameter of the MCP refresh",
            ),
            None,
        );
    }
    if text("refreshToken") != s.personal.refresh_token {
        // The MCP proxy answers a dead refresh token with a 200 error body.
        let e = envelope_error(
            "invalidParameter.authCode.notFound",
            "refresh token invalid",
        );
        return (200, e, None);
    }
    let access = s.personal.new_token("user-token");
    let refresh = s.personal.new_token("refresh-token");
    s.options.user_token = access.clone();
    s.personal.refresh_token = refresh.clone();
    let mut answer = json!({
        "accessToken": access,
        "refreshToken": refresh,
        "expiresIn": s.personal.token_lifetime.as_secs(),
    });
    // The MCP answer (`parseMCPTokenResponse`): the user's organization
    // always, the user when the service resolved it.
    match &s.personal.identity {
        FakeIdentity::CorpUser { corp, user } => {
            answer["corpId"] = json!(corp);
            answer["corpName"] = json!(format!("{corp} Inc."));
            answer["userId"] = json!(user);
            answer["userName"] = json!(format!("{user} (name)"));
        }
        FakeIdentity::AccessToken | FakeIdentity::RefreshToken => {
            answer["corpId"] = json!(super::ORG_CORP_ID);
            answer["corpName"] = json!("Fake Org Inc.");
        }
    }
    (200, answer.to_string(), Some(access))
}

/// `/dws/…`: create, list, cancel.
pub(in crate::fake_dingtalk) async fn handle_control(
    mut stream: TcpStream,
    shared: Arc<Shared>,
    req: HttpRequest,
) {
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

type ControlAnswer = (u16, String, Vec<(String, String)>, Option<String>);

fn error(status: u16, code: &str, message: &str) -> ControlAnswer {
    let e = json!({"success": false, "error": {"code": code, "message": message}});
    (status, e.to_string(), vec![], None)
}

fn control(s: &mut FakeState, op: ControlOp, req: &HttpRequest) -> ControlAnswer {
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
        return error(401, "UNAUTHORIZED", "invalid user token");
    }
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let (_, query) = req.path.split_once('?').unwrap_or(("", ""));
    let q = parse_query(query);
    let param = |k: &str| {
        q.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    let client_id = match op {
        ControlOp::Create => body.get("clientId").and_then(Value::as_str).unwrap_or(""),
        ControlOp::List => param("clientId"),
        ControlOp::Cancel => req.header("x-dws-client-id").unwrap_or(""),
    };
    if client_id.trim().is_empty() {
        return error(400, "CLIENT_ID_REQUIRED", "a client id is required");
    }
    let ok = |v: Value| (200, v.to_string(), vec![], None);
    match op {
        ControlOp::Create => {
            if let Err(m) = validate_create(s, req, &body) {
                return error(400, "INVALID_PARAM", &m);
            }
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
                gmt_create: now_ms().to_string(),
            });
            (
                200,
                json!({"success": true, "result": [id]}).to_string(),
                vec![],
                Some(id),
            )
        }
        ControlOp::List => {
            let num = |k: &str| param(k).parse::<usize>().ok();
            let size = s
                .personal
                .list_page_size
                .unwrap_or_else(|| num("pageSize").unwrap_or(100).clamp(1, 100));
            let page_no = num("pageNo").unwrap_or(1).max(1);
            let active = s.personal.active();
            let items: Vec<Value> = active
                .iter()
                .skip((page_no - 1) * size)
                .take(size)
                .map(|x| {
                    json!({"subId": x.sub_id, "eventKey": x.event_key, "ruleType": x.rule_type,
                           "clientId": x.client_id, "sourceId": x.source_id,
                           "deliveryPref": x.delivery_pref, "status": 1,
                           "gmtCreate": x.gmt_create})
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

/// The identity key the service attributes a create to.
fn identity_key(s: &FakeState, req: &HttpRequest, client: &str, source: &str) -> String {
    match &s.personal.identity {
        FakeIdentity::CorpUser { corp, user } => {
            reference::corp_user_key(corp, user, client, source)
        }
        FakeIdentity::AccessToken => reference::local_subject_key(
            "access",
            req.header("x-user-access-token").unwrap_or(""),
            client,
            source,
        ),
        FakeIdentity::RefreshToken => {
            reference::local_subject_key("refresh", &s.personal.refresh_token, client, source)
        }
    }
}

fn validate_create(s: &FakeState, req: &HttpRequest, body: &Value) -> Result<(), String> {
    let text = |k: &str| {
        body.get(k)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
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
    let client = text("clientId").unwrap_or("");
    let source = text("sourceId").unwrap_or("");
    let want = reference::idempotency_key(&identity_key(s, req, client, source), body)
        .ok_or("not a create body")?;
    let got = body["ext"]["idempotencyKey"].as_str().unwrap_or("");
    if got != want {
        return Err(format!(
            "ext.idempotencyKey {got:?} is not the key for this identity and subscription"
        ));
    }
    Ok(())
}
