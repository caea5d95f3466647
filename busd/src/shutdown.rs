//! The one shutdown signal of the bus. Every reason to stop — a signal, an
//! idle timeout, a StopRequest, a lost source — goes through
//! [`ShutdownTrigger::trigger`]; the first reason wins and every connection
//! reads that same reason to put in its final `Bye`.

use proto::v1::ByeReason;
use tokio::sync::watch;

/// Fires the shutdown. Cheap to clone; the first reason given wins.
#[derive(Clone, Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<Option<ByeReason>>,
}

/// Waits for the shutdown. Cheap to clone; `recv` returns at once once fired.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<Option<ByeReason>>,
}

pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(None);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    /// Starts the shutdown with `reason` unless it already started.
    pub fn trigger(&self, reason: ByeReason) {
        self.tx.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Whether the shutdown started (for a thread that cannot wait on it).
    pub fn fired(&self) -> bool {
        self.tx.borrow().is_some()
    }

    pub fn listener(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    pub fn reason(&self) -> Option<ByeReason> {
        *self.rx.borrow()
    }

    /// Resolves with the reason once the shutdown has started.
    pub async fn recv(&mut self) -> ByeReason {
        match self.rx.wait_for(Option::is_some).await {
            Ok(r) => r.unwrap_or(ByeReason::Shutdown),
            // The trigger is gone: nothing can start a shutdown any more, so
            // the bus is going away anyway.
            Err(_) => ByeReason::Shutdown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_reason_wins() {
        let (t, mut s) = channel();
        assert_eq!(s.reason(), None);
        t.trigger(ByeReason::Idle);
        t.trigger(ByeReason::Shutdown);
        assert_eq!(s.recv().await, ByeReason::Idle);
        assert_eq!(t.listener().recv().await, ByeReason::Idle);
    }
}
