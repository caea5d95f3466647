//! The reference CLI's portal ticket mode for the app stream
//! (`--stream-ticket-mode`, `internal/event/source/portal_ticket.go`): the
//! ticket comes from the MCP portal with the user's access token —
//! `channelType` in the body, `User-Agent: dws-event-consume` on the ticket
//! request and the WebSocket dial — and every frame is acked 200.

use dws_tests::fake_dingtalk::{dingtalk_env, FakeDingTalk};
use serde_json::{json, Value};

use super::*;

/// A bus on the app stream in portal mode `mode` with the user token of
/// `fake` (a 0600 file), plus `extra` section lines.
fn portal_env(fake: &FakeDingTalk, mode: &str, extra: &str) -> TestEnv {
    let env = dingtalk_env(
        &format!(
            "source = \"dingtalk\"\nstream_ticket_mode = \"{mode}\"\n\
             mcp_base = \"{}\"\naccess_token_file = \"token\"\n{extra}",
            fake.base_url()
        ),
        &[] as &[(&str, &str)],
    );
    env.write_private("token", fake.user_token());
    env
}

#[test]
fn normal_mode_gets_the_ticket_from_the_portal_with_the_user_token() {
    let fake = FakeDingTalk::start();
    let env = portal_env(&fake, "normal", "");
    let mut c = consumer(&env);
    let conn = fake.wait_connected(T);
    assert_eq!(fake.open_count(), 0, "no connections/open");
    let t = &fake.ticket_requests()[0];
    assert_eq!(
        t.body,
        json!({"sourceId": "open", "channelType": "open", "mode": "normal"})
    );
    assert_eq!(
        t.header("x-user-access-token"),
        Some(fake.user_token().as_str())
    );
    assert_eq!(t.header("user-agent"), Some("dws-event-consume"));
    assert_eq!(t.header("x-dws-client-id"), None);
    let hs = &fake.handshakes()[0];
    assert_eq!(hs.user_agent, "dws-event-consume");
    assert_eq!(hs.ticket, t.issued.clone().unwrap_or_default());
    let mid = fake.push_event(&ev("portal-1"));
    let ack = fake.wait_ack(&mid, T);
    assert_eq!(
        (
            ack.code,
            ack.message.as_str(),
            ack.status.as_deref(),
            ack.conn
        ),
        (200, "", Some("SUCCESS"), conn),
        "the reference's ack: {ack:?}"
    );
    let line = event_line(&mut c, "portal-1");
    assert_eq!(line["event_type"], "user_add_org", "{line}");
    // No WebSocket pings in portal mode (the reference sends none).
    std::thread::sleep(Duration::from_millis(300));
    let pings = fake.with_state(|s| s.conn(conn).map_or(0, |c| c.client_pings));
    assert_eq!(pings, 0);
    finish(c, 1);
}

#[test]
fn custom_mode_sends_the_app_credentials_in_the_ticket_body() {
    let fake = FakeDingTalk::start();
    let env = portal_env(
        &fake,
        "custom",
        &format!(
            "client_id = \"{}\"\nclient_secret = \"{}\"\n",
            fake.client_id(),
            fake.client_secret()
        ),
    );
    let c = consumer(&env);
    fake.wait_connected(T);
    let t = &fake.ticket_requests()[0];
    let want: Value = json!({
        "sourceId": "open", "channelType": "open", "mode": "custom",
        "clientId": fake.client_id(), "clientSecret": fake.client_secret(),
    });
    assert_eq!(t.body, want);
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    assert!(!log.contains(&fake.client_secret()), "{log}");
    finish(c, 0);
}

/// The reference retries a refused WebSocket handshake only for 408, 429
/// and 5xx: a 401 ends the source.
#[test]
fn a_refused_handshake_ends_the_source() {
    let fake = FakeDingTalk::start();
    let env = portal_env(&fake, "normal", "");
    fake.hold_tickets(true);
    let c = consumer(&env);
    fake.reject_handshakes(1);
    fake.hold_tickets(false);
    let lost = c.wait_exit(T).assert_source_lost();
    assert!(lost.contains("HTTP 401"), "{lost}");
    assert_eq!(fake.ticket_requests().len(), 1);
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit after losing its source");
}

/// Portal mode is the reference's personal stream loop
/// (`internal/event/source/personal.go` `runAttempt`): after `disconnect`
/// it reads on until the server closes, then dials again. A gateway that
/// takes one connection per user refuses a second one with a 4xx, which
/// would end the source; none is made.
#[test]
fn after_disconnect_the_next_connection_waits_for_the_close() {
    let fake = FakeDingTalk::start_with(dws_tests::fake_dingtalk::Options {
        disconnect_close_after: Duration::from_secs(1),
        ..Default::default()
    });
    fake.limit_live_connections(1);
    let env = portal_env(&fake, "normal", "");
    let mut c = consumer(&env);
    let old = fake.wait_connected(T);
    assert_eq!(fake.send_disconnect("rebalance"), Some(old));
    let (frame, mid) = fake.frame("EVENT", "*", &json!({"k": "after"}).to_string());
    let mut frame = frame;
    frame["headers"]["eventType"] = json!("user_add_org");
    frame["headers"]["eventId"] = json!("portal-after");
    assert!(fake.push_raw_to(old, &frame.to_string()));
    let ack = fake.wait_ack(&mid, T);
    assert_eq!((ack.code, ack.conn), (200, old), "{ack:?}");
    let new = fake.wait("a new connection", T, |s| s.target().filter(|c| *c != old));
    assert!(
        fake.handshakes().iter().all(|h| h.accepted),
        "{}",
        fake.summary()
    );
    let mid = fake.push_event(&ev("portal-next"));
    assert_eq!(fake.wait_ack(&mid, T).conn, new);
    event_line(&mut c, "portal-after");
    event_line(&mut c, "portal-next");
    finish(c, 2);
}
