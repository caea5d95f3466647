//! Starting a bus on demand: find `busd`, spawn it detached (its own session,
//! stdio on /dev/null) with a ready pipe on fd 3, and read its one-line
//! verdict (`proto::ready`): `R` ready, `A` another bus already serves the
//! profile, `E<reason>` / `U<reason>` / `P<reason>` start-up failed (a runtime,
//! configuration or permission problem: exit 1, 2 or 3).

use std::{
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::process::CommandExt,
    },
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use nix::fcntl::OFlag;
use proto::ready::{FailureKind, ReadyVerdict};
use tokio::io::AsyncReadExt;

use crate::exit::{clip, CliError, Result};

/// What the spawned bus reported.
#[derive(Debug, PartialEq, Eq)]
pub enum Spawned {
    Ready,
    AlreadyRunning,
}

/// The fd number the spawned bus finds its ready pipe on.
const READY_FD: i32 = 3;

/// `$DWS_BUSD` if set, else `busd` next to this executable, else on `PATH`.
pub fn find_busd() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("DWS_BUSD").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("busd")))
        .filter(|p| p.is_file());
    if let Some(p) = beside {
        return Ok(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("busd"))
            .find(|p| p.is_file())
    });
    on_path.ok_or_else(|| {
        CliError::runtime("cannot find busd: install it next to dws or on PATH, or set DWS_BUSD")
    })
}

/// Spawns `busd` for `profile` and waits up to `timeout` for its verdict.
pub async fn spawn_bus(profile: &str, timeout: Duration) -> Result<Spawned> {
    let busd = find_busd()?;
    let (rd, wr): (OwnedFd, OwnedFd) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| CliError::runtime(format!("cannot create the ready pipe: {e}")))?;
    let wr_fd = wr.as_raw_fd();
    let mut cmd = Command::new(&busd);
    cmd.arg("--ready-fd")
        .arg(READY_FD.to_string())
        .arg("--profile")
        .arg(profile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls (setsid, dup2, fcntl) between fork
    // and exec, on fds that are open in the child.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            if wr_fd == READY_FD {
                nix::fcntl::fcntl(
                    wr_fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )?;
            } else {
                nix::unistd::dup2(wr_fd, READY_FD)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        CliError::runtime(format!(
            "cannot start {}: {e}",
            clip(&busd.to_string_lossy())
        ))
    })?;
    drop(wr);

    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(rd)
        .map_err(|e| CliError::runtime(format!("cannot read the ready pipe: {e}")))?;
    let mut verdict = Vec::new();
    let read = tokio::time::timeout(timeout, pipe.read_to_end(&mut verdict)).await;
    let text = String::from_utf8_lossy(&verdict).trim_end().to_owned();
    let outcome = match read {
        Err(_) => Err(CliError::runtime(format!(
            "the bus did not report ready within {}s",
            timeout.as_secs()
        ))),
        Ok(Err(e)) => Err(CliError::runtime(format!(
            "cannot read the ready pipe: {e}"
        ))),
        Ok(Ok(_)) => match ReadyVerdict::parse(&text) {
            Some(ReadyVerdict::Ready) => Ok(Spawned::Ready),
            Some(ReadyVerdict::AlreadyRunning) => Ok(Spawned::AlreadyRunning),
            Some(ReadyVerdict::Failed(kind, reason)) => {
                let message = format!("cannot start the bus: {reason}");
                Err(match kind {
                    FailureKind::Runtime => CliError::runtime(message),
                    FailureKind::Usage => CliError::usage(message),
                    FailureKind::Permission => CliError::permission(message),
                })
            }
            None => Err(CliError::runtime(
                "the bus exited during start-up without a reason (see bus.log in the work dir)",
            )),
        },
    };
    if outcome != Ok(Spawned::Ready) {
        // It exits (or already did): reap it so it does not linger as a zombie.
        std::thread::spawn(move || child.wait());
    }
    outcome
}
