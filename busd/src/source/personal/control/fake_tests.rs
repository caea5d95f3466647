//! The control-plane client against the loopback fake's control plane
//! (protocol note §8, P-CTL-1/2/3/6, sharing by reference count). The fake
//! accepts a create only with the reference's idempotency key for the
//! caller's identity, and refuses an empty client id.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use dws_tests::fake_dingtalk::{
    personal::{ControlFault, ControlOp},
    FakeDingTalk,
};
use proto::v1::{ErrorCode, UpstreamSpec};
use serde_json::{json, Value};

use super::*;
use crate::{
    section::Secret,
    source::personal::config::TokenSource,
    source::{
        personal::credentials::Credentials,
        stream::{self, net},
    },
    upstream::UpstreamControl,
};

fn control(fake: &FakeDingTalk, token: &str) -> Control {
    let tls = net::tls_config().unwrap();
    let http = net::http_client(&tls, &stream::user_agent(), Duration::from_secs(10)).unwrap();
    let creds = Arc::new(Credentials::new(TokenSource::Fixed(Secret::new(token))));
    Control::new(
        http,
        creds,
        ControlConfig {
            base: format!("{}/dws", fake.base_url()),
            client_id: "cid-test".into(),
            source_id: "open".into(),
            ..ControlConfig::default()
        },
    )
}

/// Polls `cond` (the fake is observed from another thread) for up to 20 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn at_spec() -> UpstreamSpec {
    UpstreamSpec {
        rule_type: "at".into(),
        query: vec!["deploy".into()],
        ..UpstreamSpec::default()
    }
}

#[tokio::test]
async fn p_ctl_1_create_sends_the_documented_body_and_headers() {
    let fake = FakeDingTalk::start();
    let c = control(&fake, &fake.user_token());
    let req = CreateRequest::from_spec(
        &["user_im_message_receive_at".to_owned()],
        &at_spec(),
        Duration::from_secs(60),
    )
    .unwrap();
    let id = c.create(&req).await.unwrap();
    let rec = &fake.creates()[0];
    assert_eq!(rec.issued.as_deref(), Some(id.as_str()));
    assert_eq!(
        rec.header("x-user-access-token"),
        Some(fake.user_token().as_str())
    );
    assert_eq!(
        rec.header("authorization"),
        Some(format!("Bearer {}", fake.user_token()).as_str())
    );
    assert_eq!(rec.header("x-dws-client-id"), Some("cid-test"));
    assert_eq!(rec.header("x-dws-source-id"), Some("open"));
    assert_eq!(rec.body["filterRule"], "{}", "a JSON string");
    assert_eq!(rec.body["deliveryPref"], "realtime");
    assert_eq!(rec.body["ext"]["ruleType"], "at");
    assert_eq!(rec.body["ext"]["filter"]["value"], json!(["deploy"]));
    assert!(rec.body["expiresAt"].as_str().unwrap().ends_with('Z'));
    let listed = c.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].sub_id.as_str(), listed[0].status.as_str()),
        (id.as_str(), "active")
    );
    assert_eq!(listed[0].event_key, "user_im_message_receive_at");
    assert!(
        !listed[0].created_at.is_empty(),
        "gmtCreate, a string: {listed:?}"
    );
    assert_eq!(rec.header("x-cli-version"), Some(proto::BUILD));
    assert_eq!(
        rec.header("user-agent"),
        Some(format!("dws-cli/{}", proto::BUILD).as_str())
    );
    assert_eq!(rec.status, 200, "the fake checked the idempotency key");
}

