//! The bus's end of the ready pipe: the fd `dws` handed it, the one verdict
//! written to it (the format is `proto::ready`, shared with the spawner), and
//! [`StartError`], a start-up failure classified for the client's exit code.

use std::{
    fs::File,
    io::Write,
    os::fd::{FromRawFd, RawFd},
};

pub struct ReadyPipe {
    file: Option<File>,
}

impl ReadyPipe {
    /// Takes ownership of the inherited `fd`. Refuses 0-2 and fds that are
    /// not open, so a wrong `--ready-fd` cannot write into stdio.
    pub fn from_fd(fd: Option<RawFd>) -> Result<ReadyPipe, ReadyFdError> {
        let Some(fd) = fd else {
            return Ok(ReadyPipe { file: None });
        };
        if fd < 3 {
            return Err(ReadyFdError::Stdio(fd));
        }
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD)
            .map_err(|e| ReadyFdError::NotOpen(fd, e))?;
        // SAFETY: the fd was checked to be open, is not stdio, and this is the
        // only place that takes ownership of it (it is given once, in argv).
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(ReadyPipe { file: Some(file) })
    }

    fn send(&mut self, msg: &str) {
        if let Some(mut f) = self.file.take() {
            // The spawner may have given up waiting; nothing to do then.
            let _ = f.write_all(msg.as_bytes());
        }
    }

    pub fn ready(&mut self) {
        self.send(&ReadyVerdict::Ready.encode());
    }

    pub fn already_running(&mut self) {
        self.send(&ReadyVerdict::AlreadyRunning.encode());
    }

    pub fn failed(&mut self, e: &StartError) {
        self.send(&ReadyVerdict::Failed(e.kind, e.message.clone()).encode());
    }
}

/// Why `--ready-fd` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReadyFdError {
    #[error("--ready-fd {0}: must be 3 or more")]
    Stdio(RawFd),
    #[error("--ready-fd {0}: not an open file descriptor ({1})")]
    NotOpen(RawFd, nix::Error),
}

/// How a start-up failure is classified for the spawning client's exit code.
pub use proto::ready::FailureKind;
use proto::ready::ReadyVerdict;

/// Why the bus could not start: the message, and its class for the ready
/// pipe. Built by the conversions from the typed errors of start-up
/// (`ConfigError`, `PgError`) or by the constructors, each naming its class.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StartError {
    pub kind: FailureKind,
    pub message: String,
}

impl StartError {
    /// A runtime failure (ready pipe `E`, exit 1 for `dws`).
    pub fn runtime(message: impl Into<String>) -> StartError {
        StartError {
            kind: FailureKind::Runtime,
            message: message.into(),
        }
    }

    /// A wrong setting (ready pipe `U`, exit 2 for `dws`).
    pub fn usage(message: impl Into<String>) -> StartError {
        StartError {
            kind: FailureKind::Usage,
            message: message.into(),
        }
    }

    /// A permission or ownership problem (ready pipe `P`, exit 3 for `dws`).
    pub fn permission(message: impl Into<String>) -> StartError {
        StartError {
            kind: FailureKind::Permission,
            message: message.into(),
        }
    }

    /// A failed system call on `message`'s subject: a permission failure when
    /// the kernel said so (`EACCES`, `EPERM`), a runtime failure otherwise.
    pub fn from_io(message: impl Into<String>, e: &std::io::Error) -> StartError {
        let kind = match e.kind() {
            std::io::ErrorKind::PermissionDenied => FailureKind::Permission,
            _ => FailureKind::Runtime,
        };
        StartError {
            kind,
            message: message.into(),
        }
    }
}
