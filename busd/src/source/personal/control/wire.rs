//! The control plane's wire format: response envelopes and their errors
//! (the reference's `internal/event/personal/client.go` `do`,
//! `decodeAPIError`, `withHTTPResponseDetails`), the create result, and
//! listed subscriptions.
//!
//! - Non-2xx: an error from the body (an `error` object, envelope
//!   `errorCode`/`errorMsg`, or a flat `{code, message}`), else `HTTP_<n>`.
//! - 2xx, empty body: success without a result.
//! - 2xx with an envelope (any of `success`, `error`, `result`,
//!   `errorCode`, `errorMsg`): `success: false`, or no `success` and an
//!   `error`, is an error; else `result`.
//! - 2xx without an envelope: the body is the result.
//!
//! The retry delay is the largest of `retry_after_seconds`,
//! `next_retry_at − now` and `Retry-After` (seconds or an HTTP date).

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use serde_json::{Map, Value};

use super::error::ControlError;

fn field<'a>(o: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| o.get(*k).filter(|v| !v.is_null()))
}

pub(super) fn field_str(o: &Map<String, Value>, keys: &[&str]) -> Option<String> {
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
pub(super) fn created_id(result: Option<Value>) -> Result<String, ControlError> {
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
    /// `gmtCreate` (a string in the reference's list item) or `created_at`.
    pub created_at: String,
}

impl ListedSubscription {
    pub fn parse(v: &Value) -> Option<ListedSubscription> {
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
            created_at: s(&["gmtCreate", "created_at"]),
        })
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::{HeaderName, HeaderValue};
    use serde_json::json;

    use super::*;
    use crate::source::personal::control::error::Class;
    use proto::v1::ErrorCode;

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
        let l = ListedSubscription::parse(
            &json!({"subId": "s", "gmtCreate": "2030-01-02 03:04:05", "status": "1"}),
        )
        .unwrap();
        assert_eq!(
            (l.created_at.as_str(), l.status.as_str()),
            ("2030-01-02 03:04:05", "active")
        );
    }
}
