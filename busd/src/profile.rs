//! Profile configuration: which source a profile's bus owns, and its
//! settings. Read from `<config root>/config.toml`; a profile without a
//! section uses the `local` source. Env overrides win over the file.
//!
//! ```toml
//! [profiles.default]
//! source = "exec"
//! command = ["python3", "feed.py"]
//!
//! [profiles.app]
//! source = "dingtalk"
//! client_id = "ding123"
//! client_secret_file = "/home/me/.dws/app.secret"   # or client_secret (file must be 0600) or env
//! ```
//!
//! Secrets ([`Secret`]) come from the config file (refused unless it is 0600),
//! a file it names (same rule), or an env var. They are never printed: their
//! `Debug`/`Display` are redacted, and no error message includes them.

use std::{
    collections::BTreeMap,
    fmt,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use crate::store::{Durability, StoreConfig, StoreKind};

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

/// The source a profile's bus runs, with its settings.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    Local,
    Exec(ExecConfig),
    DingTalk(DingTalkConfig),
    Personal(PersonalConfig),
}

impl SourceConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Local => "local",
            SourceConfig::Exec(_) => "exec",
            SourceConfig::DingTalk(_) => "dingtalk",
            SourceConfig::Personal(_) => "personal",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// argv; run without a shell.
    pub command: Vec<String>,
    /// Backoff between restarts when the command exits: doubles from `min` to `max`.
    pub restart_min: Duration,
    pub restart_max: Duration,
}

#[derive(Debug, Clone)]
pub struct DingTalkConfig {
    pub client_id: String,
    pub client_secret: Secret,
    /// Base URL of the OpenAPI gateway (`https://api.dingtalk.com`); plain
    /// `http://` is accepted only for loopback hosts.
    pub open_api: String,
    /// Consecutive failed attempts before the source is `lost`; 0 = retry forever.
    pub max_attempts: u32,
    /// Interval of client WebSocket pings.
    pub keepalive: Duration,
}

/// Where the personal stream's user access token comes from. Read again on
/// a 401 ("refresh"): a token file rewritten by another tool is picked up.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// `access_token` in the (0600) config file, or `DWS_USER_ACCESS_TOKEN`.
    Fixed(Secret),
    /// `access_token_file` (0600).
    File(PathBuf),
}

impl TokenSource {
    /// The current token.
    pub fn read(&self) -> Result<Secret, ConfigError> {
        match self {
            TokenSource::Fixed(s) => Ok(s.clone()),
            TokenSource::File(f) => {
                check_private(f, "token file")?;
                let s = std::fs::read_to_string(f).map_err(|e| {
                    ConfigError::Permission(format!("cannot read token file {}: {e}", f.display()))
                })?;
                Ok(Secret::new(s.trim().to_owned()))
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct PersonalConfig {
    /// `POST` here for `{endpoint, ticket}` (default `<mcp_base>/stream/connections/ticket`).
    pub ticket_url: String,
    /// Control plane base (default `<mcp_base>/dws`): `/subscription/user`,
    /// `/event/sublist`, `/subscription/cancel`.
    pub control_base: String,
    pub access_token: TokenSource,
    /// Sent as `X-DWS-Client-Id` and `clientId`.
    pub client_id: String,
    /// Sent as `X-DWS-Source-Id` and `sourceId` (default `open`).
    pub source_id: String,
    /// Consecutive failed attempts before the source is `lost`; 0 = retry forever.
    pub max_attempts: u32,
    /// Interval of client WebSocket pings (default 30s; 0 = none).
    pub keepalive: Duration,
}

/// The file's shape. Unknown keys are errors, so a typo is reported instead
/// of silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    profiles: BTreeMap<String, ProfileSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileSection {
    source: Option<String>,
    // storage (every source)
    store: Option<String>,
    durability: Option<String>,
    // exec
    command: Option<Vec<String>>,
    restart_min: Option<String>,
    restart_max: Option<String>,
    // dingtalk
    client_id: Option<String>,
    client_secret: Option<String>,
    client_secret_file: Option<PathBuf>,
    open_api: Option<String>,
    max_attempts: Option<u32>,
    keepalive: Option<String>,
    // personal
    mcp_base: Option<String>,
    ticket_url: Option<String>,
    control_base: Option<String>,
    source_id: Option<String>,
    access_token: Option<String>,
    access_token_file: Option<PathBuf>,
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
    pub mcp_base: Option<String>,
    pub store: Option<String>,
    pub durability: Option<String>,
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
            mcp_base: get("DWS_MCP_URL"),
            store: get("DWS_EVENT_BUS_STORE"),
            durability: get("DWS_EVENT_BUS_DURABILITY"),
        }
    }
}

fn invalid(m: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(m.into())
}

/// Refuses a file holding a secret unless only its owner can read it.
fn check_private(path: &Path, what: &str) -> Result<(), ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        ConfigError::Permission(format!("cannot read {what} {}: {e}", path.display()))
    })?;
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
        Some(s) => humantime::parse_duration(s).map_err(|e| {
            invalid(format!(
                "{field} = {s:?}: {e} (expected a duration like 30s, 5m)"
            ))
        }),
    }
}

