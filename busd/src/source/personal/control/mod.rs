//! The personal stream's subscription control plane (protocol note §6.5):
//! create, list and cancel upstream subscriptions, parse and classify their
//! errors, and share one upstream subscription between identical local ones
//! ([`Control`], the source's [`UpstreamControl`]).
//!
//! Every call carries `Authorization: Bearer <token>`,
//! `x-user-access-token`, `X-DWS-Client-Id`, `X-DWS-Source-Id`,
//! `X-DWS-Corp-Id` (when known), `X-Cli-Version`, `User-Agent:
//! dws-cli/<version>` and `Accept: application/json`; one HTTP call per
//! operation (30 s), retried once after a 401 with a refreshed token.
//!
//! - Create: `POST {base}/subscription/user` with `clientId`, `sourceId`,
//!   `eventKey`, `filterRule` (the rule parameter as a JSON *string*),
//!   `deliveryPref: realtime`, `expiresAt` (RFC 3339, now + TTL; only when
//!   the user gave an explicit `--ttl`) and `ext`
//!   (`ruleType`, `name`, the content `filter`, `idempotencyKey`: see
//!   [`request`]). The id is the first element of `result` (or
//!   `result.subId`).
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

//!
//! Layout: [`error`] (classification), [`wire`] (response parsing),
//! [`request`] (create bodies, canonical JSON, the idempotency key),
//! [`share`] (reference counting, pure), [`client`] (the calls).

pub mod client;
pub mod error;
pub mod request;
pub mod share;
pub mod wire;

pub use self::{
    client::{Control, ControlConfig},
    error::{Class, ControlError},
    request::{CreateRequest, Identity},
    wire::{parse_response, ListedSubscription},
};

/// Create, list and cancel paths below the control base.
pub const CREATE_PATH: &str = "/subscription/user";
pub const LIST_PATH: &str = "/event/sublist";
pub const CANCEL_PATH: &str = "/subscription/cancel";

#[cfg(test)]
mod fake_tests;
#[cfg(test)]
mod golden_tests;
