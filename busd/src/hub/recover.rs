//! The hub's constructor: recovery from what the store returned — the
//! retained log and the dedup window rebuilt, the named subscriptions
//! restored (each told, with a gap, of acknowledged events the store lost),
//! what retention evicts now counted, restored events a `--where` must
//! judge again queued for the filter thread.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize},
        Arc, Condvar, Mutex,
    },
    time::Instant,
};

use tokio::sync::{watch, Notify};

use super::{
    dedup, filtering, shared, Durable, Hub, HubConfig, Ingest, Persistence, Refused, Registry,
    Shared, SourcePart, State,
};
use crate::{
    clock::now_ms,
    eventlog::EventLog,
    pattern::Selector,
    shutdown::ShutdownTrigger,
    store::{Recovered, StoreInfo, SubRecord},
    subscription::Subscription,
    upstream::UpstreamControl,
};

impl Hub {
    /// A hub over what the store recovered: the retained log, the dedup
    /// window, the named subscriptions and the seq counter. What recovery
    /// had to repair is logged.
    pub(super) fn new(
        config: HubConfig,
        shutdown: ShutdownTrigger,
        upstream: Option<Arc<dyn UpstreamControl>>,
        recovered: Recovered,
        store: StoreInfo,
    ) -> Hub {
        for note in &recovered.notes {
            tracing::warn!("store recovery: {note}");
        }
        let mut dedup = dedup::Dedup::new(config.dedup_capacity, config.dedup_keeps_retained);
        let events = recovered.events;
        let (floor, snap_head, clean) = recovered
            .snapshot
            .as_ref()
            .map_or((0, 0, true), |s| (s.log_floor, s.head_seq, s.clean));
        let last_seq = events.last().map_or(0, |e| e.seq);
        let head = last_seq.max(snap_head);
        let first_kept = events.iter().find(|e| e.seq >= floor).map(|e| e.seq);
        let mut log = EventLog::with_head(config.retention, first_kept.map_or(head, |f| f - 1));
        for e in &events {
            if !e.scope.is_empty() && !e.damaged {
                dedup.put((e.scope.to_string(), e.event_id.to_string()), e.seq);
            }
            if e.seq >= floor {
                log.append(e.clone());
            }
        }
        log.advance_head(head);
        let now = (Instant::now(), now_ms());
        let mut subs = BTreeMap::new();
        for rec in recovered.snapshot.iter().flat_map(|s| &s.subscriptions) {
            match Selector::stored(&rec.patterns, &rec.filter)
                .and_then(|s| s.with_where(&rec.where_exprs))
            {
                Ok(sel) => {
                    let mut sub = Subscription::restore(
                        rec,
                        sel,
                        &events,
                        (floor, snap_head, clean),
                        now,
                        config.default_window as usize,
                    );
                    sub.set_claimed(config.clustered);
                    report_lost(&mut sub, rec, &recovered.lost, floor);
                    subs.insert(rec.id.clone(), sub);
                }
                Err(e) => {
                    tracing::error!(subscription = %rec.id, cause = %e, "stored subscription not restored")
                }
            }
        }
        // Shared subscriptions' events evicted here may be losses: the
        // claims task asks the cluster.
        let mut shared_work = shared::SharedWork::default();
        while let Some(old) = log.evict_one() {
            for sub in subs.values_mut() {
                sub.evicted(old.seq);
                if sub.may_lose_shared(&old) {
                    shared_work.evicted(&sub.id, old.seq);
                }
            }
        }
        if !subs.is_empty() || head > 0 {
            tracing::info!(
                subscriptions = subs.len(),
                head_seq = head,
                events = log.len(),
                clean,
                "state restored from the store"
            );
        }
        // Restored events a `--where` must judge again: the filter takes
        // them once the bus runs.
        let mut filter_queue = filtering::FilterQueue::default();
        for sub in subs.values().filter(|s| s.has_filter_jobs()) {
            filter_queue.want(&sub.id);
        }
        let state = State {
            log,
            ingest: Ingest::new(head.saturating_add(1), dedup),
            registry: Registry::new(subs),
            persist: Persistence::new(store),
            source: SourcePart::new(now_ms()),
            refused: Refused::default(),
            cluster: None,
            shared_work,
            filter_queue,
        };
        let (durable, _) = watch::channel(Durable {
            seq: head,
            ..Durable::default()
        });
        Hub {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                commit_wake: Condvar::new(),
                filter_wake: Condvar::new(),
                durable,
                housekeeping: Notify::new(),
                source_gen: AtomicU64::new(0),
                config,
                started_at_ms: now_ms(),
                started: Instant::now(),
                shutdown,
                upstream,
                input_buffered: AtomicUsize::new(0),
                paused_readers: AtomicUsize::new(0),
                append_latency: Default::default(),
                relay: Mutex::default(),
                relay_wake: Notify::new(),
                relay_on: AtomicBool::new(false),
            }),
        }
    }
}

/// Acknowledged seqs the store lost (`Recovered::lost`): `sub` counts the
/// ones it had not read as lost and reports them with a gap. Below the
/// snapshot's `floor` only its pinned events were still wanted (the rest
/// was already counted lost to retention).
fn report_lost(sub: &mut Subscription, rec: &SubRecord, lost: &[(u64, u64)], floor: u64) {
    let mut pinned = rec.pinned.clone();
    pinned.sort_unstable();
    for &(a, b) in lost {
        for &p in pinned.iter().filter(|&&p| p >= a && p <= b && p < floor) {
            sub.missed(p, p);
        }
        let from = a.max(floor);
        if from <= b {
            sub.missed(from, b);
        }
    }
}
