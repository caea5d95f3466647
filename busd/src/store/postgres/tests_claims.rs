//! Tests of shared delivery's claims (`claims`) against a real PostgreSQL
//! server: claims belong to an incarnation (a later run of the same host
//! does not renew them), only held claims are renewed, an ack is done
//! whoever holds the claim, and an event lost to retention is reported
//! once.

use std::{collections::BTreeMap, time::Duration};

use dws_tests::pg::PgServer;

use super::tests::server_settings as settings;
use super::{connect, schema::migrate};
use crate::cluster::db::claims::{self, Claimer};

const HOLD: Duration = Duration::from_secs(60);

fn who<'a>(host: &'a str, incarnation: &'a str) -> Claimer<'a> {
    Claimer {
        cluster: "c1",
        host,
        incarnation,
    }
}

fn held(sub: &str, seqs: &[u64]) -> BTreeMap<String, Vec<u64>> {
    BTreeMap::from([(sub.to_owned(), seqs.to_vec())])
}

/// Every claim past its end, as if its holder stopped renewing long ago.
fn expire_all(server: &PgServer) {
    server.psql("UPDATE dws_claim SET claimed_until = now() - interval '1 minute'");
}

async fn setup(server: &PgServer) -> (crate::pg::Client, super::Driver) {
    let (mut c, d) = connect(&settings(server, "a"), "store").await.unwrap();
    migrate(&mut c).await.unwrap();
    server.psql(
        "INSERT INTO dws_subscription (cluster, id, delivery, record) \
         VALUES ('c1', 'w', 'shared', '{}')",
    );
    (c, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_belong_to_an_incarnation_and_only_held_ones_are_renewed() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (c, _d) = setup(&server).await;
    let (old, new, other) = (who("a", "run-1"), who("a", "run-2"), who("b", "run-b"));
    let got = claims::claim(&c, old, "w", &[1, 2, 3], HOLD).await.unwrap();
    assert_eq!(got, vec![(1, 1), (2, 1), (3, 1)]);
    // Held: nobody else gets them.
    assert!(claims::claim(&c, other, "w", &[1, 2, 3], HOLD)
        .await
        .unwrap()
        .is_empty());
    // The host restarted: its new run renews only what it holds (nothing
    // of the old run's), so once expired they go to whoever claims them,
    // their delivery counted again.
    assert_eq!(
        claims::renew(&c, new, &held("w", &[1, 2, 3]), HOLD)
            .await
            .unwrap(),
        0
    );
    // The old run itself renews only what its hub holds: 3 was claimed
    // but never taken (its outcome lost), it is left to expire.
    assert_eq!(
        claims::renew(&c, old, &held("w", &[1, 2]), HOLD)
            .await
            .unwrap(),
        2
    );
    server.psql("UPDATE dws_claim SET claimed_until = now() - interval '1 s' WHERE seq = 3");
    assert_eq!(
        claims::claim(&c, other, "w", &[1, 2, 3], HOLD)
            .await
            .unwrap(),
        vec![(3, 2)]
    );
    expire_all(&server);
    let mut got = claims::claim(&c, new, "w", &[1, 2], HOLD).await.unwrap();
    got.sort_unstable();
    assert_eq!(got, vec![(1, 2), (2, 2)]);
    // Releasing is the holder's: the old run cannot give 1 back.
    assert_eq!(claims::release(&c, old, "w", &[1]).await.unwrap(), 0);
    assert_eq!(claims::release(&c, new, "w", &[1]).await.unwrap(), 1);
    // A clean stop gives back every open claim of its run.
    assert_eq!(claims::release_all(&c, "c1", "run-2").await.unwrap(), 2);
    assert_eq!(
        claims::claim(&c, other, "w", &[1, 2], HOLD)
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_ack_is_done_whoever_holds_the_claim_and_losses_are_reported_once() {
    let server = tokio::task::block_in_place(PgServer::start);
    let (c, _d) = setup(&server).await;
    let (a, b) = (who("a", "run-a"), who("b", "run-b"));
    claims::claim(&c, a, "w", &[1, 2], HOLD).await.unwrap();
    expire_all(&server);
    // host-b took 1 over (host-a's claim expired while it could not reach
    // the database); host-a's consumer had acked it: done all the same.
    assert_eq!(
        claims::claim(&c, b, "w", &[1], HOLD).await.unwrap().len(),
        1
    );
    assert_eq!(claims::finish(&c, "c1", "w", &[1]).await.unwrap(), 1);
    assert_eq!(
        claims::done_of(&c, "c1", "w", &[1, 2]).await.unwrap(),
        vec![1]
    );
    // Retention evicted 1..=4: 1 was done, 2's claim expired (lost), 3 and 4
    // were never claimed (lost); 5 is held by host-b (not lost).
    claims::claim(&c, b, "w", &[5], HOLD).await.unwrap();
    assert_eq!(
        claims::mark_lost(&c, a, "w", &[1, 2, 3, 4, 5])
            .await
            .unwrap(),
        3
    );
    // Another host evicting the same events later changes nothing.
    assert_eq!(
        claims::mark_lost(&c, b, "w", &[1, 2, 3, 4]).await.unwrap(),
        0
    );
    assert!(claims::claim(&c, b, "w", &[2, 3, 4], HOLD)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(claims::take_lost(&c, "c1", "w").await.unwrap(), 3);
    assert_eq!(claims::take_lost(&c, "c1", "w").await.unwrap(), 0);
    // host-b's claim of 5 expires (it died) and 5 left the log: lost; 6,
    // expired too, is still in this host's log (floor 6): not lost.
    claims::claim(&c, b, "w", &[6], HOLD).await.unwrap();
    expire_all(&server);
    let subs = vec!["w".to_owned()];
    assert_eq!(claims::sweep_lost(&c, "c1", &subs, 6).await.unwrap(), 1);
    assert_eq!(claims::take_lost(&c, "c1", "w").await.unwrap(), 1);
    assert_eq!(claims::sweep_lost(&c, "c1", &subs, 6).await.unwrap(), 0);
    // A subscription removed meanwhile has nothing to lose.
    assert_eq!(claims::mark_lost(&c, a, "gone", &[7]).await.unwrap(), 0);
}
