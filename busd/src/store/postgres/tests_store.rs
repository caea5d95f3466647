//! Tests of [`super::store::PgStore`] behind the storage boundary, against
//! a real PostgreSQL server per test: plain threads, like the committer.

use std::sync::{
    atomic::{AtomicI64, Ordering},
    Arc,
};

use bytes::Bytes;
use dws_tests::pg::PgServer;

use super::tests::server_settings as settings;
use super::{
    definitions,
    store::{preflight, PgStore, FENCED_PREFIX},
    PgError,
};
use crate::{
    eventlog::LoggedEvent,
    profile::Secret,
    store::{
        ParkedRecord, Recovered, Snapshot, Store, StoreError, SubCounters, SubRecord,
        SNAPSHOT_FORMAT,
    },
};

fn store(server: &PgServer, host: &str, epoch: i64) -> (PgStore, Arc<AtomicI64>) {
    let e = Arc::new(AtomicI64::new(epoch));
    (PgStore::new(settings(server, host), e.clone()), e)
}

fn ev(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "a.b".into(),
        received_at_unix_ms: 5 + seq as i64,
        encoded: Bytes::from(vec![0, 255, seq as u8, 0]).into(),
        scope: "local".into(),
        event_id: format!("id-{seq}").into(),
        ..LoggedEvent::default()
    })
}

fn evs(seqs: std::ops::RangeInclusive<u64>) -> Vec<Arc<LoggedEvent>> {
    seqs.map(ev).collect()
}

fn sub(id: &str, cursor: u64) -> SubRecord {
    SubRecord {
        created_at_unix_ms: 1_700_000_000_000,
        max_sent_seq: cursor + 2,
        gap_lost: 1,
        counters: SubCounters {
            matched: 9,
            delivered: 8,
            acked: 7,
            ..SubCounters::default()
        },
        max_deliver: 3,
        on_poison: "park".into(),
        deliveries: vec![(cursor + 1, 2)],
        parked: vec![ParkedRecord {
            seq: cursor + 3,
            deliveries: 2,
            parked_at_unix_ms: 1_700_000_050_000,
            reason: Some("term: bad input".into()),
        }],
        acked: vec![cursor + 2],
        backoff_ms: vec![1_000, 60_000],
        delayed: vec![(cursor + 1, 1_700_000_100_000)],
        ..SubRecord::for_test(id, "a.*", cursor)
    }
}

fn snapshot(head: u64, subs: Vec<SubRecord>) -> Snapshot {
    Snapshot {
        format: SNAPSHOT_FORMAT,
        clean: false,
        head_seq: head,
        log_floor: 1,
        saved_at_unix_ms: 1_700_000_000_000,
        subscriptions: subs,
    }
}

fn seqs(r: &Recovered) -> Vec<u64> {
    r.events.iter().map(|e| e.seq).collect()
}

fn sub_ids(r: &Recovered) -> Vec<String> {
    r.snapshot
        .iter()
        .flat_map(|s| s.subscriptions.iter().map(|r| r.id.clone()))
        .collect()
}

/// `SELECT … ORDER BY …` as one comma-separated line.
fn rows(server: &PgServer, sql: &str) -> String {
    server.psql(&format!(
        "SELECT coalesce(string_agg(x, ','), '') FROM ({sql}) AS t(x)"
    ))
}

