//! Who the user is, as the reference knows it from its saved login
//! (`internal/app/event_personal_command.go` `resolvePersonalEventIdentity`:
//! `TokenData.CorpID`/`UserID`; `internal/auth/oauth_helpers.go`
//! `parseMCPTokenResponse`: the refresh answer's `corpId`/`userId`): with no
//! `corp_id`/`user_id` configured, the bus takes them from a JSON token
//! file in the saved login's shape, else from the refresh answer — so the
//! idempotency key is the `corp_user` one (the same user and spec get the
//! same key as with the identity configured) and `X-DWS-Corp-Id` is sent.

use dws_tests::fake_dingtalk::personal::FakeIdentity;
use serde_json::{json, Value};

use super::*;

const AT: &str = "user_im_message_receive_at";
const CORP: &str = "dingcorp1";
const USER: &str = "user-7";

/// The fake knows the user as `CORP`/`USER`; the key a bus configured with
/// that identity sends for an `AT` consumer.
fn configured_key(fake: &FakeDingTalk) -> Value {
    fake.set_identity(FakeIdentity::CorpUser {
        corp: CORP.into(),
        user: USER.into(),
    });
    let env = env_cfg(
        fake,
        &format!("corp_id = \"{CORP}\"\nuser_id = \"{USER}\"\n"),
        &[],
    );
    let c = consumer(&env, &[AT]);
    let create = fake.creates().last().expect("a create").clone();
    assert_eq!(create.status, 200, "{:?}", create.body);
    finish(c, 0);
    create.body["ext"]["idempotencyKey"].clone()
}

/// The last create the fake accepted: its corp header and key.
fn accepted_create(fake: &FakeDingTalk) -> (Option<String>, Value) {
    let creates = fake.creates();
    let ok = creates
        .iter()
        .rev()
        .find(|r| r.status == 200)
        .unwrap_or_else(|| panic!("no accepted create: {}", fake.summary()));
    (
        ok.header("x-dws-corp-id").map(str::to_owned),
        ok.body["ext"]["idempotencyKey"].clone(),
    )
}

fn token_json(env: &TestEnv) -> Value {
    let text = std::fs::read_to_string(env.cfg_dir().join("token")).expect("read token");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"))
}

/// Bare token files and no identity configured: the token on file is dead,
/// the refresh answer names the user; the create retried after it carries
/// the `corp_user` key and the corp header (today: the local subject's key,
/// refused by a service that knows the user).
#[test]
fn the_refresh_answer_tells_who_the_user_is() {
    let fake = FakeDingTalk::start();
    let want = configured_key(&fake);
    let env = env_cfg(&fake, "refresh_token_file = \"refresh\"\n", &[]);
    write_private(&env, "refresh", &fake.refresh_token());
    fake.revoke_user_token();
    let c = consumer(&env, &[AT]);
    let (corp, key) = accepted_create(&fake);
    assert_eq!(corp.as_deref(), Some(CORP));
    assert_eq!(key, want, "the same key as with the identity configured");
    assert!(!fake.refreshes().is_empty(), "{}", fake.summary());
    finish(c, 0);
}

/// The token file is the reference's saved login (`TokenData` JSON, with
/// `corp_id` and `user_id`): no refresh needed to know the user.
#[test]
fn a_json_token_file_tells_who_the_user_is() {
    let fake = FakeDingTalk::start();
    let want = configured_key(&fake);
    let env = env_cfg(&fake, "", &[]);
    let login = json!({
        "access_token": fake.user_token(),
        "refresh_token": "",
        "expires_at": "2099-01-01T00:00:00Z",
        "corp_id": CORP,
        "user_id": USER,
        "client_id": CLIENT_ID,
    });
    write_private(&env, "token", &login.to_string());
    let c = consumer(&env, &[AT]);
    let (corp, key) = accepted_create(&fake);
    assert_eq!(corp.as_deref(), Some(CORP));
    assert_eq!(key, want);
    assert!(fake.refreshes().is_empty(), "{}", fake.summary());
    finish(c, 0);
}

/// One JSON file holds both tokens and no identity: a refresh writes the
/// new access token and the rotated refresh token back into it, keeps its
/// other fields and adds the identity the answer told.
#[test]
fn a_refresh_writes_a_json_token_file_back_in_its_shape() {
    let fake = FakeDingTalk::start();
    let want = configured_key(&fake);
    let env = env_cfg(&fake, "refresh_token_file = \"token\"\n", &[]);
    let login = json!({
        "access_token": fake.user_token(),
        "refresh_token": fake.refresh_token(),
        "expires_at": "2099-01-01T00:00:00Z",
        "client_id": CLIENT_ID,
    });
    write_private(&env, "token", &login.to_string());
    fake.revoke_user_token();
    let c = consumer(&env, &[AT]);
    let (corp, key) = accepted_create(&fake);
    assert_eq!((corp.as_deref(), key), (Some(CORP), want));
    let saved = token_json(&env);
    assert_eq!(
        saved,
        json!({
            "access_token": fake.user_token(),
            "refresh_token": fake.refresh_token(),
            "expires_at": "2099-01-01T00:00:00Z",
            "client_id": CLIENT_ID,
            "corp_id": CORP,
            "user_id": USER,
        })
    );
    finish(c, 0);
}
