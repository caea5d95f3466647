//! Where a personal-stream event's identity comes from (protocol note §6.4).
//! The gateway's header spelling is not settled (`SUB_ID`, `subscribeId`,
//! …), so every field is read as the reference CLI reads it
//! (`internal/event/source/personal.go` `rawEventFromDataFrame`): from the
//! first non-empty source in a fixed order, each header name tried exactly
//! and then case-insensitively (`headerAny`), then the `data` envelope
//! (`{"eventId","eventKey","occurredAtMs","subId","payload"}`, keys also
//! case-insensitively), which may arrive wrapped in one or two JSON strings.
//! The frame's `type` is not looked at.
//!
//! | field | headers | then `data` |
//! |---|---|---|
//! | event id | `eventId`, `messageId` (exactly); `MESSAGE_ID`, `messageId`, `event_id`, `eventId` | `eventId`, `event_id` |
//! | born time | `eventBornTime`, `time`; top-level `time` | (now) |
//! | event key | `eventType` (exactly); `EVENT_TYPE`, `event_type`, `eventType`, `EVENT_KEY`, `event_key`, `eventKey`; `TOPIC`/`topic` unless `*` | `eventKey`, `event_key`, `source.tag` |
//! | upstream subscription | `SUB_ID`, `subscribe_id`, `subscribeId`, `sub_id`, `subId` | `subId`, `sub_id`, `subscribeId`, `subscribe_id` |
//! | source id | `SOURCE_ID`, `source_id`, `sourceId` | (the configured `source_id`) |
//! | rule type | `RULE_TYPE`, `rule_type`, `ruleType` | `ruleType`, `rule_type`, `ext.ruleType`, `ext.rule_type` |
//! | scope | `event_scope`, `eventScope` | (`personal`) |
//!
//! A frame without a key or without an upstream subscription id cannot be
//! routed ([`Unroutable`]: the runner acks it 200, like the reference, and
//! counts it per reason). The bus event's dedup scope is
//! `<scope>:<subscription>`, its `data` the payload object's JSON text
//! (unwrapped), its headers the frame's.

use serde_json::{Map, Value};

use crate::{
    clock::now_ms,
    hub::NewEvent,
    source::stream::{frame::Frame, one_line, Unroutable},
};

/// Reasons of unroutable personal frames (counted per reason).
pub const NO_EVENT_KEY: &str = "no event key";
pub const INVALID_EVENT_KEY: &str = "invalid event key";
pub const NO_SUBSCRIPTION_ID: &str = "no subscription id";

/// Tried exactly first (the SDK's `eventId`, the frame's `messageId`), then
/// each of [`EVENT_ID`] exactly and ignoring case.
const EVENT_ID_EXACT: &[&str] = &["eventId", "messageId"];
const EVENT_ID: &[&str] = &["MESSAGE_ID", "messageId", "event_id", "eventId"];
const BORN_TIME: &[&str] = &["eventBornTime", "time"];
/// `eventType` exactly (the SDK header), then each of these exactly and
/// ignoring case.
const EVENT_TYPE_EXACT: &str = "eventType";
const EVENT_TYPE: &[&str] = &[
    "EVENT_TYPE",
    "event_type",
    "eventType",
    "EVENT_KEY",
    "event_key",
    "eventKey",
];
const TOPIC: &[&str] = &["TOPIC", "topic"];
const SUB_ID: &[&str] = &["SUB_ID", "subscribe_id", "subscribeId", "sub_id", "subId"];
const SOURCE_ID: &[&str] = &["SOURCE_ID", "source_id", "sourceId"];
const RULE_TYPE: &[&str] = &["RULE_TYPE", "rule_type", "ruleType"];
const SCOPE: &[&str] = &["event_scope", "eventScope"];

const DATA_EVENT_ID: &[&str] = &["eventId", "event_id"];
const DATA_EVENT_KEY: &[&str] = &["eventKey", "event_key"];
const DATA_SUB_ID: &[&str] = &["subId", "sub_id", "subscribeId", "subscribe_id"];
const DATA_RULE_TYPE: &[&str] = &["ruleType", "rule_type"];

