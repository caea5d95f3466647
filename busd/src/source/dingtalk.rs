//! The `dingtalk` source: the DingTalk Stream *app* protocol, with two ways
//! to get a ticket.
//!
//! - **`connections/open`** (default; the official SDKs): `POST
//!   {open_api}/v1.0/gateway/connections/open` with the app's
//!   `clientId`/`clientSecret` and the subscriptions (`EVENT *`, plus the
//!   `SYSTEM` topics) → `{endpoint, ticket}`; an empty `endpoint` or
//!   `ticket` is a failed attempt, and so is any error status — except
//!   that a *first* open refused with a 4xx other than 408 and 429
//!   (`authFailed`) ends the source, as the reference's first `Start`
//!   does; otherwise every failure is retried with backoff (the SDK's
//!   reconnect loop), until `max_attempts`. Frames follow the SDKs ([`stream::Frames::Sdk`]):
//!   WebSocket pings every `keepalive` (30 s), backoff 1 s → 60 s reset
//!   after a connection that received a frame or lasted 30 s.
//! - **The portal ticket mode** (`stream_ticket_mode = "normal"` or
//!   `"custom"`; the reference CLI's `--stream-ticket-mode`,
//!   `internal/event/source/portal_ticket.go`): the ticket comes from the
//!   MCP portal's ticket endpoint with the *user's* access token
//!   ([`super::personal::ticket`], flavour `Portal`: `channelType` in the
//!   body, `User-Agent: dws-event-consume`, also on the WebSocket dial);
//!   `normal` needs no app credentials, `custom` sends the app's client id
//!   and secret. As in the reference: every frame is acked 200
//!   ([`stream::Frames::AckAll`]), no WebSocket pings unless `keepalive` is
//!   set, backoff 1 s → 30 s reset after an ack, a handshake refused with
//!   a status other than 408, 429 or 5xx ends the source, and a 401 on the
//!   ticket refreshes the token once (settings shared with the personal
//!   source: `access_token_file`, `refresh_token_file`, `oauth_url`,
//!   `mcp_base`, `ticket_url`, `source_id`).
//!
//! Either way an event is keyed by its `eventId`/`eventType`/
//! `eventBornTime`/… headers and deduplicated per `(dingtalk, eventId)`; a
//! frame without a valid `eventType` is acked 200 (as the SDKs do) and
//! counted unroutable. The session rules are those of [`super::stream`].

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use super::{
    personal::{
        config::{self as user_config, TicketMode, UserAuth},
        credentials::Credentials,
        ticket::{Flavor, TicketClient, PORTAL_USER_AGENT},
    },
    stream::{self, frame::Frame, net, net::Url, one_line, Scrub, Ticket, TicketError, Unroutable},
    Source, SourceContext, SourceFuture,
};
use crate::{
    clock::now_ms,
    hub::NewEvent,
    section::{ConfigError, Secret, SectionReader},
};

/// Dedup scope of DingTalk app events in the bus log.
pub const SCOPE: &str = "dingtalk";
/// Path of the open call, below the configured `open_api` base.
pub const OPEN_PATH: &str = "/v1.0/gateway/connections/open";
/// Whole open exchange (connect, TLS, request, response).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// The portal ticket request (the reference's 20 s).
const PORTAL_TIMEOUT: Duration = Duration::from_secs(20);

/// Reasons of unroutable app frames.
pub const NO_EVENT_TYPE: &str = "no eventType";
pub const INVALID_EVENT_TYPE: &str = "invalid eventType";

#[derive(Debug, Clone)]
pub struct DingTalkConfig {
    /// The app key; may be empty in the portal's `normal` mode.
    pub client_id: String,
    /// Required for `connections/open` and the portal's `custom` mode.
    pub client_secret: Option<Secret>,
    /// Base URL of the OpenAPI gateway (`https://api.dingtalk.com`); plain
    /// `http://` is accepted only for loopback hosts.
    pub open_api: String,
    /// The portal ticket mode, when set.
    pub portal: Option<PortalConfig>,
    /// Consecutive failed attempts before the source is `lost`; 0 = retry forever.
    pub max_attempts: u32,
    /// Interval of client WebSocket pings (30 s; none in portal mode).
    pub keepalive: Duration,
}

/// The portal ticket mode's settings.
#[derive(Debug, Clone)]
pub struct PortalConfig {
    pub mode: TicketMode,
    pub ticket_url: String,
    pub source_id: String,
    pub auth: UserAuth,
}

