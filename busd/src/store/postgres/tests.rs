//! Tests of the cluster store's groundwork: the pure parts (URL redaction,
//! error classification, the lease's judgements) directly, the rest against
//! a real PostgreSQL server per test (`dws_tests::pg::PgServer`, which
//! panics, never skips, when PostgreSQL is not installed).

use std::time::Duration;

use dws_tests::pg::PgServer;

use crate::cluster::db::lease::{judge, Lease, LeaseSession, LeaseTiming};

use super::{
    config, connect,
    fence::{check_epoch, fenced, fenced_at},
    schema::{self, migrate, SCHEMA_VERSION},
    PgError, PgSettings,
};
use crate::{ready::FailureKind, ready::StartError};

const CANARY: &str = "S3cretCanary";

pub(super) fn settings(url: &str, host: &str) -> PgSettings {
    PgSettings::for_test(url, host)
}

/// [`settings`] for the harness's server.
pub(super) fn server_settings(server: &PgServer, host: &str) -> PgSettings {
    settings(&server.url(), host)
}

/// Fast clocks, so a lost lease shows within a test's patience.
pub(super) fn quick() -> LeaseTiming {
    LeaseTiming {
        retry: Duration::from_millis(50),
        heartbeat: Duration::from_millis(100),
        answer_within: Duration::from_secs(2),
        bound: Duration::from_secs(10),
    }
}

pub(super) async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 15 s"))
}

// ------------------------------------------------------------------ pure

#[test]
fn postgres_settings_debug_redacts_the_password_wherever_it_is() {
    for (url, shown) in [
        (
            format!("postgres://dws:{CANARY}@db.example:6543/events"),
            "postgres://dws:<redacted>@db.example:6543/events",
        ),
        (
            format!("postgresql://dws@10.0.0.1/events?password={CANARY}&connect_timeout=3"),
            "postgres://dws:<redacted>@10.0.0.1:5432/events",
        ),
        (
            format!("host=/run/postgresql user=dws password={CANARY} dbname=events"),
            "postgres://dws:<redacted>@/run/postgresql:5432/events",
        ),
        (
            format!("postgres://dws:{CANARY}@[::1]:5433/events"),
            "postgres://dws:<redacted>@[::1]:5433/events",
        ),
        (
            format!("nonsense {CANARY}"),
            "<not a valid PostgreSQL URL; not shown>",
        ),
    ] {
        let s = settings(&url, "h1");
        let debug = format!("{s:?}");
        assert!(!debug.contains(CANARY), "{debug}");
        assert!(debug.contains(shown), "{url} → {debug}");
        assert!(debug.contains("cluster: \"c1\""), "{debug}");
    }
}

#[test]
fn postgres_url_errors_are_config_errors_that_never_echo_the_input() {
    for (url, says) in [
        (
            format!("postgres://dws:{CANARY}@127.0.0.1:notaport/dws"),
            "invalid value for option `port`",
        ),
        (
            format!("postgres://dws:pw@127.0.0.1/dws?{CANARY}=1"),
            "unknown option",
        ),
        (
            format!("host=127.0.0.1 password={CANARY} {CANARY}"),
            "unexpected",
        ),
        (CANARY.to_string(), "unexpected EOF"),
        (
            format!("postgres://dws:{CANARY}@127.0.0.1/dws?sslmode=prefer"),
            "sslmode=prefer",
        ),
        (format!("postgres://dws:{CANARY}@/dws"), "no host"),
    ] {
        match config(&settings(&url, "h1"), "test") {
            Err(PgError::Config(m)) => {
                assert!(!m.contains(CANARY), "{url} → {m}");
                assert!(m.contains(says), "{url} → {m}");
            }
            other => panic!("{url} → {other:?}"),
        }
    }
}

#[test]
fn postgres_config_adds_keepalives_and_names_the_session() {
    let c = config(
        &settings(
            "postgres://dws:pw@127.0.0.1:5432/dws?options=-c%20work_mem%3D8MB",
            "h1",
        ),
        "lease",
    )
    .unwrap();
    assert_eq!(c.get_application_name(), Some("busd/c1/h1/lease"));
    assert!(c.get_keepalives());
    assert_eq!(c.get_keepalives_idle(), Duration::from_secs(3));
    assert_eq!(c.get_connect_timeout(), Some(&crate::pg::CONNECT_TIMEOUT));
    let options = c.get_options().unwrap();
    assert!(options.starts_with("-c work_mem=8MB "), "{options}");
    assert!(options.contains("-c tcp_keepalives_idle=3"), "{options}");
    assert!(options.contains("-c tcp_user_timeout=9000"), "{options}");
    assert!(
        options.contains("-c idle_in_transaction_session_timeout=4500"),
        "{options}"
    );
}

