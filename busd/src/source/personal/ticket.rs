//! The ticket request with a user access token, in the reference CLI's two
//! flavours:
//!
//! - [`Flavor::Personal`] (`internal/event/source/personal.go`
//!   `fetchTicketAttempt`): `x-user-access-token`, `Authorization: Bearer`,
//!   `X-DWS-Client-Id`, `X-DWS-Source-Id`; body `{"sourceId","mode"}`. The
//!   answer's `{endpoint, ticket}` is under `result`, under `data` or bare
//!   (`success` is not looked at); a ticket already in the endpoint's query
//!   is kept (`endpointWithTicket`).
//! - [`Flavor::Portal`], the app stream's portal ticket mode
//!   (`internal/event/source/portal_ticket.go` `requestPortalTicketAttempt`):
//!   `x-user-access-token` and `User-Agent: dws-event-consume`; body
//!   `{"sourceId","channelType","mode"}` (`channelType` repeats `sourceId`).
//!   The answer is a bare `{endpoint, ticket}`, else an envelope whose
//!   `success: false` is fatal; the ticket always replaces one in the
//!   endpoint.
//!
//! In the `custom` mode both add `clientId` and `clientSecret` to the body.
//! Outcomes (both): 2xx with a usable answer → the ticket; a network error,
//! 408, 429 or 5xx → a failed attempt (retried); 401 → the rejected token
//! goes through [`Credentials::refresh_rejected`] and the request is
//! retried once — with a refreshed token, or with a newer token found in
//! the token file — and a second 401 is fatal; without a refresh token and
//! without a newer token the first 401 is fatal (the reference has nothing
//! to retry with either), its reason saying that a refresh token would have
//! helped. An unreadable or empty token is fatal. A refresh that fails transiently is a failed
//! attempt, one that fails for good is fatal; 400, 403, 404 and any other
//! status, a malformed answer, an empty endpoint or ticket, an endpoint
//! that is not `ws`/`wss` with a host: fatal.

use std::sync::Arc;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, USER_AGENT};
use serde_json::Value;

use super::{
    config::TicketMode,
    credentials::{Credentials, Refreshed},
};
use crate::{
    section::Secret,
    source::stream::{self, net, net::Url, one_line, Ticket, TicketError},
};

/// The `User-Agent` of the portal ticket request and WebSocket dial.
pub const PORTAL_USER_AGENT: &str = "dws-event-consume";

/// Which reference flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Personal,
    Portal,
}

pub struct TicketClient {
    pub flavor: Flavor,
    pub url: Url,
    pub http: reqwest::Client,
    pub creds: Arc<Credentials>,
    pub client_id: String,
    pub client_secret: Option<Secret>,
    pub source_id: String,
    pub mode: TicketMode,
}

/// One ticket call's result.
enum Call {
    Done(Result<Ticket, TicketError>),
    /// HTTP 401, with the detail of its body.
    Unauthorized(String),
}

/// A header value that holds a secret (never printed by reqwest).
pub fn secret_header(v: &str) -> Result<HeaderValue, HeaderError> {
    HeaderValue::from_str(v)
        .map(|mut v| {
            v.set_sensitive(true);
            v
        })
        .map_err(|_| HeaderError::Token)
}

/// A plain header value, or why it cannot be one.
pub fn header_value(name: &str, v: &str) -> Result<HeaderValue, HeaderError> {
    HeaderValue::from_str(v).map_err(|_| HeaderError::Value {
        name: name.to_owned(),
        value: v.to_owned(),
    })
}

/// A value that cannot be sent in an HTTP header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The token (not echoed).
    #[error("the user access token is not a valid HTTP header value")]
    Token,
    #[error("{name} {value:?} is not a valid HTTP header value")]
    Value { name: String, value: String },
}

/// Why a ticket answer holds no usable ticket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("not JSON")]
    NotJson,
    #[error("not a JSON object")]
    NotObject,
    #[error("no endpoint")]
    NoEndpoint,
    #[error("no ticket")]
    NoTicket,
    #[error(transparent)]
    Endpoint(#[from] stream::EndpointError),
    /// The portal's `errorCode`/`errorMsg` (one line, capped).
    #[error("{0}")]
    Refused(String),
}

