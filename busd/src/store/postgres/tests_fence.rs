//! Tests of the fences under the faults that hide from them (issue 35): a
//! lease that expires while an append waits for the cluster row's lock
//! (another session holds it `FOR UPDATE`), and a store session whose path
//! to the server is black-holed (a [`Proxy`] in between, so TCP sees
//! nothing wrong) — every statement must give up within its bound.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use dws_tests::{pg::PgServer, proxy::Proxy};

use super::tests::{quick, server_settings as settings, settings as url_settings, within};
use super::{connect, fence::check_epoch, log, schema::migrate, PgError, STATEMENT_BOUND};
use crate::{
    cluster::db::lease::{Lease, LeaseTiming},
    eventlog::LoggedEvent,
};

fn ev(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "a.b".into(),
        received_at_unix_ms: 1_700_000_000_000,
        encoded: Bytes::from_static(b"x").into(),
        scope: "local".into(),
        event_id: format!("e-{seq}").into(),
        ..LoggedEvent::default()
    })
}

/// A lease of 2 s that is never renewed after it was taken.
fn unrenewed() -> LeaseTiming {
    LeaseTiming {
        heartbeat: Duration::from_secs(600),
        answer_within: Duration::from_secs(600),
        bound: Duration::from_secs(2),
        ..quick()
    }
}

/// Another session holds the cluster's row `FOR UPDATE` past the lease's
/// expiry; the append queued behind it must see the expiry once it has the
/// lock, and commit nothing (before the fix it read the clock before the
/// wait and committed after the lease ran out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_append_granted_the_row_lock_after_the_lease_expired_commits_nothing() {
    let server = tokio::task::block_in_place(PgServer::start);
    let a = settings(&server, "a");
    let (mut store, _d) = connect(&a, "store").await.unwrap();
    migrate(&mut store).await.unwrap();
    let lease = Lease::acquire_or_wait(&a, unrenewed()).await.unwrap();
    let epoch = lease.epoch();
    assert_eq!(log::append(&mut store, "c1", epoch, &[ev(1)]).await, Ok(1));
    let (mut holder, _h) = connect(&a, "holder").await.unwrap();
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM dws_cluster WHERE cluster = 'c1' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let append = tokio::spawn(async move { log::append(&mut store, "c1", epoch, &[ev(2)]).await });
    // Past the 2 s lease, with the append queued on the lock.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !append.is_finished(),
        "the append did not wait for the lock"
    );
    tx.rollback().await.unwrap();
    match within("the queued append", append).await.unwrap() {
        Err(PgError::Unreachable(m)) => assert!(m.contains("expired"), "{m}"),
        other => panic!("an append committed under an expired lease: {other:?}"),
    }
    assert_eq!(server.psql("SELECT max(seq) FROM dws_event"), "1");

    // Every other owner's write checks the same way (`check_epoch`).
    let (mut c2, _d2) = connect(&a, "other").await.unwrap();
    let lease2 = {
        drop(lease);
        Lease::acquire_or_wait(&a, unrenewed()).await.unwrap()
    };
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM dws_cluster WHERE cluster = 'c1' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let e2 = lease2.epoch();
    let check = tokio::spawn(async move {
        let t = c2.transaction().await.unwrap();
        check_epoch(&t, "c1", e2).await
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    tx.rollback().await.unwrap();
    match within("the queued check", check).await.unwrap() {
        Err(PgError::Fenced(m)) => assert!(m.contains("expired"), "{m}"),
        other => panic!("an owner's write passed an expired lease: {other:?}"),
    }
}

/// The committer's append through a black-holed path gives up within its
/// bound (an outage, retried by the caller), and a contender's lease
/// statement too; after the heal the same calls work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statements_on_a_black_holed_path_give_up_within_their_bound() {
    let server = tokio::task::block_in_place(PgServer::start);
    let proxy = Proxy::start(server.port());
    let a = url_settings(&proxy.url(&server.url()), "a");
    let (mut store, _d) = connect(&a, "store").await.unwrap();
    migrate(&mut store).await.unwrap();
    let lease = Lease::acquire_or_wait(&a, quick()).await.unwrap();
    let epoch = lease.epoch();
    assert_eq!(log::append(&mut store, "c1", epoch, &[ev(1)]).await, Ok(1));
    proxy.black_hole();
    let started = Instant::now();
    let r = log::append(&mut store, "c1", epoch, &[ev(2)]).await;
    let took = started.elapsed();
    assert!(
        matches!(&r, Err(PgError::Unreachable(m)) if m.contains("did not answer")),
        "{r:?}"
    );
    assert!(
        took < STATEMENT_BOUND + Duration::from_secs(3),
        "the append gave up only after {took:?}"
    );
    let lost = within("the lease is lost", lease.lost()).await;
    assert!(lost.contains("did not answer"), "{lost}");
    let started = Instant::now();
    let r = log::cluster_row(&store, "c1").await;
    assert!(matches!(r, Err(PgError::Unreachable(_))), "{r:?}");
    assert!(started.elapsed() < STATEMENT_BOUND + Duration::from_secs(3));
    proxy.heal();
    let (mut again, _d2) = connect(&a, "store").await.unwrap();
    let row = log::cluster_row(&again, "c1").await.unwrap();
    assert_eq!(
        row.head_seq, 1,
        "the append that timed out committed nothing"
    );
    assert_eq!(log::read_after(&again, "c1", 0, 10).await.unwrap().len(), 1);
    drop(again.transaction().await.unwrap());
}