/// The dingtalk source's settings from its profile section.
pub fn settings(r: &mut SectionReader<'_>) -> Result<DingTalkConfig, ConfigError> {
    let mode = user_config::ticket_mode(r)?;
    let client_id = r
        .env
        .client_id
        .clone()
        .or(r.section.client_id.take())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let needs_app = mode != Some(TicketMode::Normal);
    if needs_app && client_id.is_empty() {
        return Err(ConfigError::Invalid(format!(
            "the dingtalk source needs {} or DWS_DINGTALK_CLIENT_ID",
            r.in_file("client_id")
        )));
    }
    let client_secret = user_config::client_secret(r)?;
    if needs_app && client_secret.is_none() {
        return Err(ConfigError::Invalid(format!(
            "the dingtalk source needs a client secret: {}, {} or DWS_DINGTALK_CLIENT_SECRET",
            r.in_file("client_secret_file"),
            r.in_file("client_secret")
        )));
    }
    let open_api = r
        .env
        .open_api
        .clone()
        .or(r.section.open_api.take())
        .unwrap_or_else(|| "https://api.dingtalk.com".into());
    r.check_url(&open_api, "open_api")?;
    let portal = match mode {
        None => None,
        Some(mode) => {
            let base = user_config::mcp_base(r);
            let ticket_url = user_config::ticket_url(r, &base)?;
            let auth = user_config::user_auth(
                r,
                &base,
                &client_id,
                client_secret.as_ref(),
                "the dingtalk source's portal ticket mode",
            )?;
            Some(PortalConfig {
                mode,
                ticket_url,
                source_id: user_config::portal_source_id(r, &base),
                auth,
            })
        }
    };
    let default_keepalive = if portal.is_some() {
        Duration::ZERO
    } else {
        Duration::from_secs(30)
    };
    Ok(DingTalkConfig {
        client_id,
        client_secret,
        open_api: open_api.trim_end_matches('/').to_owned(),
        portal,
        max_attempts: r.section.max_attempts.unwrap_or(0),
        keepalive: r.duration(
            "keepalive",
            r.section.keepalive.as_deref(),
            default_keepalive,
        )?,
    })
}

pub struct DingTalkSource {
    pub config: DingTalkConfig,
}

impl Source for DingTalkSource {
    fn kind(&self) -> &'static str {
        "dingtalk"
    }

    fn run(self: Box<Self>, ctx: SourceContext) -> SourceFuture {
        Box::pin(async move {
            let c = self.config;
            let result = match c.portal.clone() {
                None => open_mode(c, ctx).await,
                Some(p) => portal_mode(c, p, ctx).await,
            };
            if let Err((hub, e)) = result {
                stream::source_lost(&hub, 0, &e);
            }
        })
    }
}

type SetupFailed = (crate::hub::SourceHandle, String);

async fn open_mode(c: DingTalkConfig, ctx: SourceContext) -> Result<(), SetupFailed> {
    let tuning = stream::Tuning::new(Duration::from_secs(1), Duration::from_secs(60)).with_env();
    let policy = stream::Policy {
        keepalive: c.keepalive,
        max_attempts: c.max_attempts,
        healthy: stream::Healthy::Frame,
        frames: stream::Frames::Sdk,
    };
    let setup = net::tls_config()
        .map_err(|e| e.to_string())
        .and_then(|tls| {
            let http = net::http_client(&tls, &stream::user_agent(), OPEN_TIMEOUT)
                .map_err(|e| e.to_string())?;
            let open_url = net::parse(&format!("{}{OPEN_PATH}", c.open_api))
                .map_err(|e| format!("invalid open_api URL: {e}"))?;
            Ok((tls, http, open_url))
        });
    let (tls, http, open_url) = setup.map_err(|e| (ctx.hub.clone(), e))?;
    let secret = c.client_secret.clone().unwrap_or_else(|| Secret::new(""));
    let app = App {
        opened: AtomicBool::new(false),
        scrub: Scrub::new(secret.expose()),
        client_id: c.client_id,
        client_secret: secret,
        http,
        open_url,
    };
    stream::run(app, policy, tuning, tls, ctx).await;
    Ok(())
}

