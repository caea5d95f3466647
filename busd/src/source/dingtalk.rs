//! The `dingtalk` source: the DingTalk Stream *app* protocol.
//!
//! A ticket comes from `POST {open_api}/v1.0/gateway/connections/open` with
//! the app's `clientId`/`clientSecret` and the subscriptions (`EVENT *`, plus
//! the `SYSTEM` topics) → `{endpoint, ticket}`; an empty `endpoint` or
//! `ticket` is a failed attempt, and so is any error status: the app profile
//! retries every failure with backoff (SDK parity), until `max_attempts`.
//! An EVENT is keyed by its `eventId`/`eventType`/`eventBornTime`/… headers
//! and deduplicated per `(dingtalk, eventId)`.
//!
//! The WebSocket session — acks, `disconnect`, keepalive, backoff 1 s → 60 s
//! with jitter, reset after a connection that received a frame or lasted
//! 30 s, secrets scrubbed from every message — is the shared runner of
//! [`super::stream`], where the protocol rules are listed.

use std::time::Duration;

use super::{
    stream::{self, frame::Frame, net, net::Url, one_line, Scrub, Ticket, TicketError},
    Source, SourceContext, SourceFuture,
};
use crate::{
    hub::{now_ms, NewEvent},
    profile::DingTalkConfig,
};

/// Dedup scope of DingTalk app events in the bus log.
pub const SCOPE: &str = "dingtalk";
/// Path of the open call, below the configured `open_api` base.
pub const OPEN_PATH: &str = "/v1.0/gateway/connections/open";
/// Whole open exchange (connect, TLS, request, response).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

pub struct DingTalkSource {
    pub config: DingTalkConfig,
}

impl Source for DingTalkSource {
    fn kind(&self) -> &'static str {
        "dingtalk"
    }

    fn run(self: Box<Self>, ctx: SourceContext) -> SourceFuture {
        Box::pin(async move {
            let tuning =
                stream::Tuning::new(Duration::from_secs(1), Duration::from_secs(60)).with_env();
            let policy = stream::Policy {
                keepalive: self.config.keepalive,
                max_attempts: self.config.max_attempts,
                healthy: stream::Healthy::Frame,
                lenient_type: false,
            };
            let setup = net::tls_config().and_then(|tls| {
                let http = net::http_client(&tls, &stream::user_agent(), OPEN_TIMEOUT)?;
                let open_url = Url::parse(&format!("{}{OPEN_PATH}", self.config.open_api))
                    .map_err(|e| format!("invalid open_api URL: {e}"))?;
                Ok((tls, http, open_url))
            });
            let (tls, http, open_url) = match setup {
                Ok(v) => v,
                Err(e) => return stream::source_lost(&ctx.hub, 0, &e),
            };
            let app = App {
                scrub: Scrub::new(self.config.client_secret.expose()),
                config: self.config,
                http,
                open_url,
            };
            stream::run(app, policy, tuning, tls, ctx).await;
        })
    }
}

/// The app stream's half of the runner: the open call and EVENT keys.
struct App {
    config: DingTalkConfig,
    http: reqwest::Client,
    open_url: Url,
    scrub: Scrub,
}

impl stream::Upstream for App {
    fn name(&self) -> &'static str {
        "dingtalk"
    }

    async fn ticket(&self) -> Result<Ticket, TicketError> {
        tracing::debug!(url = %self.open_url.redacted(), "dingtalk: open call");
        self.open().await.map_err(TicketError::Retry)
    }

    fn event(&self, f: &Frame) -> Result<NewEvent, String> {
        to_event(f).ok_or_else(|| "missing or invalid eventType".to_owned())
    }

    fn scrub(&self) -> Scrub {
        self.scrub.clone()
    }
}

impl App {
    /// `POST …/connections/open` → endpoint and ticket.
    async fn open(&self) -> Result<Ticket, String> {
        let body = serde_json::json!({
            "clientId": self.config.client_id,
            "clientSecret": self.config.client_secret.expose(),
            "subscriptions": [
                {"type": "EVENT", "topic": "*"},
                {"type": "SYSTEM", "topic": "ping"},
                {"type": "SYSTEM", "topic": "disconnect"},
            ],
            "ua": stream::user_agent(),
        });
        let req = self
            .http
            .post(self.open_url.to_string())
            .header(reqwest::header::ACCEPT, "application/json")
            .json(&body);
        let resp = net::send(&self.open_url, req)
            .await
            .map_err(|e| format!("open failed: {e}"))?;
        let json: Option<serde_json::Value> = serde_json::from_slice(&resp.body).ok();
        if resp.status != 200 {
            let text = |k: &str| {
                json.as_ref()
                    .and_then(|j| j.get(k))
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_owned()
            };
            let (code, message) = (text("code"), text("message"));
            let detail = if code.is_empty() && message.is_empty() {
                one_line(&String::from_utf8_lossy(&resp.body), 200)
            } else {
                one_line(&format!("{code}: {message}"), 200)
            };
            return Err(format!("open failed: {} {detail}", resp.status)
                .trim_end()
                .to_owned());
        }
        let Some(json) = json else {
            return Err("open failed: 200 but the response is not JSON".into());
        };
        let field = |k: &str| {
            json.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        let (endpoint, ticket) = (field("endpoint"), field("ticket"));
        if endpoint.is_empty() {
            return Err("open failed: 200 but the response has no endpoint".into());
        }
        if ticket.is_empty() {
            return Err("open failed: 200 but the response has no ticket".into());
        }
        let endpoint =
            stream::parse_endpoint(&endpoint).map_err(|e| format!("open failed: {e}"))?;
        Ok(Ticket { endpoint, ticket })
    }
}

/// The bus event for an EVENT frame; `None` without a usable `eventType`.
fn to_event(f: &Frame) -> Option<NewEvent> {
    let event_type = f.header("eventType");
    if !proto::pattern::is_valid_event_type(event_type) {
        return None;
    }
    let ms = |k: &str| f.header(k).trim().parse::<i64>().ok().filter(|v| *v > 0);
    Some(NewEvent {
        scope: SCOPE.into(),
        event_id: f.header("eventId").to_owned(),
        event_type: event_type.to_owned(),
        event_born_time: ms("eventBornTime")
            .or_else(|| ms("time"))
            .unwrap_or_else(now_ms),
        event_corp_id: f.header("eventCorpId").to_owned(),
        event_unified_app_id: f.header("eventUnifiedAppId").to_owned(),
        source_id: SCOPE.into(),
        data: f.data.clone(),
        headers: f.headers.clone(),
        ..NewEvent::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::stream::frame;

    #[test]
    fn events_need_a_valid_type() {
        let f = frame::parse(
            r#"{"type":"EVENT","headers":{"messageId":"m","eventId":"e1","eventType":"user_add_org","eventBornTime":"1700000000100","eventCorpId":"c","eventUnifiedAppId":"u","x-extra":"1"},"data":"{}"}"#,
        )
        .unwrap();
        let e = to_event(&f).unwrap();
        assert_eq!(
            (
                e.event_id.as_str(),
                e.event_type.as_str(),
                e.event_born_time
            ),
            ("e1", "user_add_org", 1_700_000_000_100)
        );
        assert_eq!(
            (
                e.event_corp_id.as_str(),
                e.event_unified_app_id.as_str(),
                e.scope.as_str()
            ),
            ("c", "u", SCOPE)
        );
        assert_eq!(e.headers["x-extra"], "1");
        let f =
            frame::parse(r#"{"type":"EVENT","headers":{"messageId":"m","eventType":"bad type"}}"#)
                .unwrap();
        assert!(to_event(&f).is_none());
    }
}