#[test]
fn postgres_store_recovers_its_log_and_snapshot_and_shares_definitions() {
    let server = PgServer::start();
    let (mut a, epoch) = store(&server, "a", 0);
    let r = a.recover().unwrap();
    assert!(r.events.is_empty() && r.snapshot.is_none(), "{r:?}");
    assert_eq!(
        (a.info().kind, a.info().durability),
        ("postgres", "postgres")
    );
    assert!(a.info().path.is_none());

    // Not the owner: refused without touching the database.
    match a.append(&evs(1..=2)) {
        Err(StoreError::Io(m)) => assert!(m.starts_with(FENCED_PREFIX), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.append(&[]), Ok(()));
    server.psql("UPDATE dws_cluster SET epoch = 4, lease_expires_at = now() + interval '1 hour', owner_host = 'a' WHERE cluster = 'c1'");
    epoch.store(4, Ordering::Release);
    a.append(&evs(1..=3)).unwrap();
    a.append(&evs(4..=4)).unwrap();
    let snap = snapshot(4, vec![sub("k1", 2), sub("k2", 0)]);
    a.save(&snap).unwrap();
    // Another epoch took over: the next append stops the bus.
    server.psql("UPDATE dws_cluster SET epoch = 5, lease_expires_at = now() + interval '1 hour' WHERE cluster = 'c1'");
    match a.append(&evs(5..=5)) {
        Err(StoreError::Io(m)) => {
            assert!(m.starts_with(FENCED_PREFIX) && m.contains("epoch 5"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    drop(a);

    // The same host again: its events and its snapshot, exactly.
    let (mut a2, _) = store(&server, "a", 0);
    let r = a2.recover().unwrap();
    assert_eq!(seqs(&r), vec![1, 2, 3, 4]);
    assert_eq!(
        r.events[2].encoded().unwrap(),
        Bytes::from(vec![0, 255, 3, 0])
    );
    assert_eq!(r.events[2].event_id, "id-3");
    assert_eq!(r.snapshot.as_ref(), Some(&snap));
    assert!(r.notes.is_empty(), "{:?}", r.notes);

    // Another host: the same log, the definitions as fresh instances.
    let (mut b, _) = store(&server, "b", 0);
    let r = b.recover().unwrap();
    assert_eq!(seqs(&r), vec![1, 2, 3, 4]);
    let got = r.snapshot.clone().unwrap();
    assert_eq!(sub_ids(&r), vec!["k1", "k2"]);
    let k1 = &got.subscriptions[0];
    assert_eq!(
        k1,
        &sub("k1", 2).instance_for_host(k1.detached_since_unix_ms.unwrap())
    );
    assert_eq!(
        (k1.cursor, k1.max_sent_seq, k1.counters),
        (2, 2, SubCounters::default())
    );
    assert!(k1.deliveries.is_empty() && k1.acked.is_empty());
    assert_eq!((k1.max_deliver, k1.on_poison.as_str()), (3, "park"));
    assert!(r
        .notes
        .iter()
        .any(|n| n.contains("k1") && n.contains("another host")));

    // b saves its instances: two cursors per subscription for status.
    b.save(&snapshot(4, got.subscriptions.clone())).unwrap();
    let (rt, client) = client(&server);
    let cursors = rt
        .block_on(crate::cluster::db::hosts::cursors(&client, "c1"))
        .unwrap();
    let shown: Vec<_> = cursors
        .iter()
        .map(|c| {
            (
                c.subscription.as_str(),
                c.host.as_str(),
                c.cursor,
                c.delivery.as_str(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("k1", "a", 2, "per-host"),
            ("k1", "b", 2, "per-host"),
            ("k2", "a", 0, "per-host"),
            ("k2", "b", 0, "per-host")
        ]
    );
    let defs = rt
        .block_on(definitions::definitions::<SubRecord>(&client, "c1"))
        .unwrap();
    assert_eq!(defs.len(), 2);
    assert_eq!(defs[0].record.counters, SubCounters::default());
    let k2 = rt
        .block_on(definitions::definition::<SubRecord>(&client, "c1", "k2"))
        .unwrap();
    assert_eq!(k2.map(|d| d.record.patterns), Some(vec!["a.*".to_string()]));

    // a drops k1 (an expired copy, an unsubscribe): its cursor goes, the
    // definition stays while b has it, and a's next start does not take
    // it back.
    a2.save(&snapshot(4, vec![sub("k2", 1)])).unwrap();
    assert_eq!(
        rows(
            &server,
            "SELECT subscription || '@' || host FROM dws_cursor ORDER BY 1"
        ),
        "k1@b,k2@a,k2@b"
    );
    assert_eq!(
        rows(&server, "SELECT id FROM dws_subscription ORDER BY 1"),
        "k1,k2"
    );
    drop(a2);
    let (mut a3, _) = store(&server, "a", 0);
    assert_eq!(sub_ids(&a3.recover().unwrap()), vec!["k2"]);
    // b drops it too: the definition goes.
    b.save(&snapshot(4, vec![got.subscriptions[1].clone()]))
        .unwrap();
    assert_eq!(
        rows(&server, "SELECT id FROM dws_subscription ORDER BY 1"),
        "k2"
    );
    assert_eq!(
        server.psql("SELECT cardinality(dropped) FROM dws_host_snapshot WHERE host = 'a'"),
        "1"
    );
    a3.save(&snapshot(4, vec![sub("k2", 1)])).unwrap();
    assert_eq!(
        server.psql("SELECT cardinality(dropped) FROM dws_host_snapshot WHERE host = 'a'"),
        "0",
        "a tombstone goes with its definition"
    );
    // A new host after all that sees only what is left.
    let (mut c, _) = store(&server, "c", 0);
    assert_eq!(sub_ids(&c.recover().unwrap()), vec!["k2"]);
}

/// A runtime and a connection for reading what the store wrote.
fn client(server: &PgServer) -> (tokio::runtime::Runtime, crate::pg::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, driver) = rt
        .block_on(super::connect(&settings(server, "check"), "check"))
        .unwrap();
    // The driver runs whenever the runtime is driven.
    drop(driver);
    (rt, client)
}

#[test]
fn postgres_store_releases_only_as_the_owner_and_keeps_the_head() {
    let server = PgServer::start();
    let (mut a, epoch) = store(&server, "a", 0);
    a.recover().unwrap();
    server.psql("UPDATE dws_cluster SET epoch = 1, lease_expires_at = now() + interval '1 hour' WHERE cluster = 'c1'");
    epoch.store(1, Ordering::Release);
    a.append(&evs(1..=10)).unwrap();
    a.release_below(4).unwrap();
    assert_eq!(server.psql("SELECT min(seq) FROM dws_event"), "4");
    // A follower releases nothing (its retention is not the cluster's).
    let (mut b, _) = store(&server, "b", 0);
    b.recover().unwrap();
    b.release_below(9).unwrap();
    assert_eq!(server.psql("SELECT min(seq) FROM dws_event"), "4");
    // Everything released: the head event stays, so a restart knows the head.
    a.release_below(11).unwrap();
    let (mut a2, _) = store(&server, "a", 0);
    let r = a2.recover().unwrap();
    assert_eq!(seqs(&r), vec![10]);
    // Should the head's event vanish anyway, the head survives in the snapshot.
    server.psql("DELETE FROM dws_event");
    let (mut a3, _) = store(&server, "a", 0);
    let r = a3.recover().unwrap();
    assert!(r.events.is_empty());
    assert_eq!(r.snapshot.map(|s| s.head_seq), Some(10));
    assert!(
        r.notes.iter().any(|n| n.contains("head is seq 10")),
        "{:?}",
        r.notes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_works_inside_a_runtime_and_reconnects() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (mut a, epoch) = store(&server, "a", 0);
    // busd calls recover and the first save from its start-up task.
    a.recover().unwrap();
    a.save(&snapshot(0, vec![sub("k", 0)])).unwrap();
    server.psql("UPDATE dws_cluster SET epoch = 2, lease_expires_at = now() + interval '1 hour' WHERE cluster = 'c1'");
    epoch.store(2, Ordering::Release);
    a.append(&evs(1..=1)).unwrap();
    // The database ends the store's session while it is idle: the next
    // call notices and connects again.
    assert_eq!(
        server.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'busd/c1/a/store'"
        ),
        "1"
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut tries = 0;
    while let Err(e) = a.append(&evs(2..=2)) {
        tries += 1;
        assert!(tries < 2, "no reconnect: {e}");
    }
    assert_eq!(
        tries, 0,
        "the broken idle session was not replaced within the call"
    );
    // The server restarts: the call that hits the stopped server fails,
    // the next one after the restart succeeds.
    let mut server = server;
    tokio::task::block_in_place(|| server.stop());
    match a.append(&evs(3..=3)) {
        Err(StoreError::Io(m)) => assert!(!m.contains(server.password()), "{m}"),
        other => panic!("{other:?}"),
    }
    tokio::task::block_in_place(|| server.start_again());
    a.append(&evs(3..=3)).unwrap();
    assert_eq!(server.psql("SELECT max(seq) FROM dws_event"), "3");
    // Dropping the store inside a runtime must not panic.
    drop(a);
}

#[test]
fn postgres_store_refuses_a_newer_schema_and_preflight_classifies() {
    let server = PgServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(preflight(&settings(&server, "a"))).unwrap();
    assert_eq!(server.psql("SELECT count(*) FROM dws_cluster"), "1");
    let mut wrong = settings(&server, "a");
    wrong.url = Secret::new(server.url_with_password("nope"));
    assert!(matches!(
        rt.block_on(preflight(&wrong)),
        Err(PgError::Auth(_))
    ));
    let (mut a, _) = store(&server, "a", 0);
    a.recover().unwrap();

    server.psql("INSERT INTO dws_schema_version (version) VALUES (99)");
    let (mut b, _) = store(&server, "b", 0);
    match b.recover() {
        Err(StoreError::Refused(m)) => assert!(m.contains("version 99"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A snapshot this busd cannot read is refused, not overwritten.
    server.psql("DELETE FROM dws_schema_version WHERE version = 99");
    server.psql(
        "INSERT INTO dws_host_snapshot (cluster, host, snapshot) VALUES ('c1', 'a', '{\"format\": 7}') \
         ON CONFLICT DO NOTHING",
    );
    match store(&server, "a", 0).0.recover() {
        Err(StoreError::Refused(m)) => assert!(m.contains("host a"), "{m}"),
        other => panic!("{other:?}"),
    }
}