/// The first non-empty header of `names`, trimmed: each name exactly, then
/// ignoring case, before the next name (the reference's `headerAny`).
fn header<'a>(f: &'a Frame, names: &[&str]) -> Option<&'a str> {
    let usable = |v: &'a String| Some(v.trim()).filter(|v| !v.is_empty());
    names.iter().find_map(|n| {
        f.headers.get(*n).and_then(usable).or_else(|| {
            f.headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(n))
                .find_map(|(_, v)| usable(v))
        })
    })
}

/// The header `name` exactly, trimmed, if non-empty.
fn exact<'a>(f: &'a Frame, name: &str) -> Option<&'a str> {
    f.headers
        .get(name)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// A string (or number) field of `m` as trimmed text, if non-empty: `key`
/// exactly, then ignoring case.
fn text(m: &Map<String, Value>, key: &str) -> Option<String> {
    let usable = |v: &Value| match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    m.get(key).and_then(usable).or_else(|| {
        m.iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(key))
            .find_map(|(_, v)| usable(v))
    })
}

/// The object under `key` (exactly, then ignoring case).
fn object<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    m.get(key).and_then(Value::as_object).or_else(|| {
        m.iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(key))
            .find_map(|(_, v)| v.as_object())
    })
}

/// The payload object and its JSON text: `data` itself, or peeled out of
/// one or two levels of JSON-string wrapping. `None` (and `data` as it
/// came) when it is not a JSON object.
pub fn payload(data: &str) -> (Option<Map<String, Value>>, String) {
    let mut text = data.to_owned();
    for _ in 0..3 {
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(m)) => return (Some(m), text),
            Ok(Value::String(inner)) => text = inner,
            _ => break,
        }
    }
    (None, data.to_owned())
}

