//! The systemd readiness protocol, spoken by `busd --foreground` when it runs
//! under a service manager (`NOTIFY_SOCKET` set, e.g. a `Type=notify` unit):
//!
//! - `STATUS=starting …` as soon as the flags are parsed;
//! - `READY=1` once the socket is bound and listening and the store is
//!   recovered — a client connecting after it is served;
//! - `STATUS=serving …` with the bus's counts, refreshed while they change
//!   (at most every [`STATUS_INTERVAL`]), so `systemctl --user status` shows them;
//! - `STOPPING=1` with `STATUS=stopping (<reason>)` when the shutdown starts;
//! - `WATCHDOG=1` every half of `WATCHDOG_USEC` (a unit's `WatchdogSec=`)
//!   from the serving thread's runtime, so a bus whose runtime is stuck
//!   stops pinging and systemd restarts it.
//!
//! A bus that `dws` spawns (no `--foreground`) never notifies, even if it
//! inherited `NOTIFY_SOCKET` from its spawner: the socket belongs to
//! whoever started `dws`. A notification never waits: it is one
//! non-blocking datagram, dropped when the manager's queue is full (a
//! stalled service manager) or the socket is gone; failures are logged at
//! most once a minute, never fatal. One [`Notifier`] per run, made by
//! `main` before any thread starts.
//! See `contrib/systemd/dws-bus@.service`.

use std::{ffi::OsStr, io, os::unix::net::UnixDatagram, sync::Arc, time::Duration};

use proto::{paths::Endpoint, v1::ByeReason};
use sd_notify::NotifyState;

use crate::{hub::StatusReader, ratelimit::LogLimit, shutdown::Shutdown};

/// How often the `STATUS=` line is refreshed (only sent when it changed).
pub const STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// What this run tells its service manager (cheap to clone): nothing
/// unless supervised.
#[derive(Debug, Clone)]
pub struct Notifier(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    enabled: bool,
    /// One line a minute about notifications that could not be sent.
    failures: LogLimit,
}

/// `true` when this run is supervised by a service manager: `--foreground`
/// and a non-empty `NOTIFY_SOCKET`. Decides the idle-timeout default too
/// (see [`crate::config::Args::parse_from_argv`]).
pub fn supervised(foreground: bool) -> bool {
    foreground && std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty())
}

impl Notifier {
    /// Notifications on for a supervised run, which reports `starting`.
    /// Made once, right after the flags are parsed.
    pub fn init(foreground: bool, profile: Option<&str>) -> Notifier {
        let n = Notifier(Arc::new(Inner {
            enabled: supervised(foreground),
            failures: LogLimit::new(Duration::from_secs(60)),
        }));
        n.status(&format!(
            "starting (profile {})",
            profile.unwrap_or("from DWS_PROFILE or default")
        ));
        n
    }

    /// A run that never notifies (tests, `--doctor`).
    pub fn off() -> Notifier {
        Notifier(Arc::new(Inner {
            enabled: false,
            failures: LogLimit::new(Duration::from_secs(60)),
        }))
    }

    /// `true` when a service manager is told.
    pub fn enabled(&self) -> bool {
        self.0.enabled
    }

    fn send(&self, states: &[NotifyState]) {
        if self.enabled() {
            send(states, &self.0.failures);
        }
    }

    /// Sends one `STATUS=` line.
    pub fn status(&self, text: &str) {
        self.send(&[NotifyState::Status(text)]);
    }
}

fn send(states: &[NotifyState], failures: &LogLimit) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
    // Before logging is set up (`starting`) a failure has nowhere to go:
    // it must not use up the minute's line.
    if let Err(e) = send_datagram(&path, msg.as_bytes()) {
        if !tracing::dispatcher::has_been_set() {
            return;
        }
        crate::warn_limited!(
            failures,
            "cannot notify the service manager (NOTIFY_SOCKET {}): {e}; the notification is dropped",
            path.to_string_lossy()
        );
    }
}

/// One datagram to the service manager's socket, never waiting: a full
/// queue is `WouldBlock`. A path starting with `@` is an abstract socket.
fn send_datagram(path: &OsStr, msg: &[u8]) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    let bytes = path.as_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(msg, &addr)?
        }
        None => sock.send_to(msg, path)?,
    };
    if sent != msg.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "incomplete write"));
    }
    Ok(())
}

