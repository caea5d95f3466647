//! Housekeeping: the idle timer (the bus exits after `idle_timeout` with
//! no connection that counts — a consumer, a publisher, a change; reading
//! status does not — and no subscription that holds it: any, unless the
//! source is local and the store durable) and the TTL reaper (a detached
//! subscription is removed when its TTL runs out, releasing its upstream
//! binding; each removal is logged, and counted for status by the
//! registry).
//! One task, sleeping until the next deadline or a change. Which TTL a new
//! subscription gets is [`requested_ttl`]: a named one lives until removed
//! unless it asked for a TTL.

use std::time::{Duration, Instant};

use proto::v1::{self, ByeReason};

use super::Hub;
use crate::clock::now_ms;

/// The TTL of the subscription `req` creates: the one it asked for
/// (`--ttl`; `Duration::MAX` for `never`); else `default_ttl` when a
/// `consume` run owns it (it lingers that long after a run that could not
/// remove it), and never for a named one (`dws event subscribe`): it lives
/// until removed.
pub fn requested_ttl(req: &v1::Subscribe, default_ttl: Duration) -> Duration {
    proto::limits::ttl_from_ms(req.ttl_ms).unwrap_or(if req.owned {
        default_ttl
    } else {
        Duration::MAX
    })
}

impl Hub {
    /// Runs the idle timer and the TTL reaper until shutdown. Sleeps until the
    /// next deadline or a change in activity: no polling.
    pub(super) async fn housekeeping(self, mut shutdown: crate::shutdown::Shutdown) {
        let idle_timeout = self.shared.config.idle_timeout;
        // Subscriptions keep the bus up only where leaving loses something:
        // an upstream that delivers only while the bus runs, or a store
        // that keeps nothing. A local source on a durable store has nothing
        // to receive until a publish, which starts the bus again.
        let cfg = &self.shared.config;
        let subs_hold = cfg.source_kind != "local" || cfg.inline_commit;
        let mut idle_since: Option<(Instant, u64)> = None;
        loop {
            let notified = self.shared.housekeeping.notified();
            let now = Instant::now();
            let mut released = vec![];
            let (busy, gen, next_expiry) = {
                let mut st = self.state();
                let expired = st.registry.expire(now, now_ms());
                for sub in &expired {
                    let id = &sub.id;
                    let pending = sub.pending_len();
                    let ttl = humantime::format_duration(sub.ttl).to_string();
                    if sub.owned {
                        tracing::info!(subscription = %id, ttl, pending, "subscription expired (ttl): removed");
                    } else {
                        tracing::warn!(subscription = %id, ttl, pending, "subscription expired (ttl): removed with its backlog and parked list");
                    }
                    released.extend(sub.upstream_id.clone());
                }
                if !expired.is_empty() {
                    self.mark_subs_dirty(&mut st);
                }
                (
                    st.registry.busy(subs_hold),
                    st.registry.activity(),
                    st.registry.next_expiry(),
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
                // An idle timeout too long for the clock is no timeout.
                let idle_at = since.checked_add(idle_timeout);
                if idle_at.is_some_and(|t| t <= now) {
                    tracing::info!(timeout = ?idle_timeout, "idle: no consumers, publishers or subscriptions that keep the bus");
                    self.shared.shutdown.trigger(ByeReason::Idle);
                    return;
                }
                deadline = match (deadline, idle_at) {
                    (Some(d), Some(i)) => Some(d.min(i)),
                    (d, i) => d.or(i),
                };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_subscription_lives_until_removed_unless_it_asked_for_a_ttl() {
        let ten = Duration::from_secs(600);
        let req = |owned, ttl_ms| v1::Subscribe {
            owned,
            ttl_ms,
            ..Default::default()
        };
        assert_eq!(requested_ttl(&req(true, 0), ten), ten);
        assert_eq!(requested_ttl(&req(false, 0), ten), Duration::MAX);
        assert_eq!(
            requested_ttl(&req(false, 2000), ten),
            Duration::from_secs(2)
        );
        assert_eq!(requested_ttl(&req(true, u64::MAX), ten), Duration::MAX);
    }
}
