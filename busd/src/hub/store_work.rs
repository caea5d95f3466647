//! The committer's side of the hub: its work queue
//! ([`Hub::next_commit_work`]: staged batches first, then lazy or urgent
//! subscription saves, then the final snapshot), the snapshots and the log
//! floor the store must keep, what the committer reports back ([`Hub::saved`],
//! [`Hub::store_failed`]), closing, and the [`Durable`] progress that replies
//! and upstream acks wait on ([`Hub::wait_durable`]). The batches themselves
//! come back through [`Hub::committed`] (`delivery`).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use proto::v1::ByeReason;
use tokio::sync::watch;

use super::{Hub, State};
use crate::{
    clock::now_ms,
    eventlog::LoggedEvent,
    store::{Snapshot, StoreInfo, SNAPSHOT_FORMAT},
    subscription::Subscription,
};

/// How far the store has come, published by the committer.
#[derive(Debug, Clone, Default)]
pub struct Durable {
    /// Every event up to this seq is durable (and fanned out).
    pub seq: u64,
    /// Every subscription change up to this generation is saved.
    pub subs_gen: u64,
    /// The store failed: nothing more will become durable.
    pub failed: Option<Arc<str>>,
    /// Bumped when a publish forwarded to the cluster's owner was answered
    /// (`crate::cluster`).
    pub forwarded: u64,
}

/// One round of work for the committer (see [`Hub::next_commit_work`]).
pub enum CommitWork {
    /// Make these staged events durable, then call [`Hub::committed`].
    Append(Vec<Arc<LoggedEvent>>),
    /// Save the subscriptions; then events below `keep_from` may be
    /// released; then call [`Hub::saved`] with `gen`.
    Save {
        snapshot: Snapshot,
        keep_from: u64,
        gen: u64,
    },
    /// The bus is closing and everything is flushed: save this last
    /// snapshot (marked clean) and stop.
    Final(Snapshot),
    /// Stop now (the store failed).
    Stop,
}

/// Subscription state is saved at most this often while only cursors
/// move, and at least this often while anything changed, whatever the
/// publish load (see [`pick_work`]).
pub const SAVE_INTERVAL: Duration = Duration::from_millis(200);

/// A batch holds at most this many bytes of events (or one event): the disk
/// store starts a new segment only between batches, and retention releases
/// whole segments, so a burst of large pipelined publishes in one batch
/// would make one segment, and the disk it holds, as large as the burst.
pub const MAX_BATCH_BYTES: usize = 4 << 20;

/// How many of the staged events (their sizes, in order) the next batch
/// takes: as many as fit [`MAX_BATCH_BYTES`], and at least one.
fn batch_len(sizes: impl Iterator<Item = usize>) -> usize {
    let mut total = 0usize;
    let mut n = 0;
    for size in sizes {
        total = total.saturating_add(size);
        if n > 0 && total > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n
}

/// What the committer could do now (see [`pick_work`]).
#[derive(Debug, Clone, Copy)]
struct Wants {
    /// Events are staged.
    staged: bool,
    /// The named subscriptions changed since the last save.
    dirty: bool,
    /// A reply waits for that save.
    urgent: bool,
    /// [`SAVE_INTERVAL`] has passed since the last save.
    save_due: bool,
    /// The bus is closing.
    closing: bool,
}

/// The committer's choice for its next round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    Append,
    Save,
    Final,
    Wait,
}

/// The committer's choice: staged events first (the next batch forms while
/// one is synced), except that a save whose interval has passed goes first —
/// so under a publish flood that always has a batch staged, cursors are
/// still saved, segments released and subscribe/verb replies answered at
/// least every [`SAVE_INTERVAL`] (before, a save waited for the flood to
/// end). With nothing staged, a save a reply waits for goes at once; the
/// final snapshot comes after everything staged.
fn pick_work(w: Wants) -> Pick {
    if w.staged && !(w.dirty && w.save_due) {
        Pick::Append
    } else if w.closing && !w.staged {
        Pick::Final
    } else if w.dirty && (w.urgent || w.save_due) {
        Pick::Save
    } else if w.staged {
        Pick::Append
    } else {
        Pick::Wait
    }
}