impl TicketClient {
    /// Obtains a ticket (one refresh-and-retry on 401).
    pub async fn ticket(&self) -> Result<Ticket, TicketError> {
        // An unreadable or empty token is fatal, like the reference's
        // `resolveSourceAccessToken` (personal.go:319-334).
        let token = self
            .creds
            .usable_token()
            .await
            .map_err(|e| TicketError::Fatal(e.to_string()))?;
        let detail = match self.call(&token).await {
            Call::Done(r) => return r,
            Call::Unauthorized(detail) => detail,
        };
        let refused = format!("ticket request refused: HTTP 401{detail}");
        let (retry_with, after) = match self.creds.refresh_rejected(&token).await {
            Refreshed::Token { token, refreshed } => (
                token,
                if refreshed {
                    "after refreshing the access token"
                } else {
                    "after re-reading the access token"
                },
            ),
            Refreshed::NoRefreshToken => {
                // Nothing to retry with: the reference, without a refresh,
                // ends here too (personal.go:223-247).
                return Err(TicketError::Fatal(format!(
                    "{refused} (the token file holds no newer token; a refresh token \
                     (refresh_token_file or DWS_USER_REFRESH_TOKEN) would let the bus refresh it)"
                )));
            }
            Refreshed::Failed(e) if e.transient => {
                return Err(TicketError::Retry(format!("{refused}; {}", e.message)))
            }
            Refreshed::Failed(e) => {
                return Err(TicketError::Fatal(format!("{refused}; {}", e.message)))
            }
        };
        tracing::warn!(
            source = self.name(),
            "ticket request refused with HTTP 401: retrying once {after}"
        );
        match self.call(&retry_with).await {
            Call::Done(r) => r,
            Call::Unauthorized(detail) => {
                let hint = if self.creds.has_refresh_token() {
                    ""
                } else {
                    "; a refresh token (refresh_token_file or DWS_USER_REFRESH_TOKEN) would let the bus refresh it"
                };
                Err(TicketError::Fatal(format!(
                    "ticket request refused: HTTP 401{detail} (again {after}{hint})"
                )))
            }
        }
    }

    fn name(&self) -> &'static str {
        match self.flavor {
            Flavor::Personal => "personal",
            Flavor::Portal => "dingtalk",
        }
    }

    fn request(&self, token: &Secret) -> Result<reqwest::RequestBuilder, HeaderError> {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT, HeaderValue::from_static("application/json"));
        h.insert(
            HeaderName::from_static("x-user-access-token"),
            secret_header(token.expose())?,
        );
        let mut body = serde_json::json!({ "sourceId": self.source_id });
        match self.flavor {
            Flavor::Personal => {
                h.insert(
                    AUTHORIZATION,
                    secret_header(&format!("Bearer {}", token.expose()))?,
                );
                h.insert(
                    HeaderName::from_static("x-dws-client-id"),
                    header_value("client_id", &self.client_id)?,
                );
                h.insert(
                    HeaderName::from_static("x-dws-source-id"),
                    header_value("source_id", &self.source_id)?,
                );
            }
            Flavor::Portal => {
                h.insert(USER_AGENT, HeaderValue::from_static(PORTAL_USER_AGENT));
                body["channelType"] = Value::String(self.source_id.clone());
            }
        }
        body["mode"] = Value::String(self.mode.as_str().to_owned());
        if self.mode == TicketMode::Custom {
            body["clientId"] = Value::String(self.client_id.clone());
            body["clientSecret"] = Value::String(
                self.client_secret
                    .as_ref()
                    .map(|s| s.expose().to_owned())
                    .unwrap_or_default(),
            );
        }
        Ok(self.http.post(self.url.as_str()).headers(h).json(&body))
    }

    async fn call(&self, token: &Secret) -> Call {
        let req = match self.request(token) {
            Ok(r) => r,
            Err(e) => return Call::Done(Err(TicketError::Fatal(e.to_string()))),
        };
        tracing::debug!(source = self.name(), url = %net::redacted(&self.url), "ticket request");
        let resp = match net::send(&self.url, req).await {
            Ok(r) => r,
            Err(e) => {
                return Call::Done(Err(TicketError::Retry(format!(
                    "ticket request failed: {e}"
                ))))
            }
        };
        let status = resp.status;
        let detail = error_detail(&resp.body);
        Call::Done(Err(match status {
            200..=299 => {
                let parsed = match self.flavor {
                    Flavor::Personal => parse_personal(&resp.body),
                    Flavor::Portal => parse_portal(&resp.body),
                };
                return Call::Done(
                    parsed
                        .map_err(|e| TicketError::Fatal(format!("ticket response unusable: {e}"))),
                );
            }
            401 => return Call::Unauthorized(detail),
            408 | 429 | 500.. => {
                TicketError::Retry(format!("ticket request failed: HTTP {status}{detail}"))
            }
            _ => TicketError::Fatal(format!("ticket request refused: HTTP {status}{detail}")),
        }))
    }
}

/// `: CODE: message` from an error body (envelope or flat), or its first
/// 200 characters; empty for an empty body.
pub fn error_detail(body: &[u8]) -> String {
    let text = |v: &Value, keys: &[&str]| {
        keys.iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str).filter(|s| !s.is_empty()))
            .unwrap_or("")
            .to_owned()
    };
    let detail = match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            let e = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
            let code = text(e, &["code", "errorCode"]);
            let msg = text(e, &["message", "errorMsg", "msg"]);
            [code, msg]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(": ")
        }
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    let detail = one_line(&detail, 200);
    if detail.is_empty() {
        detail
    } else {
        format!(": {detail}")
    }
}

