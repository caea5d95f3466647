//! Sharing upstream subscriptions between identical local ones, by
//! reference count: the pure bookkeeping ([`Registry`]); the control-plane
//! calls it asks for are made by [`super::Control`].
//!
//! - The first acquire of a share key creates the upstream subscription
//!   ([`Acquire::Create`]); acquires arriving meanwhile wait for that
//!   result ([`Acquire::Wait`]); later ones share it ([`Acquire::Shared`]).
//! - When the create ends, every waiter still there gets the result and
//!   holds one reference; if nobody is left, the new subscription is
//!   cancelled at once.
//! - The last release cancels it; an acquire arriving during that cancel
//!   waits for it ([`Acquire::AfterCancel`]) and then creates anew.

use std::collections::HashMap;

use tokio::sync::oneshot;

use crate::upstream::Refusal;

/// The result a waiting acquire receives.
pub type Created = Result<String, Refusal>;

enum Slot {
    /// A create is in flight; these acquires wait for its result.
    Creating {
        waiters: Vec<oneshot::Sender<Created>>,
    },
    Ready {
        id: String,
        refs: usize,
    },
    /// The last release is cancelling it; these acquires wait, then create.
    Cancelling {
        waiters: Vec<oneshot::Sender<()>>,
    },
}

/// What an acquire does next.
pub enum Acquire {
    /// Held once more: this id.
    Shared(String),
    /// Start the create (the caller's task), then wait like [`Acquire::Wait`].
    Create(oneshot::Receiver<Created>),
    /// Wait for the create in flight.
    Wait(oneshot::Receiver<Created>),
    /// Wait for the cancel in flight, then acquire again.
    AfterCancel(oneshot::Receiver<()>),
}

/// Share key → slot, and the ready ids back to their keys.
#[derive(Default)]
pub struct Registry {
    slots: HashMap<String, Slot>,
    by_id: HashMap<String, String>,
}

