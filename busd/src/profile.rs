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

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

pub use crate::section::{ConfigError, EnvOverrides, ProfileSection, Secret, SectionReader};
pub use crate::source::{
    dingtalk::DingTalkConfig,
    exec::ExecConfig,
    personal::config::{PersonalConfig, TokenSource},
    SourceConfig,
};
use crate::{
    section::invalid,
    store::{Durability, StoreConfig, StoreKind},
};

/// The file's shape. Unknown keys are errors, so a typo is reported instead
/// of silently ignored; but a profile's section is checked only when that
/// profile is loaded, so a typo in `[profiles.other]` never stops this one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    profiles: BTreeMap<String, toml::Value>,
}

/// Parses `config.toml` at `path` (`None`: there is none) down to the
/// profile sections, each still unchecked.
fn parse_file(path: &Path) -> Result<FileConfig, ConfigError> {
    match read_config_text(path)? {
        Some(t) => toml::from_str(&t).map_err(|e| {
            invalid(format!(
                "{}: {}",
                path.display(),
                e.to_string().replace('\n', " ").trim()
            ))
        }),
        None => Ok(FileConfig::default()),
    }
}

/// The names of the profiles `<root>/config.toml` has a section for, in
/// order; an error only when the file as a whole cannot be read or parsed.
pub fn profile_names(config_root: &Path) -> Result<Vec<String>, ConfigError> {
    parse_file(&config_root.join("config.toml")).map(|f| f.profiles.into_keys().collect())
}

/// Checks one profile's section: empty when the file names no profile at
/// all or this is the default profile; a file that names profiles but not
/// this one is refused (a mistyped `--profile` would otherwise start a new,
/// empty bus beside the intended one).
fn section_of(file: FileConfig, profile: &str, path: &Path) -> Result<ProfileSection, ConfigError> {
    let named: Vec<String> = file.profiles.keys().cloned().collect();
    match file.profiles.into_iter().find(|(k, _)| k == profile) {
        None if named.is_empty() || profile == proto::paths::DEFAULT_PROFILE => {
            Ok(ProfileSection::default())
        }
        None => Err(invalid(format!(
            "{}: has no profile {} (it has {}): check the name, or add [profiles.{profile}] \
             to use a new one",
            path.display(),
            proto::limits::quoted(profile),
            named.join(", ")
        ))),
        Some((_, value)) => ProfileSection::deserialize(value).map_err(|e| {
            invalid(format!(
                "{}: [profiles.{profile}]: {}",
                path.display(),
                nearest_key(e.to_string().replace('\n', " ").trim())
            ))
        }),
    }
}

/// serde's "unknown field `stroe`, expected one of `source`, `store`, …"
/// (31 keys) as one short line: the key and the nearest valid one, when one
/// is near (`unknown key \`stroe\` (did you mean \`store\`?)`), else the key
/// and the valid ones.
fn nearest_key(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_owned();
    };
    let Some((key, expected)) = rest.split_once("`, expected one of ") else {
        return message.to_owned();
    };
    let best = expected
        .split(", ")
        .map(|k| k.trim_matches('`'))
        .map(|k| (strsim::damerau_levenshtein(key, k), k))
        .min();
    match best {
        Some((d, k)) if d <= 2.max(key.len() / 3) => {
            format!("unknown key `{key}` (did you mean `{k}`?)")
        }
        _ => format!("unknown key `{key}`; the keys are {expected}"),
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
/// `DWS_EVENT_BUS_DURABILITY`); defaults: a disk store, fsynced. A postgres
/// store leaves durability to PostgreSQL: the profile may not set it (the
/// environment's, which may serve other profiles, is ignored), and its own
/// settings are read (`pg::settings`).
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
        let settings = crate::pg::settings::settings(r)?;
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
    let section = section_of(parse_file(&path)?, profile, &path)?;
    let mut r = SectionReader::new(section, env, config_root, &path, profile);
    let store = store_config(&mut r)?;
    let source = load_source(config_root, profile, env, &path, r.section)?;
    Ok(Profile { source, store })
}

/// The text of `config.toml`, `None` when there is none. A FIFO or any
/// other non-regular file is refused without blocking (exit 2), so is text
/// that is not UTF-8; a file the bus may not read is exit 3.
fn read_config_text(path: &Path) -> Result<Option<String>, ConfigError> {
    use crate::regular::{self, OpenError};
    match regular::read(path, regular::Follow::Yes) {
        Ok((bytes, _)) => String::from_utf8(bytes).map(Some).map_err(|e| {
            invalid(format!(
                "{}: not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e @ OpenError::NotRegular(_)) => Err(invalid(format!("{}: {e}", path.display()))),
        Err(e) => Err(ConfigError::Permission(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
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
    let mut r = SectionReader::new(section, env, config_root, path, profile);
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::section::check_url;

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
        // Issue 44, item 6: the nearest key, not a list of 31.
        assert!(
            err.to_string()
                .ends_with("unknown key `comand` (did you mean `command`?)"),
            "{err}"
        );
        write(tmp.path(), "[profiles.p]\nsource = \"nope\"\n", 0o644);
        assert!(load(tmp.path(), "p", &EnvOverrides::default())
            .unwrap_err()
            .to_string()
            .contains("unknown source"));
    }

    #[test]
    fn a_typo_in_another_profile_does_not_stop_this_one() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "[profiles.typo]\nsoruce = \"exec\"\n\n[profiles.good]\nsource = \"exec\"\ncommand = [\"cat\"]\n",
            0o644,
        );
        let env = EnvOverrides::default();
        assert!(matches!(
            load(tmp.path(), "good", &env),
            Ok(SourceConfig::Exec(_))
        ));
        assert!(matches!(
            load(tmp.path(), "default", &env),
            Ok(SourceConfig::Local)
        ));
        let err = load(tmp.path(), "typo", &env).unwrap_err().to_string();
        assert!(
            err.contains("[profiles.typo]") && err.contains("soruce"),
            "{err}"
        );
        assert_eq!(profile_names(tmp.path()).unwrap(), vec!["good", "typo"]);
        // The file's own shape is still checked as a whole.
        write(tmp.path(), "[profile.good]\n", 0o644);
        assert!(load(tmp.path(), "good", &env).is_err());
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
        assert_eq!(
            p.auth
                .access_token
                .read(crate::source::personal::token_file::Field::Access)
                .unwrap()
                .expose(),
            "T0KEN"
        );
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
