//! Create requests: a local subscription's upstream spec translated as the
//! reference CLI does it (`internal/event/personal/registry.go`
//! `BuildRuleParam`, `BuildFilter`, `IdempotencyKey`, `CanonicalJSON`;
//! `internal/event/personal/client.go` `Identity.Key`,
//! `buildCreateRequest`):
//!
//! - `filterRule`: the rule parameter as a JSON *string*: `{}` (at, all),
//!   `{"targetUid","targetUidType"}` (singleChat, sender),
//!   `{"openConversationId"}` (group).
//! - `ext.filter`: the `--filter-json` value (any JSON; field aliases mapped), the
//!   content terms (`contains_any` over `payload.body.content`), or both
//!   under `and` — in that order.
//! - `ext.idempotencyKey`: `dws-cli-` + 8 bytes of SHA-256 over
//!   `identity key \0 event key \0 rule type \0 canonical rule \0
//!   canonical filter`, the identity key being `corp_user\0corp\0user\0client\0source`
//!   or `local_subject\0subject\0client\0source`; canonical JSON is Go's
//!   `json.Marshal` ([`go_json`]).
//! - `ext.name`: the consumer's `--name` (one per subscription, like the
//!   reference's `--name`), else the profile's `subscription_name`.

use std::time::{Duration, SystemTime};

use proto::v1::UpstreamSpec;
use serde_json::{json, Value};

/// Who creates a subscription (the reference's `personal.Identity`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub corp_id: String,
    pub user_id: String,
    pub client_id: String,
    pub source_id: String,
    /// `refresh:<sha256 hex>` or `access:<sha256 hex>` of the token, used
    /// when the corp or user id is unknown.
    pub local_subject: String,
}

impl Identity {
    /// The reference's `Identity.Key()`, fields joined by NUL.
    pub fn key(&self) -> String {
        let t = |s: &String| s.trim().to_owned();
        let (corp, user, client, source) = (
            t(&self.corp_id),
            t(&self.user_id),
            t(&self.client_id),
            t(&self.source_id),
        );
        let subject = t(&self.local_subject);
        let parts = if !corp.is_empty() && !user.is_empty() {
            vec!["corp_user".to_owned(), corp, user, client, source]
        } else if !subject.is_empty() {
            vec!["local_subject".to_owned(), subject, client, source]
        } else {
            vec!["unknown".to_owned(), corp, user, client, source]
        };
        parts.join("\x00")
    }

    /// Whether the key needs the local subject (no corp + user).
    pub fn needs_subject(&self) -> bool {
        self.corp_id.trim().is_empty() || self.user_id.trim().is_empty()
    }
}

/// JSON text as Go's `encoding/json.Marshal` writes a decoded value: object
/// keys sorted, no spaces, `<`, `>`, `&`, U+2028 and U+2029 escaped, control
/// characters as `\n`-style or `\u00XX` escapes, numbers as `float64`.
pub fn go_json(v: &Value) -> String {
    let mut out = String::new();
    write_go(v, &mut out);
    out
}

fn write_go(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&go_float(n.as_f64().unwrap_or(0.0))),
        Value::String(s) => go_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                go_string(k, out);
                out.push(':');
                write_go(&o[k], out);
            }
            out.push('}');
        }
    }
}

fn go_string(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{0}'..='\u{1f}' => {
                let b = c as u8;
                out.push_str("\\u00");
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 0xf) as usize] as char);
            }
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A `float64` as Go's encoder writes it: shortest digits, fixed notation
/// from 1e-6 to 1e21, otherwise `1e+21` / `1e-7` style.
fn go_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let e = format!("{f:e}");
        match e.split_once('e') {
            Some((m, exp)) if !exp.starts_with('-') => format!("{m}e+{exp}"),
            _ => e,
        }
    } else {
        format!("{f}")
    }
}

/// A create request derived from a local subscription's upstream spec.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRequest {
    pub event_key: String,
    pub rule_type: String,
    /// `{}`, `{"targetUid","targetUidType"}` or `{"openConversationId"}`.
    pub rule_param: Value,
    /// The content filter object, if any.
    pub filter: Option<Value>,
    pub ttl: Duration,
    /// `ext.name` asked for by the consumer (`--name`); empty: the
    /// profile's.
    pub name: String,
}

/// `filter_json` field aliases (the reference CLI's).
const FIELD_ALIASES: &[(&str, &str)] = &[
    ("content", "payload.body.content"),
    ("conversation_id", "payload.body.openConversationId"),
    ("sender", "payload.body.sender"),
    (
        "sender_open_dingtalk_id",
        "payload.body.senderOpenDingTalkId",
    ),
];

