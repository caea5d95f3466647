//! One `[profiles.NAME]` section of `config.toml` and how the settings
//! loaders read it: [`SectionReader`] (each source and the store take the
//! keys they use), [`EnvOverrides`], [`ConfigError`] (classified for the exit
//! code), [`Secret`] (redacted) and the permission rule for files holding
//! secrets. A leaf: `profile` assembles a profile from these, and the
//! sources' and stores' loaders depend only on this module.

use std::{
    fmt,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use crate::ready::{FailureKind, StartError};

/// A credential. Redacted everywhere it could be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    /// The value, for the one place that sends it upstream.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One `[profiles.NAME]` section. The source loaders take the keys they
/// use out of it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSection {
    pub source: Option<String>,
    // storage (every source)
    pub store: Option<String>,
    pub durability: Option<String>,
    // store = "postgres" (pg::settings)
    pub postgres_url_file: Option<PathBuf>,
    pub postgres_ca_file: Option<PathBuf>,
    pub cluster: Option<String>,
    pub cluster_host: Option<String>,
    pub cluster_lease: Option<String>,
    // exec
    pub command: Option<Vec<String>>,
    pub restart_min: Option<String>,
    pub restart_max: Option<String>,
    // dingtalk and personal
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub client_secret_file: Option<PathBuf>,
    pub max_attempts: Option<u32>,
    pub keepalive: Option<String>,
    pub mcp_base: Option<String>,
    pub ticket_url: Option<String>,
    pub source_id: Option<String>,
    pub stream_ticket_mode: Option<String>,
    pub access_token: Option<String>,
    pub access_token_file: Option<PathBuf>,
    pub refresh_token: Option<String>,
    pub refresh_token_file: Option<PathBuf>,
    pub oauth_url: Option<String>,
    // dingtalk
    pub open_api: Option<String>,
    // personal
    pub control_base: Option<String>,
    pub corp_id: Option<String>,
    pub user_id: Option<String>,
    pub subscription_name: Option<String>,
}

/// A configuration problem, classified for the client's exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A wrong or missing value (exit 2 for the client).
    Invalid(String),
    /// A secret stored where others can read it, or unreadable (exit 3).
    Permission(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Invalid(m) | ConfigError::Permission(m) => f.write_str(m),
        }
    }
}

/// Environment knobs that override the file (read once by [`load`]).
#[derive(Debug, Default, Clone)]
pub struct EnvOverrides {
    pub source: Option<String>,
    pub exec_command: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub open_api: Option<String>,
    pub access_token: Option<String>,
    pub refresh_token: Option<String>,
    pub mcp_base: Option<String>,
    pub stream_ticket_mode: Option<String>,
    pub stream_source_id: Option<String>,
    pub stream_ticket_url: Option<String>,
    pub store: Option<String>,
    pub durability: Option<String>,
    pub postgres_url: Option<String>,
    pub postgres_ca_file: Option<String>,
    pub cluster_host: Option<String>,
    pub cluster_lease: Option<String>,
}

impl EnvOverrides {
    pub fn from_process() -> EnvOverrides {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        EnvOverrides {
            source: get("DWS_EVENT_SOURCE"),
            exec_command: get("DWS_EXEC_COMMAND"),
            client_id: get("DWS_DINGTALK_CLIENT_ID"),
            client_secret: get("DWS_DINGTALK_CLIENT_SECRET"),
            open_api: get("DWS_DINGTALK_OPENAPI_URL"),
            access_token: get("DWS_USER_ACCESS_TOKEN"),
            refresh_token: get("DWS_USER_REFRESH_TOKEN"),
            mcp_base: get("DWS_MCP_URL"),
            stream_ticket_mode: get("DWS_STREAM_TICKET_MODE"),
            stream_source_id: get("DWS_STREAM_SOURCE_ID"),
            stream_ticket_url: get("DWS_STREAM_TICKET_URL"),
            store: get("DWS_EVENT_BUS_STORE"),
            durability: get("DWS_EVENT_BUS_DURABILITY"),
            postgres_url: get("DWS_POSTGRES_URL"),
            postgres_ca_file: get("DWS_POSTGRES_CA_FILE"),
            cluster_host: get("DWS_CLUSTER_HOST"),
            cluster_lease: get("DWS_CLUSTER_LEASE"),
        }
    }
}

pub(crate) fn invalid(m: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(m.into())
}

/// Refuses a file holding a secret unless only its owner can read it.
pub(crate) fn check_private(path: &Path, what: &str) -> Result<(), ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        ConfigError::Permission(format!("cannot read {what} {}: {e}", path.display()))
    })?;
    check_private_meta(&meta, path, what)
}

