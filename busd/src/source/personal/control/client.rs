//! The control-plane client ([`Control`], the personal source's
//! [`UpstreamControl`]): one HTTP call per operation (30 s), with the
//! reference's headers (`internal/event/personal/client.go` `decorate`, and
//! `newPersonalEventControlClient` for the version): `Authorization:
//! Bearer`, `x-user-access-token`, `X-DWS-Client-Id`, `X-DWS-Source-Id`,
//! `X-DWS-Corp-Id` (when known), `X-Cli-Version: <version>`, `User-Agent:
//! dws-cli/<version>`, `Accept: application/json`. A call refused with 401
//! is retried once with the token [`Credentials::refresh_rejected`] finds.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use proto::v1::{ErrorCode, UpstreamSpec};
use reqwest::{
    header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, USER_AGENT},
    Method,
};
use serde_json::{json, Value};

use super::{
    error::{normalize, Class, ControlError},
    request::{CreateRequest, Identity},
    share::{Acquire, Registry},
    wire::{created_id, field_str, parse_response, ListedSubscription},
    CANCEL_PATH, CREATE_PATH, LIST_PATH,
};
use crate::{
    section::Secret,
    source::{
        personal::{
            config::PersonalConfig,
            credentials::{Credentials, Refreshed},
            ticket::{header_value, secret_header, HeaderError},
            token_file::UserIdentity,
        },
        stream::net,
    },
    upstream::{BoxFuture, Refusal, UpstreamControl},
};

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

/// The version in `X-Cli-Version` and the `dws-cli/` `User-Agent`.
pub fn cli_version() -> &'static str {
    proto::BUILD
}

/// What the control plane needs from the profile.
#[derive(Debug, Clone, Default)]
pub struct ControlConfig {
    pub base: String,
    pub client_id: String,
    pub source_id: String,
    pub corp_id: String,
    pub user_id: String,
    /// `ext.name` of created subscriptions ("" = none).
    pub subscription_name: String,
}

impl ControlConfig {
    pub fn from_personal(c: &PersonalConfig) -> ControlConfig {
        ControlConfig {
            base: c.control_base.clone(),
            client_id: c.client_id.clone(),
            source_id: c.source_id.clone(),
            corp_id: c.corp_id.clone(),
            user_id: c.user_id.clone(),
            subscription_name: c.subscription_name.clone(),
        }
    }
}

/// The headers of every control-plane call; `corp` is the user's corp id
/// as known ([`Control::identity`]).
pub fn headers(token: &Secret, c: &ControlConfig, corp: &str) -> Result<HeaderMap, HeaderError> {
    let mut h = HeaderMap::new();
    h.insert(
        AUTHORIZATION,
        secret_header(&format!("Bearer {}", token.expose()))?,
    );
    h.insert(
        HeaderName::from_static("x-user-access-token"),
        secret_header(token.expose())?,
    );
    for (name, value) in [
        ("x-dws-client-id", c.client_id.as_str()),
        ("x-dws-source-id", c.source_id.as_str()),
        ("x-dws-corp-id", corp),
    ] {
        if !value.is_empty() {
            h.insert(HeaderName::from_static(name), header_value(name, value)?);
        }
    }
    h.insert(
        HeaderName::from_static("x-cli-version"),
        HeaderValue::from_static(cli_version()),
    );
    h.insert(
        USER_AGENT,
        header_value("User-Agent", &format!("dws-cli/{}", cli_version()))?,
    );
    h.insert(ACCEPT, HeaderValue::from_static("application/json"));
    Ok(h)
}