/// A profile: its source and where its state is kept.
#[derive(Debug)]
pub struct Profile {
    pub source: SourceConfig,
    pub store: StoreConfig,
}

/// Loads the profile's source configuration from `<root>/config.toml` (if
/// present) and the env overrides.
pub fn load(
    config_root: &Path,
    profile: &str,
    env: &EnvOverrides,
) -> Result<SourceConfig, ConfigError> {
    load_profile(config_root, profile, env).map(|p| p.source)
}

/// `store` and `durability` (env `DWS_EVENT_BUS_STORE`,
/// `DWS_EVENT_BUS_DURABILITY`); defaults: a disk store, fsynced.
fn store_config(
    section: &mut ProfileSection,
    env: &EnvOverrides,
    in_file: &dyn Fn(&str) -> String,
) -> Result<StoreConfig, ConfigError> {
    let kind = match (&env.store, section.store.take()) {
        (Some(v), _) => StoreKind::parse(v)
            .ok_or_else(|| invalid(format!("DWS_EVENT_BUS_STORE={v:?}: use disk or memory")))?,
        (None, Some(v)) => StoreKind::parse(&v)
            .ok_or_else(|| invalid(format!("{} = {v:?}: use disk or memory", in_file("store"))))?,
        (None, None) => StoreKind::Disk,
    };
    let durability = match (&env.durability, section.durability.take()) {
        (Some(v), _) => Durability::parse(v)
            .ok_or_else(|| invalid(format!("DWS_EVENT_BUS_DURABILITY={v:?}: use fsync or none")))?,
        (None, Some(v)) => Durability::parse(&v).ok_or_else(|| {
            invalid(format!(
                "{} = {v:?}: use fsync or none",
                in_file("durability")
            ))
        })?,
        (None, None) => Durability::Fsync,
    };
    Ok(StoreConfig { kind, durability })
}

/// Loads the whole profile: source and store.
pub fn load_profile(
    config_root: &Path,
    profile: &str,
    env: &EnvOverrides,
) -> Result<Profile, ConfigError> {
    let path = config_root.join("config.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(ConfigError::Permission(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    let file: FileConfig = match &text {
        Some(t) => toml::from_str(t).map_err(|e| {
            invalid(format!(
                "{}: {}",
                path.display(),
                e.to_string().replace('\n', " ").trim()
            ))
        })?,
        None => FileConfig::default(),
    };
    let mut section = file
        .profiles
        .into_iter()
        .find(|(k, _)| k == profile)
        .map(|(_, v)| v)
        .unwrap_or_default();
    let in_file = |field: &str| format!("profiles.{profile}.{field} in {}", path.display());
    let store = store_config(&mut section, env, &in_file)?;
    let source = load_source(config_root, profile, env, &path, section, &in_file)?;
    Ok(Profile { source, store })
}

