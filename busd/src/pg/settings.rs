//! The profile keys of `store = "postgres"`, read into [`PgSettings`]:
//!
//! ```toml
//! [profiles.team]
//! store = "postgres"
//! postgres_url_file = "/home/me/.dws/pg.url"   # 0600: postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=verify-full
//! postgres_ca_file = "/home/me/.dws/pg-ca.pem" # the CA that signed the server's certificate (PEM)
//! cluster = "team"                             # default: the profile name
//! cluster_host = "laptop"                      # default: the machine's host name
//! cluster_lease = "10s"                        # default 10s; DWS_CLUSTER_LEASE overrides
//! ```
//!
//! `cluster_lease` bounds how long the upstream owner keeps the lease
//! without renewing it on the database's clock (a frozen or cut-off owner
//! loses it after that long, and a follower takes over within about 2 s
//! more); [`LEASE_MIN`] to [`LEASE_MAX`].
//!
//! The URL is a secret like every other: from `DWS_POSTGRES_URL`, or from
//! the file `postgres_url_file` names (refused unless 0600 and ours, the
//! rule of `profile::read_secret_file`); never inline in `config.toml`, never
//! in an error. This host's name in the cluster is `DWS_CLUSTER_HOST`, else
//! `cluster_host`, else the machine's host name (several "hosts" may run on
//! one machine, as the tests do); names follow the profile-name rule.
//!
//! The CA file (`DWS_POSTGRES_CA_FILE`, else `postgres_ca_file`, relative
//! to the config dir) is not a secret: any mode, read once at start; it is
//! used by `sslmode=verify-full` alone, and refused with any other mode
//! (see `tls`).

use std::{path::PathBuf, time::Duration};

use proto::limits::quoted;

use super::{tls::CaFile, PgSettings};
use crate::section::{ConfigError, SectionReader};

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
    let host = match (&r.env.cluster_host, r.section.cluster_host.take()) {
        (Some(h), _) => valid_host(h, "DWS_CLUSTER_HOST")?,
        (None, Some(h)) => valid_host(&h, &r.in_file("cluster_host"))?,
        (None, None) => host_name()?,
    };
    let ca = match (&r.env.postgres_ca_file, r.section.postgres_ca_file.take()) {
        (Some(f), _) => Some(("DWS_POSTGRES_CA_FILE".to_owned(), PathBuf::from(f))),
        (None, Some(f)) => Some((r.in_file("postgres_ca_file"), r.path_of(f))),
        (None, None) => None,
    };
    let ca = ca
        .map(|(from, f)| CaFile::load(&f).map_err(|e| ConfigError::Invalid(format!("{from}: {e}"))))
        .transpose()?;
    let lease = match (&r.env.cluster_lease, r.section.cluster_lease.take()) {
        (Some(v), _) => lease_bound(v, "DWS_CLUSTER_LEASE")?,
        (None, Some(v)) => lease_bound(&v, &r.in_file("cluster_lease"))?,
        (None, None) => LEASE_DEFAULT,
    };
    let settings = PgSettings {
        url,
        cluster,
        host,
        ca,
        lease,
    };
    super::config(&settings, "check").map_err(|e| ConfigError::Invalid(format!("{from}: {e}")))?;
    Ok(settings)
}

/// The lease's default bound.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(10);
/// The shortest lease: a renewal every second must fit it several times.
pub const LEASE_MIN: Duration = Duration::from_secs(2);
/// The longest lease: a frozen owner holds the upstream at most this long.
pub const LEASE_MAX: Duration = Duration::from_secs(600);

/// A lease bound (`value`, from `from`), within [`LEASE_MIN`]..=[`LEASE_MAX`].
pub fn lease_bound(value: &str, from: &str) -> Result<Duration, ConfigError> {
    let d = proto::duration::parse(value).map_err(|e| {
        ConfigError::Invalid(format!("{from} = {}: not a duration ({e})", quoted(value)))
    })?;
    if !(LEASE_MIN..=LEASE_MAX).contains(&d) {
        return Err(ConfigError::Invalid(format!(
            "{from} = {}: use {}s to {}s",
            quoted(value),
            LEASE_MIN.as_secs(),
            LEASE_MAX.as_secs()
        )));
    }
    Ok(d)
}

