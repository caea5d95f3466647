//! The user's credentials: a rejected access token refreshed with the
//! profile's refresh token (the reference's `ForceRefreshRejectedToken` and
//! MCP `refreshToken` call), written back atomically, retried once; a
//! refresh ahead of a known expiry; failures that end the source with the
//! reason; and no token ever showing up anywhere.

use std::{fs, os::unix::fs::PermissionsExt};

use dws_tests::fake_dingtalk::personal::{ControlFault, ControlOp, FakeIdentity};
use serde_json::json;

use super::*;

const AT: &str = "user_im_message_receive_at";

/// A bus with a refresh token (a 0600 file) for `fake`, whose service
/// attributes creates to that refresh token (the reference's local subject
/// when the corp and user are unknown).
fn env_refreshing(fake: &FakeDingTalk, knobs: &[(&str, &str)]) -> TestEnv {
    fake.set_identity(FakeIdentity::RefreshToken);
    let env = env_cfg(fake, "refresh_token_file = \"refresh\"\n", knobs);
    write_private(&env, "refresh", &fake.refresh_token());
    env
}

fn file_of(env: &TestEnv, name: &str) -> (String, u32) {
    let p = env.cfg_dir().join(name);
    let mode = fs::metadata(&p).expect("metadata").permissions().mode() & 0o777;
    (
        fs::read_to_string(&p).expect("read").trim().to_owned(),
        mode,
    )
}

