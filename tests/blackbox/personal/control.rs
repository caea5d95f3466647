//! The control plane as the reference CLI drives it
//! (`internal/event/personal/client.go`, `registry.go`): create bodies and
//! headers, the idempotency key of the user's identity (which the fake
//! checks), errors as exit codes, and the ticket modes.

use dws_tests::fake_dingtalk::personal::{ControlFault, ControlOp, FakeIdentity};
use serde_json::json;

use super::*;

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
    // The reference's order: the --filter-json object, then the terms.
    assert_eq!(
        b["ext"]["filter"],
        json!({"and": [
            {"field": "payload.body.sender", "op": "eq", "value": "u9"},
            {"field": "payload.body.content", "op": "contains_any", "value": ["build", "fail"]},
        ]})
    );
    // The fake accepted the key: it is the reference's for this identity
    // (here the SHA-256 of the access token, no corp/user being known).
    let key = b["ext"]["idempotencyKey"].as_str().unwrap_or("");
    assert!(key.starts_with("dws-cli-") && key.len() == 24, "{key}");
    assert_eq!(create.status, 200);
    assert!(b["ext"].get("name").is_none(), "no name unless configured");
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
    assert_eq!(create.header("x-dws-source-id"), Some("open"));
    // The reference's control-plane headers.
    assert_eq!(create.header("x-cli-version"), Some(proto::BUILD));
    let ua = format!("dws-cli/{}", proto::BUILD);
    assert_eq!(create.header("user-agent"), Some(ua.as_str()));
    assert_eq!(create.header("x-dws-corp-id"), None, "only when known");
    assert_eq!(create.header("accept"), Some("application/json"));
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

/// With the user's corp and user id configured, creates carry
/// `X-DWS-Corp-Id` and the `corp_user` identity's key (the fake accepts no
/// other), and a configured name goes to `ext.name`; another user of the
/// same app gets another key; a bus that does not know the identity the
/// service sees is refused.
#[test]
fn the_idempotency_key_is_the_one_of_the_users_identity() {
    let fake = FakeDingTalk::start();
    fake.set_identity(FakeIdentity::CorpUser {
        corp: "dingcorp1".into(),
        user: "user-7".into(),
    });
    let env = env_cfg(
        &fake,
        "corp_id = \"dingcorp1\"\nuser_id = \"user-7\"\nsubscription_name = \"laptop bus\"\n",
        &[],
    );
    let c = consumer(&env, &["user_im_message_receive_at"]);
    let create = &fake.creates()[0];
    assert_eq!(create.status, 200, "{:?}", create.body);
    assert_eq!(create.header("x-dws-corp-id"), Some("dingcorp1"));
    assert_eq!(create.body["ext"]["name"], "laptop bus");
    let key_7 = create.body["ext"]["idempotencyKey"].clone();
    finish(c, 0);

    fake.set_identity(FakeIdentity::CorpUser {
        corp: "dingcorp1".into(),
        user: "user-8".into(),
    });
    let env8 = env_cfg(
        &fake,
        "corp_id = \"dingcorp1\"\nuser_id = \"user-8\"\n",
        &[],
    );
    let c8 = consumer(&env8, &["user_im_message_receive_at"]);
    let key_8 = fake.creates().last().expect("a create").body["ext"]["idempotencyKey"].clone();
    assert_ne!(key_7, key_8, "one key per user, not per app");
    finish(c8, 0);

    // The service knows user-8; a bus configured without the identity
    // hashes its token instead: not the key the service expects.
    let anonymous = env_cfg(&fake, "", &[]);
    let out = failing_consumer(&anonymous, &["user_im_message_receive_at"]);
    let line = out.assert_error(1);
    assert!(
        line.contains("INVALID_PARAM") && line.contains("idempotencyKey"),
        "{line}"
    );
}

/// The personal `custom` ticket mode sends the app's client id and secret
/// in the ticket body (`fetchTicketAttempt`); the secret stays out of logs.
#[test]
fn custom_ticket_mode_sends_the_app_credentials() {
    let fake = FakeDingTalk::start();
    let env = TestEnv::with_env(&[
        ("DWS_DINGTALK_BACKOFF_MIN_MS", "100"),
        ("DWS_BUS_LOG", "debug"),
    ]);
    write_token(&env, &fake.user_token());
    write_private(&env, "app.secret", &fake.client_secret());
    env.write_default_profile(&fake.personal_profile(
        "token",
        &format!(
            "client_id = \"{}\"\nclient_secret_file = \"app.secret\"\nstream_ticket_mode = \"custom\"\n",
            fake.client_id()
        ),
    ));
    let mut c = consumer(&env, &["user_im_message_receive_at"]);
    fake.wait_connected(T);
    let t = &fake.ticket_requests()[0];
    assert_eq!(
        t.body,
        json!({"sourceId": "open", "mode": "custom", "clientId": fake.client_id(), "clientSecret": fake.client_secret()})
    );
    assert_eq!(t.header("x-dws-client-id"), Some(fake.client_id().as_str()));
    let up = fake.creates()[0].issued.clone().expect("subscription");
    fake.push_personal(&PersonalEvent::new(
        "cu",
        "user_im_message_receive_at",
        &up,
        message("x"),
    ));
    assert_eq!(ids(&events(&mut c, 1)), ["cu"]);
    let out = finish(c, 1);
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    let st = env.status().to_string();
    dws_tests::assert_absent(
        "the app secret",
        &fake.client_secret(),
        &[("bus.log", &log), ("status", &st), ("stderr", &out.stderr)],
    );
}

/// `ext.name` is one per subscription, like the reference's `--name`
/// (`internal/app/event_command.go:346`, `internal/event/personal/
/// client.go:309-311`): a consumer's `--name` wins over the profile's
/// `subscription_name`, which names the others.
#[test]
fn a_consumers_name_goes_to_its_upstream_subscription() {
    let fake = FakeDingTalk::start();
    let env = env_cfg(&fake, "subscription_name = \"profile name\"\n", &[]);
    let a = consumer(&env, &[O2O, "--user", "u1", "--name", "desk <a>"]);
    let b = consumer(&env, &[O2O, "--user", "u2"]);
    fake.wait_until("two creates", T, |s| s.personal.creates.len() == 2);
    let names: Vec<(String, String)> = fake
        .creates()
        .iter()
        .map(|c| {
            (
                c.body["filterRule"].as_str().unwrap_or("").to_owned(),
                c.body["ext"]["name"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert!(
        names.contains(&(
            r#"{"targetUid":"u1","targetUidType":"staffId"}"#.to_owned(),
            "desk <a>".to_owned()
        )),
        "{names:?}"
    );
    assert!(
        names.contains(&(
            r#"{"targetUid":"u2","targetUidType":"staffId"}"#.to_owned(),
            "profile name".to_owned()
        )),
        "{names:?}"
    );
    finish(a, 0);
    finish(b, 0);
}
