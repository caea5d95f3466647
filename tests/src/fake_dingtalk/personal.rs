//! The personal stream of the fake (protocol note §6, §7) — strict where
//! the reference CLI (`DingTalk-Real-AI/dingtalk-workspace-cli`) and the
//! service are: the ticket endpoint, the subscription control plane, the
//! OAuth refresh endpoint and personal pushes. The handlers are in
//! [`server`]; what is recomputed the reference's way (SHA-256, Go's JSON,
//! the idempotency key) in [`reference`].
//!
//! - `POST /stream/connections/ticket`: requires `x-user-access-token`
//!   equal to the current user token (else 401) and a body with `sourceId`
//!   and `mode` `normal`|`custom` (else 400). A body with `channelType` is
//!   the app stream's portal mode (`channelType` must repeat `sourceId`);
//!   otherwise `X-DWS-Client-Id` must not be empty (else 400
//!   `CLIENT_ID_REQUIRED`), `Authorization: Bearer <token>` must be sent
//!   (else 401) and `X-DWS-Source-Id` must repeat `sourceId` (else 400);
//!   both need `Accept: application/json` (else 406). `custom` requires the app's `clientId` and
//!   `clientSecret`. Answers `{"success":true,"result":{endpoint,ticket}}`
//!   (or under `data`, or bare: [`TicketShape`]); optionally with the ticket
//!   embedded in the endpoint and a decoy in `ticket`
//!   ([`FakeDingTalk::set_ticket_in_endpoint`]).
//! - `POST /dws/subscription/user` (create), `GET /dws/event/sublist`
//!   (list, paged, `gmtCreate` a string), `POST /dws/subscription/cancel`:
//!   require `Authorization: Bearer <token>` and `x-user-access-token`
//!   (else 401) and a client id (else 400 `CLIENT_ID_REQUIRED`); create
//!   checks the body (`eventKey`, `filterRule` a JSON string holding an
//!   object, `deliveryPref: realtime`, `ext.ruleType`) and accepts only the
//!   reference's `ext.idempotencyKey` for the caller's identity
//!   ([`FakeIdentity`]), else 400 `INVALID_PARAM`; it answers
//!   `{"success":true,"result":["sub-…"]}`; cancel of an unknown or
//!   cancelled id answers `{"success":false,"errorCode":
//!   "PERSONAL_EVENT_NOT_FOUND"}`.
//! - `POST /oauth2/refreshToken` (the reference's MCP refresh): `clientId`,
//!   `grantType: refresh_token` and the current refresh token (a wrong one:
//!   200 with `errorCode` `invalidParameter.authCode.notFound`); a body
//!   with `clientSecret` is refused (400 `INVALID_PARAM`): the reference's
//!   `refreshViaMCP` never sends it (only the direct `userAccessToken`
//!   endpoint takes it). Refresh calls can be held until released. Issues a new access token (the old one stops working) and rotates the
//!   refresh token; `expiresIn` is [`FakeDingTalk::set_token_lifetime`].
//!   Like the MCP answer the reference parses (`parseMCPTokenResponse`),
//!   it carries the user's `corpId` and `corpName` always, and `userId`
//!   and `userName` when the service knows the user
//!   ([`FakeIdentity::CorpUser`]; else the corp is [`ORG_CORP_ID`]).
//! - Faults: the next ticket / refresh calls fail with a status and body;
//!   the next calls of one control operation get a given status, body and
//!   headers (`Retry-After`); ticket requests can be held until released;
//!   the user token can be revoked server-side.
//! - Pushes: [`PersonalEvent`] frames in every spelling the reference
//!   accepts ([`HeaderStyle::ALL`]; any `type`, or none), the data envelope
//!   wrapped in 0–2 JSON strings; they are tracked and redelivered like app
//!   EVENTs (never after a diagnostic 4xx ack).

mod push;
pub(super) mod reference;
mod server;

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

pub(super) use self::server::{handle_control, handle_refresh, handle_ticket};
use super::{new_uuid, now_ms, FakeDingTalk};

pub const TICKET_PATH: &str = "/stream/connections/ticket";
/// Every control-plane path starts with this.
pub const CONTROL_BASE_PATH: &str = "/dws/";
pub const CREATE_PATH: &str = "/dws/subscription/user";
pub const LIST_PATH: &str = "/dws/event/sublist";
pub const CANCEL_PATH: &str = "/dws/subscription/cancel";
/// The reference's MCP token refresh.
pub const REFRESH_PATH: &str = "/oauth2/refreshToken";
/// The corp a refresh answer names when the service does not know the
/// user ([`FakeIdentity::AccessToken`], [`FakeIdentity::RefreshToken`]).
pub const ORG_CORP_ID: &str = "dingfakeorg";

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
    /// The ticket issued, the subscription created or the token refreshed.
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
    /// `gmtCreate` as listed: a string, like the reference parses it.
    pub gmt_create: String,
}

