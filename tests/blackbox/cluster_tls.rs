//! TLS to PostgreSQL: real `busd` hosts on a private [`PgServer`] serving
//! TLS with certificates made here (`rcgen`): `sslmode=verify-full` with the
//! CA file carries a cluster (publish on one host, consume on both; every
//! busd session encrypted, as `pg_stat_ssl` shows), `require` accepts a
//! self-signed server, and what cannot be trusted or cannot work is refused
//! before the ready line with exit 2, the password nowhere.

use std::{path::PathBuf, time::Duration};

use crate::test_ca::Ca;
use dws_tests::{pg::PgServer, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

/// A server certificate for `names`, signed by `ca`: `(cert, key)` PEM.
fn server_cert(ca: &Ca, names: &[&str]) -> (String, String) {
    ca.server_cert(names, "dws test server")
}

fn new_ca(name: &str) -> Ca {
    Ca::new(name)
}

/// `pem` written to a file in `dir`.
fn ca_file(dir: &tempfile::TempDir, name: &str, pem: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, pem).expect("write the CA file");
    p
}

/// The test role's URL on `server` by `host`, with `query`.
fn url(server: &PgServer, host: &str, query: &str) -> String {
    format!(
        "postgres://{}:{}@{host}:{}/{}?{query}",
        dws_tests::pg::USER,
        server.password(),
        server.port(),
        dws_tests::pg::DB
    )
}

/// A cluster host reaching the database by `url`, with `ca` when given.
fn tls_host(url: &str, name: &str, ca: Option<&PathBuf>) -> TestEnv {
    let ca = ca.map(|p| p.display().to_string());
    let mut vars = vec![
        ("DWS_EVENT_BUS_STORE", "postgres".to_owned()),
        ("DWS_POSTGRES_URL", url.to_owned()),
        ("DWS_CLUSTER_HOST", name.to_owned()),
        ("DWS_EVENT_BUS_IDLE_TIMEOUT", "10m".to_owned()),
    ];
    if let Some(ca) = ca {
        vars.push(("DWS_POSTGRES_CA_FILE", ca));
    }
    TestEnv::with_env(&vars)
}

/// `(encrypted, all)` sessions of busd on `server`.
fn busd_sessions(server: &PgServer) -> (u64, u64) {
    let row = server.psql(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE 'busd/%';",
    );
    let (tls, all) = row.split_once('|').unwrap_or_else(|| panic!("{row}"));
    (
        tls.parse().unwrap_or_else(|_| panic!("{row}")),
        all.parse().unwrap_or_else(|_| panic!("{row}")),
    )
}

/// Publishes on `from`, a consumer on each host gets it; every session of
/// busd on the server is encrypted.
fn assert_cluster_works_encrypted(server: &PgServer, a: &TestEnv, b: &TestEnv) {
    let mut ca = a.dws(["event", "consume", "tls.*"]).spawn();
    ca.wait_ready();
    let mut cb = b.dws(["event", "consume", "tls.*"]).spawn();
    cb.wait_ready();
    let ra = a.publish("tls.x", "{\"n\":1}", &["--id", "from-a"]);
    let rb = b.publish("tls.x", "{\"n\":2}", &["--id", "from-b"]);
    for r in [&ra, &rb] {
        assert!(r["seq"].as_u64().is_some(), "{r}");
    }
    for c in [&mut ca, &mut cb] {
        let lines = c.wait_stdout_lines(2, EXIT_TIMEOUT);
        let ids: Vec<String> = lines
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
                v["event_id"].as_str().unwrap_or_default().to_owned()
            })
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, ["from-a", "from-b"], "{lines:?}");
    }
    let (tls, all) = busd_sessions(server);
    assert!(all >= 2, "busd has sessions on the server: {tls}/{all}");
    assert_eq!(tls, all, "every busd session is encrypted");
}

/// `sslmode=verify-full` with the CA file: a two-host cluster publishes and
/// consumes, over TLS only.
#[test]
fn tls_verify_full_with_the_ca_file_carries_the_cluster() {
    let ca = new_ca("dws test CA");
    let (cert, key) = server_cert(&ca, &["localhost"]);
    let server = PgServer::start_tls(&cert, &key);
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_path = ca_file(&dir, "ca.pem", &ca.pem);
    // channel_binding=require: SCRAM-SHA-256-PLUS, which the server
    // accepts only if busd hashed the certificate it really presented.
    let u = url(
        &server,
        "localhost",
        "sslmode=verify-full&channel_binding=require",
    );
    let a = tls_host(&u, "host-a", Some(&ca_path));
    let b = tls_host(&u, "host-b", Some(&ca_path));
    assert_cluster_works_encrypted(&server, &a, &b);
    let log = a.bus_log_tail();
    assert!(
        log.contains("TLS, sslmode=verify-full, CA file") && !log.contains(server.password()),
        "{log}"
    );
}

/// `sslmode=require` encrypts without verifying (libpq's meaning): a
/// self-signed certificate for another name is accepted.
#[test]
fn tls_require_accepts_a_self_signed_server() {
    let own = rcgen::generate_simple_self_signed(vec!["db.invalid".to_owned()])
        .expect("self-signed certificate");
    let server = PgServer::start_tls(&own.cert.pem(), &own.signing_key.serialize_pem());
    let u = url(
        &server,
        "127.0.0.1",
        "sslmode=require&channel_binding=require",
    );
    let a = tls_host(&u, "host-a", None);
    let b = tls_host(&u, "host-b", None);
    assert_cluster_works_encrypted(&server, &a, &b);
}