async fn portal_mode(
    c: DingTalkConfig,
    p: PortalConfig,
    ctx: SourceContext,
) -> Result<(), SetupFailed> {
    let tuning = stream::Tuning::new(Duration::from_secs(1), Duration::from_secs(30)).with_env();
    let policy = stream::Policy {
        keepalive: c.keepalive,
        max_attempts: c.max_attempts,
        healthy: stream::Healthy::Acked,
        frames: stream::Frames::AckAll,
    };
    let setup = net::tls_config()
        .map_err(|e| e.to_string())
        .and_then(|tls| {
            let http = net::http_client(&tls, &stream::user_agent(), PORTAL_TIMEOUT)
                .map_err(|e| e.to_string())?;
            let url = net::parse(&p.ticket_url).map_err(|e| format!("invalid ticket_url: {e}"))?;
            let creds =
                Arc::new(Credentials::with_refresh(&p.auth, &http).map_err(|e| e.to_string())?);
            if let Some(s) = &c.client_secret {
                creds.learn(s);
            }
            Ok((tls, http, url, creds))
        });
    let (tls, http, url, creds) = setup.map_err(|e| (ctx.hub.clone(), e))?;
    let portal = Portal {
        creds: creds.clone(),
        tickets: TicketClient {
            flavor: Flavor::Portal,
            url,
            http,
            creds,
            client_id: c.client_id,
            client_secret: c.client_secret,
            source_id: p.source_id,
            mode: p.mode,
        },
    };
    stream::run(portal, policy, tuning, tls, ctx).await;
    Ok(())
}

/// The app stream's half of the runner: the open call and EVENT keys.
struct App {
    /// An open call has succeeded.
    opened: AtomicBool,
    client_id: String,
    client_secret: Secret,
    http: reqwest::Client,
    open_url: Url,
    scrub: Scrub,
}

impl stream::Upstream for App {
    fn name(&self) -> &'static str {
        "dingtalk"
    }

    async fn ticket(&self) -> Result<Ticket, TicketError> {
        tracing::debug!(url = %net::redacted(&self.open_url), "dingtalk: open call");
        match self.open().await {
            Ok(t) => {
                self.opened.store(true, Ordering::Relaxed);
                Ok(t)
            }
            Err(Refused { status, why })
                if first_open_refusal_is_fatal(self.opened.load(Ordering::Relaxed), status) =>
            {
                Err(TicketError::Fatal(why))
            }
            Err(Refused { why, .. }) => Err(TicketError::Retry(why)),
        }
    }

    fn event(&self, f: &Frame) -> Result<NewEvent, Unroutable> {
        to_event(f)
    }

    fn scrub(&self) -> Scrub {
        self.scrub.clone()
    }
}

/// A failed open call: the HTTP status of a refusal, and why.
struct Refused {
    status: Option<u16>,
    why: String,
}

impl From<String> for Refused {
    fn from(why: String) -> Refused {
        Refused { status: None, why }
    }
}

impl From<&str> for Refused {
    fn from(why: &str) -> Refused {
        Refused::from(why.to_owned())
    }
}

/// The reference ends `dws event consume` when the SDK's first `Start`
/// fails (`internal/event/source/dingtalk.go` `Start`): a first open
/// refused with a 4xx other than 408 and 429 (`authFailed`, a bad request)
/// ends the source. Once an open succeeded, every failure is retried (the
/// SDK's reconnect loop), and so are transient failures of the first open
/// (no answer, 408, 429, 5xx), bounded by `max_attempts`.
fn first_open_refusal_is_fatal(opened_before: bool, status: Option<u16>) -> bool {
    !opened_before && status.is_some_and(|s| (400..500).contains(&s) && !matches!(s, 408 | 429))
}

impl App {
    /// `POST …/connections/open` → endpoint and ticket.
    async fn open(&self) -> Result<Ticket, Refused> {
        let body = serde_json::json!({
            "clientId": self.client_id,
            "clientSecret": self.client_secret.expose(),
            "subscriptions": [
                {"type": "EVENT", "topic": "*"},
                {"type": "SYSTEM", "topic": "ping"},
                {"type": "SYSTEM", "topic": "disconnect"},
            ],
            "ua": stream::user_agent(),
        });
        let req = self
            .http
            .post(self.open_url.as_str())
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
            return Err(Refused {
                status: Some(resp.status),
                why: format!("open failed: {} {detail}", resp.status)
                    .trim_end()
                    .to_owned(),
            });
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
        Ok(Ticket {
            endpoint,
            ticket,
            keep_embedded: false,
        })
    }
}

/// The portal ticket mode's half of the runner.
struct Portal {
    creds: Arc<Credentials>,
    tickets: TicketClient,
}

impl stream::Upstream for Portal {
    fn name(&self) -> &'static str {
        "dingtalk"
    }

    async fn ticket(&self) -> Result<Ticket, TicketError> {
        self.tickets.ticket().await
    }

    fn event(&self, f: &Frame) -> Result<NewEvent, Unroutable> {
        to_event(f)
    }

    fn scrub(&self) -> Scrub {
        self.creds.scrub()
    }

    fn ws_user_agent(&self) -> String {
        PORTAL_USER_AGENT.to_owned()
    }

    /// The reference retries a refused handshake only for 408, 429 and 5xx.
    fn handshake_refusal_is_fatal(&self, status: u16) -> bool {
        !matches!(status, 408 | 429 | 500..)
    }
}

