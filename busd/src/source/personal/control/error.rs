//! A failed control-plane call ([`ControlError`]) and how the reference
//! CLI classifies it (`internal/app/event_personal_attempts.go`): the
//! explicit `retryable` flag wins; then 408/425/429/5xx retryable; 401/403
//! and the listed business codes not; an "already exists" shape unknown;
//! other ≥ 400 not; a 200 business error unknown; no response retryable.
//! [`ControlError::refusal`] is what a consumer sees (exit 3 for an
//! authentication or permission failure, else exit 1).

use std::time::Duration;

use proto::v1::ErrorCode;

use crate::{source::stream::one_line, upstream::Refusal};

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
pub(super) fn normalize(code: &str) -> String {
    code.trim()
        .chars()
        .map(|c| match c {
            '-' | '.' | ' ' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

/// Business codes that say "not allowed".
const AUTH_CODES: &[&str] = &[
    "NO_AUTH",
    "NO_PERMISSION",
    "PERMISSION_DENIED",
    "ACCESS_DENIED",
    "FORBIDDEN",
    "UNAUTHORIZED",
];
const AUTH_SUFFIXES: &[&str] = &["_NO_PERMISSION", "_PERMISSION_DENIED", "_ACCESS_DENIED"];
/// Business codes that say "wrong request". With [`AUTH_CODES`] they are
/// the reference's non-retryable business codes.
const REQUEST_CODES: &[&str] = &[
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
    "NOT_FOUND",
    "NOT_EXIST",
    "NOT_SUPPORTED",
    "UNSUPPORTED",
    "UNIFIED_APP_ID_NOT_FOUND",
];
const REQUEST_SUFFIXES: &[&str] = &[
    "_NOT_BELONG_TO_ORG",
    "_DOES_NOT_BELONG_TO_ORG",
    "_NOT_FOUND",
    "_NOT_EXIST",
    "_NOT_SUPPORTED",
    "_UNSUPPORTED",
];

/// One of the reference's non-retryable business codes (a wrong request
/// or "not allowed").
fn business(code: &str) -> bool {
    listed(code, REQUEST_CODES, REQUEST_SUFFIXES) || listed(code, AUTH_CODES, AUTH_SUFFIXES)
}

fn listed(code: &str, exact: &[&str], suffixes: &[&str]) -> bool {
    let c = normalize(code);
    !c.is_empty() && (exact.contains(&c.as_str()) || suffixes.iter().any(|s| c.ends_with(s)))
}

impl ControlError {
    pub(super) fn transport(message: String) -> ControlError {
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
        if business(&self.code) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(http_status: u16, code: &str) -> ControlError {
        ControlError {
            http_status,
            code: code.into(),
            ..ControlError::default()
        }
    }

    #[test]
    fn classes() {
        assert_eq!(err(0, "TRANSPORT").class(), Class::Retryable);
        assert_eq!(err(503, "").class(), Class::Retryable);
        assert_eq!(err(401, "").class(), Class::NonRetryable);
        assert_eq!(err(200, "user-not.found").class(), Class::NonRetryable);
        assert_eq!(err(200, "CLIENT_ID_REQUIRED").class(), Class::NonRetryable);
        assert_eq!(err(200, "RATE_LIMITED").class(), Class::Unknown);
        assert_eq!(err(418, "teapot").class(), Class::NonRetryable);
        let explicit = ControlError {
            retryable: Some(true),
            ..err(401, "X")
        };
        assert_eq!(explicit.class(), Class::Retryable);
        assert!(!explicit.is_auth());
        let exists = ControlError {
            subscribe_id: "s".into(),
            ..err(400, "DUPLICATE")
        };
        assert_eq!(exists.class(), Class::Unknown);
        let unreadable = ControlError {
            token_unreadable: true,
            ..err(0, "TOKEN_UNAVAILABLE")
        };
        assert!(unreadable.is_auth());
        assert_eq!(
            unreadable.refusal(&Default::default()).code,
            ErrorCode::PermissionDenied
        );
    }

    #[test]
    fn descriptions() {
        let e = ControlError {
            message: "slow down".into(),
            retry_after: Some(Duration::from_millis(1500)),
            trace_id: "t-1".into(),
            ..err(429, "RATE_LIMITED")
        };
        assert_eq!(
            e.describe(),
            "RATE_LIMITED: slow down (HTTP 429, retryable, retry after 1.5s, trace t-1)"
        );
        assert_eq!(
            err(403, "FORBIDDEN").describe(),
            "FORBIDDEN (HTTP 403, authentication or permission failure, not retryable)"
        );
    }
}