fn map_field_aliases(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(f)) = o.get_mut("field") {
                if let Some((_, full)) = FIELD_ALIASES.iter().find(|(a, _)| a == f) {
                    *f = (*full).to_owned();
                }
            }
            o.values_mut().for_each(map_field_aliases);
        }
        Value::Array(a) => a.iter_mut().for_each(map_field_aliases),
        _ => {}
    }
}

/// A subscription spec the personal stream cannot take: the consumer's
/// usage error, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

impl CreateRequest {
    /// Checks and translates a spec (the bus does not trust the client's
    /// validation); the error is the consumer's usage error.
    pub fn from_spec(
        keys: &[String],
        spec: &UpstreamSpec,
        ttl: Duration,
    ) -> Result<CreateRequest, SpecError> {
        Self::checked(keys, spec, ttl).map_err(SpecError)
    }

    fn checked(
        keys: &[String],
        spec: &UpstreamSpec,
        ttl: Duration,
    ) -> Result<CreateRequest, String> {
        let [key] = keys else {
            return Err("a personal-stream subscription takes exactly one event key".into());
        };
        if !proto::pattern::is_valid_event_type(key) {
            return Err(format!(
                "{key}: a personal-stream subscription needs an exact event key"
            ));
        }
        let (user, odid, group) = (
            spec.user.trim(),
            spec.open_dingtalk_id.trim(),
            spec.group.trim(),
        );
        let target = match (user.is_empty(), odid.is_empty()) {
            (false, true) => Some(("staffId", user)),
            (true, false) => Some(("openDingtalkId", odid)),
            (true, true) => None,
            (false, false) => return Err("give only one of --user and --open-dingtalk-id".into()),
        };
        let rule = spec.rule_type.as_str();
        let rule_param = match (rule, target, group.is_empty()) {
            ("at" | "all", None, true) => json!({}),
            ("singleChat" | "sender", Some((kind, uid)), true) => {
                json!({"targetUid": uid, "targetUidType": kind})
            }
            ("group", None, false) => json!({"openConversationId": group}),
            ("at" | "all" | "singleChat" | "sender" | "group", ..) => {
                return Err(format!(
                    "rule {rule}: singleChat and sender take exactly one of --user or --open-dingtalk-id, \
                     group takes --group, at and all take neither"
                ))
            }
            _ => {
                return Err(format!(
                    "invalid rule {rule:?}: use at, singleChat, sender, group or all"
                ))
            }
        };
        // The reference's `BuildFilter`: the `--filter-json` object first,
        // then the content terms (its `--query` is comma-separated).
        let mut filters = vec![];
        if !spec.filter_json.trim().is_empty() {
            // Any JSON value, as the reference takes it.
            let mut f: Value = serde_json::from_str(&spec.filter_json)
                .map_err(|e| format!("invalid --filter-json: {e}"))?;
            map_field_aliases(&mut f);
            filters.push(f);
        }
        let terms: Vec<&str> = spec
            .query
            .iter()
            .flat_map(|q| q.split(','))
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .collect();
        if !terms.is_empty() {
            filters.push(
                json!({"field": "payload.body.content", "op": "contains_any", "value": terms}),
            );
        }
        let filter = match filters.len() {
            0 => None,
            1 => filters.pop(),
            _ => Some(json!({ "and": filters })),
        };
        Ok(CreateRequest {
            event_key: key.clone(),
            rule_type: rule.to_owned(),
            rule_param,
            filter,
            ttl,
            name: spec.name.trim().to_owned(),
        })
    }

    /// Identical specs have identical keys (the TTL is not part of it).
    pub fn share_key(&self) -> String {
        go_json(&json!([
            self.event_key,
            self.rule_type,
            self.rule_param,
            self.filter
        ]))
    }

    /// The reference's `IdempotencyKey`: `dws-cli-` + the first 8 bytes
    /// (hex) of SHA-256 over the identity key, event key, rule type,
    /// canonical rule parameter and canonical filter, joined by NUL.
    pub fn idempotency_key(&self, identity: &Identity) -> String {
        let input = [
            identity.key(),
            self.event_key.clone(),
            self.rule_type.clone(),
            go_json(&self.rule_param),
            self.filter.as_ref().map(go_json).unwrap_or_default(),
        ]
        .join("\x00");
        let digest = ring::digest::digest(&ring::digest::SHA256, input.as_bytes());
        let hex: String = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("dws-cli-{hex}")
    }

