//! Shared delivery's claims, on every host: one task that, while a consumer
//! of a shared subscription is attached here, claims matching events for it
//! (`cluster::db::claims`), hands the claimed ones to the hub
//! ([`ReplicaPort::offer_claimed`](crate::hub::ReplicaPort::offer_claimed)), marks acked
//! ones done, gives back what a leaving consumer held, records events
//! retention evicted before any host delivered them as lost (and reports
//! the losses to a consumer here by a gap; so are expired claims of events
//! gone from the log, which nobody can deliver), and renews the claims this
//! host holds every [`RENEW_EVERY`] so they outlive [`HOLD`] only while
//! this run of busd does.
//!
//! Claims are this run's: its *incarnation* (a random id per start,
//! [`new_incarnation`]). A host killed with `-9` stops renewing; restarted,
//! its new incarnation does not renew the dead one's claims either: they
//! expire after [`HOLD`] and a host delivers them again, marked
//! redelivered. Only the claims the hub holds are renewed, so a claim whose
//! outcome was lost with the connection (PostgreSQL restarting) expires too.
//!
//! What the claims must learn (acks, give-backs, evictions) is kept here
//! until the database took it: a round that fails keeps it for the next
//! one, so an ack made while PostgreSQL is down is not forgotten.
//!
//! Woken by new events in the log (the hub's durable watch) and every
//! [`ROUND`]; an event another host holds is not tried again before its
//! claim could have expired, one finished (acked or lost) never. Finished
//! events are looked up [`DONE_SPAN`] seqs at a time before any claim, so a
//! host that just started does not walk them a window at a time.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use super::db::claims::{self, Claimer};
use super::Link;
use crate::{
    hub::SharedWork,
    pg::{self, Client, PgError},
    shutdown::Shutdown,
};

/// How long a claim lives without renewal.
pub const HOLD: Duration = Duration::from_secs(10);
/// How often this host renews its claims.
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// The longest pause between two rounds.
const ROUND: Duration = Duration::from_millis(500);

/// A new incarnation id: 16 random hex digits (the time and pid if the
/// system's randomness fails), unique per busd start.
pub(super) fn new_incarnation() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 8];
    if SystemRandom::new().fill(&mut b).is_ok() {
        return b.iter().map(|x| format!("{x:02x}")).collect();
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos:x}", std::process::id())
}

/// How many seqs of the log one round looks up finished claims for, per
/// shared subscription (one range scan of the claims' primary key).
const DONE_SPAN: u64 = 10_000;

/// Per subscription, what not to try claiming: held elsewhere (until when),
/// or done elsewhere (for good, until the log drops it); and through which
/// seq the finished ones were looked up ([`DONE_SPAN`] at a time).
#[derive(Default)]
struct Skips {
    held: HashMap<(String, u64), Instant>,
    done: BTreeSet<(String, u64)>,
    checked: HashMap<String, u64>,
}

impl Skips {
    fn skip(&self, sub: &str, seq: u64, now: Instant) -> bool {
        let key = (sub.to_owned(), seq);
        self.done.contains(&key) || self.held.get(&key).is_some_and(|&until| until > now)
    }

    fn forget_below(&mut self, seq: u64) {
        self.held.retain(|(_, s), _| *s >= seq);
        self.done.retain(|(_, s)| *s >= seq);
    }
}

pub(super) async fn run(link: Arc<Link>, mut shutdown: Shutdown) {
    let mut durable = link.hub.durable();
    let mut skips = Skips::default();
    let mut work = SharedWork::default();
    let mut client: Option<Client> = None;
    let mut renewed = Instant::now();
    loop {
        if client.as_ref().is_some_and(|c| c.is_closed()) {
            client = None;
        }
        if client.is_none() {
            client = pg::connect(&link.settings, "claims")
                .await
                .map(|(c, _driver)| c)
                .ok();
        }
        work.merge(link.hub.take_shared_work());
        if let Some(c) = &client {
            let renew = renewed.elapsed() >= RENEW_EVERY;
            match round(&link, c, &mut work, &mut skips, renew).await {
                Ok(()) => {
                    if renew {
                        renewed = Instant::now();
                    }
                }
                Err(e) => {
                    tracing::warn!(cause = %e, "shared delivery: the claims failed; reconnecting");
                    client = None;
                }
            }
        }
        tokio::select! {
            _ = shutdown.recv() => break,
            _ = durable.changed() => {}
            _ = tokio::time::sleep(ROUND) => {}
        }
    }
    // A clean stop: what was acked is done, and everything else this run
    // held goes back at once instead of when it expires (bounded: a
    // database that does not answer leaves it to expire).
    if let Some(c) = &client {
        work.merge(link.hub.take_shared_work());
        let last = stop(&link, c, &mut work);
        if tokio::time::timeout(STOP_WITHIN, last).await.is_err() {
            tracing::warn!(
                "shared delivery: the claims were not given back at the stop; they expire"
            );
        }
    }
}

/// How long a clean stop tries to finish and give back its claims.
const STOP_WITHIN: Duration = Duration::from_secs(2);

