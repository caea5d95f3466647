//! The `personal` source against the loopback fake's personal stream
//! (`dws_tests::fake_dingtalk::personal`): conformance checks of the
//! protocol note §8 (client side: P-TKT-1..4, P-FRM-1, P-CTL-1..5; P-CTL-6,
//! list paging, is checked at unit level against the same fake in
//! `busd::source::personal::control`, since nothing in the product lists)
//! and end-to-end runs through real `busd` and `dws event consume`
//! processes: routing by upstream subscription, identical consumers sharing
//! one upstream subscription, the last one's exit cancelling it, control
//! plane errors as exit codes, a lost source, and the user token never
//! showing up anywhere.
//!
//! Each test has its own fake and its own [`TestEnv`]; the bus reads its
//! token from a 0600 file next to `config.toml`. Backoff is shortened with
//! the stream sources' test knobs. Ticket requests are held
//! ([`FakeDingTalk::hold_tickets`]) where a consumer must be attached before
//! the source fails. Waits are bounded; there are no timing assertions.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use dws_tests::{
    fake_dingtalk::{
        personal::{ControlFault, ControlOp, HeaderStyle, PersonalEvent},
        FakeDingTalk,
    },
    Child, Output, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::{json, Value};

/// Bound of every wait in this module.
const T: Duration = Duration::from_secs(30);
const O2O: &str = "user_im_message_receive_o2o";
const CLIENT_ID: &str = "dws-test-client";

/// A [`TestEnv`] whose default profile is the personal stream of `fake`.
fn env_with(fake: &FakeDingTalk, max_attempts: u32, knobs: &[(&str, &str)]) -> TestEnv {
    let mut vars = vec![
        ("DWS_DINGTALK_BACKOFF_MIN_MS", "100"),
        ("DWS_DINGTALK_BACKOFF_MAX_MS", "1000"),
    ];
    vars.retain(|(k, _)| !knobs.iter().any(|(k2, _)| k2 == k));
    vars.extend_from_slice(knobs);
    let env = TestEnv::with_env(&vars);
    write_token(&env, &fake.user_token());
    std::fs::write(
        env.cfg_dir().join("config.toml"),
        format!(
            "[profiles.default]\nsource = \"personal\"\nmcp_base = \"{}\"\nclient_id = \"{CLIENT_ID}\"\n\
             access_token_file = \"token\"\nmax_attempts = {max_attempts}\n",
            fake.base_url()
        ),
    )
    .expect("write config.toml");
    env
}

fn env(fake: &FakeDingTalk) -> TestEnv {
    env_with(fake, 0, &[])
}

fn write_token(env: &TestEnv, token: &str) {
    let p = env.cfg_dir().join("token");
    std::fs::write(&p, format!("{token}\n")).expect("write token");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod token");
}

/// `dws event consume <args>` resident until the test ends it; waits for ready.
fn consumer(env: &TestEnv, args: &[&str]) -> Child {
    let mut argv = vec!["event", "consume"];
    argv.extend_from_slice(args);
    let mut c = env.dws(argv).stdin_hold().spawn();
    c.wait_ready();
    c
}

/// A consumer expected to fail before its ready line.
fn failing_consumer(env: &TestEnv, args: &[&str]) -> Output {
    let mut argv = vec!["event", "consume"];
    argv.extend_from_slice(args);
    env.dws(argv).stdin_null().run_with_timeout(EXIT_TIMEOUT)
}

/// The upstream subscription the local subscription `local_id` is bound to.
fn upstream_of(env: &TestEnv, local_id: &str) -> String {
    let st = env.status();
    st["subscriptions"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["id"] == local_id))
        .and_then(|s| s["upstream_subscription_id"].as_str())
        .unwrap_or_else(|| panic!("no upstream binding for {local_id}: {st:#}"))
        .to_owned()
}

/// The parsed NDJSON lines, once there are `n`.
fn events(c: &mut Child, n: usize) -> Vec<Value> {
    c.wait_stdout_lines(n, T)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect()
}

fn ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event_id"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn finish(c: Child, expected_events: u64) -> Output {
    c.signal(Sig::SIGTERM);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", expected_events);
    out
}

