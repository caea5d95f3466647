//! The access-token refresh call, as the reference CLI makes it
//! (`internal/auth/oauth_helpers.go` `refreshViaMCP`): `POST {oauth_url}` with
//! `{"clientId","refreshToken","grantType":"refresh_token"}` — never the
//! client secret, which `refreshViaMCP` does not send; a 200 answer
//! `{"accessToken","refreshToken"?,"expiresIn"?,"corpId"?,"userId"?}` (also
//! accepted inside a `result`/`data` envelope; the identity fields as
//! `parseMCPTokenResponse` reads them). `errorCode`/`errorMsg`, a missing
//! `accessToken` or another status is a failure: transient (retry later) for
//! no response, 408, 429 and 5xx, final otherwise.

use std::time::Duration;

use serde_json::Value;

use super::token_file::UserIdentity;
use crate::{
    section::Secret,
    source::stream::{net, net::Url, one_line},
};

/// The reference's default lifetime when `expiresIn` is missing
/// (`config.DefaultAccessTokenExpiry`).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(7200);

/// A refreshed token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub access_token: Secret,
    /// A rotated refresh token, if the server sent one.
    pub refresh_token: Option<Secret>,
    pub lifetime: Duration,
    /// The user's corp and user id, when the answer tells them.
    pub identity: UserIdentity,
}

/// Why a refresh failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshError {
    pub message: String,
    /// Worth trying again later (no response, 408, 429, 5xx).
    pub transient: bool,
    /// The refresh token was refused as unknown
    /// (`invalidParameter.authCode.notFound`, the reference's
    /// `legacyMCPRefreshRejectedCode`): spent, maybe by another process.
    pub spent: bool,
}

/// The MCP refresh's answer to a refresh token it does not know.
pub const SPENT_CODE: &str = "invalidParameter.authCode.notFound";

impl RefreshError {
    pub fn fatal(message: impl Into<String>) -> RefreshError {
        RefreshError {
            message: message.into(),
            transient: false,
            spent: false,
        }
    }

    pub fn transient(message: impl Into<String>) -> RefreshError {
        RefreshError {
            message: message.into(),
            transient: true,
            spent: false,
        }
    }
}

/// One refresh call.
pub async fn refresh(
    http: &reqwest::Client,
    url: &Url,
    client_id: &str,
    refresh_token: &Secret,
) -> Result<Grant, RefreshError> {
    // `refreshViaMCP`: never the client secret (only the direct
    // `userAccessToken` endpoint takes one).
    let body = serde_json::json!({
        "clientId": client_id,
        "refreshToken": refresh_token.expose(),
        "grantType": "refresh_token",
    });
    let req = http
        .post(url.as_str())
        .header(reqwest::header::ACCEPT, "application/json")
        .json(&body);
    let resp = net::send(url, req)
        .await
        .map_err(|e| RefreshError::transient(format!("token refresh failed: {e}")))?;
    parse_grant(resp.status, &resp.body)
}

/// The answer of a refresh call.
pub fn parse_grant(status: u16, body: &[u8]) -> Result<Grant, RefreshError> {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let text = |v: &Value, keys: &[&str]| {
        keys.iter()
            .find_map(|k| {
                v.get(*k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.trim().is_empty())
            })
            .map(|s| s.trim().to_owned())
    };
    let detail = |v: Option<&Value>| {
        let d = v
            .map(|v| {
                let e = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
                [
                    text(e, &["errorCode", "code"]),
                    text(e, &["errorMsg", "message", "msg"]),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ")
            })
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
        let d = one_line(&d, 200);
        if d.is_empty() {
            d
        } else {
            format!(": {d}")
        }
    };
    if status != 200 {
        return Err(RefreshError {
            message: format!(
                "token refresh refused: HTTP {status}{}",
                detail(json.as_ref())
            ),
            transient: matches!(status, 408 | 429 | 500..),
            spent: false,
        });
    }
    let Some(v) = json.filter(Value::is_object) else {
        return Err(RefreshError::fatal(
            "token refresh failed: the answer is not a JSON object",
        ));
    };
    if text(&v, &["errorCode", "errorMsg"]).is_some()
        || v.get("success") == Some(&Value::Bool(false))
    {
        let spent = text(&v, &["errorCode"]).as_deref() == Some(SPENT_CODE);
        return Err(RefreshError {
            spent,
            ..RefreshError::fatal(format!("token refresh refused{}", detail(Some(&v))))
        });
    }
    let obj = ["result", "data"]
        .iter()
        .find_map(|k| v.get(*k).filter(|o| o.is_object()))
        .unwrap_or(&v);
    let access = text(obj, &["accessToken", "access_token"]).ok_or_else(|| {
        RefreshError::fatal("token refresh failed: the answer has no accessToken")
    })?;
    let lifetime = match obj.get("expiresIn").or_else(|| obj.get("expires_in")) {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|s| *s > 0)
    .map(Duration::from_secs)
    .unwrap_or(DEFAULT_LIFETIME);
    Ok(Grant {
        access_token: Secret::new(access),
        refresh_token: text(obj, &["refreshToken", "refresh_token"]).map(Secret::new),
        lifetime,
        identity: UserIdentity {
            corp_id: text(obj, &["corpId", "corp_id"]).unwrap_or_default(),
            user_id: text(obj, &["userId", "user_id"]).unwrap_or_default(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants() {
        let g = parse_grant(
            200,
            br#"{"accessToken":"A2","refreshToken":"R2","expiresIn":7200,"corpId":"c"}"#,
        )
        .unwrap();
        assert_eq!(g.access_token.expose(), "A2");
        assert_eq!(g.refresh_token.unwrap().expose(), "R2");
        assert_eq!(g.lifetime, Duration::from_secs(7200));
        assert_eq!(
            g.identity,
            UserIdentity {
                corp_id: "c".into(),
                user_id: String::new()
            }
        );
        let g = parse_grant(
            200,
            br#"{"success":true,"result":{"accessToken":"A3","expiresIn":"60","corpId":"c3","userId":"u3"}}"#,
        )
        .unwrap();
        assert_eq!(
            (g.identity.corp_id.as_str(), g.identity.user_id.as_str()),
            ("c3", "u3")
        );
        assert_eq!(
            (g.access_token.expose(), g.refresh_token, g.lifetime),
            ("A3", None, Duration::from_secs(60))
        );
        let g = parse_grant(200, br#"{"accessToken":"A4"}"#).unwrap();
        assert_eq!(g.lifetime, DEFAULT_LIFETIME);
    }

    #[test]
    fn failures() {
        let e = parse_grant(
            200,
            br#"{"errorCode":"invalidParameter.authCode.notFound","errorMsg":"gone"}"#,
        )
        .unwrap_err();
        assert!(!e.transient && e.spent);
        assert!(
            e.message
                .contains("invalidParameter.authCode.notFound: gone"),
            "{e:?}"
        );
        let e = parse_grant(200, br#"{"refreshToken":"x"}"#).unwrap_err();
        assert!(e.message.contains("no accessToken") && !e.transient);
        let e = parse_grant(400, br#"{"code":"invalid_grant","message":"expired"}"#).unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.transient),
            (
                "token refresh refused: HTTP 400: invalid_grant: expired",
                false
            )
        );
        for s in [408, 429, 500, 503] {
            assert!(parse_grant(s, b"").unwrap_err().transient, "{s}");
        }
        assert!(!parse_grant(401, b"").unwrap_err().transient);
        assert!(!parse_grant(200, b"<html>").unwrap_err().transient);
    }
}
