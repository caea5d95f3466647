//! The NDJSON event line — the consume contract's stdout format — in one
//! place, for both binaries.
//!
//! `dws` writes [`EventLine`] for events it formats itself. The bus renders
//! the same line for consumers that ask for it (`Subscribe.ndjson_lines`):
//! the parts that do not depend on the delivery ([`parts`], once per event,
//! shared by every consumer), then per delivery only the subscription id,
//! the redelivered mark and the delivery count ([`write_line`]). The two
//! produce the same bytes (a property test says so), so a consumer can pass
//! the bus's lines to stdout untouched.
//!
//! Field order (fields are only ever added, at the end), empty optional
//! fields omitted: `type, seq, event_id, event_born_time, event_corp_id,
//! event_type, event_unified_app_id, subscribe_id, source_id, rule_type,
//! data, headers, received_at_unix_ms, redelivered, delivery`.

use std::{collections::BTreeMap, io::Write};

use serde::Serialize;

use crate::v1;

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// One event as a JSON object, in the contract's field order.
#[derive(Serialize)]
pub struct EventLine<'a> {
    #[serde(flatten)]
    head: Head<'a>,
    #[serde(skip_serializing_if = "str::is_empty")]
    subscribe_id: &'a str,
    #[serde(flatten)]
    tail: Tail<'a>,
    redelivered: bool,
    /// How many times the subscription delivered this event (this one too).
    #[serde(skip_serializing_if = "is_zero_u32")]
    delivery: u32,
}

#[derive(Serialize)]
struct Head<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    #[serde(skip_serializing_if = "str::is_empty")]
    event_id: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    event_born_time: i64,
    #[serde(skip_serializing_if = "str::is_empty")]
    event_corp_id: &'a str,
    event_type: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    event_unified_app_id: &'a str,
}

/// `data`: the payload as a JSON string (the contract's default), or with
/// `--data json` the JSON value it holds.
#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Text(&'a str),
    Json(serde_json::Value),
}

impl Data<'_> {
    fn is_empty(&self) -> bool {
        matches!(self, Data::Text(""))
    }
}

#[derive(Serialize)]
struct Tail<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    source_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    rule_type: &'a str,
    #[serde(skip_serializing_if = "Data::is_empty")]
    data: Data<'a>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: &'a BTreeMap<String, String>,
    received_at_unix_ms: i64,
}

impl<'a> From<&'a v1::Event> for EventLine<'a> {
    fn from(e: &'a v1::Event) -> Self {
        EventLine {
            head: head(e),
            subscribe_id: &e.subscription_id,
            tail: tail(e),
            redelivered: e.redelivered,
            delivery: e.delivery,
        }
    }
}

impl EventLine<'_> {
    /// `--data json`: `data` becomes the JSON value the payload holds when
    /// it is valid JSON (object key order kept, numbers as i64, u64 or f64);
    /// any other payload stays the string. An empty payload is omitted.
    pub fn data_as_json(mut self) -> Self {
        if let Data::Text(text) = self.tail.data {
            if let Ok(value) = serde_json::from_str(text) {
                self.tail.data = Data::Json(value);
            }
        }
        self
    }
}

fn head(e: &v1::Event) -> Head<'_> {
    Head {
        kind: "event",
        seq: e.seq,
        event_id: &e.event_id,
        event_born_time: e.event_born_time,
        event_corp_id: &e.event_corp_id,
        event_type: &e.event_type,
        event_unified_app_id: &e.event_unified_app_id,
    }
}

fn tail(e: &v1::Event) -> Tail<'_> {
    Tail {
        source_id: &e.source_id,
        rule_type: &e.rule_type,
        data: Data::Text(&e.data),
        headers: &e.headers,
        received_at_unix_ms: e.received_at_unix_ms,
    }
}

/// The delivery-independent parts of an event's line: `{"type":…` up to
/// before `subscribe_id`, and `"source_id":…` up to `received_at_unix_ms`.
/// Written field by field ([`crate::json`]): the bus renders one for every
/// event a consumer reads, and a property test holds it to [`EventLine`]'s
/// serde rendering, byte for byte.
pub fn parts(e: &v1::Event) -> (Vec<u8>, Vec<u8>) {
    use crate::json::{write_int, write_str};
    /// `,"name":"value"` unless the value is empty; without the comma when
    /// `out` is empty (the tail's first field).
    fn field(out: &mut Vec<u8>, name: &str, value: &str) {
        if !value.is_empty() {
            if !out.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(name.as_bytes());
            write_str(out, value);
        }
    }
    let mut head = Vec::with_capacity(64 + e.event_id.len() + e.event_type.len());
    head.extend_from_slice(b"{\"type\":\"event\",\"seq\":");
    write_int(&mut head, e.seq);
    field(&mut head, "\"event_id\":", &e.event_id);
    if e.event_born_time != 0 {
        head.extend_from_slice(b",\"event_born_time\":");
        write_int(&mut head, e.event_born_time);
    }
    field(&mut head, "\"event_corp_id\":", &e.event_corp_id);
    head.extend_from_slice(b",\"event_type\":");
    write_str(&mut head, &e.event_type);
    field(
        &mut head,
        "\"event_unified_app_id\":",
        &e.event_unified_app_id,
    );

    let mut tail = Vec::with_capacity(48 + e.data.len() + e.source_id.len());
    field(&mut tail, "\"source_id\":", &e.source_id);
    field(&mut tail, "\"rule_type\":", &e.rule_type);
    field(&mut tail, "\"data\":", &e.data);
    if !e.headers.is_empty() {
        if !tail.is_empty() {
            tail.push(b',');
        }
        tail.extend_from_slice(b"\"headers\":{");
        for (i, (k, v)) in e.headers.iter().enumerate() {
            if i > 0 {
                tail.push(b',');
            }
            write_str(&mut tail, k);
            tail.push(b':');
            write_str(&mut tail, v);
        }
        tail.push(b'}');
    }
    if !tail.is_empty() {
        tail.push(b',');
    }
    tail.extend_from_slice(b"\"received_at_unix_ms\":");
    write_int(&mut tail, e.received_at_unix_ms);
    (head, tail)
}