/// Who the service takes the caller to be, for the idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FakeIdentity {
    /// The corp and user are known: `corp_user\0corp\0user\0client\0source`.
    CorpUser { corp: String, user: String },
    /// `local_subject\0access:<sha256 of the token presented>\0client\0source`.
    #[default]
    AccessToken,
    /// `local_subject\0refresh:<sha256 of the current refresh token>\0…`.
    RefreshToken,
}

/// How a personal push spells its identity. Every style but [`Sdk`] keeps
/// the identity out of the other place (headers or data), so that each
/// spelling is what routes the event.
///
/// [`Sdk`]: HeaderStyle::Sdk
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// SDK headers (`eventId`, `eventType`, `eventBornTime`, …) plus
    /// `SUB_ID`, and the whole data envelope: what production is expected
    /// to send.
    #[default]
    Sdk,
    /// `MESSAGE_ID`, `EVENT_TYPE`, `SUB_ID`, `SOURCE_ID`, `RULE_TYPE`.
    Upper,
    /// `eventId`, `eventType`, `subscribeId`, `ruleType`, `sourceId`.
    Camel,
    /// `event_id`, `event_type`, `subscribe_id`, `source_id`, `rule_type`.
    Snake,
    /// `EVENT_KEY`, `sub_id`.
    KeyUpper,
    /// `event_key`, `subId`.
    KeySnake,
    /// `eventKey`, `SUB_ID`.
    KeyCamel,
    /// The event key as the `topic` (not `*`), `SUB_ID`.
    Topic,
    /// Odd cases, matched ignoring case: `Event_Type`, `Sub_Id`, `Rule_Type`.
    MixedCase,
    /// Only `topic`, `messageId`, `contentType`, `time`: the data envelope
    /// has `eventId`, `eventKey`, `subId`.
    DataOnly,
    /// Data `event_id`, `event_key`, `sub_id`, `rule_type`.
    DataSnake,
    /// Data `eventKey`, `subscribeId`.
    DataSubscribeId,
    /// Data `event_key`, `subscribe_id`.
    DataSubscribeSnake,
    /// Data `source.tag` as the key, `subId`.
    DataSourceTag,
}

impl HeaderStyle {
    /// Every spelling the reference CLI accepts.
    pub const ALL: [HeaderStyle; 14] = [
        HeaderStyle::Sdk,
        HeaderStyle::Upper,
        HeaderStyle::Camel,
        HeaderStyle::Snake,
        HeaderStyle::KeyUpper,
        HeaderStyle::KeySnake,
        HeaderStyle::KeyCamel,
        HeaderStyle::Topic,
        HeaderStyle::MixedCase,
        HeaderStyle::DataOnly,
        HeaderStyle::DataSnake,
        HeaderStyle::DataSubscribeId,
        HeaderStyle::DataSubscribeSnake,
        HeaderStyle::DataSourceTag,
    ];
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

/// A personal push.
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
    /// The frame's `type`: `EVENT` by default; `Some("")` sends none.
    pub kind: Option<String>,
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
            kind: None,
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

    /// The frame's `type` (`""`: no `type` at all).
    pub fn kind(mut self, k: impl Into<String>) -> PersonalEvent {
        self.kind = Some(k.into());
        self
    }
}

/// The personal half of the fake's state.
#[derive(Debug)]
pub struct PersonalState {
    /// Ticket requests held right now ([`FakeDingTalk::hold_tickets`]).
    pub tickets_waiting: u32,
    /// Refresh calls held right now ([`FakeDingTalk::hold_refreshes`]).
    pub refreshes_waiting: u32,
    pub ticket_requests: Vec<HttpRecord>,
    pub creates: Vec<HttpRecord>,
    pub lists: Vec<HttpRecord>,
    pub cancels: Vec<HttpRecord>,
    pub refreshes: Vec<HttpRecord>,
    pub subscriptions: Vec<FakeSubscription>,
    /// The valid refresh token.
    pub refresh_token: String,
    pub identity: FakeIdentity,
    ticket_faults: VecDeque<(u16, String)>,
    refresh_faults: VecDeque<(u16, String)>,
    control_faults: HashMap<ControlOp, VecDeque<ControlFault>>,
    ticket_shape: TicketShape,
    ticket_in_endpoint: bool,
    header_style: HeaderStyle,
    data_wrap: u8,
    /// `expiresIn` of refreshed tokens.
    token_lifetime: Duration,
    /// The server's page size for lists (default: the requested one, ≤ 100).
    list_page_size: Option<usize>,
    next_sub: u64,
    next_token: u64,
}

