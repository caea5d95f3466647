//! [`run_on_terminal`]: a [`Cmd`] run with its stdout and stderr on a
//! pseudo-terminal (as in an interactive shell), stdin `/dev/null`; what
//! the terminal showed, bytes as written (escape codes kept). For the tests
//! of colour, which must appear on a terminal and nowhere else.

use std::{
    io::Read,
    os::fd::{AsRawFd, OwnedFd},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::cmd::Cmd;

/// How a run on a terminal ended and what the terminal showed.
#[derive(Debug)]
pub struct TerminalRun {
    pub code: Option<i32>,
    /// stdout and stderr as the terminal showed them (`\r\n` line ends).
    pub shown: String,
}

/// Runs `cmd` with stdout and stderr on a new pseudo-terminal; panics
/// (killing it) after `timeout`.
pub fn run_on_terminal(cmd: Cmd, timeout: Duration) -> TerminalRun {
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let (program, args, envs) = cmd.parts();
    let mut command = Command::new(program);
    command.args(args).env_clear().envs(envs.iter().cloned());
    let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup the terminal"));
    command
        .stdin(Stdio::null())
        .stdout(slave(&pty.slave))
        .stderr(slave(&pty.slave));
    let mut child = command.spawn().expect("spawn on a terminal");
    drop(command);
    drop(pty.slave);
    // The reader ends at EIO once no process holds the terminal open.
    let master = pty.master;
    let fd = master.as_raw_fd();
    let reader = std::thread::spawn(move || {
        let mut file = std::fs::File::from(master);
        let mut shown = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match file.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => shown.extend_from_slice(&buf[..n]),
            }
        }
        shown
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running on a terminal after {timeout:?} (fd {fd})");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let shown = reader.join().expect("the terminal reader");
    TerminalRun {
        code: status.code(),
        shown: String::from_utf8_lossy(&shown).into_owned(),
    }
}