    /// The create body (the reference's `buildCreateRequest`); `name` goes
    /// to `ext.name` when not empty.
    pub fn body(&self, identity: &Identity, name: &str, now: SystemTime) -> Value {
        let mut ext = json!({ "ruleType": self.rule_type });
        if !name.is_empty() {
            ext["name"] = json!(name);
        }
        if let Some(f) = &self.filter {
            ext["filter"] = f.clone();
        }
        ext["idempotencyKey"] = json!(self.idempotency_key(identity));
        let mut body = json!({ "clientId": identity.client_id });
        if !identity.source_id.is_empty() {
            body["sourceId"] = json!(identity.source_id);
        }
        body["eventKey"] = json!(self.event_key);
        body["filterRule"] = json!(go_json(&self.rule_param));
        body["deliveryPref"] = json!("realtime");
        if !self.ttl.is_zero() {
            body["expiresAt"] =
                json!(humantime::format_rfc3339_seconds(now + self.ttl).to_string());
        }
        body["ext"] = ext;
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rule: &str) -> UpstreamSpec {
        UpstreamSpec {
            rule_type: rule.into(),
            ..UpstreamSpec::default()
        }
    }

    fn keys(k: &str) -> Vec<String> {
        vec![k.to_owned()]
    }

    fn corp_user() -> Identity {
        Identity {
            corp_id: "corp1".into(),
            user_id: "user1".into(),
            client_id: "cid".into(),
            source_id: "open".into(),
            local_subject: String::new(),
        }
    }

