//! The bus's Unix socket: a private directory (0700, ours, not group/world
//! writable) and a 0600 socket inside it. Only the holder of `bus.lock` calls
//! [`bind`], so only it may remove a stale socket file.

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::Path,
};

/// Creates `dir` (0700) if needed and checks that it is safe to put our
/// socket in: a real directory, owned by us, not writable by group or others.
pub fn prepare_dir(dir: &Path) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        if !parent.exists() {
            fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "cannot create socket directory {}: {e}",
                dir.display()
            ))
        }
    }
    let meta = fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot inspect socket directory {}: {e}", dir.display()))?;
    check_dir(dir, &meta, nix::unistd::geteuid().as_raw())
}

fn check_dir(dir: &Path, meta: &fs::Metadata, uid: u32) -> Result<(), String> {
    if !meta.file_type().is_dir() {
        return Err(format!(
            "refusing socket directory {}: not a directory",
            dir.display()
        ));
    }
    if meta.uid() != uid {
        return Err(format!(
            "refusing socket directory {}: owned by uid {}, not by uid {uid}",
            dir.display(),
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "refusing socket directory {}: group or world writable (mode {mode:04o}); \
             remove it or run chmod 700 on it",
            dir.display()
        ));
    }
    Ok(())
}

/// Binds the socket (removing a stale file first: the caller holds the lock,
/// so no live bus can own it) and makes it 0600.
pub fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, String> {
    match fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed stale socket"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(format!(
                "cannot remove stale socket {}: {e}",
                path.display()
            ))
        }
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot chmod 600 {}: {e}", path.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot set {} non-blocking: {e}", path.display()))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unsafe_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("s");
        prepare_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_dir(&d).unwrap_err();
        assert!(err.contains("group or world writable"), "{err}");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        let meta = fs::symlink_metadata(&d).unwrap();
        let err = check_dir(&d, &meta, meta.uid() + 1).unwrap_err();
        assert!(err.contains("owned by uid"), "{err}");
        let f = tmp.path().join("f");
        fs::write(&f, "").unwrap();
        assert!(prepare_dir(&f).unwrap_err().contains("not a directory"));
    }
}
