//! The user's credentials: the access token in use, its refresh, and
//! everything to redact.
//!
//! - The token is read from its source every time it is used (a token file
//!   rewritten by another tool is picked up).
//! - A rejected token (HTTP 401) goes through [`Credentials::refresh_rejected`]
//!   (the reference's compare-and-refresh, `internal/auth/force_refresh.go`
//!   `ForceRefreshRejectedToken`): if the source already holds another
//!   token, that one is used; otherwise, with a refresh token, the bus
//!   refreshes ([`super::oauth`]) and writes the new access token — and a
//!   rotated refresh token — back to their files atomically (a 0600 temp
//!   file, fsync, rename, fsync of the directory), or keeps them in memory
//!   when they came from the environment or the config file. One refresh at
//!   a time; callers rejected with the same token share it. Across
//!   processes too, like the reference's `lockedRefresh`: the refresh runs
//!   under the file lock of [`refresh_lock`] and first re-reads the token
//!   (another process may have refreshed it meanwhile); a refresh token
//!   refused as spent (`invalidParameter.authCode.notFound`) makes it
//!   re-read the token files — a newer access token is used, a newer
//!   refresh token tried once — before the failure is final. A failed
//!   refresh of a rejected token is not retried for that token within 3 s
//!   (the reference's `rejectedTokenRefreshFailureCooldown`); callers get
//!   the same failure.
//! - Who the user is ([`Credentials::identity`]): the corp and user id a
//!   JSON token file carries ([`token_file`], the reference's saved login),
//!   else those the last refresh answer told (`parseMCPTokenResponse`); a
//!   JSON token file written back gains them.
//! - Once a refresh told the token's lifetime, [`Credentials::usable_token`]
//!   refreshes ahead of expiry (5 minutes before it, like the reference's
//!   `TokenData.IsAccessTokenValid`, or half the lifetime when that is
//!   shorter). Before that, a token file written more than the default
//!   lifetime (7200 s) less 5 minutes ago is refreshed before use.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant, SystemTime},
};

use super::{
    config::{RefreshConfig, TokenSource, UserAuth},
    oauth, refresh_lock,
    token_file::{self, Field, UserIdentity},
};
use crate::{
    section::{ConfigError, Secret},
    source::stream::{net, net::Url, Scrub},
    urls::UrlError,
};

/// How long before expiry a known-lifetime token is refreshed.
const REFRESH_AHEAD: Duration = Duration::from_secs(300);
/// After a failed early refresh, the next one is tried this much later
/// (the reference's `rejectedTokenRefreshFailureCooldown`).
const RETRY_EARLY_REFRESH: Duration = Duration::from_secs(3);
/// After a failed refresh of a rejected token, the same token gets that
/// failure again for this long without a call (`force_refresh.go:30`).
const REJECTED_REFRESH_COOLDOWN: Duration = Duration::from_secs(3);

/// Why no token can be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the user access token: {0}")]
    Unreadable(ConfigError),
    #[error("the user access token is empty")]
    Empty,
}

/// Why the credentials cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid oauth_url: {0}")]
pub struct OauthUrlError(#[from] UrlError);

/// What [`Credentials::refresh_rejected`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    /// Another token to retry with; `refreshed` when the bus refreshed it
    /// (else it was found in the token's source).
    Token { token: Secret, refreshed: bool },
    /// No refresh token is configured and the source still holds the
    /// rejected token.
    NoRefreshToken,
    /// Refreshing failed.
    Failed(oauth::RefreshError),
}

struct Refresher {
    cfg: RefreshConfig,
    url: Url,
    http: reqwest::Client,
}

