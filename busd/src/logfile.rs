//! `bus.log`: a size-bounded log file for `tracing`. When the file passes
//! [`MAX_LOG_BYTES`] it is renamed to `bus.log.1` (replacing the previous one)
//! and a new `bus.log` is started, so the logs never take more than twice that.
//!
//! `bus.log` is opened through
//! [`socket::open_private_file`](crate::socket::open_private_file), at start
//! and after each rotation: a symlink planted there is refused, never
//! appended to. `bus.log.1` is only ever the target of `rename`, which
//! replaces a symlink planted there instead of following it.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use crate::{ready::StartError, socket};

/// Size at which `bus.log` is rotated.
pub const MAX_LOG_BYTES: u64 = 4 * 1024 * 1024;

struct Inner {
    path: PathBuf,
    file: File,
    size: u64,
}

/// A cloneable writer onto the rotating log file.
#[derive(Clone)]
pub struct RotatingLog {
    inner: Arc<Mutex<Inner>>,
}

fn open(path: &Path) -> Result<File, StartError> {
    socket::open_private_file(
        path,
        OpenOptions::new().create(true).append(true).mode(0o600),
    )
}

impl RotatingLog {
    pub fn open(path: &Path) -> Result<RotatingLog, StartError> {
        let file = open(path)?;
        let size = file
            .metadata()
            .map_err(|e| StartError::runtime(format!("cannot inspect {}: {e}", path.display())))?
            .len();
        Ok(RotatingLog {
            inner: Arc::new(Mutex::new(Inner {
                path: path.to_owned(),
                file,
                size,
            })),
        })
    }
}

impl Write for RotatingLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.size + buf.len() as u64 > MAX_LOG_BYTES && g.size > 0 {
            let rotated = g.path.with_extension("log.1");
            std::fs::rename(&g.path, rotated)?;
            g.file = open(&g.path).map_err(|e| io::Error::other(e.message))?;
            g.size = 0;
        }
        g.file.write_all(buf)?;
        g.size += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RotatingLog {
    type Writer = RotatingLog;
    fn make_writer(&'a self) -> RotatingLog {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("bus.log");
        let mut log = RotatingLog::open(&p).unwrap();
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..6 {
            log.write_all(&chunk).unwrap();
        }
        assert!(std::fs::metadata(&p).unwrap().len() <= MAX_LOG_BYTES);
        assert!(tmp.path().join("bus.log.1").exists());
    }

    #[test]
    fn planted_symlinks_are_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let p = tmp.path().join("bus.log");

        // At bus.log: refused at open.
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let Err(e) = RotatingLog::open(&p) else {
            panic!("a symlinked bus.log was opened")
        };
        assert_eq!(e.kind, crate::ready::FailureKind::Permission, "{e:?}");
        assert!(e.message.contains("symbolic link"), "{e:?}");
        std::fs::remove_file(&p).unwrap();

        // At bus.log.1: rotation replaces the link, not its target.
        let rotated = tmp.path().join("bus.log.1");
        std::os::unix::fs::symlink(&target, &rotated).unwrap();
        let mut log = RotatingLog::open(&p).unwrap();
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..5 {
            log.write_all(&chunk).unwrap();
        }
        assert!(!std::fs::symlink_metadata(&rotated).unwrap().is_symlink());

        // At bus.log while the log is open: the next rotation renames the
        // link (rename never follows it) and starts a fresh regular file.
        let aside = tmp.path().join("aside");
        std::fs::rename(&p, &aside).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        for _ in 0..5 {
            let _ = log.write_all(&chunk);
        }
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }
}
