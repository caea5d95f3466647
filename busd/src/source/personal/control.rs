//! The personal stream's subscription control plane (protocol note §6.5):
//! create, list and cancel upstream subscriptions, parse and classify their
//! errors, and share one upstream subscription between identical local ones
//! ([`Control`], the source's [`UpstreamControl`]).
//!
//! Every call carries `Authorization: Bearer <token>`,
//! `x-user-access-token`, `X-DWS-Client-Id`, `X-DWS-Source-Id` and
//! `Accept: application/json`; one HTTP call per operation, 30 s.
//!
//! - Create: `POST {base}/subscription/user` with `clientId`, `sourceId`,
//!   `eventKey`, `filterRule` (the rule parameter as a JSON *string*),
//!   `deliveryPref: realtime`, `expiresAt` (RFC 3339, now + TTL; only when
//!   the user gave an explicit `--ttl`) and `ext`
//!   (`ruleType`, the content `filter`, `idempotencyKey`). The id is the
//!   first element of `result` (or `result.subId`).
//! - List: `GET {base}/event/sublist?clientId&sourceId&pageSize=100&pageNo=N`,
//!   page by page until a page is empty, `total` is reached or a page is
//!   short; duplicates skipped; a page that adds nothing while more are
//!   expected is an error.
//! - Cancel: `POST {base}/subscription/cancel {"subId"}`; `NOT_FOUND` and
//!   `PERSONAL_EVENT_NOT_FOUND` mean it is gone already: success.
//!
//! A failure is a [`ControlError`]: code, message, status, the explicit
//! `retryable` flag, the retry delay (largest of `retry_after_seconds`,
//! `next_retry_at − now` and `Retry-After`), trace id and the
//! `details.subscribe_id` of "already exists" shapes — which is reported,
//! never adopted. [`ControlError::class`] follows the reference CLI's table;
//! [`ControlError::refusal`] is what a consumer sees (exit 3 for an
//! authentication or permission failure, else exit 1).
//!
//! Sharing: identical specs (event key, rule type, rule parameter, filter)
//! share one upstream subscription by reference count. The first acquire
//! creates it (on a task of its own, so a consumer that goes away mid-call
//! does not leave the others hanging); acquires arriving meanwhile wait for
//! that result; the last release cancels it in the background, and an
//! acquire arriving during that cancel waits for it and creates anew.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use proto::v1::{ErrorCode, UpstreamSpec};
use reqwest::{
    header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION},
    Method,
};
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::Credentials;
use crate::{
    hub::Refusal,
    profile::Secret,
    source::{
        stream::{net, net::Url, one_line},
        BoxFuture, UpstreamControl,
    },
};

/// Create, list and cancel paths below the control base.
pub const CREATE_PATH: &str = "/subscription/user";
pub const LIST_PATH: &str = "/event/sublist";
pub const CANCEL_PATH: &str = "/subscription/cancel";

/// A retryable create failure is retried inside the acquire (the consumer
/// waiting) at most this many times, and only when the delay is this short;
/// otherwise the consumer is refused with the delay in the message.
const INLINE_RETRIES: usize = 2;
const INLINE_MAX_DELAY: Duration = Duration::from_secs(2);
/// Waits between inline retries when the server names no delay.
const INLINE_DELAYS: [Duration; INLINE_RETRIES] =
    [Duration::from_millis(500), Duration::from_millis(1000)];
/// List paging.
const PAGE_SIZE: usize = 100;
const MAX_PAGES: usize = 10_000;

/// The headers of every personal-stream call (ticket and control plane).
pub fn auth_headers(token: &Secret, client_id: &str, source_id: &str) -> Result<HeaderMap, String> {
    let mut h = HeaderMap::new();
    let secret = |v: String| {
        HeaderValue::from_str(&v)
            .map(|mut v| {
                v.set_sensitive(true);
                v
            })
            .map_err(|_| "the user access token is not a valid HTTP header value".to_owned())
    };
    h.insert(AUTHORIZATION, secret(format!("Bearer {}", token.expose()))?);
    h.insert(
        HeaderName::from_static("x-user-access-token"),
        secret(token.expose().to_owned())?,
    );
    for (name, value) in [
        ("x-dws-client-id", client_id),
        ("x-dws-source-id", source_id),
    ] {
        if !value.is_empty() {
            let v = HeaderValue::from_str(value)
                .map_err(|_| format!("{name} {value:?} is not a valid HTTP header value"))?;
            h.insert(HeaderName::from_static(name), v);
        }
    }
    h.insert(ACCEPT, HeaderValue::from_static("application/json"));
    Ok(h)
}

// ------------------------------------------------------------------ errors

/// How a failed call may be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Retryable,
    NonRetryable,
    /// Neither is known (e.g. an "already exists" shape, a 200 business error).
    Unknown,
}

/// A failed control-plane call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlError {
    /// The HTTP status; 0 when there was no response.
    pub http_status: u16,
    pub code: String,
    pub message: String,
    /// The server's explicit `retryable` flag.
    pub retryable: Option<bool>,
    pub retry_after: Option<Duration>,
    pub trace_id: String,
    /// `details.subscribe_id` ("already exists" shapes): reported, not adopted.
    pub subscribe_id: String,
    /// The token could not be read (a local permission problem).
    pub token_unreadable: bool,
}

