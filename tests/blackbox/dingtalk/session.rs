//! The app stream's session (protocol note §8 DISC-2, ACK-5, RECO-1..3):
//! `disconnect`, redelivery, reconnects and backoff, shutdown.

use std::time::{Duration, Instant};

use dws_tests::fake_dingtalk::FakeDingTalk;

use super::{frames::event_frame, *};

#[test]
fn disc_2_disconnect_opens_a_replacement_at_once_and_the_old_socket_takes_no_work() {
    let fake = fake_with(|o| o.disconnect_close_after = Duration::from_secs(5));
    let env = Bus::default()
        .knob("DWS_DINGTALK_DRAIN_GRACE_MS", 20_000)
        .env(&fake);
    let mut c = consumer(&env);
    let first = fake.wait_connected(T);
    let m1 = fake.push_event(&ev("disc-1"));
    fake.wait_ack(&m1, T);
    fake.send_disconnect("connection is expired")
        .expect("live connection");
    let second = fake.wait("a replacement connection", T, |s| {
        s.target().filter(|c| *c != first)
    });
    // A push that still reaches the draining socket is not taken.
    let (late, late_mid) = event_frame(&fake, "disc-late", Some("1.0"), &[]);
    assert!(
        fake.push_raw_to(first, &late.to_string()),
        "the old socket is still open (the server closes it 5 s after disconnect)\n{}",
        fake.summary()
    );
    for i in 2..=4 {
        fake.push_event(&ev(&format!("disc-{i}")));
    }
    let ids = event_ids(&mut c, 4);
    assert_eq!(ids, ["disc-1", "disc-2", "disc-3", "disc-4"]);
    fake.wait_until("the old socket closed by the server", T, |s| {
        s.conn(first).is_some_and(|c| c.closed_at.is_some())
    });
    let conns = fake.connections();
    let (old, new) = (&conns[0], &conns[1]);
    assert_eq!(new.id, second);
    assert!(
        new.opened_at < old.closed_at.expect("closed"),
        "make-before-break: the replacement was open before the old socket closed"
    );
    assert_ne!(old.ticket, new.ticket, "a fresh ticket");
    assert_eq!(fake.open_count(), 2);
    assert!(
        old.end.contains("after disconnect"),
        "the server closed it, not the client: {old:?}"
    );
    assert!(
        fake.with_state(|s| s.acks_for(&late_mid).is_empty()),
        "no work taken on the draining socket"
    );
    let out = finish(c, 4);
    assert!(!out.stdout.contains("disc-late"), "{out}");
}

#[test]
fn ack_5_a_redelivered_event_is_acked_again_and_delivered_once() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let m1 = fake.push_event(&ev("dup-1"));
    fake.wait_ack(&m1, T);
    let m2 = fake.push_event(&ev("dup-1"));
    let a2 = fake.wait_ack(&m2, T);
    assert_eq!(
        (a2.code, a2.status.as_deref()),
        (200, Some("SUCCESS")),
        "{a2:?}"
    );
    fake.push_event(&ev("after-dup"));
    assert_eq!(event_ids(&mut c, 2), ["dup-1", "after-dup"]);
    let st = env.status();
    let t = st["event_types"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["event_type"] == "user_add_org"))
        .cloned();
    assert_eq!(t.expect("event type counters")["duplicates"], 1, "{st:#}");
    finish(c, 2);
}

// ------------------------------------------------------------------ RECO

