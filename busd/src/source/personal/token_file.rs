//! A user token file's contents: the token alone, or a JSON object in the
//! shape of the reference CLI's saved login (`internal/auth/token.go`
//! `TokenData`: `access_token`, `refresh_token`, `corp_id`, `user_id`, …),
//! which also tells who the user is. A refreshed token is written back in
//! the file's own shape: a JSON file keeps its other fields, and gains the
//! corp and user id the refresh answer told when it had none.

use serde_json::{Map, Value};

use crate::section::Secret;

/// Which token a file is read for: the JSON key that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Access,
    Refresh,
}

impl Field {
    pub fn key(self) -> &'static str {
        match self {
            Field::Access => "access_token",
            Field::Refresh => "refresh_token",
        }
    }
}

/// The user's corp and user id, as far as known ("" = unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserIdentity {
    pub corp_id: String,
    pub user_id: String,
}

impl UserIdentity {
    /// Each field of `self`, or of `other` where `self`'s is empty.
    pub fn or(self, other: &UserIdentity) -> UserIdentity {
        let pick = |a: String, b: &str| {
            if a.trim().is_empty() {
                b.trim().to_owned()
            } else {
                a.trim().to_owned()
            }
        };
        UserIdentity {
            corp_id: pick(self.corp_id, &other.corp_id),
            user_id: pick(self.user_id, &other.user_id),
        }
    }
}

/// Why a token file holds no usable token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFileError {
    /// A JSON object without that token (or not as a string).
    Missing(&'static str),
}

impl std::fmt::Display for TokenFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenFileError::Missing(key) => {
                write!(f, "the JSON token file has no {key:?} string")
            }
        }
    }
}

/// The contents as a JSON object, if they are one.
fn object(text: &str) -> Option<Map<String, Value>> {
    let t = text.trim();
    if !t.starts_with('{') {
        return None;
    }
    match serde_json::from_str(t) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

fn text_of(m: &Map<String, Value>, key: &str) -> Option<String> {
    m.get(key)
        .and_then(Value::as_str)
        .map(|s| s.trim().to_owned())
}

/// The token in a file's contents: the `field` of a JSON object, else the
/// whole text (trimmed).
pub fn token(text: &str, field: Field) -> Result<Secret, TokenFileError> {
    match object(text) {
        Some(m) => text_of(&m, field.key())
            .map(Secret::new)
            .ok_or(TokenFileError::Missing(field.key())),
        None => Ok(Secret::new(text.trim())),
    }
}

/// The identity a JSON token file carries (`corp_id`, `user_id`; also
/// `corpId`, `userId`); nothing for a bare token.
pub fn identity(text: &str) -> UserIdentity {
    let Some(m) = object(text) else {
        return UserIdentity::default();
    };
    let first = |keys: [&str; 2]| {
        keys.iter()
            .find_map(|k| text_of(&m, k).filter(|s| !s.is_empty()))
            .unwrap_or_default()
    };
    UserIdentity {
        corp_id: first(["corp_id", "corpId"]),
        user_id: first(["user_id", "userId"]),
    }
}

/// What to write back for a new `token`: for a JSON file, its object with
/// `field` replaced and the empty ones of `corp_id`/`user_id` filled from
/// `learned`; for a bare token (or unreadable contents), the token.
pub fn updated(old: Option<&str>, field: Field, token: &Secret, learned: &UserIdentity) -> String {
    let Some(mut m) = old.and_then(object) else {
        return token.expose().to_owned();
    };
    m.insert(field.key().into(), Value::String(token.expose().into()));
    let known = identity(old.unwrap_or_default());
    for (key, have, new) in [
        ("corp_id", &known.corp_id, &learned.corp_id),
        ("user_id", &known.user_id, &learned.user_id),
    ] {
        if have.is_empty() && !new.trim().is_empty() {
            m.insert(key.into(), Value::String(new.trim().into()));
        }
    }
    Value::Object(m).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGIN: &str = r#"{"access_token":" A1 ","refresh_token":"R1","corp_id":"ding1","user_id":"u7","expires_at":"2026-01-01T00:00:00Z"}"#;

    #[test]
    fn bare_and_json_tokens() {
        assert_eq!(token(" T1\n", Field::Access).unwrap().expose(), "T1");
        assert_eq!(token(LOGIN, Field::Access).unwrap().expose(), "A1");
        assert_eq!(token(LOGIN, Field::Refresh).unwrap().expose(), "R1");
        assert_eq!(
            token(r#"{"corp_id":"c"}"#, Field::Refresh),
            Err(TokenFileError::Missing("refresh_token"))
        );
        // Not an object: taken as the token itself.
        assert_eq!(token("{oops", Field::Access).unwrap().expose(), "{oops");
    }

    #[test]
    fn identities() {
        let id = identity(LOGIN);
        assert_eq!((id.corp_id.as_str(), id.user_id.as_str()), ("ding1", "u7"));
        assert_eq!(identity("T1"), UserIdentity::default());
        let camel = identity(r#"{"access_token":"a","corpId":"c2","userId":""}"#);
        assert_eq!((camel.corp_id.as_str(), camel.user_id.as_str()), ("c2", ""));
        let config = UserIdentity {
            corp_id: "cfg".into(),
            user_id: String::new(),
        };
        let merged = config.or(&id);
        assert_eq!(
            (merged.corp_id.as_str(), merged.user_id.as_str()),
            ("cfg", "u7")
        );
    }

    #[test]
    fn write_back_keeps_the_shape() {
        let learned = UserIdentity {
            corp_id: "other".into(),
            user_id: "u9".into(),
        };
        assert_eq!(
            updated(Some("T1\n"), Field::Access, &Secret::new("T2"), &learned),
            "T2"
        );
        assert_eq!(
            updated(None, Field::Access, &Secret::new("T2"), &learned),
            "T2"
        );
        let v: Value = serde_json::from_str(&updated(
            Some(LOGIN),
            Field::Refresh,
            &Secret::new("R2"),
            &learned,
        ))
        .unwrap();
        // The saved identity is kept (like the reference's refresh), the
        // other fields too.
        assert_eq!(v["refresh_token"], "R2");
        assert_eq!(v["access_token"], " A1 ");
        assert_eq!(
            (&v["corp_id"], &v["user_id"]),
            (&"ding1".into(), &"u7".into())
        );
        assert_eq!(v["expires_at"], "2026-01-01T00:00:00Z");
        let v: Value = serde_json::from_str(&updated(
            Some(r#"{"access_token":"A1"}"#),
            Field::Access,
            &Secret::new("A2"),
            &learned,
        ))
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"access_token": "A2", "corp_id": "other", "user_id": "u9"})
        );
    }
}