impl Registry {
    pub fn acquire(&mut self, key: &str) -> Acquire {
        match self.slots.get_mut(key) {
            Some(Slot::Ready { id, refs }) => {
                *refs += 1;
                Acquire::Shared(id.clone())
            }
            Some(Slot::Creating { waiters }) => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Acquire::Wait(rx)
            }
            Some(Slot::Cancelling { waiters }) => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Acquire::AfterCancel(rx)
            }
            None => {
                let (tx, rx) = oneshot::channel();
                self.slots
                    .insert(key.to_owned(), Slot::Creating { waiters: vec![tx] });
                Acquire::Create(rx)
            }
        }
    }

    /// The create for `key` ended: hands the result to every waiter still
    /// there (one reference each). `Some(id)`: nobody took the new
    /// subscription; it is now cancelling and the caller cancels it.
    pub fn created(&mut self, key: &str, result: Created) -> Option<String> {
        let Some(Slot::Creating { waiters }) = self.slots.remove(key) else {
            return None;
        };
        match result {
            Ok(id) => {
                let refs = waiters
                    .into_iter()
                    .filter(|w| !w.is_closed())
                    .map(|w| w.send(Ok(id.clone())).is_ok())
                    .filter(|sent| *sent)
                    .count();
                if refs > 0 {
                    self.by_id.insert(id.clone(), key.to_owned());
                    self.slots.insert(key.to_owned(), Slot::Ready { id, refs });
                    None
                } else {
                    self.slots
                        .insert(key.to_owned(), Slot::Cancelling { waiters: vec![] });
                    Some(id)
                }
            }
            Err(r) => {
                for w in waiters {
                    let _ = w.send(Err(r.clone()));
                }
                None
            }
        }
    }

    /// A local subscription bound to `id` is gone. `Some(key)` when it was
    /// the last: the slot is now cancelling and the caller cancels `id`,
    /// then calls [`Registry::cancelled`].
    pub fn release(&mut self, id: &str) -> Option<String> {
        let key = self.by_id.get(id).cloned()?;
        let last = match self.slots.get_mut(&key) {
            Some(Slot::Ready { refs, .. }) => {
                *refs = refs.saturating_sub(1);
                *refs == 0
            }
            _ => false,
        };
        if !last {
            return None;
        }
        self.by_id.remove(id);
        self.slots
            .insert(key.clone(), Slot::Cancelling { waiters: vec![] });
        Some(key)
    }

    /// The cancel for `key` is done: the acquires that waited go on.
    pub fn cancelled(&mut self, key: &str) {
        if let Some(Slot::Cancelling { waiters }) = self.slots.remove(key) {
            for w in waiters {
                let _ = w.send(());
            }
        }
    }

    /// Forgets a cancelling slot that cannot be cancelled (no runtime).
    pub fn forget(&mut self, key: &str) {
        self.cancelled(key);
    }

    /// Takes every ready subscription (the bus is stopping); returns their ids.
    pub fn take_ready(&mut self) -> Vec<String> {
        let ready: Vec<(String, String)> = self
            .slots
            .iter()
            .filter_map(|(k, s)| match s {
                Slot::Ready { id, .. } => Some((k.clone(), id.clone())),
                _ => None,
            })
            .collect();
        for (k, id) in &ready {
            self.slots.remove(k);
            self.by_id.remove(id);
        }
        ready.into_iter().map(|(_, id)| id).collect()
    }

    /// The references held on `id` (0 when not ready).
    pub fn refs(&self, id: &str) -> usize {
        self.by_id
            .get(id)
            .and_then(|k| match self.slots.get(k) {
                Some(Slot::Ready { refs, .. }) => Some(*refs),
                _ => None,
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use proto::v1::ErrorCode;

    use super::*;

    fn rx_of(a: Acquire) -> oneshot::Receiver<Created> {
        match a {
            Acquire::Create(rx) | Acquire::Wait(rx) => rx,
            _ => panic!("not a create wait"),
        }
    }

    #[test]
    fn first_creates_others_wait_then_share() {
        let mut r = Registry::default();
        let mut a = rx_of(r.acquire("k"));
        let b = r.acquire("k");
        assert!(matches!(b, Acquire::Wait(_)));
        let mut b = rx_of(b);
        assert_eq!(r.created("k", Ok("sub-1".into())), None);
        assert_eq!(a.try_recv().unwrap().unwrap(), "sub-1");
        assert_eq!(b.try_recv().unwrap().unwrap(), "sub-1");
        assert_eq!(r.refs("sub-1"), 2);
        assert!(matches!(r.acquire("k"), Acquire::Shared(id) if id == "sub-1"));
        assert_eq!(r.refs("sub-1"), 3);
        // Another key is another subscription.
        assert!(matches!(r.acquire("other"), Acquire::Create(_)));
    }

    #[test]
    fn the_last_release_cancels_and_acquires_wait_for_it() {
        let mut r = Registry::default();
        let mut a = rx_of(r.acquire("k"));
        r.created("k", Ok("sub-1".into()));
        a.try_recv().unwrap().unwrap();
        assert!(matches!(r.acquire("k"), Acquire::Shared(_)));
        assert_eq!(r.release("sub-1"), None, "still held once");
        assert_eq!(r.release("sub-1"), Some("k".into()), "the last one");
        assert_eq!(r.release("sub-1"), None, "not held any more");
        let Acquire::AfterCancel(mut wait) = r.acquire("k") else {
            panic!("an acquire during the cancel waits")
        };
        assert!(wait.try_recv().is_err());
        r.cancelled("k");
        wait.try_recv().unwrap();
        assert!(
            matches!(r.acquire("k"), Acquire::Create(_)),
            "then creates anew"
        );
    }

    #[test]
    fn a_create_nobody_waits_for_any_more_is_cancelled() {
        let mut r = Registry::default();
        let a = rx_of(r.acquire("k"));
        drop(a);
        assert_eq!(r.created("k", Ok("sub-9".into())), Some("sub-9".into()));
        assert!(matches!(r.acquire("k"), Acquire::AfterCancel(_)));
        r.cancelled("k");
        // A failed create reaches every waiter and leaves nothing behind.
        let mut a = rx_of(r.acquire("k"));
        let mut b = rx_of(r.acquire("k"));
        let refusal = Refusal::new(ErrorCode::Upstream, "no");
        assert_eq!(r.created("k", Err(refusal)), None);
        assert_eq!(a.try_recv().unwrap().unwrap_err().message, "no");
        assert_eq!(b.try_recv().unwrap().unwrap_err().message, "no");
        assert!(matches!(r.acquire("k"), Acquire::Create(_)));
    }

    #[test]
    fn stopping_takes_every_ready_subscription() {
        let mut r = Registry::default();
        for (k, id) in [("a", "s-a"), ("b", "s-b")] {
            let mut rx = rx_of(r.acquire(k));
            r.created(k, Ok(id.into()));
            rx.try_recv().unwrap().unwrap();
        }
        let _creating = r.acquire("c");
        let mut ids = r.take_ready();
        ids.sort();
        assert_eq!(ids, ["s-a", "s-b"]);
        assert_eq!(r.release("s-a"), None);
        assert_eq!(r.refs("s-a"), 0);
    }
}
