//! The `personal` source against the loopback fake's personal stream
//! (`dws_tests::fake_dingtalk::personal`), which is as strict as the
//! reference CLI and the service where they are: conformance checks of the
//! protocol note §8 (client side: P-TKT-1..4, P-FRM-1, P-CTL-1..5; P-CTL-6,
//! list paging, is checked at unit level against the same fake in
//! `busd::source::personal::control`, since nothing in the product lists)
//! and end-to-end runs through real `busd` and `dws event consume`
//! processes: routing by upstream subscription, identical consumers sharing
//! one upstream subscription, the last one's exit cancelling it, control
//! plane errors as exit codes, a lost source, and the user token never
//! showing up anywhere.
//!
//! Submodules: [`frames`] (the reference's frame gate: spellings, acks,
//! unroutable frames, embedded tickets, keepalive), [`session`] (ping,
//! `disconnect`, drops, backoff), [`control`] (create
//! bodies, headers, the idempotency key, errors, ticket modes), [`auth`]
//! (token refresh, secrets), [`refresh`] (the refresh body, the file lock
//! shared with other processes).
//!
//! Each test has its own fake and its own [`TestEnv`]; the bus reads its
//! token from a 0600 file next to `config.toml`. Backoff is shortened with
//! the stream sources' test knobs. Ticket requests are held
//! ([`FakeDingTalk::hold_tickets`]) where a consumer must be attached before
//! the source fails. Waits are bounded; there are no timing assertions.

mod auth;
mod control;
mod frames;
mod identity;
mod refresh;
mod session;

use std::{collections::BTreeMap, os::unix::fs::PermissionsExt, time::Duration};

use dws_tests::{
    fake_dingtalk::{dingtalk_env, personal::PersonalEvent, FakeDingTalk},
    Child, Output, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::{json, Value};

/// Bound of every wait in this module.
const T: Duration = Duration::from_secs(30);
const O2O: &str = "user_im_message_receive_o2o";
const CLIENT_ID: &str = "dws-test-client";

/// A [`TestEnv`] whose default profile is the personal stream of `fake`,
/// with `extra` lines in its section and `knobs` in the bus's environment.
fn env_cfg(fake: &FakeDingTalk, extra: &str, knobs: &[(&str, &str)]) -> TestEnv {
    let mut lines = String::new();
    if !extra.contains("client_id") {
        lines.push_str(&format!("client_id = \"{CLIENT_ID}\"\n"));
    }
    lines.push_str(extra);
    let env = dingtalk_env(&fake.personal_profile("token", &lines), knobs);
    write_token(&env, &fake.user_token());
    env
}

fn env_with(fake: &FakeDingTalk, max_attempts: u32, knobs: &[(&str, &str)]) -> TestEnv {
    env_cfg(fake, &format!("max_attempts = {max_attempts}\n"), knobs)
}

fn env(fake: &FakeDingTalk) -> TestEnv {
    env_with(fake, 0, &[])
}

/// Writes a 0600 file `name` in the config dir.
fn write_private(env: &TestEnv, name: &str, body: &str) {
    let p = env.cfg_dir().join(name);
    std::fs::write(&p, format!("{body}\n")).expect("write private file");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
}

fn write_token(env: &TestEnv, token: &str) {
    write_private(env, "token", token);
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

/// Frames acked but not routed, by reason, as `status` shows them:
/// `source.unroutable` once the hub counts them per reason; until then they
/// are counted with the malformed input, under the key `(malformed)`.
fn unroutable(st: &Value) -> BTreeMap<String, u64> {
    match st["source"]["unroutable"].as_object() {
        Some(m) => m
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
            .collect(),
        None => [(
            "(malformed)".to_owned(),
            st["source"]["malformed"].as_u64().unwrap_or(0),
        )]
        .into(),
    }
}

/// Asserts the unroutable counts of `st`: exactly `want` per reason, or
/// (while the hub counts them as malformed) `want`'s total plus
/// `malformed_too` other malformed frames.
fn assert_unroutable(st: &Value, want: &[(&str, u64)], malformed_too: u64) {
    let got = unroutable(st);
    if got.contains_key("(malformed)") {
        let total: u64 = want.iter().map(|(_, n)| n).sum::<u64>() + malformed_too;
        assert_eq!(got["(malformed)"], total, "{st:#}");
    } else {
        let want: BTreeMap<String, u64> = want.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        assert_eq!(got, want, "{st:#}");
        assert_eq!(st["source"]["malformed"], malformed_too, "{st:#}");
    }
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

/// Without a refresh token and without a newer token in the file there is
/// nothing to retry with: the first 401 ends the source (the reference,
/// without a refresh callback, ends there too: personal.go `fetchTicket`).
#[test]
fn p_tkt_2_a_401_with_nothing_to_retry_with_is_fatal_and_consumers_end_with_source_lost() {
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
        // Without a refresh token the reason says one would have helped.
        assert!(lost.contains("refresh token"), "{lost}");
    }
    assert_eq!(
        fake.ticket_requests().len(),
        1,
        "no retry with the same token"
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
