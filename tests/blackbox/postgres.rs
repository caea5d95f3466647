//! The PostgreSQL harness (`dws_tests::pg`) itself: a private server starts,
//! takes the test role's password over TCP and refuses a wrong one, keeps its
//! data across a stop and a crash, runs next to other servers, and leaves
//! no process or directory behind. The cluster store's own tests build on it
//! (`cargo test -p busd postgres`). And a postgres profile's settings are
//! checked before any ready line.

use std::{
    os::unix::fs::PermissionsExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use dws_tests::{assert_absent, is_live, pg::PgServer, wait_pid_gone, TestEnv, EXIT_TIMEOUT};

/// `psql URL -c sql` as a client over TCP, with the password in the
/// environment (never in argv); `(success, stdout + stderr)`.
fn psql_url(server: &PgServer, password: &str, sql: &str) -> (bool, String) {
    let out = Command::new(dws_tests::pg::bin_dir().join("psql"))
        .args(["-X", "-q", "-A", "-t", "-w", "-h", "127.0.0.1", "-p"])
        .arg(server.port().to_string())
        .args([
            "-U",
            dws_tests::pg::USER,
            "-d",
            dws_tests::pg::DB,
            "-c",
            sql,
        ])
        .env_clear()
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .expect("run psql");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text.trim().to_owned())
}

#[test]
fn postgres_harness_serves_scram_over_tcp_and_cleans_up() {
    let t0 = Instant::now();
    let server = PgServer::start();
    eprintln!("PgServer::start took {:?}", t0.elapsed());
    let procs = server.processes();
    let dir = server.dir().to_path_buf();
    assert!(
        server.url().starts_with("postgres://dws:pgpw"),
        "{}",
        server.url()
    );
    assert_eq!(server.psql("SELECT 1 + 1"), "2");

    let (ok, out) = psql_url(&server, server.password(), "SELECT current_user");
    assert!(ok, "{out}\n{}", server.log_tail());
    assert_eq!(out, "dws");
    let (ok, out) = psql_url(&server, "wrong", "SELECT 1");
    assert!(
        !ok && out.contains("password authentication failed"),
        "{out}"
    );
    // The harness's superuser has no password: not reachable over TCP.
    assert_eq!(
        server.psql("SELECT rolsuper FROM pg_roles WHERE rolname = 'dws'"),
        "f"
    );

    drop(server);
    for pid in procs {
        assert!(
            wait_pid_gone(pid, Duration::from_secs(5)),
            "{pid} outlived Drop"
        );
    }
    assert!(!dir.exists(), "{} outlived Drop", dir.display());
}

#[test]
fn postgres_harness_keeps_data_across_stop_and_crash() {
    let mut server = PgServer::start();
    server.psql("CREATE TABLE t (n int); INSERT INTO t VALUES (1); GRANT SELECT ON t TO dws;");
    let port = server.port();

    server.stop();
    assert!(server.pid().is_none());
    let (ok, out) = psql_url(&server, server.password(), "SELECT 1");
    assert!(!ok, "a stopped server answered: {out}");
    server.start_again();
    assert_eq!(server.port(), port);
    server.psql("INSERT INTO t VALUES (2);");

    let procs = server.processes();
    assert!(procs.len() > 1, "no backends: {procs:?}");
    server.kill9();
    for pid in procs {
        assert!(!is_live(pid), "process {pid} survived kill9");
    }
    server.start_again();
    assert_eq!(
        server.psql("SELECT string_agg(n::text, ',' ORDER BY n) FROM t"),
        "1,2"
    );
    let (ok, out) = psql_url(&server, server.password(), "SELECT count(*) FROM t");
    assert!(ok && out == "2", "{out}");
}

#[test]
fn postgres_harness_servers_run_side_by_side() {
    let servers: Vec<PgServer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3).map(|_| s.spawn(PgServer::start)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("start"))
            .collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(PgServer::port).collect();
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    for (i, s) in servers.iter().enumerate() {
        s.psql(&format!(
            "CREATE TABLE mine (n int); INSERT INTO mine VALUES ({i});"
        ));
    }
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(s.psql("SELECT n FROM mine"), i.to_string());
    }
}

/// `store = "postgres"` settings are checked before any ready line, each
/// failure one `Error:` line: a URL file others can read (exit 3), a cluster
/// host name that cannot name a host, a `durability` PostgreSQL decides
/// (exit 2). The URL's password shows up nowhere.
#[test]
fn postgres_store_settings_are_checked_before_the_ready_line() {
    let server = PgServer::start();
    let env = TestEnv::new();
    let url_file = env.cfg_dir().join("pg.url");
    std::fs::write(&url_file, server.url()).expect("url file");
    let write_config = |extra: &str| {
        let config = format!(
            "[profiles.default]\nstore = \"postgres\"\npostgres_url_file = \"pg.url\"\n{extra}"
        );
        std::fs::write(env.cfg_dir().join("config.toml"), config).expect("config.toml");
    };
    write_config("");

    std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = env
        .dws(["event", "consume", "k"])
        .run_with_timeout(EXIT_TIMEOUT);
    let line = out.assert_error(3);
    assert!(
        line.contains("pg.url") && line.contains("chmod 600"),
        "{out}"
    );
    let mut outputs = vec![out];

    std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    for (extra, says) in [
        ("cluster_host = \"two words\"\n", "cluster_host"),
        ("durability = \"none\"\n", "does not apply"),
    ] {
        write_config(extra);
        let out = env
            .dws(["event", "consume", "k"])
            .run_with_timeout(EXIT_TIMEOUT);
        let line = out.assert_error(2);
        assert!(line.contains(says), "{out}");
        assert!(!out.stderr.contains("[event] ready"), "{out}");
        outputs.push(out);
    }
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    for out in &outputs {
        assert_absent(
            "the PostgreSQL password",
            server.password(),
            &[
                ("stdout", &out.stdout),
                ("stderr", &out.stderr),
                ("bus.log", &log),
            ],
        );
    }
    env.wait_no_busd(EXIT_TIMEOUT, "a bus that refused its store");
}