struct Inner {
    http: reqwest::Client,
    creds: Arc<Credentials>,
    config: ControlConfig,
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
        creds: Arc<Credentials>,
        mut config: ControlConfig,
    ) -> Control {
        config.base = config.base.trim_end_matches('/').to_owned();
        Control {
            inner: Arc::new(Inner {
                http,
                creds,
                config,
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

    /// Who creates subscriptions (the idempotency key's identity): the
    /// configured corp and user id, each when set, else the credentials'
    /// (a JSON token file's, else the last refresh answer's — the
    /// reference's saved login).
    pub fn identity(&self) -> Identity {
        let c = &self.inner.config;
        let user = UserIdentity {
            corp_id: c.corp_id.clone(),
            user_id: c.user_id.clone(),
        }
        .or(&self.inner.creds.identity());
        let mut id = Identity {
            corp_id: user.corp_id,
            user_id: user.user_id,
            client_id: c.client_id.clone(),
            source_id: c.source_id.clone(),
            local_subject: String::new(),
        };
        if id.needs_subject() {
            id.local_subject = self.inner.creds.local_subject();
        }
        id
    }

    /// One call, retried once after a 401 with the token the credentials
    /// find (refreshed or re-read): the result, or the error (scrubbed).
    /// The body is built for each attempt (a refresh may change the
    /// identity its idempotency key is made of).
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&(dyn Fn() -> Value + Sync)>,
    ) -> Result<Option<Value>, ControlError> {
        let i = &self.inner;
        let url = net::parse(&format!("{}{path}", i.config.base))
            .map_err(|e| ControlError::transport(format!("invalid control_base: {e}")))?;
        let url = net::with_query(&url, query);
        let unreadable = |m: String| ControlError {
            code: "TOKEN_UNAVAILABLE".into(),
            message: m,
            token_unreadable: true,
            ..ControlError::default()
        };
        let mut token = i
            .creds
            .usable_token()
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        let mut retried = false;
        loop {
            let corp = self.identity().corp_id;
            let headers = headers(&token, &i.config, &corp)
                .map_err(|e| ControlError::transport(e.to_string()))?;
            let mut req = i
                .http
                .request(method.clone(), url.as_str())
                .headers(headers);
            if let Some(b) = body {
                req = req.json(&b());
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
            if resp.status == 401 && !retried {
                retried = true;
                if let Refreshed::Token {
                    token: t,
                    refreshed,
                } = i.creds.refresh_rejected(&token).await
                {
                    tracing::warn!(path, refreshed, "personal: control call refused with HTTP 401: retrying once with a new token");
                    token = t;
                    continue;
                }
            }
            return parse_response(resp.status, &resp.headers, &resp.body).map_err(clean);
        }
    }

    /// Creates an upstream subscription; returns its id.
    pub async fn create(&self, req: &CreateRequest) -> Result<String, ControlError> {
        // The consumer's `--name`, else the profile's (the reference has
        // one per subscription).
        let name = if req.name.is_empty() {
            self.inner.config.subscription_name.as_str()
        } else {
            req.name.as_str()
        };
        let body = || req.body(&self.identity(), name, SystemTime::now());
        created_id(
            self.call(Method::POST, CREATE_PATH, &[], Some(&body))
                .await?,
        )
    }

    /// Cancels an upstream subscription: `Ok(true)` if it was cancelled,
    /// `Ok(false)` if the server did not know it (gone already).
    pub async fn cancel(&self, id: &str) -> Result<bool, ControlError> {
        let body = || json!({ "subId": id });
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
        let c = &self.inner.config;
        let mut seen = HashSet::new();
        let mut out = vec![];
        for page_no in 1..=MAX_PAGES {
            let query = [
                ("clientId", c.client_id.clone()),
                ("sourceId", c.source_id.clone()),
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

    /// Cancels `id` in the background, then lets the acquires waiting on
    /// `key` go on.
    fn cancel_in_background(&self, key: String, id: String) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(upstream_id = %id, "personal: no runtime to cancel the upstream subscription");
            self.registry().forget(&key);
            return;
        };
        let this = self.clone();
        rt.spawn(async move {
            this.cancel_logged(&id).await;
            this.registry().cancelled(&key);
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
        let ids = self.registry().take_ready();
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

impl UpstreamControl for Control {
    fn acquire<'a>(
        &'a self,
        keys: &'a [String],
        spec: &'a UpstreamSpec,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<String, Refusal>> {
        Box::pin(async move {
            let req = CreateRequest::from_spec(keys, spec, ttl)
                .map_err(|m| Refusal::new(ErrorCode::BadRequest, m.0))?;
            let key = req.share_key();
            loop {
                let step = self.registry().acquire(&key);
                let rx = match step {
                    Acquire::Shared(id) => {
                        tracing::debug!(upstream_id = %id, "personal: upstream subscription shared");
                        return Ok(id);
                    }
                    Acquire::Create(rx) => {
                        // On a task of its own: a consumer that goes away
                        // mid-call does not leave the others hanging.
                        let this = self.clone();
                        let (req, key) = (req.clone(), key.clone());
                        tokio::spawn(async move {
                            let r = this.create_for_acquire(&req).await;
                            let orphan = this.registry().created(&key, r);
                            if let Some(id) = orphan {
                                tracing::info!(upstream_id = %id, "personal: nobody waits for the new upstream subscription any more");
                                this.cancel_in_background(key, id);
                            }
                        });
                        rx
                    }
                    Acquire::Wait(rx) => rx,
                    Acquire::AfterCancel(rx) => {
                        let _ = rx.await;
                        continue;
                    }
                };
                return rx.await.unwrap_or_else(|_| {
                    Err(Refusal::new(
                        ErrorCode::Internal,
                        "upstream subscription failed: the create call was abandoned",
                    ))
                });
            }
        })
    }

    fn release(&self, upstream_id: &str) {
        let last = self.registry().release(upstream_id);
        match last {
            Some(key) => {
                tracing::info!(
                    upstream_id,
                    "personal: last local subscription gone: cancelling the upstream one"
                );
                self.cancel_in_background(key, upstream_id.to_owned());
            }
            None => tracing::debug!(upstream_id, "personal: upstream subscription released"),
        }
    }
}