/// A clean stop's last round: acks done, then every open claim of this
/// incarnation given back.
async fn stop(link: &Link, c: &Client, work: &mut SharedWork) {
    let s = &link.settings;
    let finished = drain(&mut work.acked, |sub, seqs| async move {
        claims::finish(c, &s.cluster, &sub, &seqs).await.map(drop)
    })
    .await;
    if finished.is_ok() {
        let _ = claims::release_all(c, &s.cluster, &link.incarnation).await;
    }
}

/// Does `f` for each subscription's seqs of `pending`, removing each once
/// it succeeded (a failure leaves it and the rest for the next round).
async fn drain<F, Fut>(pending: &mut BTreeMap<String, Vec<u64>>, mut f: F) -> Result<(), PgError>
where
    F: FnMut(String, Vec<u64>) -> Fut,
    Fut: std::future::Future<Output = Result<(), PgError>>,
{
    while let Some((sub, seqs)) = pending.pop_first() {
        if let Err(e) = f(sub.clone(), seqs.clone()).await {
            pending.insert(sub, seqs);
            return Err(e);
        }
    }
    Ok(())
}

/// One round: learn (acks, give-backs, evictions), renew, report losses,
/// claim.
async fn round(
    link: &Link,
    c: &Client,
    work: &mut SharedWork,
    skips: &mut Skips,
    renew: bool,
) -> Result<(), PgError> {
    let s = &link.settings;
    let who = Claimer {
        cluster: &s.cluster,
        host: &s.host,
        incarnation: &link.incarnation,
    };
    let mut finished = vec![];
    drain(&mut work.acked, |sub, seqs| {
        finished.extend(seqs.iter().map(|&seq| (sub.clone(), seq)));
        async move { claims::finish(c, &s.cluster, &sub, &seqs).await.map(drop) }
    })
    .await?;
    skips.done.extend(finished);
    drain(&mut work.released, |sub, seqs| async move {
        claims::release(c, who, &sub, &seqs).await.map(drop)
    })
    .await?;
    drain(&mut work.evicted, |sub, seqs| async move {
        claims::mark_lost(c, who, &sub, &seqs).await.map(drop)
    })
    .await?;
    if renew {
        claims::renew(c, who, &link.hub.shared_held(), HOLD).await?;
        let floor = link
            .hub
            .oldest_seq()
            .unwrap_or_else(|| link.hub.head_seq() + 1);
        claims::sweep_lost(c, &s.cluster, &link.hub.shared_ids(), floor).await?;
    }
    for sub in link.hub.shared_attached() {
        let lost = claims::take_lost(c, &s.cluster, &sub).await?;
        link.hub.shared_lost(&sub, lost);
    }
    // What other hosts finished is skipped before anything is tried: a host
    // that just started would otherwise try them a window at a time, and
    // one restarted more often than it could walk the log's finished
    // events delivered nothing at all (issue 50).
    let oldest = link
        .hub
        .oldest_seq()
        .unwrap_or_else(|| link.hub.head_seq() + 1);
    let head = link.hub.head_seq();
    for sub in link.hub.shared_attached() {
        let from = skips
            .checked
            .get(&sub)
            .copied()
            .unwrap_or(0)
            .max(oldest.saturating_sub(1));
        if from < head {
            let upto = head.min(from + DONE_SPAN);
            let done = claims::done_between(c, &s.cluster, &sub, from, upto).await?;
            skips
                .done
                .extend(done.into_iter().map(|seq| (sub.clone(), seq)));
            skips.checked.insert(sub, upto);
        }
    }
    let now = Instant::now();
    let wants = link.hub.shared_wants(|sub, seq| skips.skip(sub, seq, now));
    for want in wants {
        let sub = &want.subscription;
        let got = claims::claim(c, who, sub, &want.seqs, HOLD).await?;
        let taken = link.hub.offer_claimed(sub, &got);
        // Claimed but not taken (the consumer left meanwhile): give back.
        let untaken: Vec<u64> = got
            .iter()
            .map(|&(seq, _)| seq)
            .filter(|seq| !taken.contains(seq))
            .collect();
        claims::release(c, who, sub, &untaken).await?;
        let mine: BTreeSet<u64> = got.iter().map(|&(seq, _)| seq).collect();
        let others: Vec<u64> = want
            .seqs
            .iter()
            .copied()
            .filter(|seq| !mine.contains(seq))
            .collect();
        let done: BTreeSet<u64> = claims::done_of(c, &s.cluster, sub, &others)
            .await?
            .into_iter()
            .collect();
        for seq in others {
            if done.contains(&seq) {
                skips.done.insert((sub.clone(), seq));
            } else {
                // Held elsewhere: that claim cannot expire sooner.
                skips
                    .held
                    .insert((sub.clone(), seq), now + Duration::from_secs(1));
            }
        }
    }
    if let Some(oldest) = link.hub.oldest_seq() {
        skips.forget_below(oldest);
    }
    Ok(())
}