fn message(text: &str) -> Value {
    json!({"body": {"content": text, "sender": "u1"}})
}

// ------------------------------------------------------------------ end to end

#[test]
fn p_tkt_1_ticket_request_then_events_reach_only_their_upstream_subscription() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let mut a = consumer(&env, &[O2O, "--user", "u1"]);
    let mut b = consumer(&env, &[O2O, "--user", "u2"]);
    let conn = fake.wait_connected(T);

    // P-TKT-1: the ticket request.
    let t = &fake.ticket_requests()[0];
    assert_eq!(t.status, 200);
    assert_eq!(
        t.header("x-user-access-token"),
        Some(fake.user_token().as_str())
    );
    assert_eq!(
        t.header("authorization"),
        Some(format!("Bearer {}", fake.user_token()).as_str())
    );
    assert_eq!(t.header("x-dws-client-id"), Some(CLIENT_ID));
    assert_eq!(t.header("x-dws-source-id"), Some("open"));
    assert_eq!(t.body, json!({"sourceId": "open", "mode": "normal"}));
    let hs = fake.handshakes();
    assert_eq!(
        hs[0].ticket,
        t.issued.clone().unwrap_or_default(),
        "dialled with that ticket"
    );

    // Two different specs: two upstream subscriptions.
    let creates = fake.creates();
    assert_eq!(creates.len(), 2, "{}", fake.summary());
    let ready_a = a.wait_ready();
    let ready_b = b.wait_ready();
    let (up_a, up_b) = (
        upstream_of(&env, &ready_a.subscribe_id),
        upstream_of(&env, &ready_b.subscribe_id),
    );
    assert_ne!(up_a, up_b);
    let target = |id: &str| {
        creates
            .iter()
            .find(|c| c.issued.as_deref() == Some(id))
            .map(|c| c.body["filterRule"].as_str().unwrap_or("").to_owned())
    };
    assert_eq!(
        target(&up_a).as_deref(),
        Some(r#"{"targetUid":"u1","targetUidType":"staffId"}"#)
    );

    // An event for B's upstream subscription, one for nobody, one for A's.
    let mb = fake.push_personal(&PersonalEvent::new("ev-b1", O2O, &up_b, message("to b")));
    fake.push_personal(&PersonalEvent::new(
        "ev-none",
        O2O,
        "sub-nobody",
        message("x"),
    ));
    let ma = fake.push_personal(&PersonalEvent::new("ev-a1", O2O, &up_a, message("to a")));
    for m in [&mb, &ma] {
        let ack = fake.wait_ack(m, T);
        assert_eq!(
            (ack.code, ack.status.as_deref()),
            (200, Some("SUCCESS")),
            "{ack:?}"
        );
        assert_eq!(ack.conn, conn);
    }
    let ev_a = events(&mut a, 1);
    let ev_b = events(&mut b, 1);
    assert_eq!(ids(&ev_a), ["ev-a1"]);
    assert_eq!(ids(&ev_b), ["ev-b1"]);
    let e = &ev_a[0];
    assert_eq!(e["event_type"], O2O, "{e}");
    assert_eq!(e["subscribe_id"], ready_a.subscribe_id.as_str(), "{e}");
    assert_eq!(e["source_id"], "open", "{e}");
    let data: Value = serde_json::from_str(e["data"].as_str().unwrap_or("")).expect("data is JSON");
    assert_eq!(data["payload"]["body"]["content"], "to a", "{e}");
    assert_eq!(data["subId"], up_a.as_str(), "{e}");
    assert_eq!(e["headers"]["SUB_ID"], up_a.as_str(), "{e}");

    // A's next event arrives after B's and nobody's: neither reached A.
    let ma2 = fake.push_personal(&PersonalEvent::new("ev-a2", O2O, &up_a, message("again")));
    fake.wait_ack(&ma2, T);
    assert_eq!(ids(&events(&mut a, 2)), ["ev-a1", "ev-a2"]);
    let st = env.status();
    assert_eq!(st["source"]["kind"], "personal", "{st:#}");
    assert_eq!(st["source"]["state"], "connected", "{st:#}");
    finish(a, 2);
    let out_b = finish(b, 1);
    assert!(!out_b.stdout.contains("ev-a"), "{out_b}");
    fake.wait_until("both upstream subscriptions cancelled", T, |s| {
        s.personal.cancels.len() == 2 && s.personal.active().is_empty()
    });
}

