//! The `personal` source: the DingTalk *personal* stream (protocol note §6).
//! A user's access token, not an app secret, buys the WebSocket ticket, and
//! what arrives on the socket is decided by upstream subscriptions that the
//! bus creates and cancels on the user's behalf ([`control`]).
//!
//! 1. Ticket: `POST {ticket_url}` with `x-user-access-token` and
//!    `Authorization: Bearer` (the token), `X-DWS-Client-Id`,
//!    `X-DWS-Source-Id` and the body `{"sourceId", "mode": "normal"}`. The
//!    answer is `{"success":true,"result":{endpoint,ticket}}`, the same under
//!    `data`, or a bare `{endpoint,ticket}`. A network error, 408, 429 or
//!    5xx is a failed attempt (backoff, retry). A 401 re-reads the token
//!    ([`TokenSource::read`]: a token file rewritten by another tool is
//!    picked up) and retries once at once; a second 401 is fatal. 400, 403,
//!    404 and any other status, a malformed answer, an empty endpoint or
//!    ticket, an endpoint that is not `ws`/`wss` with a host: fatal — the
//!    source is lost and the bus ends with SOURCE_LOST.
//! 2. The WebSocket session is the shared runner of [`super::stream`] (acks
//!    after the append, `disconnect`, keepalive, malformed frames skipped and
//!    counted), with backoff 1 s → 30 s, reset after a connection that acked
//!    at least one push, a new ticket for every attempt, and `max_attempts`
//!    consecutive failures making the source lost. The frame `type` is
//!    matched case-insensitively.
//! 3. An EVENT's identity — event id, key, born time, upstream subscription,
//!    source id, rule type — is resolved by [`event::to_event`] from the
//!    several header spellings and the data envelope; the bus routes it to
//!    the local subscriptions bound to its upstream subscription only.
//!
//! The token is never logged nor put in a state, status or error: every
//! message goes through the [`Scrub`] of [`Credentials`], which learns each
//! token value it reads.

pub mod control;
pub mod event;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;

use super::{
    stream::{self, frame::Frame, net, net::Url, one_line, Scrub, Ticket, TicketError},
    Source, SourceContext, SourceFuture, UpstreamControl,
};
use crate::{
    hub::NewEvent,
    profile::{PersonalConfig, Secret, TokenSource},
};

/// The ticket request, whole exchange.
const TICKET_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on cancelling the held upstream subscriptions when the bus stops.
const CANCEL_ON_EXIT: Duration = Duration::from_millis(900);

/// The user access token and everything to redact.
pub struct Credentials {
    source: TokenSource,
    scrub: Mutex<Scrub>,
}

impl Credentials {
    pub fn new(source: TokenSource) -> Credentials {
        Credentials {
            source,
            scrub: Mutex::new(Scrub::default()),
        }
    }

    /// The current token (re-read from its file, if it has one), which is
    /// from now on redacted by [`Credentials::scrub`].
    pub fn token(&self) -> Result<Secret, String> {
        let token = self
            .source
            .read()
            .map_err(|e| format!("cannot read the user access token: {e}"))?;
        if token.expose().is_empty() {
            return Err("the user access token is empty".into());
        }
        self.scrub
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(token.expose());
        Ok(token)
    }

    pub fn scrub(&self) -> Scrub {
        self.scrub.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

pub struct PersonalSource {
    config: PersonalConfig,
    /// TLS and HTTP set up, or why they could not be.
    setup: Result<(Arc<rustls::ClientConfig>, reqwest::Client), String>,
    creds: Arc<Credentials>,
    control: Option<control::Control>,
}

impl PersonalSource {
    pub fn new(config: PersonalConfig) -> PersonalSource {
        let creds = Arc::new(Credentials::new(config.access_token.clone()));
        let setup = net::tls_config().and_then(|tls| {
            let http = net::http_client(&tls, &stream::user_agent(), TICKET_TIMEOUT)?;
            Ok((tls, http))
        });
        let control = setup.as_ref().ok().map(|(_, http)| {
            control::Control::new(
                http.clone(),
                &config.control_base,
                creds.clone(),
                &config.client_id,
                &config.source_id,
            )
        });
        PersonalSource {
            config,
            setup,
            creds,
            control,
        }
    }
}

impl Source for PersonalSource {
    fn kind(&self) -> &'static str {
        "personal"
    }

    fn upstream_control(&self) -> Option<Arc<dyn UpstreamControl>> {
        self.control
            .clone()
            .map(|c| Arc::new(c) as Arc<dyn UpstreamControl>)
    }

    fn run(self: Box<Self>, ctx: SourceContext) -> SourceFuture {
        Box::pin(async move {
            let tuning =
                stream::Tuning::new(Duration::from_secs(1), Duration::from_secs(30)).with_env();
            let policy = stream::Policy {
                keepalive: self.config.keepalive,
                max_attempts: self.config.max_attempts,
                healthy: stream::Healthy::Acked,
                lenient_type: true,
            };
            let setup = self.setup.and_then(|(tls, http)| {
                let ticket_url = Url::parse(&self.config.ticket_url)
                    .map_err(|e| format!("invalid ticket_url: {e}"))?;
                Ok((tls, http, ticket_url))
            });
            let (tls, http, ticket_url) = match setup {
                Ok(v) => v,
                Err(e) => return stream::source_lost(&ctx.hub, 0, &e),
            };
            let upstream = Personal {
                config: self.config,
                creds: self.creds,
                http,
                ticket_url,
            };
            stream::run(upstream, policy, tuning, tls, ctx).await;
            // The bus is stopping: the upstream subscriptions it holds would
            // outlive it (its subscriptions are in memory); cancel them.
            if let Some(c) = self.control {
                c.cancel_all(CANCEL_ON_EXIT).await;
            }
        })
    }
}

/// The personal stream's half of the runner: the ticket and EVENT identity.
struct Personal {
    config: PersonalConfig,
    creds: Arc<Credentials>,
    http: reqwest::Client,
    ticket_url: Url,
}

impl stream::Upstream for Personal {
    fn name(&self) -> &'static str {
        "personal"
    }

