//! The personal stream's connection, as the reference CLI keeps it
//! (`internal/event/source/personal.go` `runAttempt`, `handleFrame`,
//! `Start`): SYSTEM ping acked and never an event; `disconnect` acked and
//! the connection read (every frame acked) until the server closes it, and
//! only then a new one — never two at once, which a gateway with a per-user
//! connection limit refuses; a dropped TCP connection reconnected; the
//! backoff reset by a connection that acked a frame.

use std::time::Duration;

use dws_tests::fake_dingtalk::{personal::PersonalEvent, Options};
use serde_json::json;

use super::*;

/// A fake that closes a connection 1 s after its `disconnect` and takes one
/// live connection per user.
fn one_connection_fake() -> FakeDingTalk {
    let fake = FakeDingTalk::start_with(Options {
        disconnect_close_after: Duration::from_secs(1),
        ..Options::default()
    });
    fake.limit_live_connections(1);
    fake
}

/// `handleFrame` acks every frame, `disconnect` included, and `runAttempt`
/// reads on until the server closes: a frame after `disconnect` is acked on
/// that connection and delivered, though the gateway never sends it again;
/// the next connection is opened after the close, so a gateway that allows
/// one connection per user refuses none.
#[test]
fn after_disconnect_frames_are_acked_until_the_server_closes_then_one_new_connection() {
    let fake = one_connection_fake();
    let env = env(&fake);
    let mut c = consumer(&env, &[O2O, "--user", "u1"]);
    let old = fake.wait_connected(T);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new("before", O2O, &up, message("1")));
    assert_eq!(ids(&events(&mut c, 1)), ["before"]);

    assert_eq!(fake.send_disconnect("rebalance"), Some(old));
    // Untracked: the fake never sends it again.
    let (frame, mid) = fake.personal_frame(&PersonalEvent::new("after", O2O, &up, message("2")));
    assert!(fake.push_raw_to(old, &frame));
    let ack = fake.wait_ack(&mid, T);
    assert_eq!(
        (ack.code, ack.status.as_deref(), ack.conn),
        (200, Some("SUCCESS"), old),
        "{ack:?}"
    );
    assert_eq!(ids(&events(&mut c, 2)), ["before", "after"]);
    let disconnect_acked = fake.with_state(|s| {
        s.acks
            .iter()
            .any(|a| a.conn == old && a.code == 200 && a.message_id != mid)
    });
    assert!(
        disconnect_acked,
        "the disconnect is acked: {:?}",
        fake.acks()
    );

    let new = fake.wait("a new connection", T, |s| s.target().filter(|c| *c != old));
    let hs = fake.handshakes();
    assert!(
        hs.iter().all(|h| h.accepted),
        "no handshake while the old connection was open: {hs:#?}"
    );
    let (closed, opened) = fake.with_state(|s| {
        (
            s.conn(old).and_then(|c| c.closed_at),
            s.conn(new).map(|c| c.opened_at),
        )
    });
    assert!(closed.is_some_and(|cl| opened.is_some_and(|op| cl <= op)));
    fake.push_personal(&PersonalEvent::new("later", O2O, &up, message("3")));
    assert_eq!(ids(&events(&mut c, 3)), ["before", "after", "later"]);
    let st = env.status();
    assert_eq!(st["source"]["state"], "connected", "{st:#}");
    finish(c, 3);
}

/// A server that never closes the connection it sent `disconnect` on: the
/// bus closes it after the grace (`DWS_DINGTALK_DRAIN_GRACE_MS`) and opens
/// the next one.
#[test]
fn a_connection_the_server_never_closes_after_disconnect_is_closed_after_the_grace() {
    let fake = FakeDingTalk::start_with(Options {
        disconnect_close_after: Duration::from_secs(3600),
        ..Options::default()
    });
    fake.limit_live_connections(1);
    let env = env_with(&fake, 0, &[("DWS_DINGTALK_DRAIN_GRACE_MS", "1000")]);
    let mut c = consumer(&env, &[O2O, "--user", "u1"]);
    let old = fake.wait_connected(T);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.send_disconnect("rebalance");
    fake.wait("the old connection closed by the bus", T, |s| {
        s.conn(old).and_then(|c| c.closed_at)
    });
    let new = fake.wait("a new connection", T, |s| s.target().filter(|c| *c != old));
    assert!(
        fake.handshakes().iter().all(|h| h.accepted),
        "{}",
        fake.summary()
    );
    let mid = fake.push_personal(&PersonalEvent::new("next", O2O, &up, message("x")));
    assert_eq!(fake.wait_ack(&mid, T).conn, new);
    assert_eq!(ids(&events(&mut c, 1)), ["next"]);
    finish(c, 1);
}

/// SYSTEM ping: acked 200 with the SUCCESS data, neither an event nor an
/// unroutable frame.
#[test]
fn a_system_ping_is_acked_and_is_no_event() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let mut c = consumer(&env, &[O2O, "--user", "u1"]);
    let conn = fake.wait_connected(T);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    let mid = fake
        .send_system_ping("opaque-1")
        .expect("a live connection");
    let ack = fake.wait_ack(&mid, T);
    assert_eq!(
        (
            ack.code,
            ack.message.as_str(),
            ack.status.as_deref(),
            ack.conn
        ),
        (200, "", Some("SUCCESS"), conn),
        "{ack:?}"
    );
    assert_eq!(ack.content_type, "application/json", "{ack:?}");
    let data: serde_json::Value = serde_json::from_str(&ack.data).expect("ack data is JSON");
    assert_eq!(data, json!({"status": "SUCCESS", "message": "success"}));
    fake.push_personal(&PersonalEvent::new("real", O2O, &up, message("x")));
    assert_eq!(ids(&events(&mut c, 1)), ["real"], "the ping was no event");
    assert_unroutable(&env.status(), &[], 0);
    finish(c, 1);
}

/// A TCP connection dropped without a close frame: reconnected, and an
/// event unacked on it is delivered once on the next. The connection had
/// acked a frame, so the backoff restarts at its minimum: the attempt
/// count after the drop is 1, though the first connection took four.
#[test]
fn a_dropped_connection_is_replaced_and_the_backoff_restarts() {
    let fake = FakeDingTalk::start();
    fake.fail_next_tickets(3, 503, r#"{"code":"busy"}"#);
    let env = env(&fake);
    let mut c = consumer(&env, &[O2O, "--user", "u1"]);
    let old = fake.wait_connected(T);
    assert_eq!(fake.ticket_requests().len(), 4, "{}", fake.summary());
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new("one", O2O, &up, message("1")));
    assert_eq!(ids(&events(&mut c, 1)), ["one"]);

    fake.hold_tickets(true);
    assert_eq!(fake.drop_tcp(), Some(old));
    let st = env.wait_status(T, "reconnecting after the drop", |st| {
        st["source"]["state"] == "reconnecting" || st["source"]["state"] == "connecting"
    });
    assert_eq!(
        st["source"]["attempt"], 1,
        "backoff and count reset: {st:#}"
    );
    fake.push_personal(&PersonalEvent::new("two", O2O, &up, message("2")));
    fake.hold_tickets(false);
    let new = fake.wait("a new connection", T, |s| s.target().filter(|c| *c != old));
    fake.wait_until("two acked", T, |s| s.event_acked("two"));
    let on_new = fake.with_state(|s| {
        s.outbox
            .iter()
            .any(|o| o.event_id == "two" && o.acked && o.conn == Some(new))
    });
    assert!(on_new, "acked on the new connection: {}", fake.summary());
    assert_eq!(ids(&events(&mut c, 2)), ["one", "two"]);
    finish(c, 2);
}