#[test]
fn identical_consumers_share_one_upstream_subscription_the_last_exit_cancels_it() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let spec = [O2O, "--open-dingtalk-id", "od-7", "--query", "deploy"];
    let mut a = consumer(&env, &spec);
    let mut b = consumer(&env, &spec);
    fake.wait_connected(T);
    let creates = fake.creates();
    assert_eq!(
        creates.len(),
        1,
        "one create for identical specs\n{}",
        fake.summary()
    );
    let up = creates[0].issued.clone().expect("a subscription id");
    for i in 1..=3 {
        fake.push_personal(&PersonalEvent::new(
            format!("sh-{i}"),
            O2O,
            &up,
            message("deploy"),
        ));
    }
    assert_eq!(ids(&events(&mut a, 3)), ["sh-1", "sh-2", "sh-3"]);
    assert_eq!(ids(&events(&mut b, 3)), ["sh-1", "sh-2", "sh-3"]);

    let out_a = finish(a, 3);
    assert_eq!(out_a.stdout_lines().len(), 3, "each event once\n{out_a}");
    // B still holds it: nothing cancelled, events still flow.
    let m = fake.push_personal(&PersonalEvent::new("sh-4", O2O, &up, message("deploy")));
    fake.wait_ack(&m, T);
    assert_eq!(
        ids(&events(&mut b, 4)).last().map(String::as_str),
        Some("sh-4")
    );
    assert!(fake.cancels().is_empty(), "{}", fake.summary());

    let out_b = finish(b, 4);
    assert_eq!(out_b.stdout_lines().len(), 4, "each event once\n{out_b}");
    fake.wait_until("the cancel", T, |s| !s.personal.cancels.is_empty());
    let cancels = fake.cancels();
    assert_eq!(cancels.len(), 1, "{}", fake.summary());
    assert_eq!(cancels[0].body, json!({"subId": up}));
    assert_eq!(
        cancels[0].header("x-user-access-token"),
        Some(fake.user_token().as_str())
    );
    assert!(fake.with_state(|s| s.personal.active().is_empty()));
}

// ------------------------------------------------------------------ P-TKT

#[test]
fn p_tkt_2_a_401_re_reads_the_token_and_retries_once() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let old = fake.user_token();
    fake.hold_tickets(true);
    let mut c = consumer(&env, &["user_im_message_receive_at"]);
    fake.wait_until("the bus's ticket request, held", T, |s| {
        s.personal.tickets_waiting == 1
    });
    // The token is rotated while the bus's request is in flight.
    write_token(&env, "rotated-token-2");
    fake.set_user_token("rotated-token-2");
    fake.hold_tickets(false);
    fake.wait_connected(T);
    let tickets = fake.ticket_requests();
    let seen: Vec<(u16, Option<&str>)> = tickets
        .iter()
        .map(|t| (t.status, t.header("x-user-access-token")))
        .collect();
    assert_eq!(
        seen,
        [(401, Some(old.as_str())), (200, Some("rotated-token-2"))],
        "exactly one retry, with the re-read token"
    );
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new(
        "tkt2",
        "user_im_message_receive_at",
        &up,
        message("hi"),
    ));
    assert_eq!(ids(&events(&mut c, 1)), ["tkt2"]);
}

#[test]
fn p_tkt_2_a_second_401_is_fatal_and_consumers_end_with_source_lost() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    fake.hold_tickets(true);
    let a = consumer(&env, &["user_im_message_receive_at"]);
    let b = consumer(&env, &[O2O, "--user", "u1"]);
    fake.fail_next_tickets(
        5,
        401,
        r#"{"success":false,"errorCode":"UNAUTHORIZED","errorMsg":"token expired"}"#,
    );
    fake.hold_tickets(false);
    for c in [a, b] {
        let out = c.wait_exit(T);
        let lost = out.assert_source_lost();
        assert!(
            lost.contains("401") && lost.contains("UNAUTHORIZED"),
            "{lost}"
        );
    }
    assert_eq!(
        fake.ticket_requests().len(),
        2,
        "one refreshed retry, no more"
    );
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit after losing its source");
    // Its upstream subscriptions were cancelled on the way out (best effort).
    fake.wait_until("the cancels", T, |s| s.personal.cancels.len() == 2);
}

