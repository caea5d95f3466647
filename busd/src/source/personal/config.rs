//! The personal source's settings, and the user credentials that the app
//! stream's portal ticket mode shares ([`user_auth`]), read from the
//! profile section (env overrides win over the file).
//!
//! | key | env | meaning |
//! |---|---|---|
//! | `client_id` (required) | `DWS_DINGTALK_CLIENT_ID` | the OAuth client id of the app that issued the user token |
//! | `access_token_file` / `access_token` | `DWS_USER_ACCESS_TOKEN` | the user access token (file 0600; inline only in a 0600 config); a file may hold the reference's saved-login JSON ([`super::token_file`]) |
//! | `refresh_token_file` / `refresh_token` | `DWS_USER_REFRESH_TOKEN` | optional: lets the bus refresh the access token (may be the same JSON file) |
//! | `oauth_url` | — | the refresh endpoint (default `<mcp_base>/oauth2/refreshToken`) |
//! | `mcp_base` | `DWS_MCP_URL` | default `https://mcp.dingtalk.com` |
//! | `ticket_url` | `DWS_STREAM_TICKET_URL` | default `<mcp_base>/stream/connections/ticket` |
//! | `control_base` | — | default `<mcp_base>/dws` |
//! | `source_id` | `DWS_STREAM_SOURCE_ID` | default `open` |
//! | `stream_ticket_mode` | `DWS_STREAM_TICKET_MODE` | `normal` (default) or `custom` (sends the app's client id and secret for the ticket) |
//! | `client_secret_file` / `client_secret` | `DWS_DINGTALK_CLIENT_SECRET` | required by `custom`; when set, also sent with token refreshes |
//! | `corp_id`, `user_id` | — | the user's identity: `X-DWS-Corp-Id`, and the idempotency key's identity (each, when unset: from the JSON token file, else from the last refresh answer) |
//! | `subscription_name` | — | `ext.name` of the upstream subscriptions the bus creates |
//! | `max_attempts` | — | consecutive failures before the source is lost (0 = never) |
//! | `keepalive` | — | WebSocket pings (default none, like the reference CLI) |

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::token_file::{self, Field, UserIdentity};
use crate::section::{read_secret_file, ConfigError, Secret, SectionReader};

/// Where a user token comes from. A file is read again for every use (a
/// tool that rewrites it needs no restart) and a refreshed token is written
/// back to it; a fixed token (env, inline) is replaced in memory only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// Inline in the (0600) config file, or from the environment.
    Fixed(Secret),
    /// A 0600 file.
    File(PathBuf),
}

impl TokenSource {
    /// The source's text: a bare token or a JSON saved login
    /// ([`token_file`]).
    fn text(&self) -> Result<Secret, ConfigError> {
        match self {
            TokenSource::Fixed(s) => Ok(s.clone()),
            TokenSource::File(f) => read_secret_file(f, "token file"),
        }
    }

    /// The current token: the text, or its `field` when it is JSON.
    pub fn read(&self, field: Field) -> Result<Secret, ConfigError> {
        let text = self.text()?;
        token_file::token(text.expose(), field).map_err(|e| match self {
            TokenSource::File(f) => ConfigError::Invalid(format!("{}: {e}", f.display())),
            TokenSource::Fixed(_) => ConfigError::Invalid(e.to_string()),
        })
    }

    /// The user's identity the source carries (a JSON saved login's
    /// `corp_id`/`user_id`), empty when none or unreadable.
    pub fn identity(&self) -> UserIdentity {
        self.text()
            .map(|t| token_file::identity(t.expose()))
            .unwrap_or_default()
    }

    pub fn file(&self) -> Option<&Path> {
        match self {
            TokenSource::File(f) => Some(f),
            TokenSource::Fixed(_) => None,
        }
    }
}

/// How a ticket is requested from the ticket endpoint (the reference's
/// `--stream-ticket-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketMode {
    /// The portal's own credentials.
    Normal,
    /// The app's `clientId`/`clientSecret` go in the ticket body.
    Custom,
}

impl TicketMode {
    pub fn parse(s: &str) -> Option<TicketMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "normal" => Some(TicketMode::Normal),
            "custom" => Some(TicketMode::Custom),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TicketMode::Normal => "normal",
            TicketMode::Custom => "custom",
        }
    }
}

