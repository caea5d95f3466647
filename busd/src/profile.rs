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

/// The source a profile's bus runs, with its settings (each source's
/// settings are read next to that source: `source::exec::settings`,
/// `source::dingtalk::settings`, `source::personal::config::settings`).
#[derive(Debug, Clone)]
pub enum SourceConfig {
    Local,
    Exec(ExecConfig),
    DingTalk(DingTalkConfig),
    Personal(PersonalConfig),
}

pub use crate::source::{
    dingtalk::DingTalkConfig,
    exec::ExecConfig,
    personal::config::{PersonalConfig, TokenSource},
};

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

/// The file's shape. Unknown keys are errors, so a typo is reported instead
/// of silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    profiles: BTreeMap<String, ProfileSection>,
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
    // store = "postgres" (store::postgres::settings)
    pub postgres_url_file: Option<PathBuf>,
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
            cluster_host: get("DWS_CLUSTER_HOST"),
            cluster_lease: get("DWS_CLUSTER_LEASE"),
        }
    }
}

fn invalid(m: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(m.into())
}

/// Refuses a file holding a secret unless only its owner can read it.
pub(crate) fn check_private(path: &Path, what: &str) -> Result<(), ConfigError> {
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

    /// A reader over `section` as if it came from `path` (loader tests).
    #[cfg(test)]
    pub(crate) fn for_tests(
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

/// Reads a secret file (refused unless 0600 and ours), trimmed.
pub(crate) fn read_secret_file(f: &Path, what: &str) -> Result<Secret, ConfigError> {
    check_private(f, what)?;
    let s = std::fs::read_to_string(f)
        .map_err(|e| ConfigError::Permission(format!("cannot read {what} {}: {e}", f.display())))?;
    Ok(Secret::new(s.trim().to_owned()))
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
/// `DWS_EVENT_BUS_DURABILITY`); defaults: a disk store, fsynced. A postgres
/// store leaves durability to PostgreSQL: the profile may not set it (the
/// environment's, which may serve other profiles, is ignored), and its own
/// settings are read (`store::postgres::settings`).
fn store_config(r: &mut SectionReader<'_>) -> Result<StoreConfig, ConfigError> {
    let env = r.env;
    let kind = match (&env.store, r.section.store.take()) {
        (Some(v), _) => StoreKind::parse(v).ok_or_else(|| {
            invalid(format!(
                "DWS_EVENT_BUS_STORE={v:?}: use disk, memory or postgres"
            ))
        })?,
        (None, Some(v)) => StoreKind::parse(&v).ok_or_else(|| {
            invalid(format!(
                "{} = {v:?}: use disk, memory or postgres",
                r.in_file("store")
            ))
        })?,
        (None, None) => StoreKind::Disk,
    };
    let file_durability = r.section.durability.take();
    if kind == StoreKind::Postgres {
        if let Some(v) = file_durability {
            return Err(invalid(format!(
                "{} = {v:?}: durability does not apply to store = \"postgres\" (an event is \
                 durable once PostgreSQL committed it); remove the key",
                r.in_file("durability")
            )));
        }
        let settings = crate::store::postgres::settings::settings(r)?;
        return Ok(StoreConfig {
            kind,
            durability: Durability::Fsync,
            postgres: Some(settings),
        });
    }
    let durability = match (&env.durability, file_durability) {
        (Some(v), _) => Durability::parse(v)
            .ok_or_else(|| invalid(format!("DWS_EVENT_BUS_DURABILITY={v:?}: use fsync or none")))?,
        (None, Some(v)) => Durability::parse(&v).ok_or_else(|| {
            invalid(format!(
                "{} = {v:?}: use fsync or none",
                r.in_file("durability")
            ))
        })?,
        (None, None) => Durability::Fsync,
    };
    Ok(StoreConfig {
        kind,
        durability,
        postgres: None,
    })
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
    let section = file
        .profiles
        .into_iter()
        .find(|(k, _)| k == profile)
        .map(|(_, v)| v)
        .unwrap_or_default();
    let mut r = SectionReader {
        section,
        env,
        config_root,
        path: &path,
        profile,
    };
    let store = store_config(&mut r)?;
    let source = load_source(config_root, profile, env, &path, r.section)?;
    Ok(Profile { source, store })
}

/// The source part of a profile section: which source, then that
/// source's own loader.
fn load_source(
    config_root: &Path,
    profile: &str,
    env: &EnvOverrides,
    path: &Path,
    mut section: ProfileSection,
) -> Result<SourceConfig, ConfigError> {
    let kind = env
        .source
        .clone()
        .or(section.source.take())
        .unwrap_or_else(|| "local".into());
    let mut r = SectionReader {
        section,
        env,
        config_root,
        path,
        profile,
    };
    match kind.as_str() {
        "local" => Ok(SourceConfig::Local),
        "exec" => crate::source::exec::settings(&mut r).map(SourceConfig::Exec),
        "dingtalk" => crate::source::dingtalk::settings(&mut r).map(SourceConfig::DingTalk),
        "personal" => crate::source::personal::config::settings(&mut r).map(SourceConfig::Personal),
        other => Err(invalid(format!(
            "unknown source {other:?} for profile {profile}: use local, exec, dingtalk or personal"
        ))),
    }
}

/// `https://` anywhere; `http://` only to a loopback host (tests, the
/// demo) — the loopback rule of `source::stream::net`.
pub fn check_url(url: &str, field: &str) -> Result<(), ConfigError> {
    crate::source::stream::net::check_http_url(url)
        .map(|_| ())
        .map_err(|e| invalid(format!("{field} {url:?}: {e}")))
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
        assert_eq!(d.client_secret.unwrap().expose(), "CANARY");
    }

    #[test]
    fn personal_defaults_and_token_file() {
        let tmp = tempfile::tempdir().unwrap();
        let tok = tmp.path().join("tok");
        std::fs::write(&tok, "T0KEN\n").unwrap();
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).unwrap();
        write(
            tmp.path(),
            "[profiles.p]\nsource = \"personal\"\nclient_id = \"cid\"\naccess_token_file = \"tok\"\n",
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
        assert_eq!(p.auth.access_token.read().unwrap().expose(), "T0KEN");
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            load(tmp.path(), "p", &EnvOverrides::default()),
            Err(ConfigError::Permission(_))
        ));
    }

    #[test]
    fn urls_follow_the_one_loopback_rule() {
        assert!(check_url("https://api.dingtalk.com", "x").is_ok());
        assert!(check_url("http://127.0.0.1:9/", "x").is_ok());
        assert!(check_url("http://127.0.0.2:9/", "x").is_ok());
        assert!(check_url("http://[::1]:9/", "x").is_ok());
        let e = check_url("http://example.com", "open_api").unwrap_err();
        assert!(
            e.to_string()
                .contains("plain http is allowed only for loopback hosts"),
            "{e}"
        );
        assert!(check_url("ftp://x", "x").is_err());
    }
}