#[test]
fn p_tkt_3_server_errors_and_throttling_are_retried_until_connected() {
    let fake = FakeDingTalk::start();
    fake.fail_next_tickets(1, 500, r#"{"success":false,"errorCode":"SYSTEM_ERROR"}"#);
    fake.fail_next_tickets(1, 429, "");
    let env = env(&fake);
    let mut c = consumer(&env, &["user_im_message_receive_at"]);
    fake.wait_connected(T);
    let statuses: Vec<u16> = fake.ticket_requests().iter().map(|t| t.status).collect();
    assert_eq!(statuses, [500, 429, 200], "{}", fake.summary());
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new(
        "tkt3",
        "user_im_message_receive_at",
        &up,
        message("x"),
    ));
    assert_eq!(ids(&events(&mut c, 1)), ["tkt3"]);
    let st = env.status();
    assert!(
        st["source"]["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("429"),
        "{st:#}"
    );
}

#[test]
fn p_tkt_4_bad_request_forbidden_and_empty_answers_are_fatal_after_one_call() {
    for (status, body, why) in [
        (
            400,
            r#"{"success":false,"errorCode":"INVALID_PARAM","errorMsg":"bad"}"#,
            "HTTP 400",
        ),
        (
            403,
            r#"{"success":false,"errorCode":"FORBIDDEN"}"#,
            "HTTP 403",
        ),
        (
            200,
            r#"{"success":true,"result":{"endpoint":"","ticket":""}}"#,
            "no endpoint",
        ),
    ] {
        let fake = FakeDingTalk::start();
        let env = env(&fake);
        fake.hold_tickets(true);
        let c = consumer(&env, &["user_im_message_receive_at"]);
        fake.fail_next_tickets(1, status, body);
        fake.hold_tickets(false);
        let lost = c.wait_exit(T).assert_source_lost();
        assert!(lost.contains(why), "{why}: {lost}");
        assert_eq!(
            fake.ticket_requests().len(),
            1,
            "{why}: fatal after one call"
        );
        assert!(fake.handshakes().is_empty());
        env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit");
    }
}

// ------------------------------------------------------------------ P-FRM

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
    // upstream subscription id cannot be routed (400); a lower-case type is fine.
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
    let st = env.status();
    assert_eq!(fake.wait_ack(&nosub_mid, T).code, 400);
    assert_eq!(st["source"]["malformed"], 2, "{st:#}");
    assert_eq!(fake.handshakes().len(), 1);
}

// ------------------------------------------------------------------ P-CTL

#[test]
fn p_ctl_1_consumer_flags_become_the_create_body() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let _c = consumer(
        &env,
        &[
            "user_im_message_receive_group",
            "--group",
            "cid-42",
            "--query",
            "build",
            "--query",
            "fail",
            "--filter-json",
            r#"{"field":"sender","op":"eq","value":"u9"}"#,
            "--ttl",
            "7m",
        ],
    );
    let create = &fake.creates()[0];
    let b = &create.body;
    assert_eq!(b["clientId"], CLIENT_ID);
    assert_eq!(b["sourceId"], "open");
    assert_eq!(b["eventKey"], "user_im_message_receive_group");
    assert_eq!(
        b["filterRule"], r#"{"openConversationId":"cid-42"}"#,
        "a JSON string"
    );
    assert_eq!(b["deliveryPref"], "realtime");
    assert_eq!(b["ext"]["ruleType"], "group");
    assert_eq!(
        b["ext"]["filter"],
        json!({"and": [
            {"field": "payload.body.content", "op": "contains_any", "value": ["build", "fail"]},
            {"field": "payload.body.sender", "op": "eq", "value": "u9"},
        ]})
    );
    let key = b["ext"]["idempotencyKey"].as_str().unwrap_or("");
    assert!(key.starts_with("dws-cli-") && key.len() == 24, "{key}");
    let expires = b["expiresAt"].as_str().unwrap_or("");
    assert!(
        expires.len() == 20 && expires.ends_with('Z'),
        "RFC 3339 UTC: {expires}"
    );
    assert_eq!(
        create.header("authorization"),
        Some(format!("Bearer {}", fake.user_token()).as_str())
    );
    assert_eq!(create.header("x-dws-client-id"), Some(CLIENT_ID));
}