/// How the access token is refreshed.
#[derive(Debug, Clone)]
pub struct RefreshConfig {
    pub refresh_token: TokenSource,
    /// `POST` here: `{"clientId","refreshToken","grantType":"refresh_token"}`
    /// (never the client secret).
    pub oauth_url: String,
    pub client_id: String,
    /// Only redacted: the MCP refresh does not take it.
    pub client_secret: Option<Secret>,
}

/// A user's credentials for a ticket endpoint and the control plane.
#[derive(Debug, Clone)]
pub struct UserAuth {
    pub access_token: TokenSource,
    /// Without it a rejected token is only re-read.
    pub refresh: Option<RefreshConfig>,
}

#[derive(Debug, Clone)]
pub struct PersonalConfig {
    /// `POST` here for `{endpoint, ticket}`.
    pub ticket_url: String,
    /// Control plane base: `/subscription/user`, `/event/sublist`,
    /// `/subscription/cancel`.
    pub control_base: String,
    pub auth: UserAuth,
    /// Sent as `X-DWS-Client-Id` and `clientId`; never empty.
    pub client_id: String,
    /// The app secret, for the `custom` ticket mode (and token refreshes).
    pub client_secret: Option<Secret>,
    /// Sent as `X-DWS-Source-Id` and `sourceId` (default `open`).
    pub source_id: String,
    pub ticket_mode: TicketMode,
    /// The user's corp and user id, when known.
    pub corp_id: String,
    pub user_id: String,
    /// `ext.name` of created upstream subscriptions ("" = none).
    pub subscription_name: String,
    /// Consecutive failed attempts before the source is `lost`; 0 = retry forever.
    pub max_attempts: u32,
    /// Interval of client WebSocket pings (default none).
    pub keepalive: Duration,
}

/// `mcp_base` (env `DWS_MCP_URL`), without a trailing `/`.
pub(crate) fn mcp_base(r: &mut SectionReader<'_>) -> String {
    let base = r
        .env
        .mcp_base
        .clone()
        .or(r.section.mcp_base.take())
        .unwrap_or_else(|| "https://mcp.dingtalk.com".into());
    base.trim_end_matches('/').to_owned()
}

/// `ticket_url` (env `DWS_STREAM_TICKET_URL`), default from `base`.
pub(crate) fn ticket_url(r: &mut SectionReader<'_>, base: &str) -> Result<String, ConfigError> {
    let url = r
        .env
        .stream_ticket_url
        .clone()
        .or(r.section.ticket_url.take())
        .unwrap_or_else(|| format!("{base}/stream/connections/ticket"));
    r.check_url(&url, "ticket_url")?;
    Ok(url.trim_end_matches('/').to_owned())
}

/// `source_id` (env `DWS_STREAM_SOURCE_ID`), default `open`.
pub(crate) fn source_id(r: &mut SectionReader<'_>) -> String {
    source_id_or(r, "open")
}

/// The portal ticket mode's source id: as [`source_id`], but defaulting
/// to `pre_open_source` when the MCP base is a `pre-mcp` one (the
/// reference's `defaultEventStreamSourceID`, event_command.go:542-551).
pub(crate) fn portal_source_id(r: &mut SectionReader<'_>, base: &str) -> String {
    let default = if base.to_ascii_lowercase().contains("pre-mcp") {
        "pre_open_source"
    } else {
        "open"
    };
    source_id_or(r, default)
}

fn source_id_or(r: &mut SectionReader<'_>, default: &str) -> String {
    r.env
        .stream_source_id
        .clone()
        .or(r.section.source_id.take())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| default.into())
}

/// `stream_ticket_mode` (env `DWS_STREAM_TICKET_MODE`); `None` when unset.
pub(crate) fn ticket_mode(r: &mut SectionReader<'_>) -> Result<Option<TicketMode>, ConfigError> {
    let (v, field) = match (
        &r.env.stream_ticket_mode,
        r.section.stream_ticket_mode.take(),
    ) {
        (Some(v), _) => (v.clone(), "DWS_STREAM_TICKET_MODE".to_owned()),
        (None, Some(v)) => (v, r.in_file("stream_ticket_mode")),
        (None, None) => return Ok(None),
    };
    TicketMode::parse(&v)
        .map(Some)
        .ok_or_else(|| ConfigError::Invalid(format!("{field} = {v:?}: use normal or custom")))
}