#[test]
fn a_401_refreshes_the_token_writes_it_back_and_retries_once() {
    let fake = FakeDingTalk::start();
    let env = env_refreshing(&fake, &[]);
    let (old_token, old_refresh) = (fake.user_token(), fake.refresh_token());
    fake.hold_tickets(true);
    let mut c = consumer(&env, &[AT]);
    fake.wait_until("the bus's ticket request, held", T, |s| {
        s.personal.tickets_waiting == 1
    });
    // The token expires server-side while the request is in flight.
    fake.revoke_user_token();
    fake.hold_tickets(false);
    fake.wait_connected(T);
    let new_token = fake.user_token();
    let seen: Vec<(u16, String)> = fake
        .ticket_requests()
        .iter()
        .map(|t| {
            (
                t.status,
                t.header("x-user-access-token").unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [(401, old_token.clone()), (200, new_token.clone())],
        "one refresh, one retry with the new token"
    );
    let refreshes = fake.refreshes();
    assert_eq!(refreshes.len(), 1, "{}", fake.summary());
    assert_eq!(
        refreshes[0].body,
        json!({"clientId": CLIENT_ID, "refreshToken": old_refresh, "grantType": "refresh_token"})
    );
    // Both tokens written back to their 0600 files.
    assert_eq!(file_of(&env, "token"), (new_token, 0o600));
    assert_eq!(file_of(&env, "refresh"), (fake.refresh_token(), 0o600));
    let leftovers: Vec<_> = fs::read_dir(env.cfg_dir())
        .expect("cfg dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new("r1", AT, &up, message("x")));
    assert_eq!(ids(&events(&mut c, 1)), ["r1"]);
    // The next create uses the refreshed tokens (and the rotated refresh
    // token's identity, which the fake checks).
    let c2 = consumer(&env, &[O2O, "--user", "u2"]);
    let last = fake.creates().last().cloned().expect("a create");
    assert_eq!(last.status, 200, "{:?}", last.body);
    assert_eq!(
        last.header("x-user-access-token"),
        Some(fake.user_token().as_str())
    );
    finish(c2, 0);
    finish(c, 1);
}

#[test]
fn a_control_plane_401_refreshes_and_retries_once() {
    let fake = FakeDingTalk::start();
    let env = env_refreshing(&fake, &[]);
    let a = consumer(&env, &[AT]);
    fake.wait_connected(T);
    fake.revoke_user_token();
    let b = consumer(&env, &[O2O, "--user", "u1"]);
    let statuses: Vec<u16> = fake.creates().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [200, 401, 200], "{}", fake.summary());
    assert_eq!(fake.refreshes().len(), 1);
    assert_eq!(file_of(&env, "token").0, fake.user_token());
    finish(b, 0);
    finish(a, 0);
}

/// Once a refresh told the token's lifetime, the bus refreshes before it
/// runs out (like the reference's 5-minute margin, here half of a short
/// lifetime) instead of waiting for a 401.
#[test]
fn the_token_is_refreshed_ahead_of_a_known_expiry() {
    let fake = FakeDingTalk::start();
    fake.set_token_lifetime(Duration::from_secs(2));
    let env = env_refreshing(&fake, &[]);
    fake.hold_tickets(true);
    let a = consumer(&env, &[AT]);
    fake.wait_until("the bus's ticket request, held", T, |s| {
        s.personal.tickets_waiting == 1
    });
    fake.revoke_user_token();
    fake.hold_tickets(false);
    fake.wait_connected(T);
    assert_eq!(fake.refreshes().len(), 1);
    // Past half the lifetime: the next call refreshes first, no 401.
    std::thread::sleep(Duration::from_millis(1500));
    let b = consumer(&env, &[O2O, "--user", "u1"]);
    let refreshes = fake.refreshes();
    assert_eq!(refreshes.len(), 2, "{}", fake.summary());
    let creates = fake.creates();
    let last = creates.last().expect("a create");
    assert_eq!(last.status, 200);
    assert!(refreshes[1].at < last.at, "refreshed before the call");
    assert!(creates.iter().all(|c| c.status == 200), "no 401 on the way");
    finish(b, 0);
    finish(a, 0);
}

#[test]
fn a_refresh_that_fails_transiently_is_retried_and_one_refused_ends_the_source() {
    // 503 on the refresh: a failed attempt, retried with backoff.
    let fake = FakeDingTalk::start();
    let env = env_refreshing(&fake, &[]);
    fake.hold_tickets(true);
    let _c = consumer(&env, &[AT]);
    fake.revoke_user_token();
    fake.fail_next_refreshes(1, 503, "");
    fake.hold_tickets(false);
    fake.wait_connected(T);
    let refreshes: Vec<u16> = fake.refreshes().iter().map(|r| r.status).collect();
    assert_eq!(refreshes, [503, 200]);
    // Retries within 3 s of the failed refresh get that failure without a
    // call (the reference's cooldown): 401s until then, one refresh, a 200.
    let tickets: Vec<u16> = fake.ticket_requests().iter().map(|t| t.status).collect();
    let (last, before) = tickets.split_last().expect("tickets");
    assert_eq!(*last, 200, "{tickets:?}");
    assert!(
        before.len() >= 2 && before.iter().all(|s| *s == 401),
        "{tickets:?}\n{}",
        fake.summary()
    );

    // A refused refresh (a dead refresh token) ends the source, saying why.
    let fake = FakeDingTalk::start();
    let env = env_refreshing(&fake, &[]);
    fake.hold_tickets(true);
    let c = consumer(&env, &[AT]);
    fake.revoke_user_token();
    fake.set_refresh_token("not-what-the-bus-has");
    fake.hold_tickets(false);
    let lost = c.wait_exit(T).assert_source_lost();
    assert!(
        lost.contains("HTTP 401") && lost.contains("invalidParameter.authCode.notFound"),
        "{lost}"
    );
    assert_eq!(fake.ticket_requests().len(), 1, "no retry without a token");
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit after losing its source");
}

#[test]
fn the_refresh_token_and_refreshed_tokens_never_show_up_anywhere() {
    const CANARY: &str = "CANARY-refresh-token-9c2e";
    let fake = FakeDingTalk::start();
    fake.set_refresh_token(CANARY);
    let env = env_refreshing(&fake, &[("DWS_BUS_LOG", "debug")]);
    fake.hold_tickets(true);
    let c = consumer(&env, &[AT]);
    fake.revoke_user_token();
    // The first refresh fails echoing the refresh token.
    fake.fail_next_refreshes(
        1,
        500,
        &format!(r#"{{"errorCode":"BUSY","errorMsg":"retry {CANARY} later"}}"#),
    );
    fake.hold_tickets(false);
    fake.wait_connected(T);
    assert_eq!(fake.refreshes().len(), 2, "{}", fake.summary());
    let refreshed = fake.user_token();
    let new_refresh = fake.refresh_token();
    let st = env.status().to_string();
    let out = finish(c, 0);
    let log = std::fs::read_to_string(env.bus_log_path()).expect("bus.log");
    assert!(
        log.contains("refreshed"),
        "the debug log has the refresh:\n{log}"
    );
    for secret in [CANARY, refreshed.as_str(), new_refresh.as_str()] {
        dws_tests::assert_absent(
            "a token",
            secret,
            &[
                ("bus.log", &log),
                ("status JSON", &st),
                ("consumer stderr", &out.stderr),
                ("argv of the processes", &dws_tests::all_process_argv()),
            ],
        );
    }
}

#[test]
fn the_user_token_never_shows_up_anywhere() {
    const CANARY: &str = "CANARY-user-token-5b7d1e";
    let fake = FakeDingTalk::start();
    fake.set_user_token(CANARY);
    let env = env_with(&fake, 0, &[("DWS_BUS_LOG", "debug")]);
    // A ticket 503 that echoes the token (then the retry succeeds; a 401
    // would end the source: there is no refresh token).
    fake.fail_next_tickets(
        1,
        503,
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
