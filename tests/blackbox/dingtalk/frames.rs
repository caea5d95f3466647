//! The app stream's frames (protocol note §8 FRM-1..7, PING-1/2/4/5): acks
//! per frame type, malformed and unroutable frames, pings both ways.

use std::time::{Duration, Instant};

use dws_tests::fake_dingtalk::FakeDingTalk;
use serde_json::{json, Value};

use super::*;

#[test]
fn frm_1_an_event_gets_exactly_one_success_ack_after_it_reached_the_bus() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let mid = fake.push_event(&ev("frm1"));
    let ack = fake.wait_ack(&mid, T);
    assert_eq!(ack.code, 200, "{ack:?}");
    assert_eq!(ack.content_type, "application/json", "{ack:?}");
    assert_eq!(ack.status.as_deref(), Some("SUCCESS"), "{ack:?}");
    // The event is in the bus log by the time it is acked.
    let st = env.status();
    assert_eq!(st["log"]["head_seq"], 1, "{st:#}");
    assert_eq!(event_ids(&mut c, 1), ["frm1"]);
    // Later traffic on the same socket: still exactly one ack for it.
    let ping = fake
        .send_system_ping("after-frm1")
        .expect("live connection");
    fake.wait_ack(&ping, T);
    assert_eq!(
        fake.with_state(|s| s.acks_for(&mid).len()),
        1,
        "{:?}",
        fake.acks()
    );
}

#[test]
fn frm_2_ten_back_to_back_events_get_ten_acks() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let mids: Vec<String> = (0..10)
        .map(|i| fake.push_event(&ev(&format!("frm2-{i}"))))
        .collect();
    fake.wait_until("10 acks", T, |s| {
        mids.iter().all(|m| !s.acks_for(m).is_empty())
    });
    fake.with_state(|s| {
        for m in &mids {
            let acks = s.acks_for(m);
            assert_eq!(acks.len(), 1, "{m}: {acks:?}");
            assert_eq!(
                (acks[0].code, acks[0].status.as_deref()),
                (200, Some("SUCCESS")),
                "{acks:?}"
            );
        }
    });
    let ids = event_ids(&mut c, 10);
    let want: Vec<String> = (0..10).map(|i| format!("frm2-{i}")).collect();
    assert_eq!(ids, want);
}

/// An EVENT frame built by hand, for header/spec-version variations.
pub(super) fn event_frame(
    fake: &FakeDingTalk,
    id: &str,
    spec: Option<&str>,
    extra: &[(&str, &str)],
) -> (Value, String) {
    let (mut f, mid) = fake.frame("EVENT", "*", &json!({"n": id}).to_string());
    let h = f["headers"].as_object_mut().expect("headers");
    h.insert("eventId".into(), json!(id));
    h.insert("eventType".into(), json!("chat_update_title"));
    h.insert("eventBornTime".into(), json!("1700000000100"));
    for (k, v) in extra {
        h.insert((*k).into(), json!(v));
    }
    match spec {
        Some(v) => f["specVersion"] = json!(v),
        None => {
            f.as_object_mut().expect("object").remove("specVersion");
        }
    }
    (f, mid)
}

#[test]
fn frm_3_unknown_headers_and_spec_versions_are_processed_normally() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let frames = [
        event_frame(
            &fake,
            "frm3-a",
            Some("1.0"),
            &[("x-unknown-header", "kept"), ("connectionId", "c-1")],
        ),
        event_frame(&fake, "frm3-b", Some("9.9"), &[]),
        event_frame(&fake, "frm3-c", None, &[]),
    ];
    for (f, _) in &frames {
        assert!(fake.push_frame(f));
    }
    for (_, mid) in &frames {
        let ack = fake.wait_ack(mid, T);
        assert_eq!(
            (ack.code, ack.status.as_deref()),
            (200, Some("SUCCESS")),
            "{ack:?}"
        );
    }
    assert_eq!(event_ids(&mut c, 3), ["frm3-a", "frm3-b", "frm3-c"]);
    let a = event_line(&mut c, "frm3-a");
    assert_eq!(a["headers"]["x-unknown-header"], "kept", "{a}");
    assert_eq!(a["event_born_time"], 1_700_000_000_100_i64, "{a}");
    assert_eq!(a["event_type"], "chat_update_title", "{a}");
}

#[test]
fn frm_4_callback_to_an_unregistered_topic_gets_404_and_the_connection_stays() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    let conn = fake.wait_connected(T);
    let (f, mid) = fake.frame(
        "CALLBACK",
        "/v1.0/im/bot/messages/get",
        r#"{"text":{"content":"hi"}}"#,
    );
    assert!(fake.push_frame(&f));
    let ack = fake.wait_ack(&mid, T);
    assert_eq!(ack.code, 404, "{ack:?}");
    assert_eq!(ack.conn, conn);
    let evmid = fake.push_event(&ev("frm4"));
    assert_eq!(fake.wait_ack(&evmid, T).conn, conn, "same connection");
    assert_eq!(event_ids(&mut c, 1), ["frm4"]);
    assert_eq!(fake.handshakes().len(), 1);
}