/// The bus's default TTL is about detached local subscriptions: without an
/// explicit `--ttl` the upstream subscription gets no expiry (an attached
/// consumer must not silently lose it), and is cancelled by the last exit.
#[test]
fn without_ttl_the_upstream_subscription_has_no_expiry() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let _c = consumer(&env, &["user_im_message_receive_at"]);
    let create = &fake.creates()[0];
    assert!(
        create.body.get("expiresAt").is_none(),
        "no expiresAt without --ttl: {}",
        create.body
    );
}

#[test]
fn p_ctl_2_cancel_of_a_subscription_the_server_already_dropped_is_success() {
    let fake = FakeDingTalk::start();
    let env = env_with(&fake, 0, &[("DWS_BUS_LOG", "debug")]);
    let c = consumer(&env, &["user_im_message_receive_at"]);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    assert!(fake.expire_subscription(&up));
    finish(c, 0);
    fake.wait_until("the cancel", T, |s| !s.personal.cancels.is_empty());
    let cancel = &fake.cancels()[0];
    assert_eq!(cancel.body["subId"], up.as_str());
    env.wait_until(T, "the cancel's outcome in bus.log", || {
        std::fs::read_to_string(env.bus_log_path()).is_ok_and(|l| l.contains("gone already"))
    });
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    assert!(
        !log.contains("cancelling the upstream subscription failed"),
        "{log}"
    );
}

#[test]
fn p_ctl_3_4_5_control_plane_errors_refuse_the_consumer_with_the_right_exit_code() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    // The bus is up (and stays up) with one healthy consumer.
    let healthy = consumer(&env, &["user_im_message_receive_at"]);
    let args = [O2O, "--user", "u1"];
    let cases: [(ControlFault, i32, &[&str]); 5] = [
        // P-CTL-3
        (
            ControlFault::new(
                429,
                r#"{"success":false,"errorCode":"RATE_LIMITED","errorMsg":"slow down"}"#,
            )
            .header("Retry-After", "45"),
            1,
            &[
                "RATE_LIMITED: slow down",
                "HTTP 429",
                "retryable",
                "retry after 45s",
            ],
        ),
        // P-CTL-4
        (
            ControlFault::new(
                200,
                r#"{"success":false,"errorCode":"RATE_LIMITED","retryable":false,"retryAfterSeconds":30}"#,
            ),
            1,
            &["RATE_LIMITED", "not retryable", "retry after 30s"],
        ),
        // P-CTL-5
        (
            ControlFault::new(
                400,
                r#"{"error":{"code":"SUBSCRIPTION_ALREADY_EXISTS","message":"exists","details":{"subscribe_id":"sub-theirs"}}}"#,
            ),
            1,
            &[
                "SUBSCRIPTION_ALREADY_EXISTS",
                "retryability unknown",
                "sub-theirs, which is not adopted",
            ],
        ),
        // Authentication / permission.
        (
            ControlFault::new(
                403,
                r#"{"error":{"code":"FORBIDDEN","message":"not yours"}}"#,
            ),
            3,
            &[
                "FORBIDDEN: not yours",
                "authentication or permission failure",
            ],
        ),
        // A business error.
        (
            ControlFault::new(
                400,
                r#"{"success":false,"errorCode":"INVALID_PARAM","errorMsg":"bad rule"}"#,
            ),
            1,
            &["INVALID_PARAM: bad rule", "not retryable"],
        ),
    ];
    for (i, (fault, code, wants)) in cases.into_iter().enumerate() {
        let before = fake.creates().len();
        fake.fail_next_control(ControlOp::Create, 1, fault);
        let out = failing_consumer(&env, &args);
        let line = out.assert_error(code);
        assert!(
            !out.stderr.contains("[event] ready"),
            "case {i}: no ready line\n{out}"
        );
        assert!(
            line.starts_with("Error: upstream subscription failed: "),
            "case {i}: {line}"
        );
        for w in wants {
            assert!(line.contains(w), "case {i}: {w:?} missing in {line}");
        }
        assert_eq!(
            fake.creates().len(),
            before + 1,
            "case {i}: one create call, not retried"
        );
    }
    // Nothing was adopted or left behind locally; the healthy consumer is fine.
    let st = env.status();
    assert_eq!(
        st["subscriptions"].as_array().map(Vec::len),
        Some(1),
        "{st:#}"
    );
    // A second attempt after a failure works.
    let ok = consumer(&env, &args);
    finish(ok, 0);
    finish(healthy, 0);
}

