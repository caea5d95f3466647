//! The socket a running bus recorded in `bus.meta`, for a client whose
//! environment computes another one (a shell with another or no
//! `XDG_RUNTIME_DIR`: cron, ssh, `sudo -u`). The socket path is derived
//! from the environment (`proto::paths`), so such a client would find no
//! bus there, call a healthy bus dead, and start a second one that cannot
//! take the lock. When the computed socket does not answer, the recorded
//! one is used instead — only after the same checks a dial makes and more:
//! `bus.meta` is a regular file of this uid, the recorded path is a socket
//! of this uid in a directory of this uid that nobody else may write, and a
//! bus answers on it (the dial then checks the peer's uid too).

use std::{
    os::unix::{
        fs::{FileTypeExt, MetadataExt},
        net::UnixStream,
    },
    path::{Path, PathBuf},
};

use proto::paths::Endpoint;

/// `endpoint`, with the socket `bus.meta` records when the computed one
/// does not answer and the recorded one passes every check.
pub fn prefer_recorded(endpoint: Endpoint, uid: u32) -> Endpoint {
    if UnixStream::connect(&endpoint.socket_path).is_ok() {
        return endpoint;
    }
    match recorded_socket(&endpoint, uid) {
        Some(socket) if socket != endpoint.socket_path => {
            let dir = socket.parent().map(Path::to_path_buf).unwrap_or_default();
            Endpoint {
                socket_path: socket,
                socket_dir: dir,
                ..endpoint
            }
        }
        _ => endpoint,
    }
}

/// The socket `bus.meta` names, if it passes the checks (module doc).
pub fn recorded_socket(endpoint: &Endpoint, uid: u32) -> Option<PathBuf> {
    let meta = endpoint.meta_path();
    let file = crate::files::open(&meta).ok()?;
    if file.metadata().ok()?.uid() != uid {
        return None;
    }
    let bytes = crate::files::read_bounded(file, 64 * 1024).ok()?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let socket = PathBuf::from(doc["socket"].as_str()?);
    if !socket.is_absolute() {
        return None;
    }
    let s = std::fs::symlink_metadata(&socket).ok()?;
    if !s.file_type().is_socket() || s.uid() != uid {
        return None;
    }
    let d = std::fs::symlink_metadata(socket.parent()?).ok()?;
    if !d.is_dir() || d.uid() != uid || d.mode() & 0o022 != 0 {
        return None;
    }
    UnixStream::connect(&socket).ok()?;
    Some(socket)
}