/// Every ack as the Go SDK writes it (open-dingtalk/dingtalk-stream-sdk-go
/// @ d8d6e1f1): an EVENT 200 `ok` with the SUCCESS result
/// (event/frame_handler.go:45-62), a ping 200 `ok` with its data echoed
/// (payload/data_frame.go `NewDataFrameAckPong`, client/client.go
/// `OnPing`), a disconnect 200 with an empty message and data (`OnDisconnect`
/// returns nothing: client/client.go:474-477), and every frame without a
/// handler — another SYSTEM topic, a CALLBACK, an unknown type — 404 with an
/// empty message and data (client/client.go:459-463); all with
/// `contentType: application/json` and the frame's `messageId`.
#[test]
fn acks_have_the_go_sdks_codes_messages_and_data() {
    let fake = FakeDingTalk::start_with(dws_tests::fake_dingtalk::Options {
        disconnect_close_after: Duration::from_secs(1),
        ..Default::default()
    });
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let ev_mid = fake.push_event(&ev("sdk-ack"));
    event_ids(&mut c, 1);
    let ping = fake.send_system_ping("o-1").expect("a connection");
    let mut others = vec![];
    for (kind, topic) in [
        ("SYSTEM", "no_such_topic"),
        ("CALLBACK", "/v1.0/im/bot/messages/get"),
        ("MYSTERY", "*"),
    ] {
        let (f, mid) = fake.frame(kind, topic, "{}");
        assert!(fake.push_frame(&f));
        others.push(mid);
    }
    let shape = |mid: &str| {
        let a = fake.wait_ack(mid, T);
        assert_eq!(a.content_type, "application/json", "{a:?}");
        (a.code, a.message.clone(), a.data.clone())
    };
    assert_eq!(
        shape(&ev_mid),
        (
            200,
            "ok".to_owned(),
            r#"{"status":"SUCCESS","message":"success"}"#.to_owned()
        )
    );
    assert_eq!(
        shape(&ping),
        (200, "ok".to_owned(), r#"{"opaque":"o-1"}"#.to_owned())
    );
    for m in &others {
        assert_eq!(shape(m), (404, String::new(), String::new()), "{m}");
    }
    let conn = fake.send_disconnect("bye").expect("a connection");
    let known: Vec<&String> = [&ev_mid, &ping].into_iter().chain(&others).collect();
    let disc = fake.wait("the disconnect's ack", T, |s| {
        s.acks
            .iter()
            .find(|a| a.conn == conn && !known.contains(&&a.message_id))
            .cloned()
    });
    assert_eq!(
        (disc.code, disc.message.as_str(), disc.data.as_str()),
        (200, "", ""),
        "{disc:?}"
    );
}

#[test]
fn frm_5_unknown_system_topics_are_acked_or_ignored_and_the_connection_stays() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    let conn = fake.wait_connected(T);
    let mut mids = vec![];
    for topic in ["no_such_topic", "KEEPALIVE", "CONNECTED"] {
        let (f, mid) = fake.frame("SYSTEM", topic, "{}");
        assert!(fake.push_frame(&f));
        mids.push(mid);
    }
    let evmid = fake.push_event(&ev("frm5"));
    assert_eq!(fake.wait_ack(&evmid, T).conn, conn, "same connection");
    fake.with_state(|s| {
        for m in &mids {
            for a in s.acks_for(m) {
                // The Go SDK has no handler for them: 404, a diagnostic.
                assert_eq!(a.code, 404, "an ack, if any, is the SDK's 404: {a:?}");
            }
        }
    });
    assert_eq!(event_ids(&mut c, 1), ["frm5"]);
    assert_eq!(fake.handshakes().len(), 1);
}

#[test]
fn frm_6_malformed_frames_are_skipped_counted_not_acked_and_the_connection_stays() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    let conn = fake.wait_connected(T);
    let bad = [
        "{not json",
        r#"{"type":"EVENT","headers":{"messageId":"m-truncated","eventId":"x""#,
        "[1,2,3]",
        r#""just a string""#,
        r#"{"headers":{"messageId":"m-no-type"},"data":"{}"}"#,
    ];
    for b in bad {
        assert!(fake.push_raw(b));
    }
    let evmid = fake.push_event(&ev("frm6"));
    assert_eq!(fake.wait_ack(&evmid, T).conn, conn, "same connection");
    assert_eq!(event_ids(&mut c, 1), ["frm6"]);
    let acks = fake.acks();
    assert_eq!(acks.len(), 1, "only the good event is acked: {acks:?}");
    let st = env.status();
    assert_eq!(st["source"]["malformed"], bad.len(), "{st:#}");
    assert_eq!(st["source"]["state"], "connected", "{st:#}");
    assert_eq!(fake.handshakes().len(), 1);
}

// ------------------------------------------------------------------ PING

#[test]
fn ping_1_system_ping_is_acked_with_its_opaque_echoed() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let _c = consumer(&env);
    fake.wait_connected(T);
    let sent = Instant::now();
    let mid = fake
        .send_system_ping("opaque-4f2a")
        .expect("live connection");
    let ack = fake.wait_ack(&mid, T);
    assert_eq!(ack.code, 200, "{ack:?}");
    assert_eq!(ack.content_type, "application/json");
    let data: Value = serde_json::from_str(&ack.data).expect("ack data is JSON");
    assert_eq!(data["opaque"], "opaque-4f2a", "{ack:?}");
    eprintln!("PING-1: ping acked after {:?}", ack.at.duration_since(sent));
}