    async fn ticket(&self) -> Result<Ticket, TicketError> {
        let mut refreshed = false;
        loop {
            let token = self.creds.token().map_err(TicketError::Retry)?;
            let headers =
                control::auth_headers(&token, &self.config.client_id, &self.config.source_id)
                    .map_err(TicketError::Fatal)?;
            let body = serde_json::json!({"sourceId": self.config.source_id, "mode": "normal"});
            let req = self
                .http
                .post(self.ticket_url.to_string())
                .headers(headers)
                .json(&body);
            tracing::debug!(url = %self.ticket_url.redacted(), "personal: ticket request");
            let resp = net::send(&self.ticket_url, req)
                .await
                .map_err(|e| TicketError::Retry(format!("ticket request failed: {e}")))?;
            let status = resp.status;
            let detail = error_detail(&resp.body);
            return Err(match status {
                200..=299 => {
                    return parse_ticket(&resp.body)
                        .map_err(|e| TicketError::Fatal(format!("ticket response unusable: {e}")))
                }
                401 if !refreshed => {
                    refreshed = true;
                    tracing::warn!(
                        "personal: ticket request refused with HTTP 401: re-reading the access token, retrying once"
                    );
                    continue;
                }
                401 => TicketError::Fatal(format!(
                    "ticket request refused: HTTP 401{detail} (again after re-reading the access token)"
                )),
                408 | 429 | 500.. => {
                    TicketError::Retry(format!("ticket request failed: HTTP {status}{detail}"))
                }
                _ => TicketError::Fatal(format!("ticket request refused: HTTP {status}{detail}")),
            });
        }
    }

    fn event(&self, f: &Frame) -> Result<NewEvent, String> {
        event::to_event(f, &self.config.source_id)
    }

    fn scrub(&self) -> Scrub {
        self.creds.scrub()
    }
}

/// `: CODE: message` from an error body (envelope or flat), or its first
/// 200 characters; empty for an empty body.
fn error_detail(body: &[u8]) -> String {
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

/// `{endpoint, ticket}` from a successful ticket response: under `result`,
/// under `data`, or bare. `success` is not looked at.
fn parse_ticket(body: &[u8]) -> Result<Ticket, String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| "not JSON".to_owned())?;
    let obj = ["result", "data"]
        .iter()
        .find_map(|k| v.get(*k).filter(|o| o.is_object()))
        .unwrap_or(&v);
    if !obj.is_object() {
        return Err("not a JSON object".into());
    }
    let field = |k: &str| {
        obj.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let (endpoint, ticket) = (field("endpoint"), field("ticket"));
    if endpoint.is_empty() {
        return Err("no endpoint".into());
    }
    if ticket.is_empty() {
        return Err("no ticket".into());
    }
    let endpoint = stream::parse_endpoint(&endpoint)?;
    Ok(Ticket { endpoint, ticket })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_shapes() {
        for body in [
            r#"{"success":true,"result":{"endpoint":"ws://127.0.0.1:9/connect","ticket":"t-1"}}"#,
            r#"{"data":{"endpoint":"ws://127.0.0.1:9/connect","ticket":"t-1"}}"#,
            r#"{"endpoint":"ws://127.0.0.1:9/connect","ticket":"t-1"}"#,
        ] {
            let t = parse_ticket(body.as_bytes()).unwrap();
            assert_eq!(
                (t.endpoint.to_string(), t.ticket.as_str()),
                ("ws://127.0.0.1:9/connect".to_owned(), "t-1"),
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
            let e = parse_ticket(body.as_bytes()).err().unwrap();
            assert!(e.contains(why), "{body}: {e}");
        }
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

    #[test]
    fn credentials_learn_the_tokens_they_read() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("tok");
        std::fs::write(&f, "TOKEN-one\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Credentials::new(TokenSource::File(f.clone()));
        assert_eq!(c.token().unwrap().expose(), "TOKEN-one");
        std::fs::write(&f, "TOKEN-two").unwrap();
        assert_eq!(c.token().unwrap().expose(), "TOKEN-two");
        assert_eq!(
            c.scrub().clean("a TOKEN-one b TOKEN-two"),
            "a <redacted> b <redacted>"
        );
        std::fs::write(&f, "").unwrap();
        assert!(c.token().is_err());
    }
}
