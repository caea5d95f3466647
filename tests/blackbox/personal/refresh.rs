//! The refresh as the reference makes it (`internal/auth/oauth_helpers.go`
//! `refreshViaMCP`, `internal/auth/oauth_provider.go` `lockedRefresh`,
//! `internal/auth/filelock.go`): the MCP refresh body never carries the
//! client secret, and a refresh runs under the file lock `.data.lock`
//! next to the token, re-reading the token once it holds the lock — so two
//! processes sharing a rotating refresh token do not spend it twice, and a
//! refresh refused with `invalidParameter.authCode.notFound` re-reads the
//! token files before giving up.

use std::path::Path;

use dws_tests::fake_dingtalk::personal::FakeIdentity;
use serde_json::json;

use super::*;

const AT: &str = "user_im_message_receive_at";

/// A bus whose access and refresh tokens are the files `token` and
/// `refresh` in `dir` (absolute paths: several buses may share them).
fn env_sharing(fake: &FakeDingTalk, dir: &Path, extra: &str) -> TestEnv {
    dingtalk_env(
        &fake.personal_profile(
            &dir.join("token").display().to_string(),
            &format!(
                "client_id = \"{CLIENT_ID}\"\nrefresh_token_file = \"{}\"\n{extra}",
                dir.join("refresh").display()
            ),
        ),
        &[] as &[(&str, &str)],
    )
}

/// `refreshViaMCP` sends `clientId`, `refreshToken` and `grantType` only,
/// even when the app's secret is configured (the fake refuses a body with
/// `clientSecret`, 400).
#[test]
fn the_mcp_refresh_never_sends_the_client_secret() {
    let fake = FakeDingTalk::start();
    fake.set_identity(FakeIdentity::RefreshToken);
    let env = env_cfg(
        &fake,
        "refresh_token_file = \"refresh\"\nclient_secret_file = \"app.secret\"\n",
        &[],
    );
    write_private(&env, "refresh", &fake.refresh_token());
    write_private(&env, "app.secret", &fake.client_secret());
    let old_refresh = fake.refresh_token();
    // The token the bus holds is already dead: the first ticket is a 401.
    fake.revoke_user_token();
    let c = consumer(&env, &[AT]);
    fake.wait_connected(T);
    let r = &fake.refreshes()[0];
    assert_eq!(r.status, 200, "{}", fake.summary());
    assert_eq!(
        r.body,
        json!({"clientId": CLIENT_ID, "refreshToken": old_refresh, "grantType": "refresh_token"})
    );
    finish(c, 0);
}