/// `name` (from `from`) if it follows the profile-name rule.
fn valid_host(name: &str, from: &str) -> Result<String, ConfigError> {
    if proto::is_valid_id(name) {
        Ok(name.to_owned())
    } else {
        Err(ConfigError::Invalid(format!(
            "{from} = {}: a cluster host name uses 1-64 characters from A-Z a-z 0-9 . _ -",
            quoted(name)
        )))
    }
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

    use crate::profile::load_profile;
    use crate::section::{ConfigError, EnvOverrides, SectionReader};

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
        let mut r = SectionReader::new(section, env, dir, &path, "team");
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
        // The whole profile loads, with the machine's host name.
        let p = load_profile(tmp.path(), "team", &env).unwrap();
        assert_eq!(p.store.kind, crate::store::StoreKind::Postgres);
        let pg = p.store.postgres.unwrap();
        assert_eq!(
            (pg.cluster.as_str(), pg.host.as_str()),
            ("team", s.host.as_str())
        );

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

    #[test]
    fn postgres_ca_file_comes_from_the_env_or_the_file_and_must_hold_a_certificate() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "ca.pem", super::super::tests_tls::CA_PEM, 0o644);
        write(tmp.path(), "other.pem", "no certificate here\n", 0o644);
        let env = EnvOverrides {
            postgres_url: Some("postgres://dws:pw@db/dws?sslmode=verify-full".into()),
            ..EnvOverrides::default()
        };
        let s = settings(tmp.path(), "", &env).unwrap();
        assert!(s.ca.is_none());
        // Relative to the config dir; not a secret, so 0644 is fine.
        let s = settings(tmp.path(), "postgres_ca_file = \"ca.pem\"", &env).unwrap();
        assert_eq!(s.ca.unwrap().path(), tmp.path().join("ca.pem"));
        let e = settings(tmp.path(), "postgres_ca_file = \"other.pem\"", &env).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.starts_with("profiles.team.postgres_ca_file") && e.contains("holds no certificate"),
            "{e}"
        );
        // The environment wins over the file.
        let with_env = EnvOverrides {
            postgres_ca_file: Some(tmp.path().join("ca.pem").display().to_string()),
            ..env.clone()
        };
        let s = settings(tmp.path(), "postgres_ca_file = \"other.pem\"", &with_env).unwrap();
        assert!(s.ca.is_some());
        // A CA file the mode would not use is refused.
        let plain = EnvOverrides {
            postgres_url: Some("postgres://dws:pw@db/dws".into()),
            ..with_env
        };
        let e = settings(tmp.path(), "", &plain).unwrap_err().to_string();
        assert!(e.contains("add sslmode=verify-full"), "{e}");
    }

    #[test]
    fn postgres_cluster_lease_comes_from_the_env_or_the_file_within_bounds() {
        let tmp = tempfile::tempdir().unwrap();
        let env = EnvOverrides {
            postgres_url: Some("postgres://dws:pw@127.0.0.1/dws".into()),
            ..EnvOverrides::default()
        };
        let s = settings(tmp.path(), "", &env).unwrap();
        assert_eq!(s.lease, super::LEASE_DEFAULT);
        let s = settings(tmp.path(), "cluster_lease = \"30s\"", &env).unwrap();
        assert_eq!(s.lease, std::time::Duration::from_secs(30));
        let with_env = EnvOverrides {
            cluster_lease: Some("3s".into()),
            ..env.clone()
        };
        let s = settings(tmp.path(), "cluster_lease = \"30s\"", &with_env).unwrap();
        assert_eq!(s.lease, std::time::Duration::from_secs(3));
        for bad in ["1s", "11m", "soon"] {
            let e = settings(tmp.path(), &format!("cluster_lease = \"{bad}\""), &env)
                .unwrap_err()
                .to_string();
            assert!(e.contains("profiles.team.cluster_lease"), "{e}");
        }
    }

    #[test]
    fn postgres_cluster_host_comes_from_the_env_the_file_or_the_machine() {
        let tmp = tempfile::tempdir().unwrap();
        let env = EnvOverrides {
            postgres_url: Some("postgres://dws:pw@127.0.0.1/dws".into()),
            ..EnvOverrides::default()
        };
        let s = settings(tmp.path(), "cluster_host = \"h-2.eu\"", &env).unwrap();
        assert_eq!(s.host, "h-2.eu");
        let with_env = EnvOverrides {
            cluster_host: Some("from-env".into()),
            ..env.clone()
        };
        let s = settings(tmp.path(), "cluster_host = \"h-2.eu\"", &with_env).unwrap();
        assert_eq!(s.host, "from-env");

        let e = settings(tmp.path(), "cluster_host = \"no/slash\"", &env).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("profiles.team.cluster_host") && e.contains("\"no/slash\""),
            "{e}"
        );
        let bad_env = EnvOverrides {
            cluster_host: Some(String::from("x").repeat(65)),
            ..env.clone()
        };
        let e = settings(tmp.path(), "", &bad_env).unwrap_err().to_string();
        assert!(e.starts_with("DWS_CLUSTER_HOST = "), "{e}");

        // Durability is PostgreSQL's: the profile may not set it; the
        // environment's (meant for other profiles) is ignored.
        write(
            tmp.path(),
            "config.toml",
            "[profiles.team]\nstore = \"postgres\"\ndurability = \"none\"\n",
            0o644,
        );
        let e = load(tmp.path(), &env).to_string();
        assert!(
            e.contains("profiles.team.durability") && e.contains("does not apply"),
            "{e}"
        );
        write(
            tmp.path(),
            "config.toml",
            "[profiles.team]\nstore = \"postgres\"\n",
            0o644,
        );
        let with_durability = EnvOverrides {
            durability: Some("none".into()),
            ..env.clone()
        };
        let p = load_profile(tmp.path(), "team", &with_durability).unwrap();
        assert!(p.store.postgres.is_some());
    }
}
