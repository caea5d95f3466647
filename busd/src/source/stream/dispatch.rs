//! What to do with one text frame: [`decide`] is pure (frame text in,
//! [`Decision`] out) and unit-tested here; the runner applies the decision
//! to the hub and the socket. Two rule sets ([`Frames`]):
//!
//! - [`Frames::Sdk`] — the app stream over `connections/open`, like the
//!   official Go SDK (open-dingtalk/dingtalk-stream-sdk-go): `SYSTEM ping`
//!   acked 200 `ok` with its `data` echoed, `SYSTEM disconnect` 200 with an
//!   empty message and data; `EVENT` turned into a bus event and acked
//!   200 `ok` SUCCESS (after the append, once durable) — an `EVENT` that is
//!   no event (no or an invalid `eventType`) is acked 200 SUCCESS too, as
//!   the SDKs do, and counted unroutable; every frame without a handler
//!   (another `SYSTEM` topic, `CALLBACK`, an unknown `type`) 404 with an
//!   empty message and data; a frame that is not a frame (not JSON, not
//!   an object, no `type`, no `headers`) skipped, counted malformed, not
//!   acked.
//! - [`Frames::AckAll`] — the reference CLI's personal stream and portal
//!   mode (`internal/event/source/personal.go` `handleFrame`): every frame
//!   is acked 200 with the SUCCESS data and an empty message, whatever its
//!   `type` (which is never looked at, except that `SYSTEM ping` is only
//!   acked and `SYSTEM disconnect` ends the connection once the server
//!   closes it); every
//!   other frame is offered as an event; one that cannot be routed is
//!   still acked 200 and counted unroutable (per reason). Any JSON object
//!   is a frame ([`frame::parse_lenient`]); anything else is skipped and
//!   counted malformed, not acked.
//!
//! `SYSTEM disconnect` is acked in both (200).

use super::{frame, one_line, Upstream};
use crate::hub::NewEvent;

/// The rule set of a stream (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frames {
    Sdk,
    AckAll,
}

/// Why a frame that was acked is not an event the bus can route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unroutable {
    /// A short, fixed reason (`no event key`, `no subscription id`, …):
    /// counted per reason in `status`, logged once per reason per minute.
    pub reason: &'static str,
    /// The specifics, for the log line (never the frame itself).
    pub detail: String,
}

impl Unroutable {
    pub fn new(reason: &'static str, detail: impl Into<String>) -> Unroutable {
        Unroutable {
            reason,
            detail: detail.into(),
        }
    }
}

/// What to do with a text frame.
#[derive(Debug)]
pub enum Decision {
    /// Not a frame: counted malformed, not acked.
    Skip(String),
    /// Append the event; send `ack` (if any) once it is durable.
    Append {
        event: Box<NewEvent>,
        ack: Option<String>,
    },
    /// Count it (per reason) and send `ack` (if any) now.
    Unroutable {
        why: Unroutable,
        ack: Option<String>,
    },
    /// Send `ack` (if any) now; nothing else.
    Reply(Option<String>),
    /// The server is draining this connection: send `reply`, open a
    /// replacement.
    Disconnect {
        reply: Option<String>,
        reason: String,
    },
}

/// Decides what to do with one text frame.
pub fn decide<U: Upstream>(upstream: &U, frames: Frames, text: &str) -> Decision {
    match frames {
        Frames::Sdk => decide_sdk(upstream, text),
        Frames::AckAll => decide_ack_all(upstream, text),
    }
}

fn disconnect_reason(f: &frame::Frame) -> String {
    serde_json::from_str::<serde_json::Value>(&f.data)
        .ok()
        .and_then(|v| {
            v.get("reason")
                .and_then(|r| r.as_str())
                .map(|r| one_line(r, 200))
        })
        .unwrap_or_else(|| "no reason given".into())
}

fn decide_sdk<U: Upstream>(upstream: &U, text: &str) -> Decision {
    let f = match frame::parse(text) {
        Ok(f) => f,
        Err(why) => return Decision::Skip(why.to_string()),
    };
    let mid = f.message_id().to_owned();
    let ack = |code: u16, message: &str, data: &str| {
        (!mid.is_empty()).then(|| frame::ack(&mid, code, message, data))
    };
    match f.kind.as_str() {
        "EVENT" => {
            let ack = (!mid.is_empty()).then(|| frame::event_success(&mid));
            match upstream.event(&f) {
                Ok(event) => Decision::Append {
                    event: Box::new(event),
                    ack,
                },
                Err(why) => Decision::Unroutable { why, ack },
            }
        }
        // The Go SDK's acks (client/client.go `OnPing`, `OnDisconnect`, no
        // handler → 404 with an empty message and data).
        "SYSTEM" if f.topic() == "disconnect" => Decision::Disconnect {
            reply: ack(200, "", ""),
            reason: disconnect_reason(&f),
        },
        "SYSTEM" if f.topic() == "ping" => Decision::Reply(ack(200, "ok", &f.data)),
        _ => Decision::Reply(ack(404, "", "")),
    }
}