#[test]
fn postgres_errors_map_to_the_start_exit_codes() {
    let kind = |e: PgError| StartError::from(e).kind;
    assert_eq!(kind(PgError::Config("x".into())), FailureKind::Usage);
    assert_eq!(kind(PgError::Auth("x".into())), FailureKind::Permission);
    assert_eq!(kind(PgError::Unreachable("x".into())), FailureKind::Runtime);
    assert_eq!(kind(PgError::Other("x".into())), FailureKind::Runtime);
}

#[test]
fn postgres_lease_judgements() {
    assert_eq!(judge(10, 3, 10, Some(3), true), None);
    assert!(judge(10, 3, 11, Some(3), true).unwrap().contains("pooler"));
    assert!(judge(10, 3, 10, Some(4), false)
        .unwrap()
        .contains("epoch 4"));
    assert!(judge(10, 3, 10, Some(3), false)
        .unwrap()
        .contains("expired"));
    assert!(fenced(3, None).unwrap().contains("gone"));
    assert_eq!(fenced(7, Some(7)), None);
    assert_eq!(fenced_at(7, Some((7, true))), None);
    assert!(fenced_at(7, Some((7, false))).unwrap().contains("expired"));
    assert!(fenced_at(7, Some((8, true))).unwrap().contains("epoch 8"));
    assert!(crate::pg::lossy_commit("off").is_some());
    for fine in ["on", "local", "remote_write", "remote_apply"] {
        assert_eq!(crate::pg::lossy_commit(fine), None, "{fine}");
    }
    let t = LeaseTiming::for_bound(Duration::from_secs(2));
    assert!(
        t.heartbeat * 2 <= t.bound && t.answer_within < t.bound,
        "{t:?}"
    );
}

#[test]
fn postgres_schema_versions_are_consecutive() {
    assert_eq!(SCHEMA_VERSION as usize, schema::MIGRATIONS.len());
    assert!(schema::too_new(SCHEMA_VERSION).is_none());
    let e = schema::too_new(SCHEMA_VERSION + 1).unwrap();
    assert!(matches!(e, PgError::Other(ref m) if m.contains("newer than this busd")));
}

// ------------------------------------------------------ against a server

