//! Reading the bus's own files (`store/FORMAT`, `bus.lock`) as busd opens
//! them (its `regular.rs`), for `dws event doctor`: the open is
//! non-blocking and does not follow a symbolic link (a FIFO opens at once
//! instead of waiting for a writer), `fstat` on the opened descriptor
//! decides (no race between a check and the open), anything but a regular
//! file is refused, and a read takes at most a bound of bytes (a file grown
//! huge, or a device, can never exhaust memory). A leaf.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io::Read,
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

/// Why a file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// Nothing is there.
    NotFound,
    /// Something other than a regular file is there: what it is.
    NotRegular(&'static str),
    /// Longer than the bound: its size.
    TooLarge(u64),
    /// The open, `fstat` or read failed.
    Io(std::io::Error),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::NotFound => f.write_str("it does not exist"),
            ReadError::NotRegular(what) => write!(f, "it is {what}, not a regular file"),
            ReadError::TooLarge(n) => write!(f, "it is {n} bytes, far more than it may be"),
            ReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

pub use proto::file_type::describe;

/// Opens `path` for reading: non-blocking, `O_NOFOLLOW`, regular files only.
pub fn open(path: &Path) -> Result<File, ReadError> {
    let flags = nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC;
    let file = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::NotFound),
        // ELOOP (a symlink under O_NOFOLLOW), EISDIR, ENXIO: name what is there.
        Err(e) => {
            return Err(match std::fs::symlink_metadata(path) {
                Ok(m) if !m.is_file() => ReadError::NotRegular(describe(m.file_type())),
                _ => ReadError::Io(e),
            })
        }
    };
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(describe(meta.file_type())));
    }
    Ok(file)
}

/// Reads at most `max` bytes of `file` (a regular file from [`open`]):
/// [`ReadError::TooLarge`] when there are more.
pub fn read_bounded(file: File, max: usize) -> Result<Vec<u8>, ReadError> {
    let size = file.metadata().map_or(0, |m| m.len());
    let mut bytes = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() > max {
        return Err(ReadError::TooLarge(size.max(bytes.len() as u64)));
    }
    Ok(bytes)
}

/// [`open`] then [`read_bounded`].
pub fn read(path: &Path, max: usize) -> Result<Vec<u8>, ReadError> {
    read_bounded(open(path)?, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_a_symlink_and_a_device_are_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let err = read(&fifo, 64).unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let err = read(&link, 64).unwrap_err();
        assert!(err.to_string().contains("a symbolic link"), "{err}");
        let err = read(Path::new("/dev/zero"), 64).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        let err = read(dir.path(), 64).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
        assert!(matches!(
            read(&dir.path().join("none"), 64),
            Err(ReadError::NotFound)
        ));
    }

    #[test]
    fn a_read_takes_at_most_its_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("f");
        std::fs::write(&f, b"hello").expect("write");
        assert_eq!(read(&f, 5).expect("read"), b"hello");
        std::fs::write(&f, vec![b'x'; 10_000]).expect("write");
        match read(&f, 64) {
            Err(ReadError::TooLarge(n)) => assert_eq!(n, 10_000),
            other => panic!("{other:?}"),
        }
    }
}