#[derive(Default)]
struct State {
    scrub: Scrub,
    /// A refreshed access token whose source cannot be written (env, inline).
    access: Option<Secret>,
    /// A rotated refresh token whose source cannot be written.
    refresh: Option<Secret>,
    /// When the access token should be refreshed, if its lifetime is known.
    refresh_at: Option<Instant>,
    /// The last failed refresh of a rejected token: when, which token,
    /// why (the reference's cooldown).
    failed: Option<(Instant, Secret, oauth::RefreshError)>,
    /// The identity the refresh answers told.
    learned: UserIdentity,
}

pub struct Credentials {
    access: TokenSource,
    refresher: Option<Refresher>,
    state: Mutex<State>,
    /// One refresh at a time.
    refreshing: tokio::sync::Mutex<()>,
}

impl Credentials {
    /// Credentials without refresh.
    pub fn new(access: TokenSource) -> Credentials {
        Credentials {
            access,
            refresher: None,
            state: Mutex::new(State::default()),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// Credentials that refresh through `http` when `auth` has a refresh
    /// token.
    pub fn with_refresh(
        auth: &UserAuth,
        http: &reqwest::Client,
    ) -> Result<Credentials, OauthUrlError> {
        let mut c = Credentials::new(auth.access_token.clone());
        if let Some(r) = &auth.refresh {
            let url = net::parse(&r.oauth_url)?;
            if let Some(s) = &r.client_secret {
                c.learn(s);
            }
            c.refresher = Some(Refresher {
                cfg: r.clone(),
                url,
                http: http.clone(),
            });
        }
        Ok(c)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on `secret` is redacted by [`Credentials::scrub`].
    pub fn learn(&self, secret: &Secret) {
        self.state().scrub.add(secret.expose());
    }

    pub fn has_refresh_token(&self) -> bool {
        self.refresher.is_some()
    }

    /// The current access token (re-read from its file, if it has one).
    pub fn token(&self) -> Result<Secret, TokenError> {
        let held = self.state().access.clone();
        let token = match held {
            Some(t) => t,
            None => self
                .access
                .read(Field::Access)
                .map_err(TokenError::Unreadable)?,
        };
        if token.expose().is_empty() {
            return Err(TokenError::Empty);
        }
        self.learn(&token);
        Ok(token)
    }

    /// The current refresh token, if one is configured.
    fn refresh_token(&self) -> Option<Result<Secret, String>> {
        let r = self.refresher.as_ref()?;
        let held = self.state().refresh.clone();
        Some(match held {
            Some(t) => Ok(t),
            None => r
                .cfg
                .refresh_token
                .read(Field::Refresh)
                .map_err(|e| format!("cannot read the refresh token: {e}"))
                .and_then(|t| {
                    if t.expose().is_empty() {
                        Err("the refresh token is empty".into())
                    } else {
                        self.learn(&t);
                        Ok(t)
                    }
                }),
        })
    }

    /// The user's corp and user id as far as known: a JSON token file's
    /// (the access token's, then the refresh token's), else the last
    /// refresh answer's; each field on its own.
    pub fn identity(&self) -> UserIdentity {
        let mut id = self.access.identity();
        if let Some(r) = &self.refresher {
            id = id.or(&r.cfg.refresh_token.identity());
        }
        id.or(&self.state().learned)
    }

    /// The reference's local subject of the identity: `refresh:` + the
    /// SHA-256 (hex) of the refresh token when there is one, else
    /// `access:` + that of the access token (`personalTokenSubject`).
    pub fn local_subject(&self) -> String {
        let (kind, token) = match self.refresh_token() {
            Some(Ok(t)) => ("refresh", t),
            _ => match self.token() {
                Ok(t) => ("access", t),
                Err(_) => return String::new(),
            },
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, token.expose().trim().as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("{kind}:{hex}")
    }

    /// The token to use now: refreshed first when its known lifetime is
    /// nearly over (a failed early refresh is logged; the current token is
    /// used).
    pub async fn usable_token(&self) -> Result<Secret, TokenError> {
        if self.refresher.is_some() && self.refresh_due() {
            let _one = self.refreshing.lock().await;
            if let (true, Ok(current)) = (self.refresh_due(), self.token()) {
                tracing::info!("personal: the access token expires soon: refreshing it");
                match self.refresh_locked(&current).await {
                    Ok((_, true)) => {}
                    Ok((_, false)) => {
                        // Another process refreshed it: its lifetime is
                        // unknown here.
                        self.state().refresh_at = None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %self.scrub().clean(&e.message), "personal: refreshing the access token ahead of expiry failed");
                        self.state().refresh_at = Some(Instant::now() + RETRY_EARLY_REFRESH);
                    }
                }
            }
        }
        self.token()
    }

    /// Whether the access token should be refreshed now: its known lifetime
    /// is nearly over, or — before any refresh told it — its file was
    /// written longer ago than the reference's default lifetime (7200 s)
    /// less 5 minutes: the reference knows the expiry from its login, the
    /// bus only when the token was written.
    fn refresh_due(&self) -> bool {
        if let Some(at) = self.state().refresh_at {
            return Instant::now() >= at;
        }
        let Some(written) = self
            .access
            .file()
            .and_then(|f| std::fs::metadata(f).ok())
            .and_then(|m| m.modified().ok())
        else {
            return false;
        };
        let ahead = REFRESH_AHEAD.min(oauth::DEFAULT_LIFETIME / 2);
        SystemTime::now()
            .duration_since(written)
            .is_ok_and(|age| age >= oauth::DEFAULT_LIFETIME - ahead)
    }

    /// `rejected` was refused (HTTP 401): the token to retry with, if any.
    pub async fn refresh_rejected(&self, rejected: &Secret) -> Refreshed {
        let _one = self.refreshing.lock().await;
        match self.token() {
            Ok(current) if current != *rejected => {
                return Refreshed::Token {
                    token: current,
                    refreshed: false,
                }
            }
            _ => {}
        }
        if self.refresher.is_none() {
            return Refreshed::NoRefreshToken;
        }
        // The reference's `rejectedTokenRefreshFailureCooldown`: the same
        // rejected token is not refreshed again within 3 s of a failure.
        let recent =
            self.state().failed.clone().filter(|(at, token, _)| {
                at.elapsed() < REJECTED_REFRESH_COOLDOWN && token == rejected
            });
        if let Some((_, _, e)) = recent {
            return Refreshed::Failed(e);
        }
        match self.refresh_locked(rejected).await {
            Ok((token, refreshed)) => {
                self.state().failed = None;
                Refreshed::Token { token, refreshed }
            }
            Err(e) => {
                let e = oauth::RefreshError {
                    message: self.scrub().clean(&e.message),
                    ..e
                };
                self.state().failed = Some((Instant::now(), rejected.clone(), e.clone()));
                Refreshed::Failed(e)
            }
        }
    }

    /// The reference's `lockedRefresh` (the caller holds `refreshing`):
    /// under the file lock next to the token files, a token other than
    /// `stale` found there is used as is (`false`: another process
    /// refreshed it); otherwise the bus refreshes (`true`). A refresh token
    /// refused as spent is re-read: a newer access token, or one more
    /// refresh with a newer refresh token, before giving up.
    async fn refresh_locked(&self, stale: &Secret) -> Result<(Secret, bool), oauth::RefreshError> {
        let _file = match self.lock_path() {
            Some(p) => Some(
                refresh_lock::acquire(&p)
                    .await
                    .map_err(|e| oauth::RefreshError::transient(e.to_string()))?,
            ),
            None => None,
        };
        let newer = |c: &Credentials| c.token().ok().filter(|t| t != stale);
        if let Some(t) = newer(self) {
            return Ok((t, false));
        }
        let used = self.current_refresh_token()?;
        match self.refresh_now(&used).await {
            Err(e) if e.spent => {
                if let Some(t) = newer(self) {
                    tracing::info!("personal: the refresh token was spent elsewhere; using the access token found on file");
                    return Ok((t, false));
                }
                match self.current_refresh_token() {
                    Ok(again) if again != used => {
                        tracing::info!("personal: the refresh token was rotated elsewhere; refreshing with the new one");
                        self.refresh_now(&again).await.map(|t| (t, true))
                    }
                    _ => Err(e),
                }
            }
            r => r.map(|t| (t, true)),
        }
    }

    /// Where the refresh lock is: next to the refresh token's file, or the
    /// access token's; none when neither is a file.
    fn lock_path(&self) -> Option<PathBuf> {
        let file = self
            .refresher
            .as_ref()
            .and_then(|r| r.cfg.refresh_token.file())
            .or_else(|| self.access.file())?;
        Some(refresh_lock::lock_path(file))
    }

    fn current_refresh_token(&self) -> Result<Secret, oauth::RefreshError> {
        match self.refresh_token() {
            Some(Ok(t)) => Ok(t),
            Some(Err(message)) => Err(oauth::RefreshError::fatal(message)),
            None => Err(oauth::RefreshError::fatal("no refresh token")),
        }
    }

    /// Refreshes now with `refresh_token` (the caller holds the locks) and
    /// stores the result.
    async fn refresh_now(&self, refresh_token: &Secret) -> Result<Secret, oauth::RefreshError> {
        let Some(r) = &self.refresher else {
            return Err(oauth::RefreshError::fatal("no refresh token"));
        };
        let grant = oauth::refresh(&r.http, &r.url, &r.cfg.client_id, refresh_token).await?;
        self.learn(&grant.access_token);
        if let Some(t) = &grant.refresh_token {
            self.learn(t);
        }
        {
            let mut st = self.state();
            st.learned = grant.identity.clone().or(&st.learned);
        }
        self.store(&grant);
        tracing::info!(
            lifetime = ?grant.lifetime,
            "personal: access token refreshed"
        );
        Ok(grant.access_token)
    }

    /// Writes a grant back where the tokens came from; a token that cannot
    /// be written (no file, or the write failed) is held in memory.
    fn store(&self, grant: &oauth::Grant) {
        let learned = self.state().learned.clone();
        let write = |source: &TokenSource, token: &Secret, field: Field| match source.file() {
            Some(f) => match write_private_atomic(f, &contents(f, token, &learned, field)) {
                Ok(()) => None,
                Err(e) => {
                    let what = match field {
                        Field::Access => "refreshed access token",
                        Field::Refresh => "rotated refresh token",
                    };
                    tracing::error!(file = %f.display(), error = %e, "personal: the {what} could not be written back; it is kept in memory only");
                    Some(token.clone())
                }
            },
            None => Some(token.clone()),
        };
        let held_access = write(&self.access, &grant.access_token, Field::Access);
        let held_refresh = match (&grant.refresh_token, &self.refresher) {
            (Some(new), Some(r)) => write(&r.cfg.refresh_token, new, Field::Refresh),
            _ => None,
        };
        let mut st = self.state();
        if held_access.is_some() {
            st.access = held_access;
        }
        if held_refresh.is_some() {
            st.refresh = held_refresh;
        }
        let ahead = REFRESH_AHEAD.min(grant.lifetime / 2);
        // A lifetime too long for the clock (the server's `expiresIn`) is
        // never refreshed ahead.
        st.refresh_at = Instant::now().checked_add(grant.lifetime - ahead);
    }

    pub fn scrub(&self) -> Scrub {
        self.state().scrub.clone()
    }
}

/// What a token file gets for a new token: the token, or its JSON saved
/// login updated ([`token_file::updated`]).
fn contents(f: &Path, token: &Secret, learned: &UserIdentity, field: Field) -> String {
    let old = std::fs::read_to_string(f).ok();
    token_file::updated(old.as_deref(), field, token, learned)
}

/// Replaces `path` with `contents` (and a newline) atomically: a new 0600
/// file next to it, fsynced, renamed over it, the directory fsynced.
pub fn write_private_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "token".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn private(path: &Path, body: &str) {
        std::fs::write(path, body).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn tokens_are_re_read_and_learned() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("tok");
        private(&f, "TOKEN-one\n");
        let c = Credentials::new(TokenSource::File(f.clone()));
        assert_eq!(c.token().unwrap().expose(), "TOKEN-one");
        std::fs::write(&f, "TOKEN-two").unwrap();
        assert_eq!(c.token().unwrap().expose(), "TOKEN-two");
        assert_eq!(
            c.scrub().clean("a TOKEN-one b TOKEN-two"),
            "a <redacted> b <redacted>"
        );
        std::fs::write(&f, "").unwrap();
        assert!(c.token().is_err());
    }

    #[tokio::test]
    async fn a_rejected_token_is_replaced_by_a_newer_one_without_refresh() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("tok");
        private(&f, "old");
        let c = Credentials::new(TokenSource::File(f.clone()));
        let old = c.token().unwrap();
        assert_eq!(c.refresh_rejected(&old).await, Refreshed::NoRefreshToken);
        private(&f, "new");
        assert_eq!(
            c.refresh_rejected(&old).await,
            Refreshed::Token {
                token: Secret::new("new"),
                refreshed: false
            }
        );
    }

    #[test]
    fn local_subject_is_the_reference_hash() {
        let c = Credentials::new(TokenSource::Fixed(Secret::new("abc")));
        // sha256("abc")
        assert_eq!(
            c.local_subject(),
            "access:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn atomic_private_write() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("tok");
        private(&f, "old");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        write_private_atomic(&f, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new\n");
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temp file left behind");
    }

    /// The reference's cooldown: a rejected token whose refresh failed is
    /// not refreshed again for 3 s; callers get that failure.
    #[tokio::test]
    async fn a_failed_refresh_of_a_rejected_token_cools_down() {
        use dws_tests::fake_dingtalk::FakeDingTalk;

        use crate::source::{personal::config::RefreshConfig, stream};

        let fake = FakeDingTalk::start();
        let tmp = tempfile::tempdir().unwrap();
        let (access, refresh) = (tmp.path().join("token"), tmp.path().join("refresh"));
        private(&access, &fake.user_token());
        private(&refresh, &fake.refresh_token());
        let auth = UserAuth {
            access_token: TokenSource::File(access),
            refresh: Some(RefreshConfig {
                refresh_token: TokenSource::File(refresh),
                oauth_url: format!("{}/oauth2/refreshToken", fake.base_url()),
                client_id: "cid".into(),
                client_secret: None,
            }),
        };
        let tls = net::tls_config().unwrap();
        let http = net::http_client(&tls, &stream::user_agent(), Duration::from_secs(10)).unwrap();
        let c = Credentials::with_refresh(&auth, &http).unwrap();
        let rejected = c.token().unwrap();
        fake.fail_next_refreshes(2, 503, "{}");
        for _ in 0..2 {
            let r = c.refresh_rejected(&rejected).await;
            assert!(matches!(&r, Refreshed::Failed(e) if e.transient), "{r:?}");
        }
        assert_eq!(
            fake.refreshes().len(),
            1,
            "the second caller got the cooled-down failure"
        );
        tokio::time::sleep(REJECTED_REFRESH_COOLDOWN + Duration::from_millis(100)).await;
        let r = c.refresh_rejected(&rejected).await;
        assert!(matches!(r, Refreshed::Failed(_)), "{r:?}");
        assert_eq!(fake.refreshes().len(), 2, "tried again after the cooldown");
        tokio::time::sleep(REJECTED_REFRESH_COOLDOWN + Duration::from_millis(100)).await;
        let r = c.refresh_rejected(&rejected).await;
        assert!(
            matches!(
                r,
                Refreshed::Token {
                    refreshed: true,
                    ..
                }
            ),
            "{r:?}"
        );
    }
}