/// The source part of a profile section.
fn load_source(
    config_root: &Path,
    profile: &str,
    env: &EnvOverrides,
    path: &Path,
    mut section: ProfileSection,
    in_file: &dyn Fn(&str) -> String,
) -> Result<SourceConfig, ConfigError> {
    let kind = env
        .source
        .clone()
        .or(section.source.take())
        .unwrap_or_else(|| "local".into());
    match kind.as_str() {
        "local" => Ok(SourceConfig::Local),
        "exec" => {
            let command = match &env.exec_command {
                Some(c) => c.split_whitespace().map(str::to_owned).collect(),
                None => section.command.take().unwrap_or_default(),
            };
            if command.is_empty() || command[0].is_empty() {
                return Err(invalid(format!(
                    "the exec source needs a command: set {} (an argv list) or DWS_EXEC_COMMAND",
                    in_file("command")
                )));
            }
            let restart_min = duration(
                "restart_min",
                section.restart_min.as_deref(),
                Duration::from_secs(1),
            )?;
            let restart_max = duration(
                "restart_max",
                section.restart_max.as_deref(),
                Duration::from_secs(30),
            )?;
            if restart_min.is_zero() || restart_max < restart_min {
                return Err(invalid(
                    "restart_min must be more than 0 and at most restart_max",
                ));
            }
            Ok(SourceConfig::Exec(ExecConfig {
                command,
                restart_min,
                restart_max,
            }))
        }
        "dingtalk" => {
            let client_id = env
                .client_id
                .clone()
                .or(section.client_id.take())
                .ok_or_else(|| {
                    invalid(format!(
                        "the dingtalk source needs {} or DWS_DINGTALK_CLIENT_ID",
                        in_file("client_id")
                    ))
                })?;
            let client_secret = if let Some(s) = &env.client_secret {
                Secret::new(s.clone())
            } else if let Some(s) = section.client_secret.take() {
                check_private(path, "config file")?;
                Secret::new(s)
            } else if let Some(f) = section.client_secret_file.take() {
                let f = if f.is_relative() {
                    config_root.join(f)
                } else {
                    f
                };
                check_private(&f, "secret file")?;
                let s = std::fs::read_to_string(&f).map_err(|e| {
                    ConfigError::Permission(format!("cannot read secret file {}: {e}", f.display()))
                })?;
                Secret::new(s.trim().to_owned())
            } else {
                return Err(invalid(format!(
                    "the dingtalk source needs a client secret: {}, {} or DWS_DINGTALK_CLIENT_SECRET",
                    in_file("client_secret_file"),
                    in_file("client_secret")
                )));
            };
            let open_api = env
                .open_api
                .clone()
                .or(section.open_api.take())
                .unwrap_or_else(|| "https://api.dingtalk.com".into());
            check_url(&open_api, "open_api")?;
            Ok(SourceConfig::DingTalk(DingTalkConfig {
                client_id,
                client_secret,
                open_api: open_api.trim_end_matches('/').to_owned(),
                max_attempts: section.max_attempts.unwrap_or(0),
                keepalive: duration(
                    "keepalive",
                    section.keepalive.as_deref(),
                    Duration::from_secs(30),
                )?,
            }))
        }
        "personal" => {
            let base = env
                .mcp_base
                .clone()
                .or(section.mcp_base.take())
                .unwrap_or_else(|| "https://mcp.dingtalk.com".into());
            let base = base.trim_end_matches('/').to_owned();
            let ticket_url = section
                .ticket_url
                .take()
                .unwrap_or_else(|| format!("{base}/stream/connections/ticket"));
            let control_base = section
                .control_base
                .take()
                .unwrap_or_else(|| format!("{base}/dws"));
            check_url(&ticket_url, "ticket_url")?;
            check_url(&control_base, "control_base")?;
            let access_token = if let Some(t) = &env.access_token {
                TokenSource::Fixed(Secret::new(t.clone()))
            } else if let Some(t) = section.access_token.take() {
                check_private(path, "config file")?;
                TokenSource::Fixed(Secret::new(t))
            } else if let Some(f) = section.access_token_file.take() {
                let f = if f.is_relative() {
                    config_root.join(f)
                } else {
                    f
                };
                let source = TokenSource::File(f);
                source.read()?;
                source
            } else {
                return Err(invalid(format!(
                    "the personal source needs a user access token: {}, {} or DWS_USER_ACCESS_TOKEN",
                    in_file("access_token_file"),
                    in_file("access_token")
                )));
            };
            Ok(SourceConfig::Personal(PersonalConfig {
                ticket_url: ticket_url.trim_end_matches('/').to_owned(),
                control_base: control_base.trim_end_matches('/').to_owned(),
                access_token,
                client_id: env
                    .client_id
                    .clone()
                    .or(section.client_id.take())
                    .unwrap_or_default(),
                source_id: section.source_id.take().unwrap_or_else(|| "open".into()),
                max_attempts: section.max_attempts.unwrap_or(0),
                keepalive: duration(
                    "keepalive",
                    section.keepalive.as_deref(),
                    Duration::from_secs(30),
                )?,
            }))
        }
        other => Err(invalid(format!(
            "unknown source {other:?} for profile {profile}: use local, exec, dingtalk or personal"
        ))),
    }
}