#[test]
fn ping_2_a_ping_behind_a_burst_of_events_is_still_acked() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    // A subscription nobody reads: events pile up in the bus, the upstream
    // must not care.
    env.dws(["event", "subscribe", "*", "--id", "idle-sub"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    fake.wait_connected(T);
    let mids: Vec<String> = (0..500)
        .map(|i| fake.push_event(&ev(&format!("burst-{i:03}"))))
        .collect();
    let sent = Instant::now();
    let ping = fake
        .send_system_ping("behind-the-burst")
        .expect("live connection");
    let ack = fake.wait_ack(&ping, T);
    let data: Value = serde_json::from_str(&ack.data).expect("ack data is JSON");
    assert_eq!(data["opaque"], "behind-the-burst");
    eprintln!(
        "PING-2: ping behind 500 events acked after {:?}",
        ack.at.duration_since(sent)
    );
    fake.wait_until("all 500 events acked", T, |s| {
        mids.iter().all(|m| s.acks_for(m).len() == 1)
    });
    let st = env.status();
    let sub = st["subscriptions"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["id"] == "idle-sub"))
        .cloned();
    assert_eq!(sub.expect("idle-sub")["pending"], 500, "{st:#}");
}

#[test]
fn ping_4_a_peer_that_stops_answering_pings_is_replaced_with_a_new_ticket() {
    let fake = FakeDingTalk::start();
    let env = Bus {
        keepalive: "1s",
        ..Bus::default()
    }
    .knob("DWS_DINGTALK_PONG_TIMEOUT_MS", 1000)
    .env(&fake);
    let mut c = consumer(&env);
    let first = fake.wait_connected(T);
    fake.wait_until("client keepalive pings", T, |s| {
        s.conn(first).is_some_and(|c| c.client_pings >= 1)
    });
    let frozen_at = Instant::now();
    fake.stop_answering_pings().expect("live connection");
    let second = fake.wait("a replacement connection", T, |s| {
        s.target().filter(|c| *c != first)
    });
    let reconnected = fake
        .with_state(|s| s.conn(second).map(|c| c.opened_at))
        .expect("conn");
    let conns = fake.connections();
    assert_ne!(conns[0].ticket, conns[1].ticket, "a new ticket");
    assert_eq!(fake.open_count(), 2);
    assert!(
        reconnected.duration_since(frozen_at) >= Duration::from_millis(900),
        "not before the pong deadline ({:?})",
        reconnected.duration_since(frozen_at)
    );
    let mid = fake.push_event(&ev("ping4"));
    assert_eq!(fake.wait_ack(&mid, T).conn, second);
    assert_eq!(event_ids(&mut c, 1), ["ping4"]);
}

#[test]
fn ping_5_server_websocket_pings_are_answered() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let _c = consumer(&env);
    let conn = fake.wait_connected(T);
    fake.ws_ping(b"server-ping-1").expect("live connection");
    fake.wait_until("the pong", T, |s| {
        s.conn(conn)
            .is_some_and(|c| c.pongs.iter().any(|p| p == b"server-ping-1"))
    });
}

/// FRM-7: an EVENT without a (valid) `eventType` is acked 200 SUCCESS, as
/// the SDKs ack what their handler returns, never redelivered, counted in
/// `status` per reason; the connection stays.
#[test]
fn frm_7_an_event_without_an_event_type_is_acked_200_and_counted() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    let conn = fake.wait_connected(T);
    let (missing, m1) = fake.frame("EVENT", "*", "{}");
    let (mut invalid, m2) = fake.frame("EVENT", "*", "{}");
    invalid["headers"]["eventType"] = json!("not a type");
    for f in [&missing, &invalid] {
        assert!(fake.push_frame(f));
    }
    for m in [&m1, &m2] {
        let ack = fake.wait_ack(m, T);
        assert_eq!(
            (ack.code, ack.status.as_deref()),
            (200, Some("SUCCESS")),
            "{ack:?}"
        );
        assert_eq!(ack.conn, conn);
    }
    let evmid = fake.push_event(&ev("frm7"));
    assert_eq!(fake.wait_ack(&evmid, T).conn, conn, "same connection");
    assert_eq!(event_ids(&mut c, 1), ["frm7"]);
    let st = env.status();
    match st["source"]["unroutable"].as_object() {
        Some(m) => {
            assert_eq!(m.get("no eventType"), Some(&json!(1)), "{st:#}");
            assert_eq!(m.get("invalid eventType"), Some(&json!(1)), "{st:#}");
        }
        // Until the hub counts them per reason: with the malformed input.
        None => assert_eq!(st["source"]["malformed"], 2, "{st:#}"),
    }
    assert_eq!(fake.acks().len(), 3, "each acked once: {:?}", fake.acks());
    assert_eq!(fake.handshakes().len(), 1);
}