/// The hub's side of persistence: whether the named subscriptions changed
/// since the last save, the generations replies wait on, what the store
/// last reported, and how it ends (failed, lease lost, closing).
pub(super) struct Persistence {
    /// Named subscriptions changed since the last save.
    dirty: bool,
    /// Bumped by a change a reply must not precede on disk (create, remove).
    gen: u64,
    saved_gen: u64,
    info: StoreInfo,
    /// Set once the store failed; the bus is stopping.
    error: Option<Arc<str>>,
    /// The cluster lease is lost for good: the committer fails the store
    /// once the batch it is appending, if any, is resolved.
    lease_lost: Option<String>,
    /// The committer flushes what is left and stops.
    closing: bool,
}

impl Persistence {
    /// Dirty from the start: the first save writes what was recovered.
    pub(super) fn new(info: StoreInfo) -> Persistence {
        Persistence {
            dirty: true,
            gen: 0,
            saved_gen: 0,
            info,
            error: None,
            lease_lost: None,
            closing: false,
        }
    }

    /// Marks the named subscriptions changed; `true` when they were not
    /// already (the committer may need a wake-up).
    pub(super) fn mark_dirty(&mut self) -> bool {
        !std::mem::replace(&mut self.dirty, true)
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// A change a reply must not precede on disk: marks dirty and returns
    /// the generation the reply waits for.
    pub(super) fn must_save(&mut self) -> u64 {
        self.dirty = true;
        self.gen += 1;
        self.gen
    }

    /// A save of generation [`Persistence::gen`] begins: clean until the
    /// next change.
    fn start_save(&mut self) -> u64 {
        self.dirty = false;
        self.gen
    }

    /// A reply waits for a save not yet done.
    fn urgent(&self) -> bool {
        self.gen > self.saved_gen
    }

    /// Generation `gen` is saved (generations only move forward).
    fn saved(&mut self, gen: u64, info: StoreInfo) {
        self.info = info;
        self.saved_gen = self.saved_gen.max(gen);
    }

    pub(super) fn set_info(&mut self, info: StoreInfo) {
        self.info = info;
    }

    pub(super) fn info(&self) -> &StoreInfo {
        &self.info
    }

    pub(super) fn error(&self) -> Option<&Arc<str>> {
        self.error.as_ref()
    }

    fn fail(&mut self, why: Arc<str>) {
        self.error = Some(why);
    }
}

impl Hub {
    /// The committer's next round: blocks (on a condvar, in the committer's
    /// own thread) until there is something to do. Staged events first, so
    /// the next batch forms while the previous one is being synced.
    pub(super) fn next_commit_work(&self, last_save: Instant) -> CommitWork {
        let mut st = self.state();
        loop {
            if st.persist.error.is_some() {
                return CommitWork::Stop;
            }
            if let Some(why) = st.persist.lease_lost.take() {
                drop(st);
                self.store_failed(why);
                return CommitWork::Stop;
            }
            let due = last_save + SAVE_INTERVAL;
            let pick = pick_work(Wants {
                staged: st.ingest.staged_len() > 0,
                dirty: st.persist.dirty,
                urgent: st.persist.urgent(),
                save_due: Instant::now() >= due,
                closing: st.persist.closing,
            });
            match pick {
                Pick::Append => {
                    let n = batch_len(st.ingest.staged_sizes());
                    return CommitWork::Append(st.ingest.take_staged(n));
                }
                Pick::Final => return CommitWork::Final(self.snapshot_locked(&st, true).0),
                Pick::Save => {
                    let gen = st.persist.start_save();
                    let (snapshot, keep_from) = self.snapshot_locked(&st, false);
                    return CommitWork::Save {
                        snapshot,
                        keep_from,
                        gen,
                    };
                }
                Pick::Wait => {}
            }
            st = if st.persist.dirty {
                let wait = due.saturating_duration_since(Instant::now());
                self.shared
                    .commit_wake
                    .wait_timeout(st, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0)
            } else {
                self.shared
                    .commit_wake
                    .wait(st)
                    .unwrap_or_else(|p| p.into_inner())
            };
        }
    }