/// [`check_private`] on metadata already taken (from the open descriptor).
fn check_private_meta(
    meta: &std::fs::Metadata,
    path: &Path,
    what: &str,
) -> Result<(), ConfigError> {
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::Permission(format!(
            "refusing {what} {}: it holds a secret and is accessible by others (mode {mode:04o}); run chmod 600 on it",
            path.display()
        )));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(ConfigError::Permission(format!(
            "refusing {what} {}: owned by uid {}, not by this user",
            path.display(),
            meta.uid()
        )));
    }
    Ok(())
}

fn duration(field: &str, v: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    match v {
        None => Ok(default),
        Some(s) => proto::duration::parse(s)
            .map_err(|e| e.to_string())
            .and_then(|d| proto::limits::check_duration("it", d))
            .map_err(|e| invalid(format!("{field} = {s:?}: {e}"))),
    }
}

/// What a source's settings loader reads: its profile section (it takes
/// the keys it uses), the env overrides, and where the file is (for
/// messages and relative paths).
pub struct SectionReader<'a> {
    pub section: ProfileSection,
    pub env: &'a EnvOverrides,
    config_root: &'a Path,
    path: &'a Path,
    profile: &'a str,
}

impl<'a> SectionReader<'a> {
    /// `profiles.NAME.FIELD in /path/config.toml`, for messages.
    pub fn in_file(&self, field: &str) -> String {
        format!(
            "profiles.{}.{field} in {}",
            self.profile,
            self.path.display()
        )
    }

    /// A reader over `section`, which came from the file at `path`.
    pub(crate) fn new(
        section: ProfileSection,
        env: &'a EnvOverrides,
        config_root: &'a Path,
        path: &'a Path,
        profile: &'a str,
    ) -> SectionReader<'a> {
        SectionReader {
            section,
            env,
            config_root,
            path,
            profile,
        }
    }

    /// The profile's name.
    pub fn profile(&self) -> &str {
        self.profile
    }

    /// A duration value (`30s`, `5m`), or `default` when absent.
    pub fn duration(
        &self,
        field: &str,
        v: Option<&str>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        duration(field, v, default)
    }

    /// A path from the file, relative to the config root.
    pub fn path_of(&self, f: PathBuf) -> PathBuf {
        if f.is_relative() {
            self.config_root.join(f)
        } else {
            f
        }
    }

    /// A secret from the environment (`env`), inline in the file (which
    /// must then be 0600) or in a file it names (0600, read now), in that
    /// order; `None` when none is given.
    pub fn secret(
        &self,
        env: Option<&String>,
        inline: Option<String>,
        file: Option<PathBuf>,
        what: &str,
    ) -> Result<Option<Secret>, ConfigError> {
        if let Some(s) = env {
            return Ok(Some(Secret::new(s.clone())));
        }
        if let Some(s) = inline {
            check_private(self.path, "config file")?;
            return Ok(Some(Secret::new(s)));
        }
        let Some(f) = file else { return Ok(None) };
        let f = self.path_of(f);
        read_secret_file(&f, what).map(Some)
    }

    /// The config file, when a secret is inline in it: must be 0600.
    pub fn check_inline_secret(&self) -> Result<(), ConfigError> {
        check_private(self.path, "config file")
    }

    /// `url` for `field`: see [`check_url`].
    pub fn check_url(&self, url: &str, field: &str) -> Result<(), ConfigError> {
        check_url(url, field)
    }
}

/// Reads a secret file (refused unless a regular file, 0600 and ours),
/// trimmed. Opened without blocking, then checked on the open descriptor:
/// a FIFO there is refused at once instead of hanging the bus.
pub(crate) fn read_secret_file(f: &Path, what: &str) -> Result<Secret, ConfigError> {
    let (bytes, meta) = crate::regular::read(f, crate::regular::Follow::Yes)
        .map_err(|e| ConfigError::Permission(format!("cannot read {what} {}: {e}", f.display())))?;
    check_private_meta(&meta, f, what)?;
    let s = String::from_utf8(bytes)
        .map_err(|_| ConfigError::Invalid(format!("{what} {} is not UTF-8 text", f.display())))?;
    Ok(Secret::new(s.trim().to_owned()))
}

/// `https://` anywhere; `http://` only to a loopback host (tests, the
/// demo) — the loopback rule of [`crate::urls`].
pub fn check_url(url: &str, field: &str) -> Result<(), ConfigError> {
    crate::urls::check_http_url(url)
        .map(|_| ())
        .map_err(|e| invalid(format!("{field} {url:?}: {e}")))
}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> StartError {
        match e {
            ConfigError::Invalid(message) => StartError {
                kind: FailureKind::Usage,
                message,
            },
            ConfigError::Permission(message) => StartError {
                kind: FailureKind::Permission,
                message,
            },
        }
    }
}
