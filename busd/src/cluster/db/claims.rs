//! Shared delivery's claims (`dws_claim`): which host incarnation delivers
//! which event of a shared subscription. A host claims the matching events
//! it wants to deliver; `INSERT … ON CONFLICT DO UPDATE … WHERE` gives each
//! event to one incarnation (a concurrent claimer waits on the row and then
//! finds it held), and takes over a claim only once it expired (its holder
//! stopped renewing it) — counting the delivery again. A claim belongs to
//! the incarnation (one busd run) that took it, not to the host name: a
//! restarted host never renews what its dead run held, and an incarnation
//! renews only the claims it actually holds ([`renew`]), so a claim whose
//! outcome it never learned (the connection broke) expires too. An acked
//! event's claim is `done`, whoever holds it now, so nobody claims it again;
//! a host that lets a consumer go releases what it held so another host
//! takes it at once. An event retention evicted before any host delivered
//! it becomes a `lost` row ([`mark_lost`]), reported once ([`take_lost`]).

use std::{collections::BTreeMap, time::Duration};

use crate::pg::{self, sql, GenericClient, Params, PgError, Refusal, Type};

fn seqs_db(seqs: &[u64]) -> Vec<i64> {
    seqs.iter().map(|&s| s as i64).collect()
}

/// Who claims: the host's name (for people reading the table) and its
/// incarnation (whose the claim is).
#[derive(Debug, Clone, Copy)]
pub struct Claimer<'a> {
    pub cluster: &'a str,
    pub host: &'a str,
    pub incarnation: &'a str,
}

const CLAIM_SQL: &str = "
INSERT INTO dws_claim (cluster, subscription, seq, host, incarnation, claimed_until, deliveries)
SELECT $1, $2, s, $3, $4, now() + make_interval(secs => $6), 1 FROM unnest($5::bigint[]) AS s
ON CONFLICT (cluster, subscription, seq) DO UPDATE
    SET host = EXCLUDED.host, incarnation = EXCLUDED.incarnation,
        claimed_until = EXCLUDED.claimed_until,
        deliveries = dws_claim.deliveries + 1
    WHERE NOT dws_claim.done AND dws_claim.claimed_until < now()
RETURNING seq, deliveries";

/// Claims for `who` those of `seqs` (events of `subscription`) that nobody
/// holds, or whose holder's claim expired; returns `(seq, deliveries)` of
/// the ones now ours (deliveries counts this one).
pub async fn claim(
    client: &impl GenericClient,
    who: Claimer<'_>,
    subscription: &str,
    seqs: &[u64],
    hold: Duration,
) -> Result<Vec<(u64, u32)>, PgError> {
    if seqs.is_empty() {
        return Ok(vec![]);
    }
    let seqs = seqs_db(seqs);
    let secs = hold.as_secs_f64();
    let params: Params = &[
        (&who.cluster, Type::TEXT),
        (&subscription, Type::TEXT),
        (&who.host, Type::TEXT),
        (&who.incarnation, Type::TEXT),
        (&seqs, Type::INT8_ARRAY),
        (&secs, Type::FLOAT8),
    ];
    let rows = pg::query(client, "claim", CLAIM_SQL, params).await?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i32>(1).max(1) as u32))
        .collect())
}

/// Of `seqs`, those finished (acked on some host, or lost): never claimable
/// again.
pub async fn done_of(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
    seqs: &[u64],
) -> Result<Vec<u64>, PgError> {
    if seqs.is_empty() {
        return Ok(vec![]);
    }
    let seqs = seqs_db(seqs);
    let params: Params = &[
        (&cluster, Type::TEXT),
        (&subscription, Type::TEXT),
        (&seqs, Type::INT8_ARRAY),
    ];
    done_seqs(client, "done_of", "seq = ANY($3)", params).await
}