#[test]
fn reco_1_abrupt_close_reconnects_with_backoff_reset_after_a_healthy_connection() {
    let fake = FakeDingTalk::start();
    fake.fail_next_opens(5, 503, r#"{"code":"unavailable","message":"try later"}"#);
    let env = Bus::default()
        .knob("DWS_DINGTALK_BACKOFF_MIN_MS", 300)
        .knob("DWS_DINGTALK_BACKOFF_MAX_MS", 20_000)
        .env(&fake);
    let mut c = consumer(&env);
    let first = fake.wait_connected(T);
    let opens = fake.opens();
    assert_eq!(opens.len(), 6);
    for i in 1..opens.len() {
        let gap = opens[i].at.duration_since(opens[i - 1].at);
        let nominal = Duration::from_millis(300 << (i - 1));
        assert!(
            gap >= nominal.mul_f64(0.95),
            "open {i}: waited {gap:?}, backoff is at least {nominal:?}"
        );
    }
    // Healthy: it carried an event.
    let m = fake.push_event(&ev("reco-1"));
    fake.wait_ack(&m, T);
    let dropped_at = Instant::now();
    fake.drop_tcp().expect("live connection");
    let second = fake.wait("a new connection", T, |s| {
        s.target().filter(|c| *c != first)
    });
    let reopen = fake.opens()[6].at.duration_since(dropped_at);
    assert!(
        reopen >= Duration::from_millis(280),
        "a backoff, not a hot loop: {reopen:?}"
    );
    // Not reset, the next delay would be ≥ 9.6 s.
    assert!(
        reopen < Duration::from_millis(4000),
        "backoff reset after a healthy connection: {reopen:?}"
    );
    let conns = fake.connections();
    assert_ne!(conns[0].ticket, conns[1].ticket);
    let m = fake.push_event(&ev("reco-2"));
    assert_eq!(fake.wait_ack(&m, T).conn, second);
    assert_eq!(event_ids(&mut c, 2), ["reco-1", "reco-2"]);
}

#[test]
fn reco_2_consecutive_open_failures_back_off_non_decreasing_to_the_cap_one_open_at_a_time() {
    let fake = FakeDingTalk::start();
    fake.fail_next_opens(6, 503, r#"{"code":"unavailable","message":"try later"}"#);
    fake.set_open_delay(Duration::from_millis(200));
    let env = Bus::default()
        .knob("DWS_DINGTALK_BACKOFF_MIN_MS", 200)
        .knob("DWS_DINGTALK_BACKOFF_MAX_MS", 800)
        .env(&fake);
    let _c = consumer(&env);
    fake.wait_connected(T);
    let opens = fake.opens();
    assert_eq!(opens.len(), 7);
    let gaps: Vec<Duration> = opens
        .windows(2)
        .map(|w| w[1].at.duration_since(w[0].at))
        .collect();
    let slack = Duration::from_millis(150);
    for (i, g) in gaps.iter().enumerate() {
        // answer-to-answer = backoff + the 200 ms the fake takes to answer.
        let nominal = Duration::from_millis((200u64 << i).min(800) + 200);
        assert!(
            *g + slack >= nominal,
            "gap {i} {g:?} below the nominal {nominal:?}: {gaps:?}"
        );
        assert!(
            *g <= Duration::from_millis(800 + 200) * 5 / 4 + Duration::from_secs(5),
            "gap {i} {g:?} way above the cap: {gaps:?}"
        );
        if i > 0 {
            assert!(*g + slack >= gaps[i - 1], "delays never decrease: {gaps:?}");
        }
    }
    assert_eq!(
        fake.with_state(|s| s.max_opens_in_flight),
        1,
        "one open request in flight at a time"
    );
}

#[test]
fn reco_3_shutdown_during_backoff_exits_promptly() {
    let fake = FakeDingTalk::start();
    fake.fail_next_opens(1000, 503, r#"{"code":"unavailable","message":"try later"}"#);
    let env = Bus::default()
        .knob("DWS_DINGTALK_BACKOFF_MIN_MS", 120_000)
        .knob("DWS_DINGTALK_BACKOFF_MAX_MS", 120_000)
        .env(&fake);
    let c = consumer(&env);
    fake.wait_until("the first open", T, |s| !s.opens.is_empty());
    env.wait_until(T, "the source backing off", || {
        env.status()["source"]["state"] == "reconnecting"
    });
    let st = env.status();
    assert!(
        st["source"]["next_retry_at_unix_ms"].as_i64().is_some(),
        "{st:#}"
    );
    let started = Instant::now();
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("bus_shutdown", 0);
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit during a 120 s backoff");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "well before the backoff ended"
    );
    assert_eq!(fake.open_count(), 1, "no open after the stop");
}