// ------------------------------------------------------------------ secrets

#[test]
fn the_user_token_never_shows_up_anywhere() {
    const CANARY: &str = "CANARY-user-token-5b7d1e";
    let fake = FakeDingTalk::start();
    fake.set_user_token(CANARY);
    let env = env_with(&fake, 0, &[("DWS_BUS_LOG", "debug")]);
    // A ticket 401 that echoes the token (then a refreshed retry succeeds).
    fake.fail_next_tickets(
        1,
        401,
        &format!(r#"{{"errorCode":"UNAUTHORIZED","errorMsg":"bad token {CANARY}"}}"#),
    );
    let mut c = consumer(&env, &["user_im_message_receive_at"]);
    fake.wait_connected(T);
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new(
        "sec-1",
        "user_im_message_receive_at",
        &up,
        message("hi"),
    ));
    events(&mut c, 1);
    // A control-plane error that echoes the token.
    fake.fail_next_control(
        ControlOp::Create,
        1,
        ControlFault::new(
            401,
            format!(r#"{{"error":{{"code":"UNAUTHORIZED","message":"token {CANARY} expired"}}}}"#),
        ),
    );
    let refused = failing_consumer(&env, &[O2O, "--user", "u1"]);
    let line = refused.assert_error(3);
    assert!(line.contains("<redacted>"), "{line}");
    assert!(
        fake.ticket_requests()
            .iter()
            .all(|t| t.header("x-user-access-token") == Some(CANARY)),
        "the token is sent upstream"
    );

    let st = env.status().to_string();
    let meta = std::fs::read_to_string(env.work_dir().join("bus.meta")).unwrap_or_default();
    let argvs = dws_tests::all_process_argv();
    let out = finish(c, 1);
    let log = std::fs::read_to_string(env.bus_log_path()).expect("bus.log");
    assert!(
        log.contains("personal"),
        "the debug log has the source's lines:\n{log}"
    );
    dws_tests::assert_absent(
        "the user token",
        CANARY,
        &[
            ("bus.log", &log),
            ("status JSON", &st),
            ("bus.meta", &meta),
            ("consumer stdout", &out.stdout),
            ("consumer stderr", &out.stderr),
            ("refused consumer stderr", &refused.stderr),
            ("argv of the processes", &argvs),
        ],
    );

    // The lost reason, too.
    let fake2 = FakeDingTalk::start();
    fake2.set_user_token(CANARY);
    let env2 = env_with(&fake2, 0, &[]);
    fake2.hold_tickets(true);
    let c2 = consumer(&env2, &["user_im_message_receive_at"]);
    fake2.fail_next_tickets(
        2,
        401,
        &format!(r#"{{"errorCode":"UNAUTHORIZED","errorMsg":"bad token {CANARY}"}}"#),
    );
    fake2.hold_tickets(false);
    let out2 = c2.wait_exit(T);
    out2.assert_clean_exit("source_lost", 0);
    assert!(!out2.stderr.contains(CANARY), "{out2}");
    assert!(out2.stderr.contains("<redacted>"), "{out2}");
    let log2 = std::fs::read_to_string(env2.bus_log_path()).unwrap_or_default();
    assert!(!log2.contains(CANARY), "{log2}");
}