/// The finished (acked or lost) events of `subscription` with seqs in
/// `(after, upto]`: what a host that just started skips at once instead of
/// trying a window of them at a time.
pub async fn done_between(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
    after: u64,
    upto: u64,
) -> Result<Vec<u64>, PgError> {
    let (after, upto) = (after as i64, upto as i64);
    let params: Params = &[
        (&cluster, Type::TEXT),
        (&subscription, Type::TEXT),
        (&after, Type::INT8),
        (&upto, Type::INT8),
    ];
    done_seqs(client, "done_between", "seq > $3 AND seq <= $4", params).await
}

/// The finished events of a subscription (`$1` its cluster, `$2` its
/// name) that `which` (on `seq`, from `$3` on) selects.
async fn done_seqs(
    client: &impl GenericClient,
    what: &str,
    which: &str,
    params: Params<'_>,
) -> Result<Vec<u64>, PgError> {
    let sql = format!(
        "SELECT seq FROM dws_claim WHERE cluster = $1 AND subscription = $2 AND {which} AND done"
    );
    let rows = pg::query(client, what, &sql, params).await?;
    Ok(rows.iter().map(|r| r.get::<_, i64>(0) as u64).collect())
}

const RENEW_SQL: &str = "UPDATE dws_claim c
    SET claimed_until = now() + make_interval(secs => $5)
    FROM unnest($3::text[], $4::bigint[]) AS h(subscription, seq)
    WHERE c.cluster = $1 AND c.incarnation = $2
      AND c.subscription = h.subscription AND c.seq = h.seq AND NOT c.done";

/// Keeps the claims `who` holds (`held`: per subscription, its seqs) alive
/// for another `hold`; any other claim of its incarnation (one it never
/// learned it got) is left to expire.
pub async fn renew(
    client: &impl GenericClient,
    who: Claimer<'_>,
    held: &BTreeMap<String, Vec<u64>>,
    hold: Duration,
) -> Result<u64, PgError> {
    let (subs, seqs): (Vec<&str>, Vec<i64>) = held
        .iter()
        .flat_map(|(sub, seqs)| seqs.iter().map(move |&s| (sub.as_str(), s as i64)))
        .unzip();
    if subs.is_empty() {
        return Ok(0);
    }
    let secs = hold.as_secs_f64();
    let params: Params = &[
        (&who.cluster, Type::TEXT),
        (&who.incarnation, Type::TEXT),
        (&subs, Type::TEXT_ARRAY),
        (&seqs, Type::INT8_ARRAY),
        (&secs, Type::FLOAT8),
    ];
    pg::execute(client, "renew", RENEW_SQL, params).await
}

/// Marks `seqs` of `subscription` acked: done whoever holds the claim now
/// (a consumer acked it; a host that took it over meanwhile delivers it
/// once more at most).
pub async fn finish(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
    seqs: &[u64],
) -> Result<u64, PgError> {
    if seqs.is_empty() {
        return Ok(0);
    }
    let seqs = seqs_db(seqs);
    let params: Params = &[
        (&cluster, Type::TEXT),
        (&subscription, Type::TEXT),
        (&seqs, Type::INT8_ARRAY),
    ];
    pg::execute(
        client,
        "finish",
        "UPDATE dws_claim SET done = true WHERE cluster = $1 AND subscription = $2 \
         AND seq = ANY($3) AND NOT done",
        params,
    )
    .await
}

/// Gives `seqs` back: expired at once, so another host claims them (only
/// claims `who` holds).
pub async fn release(
    client: &impl GenericClient,
    who: Claimer<'_>,
    subscription: &str,
    seqs: &[u64],
) -> Result<u64, PgError> {
    if seqs.is_empty() {
        return Ok(0);
    }
    let seqs = seqs_db(seqs);
    let params: Params = &[
        (&who.cluster, Type::TEXT),
        (&subscription, Type::TEXT),
        (&who.incarnation, Type::TEXT),
        (&seqs, Type::INT8_ARRAY),
    ];
    pg::execute(
        client,
        "release",
        "UPDATE dws_claim SET claimed_until = now() - interval '1 second' \
         WHERE cluster = $1 AND subscription = $2 AND incarnation = $3 \
         AND seq = ANY($4) AND NOT done",
        params,
    )
    .await
}