/// An event whose id was generated (`<bus start ms>-<seq>`) as host `b`
/// appends it, with its own payload and receive time.
fn generated(seq: u64, data: &'static [u8], received: i64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "f.ev".into(),
        received_at_unix_ms: received,
        encoded: Bytes::from_static(data).into(),
        scope: "".into(),
        event_id: format!("1796663550000-{seq}").into(),
        ..LoggedEvent::default()
    })
}

/// Issue 50: host a's append of an id-less publish lost its answer; host b
/// took the lease and appended its own id-less publish at the same seq,
/// and both buses started in the same millisecond, so both generated the
/// same event id. Settling a's batch must not take b's row for it (before
/// the fix it did, and a's publisher was told "seq N" for an event the log
/// does not hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lost_answer_is_not_settled_by_another_owners_row_with_the_same_id() {
    let server = tokio::task::block_in_place(PgServer::start);
    let b = settings(&server, "b");
    let (mut store, _d) = connect(&b, "store").await.unwrap();
    migrate(&mut store).await.unwrap();
    let lease = Lease::acquire_or_wait(&b, quick()).await.unwrap();
    let theirs = generated(1, b"{\"t\":\"b-60\"}", 1_796_663_581_001);
    assert_eq!(
        log::append(
            &mut store,
            "c1",
            lease.epoch(),
            std::slice::from_ref(&theirs)
        )
        .await,
        Ok(1)
    );
    let a = settings(&server, "a");
    let mut conn = None;
    let deadline = Instant::now() + Duration::from_secs(5);
    let fenced = PgError::Fenced("another host took the lease".into());
    let ours = generated(1, b"{\"t\":\"a-124\"}", 1_796_663_580_990);
    let settled = within(
        "settling a's batch",
        super::append::settle(&mut conn, &a, &[ours], true, deadline, fenced.clone()),
    )
    .await;
    assert_eq!(
        settled,
        Err(fenced.clone()),
        "a's publish was answered with b's row at seq 1"
    );
    // The batch that is in the log byte for byte is found.
    let settled = within(
        "settling b's batch",
        super::append::settle(&mut conn, &a, &[theirs], true, deadline, fenced),
    )
    .await;
    assert_eq!(settled, Ok(()));
}
