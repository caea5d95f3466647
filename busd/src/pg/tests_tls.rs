//! Tests of TLS to PostgreSQL's pure parts: `sslmode` out of both URL
//! forms, the modes busd takes, the CA/mode combinations `config` refuses,
//! the CA file's checks. The handshakes themselves are tested black-box
//! (`tests/blackbox/cluster_tls.rs`) against a server with TLS.

use super::{
    config_and_mode,
    tls::{leaves_the_machine, split_sslmode, CaFile, Mode},
    PgError, PgSettings,
};

fn settings(url: &str, host: &str) -> PgSettings {
    PgSettings::for_test(url, host)
}

const CANARY: &str = "S3cretCanary";

#[test]
fn sslmode_is_taken_out_of_a_postgres_url() {
    for (url, rest, mode) in [
        ("postgres://u:p@h/db", "postgres://u:p@h/db", None),
        (
            "postgres://u:p@h/db?sslmode=verify-full",
            "postgres://u:p@h/db",
            Some("verify-full"),
        ),
        (
            "postgresql://u:p@h:5/db?application_name=x&sslmode=require&connect_timeout=3",
            "postgresql://u:p@h:5/db?application_name=x&connect_timeout=3",
            Some("require"),
        ),
        (
            "postgres://u:p@h/db?sslmode=disable&sslmode=verify-full",
            "postgres://u:p@h/db",
            Some("verify-full"),
        ),
        (
            "postgres://u:p@h/db?ssl%6Dode=verify%2Dfull&options=-c%20a%3Db",
            "postgres://u:p@h/db?options=-c%20a%3Db",
            Some("verify-full"),
        ),
        // A `?` in the password is not the query.
        (
            "postgres://u:p?sslmode=x@h/db?sslmode=require",
            "postgres://u:p?sslmode=x@h/db",
            Some("require"),
        ),
    ] {
        let (r, m) = split_sslmode(url).unwrap();
        assert_eq!((r.as_str(), m.as_deref()), (rest, mode), "{url}");
    }
}

#[test]
fn sslmode_is_taken_out_of_a_key_value_string() {
    for (url, rest, mode) in [
        ("host=h dbname=d", "host=h dbname=d", None),
        (
            "host=h sslmode=verify-full dbname=d",
            "host=h dbname=d",
            Some("verify-full"),
        ),
        (
            "host=h  sslmode = 'require'  password='a b\\' c'",
            "host=h password='a b\\' c'",
            Some("require"),
        ),
        // Unscannable: left for tokio-postgres to refuse.
        ("host=h password='open", "host=h password='open", None),
    ] {
        let (r, m) = split_sslmode(url).unwrap();
        assert_eq!((r.as_str(), m.as_deref()), (rest, mode), "{url}");
    }
    let e = split_sslmode("host=h sslrootcert=/ca.pem")
        .unwrap_err()
        .to_string();
    assert!(e.contains("postgres_ca_file"), "{e}");
}

#[test]
fn sslmode_values_busd_takes_and_refuses() {
    assert_eq!(Mode::parse(None), Ok(Mode::Disable));
    assert_eq!(Mode::parse(Some("disable")), Ok(Mode::Disable));
    assert_eq!(Mode::parse(Some("require")), Ok(Mode::Require));
    assert_eq!(Mode::parse(Some("verify-full")), Ok(Mode::VerifyFull));
    for (v, says) in [
        ("verify-ca", "verify-full"),
        ("prefer", "falls back"),
        ("allow", "falls back"),
        ("VERIFY-FULL", "unknown value"),
        (CANARY, "unknown value"),
    ] {
        let e = Mode::parse(Some(v)).unwrap_err().to_string();
        assert!(e.contains(says) && !e.contains(CANARY), "{v}: {e}");
    }
}

