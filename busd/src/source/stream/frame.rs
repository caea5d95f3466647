//! DingTalk Stream frames (app and personal stream alike): decoding the
//! server's pushes and encoding our acknowledgements ("response" frames).
//!
//! A push is one JSON object per WebSocket text frame:
//! `{"specVersion"?, "type": "SYSTEM"|"EVENT"|"CALLBACK", "headers": {…},
//! "data": "<JSON text>"}`. Decoding is lenient where leniency loses
//! nothing (a missing or unknown `specVersion`, non-string header values,
//! a `data` that is not a string) and strict where there is no sane reading
//! (not JSON, not an object, no `type`, no `headers` object).
//!
//! [`parse_lenient`] is the reference CLI's reading (its frames are decoded
//! as the Go SDK's `DataFrame`: any JSON object, `type` and `headers`
//! optional), used by the streams that follow the reference.
//!
//! An ack is `{"code": N, "headers": {"messageId", "contentType"},
//! "message": "…", "data": "<JSON text>"}`; the server correlates it with
//! the push by `messageId` only.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// A decoded push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// `type`, as sent (normally upper case).
    pub kind: String,
    /// Every header, values as strings.
    pub headers: BTreeMap<String, String>,
    /// `data` as text (a JSON document for the known frame types).
    pub data: String,
    /// The optional top-level `time` (ms), when it is a positive integer.
    pub time: Option<i64>,
}

impl Frame {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
    pub fn message_id(&self) -> &str {
        self.header("messageId")
    }
    pub fn topic(&self) -> &str {
        self.header("topic")
    }
}

/// Decodes one text frame, or says (briefly, without echoing the frame) why
/// it is not a frame.
pub fn parse(text: &str) -> Result<Frame, NotAFrame> {
    decode(text, true)
}

/// Why a text frame is not a frame (the frame itself is not echoed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAFrame {
    #[error("not JSON ({error}; {bytes} bytes)")]
    NotJson { error: String, bytes: usize },
    #[error("not a JSON object")]
    NotObject,
    #[error("`type` is not a non-empty string")]
    BadType,
    #[error("no `type`")]
    NoType,
    #[error("`headers` is not an object")]
    BadHeaders,
    #[error("no `headers`")]
    NoHeaders,
}

/// Like [`parse`], but `type` and `headers` may be missing (then `""` and
/// none): any JSON object is a frame, as for the reference CLI.
pub fn parse_lenient(text: &str) -> Result<Frame, NotAFrame> {
    decode(text, false)
}

fn decode(text: &str, strict: bool) -> Result<Frame, NotAFrame> {
    let v: Value = serde_json::from_str(text).map_err(|e| NotAFrame::NotJson {
        error: e.to_string(),
        bytes: text.len(),
    })?;
    let Value::Object(mut obj) = v else {
        return Err(NotAFrame::NotObject);
    };
    let kind = match obj.remove("type") {
        Some(Value::String(s)) if !s.is_empty() => s,
        None | Some(Value::Null) if !strict => String::new(),
        Some(_) => return Err(NotAFrame::BadType),
        None => return Err(NotAFrame::NoType),
    };
    let headers = match obj.remove("headers") {
        None | Some(Value::Null) if !strict => BTreeMap::new(),
        Some(Value::Object(h)) => h
            .into_iter()
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k, s)),
                Value::Null => None,
                other => Some((k, other.to_string())),
            })
            .collect(),
        Some(_) => return Err(NotAFrame::BadHeaders),
        None => return Err(NotAFrame::NoHeaders),
    };
    let data = match obj.remove("data") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
    };
    let time = match obj.remove("time") {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|t| *t > 0);
    Ok(Frame {
        kind,
        headers,
        data,
        time,
    })
}

/// An ack for `message_id` with `code`, `message` and `data` (JSON text).
pub fn ack(message_id: &str, code: u16, message: &str, data: &str) -> String {
    json!({
        "code": code,
        "headers": {"messageId": message_id, "contentType": "application/json"},
        "message": message,
        "data": data,
    })
    .to_string()
}

/// The `data` of a success ack: `{"status":"SUCCESS","message":"success"}`.
pub const SUCCESS_DATA: &str = r#"{"status":"SUCCESS","message":"success"}"#;

/// The ack for a consumed EVENT, as the Go SDK's event handler writes it
/// (event/frame_handler.go): code 200, message `ok`, the SUCCESS result.
pub fn event_success(message_id: &str) -> String {
    ack(message_id, 200, "ok", SUCCESS_DATA)
}

/// The reference CLI's ack of every frame (Go SDK
/// `NewSuccessDataFrameResponse` + `NewEventProcessResultSuccess`): code
/// 200, an empty message, the SUCCESS data.
pub fn reference_success(message_id: &str) -> String {
    ack(message_id, 200, "", SUCCESS_DATA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode() {
        let f = parse(
            r#"{"specVersion":"1.0","type":"EVENT","headers":{"topic":"*","messageId":"m1","n":5,"z":null},"data":"{\"a\":1}","time":1}"#,
        )
        .unwrap();
        assert_eq!(f.kind, "EVENT");
        assert_eq!(f.message_id(), "m1");
        assert_eq!(f.topic(), "*");
        assert_eq!(f.header("n"), "5");
        assert!(!f.headers.contains_key("z"));
        assert_eq!(f.data, r#"{"a":1}"#);
        assert_eq!(f.time, Some(1));

        let f = parse(r#"{"type":"SYSTEM","headers":{},"data":{"opaque":"x"}}"#).unwrap();
        assert_eq!(f.data, r#"{"opaque":"x"}"#);
        assert_eq!(parse(r#"{"type":"SYSTEM","headers":{}}"#).unwrap().data, "");

        for bad in [
            "",
            "nope",
            "[]",
            r#"{"headers":{}}"#,
            r#"{"type":1,"headers":{}}"#,
            r#"{"type":"EVENT"}"#,
            r#"{"type":"EVENT","headers":[]}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        // Lenient: any object is a frame.
        let f = parse_lenient(r#"{"data":"{}"}"#).unwrap();
        assert_eq!((f.kind.as_str(), f.headers.len()), ("", 0));
        assert!(parse_lenient(r#"{"type":"x","headers":{},"data":"{}"}"#).is_ok());
        for bad in ["[]", "nope", r#"{"headers":[]}"#, r#"{"type":1}"#] {
            assert!(parse_lenient(bad).is_err(), "{bad}");
        }
        // The reason never echoes the frame.
        let e = parse("{\"secret-looking\": ").unwrap_err();
        assert!(!e.to_string().contains("secret-looking"), "{e}");
    }

    #[test]
    fn encode() {
        let a: Value = serde_json::from_str(&event_success("m-1")).unwrap();
        assert_eq!(a["code"], 200);
        assert_eq!(a["headers"]["messageId"], "m-1");
        assert_eq!(a["headers"]["contentType"], "application/json");
        let d: Value = serde_json::from_str(a["data"].as_str().unwrap()).unwrap();
        assert_eq!(d["status"], "SUCCESS");
        let r: Value = serde_json::from_str(&reference_success("")).unwrap();
        assert_eq!(
            (r["code"].as_i64(), r["message"].as_str()),
            (Some(200), Some(""))
        );
        assert_eq!(r["headers"]["messageId"], "");
        assert_eq!(r["data"], SUCCESS_DATA);
    }
}