/// Appends one line (with its newline) from [`parts`] and the per-delivery
/// fields.
pub fn write_line(
    out: &mut Vec<u8>,
    head: &[u8],
    subscription_id: &str,
    tail: &[u8],
    redelivered: bool,
    delivery: u32,
) {
    out.extend_from_slice(head);
    if !subscription_id.is_empty() {
        out.extend_from_slice(b",\"subscribe_id\":");
        let _ = serde_json::to_writer(&mut *out, subscription_id);
    }
    if !tail.is_empty() {
        out.push(b',');
        out.extend_from_slice(tail);
    }
    out.extend_from_slice(if redelivered {
        b",\"redelivered\":true"
    } else {
        b",\"redelivered\":false"
    });
    if delivery != 0 {
        let _ = write!(out, ",\"delivery\":{delivery}");
    }
    out.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn full_line(e: &v1::Event) -> Vec<u8> {
        let mut v = serde_json::to_vec(&EventLine::from(e)).unwrap();
        v.push(b'\n');
        v
    }

    #[test]
    fn the_documented_order() {
        let e = v1::Event {
            seq: 3,
            event_id: "ev-2".into(),
            event_type: "demo.hello".into(),
            subscription_id: "s1".into(),
            data: "{\"n\":2}".into(),
            received_at_unix_ms: 10,
            delivery: 1,
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(full_line(&e)).unwrap(),
            "{\"type\":\"event\",\"seq\":3,\"event_id\":\"ev-2\",\"event_type\":\"demo.hello\",\
             \"subscribe_id\":\"s1\",\"data\":\"{\\\"n\\\":2}\",\"received_at_unix_ms\":10,\
             \"redelivered\":false,\"delivery\":1}\n"
        );
    }

    #[test]
    fn data_as_json_when_the_payload_is_json() {
        let line = |data: &str| {
            let e = v1::Event {
                seq: 1,
                event_type: "t".into(),
                data: data.into(),
                ..Default::default()
            };
            let v: serde_json::Value =
                serde_json::to_value(EventLine::from(&e).data_as_json()).unwrap();
            v.get("data").cloned()
        };
        assert_eq!(
            serde_json::to_string(&line("{\"z\":1,\"a\":[true,null]}")).unwrap(),
            "{\"z\":1,\"a\":[true,null]}"
        );
        assert_eq!(line("hello"), Some(serde_json::json!("hello")));
        assert_eq!(line("{\"a\":"), Some(serde_json::json!("{\"a\":")));
        assert_eq!(line("42"), Some(serde_json::json!(42)));
        assert_eq!(line(""), None);
        let deep = "[".repeat(10_000);
        assert_eq!(line(&deep), Some(serde_json::json!(deep)));
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "",
            "[a-z0-9._-]{1,12}",
            ".{0,30}",
            "[\"\\\\\n\t\u{0}\u{1f}é😀]{0,10}",
            "[a-z\"\\\\\u{0}-\u{1f}\u{7f}]{0,40}"
        ]
    }

    proptest! {
        #[test]
        fn the_bus_renders_exactly_what_the_client_would(
            seq in any::<u64>(), born in any::<i64>(), at in any::<i64>(),
            id in text(), corp in text(), ty in text(), app in text(), sub in text(),
            src in text(), rule in text(), data in text(),
            headers in prop::collection::btree_map(text(), text(), 0..3),
            redelivered in any::<bool>(), delivery in any::<u32>(),
        ) {
            let e = v1::Event {
                seq, event_id: id, event_born_time: born, event_corp_id: corp,
                event_type: ty, event_unified_app_id: app, subscription_id: sub.clone(),
                source_id: src, rule_type: rule, data, headers, received_at_unix_ms: at,
                redelivered, delivery,
            };
            let (head, tail) = parts(&e);
            let mut line = vec![];
            write_line(&mut line, &head, &sub, &tail, redelivered, delivery);
            let want = full_line(&e);
            prop_assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(&want));
        }
    }
}