/// `code` upper-cased with `-`, `.` and spaces as `_`.
fn normalize(code: &str) -> String {
    code.trim()
        .chars()
        .map(|c| match c {
            '-' | '.' | ' ' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

const BUSINESS_CODES: &[&str] = &[
    "INVALID_PARAM",
    "INVALID_PARAMS",
    "INVALID_PARAMETER",
    "INVALID_PARAMETERS",
    "ILLEGAL_PARAM",
    "ILLEGAL_PARAMS",
    "ILLEGAL_PARAMETER",
    "ILLEGAL_PARAMETERS",
    "PARAM_ERROR",
    "PARAMETER_ERROR",
    "CLIENT_ID_REQUIRED",
    "SOURCE_ID_REQUIRED",
    "EVENT_KEY_REQUIRED",
    "RULE_TYPE_REQUIRED",
    "NO_AUTH",
    "NO_PERMISSION",
    "PERMISSION_DENIED",
    "ACCESS_DENIED",
    "FORBIDDEN",
    "UNAUTHORIZED",
    "NOT_FOUND",
    "NOT_EXIST",
    "NOT_SUPPORTED",
    "UNSUPPORTED",
    "UNIFIED_APP_ID_NOT_FOUND",
];
const BUSINESS_SUFFIXES: &[&str] = &[
    "_NOT_BELONG_TO_ORG",
    "_DOES_NOT_BELONG_TO_ORG",
    "_NOT_FOUND",
    "_NOT_EXIST",
    "_NOT_SUPPORTED",
    "_UNSUPPORTED",
    "_NO_PERMISSION",
    "_PERMISSION_DENIED",
    "_ACCESS_DENIED",
];
/// Business codes that say "not allowed" rather than "wrong request".
const AUTH_CODES: &[&str] = &[
    "NO_AUTH",
    "NO_PERMISSION",
    "PERMISSION_DENIED",
    "ACCESS_DENIED",
    "FORBIDDEN",
    "UNAUTHORIZED",
];
const AUTH_SUFFIXES: &[&str] = &["_NO_PERMISSION", "_PERMISSION_DENIED", "_ACCESS_DENIED"];

fn listed(code: &str, exact: &[&str], suffixes: &[&str]) -> bool {
    let c = normalize(code);
    !c.is_empty() && (exact.contains(&c.as_str()) || suffixes.iter().any(|s| c.ends_with(s)))
}

impl ControlError {
    fn transport(message: String) -> ControlError {
        ControlError {
            code: "TRANSPORT".into(),
            message,
            ..ControlError::default()
        }
    }

    /// The reference CLI's classification: the explicit flag wins; then
    /// 408/425/429/5xx retryable; 401/403 and the listed business codes
    /// not; an "already exists" shape unknown; other ≥ 400 not; a 200
    /// business error unknown. No response at all: retryable.
    pub fn class(&self) -> Class {
        if self.token_unreadable {
            return Class::NonRetryable;
        }
        if let Some(r) = self.retryable {
            return if r {
                Class::Retryable
            } else {
                Class::NonRetryable
            };
        }
        match self.http_status {
            0 | 408 | 425 | 429 | 500.. => return Class::Retryable,
            401 | 403 => return Class::NonRetryable,
            _ => {}
        }
        if listed(&self.code, BUSINESS_CODES, BUSINESS_SUFFIXES) {
            Class::NonRetryable
        } else if !self.subscribe_id.is_empty() {
            Class::Unknown
        } else if self.http_status >= 400 {
            Class::NonRetryable
        } else {
            Class::Unknown
        }
    }

    /// An authentication or permission failure (the consumer's exit 3):
    /// HTTP 401/403, a permission code, or an unreadable token — unless the
    /// server says it is retryable.
    pub fn is_auth(&self) -> bool {
        self.class() != Class::Retryable
            && (self.token_unreadable
                || matches!(self.http_status, 401 | 403)
                || listed(&self.code, AUTH_CODES, AUTH_SUFFIXES))
    }

    /// `CODE: message (HTTP n, retryable, retry after 45s, trace t)`.
    pub fn describe(&self) -> String {
        let head = [self.code.as_str(), self.message.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|s| one_line(s, 200))
            .collect::<Vec<_>>()
            .join(": ");
        let mut details = vec![];
        if self.http_status != 0 {
            details.push(format!("HTTP {}", self.http_status));
        }
        if self.is_auth() {
            details.push("authentication or permission failure".to_owned());
        }
        details.push(
            match self.class() {
                Class::Retryable => "retryable",
                Class::NonRetryable => "not retryable",
                Class::Unknown => "retryability unknown",
            }
            .to_owned(),
        );
        if let Some(d) = self.retry_after {
            details.push(format!("retry after {}", secs(d)));
        }
        if !self.subscribe_id.is_empty() {
            details.push(format!(
                "the server named subscription {}, which is not adopted",
                one_line(&self.subscribe_id, 80)
            ));
        }
        if !self.trace_id.is_empty() {
            details.push(format!("trace {}", one_line(&self.trace_id, 80)));
        }
        format!("{head} ({})", details.join(", "))
    }

    /// What a consumer is told, scrubbed of secrets.
    pub fn refusal(&self, scrub: &crate::source::stream::Scrub) -> Refusal {
        let code = if self.is_auth() {
            ErrorCode::PermissionDenied
        } else {
            ErrorCode::Upstream
        };
        Refusal::new(
            code,
            scrub.clean(&format!(
                "upstream subscription failed: {}",
                self.describe()
            )),
        )
    }
}

/// `45s`, `1.5s`.
fn secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

// ------------------------------------------------------------------ parsing

fn field<'a>(o: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| o.get(*k).filter(|v| !v.is_null()))
}

fn field_str(o: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    match field(o, keys)? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn field_bool(o: &Map<String, Value>, keys: &[&str]) -> Option<bool> {
    match field(o, keys)? {
        Value::Bool(b) => Some(*b),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn field_secs(o: &Map<String, Value>, keys: &[&str]) -> Option<Duration> {
    let n = match field(o, keys)? {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (n.is_finite() && n > 0.0).then(|| Duration::from_secs_f64(n.min(86_400.0 * 365.0)))
}

/// RFC 3339 (`Z` or a `±hh:mm` offset) → time from now, if in the future.
fn until_rfc3339(s: &str, now: SystemTime) -> Option<Duration> {
    let s = s.trim();
    let (local, offset_secs) = if let Some(l) = s.strip_suffix(['Z', 'z']) {
        (l, 0i64)
    } else {
        let split = s.len().checked_sub(6)?;
        let (l, off) = (s.get(..split)?, s.get(split..)?);
        let sign = match off.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let (h, m) = off.get(1..)?.split_once(':')?;
        (
            l,
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60),
        )
    };
    let t = humantime::parse_rfc3339_weak(local).ok()?;
    let utc = if offset_secs >= 0 {
        t.checked_sub(Duration::from_secs(offset_secs.unsigned_abs()))?
    } else {
        t.checked_add(Duration::from_secs(offset_secs.unsigned_abs()))?
    };
    utc.duration_since(now).ok().filter(|d| !d.is_zero())
}

/// `Retry-After`: delta seconds or an HTTP date.
fn retry_after_header(h: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let v = h.get("retry-after")?.to_str().ok()?.trim();
    if let Ok(n) = v.parse::<u64>() {
        return (n > 0).then(|| Duration::from_secs(n));
    }
    httpdate::parse_http_date(v)
        .ok()?
        .duration_since(now)
        .ok()
        .filter(|d| !d.is_zero())
}

/// The error an (error) body describes, if it describes one: an `error`
/// object, envelope `errorCode`/`errorMsg`, or a flat `{code, message}`.
/// Fields missing in the `error` object are taken from the envelope.
fn error_from(v: &Value, now: SystemTime) -> Option<ControlError> {
    let outer = v.as_object()?;
    let inner = outer.get("error").and_then(Value::as_object);
    let has = |o: &Map<String, Value>, keys: &[&str]| keys.iter().any(|k| o.contains_key(*k));
    if inner.is_none() && !has(outer, &["errorCode", "errorMsg", "code", "message"]) {
        return None;
    }
    let objs: Vec<&Map<String, Value>> = inner.into_iter().chain([outer]).collect();
    let str_of = |keys: &[&str]| objs.iter().find_map(|o| field_str(o, keys));
    let mut e = ControlError {
        code: str_of(&["code", "errorCode"]).unwrap_or_default(),
        message: str_of(&["message", "errorMsg", "msg"]).unwrap_or_default(),
        retryable: objs.iter().find_map(|o| field_bool(o, &["retryable"])),
        trace_id: str_of(&[
            "trace_id",
            "traceId",
            "request_id",
            "requestId",
            "requestid",
        ])
        .or_else(|| {
            outer
                .get("arguments")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_default(),
        subscribe_id: objs
            .iter()
            .filter_map(|o| o.get("details").and_then(Value::as_object))
            .find_map(|d| field_str(d, &["subscribe_id", "subscribeId", "subId"]))
            .unwrap_or_default(),
        ..ControlError::default()
    };
    if let Some(s) = str_of(&["http_status", "httpStatus"]).and_then(|s| s.parse().ok()) {
        e.http_status = s;
    }
    let delays = objs.iter().flat_map(|o| {
        [
            field_secs(o, &["retry_after_seconds", "retryAfterSeconds"]),
            field_str(o, &["next_retry_at", "nextRetryAt"]).and_then(|s| until_rfc3339(&s, now)),
        ]
    });
    e.retry_after = delays.flatten().max();
    Some(e)
}

/// Parses a control-plane response: `Ok(result)` (`None` when there is
/// none) or the error it carries.
pub fn parse_response(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Option<Value>, ControlError> {
    let now = SystemTime::now();
    let blank = body.iter().all(u8::is_ascii_whitespace);
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let with_headers = |mut e: ControlError| {
        if e.http_status == 0 || (200..300).contains(&status) {
            e.http_status = status;
        }
        e.retry_after = e.retry_after.max(retry_after_header(headers, now));
        if e.trace_id.is_empty() {
            e.trace_id = ["x-trace-id", "x-dingtalk-trace-id", "x-request-id"]
                .iter()
                .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
                .unwrap_or("")
                .to_owned();
        }
        e
    };
    if !(200..300).contains(&status) {
        let e = json
            .as_ref()
            .and_then(|v| error_from(v, now))
            .unwrap_or_else(|| ControlError {
                code: format!("HTTP_{status}"),
                message: reqwest::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("error")
                    .to_owned(),
                ..ControlError::default()
            });
        // The transport status is the one that counts.
        return Err(with_headers(ControlError {
            http_status: status,
            ..e
        }));
    }
    if blank {
        return Ok(None);
    }
    let Some(v) = json else {
        return Err(with_headers(ControlError {
            code: "MALFORMED_RESPONSE".into(),
            message: "the response is not JSON".into(),
            ..ControlError::default()
        }));
    };
    let Value::Object(m) = &v else {
        return Ok(Some(v));
    };
    let envelope = ["success", "error", "result", "errorCode", "errorMsg"]
        .iter()
        .any(|k| m.contains_key(*k));
    if !envelope {
        return Ok(Some(v));
    }
    let success = field_bool(m, &["success"]);
    let has_error = m.get("error").is_some_and(|e| !e.is_null());
    if success == Some(false) || (success.is_none() && has_error) {
        let e = error_from(&v, now).unwrap_or_else(|| ControlError {
            code: "REQUEST_FAILED".into(),
            message: "the server answered success: false".into(),
            ..ControlError::default()
        });
        return Err(with_headers(e));
    }
    Ok(m.get("result").filter(|r| !r.is_null()).cloned())
}

/// The subscription id in a create result: `["sub-…"]`, `{"subId": …}` or
/// a bare string.
fn created_id(result: Option<Value>) -> Result<String, ControlError> {
    let id = match &result {
        Some(Value::Array(a)) => a.first().and_then(Value::as_str).map(str::to_owned),
        Some(Value::Object(o)) => field_str(o, &["subId", "subscribe_id", "subscribeId"]),
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    match id.map(|s| s.trim().to_owned()) {
        Some(id) if !id.is_empty() && id.len() <= 256 && !id.chars().any(char::is_control) => {
            Ok(id)
        }
        _ => Err(ControlError {
            http_status: 200,
            code: "NO_SUBSCRIPTION_ID".into(),
            message: "the create response has no usable subscription id".into(),
            ..ControlError::default()
        }),
    }
}

// ------------------------------------------------------------------ requests

/// A create request derived from a local subscription's upstream spec.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRequest {
    pub event_key: String,
    pub rule_type: String,
    /// `{}`, `{"targetUid","targetUidType"}` or `{"openConversationId"}`.
    pub rule_param: Value,
    /// The content filter object, if any.
    pub filter: Option<Value>,
    pub ttl: Duration,
}

/// `filter_json` field aliases (the reference CLI's).
const FIELD_ALIASES: &[(&str, &str)] = &[
    ("content", "payload.body.content"),
    ("conversation_id", "payload.body.openConversationId"),
    ("sender", "payload.body.sender"),
    (
        "sender_open_dingtalk_id",
        "payload.body.senderOpenDingTalkId",
    ),
];

fn map_field_aliases(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(f)) = o.get_mut("field") {
                if let Some((_, full)) = FIELD_ALIASES.iter().find(|(a, _)| a == f) {
                    *f = (*full).to_owned();
                }
            }
            o.values_mut().for_each(map_field_aliases);
        }
        Value::Array(a) => a.iter_mut().for_each(map_field_aliases),
        _ => {}
    }
}

/// JSON text with object keys sorted at every level.
pub fn canonical(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&o[k])))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

impl CreateRequest {
    /// Checks and translates a spec (the bus does not trust the client's
    /// validation); the error is the consumer's usage error.
    pub fn from_spec(
        keys: &[String],
        spec: &UpstreamSpec,
        ttl: Duration,
    ) -> Result<CreateRequest, String> {
        let [key] = keys else {
            return Err("a personal-stream subscription takes exactly one event key".into());
        };
        if !proto::pattern::is_valid_event_type(key) {
            return Err(format!(
                "{key}: a personal-stream subscription needs an exact event key"
            ));
        }
        let target = match (spec.user.is_empty(), spec.open_dingtalk_id.is_empty()) {
            (false, true) => Some(("staffId", spec.user.as_str())),
            (true, false) => Some(("openDingtalkId", spec.open_dingtalk_id.as_str())),
            (true, true) => None,
            (false, false) => return Err("give only one of --user and --open-dingtalk-id".into()),
        };
        let rule = spec.rule_type.as_str();
        let rule_param = match (rule, target, spec.group.is_empty()) {
            ("at" | "all", None, true) => json!({}),
            ("singleChat" | "sender", Some((kind, uid)), true) => {
                json!({"targetUid": uid, "targetUidType": kind})
            }
            ("group", None, false) => json!({"openConversationId": spec.group}),
            ("at" | "all" | "singleChat" | "sender" | "group", ..) => {
                return Err(format!(
                    "rule {rule}: singleChat and sender take exactly one of --user or --open-dingtalk-id, \
                     group takes --group, at and all take neither"
                ))
            }
            _ => {
                return Err(format!(
                    "invalid rule {rule:?}: use at, singleChat, sender, group or all"
                ))
            }
        };
        let mut filters = vec![];
        let terms: Vec<&str> = spec
            .query
            .iter()
            .map(|q| q.trim())
            .filter(|q| !q.is_empty())
            .collect();
        if !terms.is_empty() {
            filters.push(
                json!({"field": "payload.body.content", "op": "contains_any", "value": terms}),
            );
        }
        if !spec.filter_json.trim().is_empty() {
            let mut f: Value = serde_json::from_str(&spec.filter_json)
                .map_err(|e| format!("invalid --filter-json: {e}"))?;
            if !f.is_object() {
                return Err("--filter-json must be a JSON object".into());
            }
            map_field_aliases(&mut f);
            filters.push(f);
        }
        let filter = match filters.len() {
            0 => None,
            1 => filters.pop(),
            _ => Some(json!({ "and": filters })),
        };
        Ok(CreateRequest {
            event_key: key.clone(),
            rule_type: rule.to_owned(),
            rule_param,
            filter,
            ttl,
        })
    }

    /// Identical specs have identical keys (the TTL is not part of it).
    pub fn share_key(&self) -> String {
        canonical(&json!([
            self.event_key,
            self.rule_type,
            self.rule_param,
            self.filter
        ]))
    }

    /// `dws-cli-` + the first 8 bytes (hex) of SHA-256 over the identity
    /// key, event key, rule type, canonical rule parameter and canonical
    /// filter, one per line.
    pub fn idempotency_key(&self, identity: &str) -> String {
        let input = [
            identity.to_owned(),
            self.event_key.clone(),
            self.rule_type.clone(),
            canonical(&self.rule_param),
            self.filter.as_ref().map(canonical).unwrap_or_default(),
        ]
        .join("\n");
        let digest = ring::digest::digest(&ring::digest::SHA256, input.as_bytes());
        let hex: String = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("dws-cli-{hex}")
    }

    pub fn body(&self, client_id: &str, source_id: &str, now: SystemTime) -> Value {
        let mut ext = json!({
            "ruleType": self.rule_type,
            "idempotencyKey": self.idempotency_key(&format!("{client_id}/{source_id}")),
        });
        if let Some(f) = &self.filter {
            ext["filter"] = f.clone();
        }
        let mut body = json!({
            "clientId": client_id,
            "eventKey": self.event_key,
            "filterRule": self.rule_param.to_string(),
            "deliveryPref": "realtime",
        });
        if !source_id.is_empty() {
            body["sourceId"] = json!(source_id);
        }
        if !self.ttl.is_zero() {
            body["expiresAt"] =
                json!(humantime::format_rfc3339_seconds(now + self.ttl).to_string());
        }
        body["ext"] = ext;
        body
    }
}

/// One upstream subscription as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSubscription {
    pub sub_id: String,
    pub event_key: String,
    pub rule_type: String,
    pub client_id: String,
    pub source_id: String,
    pub delivery_pref: String,
    /// `active`, `paused`, `deleted`, or the server's text.
    pub status: String,
}

impl ListedSubscription {
    fn parse(v: &Value) -> Option<ListedSubscription> {
        let o = v.as_object()?;
        let s = |keys: &[&str]| field_str(o, keys).unwrap_or_default();
        let status = match s(&["status"]).as_str() {
            "1" => "active".to_owned(),
            "2" => "paused".to_owned(),
            "3" => "deleted".to_owned(),
            other => other.to_ascii_lowercase(),
        };
        Some(ListedSubscription {
            sub_id: field_str(o, &["subId", "subscribe_id", "subscribeId"])?,
            event_key: s(&["eventKey", "event_key"]),
            rule_type: s(&["ruleType", "rule_type"]),
            client_id: s(&["clientId", "client_id"]),
            source_id: s(&["sourceId", "source_id"]),
            delivery_pref: s(&["deliveryPref", "delivery_pref"]),
            status,
        })
    }
}

// ------------------------------------------------------------------ client

enum Slot {
    /// A create is in flight; these acquires wait for its result.
    Creating {
        waiters: Vec<oneshot::Sender<Result<String, Refusal>>>,
    },
    Ready {
        id: String,
        refs: usize,
    },
    /// The last release is cancelling it; these acquires wait, then create.
    Cancelling {
        waiters: Vec<oneshot::Sender<()>>,
    },
}

#[derive(Default)]
struct Registry {
    /// By [`CreateRequest::share_key`].
    slots: HashMap<String, Slot>,
    /// Upstream id → share key, for the ready ones.
    by_id: HashMap<String, String>,
}

struct Inner {
    http: reqwest::Client,
    base: String,
    creds: Arc<Credentials>,
    client_id: String,
    source_id: String,
    registry: Mutex<Registry>,
}

/// The control-plane client and the source's [`UpstreamControl`]. Cheap to
/// clone (one shared state).
#[derive(Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

impl Control {
    pub fn new(
        http: reqwest::Client,
        control_base: &str,
        creds: Arc<Credentials>,
        client_id: &str,
        source_id: &str,
    ) -> Control {
        Control {
            inner: Arc::new(Inner {
                http,
                base: control_base.trim_end_matches('/').to_owned(),
                creds,
                client_id: client_id.to_owned(),
                source_id: source_id.to_owned(),
                registry: Mutex::new(Registry::default()),
            }),
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// One call: the result, or the error (scrubbed of secrets).
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Option<Value>, ControlError> {
        let i = &self.inner;
        let mut url = Url::parse(&format!("{}{path}", i.base))
            .map_err(|e| ControlError::transport(format!("invalid control_base: {e}")))?;
        for (k, v) in query {
            url = url.with_query_param(k, v);
        }
        let token = i.creds.token().map_err(|m| ControlError {
            code: "TOKEN_UNAVAILABLE".into(),
            message: m,
            token_unreadable: true,
            ..ControlError::default()
        })?;
        let headers =
            auth_headers(&token, &i.client_id, &i.source_id).map_err(ControlError::transport)?;
        let mut req = i.http.request(method, url.to_string()).headers(headers);
        if let Some(b) = body {
            req = req.json(b);
        }
        let scrub = i.creds.scrub();
        let clean = |mut e: ControlError| {
            e.message = scrub.clean(&e.message);
            e.code = scrub.clean(&e.code);
            e.trace_id = scrub.clean(&e.trace_id);
            e.subscribe_id = scrub.clean(&e.subscribe_id);
            e
        };
        let resp = net::send(&url, req)
            .await
            .map_err(|m| clean(ControlError::transport(format!("{path}: {m}"))))?;
        parse_response(resp.status, &resp.headers, &resp.body).map_err(clean)
    }

    /// Creates an upstream subscription; returns its id.
    pub async fn create(&self, req: &CreateRequest) -> Result<String, ControlError> {
        let i = &self.inner;
        let body = req.body(&i.client_id, &i.source_id, SystemTime::now());
        created_id(
            self.call(Method::POST, CREATE_PATH, &[], Some(&body))
                .await?,
        )
    }

    /// Cancels an upstream subscription: `Ok(true)` if it was cancelled,
    /// `Ok(false)` if the server did not know it (gone already).
    pub async fn cancel(&self, id: &str) -> Result<bool, ControlError> {
        let body = json!({ "subId": id });
        match self.call(Method::POST, CANCEL_PATH, &[], Some(&body)).await {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    normalize(&e.code).as_str(),
                    "PERSONAL_EVENT_NOT_FOUND" | "NOT_FOUND"
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Every upstream subscription of this client id and source id, page by
    /// page.
    pub async fn list(&self) -> Result<Vec<ListedSubscription>, ControlError> {
        let i = &self.inner;
        let mut seen = HashSet::new();
        let mut out = vec![];
        for page_no in 1..=MAX_PAGES {
            let query = [
                ("clientId", i.client_id.clone()),
                ("sourceId", i.source_id.clone()),
                ("pageSize", PAGE_SIZE.to_string()),
                ("pageNo", page_no.to_string()),
            ];
            let result = self.call(Method::GET, LIST_PATH, &query, None).await?;
            let page = result.as_ref().and_then(Value::as_object);
            let items = page
                .and_then(|p| p.get("items"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            if items.is_empty() {
                return Ok(out);
            }
            let num = |k: &str| {
                page.and_then(|p| field_str(p, &[k]))
                    .and_then(|s| s.parse::<usize>().ok())
            };
            let total = num("total");
            let page_size = num("pageSize").filter(|n| *n > 0).unwrap_or(PAGE_SIZE);
            let before = out.len();
            for it in items.iter().filter_map(ListedSubscription::parse) {
                if seen.insert(it.sub_id.clone()) {
                    out.push(it);
                }
            }
            if total.is_some_and(|t| out.len() >= t) || items.len() < page_size {
                return Ok(out);
            }
            if out.len() == before {
                return Err(ControlError {
                    http_status: 200,
                    code: "LIST_STALLED".into(),
                    message: format!(
                        "page {page_no} added no new subscription while more were expected"
                    ),
                    ..ControlError::default()
                });
            }
        }
        Err(ControlError {
            http_status: 200,
            code: "LIST_TOO_LONG".into(),
            message: format!("more than {MAX_PAGES} pages"),
            ..ControlError::default()
        })
    }

    /// Create, retrying a retryable failure a little while the consumer
    /// waits; the refusal otherwise.
    async fn create_for_acquire(&self, req: &CreateRequest) -> Result<String, Refusal> {
        let mut retries = 0;
        loop {
            let e = match self.create(req).await {
                Ok(id) => {
                    tracing::info!(upstream_id = %id, event_key = %req.event_key, rule = %req.rule_type, "personal: upstream subscription created");
                    return Ok(id);
                }
                Err(e) => e,
            };
            let delay = e
                .retry_after
                .unwrap_or(INLINE_DELAYS[retries.min(INLINE_RETRIES - 1)]);
            if e.class() == Class::Retryable
                && retries < INLINE_RETRIES
                && delay <= INLINE_MAX_DELAY
            {
                retries += 1;
                tracing::warn!(error = %e.describe(), retry_in = ?delay, "personal: creating the upstream subscription failed; retrying");
                tokio::time::sleep(delay).await;
                continue;
            }
            tracing::warn!(error = %e.describe(), event_key = %req.event_key, "personal: creating the upstream subscription failed");
            return Err(e.refusal(&self.inner.creds.scrub()));
        }
    }

    /// The create task's end: hand the result to every waiter; the
    /// subscription is held once per waiter still there.
    fn created(&self, key: &str, result: Result<String, Refusal>) {
        let mut reg = self.registry();
        let Some(Slot::Creating { waiters }) = reg.slots.remove(key) else {
            return;
        };
        match result {
            Ok(id) => {
                let refs = waiters
                    .into_iter()
                    .filter(|w| !w.is_closed())
                    .map(|w| w.send(Ok(id.clone())).is_ok())
                    .filter(|sent| *sent)
                    .count();
                if refs > 0 {
                    reg.by_id.insert(id.clone(), key.to_owned());
                    reg.slots.insert(key.to_owned(), Slot::Ready { id, refs });
                } else {
                    tracing::info!(upstream_id = %id, "personal: nobody waits for the new upstream subscription any more");
                    self.start_cancel(&mut reg, key, id);
                }
            }
            Err(r) => {
                for w in waiters {
                    let _ = w.send(Err(r.clone()));
                }
            }
        }
    }

    /// Marks `key` cancelling and cancels `id` in the background.
    fn start_cancel(&self, reg: &mut Registry, key: &str, id: String) {
        reg.by_id.remove(&id);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(upstream_id = %id, "personal: no runtime to cancel the upstream subscription");
            reg.slots.remove(key);
            return;
        };
        reg.slots
            .insert(key.to_owned(), Slot::Cancelling { waiters: vec![] });
        let this = self.clone();
        let key = key.to_owned();
        rt.spawn(async move {
            this.cancel_logged(&id).await;
            let mut reg = this.registry();
            if let Some(Slot::Cancelling { waiters }) = reg.slots.remove(&key) {
                for w in waiters {
                    let _ = w.send(());
                }
            }
        });
    }

    async fn cancel_logged(&self, id: &str) {
        match self.cancel(id).await {
            Ok(true) => {
                tracing::info!(upstream_id = %id, "personal: upstream subscription cancelled")
            }
            Ok(false) => {
                tracing::info!(upstream_id = %id, "personal: upstream subscription was gone already")
            }
            Err(e) => {
                tracing::warn!(upstream_id = %id, error = %e.describe(), "personal: cancelling the upstream subscription failed")
            }
        }
    }

    /// Cancels every upstream subscription still held (the bus is
    /// stopping), within `budget`.
    pub async fn cancel_all(&self, budget: Duration) {
        let ids: Vec<String> = {
            let mut reg = self.registry();
            let ready: Vec<(String, String)> = reg
                .slots
                .iter()
                .filter_map(|(k, s)| match s {
                    Slot::Ready { id, .. } => Some((k.clone(), id.clone())),
                    _ => None,
                })
                .collect();
            for (k, id) in &ready {
                reg.slots.remove(k);
                reg.by_id.remove(id);
            }
            ready.into_iter().map(|(_, id)| id).collect()
        };
        if ids.is_empty() {
            return;
        }
        let all = futures_util::future::join_all(ids.iter().map(|id| self.cancel_logged(id)));
        if tokio::time::timeout(budget, all).await.is_err() {
            tracing::warn!(
                count = ids.len(),
                "personal: not every upstream subscription was cancelled before exit"
            );
        }
    }
}

/// What an acquire waits for.
enum Wait {
    Created(oneshot::Receiver<Result<String, Refusal>>),
    Cancelled(oneshot::Receiver<()>),
}

impl UpstreamControl for Control {
    fn acquire<'a>(
        &'a self,
        keys: &'a [String],
        spec: &'a UpstreamSpec,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<String, Refusal>> {
        Box::pin(async move {
            let req = CreateRequest::from_spec(keys, spec, ttl)
                .map_err(|m| Refusal::new(ErrorCode::BadRequest, m))?;
            let key = req.share_key();
            loop {
                let wait = {
                    let mut reg = self.registry();
                    match reg.slots.get_mut(&key) {
                        Some(Slot::Ready { id, refs }) => {
                            *refs += 1;
                            tracing::debug!(upstream_id = %id, refs = *refs, "personal: upstream subscription shared");
                            return Ok(id.clone());
                        }
                        Some(Slot::Creating { waiters }) => {
                            let (tx, rx) = oneshot::channel();
                            waiters.push(tx);
                            Wait::Created(rx)
                        }
                        Some(Slot::Cancelling { waiters }) => {
                            let (tx, rx) = oneshot::channel();
                            waiters.push(tx);
                            Wait::Cancelled(rx)
                        }
                        None => {
                            let (tx, rx) = oneshot::channel();
                            reg.slots
                                .insert(key.clone(), Slot::Creating { waiters: vec![tx] });
                            let this = self.clone();
                            let (req, key) = (req.clone(), key.clone());
                            tokio::spawn(async move {
                                let r = this.create_for_acquire(&req).await;
                                this.created(&key, r);
                            });
                            Wait::Created(rx)
                        }
                    }
                };
                match wait {
                    Wait::Created(rx) => {
                        return rx.await.unwrap_or_else(|_| {
                            Err(Refusal::new(
                                ErrorCode::Internal,
                                "upstream subscription failed: the create call was abandoned",
                            ))
                        })
                    }
                    Wait::Cancelled(rx) => {
                        let _ = rx.await;
                    }
                }
            }
        })
    }

    fn release(&self, upstream_id: &str) {
        let mut reg = self.registry();
        let Some(key) = reg.by_id.get(upstream_id).cloned() else {
            tracing::debug!(
                upstream_id,
                "personal: release of an upstream subscription not held"
            );
            return;
        };
        let last = match reg.slots.get_mut(&key) {
            Some(Slot::Ready { refs, .. }) => {
                *refs = refs.saturating_sub(1);
                *refs == 0
            }
            _ => false,
        };
        if last {
            tracing::info!(
                upstream_id,
                "personal: last local subscription gone: cancelling the upstream one"
            );
            self.start_cancel(&mut reg, &key, upstream_id.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rule: &str) -> UpstreamSpec {
        UpstreamSpec {
            rule_type: rule.into(),
            ..UpstreamSpec::default()
        }
    }

    fn keys(k: &str) -> Vec<String> {
        vec![k.to_owned()]
    }

    #[test]
    fn create_bodies() {
        let s = UpstreamSpec {
            user: "u1".into(),
            query: vec!["hello".into(), "world".into()],
            filter_json: r#"{"field":"sender","op":"eq","value":"x"}"#.into(),
            ..spec("singleChat")
        };
        let r = CreateRequest::from_spec(
            &keys("user_im_message_receive_o2o"),
            &s,
            Duration::from_secs(600),
        )
        .unwrap();
        let now = humantime::parse_rfc3339("2030-01-02T03:04:05Z").unwrap();
        let b = r.body("cid", "open", now);
        assert_eq!(b["clientId"], "cid");
        assert_eq!(b["sourceId"], "open");
        assert_eq!(b["eventKey"], "user_im_message_receive_o2o");
        assert_eq!(b["deliveryPref"], "realtime");
        assert_eq!(b["expiresAt"], "2030-01-02T03:14:05Z");
        let rule: Value = serde_json::from_str(b["filterRule"].as_str().unwrap()).unwrap();
        assert_eq!(rule, json!({"targetUid": "u1", "targetUidType": "staffId"}));
        assert_eq!(b["ext"]["ruleType"], "singleChat");
        assert_eq!(
            b["ext"]["filter"],
            json!({"and": [
                {"field": "payload.body.content", "op": "contains_any", "value": ["hello", "world"]},
                {"field": "payload.body.sender", "op": "eq", "value": "x"},
            ]})
        );
        let idem = b["ext"]["idempotencyKey"].as_str().unwrap();
        assert!(
            idem.starts_with("dws-cli-") && idem.len() == 8 + 16,
            "{idem}"
        );

        let g = CreateRequest::from_spec(
            &keys("user_im_group_updated"),
            &UpstreamSpec {
                group: "cid-1".into(),
                ..spec("group")
            },
            Duration::ZERO,
        )
        .unwrap();
        let b = g.body("cid", "", now);
        assert_eq!(b["filterRule"], r#"{"openConversationId":"cid-1"}"#);
        assert!(b.get("expiresAt").is_none() && b.get("sourceId").is_none());
        assert!(b["ext"].get("filter").is_none());
        let at = CreateRequest::from_spec(
            &keys("user_im_message_receive_at"),
            &spec("at"),
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(at.body("c", "s", now)["filterRule"], "{}");
        let o = CreateRequest::from_spec(
            &keys("k"),
            &UpstreamSpec {
                open_dingtalk_id: "od".into(),
                ..spec("sender")
            },
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(o.rule_param["targetUidType"], "openDingtalkId");

        for (k, s) in [
            (keys("a.*"), spec("at")),
            (vec![], spec("at")),
            (keys("k"), spec("nope")),
            (keys("k"), spec("singleChat")),
            (
                keys("k"),
                UpstreamSpec {
                    group: "g".into(),
                    ..spec("at")
                },
            ),
            (
                keys("k"),
                UpstreamSpec {
                    user: "u".into(),
                    open_dingtalk_id: "o".into(),
                    ..spec("sender")
                },
            ),
            (
                keys("k"),
                UpstreamSpec {
                    filter_json: "[1]".into(),
                    ..spec("at")
                },
            ),
        ] {
            assert!(
                CreateRequest::from_spec(&k, &s, Duration::ZERO).is_err(),
                "{k:?} {s:?}"
            );
        }
    }

    #[test]
    fn sharing_and_idempotency_keys_ignore_key_order_and_ttl() {
        let a = CreateRequest::from_spec(
            &keys("k"),
            &UpstreamSpec {
                filter_json: r#"{"op":"eq","field":"content","value":"x"}"#.into(),
                ..spec("at")
            },
            Duration::from_secs(1),
        )
        .unwrap();
        let b = CreateRequest::from_spec(
            &keys("k"),
            &UpstreamSpec {
                filter_json: r#"{"value":"x","field":"content","op":"eq"}"#.into(),
                ..spec("at")
            },
            Duration::from_secs(99),
        )
        .unwrap();
        assert_eq!(a.share_key(), b.share_key());
        assert_eq!(a.idempotency_key("id"), b.idempotency_key("id"));
        assert_ne!(a.idempotency_key("id"), a.idempotency_key("other"));
        let c = CreateRequest::from_spec(&keys("k"), &spec("at"), Duration::ZERO).unwrap();
        assert_ne!(a.share_key(), c.share_key());
        assert_eq!(
            canonical(&json!({"b": [{"d": 1, "c": 2}], "a": null})),
            r#"{"a":null,"b":[{"c":2,"d":1}]}"#
        );
    }

    fn parse(
        status: u16,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Option<Value>, ControlError> {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        parse_response(status, &h, body.as_bytes())
    }

    #[test]
    fn successes() {
        assert_eq!(parse(200, &[], "").unwrap(), None);
        assert_eq!(parse(204, &[], " \n").unwrap(), None);
        assert_eq!(parse(200, &[], r#"{"success":true}"#).unwrap(), None);
        let r = parse(200, &[], r#"{"success":true,"result":["sub-1"]}"#).unwrap();
        assert_eq!(created_id(r).unwrap(), "sub-1");
        let r = parse(200, &[], r#"{"result":{"subId":"sub-2","eventKey":"k"}}"#).unwrap();
        assert_eq!(created_id(r).unwrap(), "sub-2");
        let r = parse(200, &[], r#"{"subscribe_id":"sub-3"}"#).unwrap();
        assert_eq!(
            created_id(r).unwrap(),
            "sub-3",
            "a non-envelope body is the result"
        );
        let e =
            created_id(parse(200, &[], r#"{"success":true,"result":[]}"#).unwrap()).unwrap_err();
        assert_eq!(e.code, "NO_SUBSCRIPTION_ID");
    }

    #[test]
    fn p_ctl_3_429_with_retry_after_is_retryable_after_45s() {
        let e = parse(429, &[("Retry-After", "45")], "").unwrap_err();
        assert_eq!(
            (e.class(), e.retry_after),
            (Class::Retryable, Some(Duration::from_secs(45)))
        );
        assert_eq!(e.code, "HTTP_429");
        assert!(e.describe().contains("retry after 45s"), "{}", e.describe());
        assert_eq!(e.refusal(&Default::default()).code, ErrorCode::Upstream);
        let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let e = parse(503, &[("Retry-After", &date)], "busy").unwrap_err();
        assert!(
            e.retry_after.is_some_and(|d| d > Duration::from_secs(100)),
            "{e:?}"
        );
    }

    #[test]
    fn p_ctl_4_explicit_retryable_false_wins_and_the_delay_is_kept() {
        let e = parse(
            200,
            &[],
            r#"{"success":false,"errorCode":"RATE_LIMITED","retryable":false,"retryAfterSeconds":30}"#,
        )
        .unwrap_err();
        assert_eq!(e.class(), Class::NonRetryable);
        assert_eq!(e.retry_after, Some(Duration::from_secs(30)));
        assert_eq!(e.code, "RATE_LIMITED");
        let e = parse(429, &[], r#"{"error":{"code":"X","retryable":false}}"#).unwrap_err();
        assert_eq!(e.class(), Class::NonRetryable, "even over a 429");
        let e = parse(200, &[], r#"{"success":false,"errorCode":"RATE_LIMITED"}"#).unwrap_err();
        assert_eq!(
            e.class(),
            Class::Unknown,
            "a 200 business error without flags"
        );
    }

    #[test]
    fn p_ctl_5_already_exists_is_unknown_and_not_adopted() {
        let e = parse(
            400,
            &[("X-Trace-Id", "tr-1")],
            r#"{"error":{"code":"SUBSCRIPTION_ALREADY_EXISTS","message":"exists","details":{"subscribe_id":"sub-old"}}}"#,
        )
        .unwrap_err();
        assert_eq!(e.class(), Class::Unknown);
        assert_eq!(
            (e.subscribe_id.as_str(), e.trace_id.as_str()),
            ("sub-old", "tr-1")
        );
        let d = e.describe();
        assert!(
            d.contains("SUBSCRIPTION_ALREADY_EXISTS: exists") && d.contains("not adopted"),
            "{d}"
        );
    }

    #[test]
    fn classification_table() {
        let e = |status: u16, body: &str| parse(status, &[], body).unwrap_err();
        assert_eq!(e(500, "").class(), Class::Retryable);
        assert_eq!(e(408, "").class(), Class::Retryable);
        assert_eq!(e(425, "").class(), Class::Retryable);
        let auth = e(401, r#"{"code":"authFailed","message":"bad token"}"#);
        assert_eq!(auth.class(), Class::NonRetryable);
        assert!(auth.is_auth());
        assert_eq!(
            auth.refusal(&Default::default()).code,
            ErrorCode::PermissionDenied
        );
        assert!(e(403, "").is_auth());
        assert!(
            !e(401, r#"{"retryable":true,"code":"x"}"#).is_auth(),
            "retryable is not final"
        );
        let biz = e(200, r#"{"success":false,"errorCode":"user-not.found"}"#);
        assert_eq!(
            biz.class(),
            Class::NonRetryable,
            "normalized to USER_NOT_FOUND"
        );
        assert!(!biz.is_auth());
        let perm = e(200, r#"{"success":false,"errorCode":"APP_NO_PERMISSION"}"#);
        assert!(perm.is_auth());
        assert_eq!(e(404, "<html>").class(), Class::NonRetryable);
        assert_eq!(e(418, "").code, "HTTP_418");
        let g = e(200, r#"{"success":false}"#);
        assert_eq!(
            (g.code.as_str(), g.class()),
            ("REQUEST_FAILED", Class::Unknown)
        );
        let t = ControlError::transport("refused".into());
        assert_eq!(t.class(), Class::Retryable);
        let env = e(
            400,
            r#"{"success":false,"error":{"code":"E"},"requestId":"r-9","retry_after_seconds":"3"}"#,
        );
        assert_eq!(
            (env.trace_id.as_str(), env.retry_after),
            ("r-9", Some(Duration::from_secs(3)))
        );
        let args = e(500, r#"{"errorCode":"E","arguments":["trace-a",1]}"#);
        assert_eq!(args.trace_id, "trace-a");
        assert_eq!(e(200, "nope").code, "MALFORMED_RESPONSE");
    }

    #[test]
    fn next_retry_at_takes_the_largest_delay() {
        let now = SystemTime::now();
        let later = humantime::format_rfc3339_seconds(now + Duration::from_secs(90)).to_string();
        let e = parse(
            429,
            &[("Retry-After", "10")],
            &json!({"error": {"code": "RATE_LIMITED", "retry_after_seconds": 5, "next_retry_at": later}}).to_string(),
        )
        .unwrap_err();
        let d = e.retry_after.unwrap();
        assert!(
            d > Duration::from_secs(80) && d <= Duration::from_secs(90),
            "{d:?}"
        );
        let base = humantime::parse_rfc3339("2030-01-01T00:00:00Z").unwrap();
        assert_eq!(
            until_rfc3339("2030-01-01T08:00:30+08:00", base),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            until_rfc3339("2030-01-01T00:00:30.5Z", base),
            Some(Duration::from_millis(30_500))
        );
        assert_eq!(until_rfc3339("2029-01-01T00:00:00Z", base), None);
        assert_eq!(until_rfc3339("garbage", base), None);
    }

    #[test]
    fn listed_subscriptions() {
        let l = ListedSubscription::parse(&json!({"subId": "s", "eventKey": "k", "status": 1}))
            .unwrap();
        assert_eq!((l.sub_id.as_str(), l.status.as_str()), ("s", "active"));
        let l = ListedSubscription::parse(&json!({"subId": "s", "status": "PAUSED"})).unwrap();
        assert_eq!(l.status, "paused");
        assert!(ListedSubscription::parse(&json!({"eventKey": "k"})).is_none());
    }
}

/// The client against the loopback fake's control plane (protocol note §8,
/// P-CTL-1/2/3/6, sharing by reference count).
#[cfg(test)]
mod fake_tests {
    use std::time::Instant;

    use dws_tests::fake_dingtalk::{
        personal::{ControlFault, ControlOp},
        FakeDingTalk,
    };

    use super::*;
    use crate::{
        profile::TokenSource,
        source::stream::{self, net},
    };

    fn control(fake: &FakeDingTalk, token: &str) -> Control {
        let tls = net::tls_config().unwrap();
        let http = net::http_client(&tls, &stream::user_agent(), Duration::from_secs(10)).unwrap();
        let creds = Arc::new(Credentials::new(TokenSource::Fixed(Secret::new(token))));
        Control::new(
            http,
            &format!("{}/dws", fake.base_url()),
            creds,
            "cid-test",
            "open",
        )
    }

    /// Polls `cond` (the fake is observed from another thread) for up to 20 s.
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn at_spec() -> UpstreamSpec {
        UpstreamSpec {
            rule_type: "at".into(),
            query: vec!["deploy".into()],
            ..UpstreamSpec::default()
        }
    }

    #[tokio::test]
    async fn p_ctl_1_create_sends_the_documented_body_and_headers() {
        let fake = FakeDingTalk::start();
        let c = control(&fake, &fake.user_token());
        let req = CreateRequest::from_spec(
            &["user_im_message_receive_at".to_owned()],
            &at_spec(),
            Duration::from_secs(60),
        )
        .unwrap();
        let id = c.create(&req).await.unwrap();
        let rec = &fake.creates()[0];
        assert_eq!(rec.issued.as_deref(), Some(id.as_str()));
        assert_eq!(
            rec.header("x-user-access-token"),
            Some(fake.user_token().as_str())
        );
        assert_eq!(
            rec.header("authorization"),
            Some(format!("Bearer {}", fake.user_token()).as_str())
        );
        assert_eq!(rec.header("x-dws-client-id"), Some("cid-test"));
        assert_eq!(rec.header("x-dws-source-id"), Some("open"));
        assert_eq!(rec.body["filterRule"], "{}", "a JSON string");
        assert_eq!(rec.body["deliveryPref"], "realtime");
        assert_eq!(rec.body["ext"]["ruleType"], "at");
        assert_eq!(rec.body["ext"]["filter"]["value"], json!(["deploy"]));
        assert!(rec.body["expiresAt"].as_str().unwrap().ends_with('Z'));
        let listed = c.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].sub_id.as_str(), listed[0].status.as_str()),
            (id.as_str(), "active")
        );
        assert_eq!(listed[0].event_key, "user_im_message_receive_at");
    }

    #[tokio::test]
    async fn p_ctl_2_cancel_of_an_unknown_id_is_success() {
        let fake = FakeDingTalk::start();
        let c = control(&fake, &fake.user_token());
        assert_eq!(c.cancel("sub-unknown").await, Ok(false));
        let id = fake.seed_subscriptions(1, "cid-test", "open").remove(0);
        assert_eq!(c.cancel(&id).await, Ok(true));
        assert_eq!(c.cancel(&id).await, Ok(false), "twice: gone already");
        fake.fail_next_control(
            ControlOp::Cancel,
            1,
            ControlFault::new(404, r#"{"error":{"code":"NOT_FOUND","message":"no"}}"#),
        );
        assert_eq!(c.cancel("x").await, Ok(false));
        fake.fail_next_control(ControlOp::Cancel, 1, ControlFault::new(500, ""));
        assert_eq!(c.cancel("x").await.unwrap_err().class(), Class::Retryable);
        assert_eq!(fake.cancels().len(), 5);
    }

    #[tokio::test]
    async fn p_ctl_6_list_walks_every_page_without_duplicates() {
        let fake = FakeDingTalk::start();
        let seeded = fake.seed_subscriptions(205, "cid-test", "open");
        let c = control(&fake, &fake.user_token());
        let all = c.list().await.unwrap();
        assert_eq!(all.len(), 205);
        let ids: HashSet<&str> = all.iter().map(|s| s.sub_id.as_str()).collect();
        assert_eq!(ids.len(), 205);
        assert!(seeded.iter().all(|s| ids.contains(s.as_str())));
        let pages: Vec<String> = fake
            .lists()
            .iter()
            .map(|r| r.param("pageNo").unwrap_or("").to_owned())
            .collect();
        assert_eq!(pages, ["1", "2", "3"]);
        let first = &fake.lists()[0];
        assert_eq!(
            (
                first.param("pageSize"),
                first.param("clientId"),
                first.param("sourceId")
            ),
            (Some("100"), Some("cid-test"), Some("open"))
        );

        // A server page size of 50: five pages, stops at total.
        let fake = FakeDingTalk::start();
        fake.seed_subscriptions(205, "cid-test", "open");
        fake.set_list_page_size(50);
        let c = control(&fake, &fake.user_token());
        assert_eq!(c.list().await.unwrap().len(), 205);
        assert_eq!(fake.lists().len(), 5);

        // A page that repeats the previous one is an error, not a loop.
        let fake = FakeDingTalk::start();
        let page = |n: usize| {
            let items: Vec<Value> = (0..n).map(|i| json!({"subId": format!("s{i}")})).collect();
            json!({"success": true, "result": {"total": 300, "pageSize": 100, "items": items}})
                .to_string()
        };
        fake.fail_next_control(ControlOp::List, 2, ControlFault::new(200, page(100)));
        let e = control(&fake, &fake.user_token()).list().await.unwrap_err();
        assert_eq!(e.code, "LIST_STALLED");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn identical_specs_share_one_upstream_subscription() {
        let fake = FakeDingTalk::start();
        let c = control(&fake, &fake.user_token());
        let keys = ["user_im_message_receive_at".to_owned()];
        let spec = at_spec();
        let ttl = Duration::from_secs(60);
        let (a, b) = tokio::join!(c.acquire(&keys, &spec, ttl), c.acquire(&keys, &spec, ttl));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b);
        assert_eq!(
            fake.creates().len(),
            1,
            "one create for two concurrent acquires"
        );
        let other = UpstreamSpec {
            query: vec![],
            ..spec.clone()
        };
        let o = c.acquire(&keys, &other, ttl).await.unwrap();
        assert_ne!(o, a, "a different filter is another subscription");
        assert_eq!(c.acquire(&keys, &spec, ttl).await.unwrap(), a);
        assert_eq!(fake.creates().len(), 2);

        c.release(&a);
        c.release(&a);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(fake.cancels().is_empty(), "still held once");
        c.release(&a);
        eventually("the cancel", || fake.cancels().len() == 1).await;
        assert_eq!(fake.cancels()[0].body["subId"], a.as_str());
        // Acquired again: a new create (the old one is gone).
        let again = c.acquire(&keys, &spec, ttl).await.unwrap();
        assert_ne!(again, a);
        assert_eq!(fake.creates().len(), 3);
        c.release("not-held");
        // The bus stopping cancels what is still held.
        c.cancel_all(Duration::from_secs(5)).await;
        let cancelled: Vec<String> = fake
            .cancels()
            .iter()
            .map(|r| r.body["subId"].as_str().unwrap_or("").to_owned())
            .collect();
        assert_eq!(cancelled.len(), 3, "{cancelled:?}");
        assert!(cancelled.contains(&o) && cancelled.contains(&again));
        assert!(fake.with_state(|s| s.personal.active().is_empty()));
    }

    #[tokio::test]
    async fn acquire_refusals_and_short_retries() {
        let fake = FakeDingTalk::start();
        let keys = ["user_im_message_receive_at".to_owned()];
        let ttl = Duration::from_secs(60);
        let token = "CANARY-token-8e1f";
        fake.set_user_token(token);
        let c = control(&fake, token);

        // Two quick 503s are retried inside the acquire.
        fake.fail_next_control(ControlOp::Create, 2, ControlFault::new(503, ""));
        c.acquire(&keys, &at_spec(), ttl).await.unwrap();
        assert_eq!(fake.creates().len(), 3);

        // P-CTL-3: a long Retry-After is not waited for.
        fake.fail_next_control(
            ControlOp::Create,
            1,
            ControlFault::new(429, "").header("Retry-After", "45"),
        );
        let spec2 = UpstreamSpec {
            query: vec!["x".into()],
            ..at_spec()
        };
        let r = c.acquire(&keys, &spec2, ttl).await.unwrap_err();
        assert_eq!(r.code, ErrorCode::Upstream);
        assert!(
            r.message.starts_with("upstream subscription failed: ")
                && r.message.contains("retry after 45s"),
            "{}",
            r.message
        );
        assert_eq!(fake.creates().len(), 4);

        // An auth failure echoing the token: exit 3, redacted.
        fake.fail_next_control(
            ControlOp::Create,
            1,
            ControlFault::new(
                401,
                format!(
                    r#"{{"error":{{"code":"UNAUTHORIZED","message":"token {token} expired"}}}}"#
                ),
            ),
        );
        let r = c.acquire(&keys, &spec2, ttl).await.unwrap_err();
        assert_eq!(r.code, ErrorCode::PermissionDenied);
        assert!(
            !r.message.contains(token) && r.message.contains("<redacted>"),
            "{}",
            r.message
        );

        // A bad spec never reaches the server.
        let bad = UpstreamSpec {
            rule_type: "group".into(),
            ..UpstreamSpec::default()
        };
        assert_eq!(
            c.acquire(&keys, &bad, ttl).await.unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(fake.creates().len(), 5);
    }
}
