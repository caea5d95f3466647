//! Tests of the cluster's log, inbox, hosts and notifications against a
//! real PostgreSQL server per test (`dws_tests::pg::PgServer`).

use std::{sync::Arc, time::Duration};

use crate::pg::Client;
use bytes::Bytes;
use dws_tests::pg::PgServer;

use super::tests::{quick, server_settings as settings, within};
use super::{
    connect, definitions, listen,
    log::{self, ClusterRow},
    schema::migrate,
    Driver, PgError,
};
use crate::{
    cluster::db::{
        hosts,
        inbox::{self, InboxResult},
        lease::Lease,
    },
    eventlog::{LoggedEvent, NewEvent},
    store::SubRecord,
};

/// A migrated connection of host `host`.
async fn store_conn(server: &PgServer, host: &str) -> (Client, Driver) {
    let (mut client, driver) = connect(&settings(server, host), "store").await.unwrap();
    migrate(&mut client).await.unwrap();
    (client, driver)
}

/// An event whose encoded bytes hold every byte value (zeros included).
fn ev(seq: u64, scope: &str, id: &str) -> Arc<LoggedEvent> {
    let mut encoded: Vec<u8> = (0..=255u8).collect();
    encoded.extend_from_slice(&seq.to_le_bytes());
    Arc::new(LoggedEvent {
        seq,
        event_type: "a.b".into(),
        received_at_unix_ms: 1_700_000_000_000 + seq as i64,
        encoded: Bytes::from(encoded).into(),
        scope: scope.into(),
        event_id: id.into(),
        route: if seq.is_multiple_of(2) {
            "up-1".into()
        } else {
            "".into()
        },
        ..LoggedEvent::default()
    })
}

fn evs(seqs: std::ops::RangeInclusive<u64>, tag: &str) -> Vec<Arc<LoggedEvent>> {
    seqs.map(|s| ev(s, "local", &format!("{tag}-{s}")))
        .collect()
}