    /// The subscriptions as they are now, and the lowest seq the store must
    /// keep: the log's oldest retained event and the events pinned in flight
    /// or parked; on the cluster store also the dedup window (its unique
    /// index). The disk store keeps the window's ids, not its payloads, in
    /// `store::dedup_ids`, so retention alone bounds its segments.
    fn snapshot_locked(&self, st: &State, clean: bool) -> (Snapshot, u64) {
        let head = st.log.head_seq();
        let log_floor = st.log.oldest_seq().unwrap_or(head + 1);
        let now = (Instant::now(), crate::clock::now_ms());
        let subscriptions: Vec<_> = st
            .registry
            .subs()
            .values()
            .filter(|s| !s.owned)
            .map(|s| s.record(log_floor, head, now))
            .collect();
        // Pinned in-flight events and parked ones outlive the log.
        let pinned_floor = st
            .registry
            .subs()
            .values()
            .filter(|s| !s.owned)
            .filter_map(Subscription::oldest_kept)
            .min()
            .unwrap_or(u64::MAX);
        let dedup_floor = if self.shared.config.dedup_keeps_retained {
            (head + 1).saturating_sub(self.shared.config.dedup_capacity as u64)
        } else {
            u64::MAX
        };
        let keep_from = log_floor.min(pinned_floor).min(dedup_floor);
        let snapshot = Snapshot {
            format: SNAPSHOT_FORMAT,
            clean,
            head_seq: head,
            log_floor,
            saved_at_unix_ms: now_ms(),
            subscriptions,
        };
        (snapshot, keep_from)
    }

    /// The snapshot written at start-up, before anything is served: marks
    /// the store as in use (not clean) until the next clean exit.
    pub(super) fn startup_snapshot(&self) -> Snapshot {
        self.snapshot_locked(&self.state(), false).0
    }

    /// Marks the named subscriptions changed and, when they were not
    /// already, wakes the committer: it may sleep without a deadline (on a
    /// cluster follower nothing is ever appended to wake it), and a change
    /// marked without a wake-up would leave every later one unsaved too.
    pub(super) fn mark_subs_dirty(&self, st: &mut State) {
        if st.persist.mark_dirty() {
            self.shared.commit_wake.notify_one();
        }
    }

    /// The store holds no event below `floor` any more: the dedup window
    /// stops keeping their ids (see `dedup`).
    pub(super) fn store_retains_from(&self, floor: u64) {
        self.state().ingest.dedup_retained_from(floor);
    }

    /// Ids of the dedup window whose events the store released (read back
    /// from `store::dedup_ids` at start): they join the window behind the
    /// ids recovered from the log, oldest last.
    pub(super) fn seed_dedup(&self, older: &[crate::store::dedup_ids::Entry]) {
        self.state().ingest.seed_dedup(older);
    }

    /// The subscriptions of generation `gen` are saved.
    pub(super) fn saved(&self, gen: u64, info: StoreInfo) {
        self.state().persist.saved(gen, info);
        self.shared
            .durable
            .send_modify(|d| d.subs_gen = d.subs_gen.max(gen));
    }

    /// The store failed: nothing more can be made durable. Fatal — the bus
    /// stops, and every consumer and waiting publisher is told why. Never
    /// retried: after a failed fsync the kernel may have dropped the pages.
    pub(super) fn store_failed(&self, why: String) {
        tracing::error!(cause = %why, "the store failed; the bus stops (the next start recovers what is on disk)");
        let why: Arc<str> = why.into();
        // The waiters' view first: a connection that sees `store_error`
        // then finds the failure in `Durable` too (see `Connection::bye`).
        self.shared
            .durable
            .send_modify(|d| d.failed = Some(why.clone()));
        self.state().persist.fail(why.clone());
        self.shared.shutdown.trigger(ByeReason::Shutdown);
    }

    /// The cluster's upstream lease is lost for good. Not failed at once:
    /// a batch the committer is appending may have committed before another
    /// host took the lease (its answer lost), and its publishers must hear
    /// that. The committer resolves it, then fails the store with `why`.
    pub(super) fn lease_lost(&self, why: String) {
        self.state().persist.lease_lost = Some(why);
        self.shared.commit_wake.notify_one();
    }

    /// Asks the committer to flush what is staged, save the subscriptions
    /// marked clean, and stop.
    pub(super) fn close_store(&self) {
        self.state().persist.closing = true;
        self.shared.commit_wake.notify_one();
    }

    /// Waits until every event up to `seq` is durable. Fails when the store
    /// failed (the bus is stopping), with the cause.
    pub(super) async fn wait_durable(&self, seq: u64) -> Result<(), Arc<str>> {
        let mut rx = self.shared.durable.subscribe();
        let d = rx
            .wait_for(|d| d.seq >= seq || d.failed.is_some())
            .await
            .map_err(|_| Arc::<str>::from("the bus is stopping"))?;
        match (&d.failed, d.seq >= seq) {
            (_, true) => Ok(()),
            (Some(e), false) => Err(e.clone()),
            (None, false) => Err("the bus is stopping".into()),
        }
    }

