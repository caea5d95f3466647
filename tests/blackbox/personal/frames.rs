//! The personal stream's frames, as the reference CLI handles them
//! (`internal/event/source/personal.go` `handleFrame`): every frame acked
//! 200 whatever its `type`, every spelling of the identity routed, frames
//! that cannot be routed acked too and counted per reason, a ticket
//! embedded in the endpoint kept, no WebSocket pings.

use dws_tests::fake_dingtalk::personal::{HeaderStyle, PersonalEvent};
use serde_json::{json, Value};

use super::*;

#[test]
fn p_frm_1_identity_from_every_header_spelling_and_wrapped_data() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let mut c = consumer(&env, &[O2O, "--user", "u1"]);
    let conn = fake.wait_connected(T);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    let cases = [
        (HeaderStyle::Sdk, 0u8),
        (HeaderStyle::Upper, 1),
        (HeaderStyle::Camel, 2),
        (HeaderStyle::DataOnly, 2),
    ];
    let mut mids = vec![];
    for (i, (style, wrap)) in cases.iter().enumerate() {
        let ev = PersonalEvent::new(format!("frm-{i}"), O2O, &up, message(&format!("m{i}")))
            .rule_type("singleChat")
            .style(*style)
            .wrap(*wrap);
        mids.push(fake.push_personal(&ev));
    }
    // Garbage on the same socket is skipped, not fatal; an event without an
    // upstream subscription id cannot be routed (acked 200 like the
    // reference, counted); a lower-case type is fine.
    assert!(fake.push_raw("this is not JSON"));
    let (mut nosub, nosub_mid) = fake.frame("EVENT", "*", &json!({"eventKey": O2O}).to_string());
    nosub["headers"]["eventId"] = json!("frm-nosub");
    assert!(fake.push_frame(&nosub));
    let (mut lower, lower_mid) = fake.frame(
        "event",
        "*",
        &json!({"eventId": "frm-lc", "eventKey": O2O, "subId": up}).to_string(),
    );
    lower["headers"]["eventId"] = json!("frm-lc");
    assert!(fake.push_frame(&lower));
    mids.push(lower_mid);
    for m in &mids {
        let ack = fake.wait_ack(m, T);
        assert_eq!(
            (ack.code, ack.status.as_deref()),
            (200, Some("SUCCESS")),
            "{ack:?}"
        );
        assert_eq!(ack.conn, conn, "same connection");
    }
    let got = events(&mut c, 5);
    // §6.4: the header `eventId`, else the push's `messageId`, before the
    // data envelope's `eventId`.
    assert_eq!(
        ids(&got),
        [
            "frm-0".to_owned(),
            mids[1].clone(),
            "frm-2".to_owned(),
            mids[3].clone(),
            "frm-lc".to_owned()
        ]
    );
    for (i, e) in got.iter().enumerate().take(4) {
        assert_eq!(e["event_type"], O2O, "{e}");
        assert_eq!(e["rule_type"], "singleChat", "{e}");
        let data: Value = serde_json::from_str(e["data"].as_str().unwrap_or(""))
            .unwrap_or_else(|err| panic!("data not unwrapped to an object ({err}): {e}"));
        assert_eq!(data["payload"]["body"]["content"], format!("m{i}"), "{e}");
    }
    let ack = fake.wait_ack(&nosub_mid, T);
    assert_eq!(
        (ack.code, ack.status.as_deref()),
        (200, Some("SUCCESS")),
        "{ack:?}"
    );
    assert_unroutable(&env.status(), &[("no subscription id", 1)], 1);
    assert_eq!(fake.handshakes().len(), 1);
}