/// The bus event for a personal frame, or why it cannot be routed.
pub fn to_event(f: &Frame, default_source_id: &str) -> Result<NewEvent, Unroutable> {
    let (obj, data) = payload(&f.data);
    let from_data = |keys: &[&str]| {
        obj.as_ref()
            .and_then(|m| keys.iter().find_map(|k| text(m, k)))
    };
    let nested = |outer: &str, keys: &[&str]| {
        obj.as_ref()
            .and_then(|m| object(m, outer))
            .and_then(|m| keys.iter().find_map(|k| text(m, k)))
    };
    let event_type = exact(f, EVENT_TYPE_EXACT)
        .or_else(|| header(f, EVENT_TYPE))
        .or_else(|| header(f, TOPIC).filter(|t| *t != "*"))
        .map(str::to_owned)
        .or_else(|| from_data(DATA_EVENT_KEY))
        .or_else(|| nested("source", &["tag"]))
        .ok_or_else(|| {
            Unroutable::new(
                NO_EVENT_KEY,
                "no eventType, EVENT_TYPE, eventKey, … header or data key",
            )
        })?;
    if !proto::pattern::is_valid_event_type(&event_type) {
        return Err(Unroutable::new(
            INVALID_EVENT_KEY,
            format!("{:?} is not a valid event type", one_line(&event_type, 80)),
        ));
    }
    let event_id = EVENT_ID_EXACT
        .iter()
        .find_map(|n| exact(f, n))
        .or_else(|| header(f, EVENT_ID))
        .map(str::to_owned)
        .or_else(|| from_data(DATA_EVENT_ID))
        .unwrap_or_default();
    let ms = |v: &str| v.trim().parse::<i64>().ok().filter(|t| *t > 0);
    let born = BORN_TIME
        .iter()
        .find_map(|k| header(f, &[k]).and_then(ms))
        .or(f.time)
        .unwrap_or_else(now_ms);
    // Without it the event cannot be routed: delivering it to every
    // subscription of its key would hand one rule's events to another's
    // consumer.
    let sub_id = header(f, SUB_ID)
        .map(str::to_owned)
        .or_else(|| from_data(DATA_SUB_ID))
        .ok_or_else(|| {
            Unroutable::new(
                NO_SUBSCRIPTION_ID,
                format!("{event_type}: no SUB_ID, subscribeId, data subId, … to route it by"),
            )
        })?;
    let source_id = header(f, SOURCE_ID).unwrap_or(default_source_id).to_owned();
    let rule_type = header(f, RULE_TYPE)
        .map(str::to_owned)
        .or_else(|| from_data(DATA_RULE_TYPE))
        .or_else(|| nested("ext", DATA_RULE_TYPE))
        .unwrap_or_default();
    let scope = header(f, SCOPE).unwrap_or("personal");
    Ok(NewEvent {
        scope: format!("{scope}:{sub_id}"),
        event_id,
        event_type,
        event_born_time: born,
        event_corp_id: header(f, &["eventCorpId"]).unwrap_or("").to_owned(),
        event_unified_app_id: header(f, &["eventUnifiedAppId"]).unwrap_or("").to_owned(),
        source_id,
        rule_type,
        upstream_subscription: sub_id,
        data,
        headers: f.headers.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::stream::frame;

    fn ev(text: &str) -> NewEvent {
        to_event(&frame::parse_lenient(text).unwrap(), "open").unwrap()
    }

    #[test]
    fn sdk_headers() {
        let e = ev(
            r#"{"type":"EVENT","headers":{"topic":"*","messageId":"m1","eventId":"e1","eventType":"user_im_message_receive_o2o","eventBornTime":"1700000000100","SUB_ID":"sub-1"},"data":"{\"payload\":{}}"}"#,
        );
        assert_eq!(
            (
                e.event_id.as_str(),
                e.event_type.as_str(),
                e.event_born_time,
                e.upstream_subscription.as_str(),
                e.scope.as_str(),
                e.source_id.as_str()
            ),
            (
                "e1",
                "user_im_message_receive_o2o",
                1_700_000_000_100,
                "sub-1",
                "personal:sub-1",
                "open"
            )
        );
        assert_eq!(e.data, r#"{"payload":{}}"#);
    }

    #[test]
    fn upper_case_and_camel_case_headers() {
        let e = ev(
            r#"{"type":"event","headers":{"MESSAGE_ID":"e2","EVENT_TYPE":"user_im_group_updated","SUB_ID":"s2","SOURCE_ID":"src","RULE_TYPE":"group","time":"1700000000200"},"data":"{}"}"#,
        );
        assert_eq!(
            (
                e.event_id.as_str(),
                e.event_type.as_str(),
                e.upstream_subscription.as_str(),
                e.source_id.as_str(),
                e.rule_type.as_str(),
                e.event_born_time
            ),
            (
                "e2",
                "user_im_group_updated",
                "s2",
                "src",
                "group",
                1_700_000_000_200
            )
        );
        let e = ev(
            r#"{"type":"EVENT","headers":{"messageId":"m3","eventType":"k.x","subscribeId":"s3","ruleType":"at","sourceId":"open2","Event_Scope":"team"},"data":"{}"}"#,
        );
        assert_eq!(
            (
                e.event_id.as_str(),
                e.upstream_subscription.as_str(),
                e.rule_type.as_str(),
                e.source_id.as_str(),
                e.scope.as_str()
            ),
            ("m3", "s3", "at", "open2", "team:s3")
        );
        // Exact spellings win over case-insensitive ones.
        let e = ev(
            r#"{"type":"EVENT","headers":{"SUB_ID":"exact","sub_ID":"ci","eventtype":"ci.type"},"data":"{}"}"#,
        );
        assert_eq!(e.upstream_subscription, "exact");
        assert_eq!(e.event_type, "ci.type");
    }

    #[test]
    fn data_envelope_wrapped_once_or_twice() {
        let inner = serde_json::json!({
            "eventId": "e4", "eventKey": "user_im_message_receive_at", "subId": "s4",
            "ext": {"ruleType": "at"}, "payload": {"body": {"content": "hi"}}
        })
        .to_string();
        let once = Value::String(inner.clone()).to_string();
        let twice = Value::String(once.clone()).to_string();
        for data in [inner.clone(), once, twice] {
            let f = serde_json::json!({"type":"EVENT","headers":{"topic":"*"},"data": data, "time": 1_700_000_000_300_i64});
            let e = ev(&f.to_string());
            assert_eq!(
                (
                    e.event_id.as_str(),
                    e.event_type.as_str(),
                    e.upstream_subscription.as_str(),
                    e.rule_type.as_str(),
                    e.event_born_time
                ),
                (
                    "e4",
                    "user_im_message_receive_at",
                    "s4",
                    "at",
                    1_700_000_000_300
                )
            );
            assert_eq!(e.data, inner, "the payload comes unwrapped");
        }
        // Three levels are not peeled: no key to be found.
        let thrice = Value::String(Value::String(Value::String(inner).to_string()).to_string());
        let f = serde_json::json!({"type":"EVENT","headers":{},"data": thrice.to_string()});
        assert!(to_event(&frame::parse(&f.to_string()).unwrap(), "open").is_err());
    }

    /// Each header name is tried exactly and then ignoring case before the
    /// next one (`headerAny`), and data keys ignore case too.
    #[test]
    fn names_are_tried_in_the_reference_order() {
        // `EVENT_TYPE` (case-insensitively `event_type`) comes before `EVENT_KEY`.
        let e = ev(
            r#"{"type":"x","headers":{"EVENT_KEY":"k.second","event_type":"k.first","Sub_Id":"s"},"data":""}"#,
        );
        assert_eq!(
            (e.event_type.as_str(), e.upstream_subscription.as_str()),
            ("k.first", "s")
        );
        // Values are trimmed.
        let e = ev(r#"{"headers":{"eventType":" k.t ","SUB_ID":" s1 "}}"#);
        assert_eq!(
            (e.event_type.as_str(), e.upstream_subscription.as_str()),
            ("k.t", "s1")
        );
        let e = ev(
            r#"{"headers":{},"data":"{\"EventKey\":\"k.d\",\"SUBSCRIBE_ID\":\"s2\",\"Source\":{\"Tag\":\"x\"},\"EXT\":{\"RuleType\":\"all\"}}"}"#,
        );
        assert_eq!(
            (
                e.event_type.as_str(),
                e.upstream_subscription.as_str(),
                e.rule_type.as_str()
            ),
            ("k.d", "s2", "all")
        );
    }

    #[test]
    fn fallbacks_and_refusals() {
        let e = ev(
            r#"{"type":"EVENT","headers":{"topic":"user_oa_x","subId":"s"},"data":"{\"source\":{\"tag\":\"ignored\"}}"}"#,
        );
        assert_eq!(e.event_type, "user_oa_x", "topic when it is not *");
        let e = ev(
            r#"{"type":"EVENT","headers":{"topic":"*"},"data":"{\"sub_id\":\"s5\",\"source\":{\"tag\":\"t.tag\"}}"}"#,
        );
        assert_eq!(e.event_type, "t.tag");
        assert_eq!(e.event_id, "", "no id: the bus makes one up");
        assert_eq!(e.scope, "personal:s5");
        let f = frame::parse(r#"{"type":"EVENT","headers":{"eventType":"k.x","eventId":"e"}}"#)
            .unwrap();
        assert_eq!(to_event(&f, "open").unwrap_err().reason, NO_SUBSCRIPTION_ID);
        assert!(e.event_born_time > 0);
        let f =
            frame::parse(r#"{"type":"EVENT","headers":{"topic":"*"},"data":"not json"}"#).unwrap();
        assert_eq!(to_event(&f, "open").unwrap_err().reason, NO_EVENT_KEY);
        let f = frame::parse(r#"{"type":"EVENT","headers":{"eventType":"bad key"}}"#).unwrap();
        assert_eq!(to_event(&f, "open").unwrap_err().reason, INVALID_EVENT_KEY);
    }
}