    /// A receiver of the committer's progress (connections wait on it for
    /// their pipelined publish replies).
    pub(super) fn durable(&self) -> watch::Receiver<Durable> {
        self.shared.durable.subscribe()
    }

    /// Why the store failed, once it did.
    pub(super) fn store_error(&self) -> Option<Arc<str>> {
        self.state().persist.error.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::{batch_len, pick_work, Persistence, Pick, Wants, MAX_BATCH_BYTES};
    use crate::store::StoreInfo;

    #[test]
    fn a_change_wakes_the_committer_once_until_it_is_saved() {
        let mut p = Persistence::new(StoreInfo::default());
        assert!(p.is_dirty(), "what was recovered is saved first");
        assert!(!p.mark_dirty(), "already dirty: no wake-up");
        assert_eq!(p.start_save(), 0);
        assert!(!p.is_dirty());
        assert!(p.mark_dirty(), "the first change after a save wakes");
        assert!(!p.mark_dirty());
    }

    #[test]
    fn a_reply_waits_until_its_generation_is_saved() {
        let mut p = Persistence::new(StoreInfo::default());
        assert!(!p.urgent());
        let gen = p.must_save();
        assert_eq!(gen, 1);
        assert!(p.is_dirty() && p.urgent());
        // A save taken now covers the generation; a later change is newer.
        let saving = p.start_save();
        assert_eq!(saving, 1);
        assert_eq!(p.must_save(), 2);
        p.saved(saving, StoreInfo::default());
        assert!(p.urgent(), "generation 2 is not saved yet");
        p.saved(2, StoreInfo::default());
        assert!(!p.urgent());
        // An older save reported late does not move the generation back.
        p.saved(1, StoreInfo::default());
        assert!(!p.urgent());
    }

    #[test]
    fn the_store_reports_replace_what_status_shows_and_a_failure_stays() {
        let mut p = Persistence::new(StoreInfo::default());
        p.set_info(StoreInfo {
            segments: 3,
            ..StoreInfo::default()
        });
        assert_eq!(p.info().segments, 3);
        assert!(p.error().is_none());
        p.fail("disk full".into());
        assert_eq!(p.error().map(|e| e.to_string()), Some("disk full".into()));
    }

    #[test]
    fn a_batch_stops_at_its_byte_bound_but_always_takes_one_event() {
        assert_eq!(batch_len([].into_iter()), 0);
        assert_eq!(batch_len([10, 20, 30].into_iter()), 3);
        assert_eq!(batch_len([MAX_BATCH_BYTES * 2, 1].into_iter()), 1);
        let mib = 1 << 20;
        assert_eq!(batch_len([mib; 10].into_iter()), 4);
        assert_eq!(batch_len([mib, mib, mib, mib + 1].into_iter()), 3);
    }

    fn wants(staged: bool, dirty: bool, urgent: bool, save_due: bool) -> Wants {
        Wants {
            staged,
            dirty,
            urgent,
            save_due,
            closing: false,
        }
    }

    #[test]
    fn a_due_save_goes_before_staged_events_and_staged_events_before_an_early_one() {
        // Under a flood something is always staged: the save still runs once due.
        assert_eq!(pick_work(wants(true, true, false, true)), Pick::Save);
        assert_eq!(pick_work(wants(true, true, true, true)), Pick::Save);
        // Not yet due: the batch first, even when a reply waits for the save.
        assert_eq!(pick_work(wants(true, true, true, false)), Pick::Append);
        assert_eq!(pick_work(wants(true, false, false, true)), Pick::Append);
        // Nothing staged: a save a reply waits for goes at once, a lazy one when due.
        assert_eq!(pick_work(wants(false, true, true, false)), Pick::Save);
        assert_eq!(pick_work(wants(false, true, false, false)), Pick::Wait);
        assert_eq!(pick_work(wants(false, true, false, true)), Pick::Save);
        assert_eq!(pick_work(wants(false, false, false, true)), Pick::Wait);
    }

    #[test]
    fn closing_flushes_what_is_staged_then_saves_the_final_snapshot() {
        let mut w = wants(true, true, true, true);
        w.closing = true;
        // A due save may still go first; the final snapshot never before a batch.
        assert_ne!(pick_work(w), Pick::Final);
        w.staged = false;
        assert_eq!(pick_work(w), Pick::Final);
        w.dirty = false;
        assert_eq!(pick_work(w), Pick::Final);
    }
}
