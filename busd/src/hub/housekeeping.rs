//! Housekeeping: the idle timer (the bus exits after `idle_timeout` with
//! no connections and no subscriptions) and the TTL reaper (a detached
//! subscription is removed when its TTL runs out, releasing its upstream
//! binding). One task, sleeping until the next deadline or a change.

use std::time::Instant;

use proto::v1::ByeReason;

use super::Hub;
use crate::subscription::Subscription;

impl Hub {
    /// Runs the idle timer and the TTL reaper until shutdown. Sleeps until the
    /// next deadline or a change in activity: no polling.
    pub async fn housekeeping(self, mut shutdown: crate::shutdown::Shutdown) {
        let idle_timeout = self.shared.config.idle_timeout;
        let mut idle_since: Option<(Instant, u64)> = None;
        loop {
            let notified = self.shared.housekeeping.notified();
            let now = Instant::now();
            let mut released = vec![];
            let (busy, gen, next_expiry) = {
                let mut st = self.state();
                let expired: Vec<String> = st
                    .subs
                    .values()
                    .filter(|s| s.expires_at().is_some_and(|t| t <= now))
                    .map(|s| s.id.clone())
                    .collect();
                for id in &expired {
                    tracing::info!(subscription = %id, "subscription expired (ttl)");
                    if let Some(up) = st.subs.remove(id).and_then(|s| s.upstream_id) {
                        released.push(up);
                    }
                }
                if !expired.is_empty() {
                    st.activity_gen += 1;
                    self.mark_subs_dirty(&mut st);
                }
                let next = st.subs.values().filter_map(Subscription::expires_at).min();
                (
                    !st.conns.is_empty() || !st.subs.is_empty(),
                    st.activity_gen,
                    next,
                )
            };
            self.release_upstream(released);
            let mut deadline = next_expiry;
            if busy || idle_timeout.is_zero() {
                idle_since = None;
            } else {
                let since = match idle_since {
                    Some((t, g)) if g == gen => t,
                    _ => now,
                };
                idle_since = Some((since, gen));
                let idle_at = since + idle_timeout;
                if idle_at <= now {
                    tracing::info!(timeout = ?idle_timeout, "idle: no consumers and no subscriptions");
                    self.shared.shutdown.trigger(ByeReason::Idle);
                    return;
                }
                deadline = Some(deadline.map_or(idle_at, |d| d.min(idle_at)));
            }
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = sleep => {}
                _ = shutdown.recv() => return,
            }
        }
    }
}
