//! Opening a file the bus reads or writes as data (`config.toml`, a secret
//! file, the store's `FORMAT`, `subscriptions.json` and segments) so that
//! anything but a regular file is refused and never hangs the bus: the open
//! is non-blocking (a FIFO opens at once instead of waiting for a writer),
//! then `fstat` on the opened descriptor decides (no race between a check
//! and the open), then the descriptor is set back to blocking. A leaf.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io::Read,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::Path,
};

/// Whether a symlink at the path is followed (a file the user names, like
/// `config.toml`) or refused (the bus's own files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    Yes,
    No,
}

/// Why a file could not be opened as a regular file.
#[derive(Debug)]
pub enum OpenError {
    /// Something else is there: `what` says what (`a FIFO`, `a directory`).
    NotRegular(&'static str),
    /// The open, `fstat` or read failed.
    Io(std::io::Error),
}

impl OpenError {
    /// The I/O error's kind; `Other` for a file that is not regular.
    pub fn kind(&self) -> std::io::ErrorKind {
        match self {
            OpenError::Io(e) => e.kind(),
            OpenError::NotRegular(_) => std::io::ErrorKind::Other,
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NotRegular(what) => {
                write!(f, "it is {what}, not a regular file; refusing to open it")
            }
            OpenError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<std::io::Error> for OpenError {
    fn from(e: std::io::Error) -> OpenError {
        OpenError::Io(e)
    }
}

pub use proto::file_type::describe;

/// Opens `path` with `options` (its mode and flags kept) plus `O_NONBLOCK`,
/// `O_CLOEXEC` and, unless `follow`, `O_NOFOLLOW`; refuses anything but a
/// regular file; returns it in blocking mode.
pub fn open(path: &Path, options: &OpenOptions, follow: Follow) -> Result<File, OpenError> {
    let mut options = options.clone();
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC;
    if follow == Follow::No {
        flags |= nix::libc::O_NOFOLLOW;
    }
    options.custom_flags(flags);
    let file = match options.open(path) {
        Ok(f) => f,
        Err(e) => {
            // EISDIR, ENXIO (a FIFO opened for writing without a reader),
            // ELOOP (a symlink under O_NOFOLLOW): name what is there.
            let meta = match follow {
                Follow::Yes => std::fs::metadata(path),
                Follow::No => std::fs::symlink_metadata(path),
            };
            return Err(match meta {
                Ok(m) if !m.is_file() => OpenError::NotRegular(describe(m.file_type())),
                _ => OpenError::Io(e),
            });
        }
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(OpenError::NotRegular(describe(meta.file_type())));
    }
    let fd = file.as_raw_fd();
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)
        .map(|f| nix::fcntl::OFlag::from_bits_truncate(f) & !nix::fcntl::OFlag::O_NONBLOCK)
        .and_then(|f| nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(f)))
        .map_err(std::io::Error::from)?;
    Ok(file)
}

/// Reads the whole regular file at `path` (see [`open`]), with its
/// metadata from the same descriptor.
pub fn read(path: &Path, follow: Follow) -> Result<(Vec<u8>, std::fs::Metadata), OpenError> {
    let mut file = open(path, OpenOptions::new().read(true), follow)?;
    let meta = file.metadata()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok((bytes, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_at_once_for_reading_and_writing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for follow in [Follow::Yes, Follow::No] {
            let err = read(&p, follow).unwrap_err();
            assert!(err.to_string().contains("a FIFO"), "{err}");
            let err = open(&p, OpenOptions::new().append(true), follow).unwrap_err();
            assert!(err.to_string().contains("a FIFO"), "{err}");
        }
    }

    #[test]
    fn a_directory_and_a_symlink_are_named_and_a_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let err = read(dir.path(), Follow::Yes).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
        let f = dir.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read(&link, Follow::Yes).unwrap().0, b"hello");
        let err = read(&link, Follow::No).unwrap_err();
        assert!(err.to_string().contains("a symbolic link"), "{err}");
        let (bytes, meta) = read(&f, Follow::No).unwrap();
        assert_eq!((bytes.as_slice(), meta.len()), (&b"hello"[..], 5));
        let missing = read(&dir.path().join("none"), Follow::No).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }
}
