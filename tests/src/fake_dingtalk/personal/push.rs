//! Personal pushes in every spelling of the identity the reference CLI
//! accepts ([`HeaderStyle`]).

use serde_json::{json, Map, Value};

use super::{HeaderStyle, PersonalEvent};
use crate::fake_dingtalk::{now_ms, FakeDingTalk};

impl FakeDingTalk {
    /// Pushes a personal frame (tracked until acked, like
    /// [`FakeDingTalk::push_event`]); returns its `messageId`.
    pub fn push_personal(&self, ev: &PersonalEvent) -> String {
        self.shared.update(|s| {
            let mid = s.message_id();
            let style = ev.style.unwrap_or(s.personal.header_style);
            let wrap = ev.wrap.unwrap_or(s.personal.data_wrap);
            let (headers, envelope) = spell(ev, style, &mid);
            let mut data = envelope.to_string();
            for _ in 0..wrap {
                data = Value::String(data).to_string();
            }
            s.log(|| {
                format!(
                    "push personal {mid} eventId={} key={} sub={} style={style:?} wrap={wrap}",
                    ev.event_id, ev.event_key, ev.sub_id
                )
            });
            let kind = ev.kind.clone().unwrap_or_else(|| "EVENT".into());
            let kind = (!kind.is_empty()).then_some(kind.as_str());
            s.enqueue_frame(&mid, &ev.event_id, kind, headers, &data);
            mid
        })
    }

    /// The frame [`FakeDingTalk::push_personal`] would send for `ev`, not
    /// tracked (send it with [`FakeDingTalk::push_raw_to`], e.g. on a
    /// connection that received `disconnect`: never redelivered); returns
    /// it with its `messageId`.
    pub fn personal_frame(&self, ev: &PersonalEvent) -> (String, String) {
        self.shared.update(|s| {
            let mid = s.message_id();
            let style = ev.style.unwrap_or(s.personal.header_style);
            let wrap = ev.wrap.unwrap_or(s.personal.data_wrap);
            let (headers, envelope) = spell(ev, style, &mid);
            let mut data = envelope.to_string();
            for _ in 0..wrap {
                data = Value::String(data).to_string();
            }
            let kind = ev.kind.clone().unwrap_or_else(|| "EVENT".into());
            let mut frame = json!({"specVersion": "1.0", "headers": headers, "data": data});
            if !kind.is_empty() {
                frame["type"] = json!(kind);
            }
            (frame.to_string(), mid)
        })
    }
}

/// The headers and data envelope of a personal push in `style`.
fn spell(ev: &PersonalEvent, style: HeaderStyle, mid: &str) -> (Map<String, Value>, Value) {
    use HeaderStyle as H;
    let now = now_ms().to_string();
    let mut headers = Map::new();
    let mut put = |k: &str, v: &str| {
        if !v.is_empty() {
            headers.insert(k.to_owned(), Value::String(v.to_owned()));
        }
    };
    let topic = if style == H::Topic {
        ev.event_key.as_str()
    } else {
        "*"
    };
    for (k, v) in [
        ("topic", topic),
        ("messageId", mid),
        ("contentType", "application/json"),
        ("time", now.as_str()),
    ] {
        put(k, v);
    }
    let (id, key, sub, rule, src) = (
        ev.event_id.as_str(),
        ev.event_key.as_str(),
        ev.sub_id.as_str(),
        ev.rule_type.as_str(),
        ev.source_id.as_str(),
    );
    let header_names: &[(&str, &str)] = match style {
        H::Sdk => &[
            ("eventId", id),
            ("eventType", key),
            ("eventBornTime", &now),
            ("eventCorpId", "dingfakecorp"),
            ("SUB_ID", sub),
        ],
        H::Upper => &[
            ("MESSAGE_ID", id),
            ("EVENT_TYPE", key),
            ("SUB_ID", sub),
            ("SOURCE_ID", src),
            ("RULE_TYPE", rule),
        ],
        H::Camel => &[
            ("eventId", id),
            ("eventType", key),
            ("subscribeId", sub),
            ("ruleType", rule),
            ("sourceId", src),
        ],
        H::Snake => &[
            ("event_id", id),
            ("event_type", key),
            ("subscribe_id", sub),
            ("source_id", src),
            ("rule_type", rule),
        ],
        H::KeyUpper => &[("EVENT_KEY", key), ("sub_id", sub)],
        H::KeySnake => &[("event_key", key), ("subId", sub)],
        H::KeyCamel => &[("eventKey", key), ("SUB_ID", sub)],
        H::Topic => &[("SUB_ID", sub)],
        H::MixedCase => &[("Event_Type", key), ("Sub_Id", sub), ("Rule_Type", rule)],
        _ => &[],
    };
    for (k, v) in header_names {
        put(k, v);
    }
    let data_keys: &[(&str, &str)] = match style {
        H::Sdk | H::DataOnly => &[("eventId", id), ("eventKey", key), ("subId", sub)],
        H::DataSnake => &[
            ("event_id", id),
            ("event_key", key),
            ("sub_id", sub),
            ("rule_type", rule),
        ],
        H::DataSubscribeId => &[("eventKey", key), ("subscribeId", sub)],
        H::DataSubscribeSnake => &[("event_key", key), ("subscribe_id", sub)],
        H::DataSourceTag => &[("subId", sub)],
        _ => &[],
    };
    let mut envelope = Map::new();
    for (k, v) in data_keys {
        envelope.insert((*k).to_owned(), json!(v));
    }
    if matches!(style, H::Sdk | H::DataOnly) {
        envelope.insert("ext".into(), json!({"ruleType": rule}));
    }
    if style == H::DataSourceTag {
        envelope.insert("source".into(), json!({"tag": key}));
    }
    envelope.insert("occurredAtMs".into(), json!(now_ms()));
    envelope.insert("payload".into(), ev.payload.clone());
    (headers, Value::Object(envelope))
}