#[tokio::test]
async fn p_ctl_2_cancel_of_an_unknown_id_is_success() {
    let fake = FakeDingTalk::start();
    let c = control(&fake, &fake.user_token());
    assert_eq!(c.cancel("sub-unknown").await, Ok(false));
    let id = fake.seed_subscriptions(1, "cid-test", "open").remove(0);
    assert_eq!(c.cancel(&id).await, Ok(true));
    assert_eq!(c.cancel(&id).await, Ok(false), "twice: gone already");
    fake.fail_next_control(
        ControlOp::Cancel,
        1,
        ControlFault::new(404, r#"{"error":{"code":"NOT_FOUND","message":"no"}}"#),
    );
    assert_eq!(c.cancel("x").await, Ok(false));
    fake.fail_next_control(ControlOp::Cancel, 1, ControlFault::new(500, ""));
    assert_eq!(c.cancel("x").await.unwrap_err().class(), Class::Retryable);
    assert_eq!(fake.cancels().len(), 5);
}

#[tokio::test]
async fn p_ctl_6_list_walks_every_page_without_duplicates() {
    let fake = FakeDingTalk::start();
    let seeded = fake.seed_subscriptions(205, "cid-test", "open");
    let c = control(&fake, &fake.user_token());
    let all = c.list().await.unwrap();
    assert_eq!(all.len(), 205);
    let ids: HashSet<&str> = all.iter().map(|s| s.sub_id.as_str()).collect();
    assert_eq!(ids.len(), 205);
    assert!(seeded.iter().all(|s| ids.contains(s.as_str())));
    let pages: Vec<String> = fake
        .lists()
        .iter()
        .map(|r| r.param("pageNo").unwrap_or("").to_owned())
        .collect();
    assert_eq!(pages, ["1", "2", "3"]);
    let first = &fake.lists()[0];
    assert_eq!(
        (
            first.param("pageSize"),
            first.param("clientId"),
            first.param("sourceId")
        ),
        (Some("100"), Some("cid-test"), Some("open"))
    );

    // A server page size of 50: five pages, stops at total.
    let fake = FakeDingTalk::start();
    fake.seed_subscriptions(205, "cid-test", "open");
    fake.set_list_page_size(50);
    let c = control(&fake, &fake.user_token());
    assert_eq!(c.list().await.unwrap().len(), 205);
    assert_eq!(fake.lists().len(), 5);

    // A page that repeats the previous one is an error, not a loop.
    let fake = FakeDingTalk::start();
    let page = |n: usize| {
        let items: Vec<Value> = (0..n).map(|i| json!({"subId": format!("s{i}")})).collect();
        json!({"success": true, "result": {"total": 300, "pageSize": 100, "items": items}})
            .to_string()
    };
    fake.fail_next_control(ControlOp::List, 2, ControlFault::new(200, page(100)));
    let e = control(&fake, &fake.user_token()).list().await.unwrap_err();
    assert_eq!(e.code, "LIST_STALLED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_specs_share_one_upstream_subscription() {
    let fake = FakeDingTalk::start();
    let c = control(&fake, &fake.user_token());
    let keys = ["user_im_message_receive_at".to_owned()];
    let spec = at_spec();
    let ttl = Duration::from_secs(60);
    let (a, b) = tokio::join!(c.acquire(&keys, &spec, ttl), c.acquire(&keys, &spec, ttl));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    assert_eq!(
        fake.creates().len(),
        1,
        "one create for two concurrent acquires"
    );
    let other = UpstreamSpec {
        query: vec![],
        ..spec.clone()
    };
    let o = c.acquire(&keys, &other, ttl).await.unwrap();
    assert_ne!(o, a, "a different filter is another subscription");
    assert_eq!(c.acquire(&keys, &spec, ttl).await.unwrap(), a);
    assert_eq!(fake.creates().len(), 2);

    c.release(&a);
    c.release(&a);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(fake.cancels().is_empty(), "still held once");
    c.release(&a);
    eventually("the cancel", || fake.cancels().len() == 1).await;
    assert_eq!(fake.cancels()[0].body["subId"], a.as_str());
    // Acquired again: a new create (the old one is gone).
    let again = c.acquire(&keys, &spec, ttl).await.unwrap();
    assert_ne!(again, a);
    assert_eq!(fake.creates().len(), 3);
    c.release("not-held");
    // The bus stopping cancels what is still held.
    c.cancel_all(Duration::from_secs(5)).await;
    let cancelled: Vec<String> = fake
        .cancels()
        .iter()
        .map(|r| r.body["subId"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(cancelled.len(), 3, "{cancelled:?}");
    assert!(cancelled.contains(&o) && cancelled.contains(&again));
    assert!(fake.with_state(|s| s.personal.active().is_empty()));
}

#[tokio::test]
async fn acquire_refusals_and_short_retries() {
    let fake = FakeDingTalk::start();
    let keys = ["user_im_message_receive_at".to_owned()];
    let ttl = Duration::from_secs(60);
    let token = "CANARY-token-8e1f";
    fake.set_user_token(token);
    let c = control(&fake, token);

    // Two quick 503s are retried inside the acquire.
    fake.fail_next_control(ControlOp::Create, 2, ControlFault::new(503, ""));
    c.acquire(&keys, &at_spec(), ttl).await.unwrap();
    assert_eq!(fake.creates().len(), 3);

    // P-CTL-3: a long Retry-After is not waited for.
    fake.fail_next_control(
        ControlOp::Create,
        1,
        ControlFault::new(429, "").header("Retry-After", "45"),
    );
    let spec2 = UpstreamSpec {
        query: vec!["x".into()],
        ..at_spec()
    };
    let r = c.acquire(&keys, &spec2, ttl).await.unwrap_err();
    assert_eq!(r.code, ErrorCode::Upstream);
    assert!(
        r.message.starts_with("upstream subscription failed: ")
            && r.message.contains("retry after 45s"),
        "{}",
        r.message
    );
    assert_eq!(fake.creates().len(), 4);

    // An auth failure echoing the token: exit 3, redacted.
    fake.fail_next_control(
        ControlOp::Create,
        1,
        ControlFault::new(
            401,
            format!(r#"{{"error":{{"code":"UNAUTHORIZED","message":"token {token} expired"}}}}"#),
        ),
    );
    let r = c.acquire(&keys, &spec2, ttl).await.unwrap_err();
    assert_eq!(r.code, ErrorCode::PermissionDenied);
    assert!(
        !r.message.contains(token) && r.message.contains("<redacted>"),
        "{}",
        r.message
    );

    // A bad spec never reaches the server.
    let bad = UpstreamSpec {
        rule_type: "group".into(),
        ..UpstreamSpec::default()
    };
    assert_eq!(
        c.acquire(&keys, &bad, ttl).await.unwrap_err().code,
        ErrorCode::BadRequest
    );
    assert_eq!(fake.creates().len(), 5);
}

/// The identity of the key: each of the configured corp and user id wins
/// over the token's (a JSON saved login here); the other comes from it.
#[test]
fn the_configured_identity_wins_field_by_field() {
    let tls = net::tls_config().unwrap();
    let http = net::http_client(&tls, &stream::user_agent(), Duration::from_secs(10)).unwrap();
    let login = r#"{"access_token":"T","corp_id":"file-corp","user_id":"file-user"}"#;
    let creds = Arc::new(Credentials::new(TokenSource::Fixed(Secret::new(login))));
    let with = |corp: &str, user: &str| {
        Control::new(
            http.clone(),
            creds.clone(),
            ControlConfig {
                base: "http://127.0.0.1:9/dws".into(),
                client_id: "cid".into(),
                source_id: "open".into(),
                corp_id: corp.into(),
                user_id: user.into(),
                ..ControlConfig::default()
            },
        )
        .identity()
    };
    let id = with("", "");
    assert_eq!(
        (id.corp_id.as_str(), id.user_id.as_str()),
        ("file-corp", "file-user")
    );
    assert_eq!(
        id.local_subject, "",
        "corp and user known: no local subject"
    );
    let id = with("cfg-corp", "");
    assert_eq!(
        (id.corp_id.as_str(), id.user_id.as_str()),
        ("cfg-corp", "file-user")
    );
    let id = with("cfg-corp", "cfg-user");
    assert_eq!(
        (id.corp_id.as_str(), id.user_id.as_str()),
        ("cfg-corp", "cfg-user")
    );
    assert_eq!(creds.token().unwrap().expose(), "T");
}