fn other(r: Result<u64, PgError>) -> String {
    match r {
        Err(PgError::Other(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_log_round_trip_gaps_and_dedup() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (mut c, _d) = store_conn(&server, "a").await;
    let row = log::cluster_row(&c, "c1").await.unwrap();
    assert_eq!(
        row,
        ClusterRow {
            head_seq: 0,
            epoch: 0,
            owner_host: None,
            owner_since_unix_ms: None
        }
    );
    // Nobody holds the lease: epoch 0 is nobody's.
    match log::append(&mut c, "c1", 0, &evs(1..=1, "x")).await {
        Err(PgError::Fenced(_)) => {}
        other => panic!("{other:?}"),
    }
    let lease = Lease::acquire_or_wait(&settings(&server, "a"), quick())
        .await
        .unwrap();
    let epoch = lease.epoch();
    let batch = evs(1..=3, "x");
    assert_eq!(log::append(&mut c, "c1", epoch, &batch).await, Ok(3));
    let back = log::read_after(&c, "c1", 0, 100).await.unwrap();
    assert_eq!(back.len(), 3);
    for (r, e) in back.iter().zip(&batch) {
        assert_eq!(
            (r.seq, r.received_at_unix_ms, &r.scope, &r.event_id),
            (
                e.seq,
                e.received_at_unix_ms,
                &e.scope.to_string(),
                &e.event_id.to_string()
            )
        );
        let (t, route) = (e.event_type.to_string(), e.route.to_string());
        assert_eq!((&r.event_type, &r.route), (&t, &route));
        assert_eq!(r.encoded, e.encoded().unwrap().to_vec(), "seq {}", r.seq);
    }
    let page = log::read_after(&c, "c1", 1, 1).await.unwrap();
    assert_eq!(page.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![2]);
    let row = log::cluster_row(&c, "c1").await.unwrap();
    assert_eq!((row.head_seq, row.epoch), (3, epoch));
    assert_eq!(row.owner_host.as_deref(), Some("a"));
    assert!(row
        .owner_since_unix_ms
        .is_some_and(|ms| ms > 1_600_000_000_000));

    // A gap, an overlap, a batch that skips inside: refused, nothing written.
    let m = other(log::append(&mut c, "c1", epoch, &evs(5..=5, "x")).await);
    assert!(
        m.contains("starts at seq 5") && m.contains("ends at 3"),
        "{m}"
    );
    other(log::append(&mut c, "c1", epoch, &evs(3..=4, "x")).await);
    let skipping = vec![ev(4, "local", "s4"), ev(6, "local", "s6")];
    let m = other(log::append(&mut c, "c1", epoch, &skipping).await);
    assert!(m.contains("not consecutive"), "{m}");
    // A retained event id of the same scope: refused by the log itself.
    let m = other(log::append(&mut c, "c1", epoch, &[ev(4, "local", "x-2")]).await);
    assert!(m.contains("already in the log") && m.contains("x-2"), "{m}");
    assert_eq!(log::cluster_row(&c, "c1").await.unwrap().head_seq, 3);
    assert_eq!(server.psql("SELECT count(*) FROM dws_event"), "3");
    // The same id in another scope, or without a scope, is another event.
    let fine = vec![ev(4, "other", "x-2"), ev(5, "", "x-2"), ev(6, "", "x-2")];
    assert_eq!(log::append(&mut c, "c1", epoch, &fine).await, Ok(6));
    assert_eq!(log::append(&mut c, "c1", epoch, &[]).await, Ok(6));
    // Another cluster in the same database has its own log.
    assert_eq!(log::cluster_row(&c, "c2").await.unwrap().head_seq, 0);
    assert!(log::read_after(&c, "c2", 0, 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_log_a_takeover_fences_the_old_owner_even_mid_race() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (mut ca, _da) = store_conn(&server, "a").await;
    let (cb, _db) = connect(&settings(&server, "b"), "store").await.unwrap();
    let lease_a = Lease::acquire_or_wait(&settings(&server, "a"), quick())
        .await
        .unwrap();
    let old = lease_a.epoch();
    assert_eq!(
        log::append(&mut ca, "c1", old, &evs(1..=2, "a")).await,
        Ok(2)
    );
    drop(lease_a);
    let lease_b = within(
        "b takes over",
        Lease::acquire_or_wait(&settings(&server, "b"), quick()),
    )
    .await
    .unwrap();
    let new = lease_b.epoch();
    assert!(new > old);
    match log::append(&mut ca, "c1", old, &evs(3..=3, "a")).await {
        Err(PgError::Fenced(m)) => assert!(m.contains(&format!("epoch {new}")), "{m}"),
        other => panic!("the old owner appended: {other:?}"),
    }
    // Both append as fast as they can, each continuing the log it reads:
    // only the current epoch's appends land, and the log stays gapless.
    let race = |mut c: Client, epoch: i64, tag: &'static str| async move {
        let (mut ok, mut fenced) = (0, 0);
        for _ in 0..20 {
            let head = log::cluster_row(&c, "c1").await.unwrap().head_seq;
            match log::append(&mut c, "c1", epoch, &evs(head + 1..=head + 2, tag)).await {
                Ok(_) => ok += 1,
                Err(PgError::Fenced(_)) => fenced += 1,
                // Lost the race for head + 1 to the other appender.
                Err(PgError::Other(m)) if m.contains("starts at seq") => {}
                Err(e) => panic!("{tag}: {e:?}"),
            }
        }
        (ok, fenced)
    };
    let (a, b) = tokio::join!(
        tokio::spawn(race(ca, old, "a")),
        tokio::spawn(race(cb, new, "b"))
    );
    assert_eq!(a.unwrap(), (0, 20));
    assert_eq!(b.unwrap(), (20, 0));
    let (check, _d) = connect(&settings(&server, "c"), "check").await.unwrap();
    let all = log::read_after(&check, "c1", 0, 1000).await.unwrap();
    assert_eq!(all.len(), 42);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1);
        assert!(i < 2 || r.event_id.starts_with("b-"), "{}", r.event_id);
    }
    // The unused fence of the other cluster API path: appends under a
    // missing cluster row are fenced too.
    let (mut cc, _dc) = connect(&settings(&server, "c"), "x").await.unwrap();
    assert!(matches!(
        log::append(&mut cc, "nosuch", new, &evs(1..=1, "c")).await,
        Err(PgError::Fenced(m)) if m.contains("gone")
    ));
    drop(lease_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_log_delete_below_works_in_batches_and_keeps_the_head() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (mut c, _d) = store_conn(&server, "a").await;
    log::cluster_row(&c, "c1").await.unwrap();
    server.psql("UPDATE dws_cluster SET epoch = 7, lease_expires_at = now() + interval '1 hour' WHERE cluster = 'c1'");
    let n = 2 * log::DELETE_BATCH as u64 + 500;
    let batch: Vec<_> = (1..=n)
        .map(|s| {
            Arc::new(LoggedEvent {
                seq: s,
                event_type: "t".into(),
                event_id: format!("g-{s}").into(),
                encoded: Bytes::from_static(b"\x00x").into(),
                ..LoggedEvent::default()
            })
        })
        .collect();
    assert_eq!(log::append(&mut c, "c1", 7, &batch).await, Ok(n));
    let cut = 2 * log::DELETE_BATCH as u64 + 1;
    assert_eq!(log::delete_below(&c, "c1", cut).await, Ok(cut - 1));
    let first = log::read_after(&c, "c1", 0, 1).await.unwrap();
    assert_eq!(first[0].seq, cut);
    // Everything released: the newest event stays, carrying the head.
    assert_eq!(log::delete_below(&c, "c1", n + 100).await, Ok(n - cut));
    let left = log::read_after(&c, "c1", 0, 10).await.unwrap();
    assert_eq!(left.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![n]);
    assert_eq!(log::delete_below(&c, "c1", n + 100).await, Ok(0));
}

fn new_event(i: usize) -> NewEvent {
    NewEvent {
        scope: "local".into(),
        event_id: if i.is_multiple_of(2) {
            format!("p-{i}")
        } else {
            String::new()
        },
        event_type: "in.box".into(),
        data: format!("payload {i} with a NUL \u{0} and ünïcødé"),
        headers: [("h".to_string(), format!("v{i}"))].into_iter().collect(),
        ..NewEvent::default()
    }
}

fn done(seq: u64) -> InboxResult {
    InboxResult {
        seq,
        duplicate: false,
        event_id: format!("e-{seq}"),
        error: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inbox_rows_are_taken_once_finished_and_retaken_after_a_takeover() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (pusher, _dp) = store_conn(&server, "b").await;
    let lease_a = Lease::acquire_or_wait(&settings(&server, "a"), quick())
        .await
        .unwrap();
    let epoch = lease_a.epoch();
    let mut ids = vec![];
    for i in 0..60 {
        ids.push(
            inbox::push(&pusher, "c1", "b", &format!("k{i}"), &new_event(i))
                .await
                .unwrap(),
        );
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(inbox::result(&pusher, "c1", ids[0]).await, Ok(None));
    assert!(inbox::result(&pusher, "c1", -5).await.is_err());

    // Two takers at once: every row once, oldest first within a take.
    let taker = |mut c: Client| async move {
        let mut got = vec![];
        loop {
            let batch = inbox::take(&mut c, "c1", epoch, 7, false).await.unwrap();
            if batch.is_empty() {
                return (c, got);
            }
            assert!(batch.windows(2).all(|w| w[0].0 < w[1].0));
            got.extend(batch);
        }
    };
    let (c1, _d1) = connect(&settings(&server, "a"), "t1").await.unwrap();
    let (c2, _d2) = connect(&settings(&server, "a"), "t2").await.unwrap();
    let (r1, r2) = tokio::join!(tokio::spawn(taker(c1)), tokio::spawn(taker(c2)));
    let ((mut c1, got1), (_c2, got2)) = (r1.unwrap(), r2.unwrap());
    let mut all: Vec<i64> = got1.iter().chain(&got2).map(|(id, _, _)| *id).collect();
    all.sort();
    assert_eq!(all, ids, "each row exactly once");
    for (id, key, ev) in got1.iter().chain(&got2) {
        let i = ids.iter().position(|x| x == id).unwrap();
        assert_eq!(key.as_deref(), Some(format!("k{i}").as_str()));
        assert_eq!(ev.data, new_event(i).data);
        assert_eq!(ev.headers, new_event(i).headers);
        assert_eq!(ev.event_id, new_event(i).event_id);
    }

    // Finish the first ten; a second finish does not overwrite.
    let first: Vec<(i64, InboxResult)> = ids[..10]
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, done(i as u64 + 1)))
        .collect();
    assert_eq!(inbox::finish(&c1, "c1", &first).await, Ok(10));
    assert_eq!(inbox::finish(&c1, "c1", &[(ids[0], done(99))]).await, Ok(0));
    let refused = InboxResult {
        seq: 0,
        duplicate: false,
        event_id: String::new(),
        error: Some("too large".into()),
    };
    assert_eq!(
        inbox::finish(&c1, "c1", &[(ids[10], refused.clone())]).await,
        Ok(1)
    );
    assert_eq!(
        inbox::result(&pusher, "c1", ids[0]).await,
        Ok(Some(done(1)))
    );
    assert_eq!(
        inbox::result(&pusher, "c1", ids[10]).await,
        Ok(Some(refused))
    );
    let some = inbox::results(&pusher, "c1", &[ids[1], ids[20], -1])
        .await
        .unwrap();
    assert_eq!(some, vec![(ids[1], Some(done(2))), (ids[20], None)]);

    // The owner dies with 49 rows taken and not finished: a wrong epoch
    // takes nothing, the next owner takes them all again.
    assert!(matches!(
        inbox::take(&mut c1, "c1", epoch + 1, 100, false).await,
        Err(PgError::Fenced(_))
    ));
    drop(lease_a);
    let lease_b = within(
        "b takes over",
        Lease::acquire_or_wait(&settings(&server, "b"), quick()),
    )
    .await
    .unwrap();
    let (mut cb, _db) = connect(&settings(&server, "b"), "owner").await.unwrap();
    let again = inbox::take(&mut cb, "c1", lease_b.epoch(), 100, false)
        .await
        .unwrap();
    let again: Vec<i64> = again.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(again, ids[11..].to_vec());
    // Not again under the same epoch, unless asked (a new session of the
    // same owner takes what its broken one did not finish).
    assert!(inbox::take(&mut cb, "c1", lease_b.epoch(), 100, false)
        .await
        .unwrap()
        .is_empty());
    let retaken = inbox::take(&mut cb, "c1", lease_b.epoch(), 100, true)
        .await
        .unwrap();
    assert_eq!(retaken.len(), ids[11..].len());
    // A push is idempotent by key; a taken row cannot be withdrawn, an
    // untaken one can, and a withdrawn key is absent.
    assert_eq!(
        inbox::push(&pusher, "c1", "b", "k20", &new_event(20)).await,
        Ok(ids[20])
    );
    assert_eq!(
        inbox::withdraw(&pusher, "c1", "k20").await,
        Ok(inbox::Withdrawal::Taken)
    );
    let fresh = inbox::push(&pusher, "c1", "b", "k-new", &new_event(1))
        .await
        .unwrap();
    assert!(fresh > ids[59]);
    assert_eq!(
        inbox::withdraw(&pusher, "c1", "k-new").await,
        Ok(inbox::Withdrawal::Withdrawn)
    );
    assert_eq!(
        inbox::withdraw(&pusher, "c1", "k-new").await,
        Ok(inbox::Withdrawal::Absent)
    );
    assert!(matches!(
        inbox::take(&mut c1, "c1", epoch, 100, false).await,
        Err(PgError::Fenced(_))
    ));

    // A row the owner cannot read is finished with the reason, not returned.
    server.psql(
        "INSERT INTO dws_inbox (cluster, host, event) \
         VALUES ('c1', 'b', '{\"bogus\": 1, \"data\": 5}')",
    );
    assert!(inbox::take(&mut cb, "c1", lease_b.epoch(), 100, false)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        server.psql("SELECT error LIKE 'the owner cannot read%' FROM dws_inbox WHERE event::text LIKE '%bogus%'"),
        "t"
    );
    assert_eq!(
        inbox::purge_done(&cb, "c1", Duration::from_secs(3600)).await,
        Ok(0)
    );
    assert_eq!(inbox::purge_done(&cb, "c1", Duration::ZERO).await, Ok(12));
    assert!(inbox::result(&pusher, "c1", ids[0]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_listen_gets_the_log_and_inbox_notifications() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (mut c, _d) = store_conn(&server, "a").await;
    let s = settings(&server, "b");
    assert!(matches!(
        listen(&s, "tail", &["dws_log; DROP TABLE x"]).await,
        Err(PgError::Other(_))
    ));
    let (_client, _driver, mut rx) = listen(
        &s,
        "tail",
        &[log::LOG_CHANNEL, inbox::DONE_CHANNEL, inbox::PUSH_CHANNEL],
    )
    .await
    .unwrap();
    log::cluster_row(&c, "c1").await.unwrap();
    server.psql("UPDATE dws_cluster SET epoch = 3, lease_expires_at = now() + interval '1 hour' WHERE cluster = 'c1'");
    log::append(&mut c, "c1", 3, &evs(1..=4, "n"))
        .await
        .unwrap();
    let payload = within("the log's notify", rx.recv()).await.unwrap();
    assert_eq!(payload, "c1:4");
    assert_eq!(log::parse_notify(&payload, "c1"), Some(4));
    assert_eq!(log::parse_notify(&payload, "c"), None);
    // One notification per batch, not per row.
    log::append(&mut c, "c1", 3, &evs(5..=5, "n"))
        .await
        .unwrap();
    assert_eq!(within("next", rx.recv()).await.unwrap(), "c1:5");

    let id = inbox::push(&c, "c1", "b", "k1", &new_event(1))
        .await
        .unwrap();
    assert_eq!(within("push", rx.recv()).await.unwrap(), "c1");
    inbox::finish(&c, "c1", &[(id, done(6))]).await.unwrap();
    assert_eq!(within("finish", rx.recv()).await.unwrap(), "c1");
    assert!(rx.try_recv().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_hosts_register_beat_and_leave() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (c, _d) = store_conn(&server, "a").await;
    hosts::register(&c, "c1", "b", 22, "build-b", "i-b")
        .await
        .unwrap();
    hosts::register(&c, "c1", "a", 11, "build-a", "i-a")
        .await
        .unwrap();
    hosts::register(&c, "c2", "z", 1, "other cluster", "i-z")
        .await
        .unwrap();
    server.psql("UPDATE dws_host SET heartbeat_at = now() - interval '5 s' WHERE host = 'a'");
    let list = hosts::list(&c, "c1").await.unwrap();
    assert_eq!(
        list.iter()
            .map(|h| (h.host.as_str(), h.pid, h.build.as_str()))
            .collect::<Vec<_>>(),
        vec![("a", 11, "build-a"), ("b", 22, "build-b")]
    );
    assert!(list[0].heartbeat_age_ms >= 4_900, "{:?}", list[0]);
    assert!(list[1].heartbeat_age_ms < 4_900, "{:?}", list[1]);
    assert!(list[0].started_at_unix_ms > 1_600_000_000_000);
    assert_eq!(hosts::heartbeat(&c, "c1", "a").await, Ok(true));
    assert!(hosts::list(&c, "c1").await.unwrap()[0].heartbeat_age_ms < 4_900);
    // A restart replaces the row.
    hosts::register(&c, "c1", "a", 12, "build-a2", "i-a2")
        .await
        .unwrap();
    assert_eq!(hosts::list(&c, "c1").await.unwrap()[0].pid, 12);
    hosts::unregister(&c, "c1", "a").await.unwrap();
    assert_eq!(hosts::heartbeat(&c, "c1", "a").await, Ok(false));
    let left: Vec<String> = hosts::list(&c, "c1")
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.host)
        .collect();
    assert_eq!(left, vec!["b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retention_is_held_by_per_host_cursors_and_parked_events_not_shared_ones() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (c, _d) = store_conn(&server, "a").await;
    log::cluster_row(&c, "c1").await.unwrap();
    assert_eq!(log::held_from(&c, "c1").await, Ok((0, None)));
    server.psql(
        "UPDATE dws_cluster SET head_seq = 300 WHERE cluster = 'c1';
         INSERT INTO dws_subscription (cluster, id, delivery, record) VALUES
           ('c1', 'p', 'per-host', '{}'), ('c1', 's', 'shared', '{}');
         INSERT INTO dws_cursor (cluster, subscription, host, record) VALUES
           ('c1', 'p', 'a', '{\"cursor\": 250, \"parked\": []}'),
           ('c1', 'p', 'b', '{\"cursor\": 40, \"parked\": [{\"seq\": 7}]}'),
           ('c1', 's', 'a', '{\"cursor\": 1, \"parked\": [{\"seq\": 1}]}')",
    );
    assert_eq!(log::held_from(&c, "c1").await, Ok((300, Some(7))));
    server.psql("DELETE FROM dws_cursor WHERE host = 'b'");
    assert_eq!(log::held_from(&c, "c1").await, Ok((300, Some(251))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_definition_has_one_winner_and_is_given_back_only_while_nobody_holds_it() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (c, _d) = store_conn(&server, "a").await;
    let (c2, _d2) = store_conn(&server, "b").await;
    log::cluster_row(&c, "c1").await.unwrap();
    let rec = |key: &str| {
        let mut r: crate::store::SubRecord = serde_json::from_value(serde_json::json!({
            "id": "k", "patterns": [key], "filter": "", "ttl_ms": 1000,
            "created_at_unix_ms": 0, "upstream_id": null, "cursor": 0, "pinned": [],
            "max_sent_seq": 0, "gap_lost": 0, "detached_since_unix_ms": null,
            "counters": {"matched": 0, "delivered": 0, "acked": 0, "redelivered": 0, "lost": 0},
            "max_deliver": 0, "on_poison": "halt", "state": "active", "halt": null,
            "deliveries": [], "parked": [], "acked": [], "shared": false
        }))
        .unwrap();
        r.patterns = vec![key.into()];
        serde_json::to_string(&r).unwrap()
    };
    let (ra, rb) = (rec("a.*"), rec("b.*"));
    let (wa, wb) = tokio::join!(
        definitions::claim_definition::<SubRecord>(&c, "c1", "k", false, &ra),
        definitions::claim_definition::<SubRecord>(&c2, "c1", "k", false, &rb)
    );
    let ((ia, da), (ib, db)) = (wa.unwrap(), wb.unwrap());
    assert!(ia != ib, "exactly one inserted");
    assert_eq!(da, db, "both read the winner's definition");
    server.psql(
        "INSERT INTO dws_cursor (cluster, subscription, host, record) \
         VALUES ('c1', 'k', 'a', '{\"cursor\": 0}')",
    );
    definitions::release_definition(&c, "c1", "k")
        .await
        .unwrap();
    assert!(
        definitions::definition::<SubRecord>(&c, "c1", "k")
            .await
            .unwrap()
            .is_some(),
        "held"
    );
    server.psql("DELETE FROM dws_cursor");
    definitions::release_definition(&c, "c1", "k")
        .await
        .unwrap();
    assert!(definitions::definition::<SubRecord>(&c, "c1", "k")
        .await
        .unwrap()
        .is_none());
}
