//! The bus's private paths and its Unix socket.
//!
//! One rule for every directory the bus keeps something in — the socket dir
//! and the work dir (`<config root>/events/` and `events/<profile>/`):
//! [`prepare_private_dir`] creates it 0700 and refuses it unless it is a real
//! directory (not a symlink), owned by the effective uid and not writable by
//! group or others. One rule for every file the bus opens in them (`bus.lock`,
//! `bus.log`, `bus.meta.tmp`): [`open_private_file`] never follows a symlink
//! (`O_NOFOLLOW`), never blocks on a FIFO, and refuses anything but a regular
//! file. A refusal is a permission failure (ready pipe `P`, `dws` exits 3),
//! and what a planted symlink points to is never touched.
//!
//! The socket itself is 0600 in that directory. Only the holder of
//! `bus.lock` calls [`bind`], so only it may remove a stale socket file.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    },
    path::Path,
};

use crate::ready::StartError;

/// Creates the socket directory (0700, and its parent if needed) and checks
/// it with [`prepare_private_dir`].
pub fn prepare_dir(dir: &Path) -> Result<(), StartError> {
    if let Some(parent) = dir.parent() {
        if !parent.exists() {
            fs::create_dir_all(parent).map_err(|e| {
                StartError::from_io(format!("cannot create {}: {e}", parent.display()), &e)
            })?;
        }
    }
    prepare_private_dir(dir, "socket directory")
}

/// Creates `dir` with mode 0700 if it is missing (its parent must exist) and
/// checks that it is safe to keep the bus's files in: a real directory, not a
/// symlink, owned by the effective uid, not writable by group or others. An
/// existing directory is never chmodded: a loose one is refused, since
/// someone may already have planted files in it. `what` names it in errors.
pub fn prepare_private_dir(dir: &Path, what: &str) -> Result<(), StartError> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(StartError::from_io(
                format!("cannot create {what} {}: {e}", dir.display()),
                &e,
            ))
        }
    }
    let meta = fs::symlink_metadata(dir).map_err(|e| {
        StartError::from_io(format!("cannot inspect {what} {}: {e}", dir.display()), &e)
    })?;
    check_dir(&meta, nix::unistd::geteuid().as_raw())
        .map_err(|why| StartError::permission(format!("refusing {what} {}: {why}", dir.display())))
}

/// Why a directory with `meta` (from `lstat`) is not private to `uid`.
fn check_dir(meta: &fs::Metadata, uid: u32) -> Result<(), String> {
    let ft = meta.file_type();
    if ft.is_symlink() {
        return Err("it is a symbolic link, not a directory; remove the link".to_owned());
    }
    if !ft.is_dir() {
        return Err(format!("it is {}, not a directory", describe(ft)));
    }
    if meta.uid() != uid {
        return Err(format!("owned by uid {}, not by uid {uid}", meta.uid()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "group or world writable (mode {mode:04o}); run chmod 700 on it"
        ));
    }
    Ok(())
}

/// Opens `path`, one of the bus's own files in a directory checked by
/// [`prepare_private_dir`], with `options` plus `O_NOFOLLOW | O_CLOEXEC`: a
/// symlink at `path` is refused and its target is not opened, let alone
/// created, truncated or written. The open is non-blocking, so a FIFO planted
/// there cannot hang the bus; anything but a regular file is refused.
pub fn open_private_file(path: &Path, options: &OpenOptions) -> Result<File, StartError> {
    let mut options = options.clone();
    options.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK);
    let file = match options.open(path) {
        Ok(f) => f,
        Err(e) => {
            // ELOOP (a symlink), ENXIO (a FIFO without reader), EISDIR...:
            // name what is there rather than the errno.
            if let Ok(meta) = fs::symlink_metadata(path) {
                refuse_unless_regular(path, meta.file_type())?;
            }
            return Err(StartError::from_io(
                format!("cannot open {}: {e}", path.display()),
                &e,
            ));
        }
    };
    let meta = file
        .metadata()
        .map_err(|e| StartError::from_io(format!("cannot inspect {}: {e}", path.display()), &e))?;
    refuse_unless_regular(path, meta.file_type())?;
    // Back to blocking I/O (no-op for a regular file, but explicit).
    let fd = file.as_raw_fd();
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)
        .map(|flags| nix::fcntl::OFlag::from_bits_truncate(flags) & !nix::fcntl::OFlag::O_NONBLOCK)
        .and_then(|flags| nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags)))
        .map_err(|e| StartError::runtime(format!("cannot set {} blocking: {e}", path.display())))?;
    Ok(file)
}

/// Removes a stale `path` left by an earlier bus (e.g. `bus.meta.tmp` after a
/// crash) so it can be created exclusively. Anything but a regular file there
/// was planted: it is refused, not removed.
pub fn remove_stale_file(path: &Path) -> Result<(), StartError> {
    match fs::symlink_metadata(path) {
        Ok(meta) => refuse_unless_regular(path, meta.file_type())?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(StartError::from_io(
                format!("cannot inspect {}: {e}", path.display()),
                &e,
            ))
        }
    }
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StartError::from_io(
            format!("cannot remove stale {}: {e}", path.display()),
            &e,
        )),
    }
}