/// The app's client secret (env `DWS_DINGTALK_CLIENT_SECRET`,
/// `client_secret` in a 0600 config, or `client_secret_file`), if any.
pub(crate) fn client_secret(r: &mut SectionReader<'_>) -> Result<Option<Secret>, ConfigError> {
    let inline = r.section.client_secret.take();
    let file = r.section.client_secret_file.take();
    let env = r.env.client_secret.clone();
    r.secret(env.as_ref(), inline, file, "secret file")
}

/// A token: env, inline (0600 config) or file (0600, read now to check it).
fn token(
    r: &SectionReader<'_>,
    field: Field,
    env: Option<&String>,
    inline: Option<String>,
    file: Option<PathBuf>,
) -> Result<Option<TokenSource>, ConfigError> {
    if let Some(t) = env {
        return Ok(Some(TokenSource::Fixed(Secret::new(t.clone()))));
    }
    if let Some(t) = inline {
        r.check_inline_secret()?;
        return Ok(Some(TokenSource::Fixed(Secret::new(t))));
    }
    let Some(f) = file else { return Ok(None) };
    let source = TokenSource::File(r.path_of(f));
    source.read(field)?;
    Ok(Some(source))
}

/// The user credentials: the access token (required), and the refresh
/// token with its OAuth endpoint (optional).
pub(crate) fn user_auth(
    r: &mut SectionReader<'_>,
    base: &str,
    client_id: &str,
    client_secret: Option<&Secret>,
    who: &str,
) -> Result<UserAuth, ConfigError> {
    let (inline, file) = (
        r.section.access_token.take(),
        r.section.access_token_file.take(),
    );
    let access_token = token(r, Field::Access, r.env.access_token.as_ref(), inline, file)?
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "{who} needs a user access token: {}, {} or DWS_USER_ACCESS_TOKEN",
                r.in_file("access_token_file"),
                r.in_file("access_token")
            ))
        })?;
    let (inline, file) = (
        r.section.refresh_token.take(),
        r.section.refresh_token_file.take(),
    );
    let refresh_token = token(
        r,
        Field::Refresh,
        r.env.refresh_token.as_ref(),
        inline,
        file,
    )?;
    let oauth_url = r.section.oauth_url.take();
    let refresh = match (refresh_token, oauth_url) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(ConfigError::Invalid(format!(
                "{} is set but there is no refresh token: set {} or DWS_USER_REFRESH_TOKEN",
                r.in_file("oauth_url"),
                r.in_file("refresh_token_file")
            )))
        }
        (Some(refresh_token), url) => {
            let oauth_url = url.unwrap_or_else(|| format!("{base}/oauth2/refreshToken"));
            r.check_url(&oauth_url, "oauth_url")?;
            Some(RefreshConfig {
                refresh_token,
                oauth_url,
                client_id: client_id.to_owned(),
                client_secret: client_secret.cloned(),
            })
        }
    };
    Ok(UserAuth {
        access_token,
        refresh,
    })
}