fn pair(obj: &Value) -> (String, String) {
    let field = |k: &str| {
        obj.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    (field("endpoint"), field("ticket"))
}

fn ticket_from(
    endpoint: String,
    ticket: String,
    keep_embedded: bool,
) -> Result<Ticket, AnswerError> {
    if endpoint.is_empty() {
        return Err(AnswerError::NoEndpoint);
    }
    if ticket.is_empty() {
        return Err(AnswerError::NoTicket);
    }
    Ok(Ticket {
        endpoint: stream::parse_endpoint(&endpoint)?,
        ticket,
        keep_embedded,
    })
}

/// The personal answer: under `result`, under `data`, or bare.
pub fn parse_personal(body: &[u8]) -> Result<Ticket, AnswerError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| AnswerError::NotJson)?;
    let obj = ["result", "data"]
        .iter()
        .find_map(|k| v.get(*k).filter(|o| o.is_object()))
        .unwrap_or(&v);
    if !obj.is_object() {
        return Err(AnswerError::NotObject);
    }
    let (endpoint, ticket) = pair(obj);
    ticket_from(endpoint, ticket, true)
}

/// The portal answer: a bare pair first, else the envelope.
pub fn parse_portal(body: &[u8]) -> Result<Ticket, AnswerError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| AnswerError::NotJson)?;
    if !v.is_object() {
        return Err(AnswerError::NotObject);
    }
    let (endpoint, ticket) = pair(&v);
    if !endpoint.is_empty() && !ticket.is_empty() {
        return ticket_from(endpoint, ticket, false);
    }
    if v.get("success").and_then(Value::as_bool) != Some(true) {
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        return Err(AnswerError::Refused(one_line(
            &format!("the portal said {} {}", text("errorCode"), text("errorMsg")),
            200,
        )));
    }
    let (endpoint, ticket) = v.get("result").map(pair).unwrap_or_default();
    ticket_from(endpoint, ticket, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn personal_shapes() {
        for body in [
            r#"{"success":true,"result":{"endpoint":"ws://127.0.0.1:9/connect","ticket":"t-1"}}"#,
            r#"{"data":{"endpoint":"ws://127.0.0.1:9/connect","ticket":"t-1"}}"#,
            r#"{"endpoint":"ws://127.0.0.1:9/connect","ticket":"t-1"}"#,
        ] {
            let t = parse_personal(body.as_bytes()).unwrap();
            assert_eq!(
                (t.endpoint.as_str(), t.ticket.as_str(), t.keep_embedded),
                ("ws://127.0.0.1:9/connect", "t-1", true),
                "{body}"
            );
        }
        for (body, why) in [
            (
                r#"{"success":true,"result":{"endpoint":"","ticket":""}}"#,
                "no endpoint",
            ),
            (
                r#"{"result":{"endpoint":"ws://127.0.0.1:9/c"}}"#,
                "no ticket",
            ),
            (
                r#"{"endpoint":"https://127.0.0.1/c","ticket":"t"}"#,
                "not ws/wss",
            ),
            (r#"{"endpoint":"wss:///c","ticket":"t"}"#, "no host"),
            (
                r#"{"endpoint":"ws://example.com/c","ticket":"t"}"#,
                "loopback",
            ),
            ("<html>", "not JSON"),
            ("[1]", "not a JSON object"),
        ] {
            let e = parse_personal(body.as_bytes()).err().unwrap();
            assert!(e.to_string().contains(why), "{body}: {e}");
        }
    }

    #[test]
    fn portal_shapes() {
        let t = parse_portal(br#"{"endpoint":"ws://127.0.0.1:9/c","ticket":"t"}"#).unwrap();
        assert!(!t.keep_embedded);
        let t = parse_portal(
            br#"{"success":true,"result":{"endpoint":"ws://127.0.0.1:9/c","ticket":"t2"}}"#,
        )
        .unwrap();
        assert_eq!(t.ticket, "t2");
        let e = parse_portal(br#"{"success":false,"errorCode":"NO_AUTH","errorMsg":"no"}"#)
            .err()
            .unwrap();
        assert!(e.to_string().contains("NO_AUTH no"), "{e}");
        let e = parse_portal(br#"{"data":{"endpoint":"ws://127.0.0.1:9/c","ticket":"t"}}"#)
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("the portal said"),
            "the portal reads no `data`: {e}"
        );
    }

    #[test]
    fn error_details() {
        assert_eq!(
            error_detail(br#"{"success":false,"errorCode":"X","errorMsg":"no"}"#),
            ": X: no"
        );
        assert_eq!(
            error_detail(br#"{"error":{"code":"E","message":"m"}}"#),
            ": E: m"
        );
        assert_eq!(error_detail(b"bad\ngateway"), ": bad gateway");
        assert_eq!(error_detail(b""), "");
    }
}