/// `https://` anywhere; `http://` only to a loopback host (tests, the demo).
pub fn check_url(url: &str, field: &str) -> Result<(), ConfigError> {
    if url.starts_with("https://") {
        return Ok(());
    }
    if let Some(rest) = url.strip_prefix("http://") {
        let host = rest.split(['/', ':']).next().unwrap_or("");
        if host == "127.0.0.1" || host == "localhost" || host == "[::1]" {
            return Ok(());
        }
        return Err(invalid(format!(
            "{field} {url:?}: plain http is allowed only for loopback hosts; use https"
        )));
    }
    Err(invalid(format!("{field} {url:?}: not an http(s) URL")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, body: &str, mode: u32) {
        let p = dir.join("config.toml");
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn default_is_local() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            load(tmp.path(), "default", &EnvOverrides::default()),
            Ok(SourceConfig::Local)
        ));
    }

    #[test]
    fn exec_and_errors() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "[profiles.p]\nsource = \"exec\"\ncommand = [\"cat\"]\n",
            0o644,
        );
        let SourceConfig::Exec(e) = load(tmp.path(), "p", &EnvOverrides::default()).unwrap() else {
            panic!()
        };
        assert_eq!(e.command, vec!["cat"]);
        write(
            tmp.path(),
            "[profiles.p]\nsource = \"exec\"\ncomand = [\"cat\"]\n",
            0o644,
        );
        let err = load(tmp.path(), "p", &EnvOverrides::default()).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
        write(tmp.path(), "[profiles.p]\nsource = \"nope\"\n", 0o644);
        assert!(load(tmp.path(), "p", &EnvOverrides::default())
            .unwrap_err()
            .to_string()
            .contains("unknown source"));
    }

    #[test]
    fn inline_secret_needs_private_file_and_is_redacted() {
        let tmp = tempfile::tempdir().unwrap();
        let body =
            "[profiles.p]\nsource = \"dingtalk\"\nclient_id = \"id\"\nclient_secret = \"CANARY\"\n";
        write(tmp.path(), body, 0o644);
        let err = load(tmp.path(), "p", &EnvOverrides::default()).unwrap_err();
        assert!(matches!(err, ConfigError::Permission(_)));
        assert!(!err.to_string().contains("CANARY"));
        write(tmp.path(), body, 0o600);
        let cfg = load(tmp.path(), "p", &EnvOverrides::default()).unwrap();
        assert!(!format!("{cfg:?}").contains("CANARY"));
        let SourceConfig::DingTalk(d) = cfg else {
            panic!()
        };
        assert_eq!(d.client_secret.expose(), "CANARY");
    }

    #[test]
    fn personal_defaults_and_token_file() {
        let tmp = tempfile::tempdir().unwrap();
        let tok = tmp.path().join("tok");
        std::fs::write(&tok, "T0KEN\n").unwrap();
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).unwrap();
        write(
            tmp.path(),
            "[profiles.p]\nsource = \"personal\"\naccess_token_file = \"tok\"\n",
            0o644,
        );
        let SourceConfig::Personal(p) = load(tmp.path(), "p", &EnvOverrides::default()).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            p.ticket_url,
            "https://mcp.dingtalk.com/stream/connections/ticket"
        );
        assert_eq!(p.control_base, "https://mcp.dingtalk.com/dws");
        assert_eq!(p.source_id, "open");
        assert_eq!(p.access_token.read().unwrap().expose(), "T0KEN");
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            load(tmp.path(), "p", &EnvOverrides::default()),
            Err(ConfigError::Permission(_))
        ));
    }

    #[test]
    fn urls() {
        assert!(check_url("https://api.dingtalk.com", "x").is_ok());
        assert!(check_url("http://127.0.0.1:9/", "x").is_ok());
        assert!(check_url("http://example.com", "x").is_err());
        assert!(check_url("ftp://x", "x").is_err());
    }
}
