//! The `--where` filter thread (as `commit` is the committer's): takes a
//! batch of one subscription's events from the hub
//! ([`FilterHandle::next_batch`], the subscription chosen by [`Fair`]),
//! reads their bytes (a cold event's from its segment) and judges them with
//! the hub unlocked, in the worker process (`where_filter::Pool`), then
//! hands the verdicts back ([`FilterHandle::judged`]). It runs until the
//! bus shuts down. The hub never imports it: it holds a [`FilterHandle`].

use std::{path::PathBuf, thread, time::Duration};

use bytes::Bytes;

use crate::{
    hub::{FilterBatch, FilterHandle},
    where_filter::{limits::MAX_BATCH_BYTES, Fair, Pool, Verdict},
};

/// Where verdicts come from.
pub enum Evaluator {
    /// The worker process: the bus's.
    Worker(Pool),
    /// In this thread, with the step bound only: unit tests (their binary
    /// cannot be a worker).
    Here,
}

impl Evaluator {
    /// The worker running busd's own executable.
    pub fn worker() -> Evaluator {
        Evaluator::Worker(Pool::new(PathBuf::from("/proc/self/exe")))
    }

    fn judge(&mut self, batch: &FilterBatch, events: &[(u64, Bytes)]) -> Vec<(Verdict, Duration)> {
        match self {
            Evaluator::Worker(pool) => pool.judge(batch.wheres.exprs(), events),
            Evaluator::Here => events
                .iter()
                .map(|(_, b)| (batch.wheres.eval_here(b), Duration::ZERO))
                .collect(),
        }
    }
}

/// Starts the filter thread.
pub fn spawn(hub: FilterHandle, evaluator: Evaluator) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("where-filter".into())
        .spawn(move || run(&hub, evaluator))
}

fn run(hub: &FilterHandle, mut evaluator: Evaluator) {
    let mut fair = Fair::default();
    loop {
        let batch = hub.next_batch(
            &mut |ids| {
                let i = fair.pick(ids);
                (i, fair.batch_len(ids[i]))
            },
            MAX_BATCH_BYTES,
        );
        let Some(batch) = batch else {
            return;
        };
        // A cold body that cannot be read is a store failure (the bus
        // stops); meanwhile the event is judged as an empty one.
        let events: Vec<(u64, Bytes)> = batch
            .events
            .iter()
            .map(|e| (e.seq, e.encoded().unwrap_or_default()))
            .collect();
        let judged = evaluator.judge(&batch, &events);
        let costs: Vec<Duration> = judged.iter().map(|(_, c)| *c).collect();
        fair.charge(&batch.subscription, &costs);
        let verdicts: Vec<Verdict> = judged.into_iter().map(|(v, _)| v).collect();
        hub.judged(&batch, &verdicts);
    }
}
