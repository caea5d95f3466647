//! The wake-up relay: the committer (a plain thread) hands the connections
//! a committed batch must wake, and the new durable head, to one task on
//! the runtime, which wakes them there.
//!
//! Why: every task woken from outside the runtime costs a write to the
//! runtime's eventfd (tokio's `current_thread` scheduler unparks its driver
//! once per remote wake-up), so a commit that woke the publisher and N
//! consumers directly cost N + 1 of them. Through the relay it costs one,
//! and the N + 1 wake-ups become local ones. Callers on the runtime thread
//! (the memory store's inline commit, a cluster follower's replicated
//! batches) wake directly, as does every caller while no relay runs (unit
//! tests).

use std::sync::{atomic::Ordering, Arc};

use super::{lock, ConnHandle, Hub};

/// Held by a running relay: when the relay stops for any reason (its task
/// aborted, the runtime dropped, a panic), commits go back to waking
/// directly, and what was handed to the relay but not passed on is passed
/// on here, so no commit's wake-ups are lost with it.
struct RelayOn(Hub);

impl Drop for RelayOn {
    fn drop(&mut self) {
        self.0.shared.relay_on.store(false, Ordering::Release);
        self.0.pass_on();
    }
}

/// What the relay has not passed on yet.
#[derive(Default)]
pub(super) struct Pending {
    wake: Vec<Arc<ConnHandle>>,
    /// The durable head moved: its watchers are to be told.
    durable: bool,
}

impl Hub {
    /// Runs the relay until the runtime stops (it never returns on its own).
    pub(super) async fn wake_relay(self) {
        self.shared.relay_on.store(true, Ordering::Release);
        let _on = RelayOn(self.clone());
        loop {
            self.shared.relay_wake.notified().await;
            self.pass_on();
        }
    }

    /// Tells the durable head's watchers and wakes what the relay holds.
    fn pass_on(&self) {
        let Pending { wake, durable } = std::mem::take(&mut *lock(&self.shared.relay));
        if durable {
            // The value is set already (see `after_fan_out`): only tell.
            self.shared.durable.send_modify(|_| {});
        }
        wake_all(wake);
    }

    /// Publishes the durable head `head` and wakes `wake`: directly on the
    /// runtime thread (or when no relay runs), else through the relay.
    pub(super) fn after_fan_out(&self, wake: Vec<Arc<ConnHandle>>, head: u64) {
        let on_runtime = tokio::runtime::Handle::try_current().is_ok();
        if on_runtime || !self.shared.relay_on.load(Ordering::Acquire) {
            self.shared.durable.send_modify(|d| d.seq = head);
            return wake_all(wake);
        }
        // The head is set here, in order with everything else the committer
        // reports (a store failure after it sees it), without waking
        // anyone; the relay tells the watchers.
        self.shared.durable.send_if_modified(|d| {
            d.seq = head;
            false
        });
        {
            let mut p = lock(&self.shared.relay);
            p.wake.extend(wake);
            p.durable = true;
        }
        self.shared.relay_wake.notify_one();
        // The relay stopped meanwhile: pass this on here (at worst twice,
        // which costs a spurious wake-up, never a lost one).
        if !self.shared.relay_on.load(Ordering::Acquire) {
            self.pass_on();
        }
    }
}

fn wake_all(mut wake: Vec<Arc<ConnHandle>>) {
    wake.sort_by_key(Arc::as_ptr);
    wake.dedup_by_key(|h| Arc::as_ptr(h));
    for w in wake {
        w.wake.notify_one();
    }
}