/// Gives back every open claim of `incarnation` (its busd stops cleanly).
pub async fn release_all(
    client: &impl GenericClient,
    cluster: &str,
    incarnation: &str,
) -> Result<u64, PgError> {
    pg::execute(
        client,
        "release_all",
        "UPDATE dws_claim SET claimed_until = now() - interval '1 second' \
         WHERE cluster = $1 AND incarnation = $2 AND NOT done",
        &[(&cluster, Type::TEXT), (&incarnation, Type::TEXT)],
    )
    .await
}

const LOST_SQL: &str = "
INSERT INTO dws_claim (cluster, subscription, seq, host, incarnation, claimed_until,
                       deliveries, done, lost)
SELECT $1, $2, s, $3, $4, now(), 0, true, true FROM unnest($5::bigint[]) AS s
ON CONFLICT (cluster, subscription, seq) DO UPDATE
    SET done = true, lost = true, host = EXCLUDED.host, incarnation = EXCLUDED.incarnation
    WHERE NOT dws_claim.done AND dws_claim.claimed_until < now()";

/// Retention evicted `seqs` of `subscription` from `who`'s log, none of
/// them held there: those no host finished or holds (a claim that expired
/// counts as not held) are lost — done, and to be reported once. A
/// subscription removed meanwhile has nothing to lose.
pub async fn mark_lost(
    client: &impl GenericClient,
    who: Claimer<'_>,
    subscription: &str,
    seqs: &[u64],
) -> Result<u64, PgError> {
    crate::pg::bounded("mark_lost", async move {
        if seqs.is_empty() {
            return Ok(0);
        }
        let seqs = seqs_db(seqs);
        let r = sql::execute(
            client,
            LOST_SQL,
            &[
                (&who.cluster, Type::TEXT),
                (&subscription, Type::TEXT),
                (&who.host, Type::TEXT),
                (&who.incarnation, Type::TEXT),
                (&seqs, Type::INT8_ARRAY),
            ],
        )
        .await;
        match r {
            Err(e) if e.refused(Refusal::ForeignKey) => Ok(0),
            r => r,
        }
    })
    .await
}

const SWEEP_SQL: &str = "UPDATE dws_claim c SET done = true, lost = true, reported = false
    WHERE c.cluster = $1 AND c.subscription = ANY($2) AND NOT c.done
      AND c.claimed_until < now() AND c.seq < $3";

/// Expired claims of `subscriptions` whose event retention took from this
/// host's log (below `floor`): a host delivers only from its log, so
/// nobody can deliver them any more (a holder died, or gave back an event
/// retention had taken while it was in flight): they are lost, to be
/// reported once. (A host whose retention keeps more would still have had
/// it: with unequal retention the smallest decides.)
pub async fn sweep_lost(
    client: &impl GenericClient,
    cluster: &str,
    subscriptions: &[String],
    floor: u64,
) -> Result<u64, PgError> {
    if subscriptions.is_empty() {
        return Ok(0);
    }
    let floor = floor.min(i64::MAX as u64) as i64;
    let params: Params = &[
        (&cluster, Type::TEXT),
        (&subscriptions, Type::TEXT_ARRAY),
        (&floor, Type::INT8),
    ];
    pg::execute(client, "sweep_lost", SWEEP_SQL, params).await
}

/// Takes the losses of `subscription` no host reported yet: how many (this
/// host reports them with a gap).
pub async fn take_lost(
    client: &impl GenericClient,
    cluster: &str,
    subscription: &str,
) -> Result<u64, PgError> {
    pg::execute(
        client,
        "take_lost",
        "UPDATE dws_claim SET reported = true WHERE cluster = $1 AND subscription = $2 \
         AND lost AND NOT reported",
        &[(&cluster, Type::TEXT), (&subscription, Type::TEXT)],
    )
    .await
}