/// The reference reads each field from many spellings (`headerAny`, data
/// keys, `source.tag`) and never looks at `type`: every spelling the fake
/// knows, under several `type`s (or none), reaches the consumer.
#[test]
fn every_spelling_the_reference_accepts_is_routed_whatever_the_type() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let mut c = consumer(&env, &[O2O, "--user", "u1"]);
    let conn = fake.wait_connected(T);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    let kinds = ["EVENT", "event", "", "MESSAGE", "CALLBACK"];
    let mut mids = vec![];
    for (i, style) in HeaderStyle::ALL.iter().enumerate() {
        let ev = PersonalEvent::new(format!("sp-{i}"), O2O, &up, message(&format!("s{i}")))
            .rule_type("singleChat")
            .style(*style)
            .wrap((i % 3) as u8)
            .kind(kinds[i % kinds.len()]);
        mids.push((style, fake.push_personal(&ev)));
    }
    for (style, m) in &mids {
        let ack = fake.wait_ack(m, T);
        assert_eq!(
            (ack.code, ack.message.as_str(), ack.status.as_deref()),
            (200, "", Some("SUCCESS")),
            "{style:?}: {ack:?}"
        );
        assert_eq!(ack.conn, conn);
    }
    let got = events(&mut c, HeaderStyle::ALL.len());
    let contents: Vec<String> = got
        .iter()
        .map(|e| {
            assert_eq!(e["event_type"], O2O, "{e}");
            let data: Value = serde_json::from_str(e["data"].as_str().unwrap_or("")).expect("data");
            data["payload"]["body"]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    let want: Vec<String> = (0..HeaderStyle::ALL.len())
        .map(|i| format!("s{i}"))
        .collect();
    assert_eq!(contents, want, "every spelling, in order, once");
    assert_unroutable(&env.status(), &[], 0);
}

/// Unroutable frames are acked 200 (never 400: a gateway that redelivers
/// non-200 acks would loop), counted in `status` per reason and logged at
/// most once per reason per minute; the fake does not redeliver them.
#[test]
fn unroutable_frames_are_acked_200_counted_per_reason_and_logged_once_a_minute() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let mut c = consumer(&env, &[O2O, "--user", "u1"]);
    fake.wait_connected(T);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    let mut mids = vec![];
    for i in 0..3 {
        let (mut f, mid) = fake.frame("EVENT", "*", "{}");
        f["headers"]["eventType"] = json!(O2O);
        f["headers"]["eventId"] = json!(format!("nosub-{i}"));
        assert!(fake.push_frame(&f));
        mids.push(mid);
    }
    for _ in 0..2 {
        let (f, mid) = fake.frame("EVENT", "*", r#"{"subId":"s"}"#);
        assert!(fake.push_frame(&f));
        mids.push(mid);
    }
    let (mut f, mid) = fake.frame("EVENT", "*", "{}");
    f["headers"]["eventType"] = json!("not a key");
    f["headers"]["SUB_ID"] = json!(up);
    assert!(fake.push_frame(&f));
    mids.push(mid);
    for m in &mids {
        let ack = fake.wait_ack(m, T);
        assert_eq!(
            (ack.code, ack.status.as_deref()),
            (200, Some("SUCCESS")),
            "{ack:?}"
        );
    }
    // A routable event after them still flows on the same connection.
    let m = fake.push_personal(&PersonalEvent::new("after", O2O, &up, message("x")));
    fake.wait_ack(&m, T);
    assert_eq!(ids(&events(&mut c, 1)), ["after"]);
    assert_unroutable(
        &env.status(),
        &[
            ("no subscription id", 3),
            ("no event key", 2),
            ("invalid event key", 1),
        ],
        0,
    );
    assert_eq!(fake.with_state(|s| s.unacked()), 0);
    assert_eq!(
        fake.acks().len(),
        mids.len() + 1,
        "each frame acked once, none redelivered"
    );
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    let lines = |reason: &str| {
        log.lines()
            .filter(|l| l.contains("unroutable frame acked and dropped") && l.contains(reason))
            .count()
    };
    assert_eq!(lines("no subscription id"), 1, "{log}");
    assert_eq!(lines("no event key"), 1, "{log}");
    assert_eq!(lines("invalid event key"), 1, "{log}");
    finish(c, 1);
}

/// `endpointWithTicket`: a ticket already in the endpoint's query is kept
/// (the fake's `ticket` field is then a decoy no handshake accepts).
#[test]
fn a_ticket_embedded_in_the_endpoint_is_kept() {
    let fake = FakeDingTalk::start();
    fake.set_ticket_in_endpoint(true);
    let env = env(&fake);
    let mut c = consumer(&env, &["user_im_message_receive_at"]);
    fake.wait_connected(T);
    let issued = fake.ticket_requests()[0].issued.clone().expect("a ticket");
    let hs = fake.handshakes();
    assert_eq!(hs.len(), 1, "{}", fake.summary());
    assert_eq!(hs[0].ticket, issued, "dialled with the embedded ticket");
    assert!(hs[0].accepted);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new(
        "emb",
        "user_im_message_receive_at",
        &up,
        message("x"),
    ));
    assert_eq!(ids(&events(&mut c, 1)), ["emb"]);
}

/// The reference sends no WebSocket pings on the personal stream; a
/// profile may opt in with `keepalive`.
#[test]
fn no_websocket_pings_unless_keepalive_is_set() {
    let pings_after = |extra: &str| {
        let fake = FakeDingTalk::start();
        let env = env_cfg(&fake, extra, &[]);
        let c = consumer(&env, &["user_im_message_receive_at"]);
        let conn = fake.wait_connected(T);
        std::thread::sleep(Duration::from_millis(2500));
        let pings = fake.with_state(|s| s.conn(conn).map_or(0, |c| c.client_pings));
        finish(c, 0);
        pings
    };
    assert_eq!(pings_after(""), 0, "no pings by default");
    assert!(
        pings_after("keepalive = \"300ms\"\n") >= 2,
        "pings when asked for"
    );
}