/// A start that must be refused: `dws event consume` exits with `code`
/// and one `Error:` line saying `says`, before any ready line, with the
/// password in neither the output nor `bus.log`.
fn assert_refused(env: &TestEnv, password: &str, code: i32, says: &str) {
    let out = env
        .dws(["event", "consume", "x.y"])
        .run_with_timeout(Duration::from_secs(40));
    let err = out.assert_error(code);
    assert!(err.contains(says), "expected {says:?} in: {err}\n{out}");
    assert!(!out.stderr.contains("[event] ready"), "{out}");
    assert!(!out.stderr.contains(password), "{out}");
    assert!(!out.stdout.contains(password), "{out}");
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    assert!(!log.contains(password), "{log}");
}

/// A certificate that does not chain to the CA file, or to the bundled
/// public CAs when there is none, is refused before ready: exit 2.
#[test]
fn tls_a_certificate_from_another_ca_is_refused_before_ready() {
    let ca = new_ca("the server's CA");
    let other = new_ca("another CA");
    let (cert, key) = server_cert(&ca, &["localhost"]);
    let server = PgServer::start_tls(&cert, &key);
    let dir = tempfile::tempdir().expect("temp dir");
    let wrong = ca_file(&dir, "other.pem", &other.pem);
    let u = url(&server, "localhost", "sslmode=verify-full");
    let env = tls_host(&u, "h", Some(&wrong));
    assert_refused(
        &env,
        server.password(),
        2,
        "does not verify against the CA file",
    );
    let env = tls_host(&u, "h", None);
    assert_refused(
        &env,
        server.password(),
        2,
        "does not verify against the bundled",
    );
}

/// Under `verify-full` the certificate must name the URL's host: a
/// certificate for `localhost` reached as `127.0.0.1` is refused (exit 2),
/// while `require` takes it.
#[test]
fn tls_a_host_name_the_certificate_does_not_hold_is_refused() {
    let ca = new_ca("dws test CA");
    let (cert, key) = server_cert(&ca, &["localhost"]);
    let server = PgServer::start_tls(&cert, &key);
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_path = ca_file(&dir, "ca.pem", &ca.pem);
    let u = url(&server, "127.0.0.1", "sslmode=verify-full");
    let env = tls_host(&u, "h", Some(&ca_path));
    assert_refused(&env, server.password(), 2, "not valid for this host name");
}

/// `require` against a server without TLS, and the modes and combinations
/// busd does not take, are refused before ready with exit 2.
#[test]
fn tls_what_cannot_work_is_refused_with_exit_2() {
    let server = PgServer::start();
    let u = url(&server, "127.0.0.1", "sslmode=require");
    let env = tls_host(&u, "h", None);
    assert_refused(&env, server.password(), 2, "does not offer TLS");

    let dir = tempfile::tempdir().expect("temp dir");
    let ca_path = ca_file(&dir, "ca.pem", &new_ca("dws test CA").pem);
    let not_pem = ca_file(&dir, "not.pem", "not a certificate\n");
    for (query, ca, says) in [
        (
            "sslmode=verify-ca",
            None,
            "sslmode=verify-ca is not supported",
        ),
        ("sslmode=prefer", None, "sslmode=prefer is not supported"),
        (
            "sslmode=require",
            Some(&ca_path),
            "does not verify the server's certificate",
        ),
        ("sslmode=disable", Some(&ca_path), "add sslmode=verify-full"),
        (
            "sslrootcert=/x.pem&sslmode=verify-full",
            None,
            "postgres_ca_file",
        ),
        (
            "sslmode=verify-full",
            Some(&not_pem),
            "holds no certificate",
        ),
    ] {
        let env = tls_host(&url(&server, "localhost", query), "h", ca);
        assert_refused(&env, server.password(), 2, says);
    }
}

/// PostgreSQL restarted under a host on `verify-full`: its sessions
/// reconnect over TLS (verifying again) and a publish answered after the
/// restart reaches the consumer. (One host: which of several takes the
/// lease back after a restart is the lease's business, not TLS's.)
#[test]
fn tls_a_postgres_restart_is_ridden_out_over_tls() {
    let ca = new_ca("dws test CA");
    let (cert, key) = server_cert(&ca, &["localhost"]);
    let mut server = PgServer::start_tls(&cert, &key);
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_path = ca_file(&dir, "ca.pem", &ca.pem);
    let u = url(&server, "localhost", "sslmode=verify-full");
    let a = tls_host(&u, "host-a", Some(&ca_path));
    let mut consumer = a.dws(["event", "consume", "rs.*"]).spawn();
    consumer.wait_ready();
    a.wait_until(Duration::from_secs(15), "host-a owns the cluster", || {
        a.status()["cluster"]["role"] == "owner"
    });
    a.publish("rs.x", "{}", &["--id", "before"]);

    server.stop();
    server.start_again();
    a.publish("rs.x", "{}", &["--id", "after"]);
    let lines = consumer.wait_stdout_lines(2, EXIT_TIMEOUT);
    let ids: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            v["event_id"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(ids, ["before", "after"], "{lines:?}");
    a.wait_until(
        Duration::from_secs(30),
        "the host reconnected, encrypted",
        || {
            let (tls, all) = busd_sessions(&server);
            all >= 2 && tls == all
        },
    );
}
