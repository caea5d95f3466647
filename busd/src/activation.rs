//! Socket activation: the listening socket a service manager passes
//! (`LISTEN_FDS=1`, `LISTEN_PID` = our pid, the socket as fd 3), e.g. the
//! user unit `contrib/systemd/dws-bus@.socket`.
//!
//! The socket must be exactly the one `dws` looks for: a listening Unix
//! stream socket bound at this profile's socket path. Anything else is
//! refused with what to set, since a bus listening elsewhere would leave
//! `dws` to spawn a second, unmanaged one. An activated bus neither binds
//! nor unlinks the socket: the service manager owns it, and keeps it
//! listening while the bus is stopped, so the next client starts the unit
//! again instead of spawning a bus of its own.

use std::{
    os::{
        fd::{FromRawFd, OwnedFd, RawFd},
        unix::net::UnixListener,
    },
    path::Path,
};

use nix::sys::socket::{getsockname, getsockopt, sockopt, AddressFamily, SockType, UnixAddr};

/// Why an inherited socket cannot serve this profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivationError {
    /// `LISTEN_PID`/`LISTEN_FDS` could not be read.
    Environment(String),
    /// More than one socket was passed; the bus serves one.
    TooMany(usize),
    /// fd 3 is not a listening Unix stream socket.
    NotAListeningUnixSocket(String),
    /// The socket is bound elsewhere than where `dws` looks.
    WrongPath { bound: String, expected: String },
}

impl std::fmt::Display for ActivationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActivationError::Environment(e) => write!(f, "socket activation: {e}"),
            ActivationError::TooMany(n) => write!(
                f,
                "socket activation: {n} sockets passed (LISTEN_FDS={n}); busd serves exactly one"
            ),
            ActivationError::NotAListeningUnixSocket(why) => write!(
                f,
                "socket activation: fd 3 is not a listening Unix stream socket ({why}); use \
                 ListenStream= with a path"
            ),
            ActivationError::WrongPath { bound, expected } => write!(
                f,
                "socket activation: the passed socket is bound at {bound}, but dws looks for \
                 this profile's bus at {expected}: set ListenStream={expected} \
                 (scripts/install-systemd.sh writes it)"
            ),
        }
    }
}

/// The inherited listening socket, if the service manager passed one to this
/// process; `Ok(None)` when this run is not socket-activated.
pub fn inherited(expected: &Path) -> Result<Option<UnixListener>, ActivationError> {
    let fds: Vec<RawFd> = sd_notify::listen_fds()
        .map_err(|e| ActivationError::Environment(e.to_string()))?
        .collect();
    match fds.as_slice() {
        [] => Ok(None),
        [fd] => {
            check(*fd, expected)?;
            // SAFETY: `listen_fds` returned this fd for this pid (LISTEN_PID
            // checked): it is open, ours, and taken over exactly once here.
            let owned = unsafe { OwnedFd::from_raw_fd(*fd) };
            let listener = UnixListener::from(owned);
            listener
                .set_nonblocking(true)
                .map_err(|e| ActivationError::NotAListeningUnixSocket(e.to_string()))?;
            Ok(Some(listener))
        }
        more => Err(ActivationError::TooMany(more.len())),
    }
}

/// Checks that `fd` listens as a Unix stream socket bound at `expected`.
fn check(fd: RawFd, expected: &Path) -> Result<(), ActivationError> {
    let bad = |e: nix::Error| ActivationError::NotAListeningUnixSocket(e.to_string());
    // SAFETY of the borrow: the fd is open for the whole call (see `inherited`).
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let kind = getsockopt(&borrowed, sockopt::SockType).map_err(bad)?;
    let listening = getsockopt(&borrowed, sockopt::AcceptConn).map_err(bad)?;
    let addr: UnixAddr = getsockname(fd).map_err(bad)?;
    let family_ok = nix::sys::socket::SockaddrLike::family(&addr) == Some(AddressFamily::Unix);
    let bound = addr.path().map(Path::to_path_buf);
    decide(kind, listening, family_ok, bound.as_deref(), expected)
}

/// The pure decision over what `fd` turned out to be.
fn decide(
    kind: SockType,
    listening: bool,
    unix: bool,
    bound: Option<&Path>,
    expected: &Path,
) -> Result<(), ActivationError> {
    if !unix || kind != SockType::Stream {
        return Err(ActivationError::NotAListeningUnixSocket(
            "not AF_UNIX SOCK_STREAM".to_owned(),
        ));
    }
    if !listening {
        return Err(ActivationError::NotAListeningUnixSocket(
            "not listening".to_owned(),
        ));
    }
    match bound {
        Some(p) if p == expected => Ok(()),
        other => Err(ActivationError::WrongPath {
            bound: other.map_or_else(
                || "an unnamed or abstract address".to_owned(),
                |p| p.display().to_string(),
            ),
            expected: expected.display().to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listening_unix_stream_socket_at_the_profiles_path_serves() {
        let want = Path::new("/run/user/1/dws-event-1/a.sock");
        assert_eq!(
            decide(SockType::Stream, true, true, Some(want), want),
            Ok(())
        );
        assert!(matches!(
            decide(SockType::Datagram, true, true, Some(want), want),
            Err(ActivationError::NotAListeningUnixSocket(_))
        ));
        assert!(matches!(
            decide(SockType::Stream, false, true, Some(want), want),
            Err(ActivationError::NotAListeningUnixSocket(_))
        ));
        assert!(matches!(
            decide(SockType::Stream, true, false, Some(want), want),
            Err(ActivationError::NotAListeningUnixSocket(_))
        ));
        let err = decide(
            SockType::Stream,
            true,
            true,
            Some(Path::new("/tmp/x")),
            want,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ListenStream=/run/user/1/dws-event-1/a.sock"),
            "{err}"
        );
        assert!(decide(SockType::Stream, true, true, None, want).is_err());
    }

    #[test]
    fn no_listen_env_is_not_activated() {
        // The test runner's pid is never a LISTEN_PID set for it.
        assert!(matches!(inherited(Path::new("/nowhere")), Ok(None)));
    }
}