#[test]
fn config_sets_the_mode_and_refuses_a_ca_file_it_would_not_use() {
    let tmp = tempfile::tempdir().unwrap();
    let mode = |url: &str| {
        let (c, m) = config_and_mode(&settings(url, "h"), "t").unwrap();
        (c.get_ssl_mode(), m)
    };
    use tokio_postgres::config::SslMode as S;
    assert_eq!(
        mode("postgres://u:p@h/db"),
        (S::Disable, Mode::Disable),
        "no sslmode: no TLS"
    );
    assert_eq!(
        mode("postgres://u:p@h/db?sslmode=verify-full"),
        (S::Require, Mode::VerifyFull)
    );
    assert_eq!(
        mode("host=/run/postgresql user=u sslmode=require"),
        (S::Disable, Mode::Disable),
        "a Unix socket has no TLS"
    );

    let pem = tmp.path().join("ca.pem");
    std::fs::write(&pem, CA_PEM).unwrap();
    let ca = CaFile::load(&pem).unwrap();
    for url in [
        format!("postgres://u:{CANARY}@h/db"),
        format!("postgres://u:{CANARY}@h/db?sslmode=require"),
    ] {
        let mut s = settings(&url, "h");
        s.ca = Some(ca.clone());
        match config_and_mode(&s, "t") {
            Err(PgError::Config(m)) => {
                assert!(
                    m.contains("sslmode=verify-full") && !m.contains(CANARY),
                    "{m}"
                )
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    let mut s = settings("postgres://u:p@h/db?sslmode=verify-full", "h");
    s.ca = Some(ca);
    assert!(config_and_mode(&s, "t").is_ok());
    assert!(format!("{s:?}").contains("ca.pem"));
}

#[test]
fn a_connection_leaves_the_machine_unless_every_host_is_local() {
    let leaves = |url: &str| leaves_the_machine(&url.parse().unwrap());
    assert!(!leaves("postgres://u@localhost/db"));
    assert!(!leaves("postgres://u@127.0.0.2:5/db"));
    assert!(!leaves("postgres://u@[::1]/db"));
    assert!(!leaves("host=/run/postgresql user=u"));
    assert!(!leaves("host=db.example hostaddr=127.0.0.1 user=u"));
    assert!(leaves("postgres://u@db.example/db"));
    assert!(leaves("postgres://u@localhost,10.0.0.9/db"));
    assert!(leaves("host=localhost hostaddr=10.0.0.9 user=u"));
}

#[test]
fn a_ca_file_must_hold_a_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("x.pem");
    assert!(CaFile::load(&p)
        .unwrap_err()
        .to_string()
        .contains("cannot read"));
    std::fs::write(&p, "hello\n").unwrap();
    assert!(CaFile::load(&p)
        .unwrap_err()
        .to_string()
        .contains("holds no certificate"));
    std::fs::write(
        &p,
        "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    assert!(CaFile::load(&p).is_err());
    std::fs::write(&p, CA_PEM).unwrap();
    assert_eq!(CaFile::load(&p).unwrap().path(), p);
}

/// A throwaway self-signed CA (P-256, its key discarded), for the file checks.
pub(super) const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBgzCCASmgAwIBAgIUf3/QffyDarq9zTqHieEr44vEToAwCgYIKoZIzj0EAwIw
FjEUMBIGA1UEAwwLZHdzIHRlc3QgQ0EwIBcNMjYxMjAxMTYwNTExWhgPMjEyNjEx
MDcxNjA1MTFaMBYxFDASBgNVBAMMC2R3cyB0ZXN0IENBMFkwEwYHKoZIzj0CAQYI
KoZIzj0DAQcDQgAEjlP9vi+ggqFs4Y8zZhRn94XafzS31QucaAwtZhkZsQcUJ2Vb
/xFTPv9yececs/GHxklWxWdoQd9ewQryDdImn6NTMFEwHQYDVR0OBBYEFIGjg6L2
3z2V6QW2QTcH4/eBvjHWMB8GA1UdIwQYMBaAFIGjg6L23z2V6QW2QTcH4/eBvjHW
MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgH6Y0/1pfphm5Ixt3
oL8EBPMlUyxfG+5CwwDTZuFco08CIQCkrzT5w1BwfqE5qNs3KPxsiDr0xafqMXSm
U27Ce0Alhg==
-----END CERTIFICATE-----
";
