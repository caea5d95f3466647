//! The profile keys of `store = "postgres"`, read into [`PgSettings`]:
//!
//! ```toml
//! [profiles.team]
//! store = "postgres"
//! postgres_url_file = "/home/me/.dws/pg.url"   # 0600: postgres://USER:PASSWORD@HOST:PORT/DB
//! cluster = "team"                             # default: the profile name
//! ```
//!
//! The URL is a secret like every other: from `DWS_POSTGRES_URL`, or from
//! the file `postgres_url_file` names (refused unless 0600 and ours, the
//! rule of `profile::read_secret_file`); never inline in `config.toml`, never
//! in an error. This host's name in the cluster is the machine's host name.
//! The profile loader checks these settings, then refuses the store: the
//! cluster store is not finished (see `profile::load_profile`).

use proto::limits::quoted;

use super::PgSettings;
use crate::profile::{ConfigError, SectionReader};

/// Reads and checks the settings: the URL present and well-formed, the
/// cluster name valid (the profile-name rule), a usable host name.
pub fn settings(r: &mut SectionReader<'_>) -> Result<PgSettings, ConfigError> {
    let file = r.section.postgres_url_file.take();
    let from = if r.env.postgres_url.is_some() {
        "DWS_POSTGRES_URL".to_owned()
    } else {
        r.in_file("postgres_url_file")
    };
    let url = r
        .secret(r.env.postgres_url.as_ref(), None, file, "postgres_url_file")?
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "store = \"postgres\" needs the database URL: set {} (a 0600 file holding \
                 postgres://USER:PASSWORD@HOST:PORT/DATABASE) or DWS_POSTGRES_URL",
                r.in_file("postgres_url_file")
            ))
        })?;
    if url.expose().is_empty() {
        return Err(ConfigError::Invalid(format!("{from}: the URL is empty")));
    }
    let cluster = r
        .section
        .cluster
        .take()
        .unwrap_or_else(|| r.profile().to_owned());
    if !proto::is_valid_id(&cluster) {
        return Err(ConfigError::Invalid(format!(
            "{} = {}: use 1-64 characters from A-Z a-z 0-9 . _ -",
            r.in_file("cluster"),
            quoted(&cluster)
        )));
    }
    let host = host_name()?;
    let settings = PgSettings { url, cluster, host };
    super::config(&settings, "check").map_err(|e| ConfigError::Invalid(format!("{from}: {e}")))?;
    Ok(settings)
}

/// The machine's host name, if it follows the profile-name rule.
fn host_name() -> Result<String, ConfigError> {
    let name = nix::unistd::gethostname()
        .map_err(|e| ConfigError::Invalid(format!("cannot read the host name: {e}")))?;
    let name = name.to_string_lossy().into_owned();
    if proto::is_valid_id(&name) {
        Ok(name)
    } else {
        Err(ConfigError::Invalid(format!(
            "the host name {} cannot name this host in a cluster: use 1-64 characters from \
             A-Z a-z 0-9 . _ -",
            quoted(&name)
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::PermissionsExt, path::Path};

    use crate::profile::{load_profile, ConfigError, EnvOverrides, SectionReader};

    const CANARY: &str = "S3cretCanary";

    fn write(dir: &Path, name: &str, body: &str, mode: u32) {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn load(dir: &Path, env: &EnvOverrides) -> ConfigError {
        load_profile(dir, "team", env).unwrap_err()
    }

    /// The loader alone, on `keys` of a `[profiles.team]` section.
    fn settings(
        dir: &Path,
        keys: &str,
        env: &EnvOverrides,
    ) -> Result<super::PgSettings, ConfigError> {
        let section = toml::from_str(keys).unwrap();
        let path = dir.join("config.toml");
        let mut r = SectionReader::for_tests(section, env, dir, &path, "team");
        super::settings(&mut r)
    }

    #[test]
    fn postgres_settings_read_the_url_file_and_default_the_cluster() {
        let tmp = tempfile::tempdir().unwrap();
        let url = format!("postgres://dws:{CANARY}@127.0.0.1:5432/dws\n");
        write(tmp.path(), "pg.url", &url, 0o600);
        let keys = "store = \"postgres\"\npostgres_url_file = \"pg.url\"\n";
        write(
            tmp.path(),
            "config.toml",
            &format!("[profiles.team]\n{keys}"),
            0o644,
        );
        let env = EnvOverrides::default();
        let s = settings(tmp.path(), keys, &env).unwrap();
        assert_eq!(s.cluster, "team");
        assert_eq!(s.url.expose(), url.trim());
        assert!(!s.host.is_empty());
        assert!(!format!("{s:?}").contains(CANARY));
        // Valid settings, but the store is not finished: a clear refusal.
        let e = load(tmp.path(), &env);
        assert!(matches!(e, ConfigError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("not finished yet"), "{e}");

        let env = EnvOverrides {
            postgres_url: Some("postgres://dws:pw@10.0.0.9/other".into()),
            ..EnvOverrides::default()
        };
        let s = settings(tmp.path(), "cluster = \"ops.eu-1\"", &env).unwrap();
        assert_eq!(
            (s.cluster.as_str(), s.url.expose()),
            ("ops.eu-1", "postgres://dws:pw@10.0.0.9/other")
        );
    }

    #[test]
    fn postgres_settings_refuse_what_cannot_work() {
        let tmp = tempfile::tempdir().unwrap();
        let env = EnvOverrides::default();
        let cfg = |extra: &str| format!("[profiles.team]\nstore = \"postgres\"\n{extra}");

        write(tmp.path(), "config.toml", &cfg(""), 0o644);
        let e = load(tmp.path(), &env);
        assert!(matches!(e, ConfigError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("DWS_POSTGRES_URL"), "{e}");

        // The URL file must be private, like every secret file.
        let url = format!("postgres://dws:{CANARY}@127.0.0.1/dws");
        write(tmp.path(), "pg.url", &url, 0o644);
        write(
            tmp.path(),
            "config.toml",
            &cfg("postgres_url_file = \"pg.url\"\n"),
            0o644,
        );
        let e = load(tmp.path(), &env);
        assert!(matches!(e, ConfigError::Permission(_)), "{e:?}");
        assert!(
            e.to_string().contains("chmod 600") && !e.to_string().contains(CANARY),
            "{e}"
        );

        // A malformed URL: exit 2, without echoing it.
        write(
            tmp.path(),
            "pg.url",
            &format!("postgres://dws:{CANARY}@h:port/dws"),
            0o600,
        );
        let e = load(tmp.path(), &env);
        assert!(matches!(e, ConfigError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("postgres_url_file"), "{e}");
        assert!(!e.to_string().contains(CANARY), "{e}");
        write(tmp.path(), "pg.url", "\n", 0o600);
        assert!(load(tmp.path(), &env).to_string().contains("empty"));

        write(tmp.path(), "pg.url", &url, 0o600);
        write(
            tmp.path(),
            "config.toml",
            &cfg("postgres_url_file = \"pg.url\"\ncluster = \"no spaces\"\n"),
            0o644,
        );
        let e = load(tmp.path(), &env);
        let e = e.to_string();
        assert!(
            e.contains("profiles.team.cluster") && e.contains("= \"no spaces\""),
            "{e}"
        );

        // The env var selects the store too.
        write(tmp.path(), "config.toml", "", 0o644);
        let env = EnvOverrides {
            store: Some("postgres".into()),
            postgres_url: Some("not a url".into()),
            ..EnvOverrides::default()
        };
        let e = load(tmp.path(), &env);
        assert!(e.to_string().starts_with("DWS_POSTGRES_URL: "), "{e}");
    }
}