/// Two buses share one rotating refresh token (`lockedRefresh`'s case: two
/// processes). Both find the access token rejected at once; the first to
/// take `.data.lock` refreshes, the other waits for the lock, re-reads the
/// token file and uses the new token: one refresh call, both sources stay
/// connected. Without the lock the second call spends a refresh token the
/// first one rotated (`invalidParameter.authCode.notFound`).
#[test]
fn two_buses_sharing_a_rotating_refresh_token_refresh_once() {
    let fake = FakeDingTalk::start();
    fake.set_identity(FakeIdentity::RefreshToken);
    let shared = tempfile::tempdir().expect("tempdir");
    for (name, body) in [
        ("token", fake.user_token()),
        ("refresh", fake.refresh_token()),
    ] {
        let p = shared.path().join(name);
        std::fs::write(&p, format!("{body}\n")).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let a_env = env_sharing(&fake, shared.path(), "");
    let b_env = env_sharing(&fake, shared.path(), "");
    fake.hold_tickets(true);
    let a = consumer(&a_env, &[AT]);
    let b = consumer(&b_env, &[AT]);
    fake.wait_until("both buses' ticket requests, held", T, |s| {
        s.personal.tickets_waiting == 2
    });
    // The token dies while both requests are in flight: both get a 401.
    fake.revoke_user_token();
    fake.hold_refreshes(true);
    fake.hold_tickets(false);
    fake.wait_until("a refresh call, held", T, |s| {
        s.personal.refreshes_waiting >= 1
    });
    // Give the other bus the time to send its own (it must not).
    std::thread::sleep(Duration::from_millis(1500));
    fake.hold_refreshes(false);
    fake.wait_until("both buses connected", T, |s| s.live_conns() == 2);
    let refreshes = fake.refreshes();
    let statuses: Vec<(u16, Option<String>)> = refreshes
        .iter()
        .map(|r| (r.status, r.issued.clone()))
        .collect();
    assert_eq!(refreshes.len(), 1, "one refresh call: {statuses:?}");
    for env in [&a_env, &b_env] {
        let st = env.status();
        assert_eq!(st["source"]["state"], "connected", "{st:#}");
    }
    assert_eq!(
        std::fs::read_to_string(shared.path().join("refresh"))
            .expect("refresh")
            .trim(),
        fake.refresh_token()
    );
    finish(a, 0);
    finish(b, 0);
}

/// Another process rotated the refresh token between this bus's read and
/// its call (a process that does not take the lock): the refresh is
/// refused with `invalidParameter.authCode.notFound`; the bus re-reads the
/// token files, finds a newer access token, and goes on.
#[test]
fn a_refresh_refused_as_spent_re_reads_the_token_files_before_giving_up() {
    let fake = FakeDingTalk::start();
    fake.set_identity(FakeIdentity::RefreshToken);
    let shared = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, body: &str| {
        let p = shared.path().join(name);
        std::fs::write(&p, format!("{body}\n")).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    };
    write("token", &fake.user_token());
    write("refresh", &fake.refresh_token());
    let env = env_sharing(&fake, shared.path(), "max_attempts = 1\n");
    fake.hold_tickets(true);
    let c = consumer(&env, &[AT]);
    fake.wait_until("the ticket request, held", T, |s| {
        s.personal.tickets_waiting == 1
    });
    fake.revoke_user_token();
    fake.hold_refreshes(true);
    fake.hold_tickets(false);
    fake.wait_until("the bus's refresh call, held", T, |s| {
        s.personal.refreshes_waiting == 1
    });
    // "The other process": rotates the tokens and writes them back while
    // the bus's call (with the old refresh token) is in flight.
    fake.set_refresh_token("rotated-elsewhere");
    let newer = "token-from-elsewhere";
    fake.set_user_token(newer);
    write("token", newer);
    write("refresh", "rotated-elsewhere");
    fake.hold_refreshes(false);
    fake.wait_connected(T);
    let r = &fake.refreshes()[0];
    assert!(
        r.issued.is_none(),
        "the bus's refresh was refused: {}",
        fake.summary()
    );
    let last = fake.ticket_requests().last().cloned().expect("a ticket");
    assert_eq!(
        (last.status, last.header("x-user-access-token")),
        (200, Some(newer))
    );
    let st = env.status();
    assert_eq!(st["source"]["state"], "connected", "{st:#}");
    finish(c, 0);
}

/// An empty token file is fatal, like the reference's
/// `resolveSourceAccessToken` (an empty token from the provider): the
/// source is lost at the next ticket, not retried forever.
#[test]
fn an_empty_token_file_ends_the_source() {
    let fake = FakeDingTalk::start();
    let env = env(&fake);
    let c = consumer(&env, &[AT]);
    fake.wait_connected(T);
    write_token(&env, "");
    fake.drop_tcp();
    let out = c.wait_exit(T);
    let lost = out.assert_source_lost();
    assert!(lost.contains("empty"), "{lost}\n{out}");
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit after losing its source");
}

/// The reference knows the token's expiry from its login
/// (`TokenData.IsAccessTokenValid`, 5 minutes ahead; 7200 s by default);
/// the bus knows when the token file was written. A token file written 3
/// hours ago is refreshed before its first use, not after a 401.
#[test]
fn a_token_file_older_than_the_default_lifetime_is_refreshed_before_use() {
    let fake = FakeDingTalk::start();
    fake.set_identity(FakeIdentity::RefreshToken);
    let env = env_cfg(&fake, "refresh_token_file = \"refresh\"\n", &[]);
    write_private(&env, "refresh", &fake.refresh_token());
    let old = std::fs::File::options()
        .write(true)
        .open(env.cfg_dir().join("token"))
        .expect("token file");
    old.set_modified(std::time::SystemTime::now() - Duration::from_secs(3 * 3600))
        .expect("set mtime");
    drop(old);
    let c = consumer(&env, &[AT]);
    fake.wait_connected(T);
    assert_eq!(fake.refreshes().len(), 1, "{}", fake.summary());
    let first = fake.ticket_requests()[0].clone();
    assert_eq!(
        (first.status, first.header("x-user-access-token")),
        (200, Some(fake.user_token().as_str())),
        "the first ticket already has the refreshed token"
    );
    finish(c, 0);
}
