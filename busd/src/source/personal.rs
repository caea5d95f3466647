//! The `personal` source: the DingTalk *personal* stream, as the reference
//! CLI (`DingTalk-Real-AI/dingtalk-workspace-cli`,
//! `internal/event/source/personal.go`) speaks it. A user's access token,
//! not an app secret, buys the WebSocket ticket, and what arrives on the
//! socket is decided by upstream subscriptions that the bus creates and
//! cancels on the user's behalf ([`control`]).
//!
//! - Settings: [`config`] (`client_id` is required, as in the reference).
//! - Credentials: [`credentials`] — the token re-read for every use, a
//!   rejected token refreshed with the profile's refresh token
//!   ([`oauth`]) and written back, a refresh ahead of a known expiry.
//! - Ticket: [`ticket`] (`POST {ticket_url}`, one refresh-and-retry on 401).
//! - The WebSocket session is the shared runner of [`super::stream`] with
//!   the reference's rules ([`stream::Frames::AckAll`]): every frame acked
//!   200, every frame offered as an event whatever its `type`, unroutable
//!   ones counted per reason; backoff 1 s → 30 s, reset after a connection
//!   that acked a frame; a new ticket for every attempt; no WebSocket pings
//!   unless `keepalive` is set (the reference sends none); `max_attempts`
//!   consecutive failures make the source lost.
//! - An event's identity — event id, key, born time, upstream subscription,
//!   source id, rule type — is resolved by [`event::to_event`] from the
//!   several header spellings and the data envelope; the bus routes it to
//!   the local subscriptions bound to its upstream subscription only.
//!
//! Tokens are never logged nor put in a state, status or error: every
//! message goes through the [`Scrub`] of [`Credentials`], which learns each
//! token value it reads.

pub mod config;
pub mod control;
pub mod credentials;
pub mod event;
pub mod oauth;
pub mod refresh_lock;
pub mod ticket;
pub mod token_file;

use std::{sync::Arc, time::Duration};

use self::{
    config::PersonalConfig,
    credentials::Credentials,
    ticket::{Flavor, TicketClient},
};
use super::{
    stream::{self, frame::Frame, net, Scrub, Ticket, TicketError, Unroutable},
    Source, SourceContext, SourceFuture,
};
use crate::{hub::NewEvent, upstream::UpstreamControl};

/// The ticket request, whole exchange.
const TICKET_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on cancelling the held upstream subscriptions when the bus stops.
const CANCEL_ON_EXIT: Duration = Duration::from_millis(900);

pub struct PersonalSource {
    config: PersonalConfig,
    /// TLS, HTTP and credentials set up, or why they could not be.
    setup: Result<Setup, String>,
    control: Option<control::Control>,
}

struct Setup {
    tls: Arc<rustls::ClientConfig>,
    http: reqwest::Client,
    creds: Arc<Credentials>,
}

impl PersonalSource {
    pub fn new(config: PersonalConfig) -> PersonalSource {
        let setup = net::tls_config()
            .map_err(|e| e.to_string())
            .and_then(|tls| {
                let http = net::http_client(&tls, &stream::user_agent(), TICKET_TIMEOUT)
                    .map_err(|e| e.to_string())?;
                let creds = Arc::new(
                    Credentials::with_refresh(&config.auth, &http).map_err(|e| e.to_string())?,
                );
                if let Some(s) = &config.client_secret {
                    creds.learn(s);
                }
                Ok(Setup { tls, http, creds })
            });
        let control = setup.as_ref().ok().map(|s| {
            control::Control::new(
                s.http.clone(),
                s.creds.clone(),
                control::ControlConfig::from_personal(&config),
            )
        });
        PersonalSource {
            config,
            setup,
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
                frames: stream::Frames::AckAll,
            };
            let setup = self.setup.and_then(|s| {
                let url = net::parse(&self.config.ticket_url)
                    .map_err(|e| format!("invalid ticket_url: {e}"))?;
                Ok((s, url))
            });
            let (s, url) = match setup {
                Ok(v) => v,
                Err(e) => return stream::source_lost(&ctx.hub, 0, &e),
            };
            let c = &self.config;
            let upstream = Personal {
                source_id: c.source_id.clone(),
                creds: s.creds.clone(),
                tickets: TicketClient {
                    flavor: Flavor::Personal,
                    url,
                    http: s.http,
                    creds: s.creds,
                    client_id: c.client_id.clone(),
                    client_secret: c.client_secret.clone(),
                    source_id: c.source_id.clone(),
                    mode: c.ticket_mode,
                },
            };
            stream::run(upstream, policy, tuning, s.tls, ctx).await;
            // The bus is stopping: the upstream subscriptions it holds would
            // outlive it (their bindings are not stored); cancel them.
            if let Some(c) = self.control {
                c.cancel_all(CANCEL_ON_EXIT).await;
            }
        })
    }
}

/// The personal stream's half of the runner: the ticket and the event
/// identity.
struct Personal {
    source_id: String,
    creds: Arc<Credentials>,
    tickets: TicketClient,
}

impl stream::Upstream for Personal {
    fn name(&self) -> &'static str {
        "personal"
    }

    async fn ticket(&self) -> Result<Ticket, TicketError> {
        self.tickets.ticket().await
    }

    fn event(&self, f: &Frame) -> Result<NewEvent, Unroutable> {
        event::to_event(f, &self.source_id)
    }

    fn scrub(&self) -> Scrub {
        self.creds.scrub()
    }
}
