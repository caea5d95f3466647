//! [`Cmd`]: a command about to run in a [`crate::TestEnv`] — its argv,
//! its cleared-then-set environment, what its stdin is, whether stderr
//! joins stdout, socket activation — and how it is spawned into a
//! [`Child`].

use std::{
    ffi::{OsStr, OsString},
    fs::File,
    io::Write,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use crate::{
    capture::Capture,
    output::Output,
    process::{Child, ChildParts, StdoutMode},
};

enum StdinMode {
    Null,
    Pipe,
    Hold,
    Bytes(Vec<u8>),
}

/// A command about to run in a [`crate::TestEnv`].
pub struct Cmd {
    program: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    stdin: StdinMode,
    merge_output: bool,
    close_stdout_after: Option<usize>,
    log_path: PathBuf,
    listen_fd: Option<std::os::fd::RawFd>,
}

impl Cmd {
    /// `program` with `args` and exactly `envs`; stdin `/dev/null`.
    /// `log_path` is the `bus.log` whose tail failure messages show.
    pub(crate) fn new(
        program: PathBuf,
        args: Vec<OsString>,
        envs: Vec<(OsString, OsString)>,
        log_path: PathBuf,
    ) -> Cmd {
        Cmd {
            program,
            args,
            envs,
            stdin: StdinMode::Null,
            merge_output: false,
            close_stdout_after: None,
            log_path,
            listen_fd: None,
        }
    }

    /// The program, its argv and its whole environment (for a harness
    /// that spawns it its own way, e.g. on a terminal).
    pub(crate) fn parts(&self) -> (&Path, &[OsString], &[(OsString, OsString)]) {
        (&self.program, &self.args, &self.envs)
    }

    /// Socket activation as systemd does it: `fd` (a listening socket the
    /// test keeps open) becomes the process's fd 3, with `LISTEN_FDS=1` and
    /// `LISTEN_PID` set to the process's own pid (through `sh -c 'exec …'`,
    /// so the pid is known before the exec).
    pub fn listen_fd(mut self, fd: std::os::fd::RawFd) -> Self {
        let program = std::mem::replace(&mut self.program, PathBuf::from("/bin/sh"));
        let mut args: Vec<OsString> = vec![
            "-c".into(),
            "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\"".into(),
            program.into_os_string(),
        ];
        args.append(&mut self.args);
        self.args = args;
        self.listen_fd = Some(fd);
        self
    }

    /// stdin is `/dev/null` (the default): does not arm the stdin-EOF rule.
    pub fn stdin_null(mut self) -> Self {
        self.stdin = StdinMode::Null;
        self
    }
    /// stdin is a pipe the test writes to ([`Child::write_stdin`]) and closes
    /// ([`Child::close_stdin`]) when it wants EOF.
    pub fn stdin_pipe(mut self) -> Self {
        self.stdin = StdinMode::Pipe;
        self
    }
    /// stdin is a pipe held open by the test until the [`Child`] is dropped,
    /// like `< <(tail -f /dev/null)`: EOF never comes.
    pub fn stdin_hold(mut self) -> Self {
        self.stdin = StdinMode::Hold;
        self
    }
    /// stdin is a pipe carrying `data`, then EOF (like `printf '...' | cmd`).
    pub fn stdin_bytes(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = StdinMode::Bytes(data.into());
        self
    }
    /// One more environment variable for this command only.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((k.as_ref().to_owned(), v.as_ref().to_owned()));
        self
    }
    /// stdout and stderr share one pipe (`2>&1`), so the relative order of
    /// their bytes is observable; everything is captured as stdout.
    pub fn merge_output(mut self) -> Self {
        self.merge_output = true;
        self
    }
    /// The test closes the read end of stdout after `n` complete lines, like
    /// `| head -n N`.
    pub fn close_stdout_after_lines(mut self, n: usize) -> Self {
        self.close_stdout_after = Some(n);
        self
    }

    /// The command line, for messages.
    pub fn display(&self) -> String {
        display_command(&self.program, &self.args)
    }

    /// Starts the process, capturing its stdout and stderr.
    pub fn spawn(self) -> Child {
        self.spawn_with(true)
    }

    /// Starts the process with a stdout pipe the test holds but does not
    /// read, like a consumer whose reader stalled: once the pipe buffer
    /// (64 KiB on Linux) is full, its writes block. stderr is captured as
    /// usual. [`Child::start_reading`] reads it from then on,
    /// [`Child::wait_exit`] after the process exited.
    pub fn spawn_stdout_unread(self) -> Child {
        assert!(
            !self.merge_output,
            "spawn_stdout_unread: stderr merged into an unread stdout could not be seen"
        );
        self.spawn_with(false)
    }

    /// Runs to completion; panics (killing the process) after `timeout`.
    pub fn run_with_timeout(self, timeout: Duration) -> Output {
        self.spawn().wait_exit(timeout)
    }

    fn spawn_with(self, read_stdout: bool) -> Child {
        let display = self.display();
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).env_clear();
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        cmd.stdin(match self.stdin {
            StdinMode::Null => Stdio::null(),
            _ => Stdio::piped(),
        });
        if let Some(fd) = self.listen_fd {
            // SAFETY: between fork and exec only dup2 and fcntl run, both
            // async-signal-safe; `fd` stays open in the test meanwhile.
            unsafe {
                cmd.pre_exec(move || {
                    if fd == 3 {
                        nix::fcntl::fcntl(
                            3,
                            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                        )?;
                    } else if nix::libc::dup2(fd, 3) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut merged_read = None;
        if self.merge_output {
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe2");
            let w2 = w.try_clone().expect("dup pipe");
            cmd.stdout(Stdio::from(w)).stderr(Stdio::from(w2));
            merged_read = Some(File::from(r));
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut proc = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn `{display}`: {e}"));
        // Drop the parent's copies of the merged pipe's write end.
        drop(cmd);

        let mut stdin = proc.stdin.take();
        if let StdinMode::Bytes(data) = &self.stdin {
            if let Some(mut s) = stdin.take() {
                let data = data.clone();
                // A thread, so a process that never reads cannot block the test.
                thread::spawn(move || {
                    let _ = s.write_all(&data);
                });
            }
        }
        let (stdout, stderr) = match merged_read {
            Some(r) => (
                StdoutMode::Captured(Capture::spawn(r, self.close_stdout_after)),
                Capture::finished(),
            ),
            None => {
                let out = proc.stdout.take().expect("stdout piped");
                let stdout = if read_stdout {
                    StdoutMode::Captured(Capture::spawn(out, self.close_stdout_after))
                } else {
                    StdoutMode::Unread(Some(out))
                };
                let stderr = Capture::spawn(proc.stderr.take().expect("stderr piped"), None);
                (stdout, stderr)
            }
        };
        Child::from_parts(ChildParts {
            display,
            proc,
            stdin,
            stdout,
            stderr,
            log_path: self.log_path,
        })
    }
}

/// `program`'s file name and `args`, each arg quoted for `sh` when it holds
/// anything but `[A-Za-z0-9-_./=:,]` (or is empty).
fn display_command(program: &Path, args: &[OsString]) -> String {
    let mut s = program
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for a in args {
        let a = a.to_string_lossy();
        s.push(' ');
        if a.is_empty()
            || a.chars()
                .any(|c| !(c.is_ascii_alphanumeric() || "-_./=:,".contains(c)))
        {
            s.push('\'');
            s.push_str(&a.replace('\'', "'\\''"));
            s.push('\'');
        } else {
            s.push_str(&a);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_quoted_for_sh_only_where_needed() {
        let args: Vec<OsString> = ["event", "consume", "a.*", "", "it's", "--x=1,2:3"]
            .into_iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            display_command(Path::new("/t/debug/dws"), &args),
            "dws event consume 'a.*' '' 'it'\\''s' --x=1,2:3"
        );
        assert_eq!(display_command(Path::new("/"), &[]), "");
    }
}
