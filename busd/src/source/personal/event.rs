//! Where a personal-stream event's identity comes from (protocol note §6.4).
//! The gateway's header spelling is not settled (`SUB_ID`, `subscribeId`,
//! …), so every field is read from the first non-empty source in a fixed
//! order: header names exactly, then the same names case-insensitively,
//! then the `data` envelope (`{"eventId","eventKey","occurredAtMs","subId",
//! "payload"}`), which may arrive wrapped in one or two JSON strings.
//!
//! | field | headers | then `data` |
//! |---|---|---|
//! | event id | `eventId`, `messageId`, `MESSAGE_ID`, `event_id` | `eventId`, `event_id` |
//! | born time | `eventBornTime`, `time`; top-level `time` | (now) |
//! | event key | `eventType`, `EVENT_TYPE`, `event_type`, `EVENT_KEY`, `event_key`, `eventKey`; `topic` unless `*` | `eventKey`, `event_key`, `source.tag` |
//! | upstream subscription | `SUB_ID`, `subscribe_id`, `subscribeId`, `sub_id`, `subId` | `subId`, `sub_id`, `subscribeId`, `subscribe_id` |
//! | source id | `SOURCE_ID`, `source_id`, `sourceId` | (the configured `source_id`) |
//! | rule type | `RULE_TYPE`, `rule_type`, `ruleType` | `ruleType`, `rule_type`, `ext.ruleType`, `ext.rule_type` |
//! | scope | `event_scope`, `eventScope` | (`personal`) |
//!
//! An event without a key or without an upstream subscription id is no
//! event (the runner counts it malformed and acks it 400). The bus event's
//! dedup scope is `<scope>:<subscription>`, its `data` the payload object's
//! JSON text (unwrapped), its headers the frame's.

use serde_json::{Map, Value};

use crate::{
    hub::{now_ms, NewEvent},
    source::stream::{frame::Frame, one_line},
};

const EVENT_ID: &[&str] = &["eventId", "messageId", "MESSAGE_ID", "event_id"];
const BORN_TIME: &[&str] = &["eventBornTime", "time"];
const EVENT_TYPE: &[&str] = &[
    "eventType",
    "EVENT_TYPE",
    "event_type",
    "EVENT_KEY",
    "event_key",
    "eventKey",
];
const TOPIC: &[&str] = &["topic", "TOPIC"];
const SUB_ID: &[&str] = &["SUB_ID", "subscribe_id", "subscribeId", "sub_id", "subId"];
const SOURCE_ID: &[&str] = &["SOURCE_ID", "source_id", "sourceId"];
const RULE_TYPE: &[&str] = &["RULE_TYPE", "rule_type", "ruleType"];
const SCOPE: &[&str] = &["event_scope", "eventScope"];

const DATA_EVENT_ID: &[&str] = &["eventId", "event_id"];
const DATA_EVENT_KEY: &[&str] = &["eventKey", "event_key"];
const DATA_SUB_ID: &[&str] = &["subId", "sub_id", "subscribeId", "subscribe_id"];
const DATA_RULE_TYPE: &[&str] = &["ruleType", "rule_type"];

/// The first non-empty header of `names`: exact spellings first, then the
/// same names ignoring case.
fn header<'a>(f: &'a Frame, names: &[&str]) -> Option<&'a str> {
    let usable = |v: &'a String| Some(v.as_str()).filter(|v| !v.trim().is_empty());
    names
        .iter()
        .find_map(|n| f.headers.get(*n).and_then(usable))
        .or_else(|| {
            names.iter().find_map(|n| {
                f.headers
                    .iter()
                    .find(|(k, v)| k.eq_ignore_ascii_case(n) && !v.trim().is_empty())
                    .map(|(_, v)| v.as_str())
            })
        })
}

/// A string or number field of `m` as text, if non-empty.
fn text(m: &Map<String, Value>, key: &str) -> Option<String> {
    match m.get(key)? {
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
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

/// The bus event for a personal EVENT frame, or why it is not one.
pub fn to_event(f: &Frame, default_source_id: &str) -> Result<NewEvent, String> {
    let (obj, data) = payload(&f.data);
    let from_data = |keys: &[&str]| {
        obj.as_ref()
            .and_then(|m| keys.iter().find_map(|k| text(m, k)))
    };
    let nested = |outer: &str, keys: &[&str]| {
        obj.as_ref()
            .and_then(|m| m.get(outer))
            .and_then(Value::as_object)
            .and_then(|m| keys.iter().find_map(|k| text(m, k)))
    };
    let event_type = header(f, EVENT_TYPE)
        .or_else(|| header(f, TOPIC).filter(|t| t.trim() != "*"))
        .map(str::to_owned)
        .or_else(|| from_data(DATA_EVENT_KEY))
        .or_else(|| nested("source", &["tag"]))
        .ok_or_else(|| "no event key (eventType, EVENT_TYPE, eventKey, …)".to_owned())?;
    if !proto::pattern::is_valid_event_type(&event_type) {
        return Err(format!("invalid event key {:?}", one_line(&event_type, 80)));
    }
    let event_id = header(f, EVENT_ID)
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
            "no upstream subscription id (SUB_ID, subscribeId, data subId, …): not routable"
                .to_owned()
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
        to_event(&frame::parse(text).unwrap(), "open").unwrap()
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
        assert!(to_event(&f, "open").unwrap_err().contains("not routable"));
        assert!(e.event_born_time > 0);
        let f =
            frame::parse(r#"{"type":"EVENT","headers":{"topic":"*"},"data":"not json"}"#).unwrap();
        assert!(to_event(&f, "open").unwrap_err().contains("no event key"));
        let f = frame::parse(r#"{"type":"EVENT","headers":{"eventType":"bad key"}}"#).unwrap();
        assert!(to_event(&f, "open")
            .unwrap_err()
            .contains("invalid event key"));
    }
}