/// Refuses `path` unless `ft` (its type, from `lstat`/`fstat`) is a regular
/// file: the bus only ever creates regular files in its directories.
pub fn refuse_unless_regular(path: &Path, ft: fs::FileType) -> Result<(), StartError> {
    if ft.is_file() {
        return Ok(());
    }
    Err(StartError::permission(format!(
        "refusing {}: it is {}, not a regular file; remove it",
        path.display(),
        describe(ft)
    )))
}

use proto::file_type::describe;

/// Binds the socket (removing a stale file first: the caller holds the lock,
/// so no live bus can own it) and makes it 0600.
pub fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, StartError> {
    match fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed stale socket"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(StartError::runtime(format!(
                "cannot remove stale socket {}: {e}",
                path.display()
            )))
        }
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| StartError::runtime(format!("cannot bind {}: {e}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(|e| StartError::runtime(format!("cannot chmod 600 {}: {e}", path.display())))?;
    listener.set_nonblocking(true).map_err(|e| {
        StartError::runtime(format!("cannot set {} non-blocking: {e}", path.display()))
    })?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ready::FailureKind;
    use std::io::Write;

    #[test]
    fn refuses_unsafe_dirs_as_permission_failures() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("s");
        prepare_private_dir(&d, "test dir").unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        prepare_private_dir(&d, "test dir").unwrap();

        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_private_dir(&d, "test dir").unwrap_err();
        assert_eq!(err.kind, FailureKind::Permission, "{err:?}");
        assert!(err.message.contains("group or world writable"), "{err:?}");
        assert!(err.message.contains(&*d.to_string_lossy()), "{err:?}");
        assert_eq!(
            fs::metadata(&d).unwrap().mode() & 0o777,
            0o777,
            "a loose dir is refused, not chmodded"
        );
        fs::set_permissions(&d, fs::Permissions::from_mode(0o720)).unwrap();
        assert!(
            prepare_private_dir(&d, "test dir").is_err(),
            "group writable"
        );
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        prepare_private_dir(&d, "test dir").unwrap();

        let meta = fs::symlink_metadata(&d).unwrap();
        let err = check_dir(&meta, meta.uid() + 1).unwrap_err();
        assert!(err.contains("owned by uid"), "{err}");

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let err = prepare_private_dir(&link, "test dir").unwrap_err();
        assert_eq!(err.kind, FailureKind::Permission, "{err:?}");
        assert!(err.message.contains("symbolic link"), "{err:?}");

        let f = tmp.path().join("f");
        fs::write(&f, "").unwrap();
        let err = prepare_dir(&f).unwrap_err();
        assert_eq!(err.kind, FailureKind::Permission, "{err:?}");
        assert!(err.message.contains("not a directory"), "{err:?}");
    }

    fn rw_create() -> OpenOptions {
        let mut o = OpenOptions::new();
        o.read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600);
        o
    }

    #[test]
    fn open_private_file_refuses_a_symlink_and_leaves_its_target_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::write(&target, "precious").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
        let p = tmp.path().join("bus.lock");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        for options in [
            rw_create(),
            OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .clone(),
            OpenOptions::new().write(true).truncate(true).clone(),
        ] {
            let err = open_private_file(&p, &options).unwrap_err();
            assert_eq!(err.kind, FailureKind::Permission, "{err:?}");
            assert!(err.message.contains("symbolic link"), "{err:?}");
            assert!(err.message.contains(&*p.to_string_lossy()), "{err:?}");
        }
        // A dangling link: its target must not be created.
        let missing = tmp.path().join("missing");
        let dangling = tmp.path().join("bus.log");
        std::os::unix::fs::symlink(&missing, &dangling).unwrap();
        assert!(open_private_file(&dangling, &rw_create()).is_err());
        assert!(!missing.exists(), "the dangling link's target was created");

        assert_eq!(fs::read(&target).unwrap(), b"precious");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, 0o644);
        let err = remove_stale_file(&p).unwrap_err();
        assert_eq!(err.kind, FailureKind::Permission, "{err:?}");
        assert!(
            fs::symlink_metadata(&p).is_ok(),
            "a planted link is not removed"
        );
    }

    #[test]
    fn open_private_file_refuses_a_fifo_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("bus.log");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let append = OpenOptions::new().append(true).create(true).clone();
        for options in [append, rw_create()] {
            let err = open_private_file(&p, &options).unwrap_err();
            assert_eq!(err.kind, FailureKind::Permission, "{err:?}");
            assert!(err.message.contains("a FIFO"), "{err:?}");
        }
    }

    #[test]
    fn open_private_file_creates_and_reopens_a_regular_file() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("bus.meta.tmp");
        let mut f = open_private_file(&p, &rw_create()).unwrap();
        f.write_all(b"x").unwrap();
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        drop(f);
        open_private_file(&p, &rw_create()).unwrap();
        remove_stale_file(&p).unwrap();
        assert!(!p.exists());
        remove_stale_file(&p).unwrap();
    }
}