    #[test]
    fn create_bodies() {
        let s = UpstreamSpec {
            user: " u1 ".into(),
            query: vec!["hello, world".into()],
            filter_json: r#"{"field":"sender","op":"eq","value":"x"}"#.into(),
            ..spec("singleChat")
        };
        let r = CreateRequest::from_spec(
            &keys("user_im_message_receive_o2o"),
            &s,
            Duration::from_secs(600),
        )
        .unwrap();
        let now = humantime::parse_rfc3339("2030-01-02T03:04:05Z").unwrap();
        let b = r.body(&corp_user(), "my-bus", now);
        assert_eq!(b["clientId"], "cid");
        assert_eq!(b["sourceId"], "open");
        assert_eq!(b["eventKey"], "user_im_message_receive_o2o");
        assert_eq!(b["deliveryPref"], "realtime");
        assert_eq!(b["expiresAt"], "2030-01-02T03:14:05Z");
        assert_eq!(
            b["filterRule"], r#"{"targetUid":"u1","targetUidType":"staffId"}"#,
            "Go's json.Marshal of the rule parameter"
        );
        assert_eq!(b["ext"]["ruleType"], "singleChat");
        assert_eq!(b["ext"]["name"], "my-bus");
        // The reference's order: the filter object first, then the terms
        // (comma-separated, like its --query).
        assert_eq!(
            b["ext"]["filter"],
            json!({"and": [
                {"field": "payload.body.sender", "op": "eq", "value": "x"},
                {"field": "payload.body.content", "op": "contains_any", "value": ["hello", "world"]},
            ]})
        );
        let idem = b["ext"]["idempotencyKey"].as_str().unwrap();
        assert!(
            idem.starts_with("dws-cli-") && idem.len() == 8 + 16,
            "{idem}"
        );

        let g = CreateRequest::from_spec(
            &keys("user_im_group_updated"),
            &UpstreamSpec {
                group: "cid-1".into(),
                ..spec("group")
            },
            Duration::ZERO,
        )
        .unwrap();
        let no_source = Identity {
            source_id: String::new(),
            ..corp_user()
        };
        let b = g.body(&no_source, "", now);
        assert_eq!(b["filterRule"], r#"{"openConversationId":"cid-1"}"#);
        assert!(b.get("expiresAt").is_none() && b.get("sourceId").is_none());
        assert!(b["ext"].get("filter").is_none() && b["ext"].get("name").is_none());
        let at = CreateRequest::from_spec(
            &keys("user_im_message_receive_at"),
            &spec("at"),
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(at.body(&corp_user(), "", now)["filterRule"], "{}");
        let o = CreateRequest::from_spec(
            &keys("k"),
            &UpstreamSpec {
                open_dingtalk_id: "od".into(),
                ..spec("sender")
            },
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(o.rule_param["targetUidType"], "openDingtalkId");

        for (k, s) in [
            (keys("a.*"), spec("at")),
            (vec![], spec("at")),
            (keys("k"), spec("nope")),
            (keys("k"), spec("singleChat")),
            (
                keys("k"),
                UpstreamSpec {
                    group: "g".into(),
                    ..spec("at")
                },
            ),
            (
                keys("k"),
                UpstreamSpec {
                    user: "u".into(),
                    open_dingtalk_id: "o".into(),
                    ..spec("sender")
                },
            ),
            (
                keys("k"),
                UpstreamSpec {
                    filter_json: "[1".into(),
                    ..spec("at")
                },
            ),
        ] {
            assert!(
                CreateRequest::from_spec(&k, &s, Duration::ZERO).is_err(),
                "{k:?} {s:?}"
            );
        }
    }

    /// Golden values: SHA-256 over the NUL-joined fields, computed outside
    /// this code (Python `hashlib`) from the reference's definition.
    #[test]
    fn idempotency_keys_are_the_reference_ones() {
        let g = CreateRequest::from_spec(
            &keys("user_im_message_receive_group"),
            &UpstreamSpec {
                group: "cid-42".into(),
                query: vec!["build".into(), "fail".into()],
                filter_json: r#"{"value":"u9","field":"sender","op":"eq"}"#.into(),
                ..spec("group")
            },
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(g.idempotency_key(&corp_user()), "dws-cli-3a3ccc2908019d5d");
        let at = CreateRequest::from_spec(
            &keys("user_im_message_receive_at"),
            &spec("at"),
            Duration::ZERO,
        )
        .unwrap();
        let local = Identity {
            corp_id: "corp1".into(),
            user_id: String::new(),
            local_subject:
                "access:1a7674eb4ee78df7e1ac439a93c3fa8e3c945784d4dec9fd8e3011738b2f1d62".into(),
            ..corp_user()
        };
        assert!(local.needs_subject());
        assert_eq!(at.idempotency_key(&local), "dws-cli-88b460eeefa9511c");
        // Another user of the same app gets another key.
        let other = Identity {
            user_id: "user2".into(),
            ..corp_user()
        };
        assert_ne!(at.idempotency_key(&other), at.idempotency_key(&corp_user()));
        assert_eq!(
            corp_user().key(),
            "corp_user\x00corp1\x00user1\x00cid\x00open"
        );
        assert_eq!(Identity::default().key(), "unknown\x00\x00\x00\x00");
    }

    #[test]
    fn sharing_and_idempotency_keys_ignore_key_order_and_ttl() {
        let a = CreateRequest::from_spec(
            &keys("k"),
            &UpstreamSpec {
                filter_json: r#"{"op":"eq","field":"content","value":"x"}"#.into(),
                ..spec("at")
            },
            Duration::from_secs(1),
        )
        .unwrap();
        let b = CreateRequest::from_spec(
            &keys("k"),
            &UpstreamSpec {
                filter_json: r#"{"value":"x","field":"content","op":"eq"}"#.into(),
                ..spec("at")
            },
            Duration::from_secs(99),
        )
        .unwrap();
        assert_eq!(a.share_key(), b.share_key());
        let id = corp_user();
        assert_eq!(a.idempotency_key(&id), b.idempotency_key(&id));
        let c = CreateRequest::from_spec(&keys("k"), &spec("at"), Duration::ZERO).unwrap();
        assert_ne!(a.share_key(), c.share_key());
    }

    #[test]
    fn go_json_is_gos_marshal() {
        assert_eq!(
            go_json(&json!({"b": [{"d": 1, "c": 2}], "a": null, "B": true})),
            r#"{"B":true,"a":null,"b":[{"c":2,"d":1}]}"#
        );
        assert_eq!(
            go_json(&json!(
                "<a> & \"q\" \\ \n\t\r\u{8}\u{c}\u{1} \u{2028} é \u{7f}"
            )),
            "\"\\u003ca\\u003e \\u0026 \\\"q\\\" \\\\ \\n\\t\\r\\b\\f\\u0001 \\u2028 é \u{7f}\""
        );
        let n: Value = serde_json::from_str(
            "[1, 1.0, -0.0, 1.5, 1e21, 1e20, 0.000001, 1e-7, 12345678901234567890, 2.5e-10]",
        )
        .unwrap();
        assert_eq!(
            go_json(&n),
            "[1,1,-0,1.5,1e+21,100000000000000000000,0.000001,1e-7,12345678901234567000,2.5e-10]"
        );
    }
}