/// How often to send `WATCHDOG=1` for a watchdog of `timeout`: half of it,
/// as sd_watchdog_enabled(3) advises, but never more often than every 10 ms.
pub fn ping_interval(timeout: Duration) -> Duration {
    (timeout / 2).max(Duration::from_millis(10))
}

/// Sends `WATCHDOG=1` every [`ping_interval`] while the bus serves, when the
/// service manager asked for it (`WATCHDOG_USEC`, and `WATCHDOG_PID` unset
/// or ours). The pings run on the runtime that serves every connection and
/// take the hub's lock, so a stuck runtime or a lock never released stops them.
fn watchdog(n: Notifier, hub: StatusReader, mut shutdown: Shutdown) {
    let Some(timeout) = sd_notify::watchdog_enabled() else {
        return;
    };
    let every = ping_interval(timeout);
    tracing::info!(?timeout, ?every, "systemd watchdog: pinging");
    tokio::spawn(async move {
        loop {
            let _ = hub.status_json(0);
            n.send(&[NotifyState::Watchdog]);
            tokio::select! {
                _ = shutdown.recv() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    });
}

/// `READY=1` with a first `STATUS=`; then keeps the status current until the
/// shutdown starts, and pings the watchdog if one is set. Call after the
/// socket listens (the ready pipe's `R`).
pub fn ready(n: &Notifier, hub: &StatusReader, endpoint: &Endpoint, mut shutdown: Shutdown) {
    if !n.enabled() {
        return;
    }
    watchdog(n.clone(), hub.clone(), shutdown.clone());
    let first = summary(hub, endpoint);
    n.send(&[NotifyState::Ready, NotifyState::Status(&first)]);
    let n = n.clone();
    let hub = hub.clone();
    let endpoint = endpoint.clone();
    tokio::spawn(async move {
        let mut last = first;
        loop {
            tokio::select! {
                _ = shutdown.recv() => return,
                () = tokio::time::sleep(STATUS_INTERVAL) => {}
            }
            let now = summary(&hub, &endpoint);
            if now != last {
                n.status(&now);
                last = now;
            }
        }
    });
}

/// `STOPPING=1` and why. Call when the shutdown starts.
pub fn stopping(n: &Notifier, reason: ByeReason) {
    let text = format!("stopping ({})", proto::bye_reason_name(reason));
    n.send(&[NotifyState::Stopping, NotifyState::Status(&text)]);
}

/// The one-line status: profile, counts, source state, socket.
fn summary(hub: &StatusReader, endpoint: &Endpoint) -> String {
    // Lists are not needed: with none listed, `truncated` carries the totals.
    let doc = hub.status_json(0);
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    format!(
        "serving profile {}: {} connection(s), {} subscription(s), source {} {}, head seq {}; socket {}",
        endpoint.profile,
        n(&doc["bus"]["connections"]),
        n(&doc["truncated"]["subscriptions_total"]),
        doc["source"]["kind"].as_str().unwrap_or("?"),
        doc["source"]["state"].as_str().unwrap_or("?"),
        n(&doc["log"]["head_seq"]),
        endpoint.socket_path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_foreground_run_is_supervised() {
        // NOTIFY_SOCKET is whatever the test runner has; without
        // --foreground it never counts.
        assert!(!supervised(false));
    }

    #[test]
    fn a_full_or_absent_socket_fails_at_once_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        // Nobody reads: the queue fills, and then each send fails at once.
        let started = std::time::Instant::now();
        let mut refused = 0;
        for _ in 0..10_000 {
            if send_datagram(path.as_os_str(), &[b'x'; 512]).is_err() {
                refused += 1;
            }
            if refused > 10 {
                break;
            }
        }
        assert!(refused > 10, "the queue never filled");
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(receiver);
        assert!(send_datagram(path.as_os_str(), b"READY=1\n").is_err());
        assert!(send_datagram(OsStr::new("@dws-test-no-such-socket"), b"x").is_err());
    }

    #[test]
    fn the_watchdog_is_pinged_at_half_its_timeout() {
        assert_eq!(
            ping_interval(Duration::from_secs(30)),
            Duration::from_secs(15)
        );
        assert_eq!(
            ping_interval(Duration::from_micros(1)),
            Duration::from_millis(10)
        );
    }
}
