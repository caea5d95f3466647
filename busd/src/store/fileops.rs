//! The file operations the disk store goes through: a trait with one real
//! implementation ([`RealFs`], thin and inlined: the same syscalls as
//! calling `std::fs` directly) and, in tests, a recording one that knows
//! what was made durable and can simulate a power cut
//! (`super::powercut`). Every call the store's durability depends on is
//! here: writes, `fdatasync`/`fsync` of a file, renames, unlinks and the
//! `fsync` of the directory that makes them durable.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::eventlog::ColdSource;

/// The disk store's view of the file system. Paths are inside the store's
/// directory; every file is opened with `O_NOFOLLOW`.
pub trait FileOps: Send {
    /// A file open for appending.
    type File: Send;
    /// Creates the directory (and its missing parents) mode 0700, making
    /// each creation durable; refuses a symlink or a non-directory.
    fn prepare_dir(&self, dir: &Path) -> Result<(), DirError>;
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates `path`, which must not exist, for appending (mode 0600).
    fn create_new(&self, path: &Path) -> io::Result<Self::File>;
    fn open_append(&self, path: &Path) -> io::Result<Self::File>;
    fn write(&self, file: &mut Self::File, bytes: &[u8]) -> io::Result<()>;
    /// `fdatasync`: the file's data (and size) are durable.
    fn sync_data(&self, file: &mut Self::File) -> io::Result<()>;
    /// Cuts the file to `len` bytes (not durable before [`Self::sync_data`]).
    fn set_len(&self, file: &mut Self::File, len: u64) -> io::Result<()>;
    /// Not durable before [`Self::sync_dir`].
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Not durable before [`Self::sync_dir`].
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// `fsync` of the directory: its creates, renames and unlinks are durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// What reads event bodies back from segments, so that the log need
    /// not hold them; `None`: the log keeps them in memory.
    fn cold_source(&self) -> Option<Arc<dyn ColdSource>> {
        None
    }
}

/// Why [`FileOps::prepare_dir`] failed.
#[derive(Debug)]
pub enum DirError {
    /// A symlink or a file where the directory should be.
    NotADirectory,
    Io(&'static str, PathBuf, io::Error),
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

fn open_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC);
    o
}

/// A refusal of [`crate::regular`] as an I/O error that names it.
fn regular_error(e: crate::regular::OpenError) -> io::Error {
    match e {
        crate::regular::OpenError::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

impl FileOps for RealFs {
    type File = File;

    fn prepare_dir(&self, dir: &Path) -> Result<(), DirError> {
        match fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() || !m.is_dir() => {
                return Err(DirError::NotADirectory)
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The ancestors that do not exist yet: each new entry is made
                // durable by an fsync of its parent.
                let missing: Vec<&Path> = dir
                    .ancestors()
                    .take_while(|p| !p.as_os_str().is_empty() && fs::symlink_metadata(p).is_err())
                    .collect();
                fs::create_dir_all(dir)
                    .map_err(|e| DirError::Io("cannot create", dir.to_owned(), e))?;
                for p in missing.iter().rev() {
                    if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
                        self.sync_dir(parent)
                            .map_err(|e| DirError::Io("cannot fsync", parent.to_owned(), e))?;
                    }
                }
            }
            Err(e) => return Err(DirError::Io("cannot read", dir.to_owned(), e)),
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| DirError::Io("cannot chmod 700", dir.to_owned(), e))
    }

    /// A regular file only, opened without blocking and without following
    /// a symlink (`crate::regular`): a FIFO is refused, never waited on.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        crate::regular::read(path, crate::regular::Follow::No)
            .map(|(bytes, _)| bytes)
            .map_err(regular_error)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = vec![];
        for entry in fs::read_dir(dir)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    #[inline]
    fn create_new(&self, path: &Path) -> io::Result<File> {
        open_options().append(true).create_new(true).open(path)
    }

    fn open_append(&self, path: &Path) -> io::Result<File> {
        crate::regular::open(
            path,
            open_options().append(true),
            crate::regular::Follow::No,
        )
        .map_err(regular_error)
    }

    #[inline]
    fn write(&self, file: &mut File, bytes: &[u8]) -> io::Result<()> {
        file.write_all(bytes)
    }

    #[inline]
    fn sync_data(&self, file: &mut File) -> io::Result<()> {
        file.sync_data()
    }

    #[inline]
    fn set_len(&self, file: &mut File, len: u64) -> io::Result<()> {
        file.set_len(len)
    }

    #[inline]
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    #[inline]
    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    #[inline]
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn cold_source(&self) -> Option<Arc<dyn ColdSource>> {
        Some(Arc::new(super::disk::cold::SegmentReader::default()))
    }
}