impl Default for PersonalState {
    fn default() -> Self {
        PersonalState {
            tickets_waiting: 0,
            refreshes_waiting: 0,
            ticket_requests: vec![],
            creates: vec![],
            lists: vec![],
            cancels: vec![],
            refreshes: vec![],
            subscriptions: vec![],
            refresh_token: "fake-refresh-token".into(),
            identity: FakeIdentity::default(),
            ticket_faults: VecDeque::new(),
            refresh_faults: VecDeque::new(),
            control_faults: HashMap::new(),
            ticket_shape: TicketShape::default(),
            ticket_in_endpoint: false,
            header_style: HeaderStyle::default(),
            data_wrap: 0,
            token_lifetime: Duration::from_secs(7200),
            list_page_size: None,
            next_sub: 0,
            next_token: 0,
        }
    }
}

impl PersonalState {
    pub fn active(&self) -> Vec<&FakeSubscription> {
        self.subscriptions.iter().filter(|s| s.active).collect()
    }

    fn new_sub_id(&mut self) -> String {
        self.next_sub += 1;
        format!("sub-{:04}-{}", self.next_sub, &new_uuid()[..6])
    }

    fn new_token(&mut self, kind: &str) -> String {
        self.next_token += 1;
        format!("{kind}-{}-{}", self.next_token, &new_uuid()[..8])
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

    /// The current user token stops working (as if it expired); only a
    /// refresh gets a valid one.
    pub fn revoke_user_token(&self) {
        self.shared.update(|s| {
            s.options.user_token = s.personal.new_token("revoked");
        });
    }

    /// The valid refresh token.
    pub fn refresh_token(&self) -> String {
        self.with_state(|s| s.personal.refresh_token.clone())
    }

    /// From now on only `token` is a valid refresh token.
    pub fn set_refresh_token(&self, token: &str) {
        self.shared
            .update(|s| s.personal.refresh_token = token.to_owned());
    }

    /// `expiresIn` of the tokens the refresh endpoint issues.
    pub fn set_token_lifetime(&self, d: Duration) {
        self.shared.update(|s| s.personal.token_lifetime = d);
    }

    /// Who creates are attributed to (the idempotency key's identity).
    pub fn set_identity(&self, identity: FakeIdentity) {
        self.shared.update(|s| s.personal.identity = identity);
    }

    /// The next `n` ticket requests are answered `status` with `body`.
    pub fn fail_next_tickets(&self, n: usize, status: u16, body: &str) {
        self.shared.update(|s| {
            s.personal
                .ticket_faults
                .extend((0..n).map(|_| (status, body.to_owned())))
        });
    }

    /// The next `n` refresh calls are answered `status` with `body`.
    pub fn fail_next_refreshes(&self, n: usize, status: u16, body: &str) {
        self.shared.update(|s| {
            s.personal
                .refresh_faults
                .extend((0..n).map(|_| (status, body.to_owned())))
        });
    }

    pub fn set_ticket_shape(&self, shape: TicketShape) {
        self.shared.update(|s| s.personal.ticket_shape = shape);
    }

    /// Personal tickets come embedded in the endpoint's query, the
    /// `ticket` field holding a decoy that no handshake accepts.
    pub fn set_ticket_in_endpoint(&self, on: bool) {
        self.shared.update(|s| s.personal.ticket_in_endpoint = on);
    }

    /// While held, ticket requests wait (up to 60 s) before being answered.
    pub fn hold_tickets(&self, held: bool) {
        self.shared.tickets_held.send_replace(held);
        self.shared.update(|_| ());
    }

    /// While held, refresh calls wait (up to 60 s) before being answered,
    /// in arrival order.
    pub fn hold_refreshes(&self, held: bool) {
        self.shared.refreshes_held.send_replace(held);
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
                        gmt_create: now_ms().to_string(),
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

    pub fn refreshes(&self) -> Vec<HttpRecord> {
        self.with_state(|s| s.personal.refreshes.clone())
    }

    pub fn subscriptions(&self) -> Vec<FakeSubscription> {
        self.with_state(|s| s.personal.subscriptions.clone())
    }
}