fn psql_count(server: &PgServer, sql: &str) -> i64 {
    server.psql(sql).parse().unwrap_or_else(|_| panic!("{sql}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_are_idempotent_and_safe_when_hosts_start_together() {
    let server = tokio::task::block_in_place(PgServer::start);
    let s = settings(&server.url(), "h1");
    let mut clients = vec![];
    for _ in 0..4 {
        clients.push(connect(&s, "store").await.unwrap());
    }
    let results = futures_util::future::join_all(
        clients
            .iter_mut()
            .map(|(client, _)| async move { migrate(client).await }),
    )
    .await;
    for r in results {
        assert_eq!(r, Ok(SCHEMA_VERSION));
    }
    assert_eq!(migrate(&mut clients[0].0).await, Ok(SCHEMA_VERSION));
    assert_eq!(
        server
            .psql("SELECT string_agg(version::text, ',' ORDER BY version) FROM dws_schema_version"),
        (1..=SCHEMA_VERSION)
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    assert_eq!(
        psql_count(
            &server,
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'dws\\_%'"
        ),
        9
    );
    // The tables belong to the role busd connects as.
    assert_eq!(
        server.psql("SELECT DISTINCT tableowner FROM pg_tables WHERE tablename LIKE 'dws\\_%'"),
        dws_tests::pg::USER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_schema_newer_than_this_busd() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (mut client, _driver) = connect(&settings(&server.url(), "h1"), "store")
        .await
        .unwrap();
    migrate(&mut client).await.unwrap();
    server.psql("INSERT INTO dws_schema_version (version) VALUES (99)");
    match migrate(&mut client).await {
        Err(PgError::Other(m)) => {
            assert!(m.contains("version 99") && m.contains("upgrade"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        psql_count(&server, "SELECT count(*) FROM dws_schema_version"),
        SCHEMA_VERSION as i64 + 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_has_one_owner_and_a_takeover_fences_the_old_one() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (a, b) = (settings(&server.url(), "a"), settings(&server.url(), "b"));
    let (mut store, _driver) = connect(&b, "store").await.unwrap();
    migrate(&mut store).await.unwrap();

    let lease_a = match LeaseSession::open(&a)
        .await
        .unwrap()
        .try_acquire(quick())
        .await
    {
        Ok(Ok(lease)) => lease,
        other => panic!("a did not win an uncontended lease: {:?}", other.err()),
    };
    assert_eq!(lease_a.epoch(), 1);
    let session_b = LeaseSession::open(&b).await.unwrap();
    let session_b = match session_b.try_acquire(quick()).await.unwrap() {
        Err(back) => back,
        Ok(_) => panic!("two owners at once"),
    };
    assert_eq!(
        server.psql("SELECT owner_host || ' ' || epoch FROM dws_cluster WHERE cluster = 'c1'"),
        "a 1"
    );
    // The lease row names a's lease session, not b's contending one.
    assert_eq!(
        server.psql(
            "SELECT a.application_name FROM dws_cluster c \
             JOIN pg_stat_activity a ON a.pid = c.owner_pid WHERE c.cluster = 'c1'"
        ),
        "busd/c1/a/lease"
    );
    // An append under epoch 1 passes while a owns the lease.
    {
        let tx = store.transaction().await.unwrap();
        check_epoch(&tx, "c1", 1).await.unwrap();
        tx.rollback().await.unwrap();
    }

    // The database ends a's session: a learns it lost the lease, b takes over.
    let waiting_b = tokio::spawn(async move {
        let mut session = session_b;
        loop {
            match session.try_acquire(quick()).await.unwrap() {
                Ok(lease) => return lease,
                Err(back) => session = back,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert_eq!(
        server.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'busd/c1/a/lease'"
        ),
        "t"
    );
    let why = within("a notices its lost lease", lease_a.lost()).await;
    assert!(why.contains("lease session"), "{why}");
    assert!(lease_a.lost_reason().is_some());
    let lease_b = within("b takes over", waiting_b).await.unwrap();
    assert_eq!(lease_b.epoch(), 2);
    assert_eq!(
        server.psql("SELECT owner_host || ' ' || epoch FROM dws_cluster WHERE cluster = 'c1'"),
        "b 2"
    );

    // a's appends are fenced; b's pass.
    let tx = store.transaction().await.unwrap();
    match check_epoch(&tx, "c1", lease_a.epoch()).await {
        Err(PgError::Fenced(m)) => assert!(m.contains("epoch 2"), "{m}"),
        other => panic!("the old owner could append: {other:?}"),
    }
    drop(tx);
    let tx = store.transaction().await.unwrap();
    check_epoch(&tx, "c1", lease_b.epoch()).await.unwrap();
    tx.commit().await.unwrap();

    // A clean release clears the owner and lets the next host in at once.
    lease_b.release().await.unwrap();
    assert_eq!(
        server.psql("SELECT coalesce(owner_host, '-') FROM dws_cluster WHERE cluster = 'c1'"),
        "-"
    );
    let lease_a2 = within(
        "a takes the released lease",
        Lease::acquire_or_wait(&a, quick()),
    )
    .await
    .unwrap();
    assert_eq!(lease_a2.epoch(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_takeover_waits_for_an_append_in_flight() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (a, b) = (settings(&server.url(), "a"), settings(&server.url(), "b"));
    let (mut store, _driver) = connect(&a, "store").await.unwrap();
    migrate(&mut store).await.unwrap();
    let lease_a = Lease::acquire_or_wait(&a, quick()).await.unwrap();
    let tx = store.transaction().await.unwrap();
    check_epoch(&tx, "c1", lease_a.epoch()).await.unwrap();
    // a's session dies while its append is open; b wins the lock at once but
    // its epoch bump waits for the append's row lock.
    drop(lease_a);
    let takeover = tokio::spawn(async move { Lease::acquire_or_wait(&b, quick()).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !takeover.is_finished(),
        "the epoch moved under an open append"
    );
    tx.commit().await.unwrap();
    let lease_b = within("b takes over", takeover).await.unwrap().unwrap();
    assert_eq!(lease_b.epoch(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_is_lost_when_the_server_restarts() {
    let mut server = tokio::task::block_in_place(PgServer::start);
    let a = settings(&server.url(), "a");
    let (mut store, _driver) = connect(&a, "store").await.unwrap();
    migrate(&mut store).await.unwrap();
    let lease = Lease::acquire_or_wait(&a, quick()).await.unwrap();
    tokio::task::block_in_place(|| server.stop());
    let why = within("the lease is lost", lease.lost()).await;
    assert!(why.contains("lease session"), "{why}");
    match LeaseSession::open(&a).await {
        Err(PgError::Unreachable(m)) => assert!(!m.contains(server.password()), "{m}"),
        other => panic!("{:?}", other.err()),
    }
    tokio::task::block_in_place(|| server.start_again());
    // The server restarted since a's session began: another host may not
    // take the unexpired lease, a takes it back.
    let b = settings(&server.url(), "b");
    match LeaseSession::open(&b)
        .await
        .unwrap()
        .try_acquire(quick())
        .await
    {
        Ok(Err(_)) => {}
        _ => panic!("b took a lease whose owner only lost its session to a restart"),
    }
    let again = within(
        "the lease is taken again",
        Lease::acquire_or_wait(&a, quick()),
    )
    .await
    .unwrap();
    assert_eq!(again.epoch(), 2);
}

/// An owner whose lease ran out on the database's clock (here: moved into
/// the past, as a frozen owner's would) is fenced at once, learns it at its
/// next renewal, and a contender takes the lease although the owner's
/// session is alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_expired_lease_fences_its_owner_and_is_taken_over() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (a, b) = (settings(&server.url(), "a"), settings(&server.url(), "b"));
    let (mut store, _driver) = connect(&a, "store").await.unwrap();
    migrate(&mut store).await.unwrap();
    let slow = LeaseTiming {
        heartbeat: Duration::from_secs(3),
        ..quick()
    };
    let lease_a = Lease::acquire_or_wait(&a, slow).await.unwrap();
    let session_b = match LeaseSession::open(&b)
        .await
        .unwrap()
        .try_acquire(quick())
        .await
    {
        Ok(Err(back)) => back,
        _ => panic!("b took a live lease"),
    };
    server.psql(
        "UPDATE dws_cluster SET lease_expires_at = clock_timestamp() - interval '1 second' \
         WHERE cluster = 'c1'",
    );
    let tx = store.transaction().await.unwrap();
    match check_epoch(&tx, "c1", lease_a.epoch()).await {
        Err(PgError::Fenced(m)) => assert!(m.contains("expired"), "{m}"),
        other => panic!("an expired lease could append: {other:?}"),
    }
    drop(tx);
    let lease_b = match session_b.try_acquire(quick()).await {
        Ok(Ok(lease)) => lease,
        _ => panic!("b could not take an expired lease"),
    };
    assert_eq!(lease_b.epoch(), lease_a.epoch() + 1);
    let why = within("a notices its lost lease", lease_a.lost()).await;
    assert!(why.contains("epoch 2"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connect_errors_are_classified_without_the_password() {
    let server = tokio::task::block_in_place(PgServer::start);
    let wrong = server.url_with_password(CANARY);
    match connect(&settings(&wrong, "h1"), "store").await {
        Err(PgError::Auth(m)) => {
            assert!(m.contains("password authentication failed"), "{m}");
            assert!(
                m.contains(&format!("127.0.0.1:{}/dws", server.port())),
                "{m}"
            );
            assert!(!m.contains(CANARY) && !m.contains("postgres://"), "{m}");
        }
        other => panic!("{:?}", other.err()),
    }

    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nobody = format!("postgres://dws:{CANARY}@127.0.0.1:{closed_port}/dws");
    match connect(&settings(&nobody, "h1"), "store").await {
        Err(PgError::Unreachable(m)) => {
            assert!(m.contains("cannot connect") && !m.contains(CANARY), "{m}")
        }
        other => panic!("{:?}", other.err()),
    }

    let garbage = format!("postgres://dws:{CANARY}@127.0.0.1:{closed_port}:x/dws");
    assert!(matches!(
        connect(&settings(&garbage, "h1"), "store").await,
        Err(PgError::Config(m)) if !m.contains(CANARY)
    ));

    let no_db = format!("{}/nosuchdb", server.url().trim_end_matches("/dws"));
    match connect(&settings(&no_db, "h1"), "store").await {
        Err(PgError::Config(m)) => {
            assert!(
                m.contains("does not exist") && !m.contains(server.password()),
                "{m}"
            )
        }
        other => panic!("{:?}", other.err()),
    }

    // A role that may log in but not create tables: migrating is refused as
    // a permission problem (exit 3).
    server.psql(&format!(
        "CREATE ROLE weak LOGIN PASSWORD '{CANARY}'; GRANT CONNECT ON DATABASE dws TO weak;"
    ));
    let weak = server
        .url_with_password(CANARY)
        .replace("://dws:", "://weak:");
    let (mut client, _driver) = connect(&settings(&weak, "h1"), "store").await.unwrap();
    match migrate(&mut client).await {
        Err(PgError::Auth(m)) => {
            assert!(
                m.contains("permission denied") && !m.contains(CANARY),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
}