/// The bus event for an app frame, or why it has none (no or an invalid
/// `eventType`).
fn to_event(f: &Frame) -> Result<NewEvent, Unroutable> {
    let event_type = f.header("eventType").trim();
    if event_type.is_empty() {
        return Err(Unroutable::new(
            NO_EVENT_TYPE,
            format!(
                "{} frame without an eventType header",
                one_line(&f.kind, 30)
            ),
        ));
    }
    if !proto::pattern::is_valid_event_type(event_type) {
        return Err(Unroutable::new(
            INVALID_EVENT_TYPE,
            format!("{:?} is not a valid event type", one_line(event_type, 80)),
        ));
    }
    let ms = |k: &str| f.header(k).trim().parse::<i64>().ok().filter(|v| *v > 0);
    Ok(NewEvent {
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
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::{
        profile::{load, EnvOverrides, SourceConfig},
        source::stream::frame,
    };

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
        assert_eq!(to_event(&f).unwrap_err().reason, INVALID_EVENT_TYPE);
        let f = frame::parse(r#"{"type":"EVENT","headers":{"messageId":"m"}}"#).unwrap();
        assert_eq!(to_event(&f).unwrap_err().reason, NO_EVENT_TYPE);
    }

    fn load_dingtalk(dir: &std::path::Path, body: &str) -> Result<DingTalkConfig, ConfigError> {
        let p = dir.join("config.toml");
        std::fs::write(&p, format!("[profiles.p]\nsource = \"dingtalk\"\n{body}")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        match load(dir, "p", &EnvOverrides::default())? {
            SourceConfig::DingTalk(d) => Ok(d),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn settings_of_both_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let d = load_dingtalk(tmp.path(), "client_id = \"i\"\nclient_secret = \"s\"\n").unwrap();
        assert!(d.portal.is_none());
        assert_eq!(d.keepalive, Duration::from_secs(30));
        assert!(load_dingtalk(tmp.path(), "client_id = \"i\"\n")
            .unwrap_err()
            .to_string()
            .contains("client secret"));
        // The portal's normal mode needs a user token, not app credentials.
        let e = load_dingtalk(tmp.path(), "stream_ticket_mode = \"normal\"\n").unwrap_err();
        assert!(e.to_string().contains("user access token"), "{e}");
        let d = load_dingtalk(
            tmp.path(),
            "stream_ticket_mode = \"normal\"\naccess_token = \"t\"\nmcp_base = \"http://127.0.0.1:9\"\n",
        )
        .unwrap();
        let p = d.portal.unwrap();
        assert_eq!(
            (p.mode, p.ticket_url.as_str(), p.source_id.as_str()),
            (
                TicketMode::Normal,
                "http://127.0.0.1:9/stream/connections/ticket",
                "open"
            )
        );
        assert_eq!(d.keepalive, Duration::ZERO, "no pings, like the reference");
        // A pre-mcp base defaults to the reference's pre_open_source.
        for (base, extra, want) in [
            ("https://pre-mcp.dingtalk.com", "", "pre_open_source"),
            ("https://PRE-MCP.example.com/x", "", "pre_open_source"),
            (
                "https://pre-mcp.dingtalk.com",
                "source_id = \"mine\"\n",
                "mine",
            ),
            ("https://mcp.dingtalk.com", "", "open"),
        ] {
            let d = load_dingtalk(
                tmp.path(),
                &format!("stream_ticket_mode = \"normal\"\naccess_token = \"t\"\nmcp_base = \"{base}\"\n{extra}"),
            )
            .unwrap();
            assert_eq!(d.portal.unwrap().source_id, want, "{base} {extra}");
        }
        // custom needs the app's credentials.
        let e = load_dingtalk(
            tmp.path(),
            "stream_ticket_mode = \"custom\"\naccess_token = \"t\"\nclient_id = \"i\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("client secret"), "{e}");
    }

    #[test]
    fn only_a_first_open_refused_for_good_is_fatal() {
        for s in [400, 401, 403, 404] {
            assert!(first_open_refusal_is_fatal(false, Some(s)), "{s}");
            assert!(!first_open_refusal_is_fatal(true, Some(s)), "{s} later");
        }
        for s in [408, 429, 500, 503] {
            assert!(!first_open_refusal_is_fatal(false, Some(s)), "{s}");
        }
        assert!(!first_open_refusal_is_fatal(false, None), "no answer");
    }
}
