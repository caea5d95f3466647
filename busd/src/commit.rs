//! The committer: the one thread that owns the [`Store`]. It takes every
//! event the hub staged as one batch, makes it durable (one write, one
//! `fdatasync`), and hands it back to the hub for fan-out; meanwhile the next
//! batch forms (group commit). Between batches it saves the named
//! subscriptions — at once when a reply waits for it and nothing is staged,
//! else every [`crate::hub::SAVE_INTERVAL`], even under a flood that always
//! has a batch staged — and then releases the log space nobody needs (on
//! the disk store after writing the dedup window's ids of what goes,
//! `store::dedup_ids`). A failed write or fsync is fatal and never retried.
//!
//! It is a plain thread, not a task: every call here blocks on the disk, and
//! the hub wakes it with a condvar.

use std::{thread, time::Instant};

use crate::{
    hub::{CommitPort, CommitWork},
    store::{dedup_ids::DedupIds, Store},
};

/// Starts the committer. It returns after the hub closes the store (having
/// flushed everything and saved a clean snapshot) or after a store failure.
/// `dedup` (the disk store): where the dedup window's ids go before their
/// segments are released.
pub fn spawn(
    hub: CommitPort,
    store: Box<dyn Store>,
    dedup: Option<DedupIds>,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("committer".into())
        .spawn(move || run(&hub, store, dedup))
}

fn run(hub: &CommitPort, mut store: Box<dyn Store>, mut dedup: Option<DedupIds>) {
    let mut last_save = Instant::now();
    loop {
        let work = hub.next_work(last_save);
        // A body the log could not read back: the store failed.
        if let Some(why) = store.take_read_failure() {
            return hub.store_failed(why);
        }
        match work {
            CommitWork::Append(batch) => match timed(hub, || store.append(&batch)) {
                Ok(()) => {
                    if let Some(d) = dedup.as_mut() {
                        d.appended(&batch);
                    }
                    hub.committed(batch, store.info())
                }
                Err(e) => return hub.store_failed(e.to_string()),
            },
            CommitWork::Save {
                snapshot,
                keep_from,
                gen,
            } => {
                if let Err(e) = store.save(&snapshot) {
                    return hub.store_failed(e.to_string());
                }
                last_save = Instant::now();
                // The window's ids of what is released are durable first.
                if let Some(Err(e)) = dedup.as_mut().map(|d| d.before_release(keep_from)) {
                    return hub.store_failed(e.to_string());
                }
                // Losing an unlink only costs space; the next save retries.
                if let Err(e) = store.release_below(keep_from) {
                    tracing::warn!(cause = %e, "cannot release old log segments");
                }
                if let Some(floor) = store.retained_from() {
                    hub.store_retains_from(floor);
                }
                hub.saved(gen, store.info());
            }
            CommitWork::Final(snapshot) => {
                if let Err(e) = store.save(&snapshot) {
                    hub.store_failed(e.to_string());
                }
                return;
            }
            CommitWork::Stop => return,
        }
    }
}

/// Runs one append and records how long it took (failures too: a slow
/// failing disk is what the histogram is for).
fn timed<T>(hub: &CommitPort, append: impl FnOnce() -> T) -> T {
    let start = std::time::Instant::now();
    let out = append();
    hub.append_took(start.elapsed());
    out
}