fn decide_ack_all<U: Upstream>(upstream: &U, text: &str) -> Decision {
    let f = match frame::parse_lenient(text) {
        Ok(f) => f,
        Err(why) => return Decision::Skip(why.to_string()),
    };
    let ack = Some(frame::reference_success(f.message_id()));
    let system = f.kind.eq_ignore_ascii_case("SYSTEM");
    match f.topic() {
        "disconnect" if system => Decision::Disconnect {
            reply: ack,
            reason: disconnect_reason(&f),
        },
        "ping" if system => Decision::Reply(ack),
        _ => match upstream.event(&f) {
            Ok(event) => Decision::Append {
                event: Box::new(event),
                ack,
            },
            Err(why) => Decision::Unroutable { why, ack },
        },
    }
}

/// On a draining connection only pings are answered: the ack of `text` if
/// it is a `SYSTEM ping`.
pub fn ping_ack(frames: Frames, text: &str) -> Option<String> {
    match frames {
        Frames::Sdk => frame::parse(text)
            .ok()
            .filter(|f| f.kind == "SYSTEM" && f.topic() == "ping" && !f.message_id().is_empty())
            .map(|f| frame::ack(f.message_id(), 200, "ok", &f.data)),
        Frames::AckAll => frame::parse_lenient(text)
            .ok()
            .filter(|f| f.kind.eq_ignore_ascii_case("SYSTEM") && f.topic() == "ping")
            .map(|f| frame::reference_success(f.message_id())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::source::stream::{frame::Frame, Scrub, Ticket, TicketError};

    /// Routes a frame with an `eventType` header and, when `needs_sub`, a
    /// `sub` header.
    struct Fake {
        needs_sub: bool,
    }

    impl Upstream for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        async fn ticket(&self) -> Result<Ticket, TicketError> {
            Err(TicketError::Fatal("none".into()))
        }
        fn event(&self, f: &Frame) -> Result<NewEvent, Unroutable> {
            let t = f.header("eventType");
            if t.is_empty() {
                return Err(Unroutable::new("no event key", "no eventType"));
            }
            if self.needs_sub && f.header("sub").is_empty() {
                return Err(Unroutable::new("no subscription id", ""));
            }
            Ok(NewEvent {
                event_type: t.to_owned(),
                data: f.data.clone(),
                ..NewEvent::default()
            })
        }
        fn scrub(&self) -> Scrub {
            Scrub::default()
        }
    }

    fn frame(kind: &str, headers: Value, data: &str) -> String {
        json!({"type": kind, "headers": headers, "data": data}).to_string()
    }

    fn ack_of(d: &Decision) -> Option<Value> {
        let a = match d {
            Decision::Append { ack, .. }
            | Decision::Unroutable { ack, .. }
            | Decision::Reply(ack)
            | Decision::Disconnect { reply: ack, .. } => ack.as_ref(),
            Decision::Skip(_) => None,
        };
        a.map(|a| serde_json::from_str(a).unwrap())
    }

    #[test]
    fn sdk_rules() {
        let app = Fake { needs_sub: false };
        let d = decide(
            &app,
            Frames::Sdk,
            &frame(
                "EVENT",
                json!({"messageId": "m1", "eventType": "a_b"}),
                "{}",
            ),
        );
        assert!(matches!(&d, Decision::Append { event, .. } if event.event_type == "a_b"));
        let a = ack_of(&d).unwrap();
        assert_eq!(
            (a["code"].as_i64(), a["message"].as_str()),
            (Some(200), Some("ok"))
        );
        assert_eq!(a["headers"]["messageId"], "m1");

        // No eventType: acked 200 SUCCESS like the SDKs, counted unroutable.
        let d = decide(
            &app,
            Frames::Sdk,
            &frame("EVENT", json!({"messageId": "m2"}), "{}"),
        );
        assert!(matches!(&d, Decision::Unroutable { why, .. } if why.reason == "no event key"));
        let a = ack_of(&d).unwrap();
        assert_eq!(a["code"], 200);
        assert_eq!(a["data"], frame::SUCCESS_DATA);

        // Ping: its data echoed.
        let d = decide(
            &app,
            Frames::Sdk,
            &frame(
                "SYSTEM",
                json!({"messageId": "p", "topic": "ping"}),
                r#"{"opaque":"o"}"#,
            ),
        );
        assert_eq!(ack_of(&d).unwrap()["data"], r#"{"opaque":"o"}"#);
        let d = decide(
            &app,
            Frames::Sdk,
            &frame(
                "SYSTEM",
                json!({"messageId": "d", "topic": "disconnect"}),
                r#"{"reason":"bye\nnow"}"#,
            ),
        );
        assert!(
            matches!(&d, Decision::Disconnect { reason, reply: Some(_) } if reason == "bye now")
        );
        let d = decide(
            &app,
            Frames::Sdk,
            &frame("CALLBACK", json!({"messageId": "c", "topic": "/x"}), "{}"),
        );
        assert_eq!(ack_of(&d).unwrap()["code"], 404);
        let d = decide(
            &app,
            Frames::Sdk,
            &frame("event", json!({"messageId": "l", "eventType": "a"}), "{}"),
        );
        assert_eq!(
            ack_of(&d).unwrap()["code"],
            404,
            "the SDKs match the type exactly"
        );
        // Without a messageId nothing is acked.
        let d = decide(
            &app,
            Frames::Sdk,
            &frame("EVENT", json!({"eventType": "a"}), "{}"),
        );
        assert!(matches!(d, Decision::Append { ack: None, .. }));
        for bad in ["nope", "[1]", r#"{"headers":{}}"#, r#"{"type":"EVENT"}"#] {
            assert!(
                matches!(decide(&app, Frames::Sdk, bad), Decision::Skip(_)),
                "{bad}"
            );
        }
    }

    #[test]
    fn ack_all_rules() {
        let p = Fake { needs_sub: true };
        let routable = json!({"messageId": "m", "eventType": "k_x", "sub": "s"});
        // Whatever the type, a routable frame is an event, acked like the
        // reference: 200, empty message, SUCCESS.
        for kind in ["EVENT", "event", "CALLBACK", "MESSAGE", "SYSTEM"] {
            let d = decide(&p, Frames::AckAll, &frame(kind, routable.clone(), "{}"));
            assert!(matches!(&d, Decision::Append { .. }), "{kind}: {d:?}");
            let a = ack_of(&d).unwrap();
            assert_eq!(
                (
                    a["code"].as_i64(),
                    a["message"].as_str(),
                    a["data"].as_str()
                ),
                (Some(200), Some(""), Some(frame::SUCCESS_DATA)),
                "{kind}"
            );
        }
        // No type, no headers at all: still a frame.
        let d = decide(&p, Frames::AckAll, r#"{"data":"{}"}"#);
        assert!(matches!(&d, Decision::Unroutable { why, .. } if why.reason == "no event key"));
        assert_eq!(
            ack_of(&d).unwrap()["code"],
            200,
            "acked even without a messageId"
        );
        let d = decide(
            &p,
            Frames::AckAll,
            &frame("EVENT", json!({"messageId": "m", "eventType": "k_x"}), "{}"),
        );
        assert!(
            matches!(&d, Decision::Unroutable { why, .. } if why.reason == "no subscription id")
        );
        assert_eq!(ack_of(&d).unwrap()["code"], 200);
        // SYSTEM ping: acked (no opaque echo), not an event.
        let d = decide(
            &p,
            Frames::AckAll,
            &frame(
                "system",
                json!({"messageId": "p", "topic": "ping"}),
                r#"{"opaque":"o"}"#,
            ),
        );
        assert!(matches!(&d, Decision::Reply(Some(_))));
        assert_eq!(ack_of(&d).unwrap()["data"], frame::SUCCESS_DATA);
        let d = decide(
            &p,
            Frames::AckAll,
            &frame(
                "SYSTEM",
                json!({"messageId": "d", "topic": "disconnect"}),
                "{}",
            ),
        );
        assert!(matches!(&d, Decision::Disconnect { reason, .. } if reason == "no reason given"));
        for bad in ["nope", "[1]", r#""s""#] {
            assert!(
                matches!(decide(&p, Frames::AckAll, bad), Decision::Skip(_)),
                "{bad}"
            );
        }
    }

    #[test]
    fn draining_connections_answer_only_pings() {
        let ping = frame(
            "SYSTEM",
            json!({"messageId": "p", "topic": "ping"}),
            r#"{"opaque":"o"}"#,
        );
        let ev = frame("EVENT", json!({"messageId": "e", "eventType": "a"}), "{}");
        let a: Value = serde_json::from_str(&ping_ack(Frames::Sdk, &ping).unwrap()).unwrap();
        assert_eq!(a["data"], r#"{"opaque":"o"}"#);
        let a: Value = serde_json::from_str(&ping_ack(Frames::AckAll, &ping).unwrap()).unwrap();
        assert_eq!(a["data"], frame::SUCCESS_DATA);
        assert_eq!(ping_ack(Frames::Sdk, &ev), None);
        assert_eq!(ping_ack(Frames::AckAll, &ev), None);
    }
}
