//! `bus.log`: a size-bounded log file for `tracing`. When the file passes
//! [`MAX_LOG_BYTES`] it is renamed to `bus.log.1` (replacing the previous one)
//! and a new `bus.log` is started, so the logs never take more than twice that.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

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

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl RotatingLog {
    pub fn open(path: &Path) -> io::Result<RotatingLog> {
        let file = open(path)?;
        let size = file.metadata()?.len();
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
            g.file = open(&g.path)?;
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
}
