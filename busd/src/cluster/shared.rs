//! Shared delivery's claims, on every host: one task that, while a consumer
//! of a shared subscription is attached here, claims matching events for it
//! (`store::postgres::claims`), hands the claimed ones to the hub
//! ([`Hub::offer_claimed`](crate::hub::Hub::offer_claimed)), marks acked
//! ones done, gives back what a leaving consumer held, and renews this
//! host's claims every [`RENEW_EVERY`] so they outlive [`HOLD`] only while
//! this host does. A host killed with `-9` stops renewing: its claims expire
//! after [`HOLD`] and another host delivers them again, marked redelivered.
//!
//! Woken by new events in the log (the hub's durable watch) and every
//! [`ROUND`]; an event another host holds is not tried again before its
//! claim could have expired, one another host finished never.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio_postgres::Client;

use super::Link;
use crate::{
    shutdown::Shutdown,
    store::postgres::{self, claims, PgError},
};

/// How long a claim lives without renewal.
pub const HOLD: Duration = Duration::from_secs(10);
/// How often this host renews its claims.
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// The longest pause between two rounds.
const ROUND: Duration = Duration::from_millis(500);

/// Per subscription, what not to try claiming: held elsewhere (until when),
/// or done elsewhere (for good, until the log drops it).
#[derive(Default)]
struct Skips {
    held: HashMap<(String, u64), Instant>,
    done: BTreeSet<(String, u64)>,
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
    let mut client: Option<Client> = None;
    let mut renewed = Instant::now();
    loop {
        if client.is_none() {
            client = postgres::connect(&link.settings, "claims")
                .await
                .map(|(c, _driver)| c)
                .ok();
        }
        if let Some(c) = &client {
            let renew = renewed.elapsed() >= RENEW_EVERY;
            match round(&link, c, &mut skips, renew).await {
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
            _ = shutdown.recv() => return,
            _ = durable.changed() => {}
            _ = tokio::time::sleep(ROUND) => {}
        }
    }
}

/// One round: learn (acks, give-backs), renew, claim.
async fn round(link: &Link, c: &Client, skips: &mut Skips, renew: bool) -> Result<(), PgError> {
    let s = &link.settings;
    let work = link.hub.take_shared_work();
    for (sub, seqs) in &work.acked {
        claims::finish(c, &s.cluster, sub, &s.host, seqs).await?;
        skips
            .done
            .extend(seqs.iter().map(|&seq| (sub.clone(), seq)));
    }
    for (sub, seqs) in &work.released {
        claims::release(c, &s.cluster, sub, &s.host, seqs).await?;
    }
    if renew {
        claims::renew(c, &s.cluster, &s.host, HOLD).await?;
    }
    let now = Instant::now();
    let wants = link.hub.shared_wants(|sub, seq| skips.skip(sub, seq, now));
    for want in wants {
        let sub = &want.subscription;
        let got = claims::claim(c, &s.cluster, sub, &s.host, &want.seqs, HOLD).await?;
        let taken = link.hub.offer_claimed(sub, &got);
        // Claimed but not taken (the consumer left meanwhile): give back.
        let untaken: Vec<u64> = got
            .iter()
            .map(|&(seq, _)| seq)
            .filter(|seq| !taken.contains(seq))
            .collect();
        claims::release(c, &s.cluster, sub, &s.host, &untaken).await?;
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
