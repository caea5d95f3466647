//! The cross-process refresh lock, as the reference CLI takes it
//! (`internal/auth/filelock.go` `acquireTokenLock`): an exclusive `flock`
//! on `.data.lock` in the directory of the token files, tried every 50 ms
//! for up to 10 s (`config.LockTimeout`). Two processes sharing a rotating
//! refresh token (two buses, or a bus and the reference CLI pointed at the
//! same directory) thus refresh one at a time, and the one that waited
//! re-reads the token before spending the refresh token again.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::fcntl::{Flock, FlockArg};

/// The lock file's name, the reference's `lockFileName`.
pub const LOCK_FILE: &str = ".data.lock";
/// The reference's `config.LockTimeout`.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The reference's `lockRetryDelay`.
const RETRY: Duration = Duration::from_millis(50);

/// The held lock; released when dropped.
pub struct RefreshLock {
    _file: Flock<File>,
}

/// Where the lock of tokens kept in `token_file` lives.
pub fn lock_path(token_file: &Path) -> PathBuf {
    let dir = token_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    dir.join(LOCK_FILE)
}

/// Why the refresh lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot open the refresh lock {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the refresh lock {} is held by another process for more than {}s", .0.display(), TIMEOUT.as_secs())]
    Held(PathBuf),
    #[error("cannot lock {}: {errno}", path.display())]
    Lock {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
}

/// Takes the lock at `path`, waiting up to 10 s for another holder.
pub async fn acquire(path: &Path) -> Result<RefreshLock, LockError> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| LockError::Open {
            path: path.to_owned(),
            source,
        })?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Ok(RefreshLock { _file: locked }),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(LockError::Held(path.to_owned()));
                }
                file = f;
                tokio::time::sleep(RETRY).await;
            }
            Err((_, errno)) => {
                return Err(LockError::Lock {
                    path: path.to_owned(),
                    errno,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_sits_next_to_the_token() {
        assert_eq!(
            lock_path(Path::new("/a/b/refresh")),
            Path::new("/a/b/.data.lock")
        );
        assert_eq!(lock_path(Path::new("refresh")), Path::new("./.data.lock"));
    }

    #[tokio::test]
    async fn a_second_holder_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(LOCK_FILE);
        let first = acquire(&p).await.unwrap();
        let p2 = p.clone();
        let waiter = tokio::spawn(async move { acquire(&p2).await.map(drop) });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!waiter.is_finished(), "the second waits");
        drop(first);
        waiter.await.unwrap().unwrap();
    }
}
