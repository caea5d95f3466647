//! `bus.lock`: the single-instance guarantee. The daemon holds an exclusive
//! `flock` on it for its whole life and writes its pid into it. The kernel
//! drops the lock when the process dies, so a lock left by a `kill -9`ed bus
//! is simply taken over by the next one. It is opened through
//! [`socket::open_private_file`](crate::socket::open_private_file): a symlink
//! planted at `bus.lock` is refused, and its target is never truncated.

use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, SeekFrom, Write},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

use nix::fcntl::{Flock, FlockArg};

use crate::{ready::StartError, socket};

/// The held lock; released when dropped (or when the process dies).
pub struct BusLock {
    _file: Flock<File>,
}

/// Outcome of one attempt to take the lock.
pub enum TryLock {
    Acquired(BusLock),
    /// Another process holds it; its pid as written in the file, if readable.
    Busy(Option<u32>),
}

pub fn try_lock(path: &Path) -> Result<TryLock, StartError> {
    let file = socket::open_private_file(
        path,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600),
    )?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut locked) => {
            let pid = std::process::id().to_string();
            let written = locked
                .set_len(0)
                .and_then(|()| locked.seek(SeekFrom::Start(0)).map(drop))
                .and_then(|()| locked.write_all(pid.as_bytes()));
            if let Err(e) = written {
                return Err(StartError::runtime(format!(
                    "cannot write pid to {}: {e}",
                    path.display()
                )));
            }
            Ok(TryLock::Acquired(BusLock { _file: locked }))
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut s = String::new();
            let pid = file
                .read_to_string(&mut s)
                .ok()
                .and_then(|_| s.trim().parse().ok());
            Ok(TryLock::Busy(pid))
        }
        Err((_, errno)) => Err(StartError::runtime(format!(
            "cannot lock {}: {errno}",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_busy_until_released() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("bus.lock");
        let TryLock::Acquired(held) = try_lock(&p).unwrap() else {
            panic!("first lock")
        };
        match try_lock(&p).unwrap() {
            TryLock::Busy(pid) => assert_eq!(pid, Some(std::process::id())),
            TryLock::Acquired(_) => panic!("lock taken twice"),
        }
        drop(held);
        assert!(matches!(try_lock(&p).unwrap(), TryLock::Acquired(_)));
    }

    #[test]
    fn a_symlink_at_bus_lock_is_refused_and_its_target_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let p = tmp.path().join("bus.lock");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let Err(e) = try_lock(&p) else {
            panic!("a symlinked bus.lock was taken")
        };
        assert_eq!(e.kind, crate::ready::FailureKind::Permission, "{e:?}");
        assert!(e.message.contains("symbolic link"), "{e:?}");
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }
}