/// The personal source's settings from its profile section.
pub fn settings(r: &mut SectionReader<'_>) -> Result<PersonalConfig, ConfigError> {
    let base = mcp_base(r);
    let ticket_url = ticket_url(r, &base)?;
    let control_base = r
        .section
        .control_base
        .take()
        .unwrap_or_else(|| format!("{base}/dws"));
    r.check_url(&control_base, "control_base")?;
    // The reference refuses to start without it: it is the app that issued
    // the user token, and the service answers CLIENT_ID_REQUIRED.
    let client_id = r
        .env
        .client_id
        .clone()
        .or(r.section.client_id.take())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "the personal source needs {} or DWS_DINGTALK_CLIENT_ID: the OAuth client id of the app that issued the user token",
                r.in_file("client_id")
            ))
        })?;
    let client_secret = client_secret(r)?;
    let ticket_mode = ticket_mode(r)?.unwrap_or(TicketMode::Normal);
    if ticket_mode == TicketMode::Custom && client_secret.is_none() {
        return Err(ConfigError::Invalid(format!(
            "stream_ticket_mode = \"custom\" needs the app's client secret: {}, {} or DWS_DINGTALK_CLIENT_SECRET",
            r.in_file("client_secret_file"),
            r.in_file("client_secret")
        )));
    }
    let auth = user_auth(
        r,
        &base,
        &client_id,
        client_secret.as_ref(),
        "the personal source",
    )?;
    let text = |v: Option<String>| v.map(|s| s.trim().to_owned()).unwrap_or_default();
    Ok(PersonalConfig {
        ticket_url,
        control_base: control_base.trim_end_matches('/').to_owned(),
        auth,
        client_id,
        client_secret,
        source_id: source_id(r),
        ticket_mode,
        corp_id: text(r.section.corp_id.take()),
        user_id: text(r.section.user_id.take()),
        subscription_name: text(r.section.subscription_name.take()),
        max_attempts: r.section.max_attempts.unwrap_or(0),
        keepalive: r.duration("keepalive", r.section.keepalive.as_deref(), Duration::ZERO)?,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::profile::{load, EnvOverrides, SourceConfig};

    fn write(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    fn personal(dir: &Path, extra: &str) -> Result<PersonalConfig, ConfigError> {
        write(
            dir,
            "config.toml",
            &format!("[profiles.p]\nsource = \"personal\"\naccess_token_file = \"tok\"\n{extra}"),
        );
        match load(dir, "p", &EnvOverrides::default())? {
            SourceConfig::Personal(p) => Ok(p),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn client_id_is_required() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "tok", "T");
        let e = personal(tmp.path(), "").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid(m) if m.contains("client_id") && m.contains("DWS_DINGTALK_CLIENT_ID")),
            "{e:?}"
        );
        let e = personal(tmp.path(), "client_id = \"  \"\n").unwrap_err();
        assert!(matches!(e, ConfigError::Invalid(_)));
        let p = personal(tmp.path(), "client_id = \"cid\"\n").unwrap();
        assert_eq!(p.client_id, "cid");
        // Defaults: normal tickets, no keepalive pings, no refresh.
        assert_eq!(p.ticket_mode, TicketMode::Normal);
        assert_eq!(p.keepalive, Duration::ZERO);
        assert!(p.auth.refresh.is_none());
        assert_eq!((p.corp_id.as_str(), p.subscription_name.as_str()), ("", ""));
    }

    #[test]
    fn refresh_token_and_oauth_url() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "tok", "T");
        write(tmp.path(), "refresh", "R\n");
        let p = personal(
            tmp.path(),
            "client_id = \"cid\"\nrefresh_token_file = \"refresh\"\nmcp_base = \"http://127.0.0.1:9\"\n",
        )
        .unwrap();
        let r = p.auth.refresh.unwrap();
        assert_eq!(r.oauth_url, "http://127.0.0.1:9/oauth2/refreshToken");
        assert_eq!(r.refresh_token.read(Field::Refresh).unwrap().expose(), "R");
        assert_eq!(r.client_id, "cid");
        let e = personal(tmp.path(), "client_id = \"c\"\noauth_url = \"https://x\"\n").unwrap_err();
        assert!(e.to_string().contains("no refresh token"), "{e}");
        std::fs::set_permissions(
            tmp.path().join("refresh"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let e = personal(
            tmp.path(),
            "client_id = \"c\"\nrefresh_token_file = \"refresh\"\n",
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::Permission(_)), "{e:?}");
    }

    #[test]
    fn ticket_modes() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "tok", "T");
        write(tmp.path(), "app.secret", "S");
        let e = personal(
            tmp.path(),
            "client_id = \"c\"\nstream_ticket_mode = \"custom\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("client secret"), "{e}");
        let p = personal(
            tmp.path(),
            "client_id = \"c\"\nstream_ticket_mode = \"Custom\"\nclient_secret_file = \"app.secret\"\n",
        )
        .unwrap();
        assert_eq!(p.ticket_mode, TicketMode::Custom);
        assert_eq!(p.client_secret.unwrap().expose(), "S");
        let e = personal(
            tmp.path(),
            "client_id = \"c\"\nstream_ticket_mode = \"odd\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("use normal or custom"), "{e}");
    }
}
