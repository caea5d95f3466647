//! Harness of the black-box tests: runs the real `dws` and `busd` binaries in
//! isolated temporary directories and observes them only from the outside
//! (argv, env, stdin, stdout, stderr, exit status, signals, files, sockets).
//!
//! Why it looks the way it does:
//!
//! - **Isolation.** Every test builds its own [`TestEnv`]: a temp dir under
//!   `/tmp` (so socket paths stay far below the 107-byte `sun_path` limit) with
//!   `cfg/` (`DWS_CONFIG_DIR`), `run/` (`XDG_RUNTIME_DIR`, mode 0700) and
//!   `home/` (`HOME`). Every command starts from `env_clear()`, so nothing of
//!   the developer's own `~/.dws` or runtime dir leaks in and tests can run in
//!   parallel: each test has its own bus, socket and lock.
//! - **No leaked daemons.** `dws` spawns `busd` on demand and the daemon
//!   outlives it by design. [`TestEnv`]'s `Drop` finds every `busd` whose
//!   environment carries this test's `DWS_CONFIG_DIR` (by scanning
//!   `/proc/*/environ`) and SIGKILLs it, then waits (bounded) until it is gone.
//!   [`Child`] guards SIGKILL and reap their process on `Drop`, so a failing
//!   assertion never leaves a consumer behind either.
//! - **Bounded waits only.** Every wait takes a timeout and panics naming what
//!   it waited for, with the command, everything captured on stdout/stderr and
//!   the tail of `bus.log`. Tests never sleep "to let time pass" except where
//!   the behaviour itself is about time (idle timeout, `--duration`, stdin EOF).
//! - **Incremental capture.** stdout and stderr of a spawned process are read
//!   by background threads into shared buffers, so a test can block on "the
//!   ready line appeared" while the process keeps running, and no pipe ever
//!   fills up and stalls the process under test.
//! - **Binaries are located, not built.** Building from inside a test would
//!   race with the build that is running the test; see [`bin_dir`].

pub mod common;
pub mod fake_dingtalk;
pub mod history;
pub mod pg;
pub mod wire;

use std::{
    ffi::{OsStr, OsString},
    fmt,
    fs::File,
    io::{Read, Write},
    os::unix::{
        ffi::OsStrExt,
        fs::PermissionsExt,
        process::{CommandExt, ExitStatusExt},
    },
    path::{Path, PathBuf},
    process::{ChildStdin, Command, Stdio},
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

pub use nix::sys::signal::Signal as Sig;

/// How long a test waits for a consumer's ready line. Generous on purpose: a
/// debug `busd` is spawned on demand while other tests load the same 2 cores.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a test waits for a process it expects to exit on its own.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(20);
/// After a process exited, how long its stdout/stderr may stay open. A pipe
/// still open after that is held by a descendant (a `busd` that did not
/// detach from its spawner's stdio), which would hang `dws ... | cat` forever.
const PIPE_GRACE: Duration = Duration::from_secs(3);
/// Poll interval of the few waits that have nothing to block on (files,
/// `/proc`, `try_wait`).
const POLL: Duration = Duration::from_millis(20);

// ------------------------------------------------------------------ binaries

/// The directory holding `dws` and `busd`: the parent of the directory of the
/// running test executable (`target/debug/deps/blackbox-…` → `target/debug`).
/// `DWS_BIN` and `BUSD_BIN` override the two paths one by one.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe of the test binary");
    let deps = exe.parent().expect("test executable has a parent dir");
    match deps.file_name() {
        Some(n) if n == "deps" => deps.parent().expect("deps has a parent").to_path_buf(),
        _ => deps.to_path_buf(),
    }
}

fn locate(var: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{var}={} does not name a file", p.display());
        return p;
    }
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "binary `{name}` not found at {}.\nBuild the binaries first:\n\n    cargo build --workspace --bins\n\n\
         (or point {var} at it)",
        p.display()
    );
    p
}

/// Path of the `dws` binary (env `DWS_BIN` overrides).
pub fn dws_bin() -> PathBuf {
    locate("DWS_BIN", "dws")
}

/// Path of the `busd` binary (env `BUSD_BIN` overrides).
pub fn busd_bin() -> PathBuf {
    locate("BUSD_BIN", "busd")
}

// ------------------------------------------------------------------ TestEnv

/// One isolated world: config dir, runtime dir, home, and the daemons started
/// in it. Dropping it kills those daemons.
pub struct TestEnv {
    tmp: tempfile::TempDir,
    extra: Vec<(OsString, OsString)>,
}

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl TestEnv {
    /// A fresh environment with no bus running.
    pub fn new() -> TestEnv {
        Self::with_env::<&str, &str>(&[])
    }

    /// A fresh environment whose every command also gets `vars`
    /// (e.g. `("DWS_EVENT_BUS_IDLE_TIMEOUT", "2s")`).
    pub fn with_env<K: AsRef<OsStr>, V: AsRef<OsStr>>(vars: &[(K, V)]) -> TestEnv {
        // Fail early and clearly when the binaries are missing.
        let _ = dws_bin();
        let _ = busd_bin();
        let tmp = tempfile::Builder::new()
            .prefix("dwst")
            .tempdir_in("/tmp")
            .expect("create temp dir under /tmp");
        for d in ["cfg", "run", "home"] {
            std::fs::create_dir(tmp.path().join(d)).expect("create test subdir");
        }
        std::fs::set_permissions(
            tmp.path().join("run"),
            std::fs::Permissions::from_mode(0o700),
        )
        .expect("chmod run dir 0700");
        let extra = vars
            .iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();
        TestEnv { tmp, extra }
    }

    pub fn root(&self) -> &Path {
        self.tmp.path()
    }
    /// `DWS_CONFIG_DIR`.
    pub fn cfg_dir(&self) -> PathBuf {
        self.root().join("cfg")
    }
    /// `XDG_RUNTIME_DIR`.
    pub fn run_dir(&self) -> PathBuf {
        self.root().join("run")
    }
    /// `HOME`.
    pub fn home_dir(&self) -> PathBuf {
        self.root().join("home")
    }
    /// `<cfg>/events/default`: `bus.lock`, `bus.meta`, `bus.log`.
    pub fn work_dir(&self) -> PathBuf {
        self.cfg_dir().join("events").join("default")
    }
    pub fn bus_log_path(&self) -> PathBuf {
        self.work_dir().join("bus.log")
    }

    /// Where the contract says the default profile's socket lives, resolved
    /// with the shared `proto::paths` rules from this env's inputs.
    pub fn expected_socket_path(&self) -> PathBuf {
        let env = proto::paths::Env {
            profile: None,
            config_dir: Some(self.cfg_dir()),
            home: Some(self.home_dir()),
            xdg_runtime_dir: Some(self.run_dir()),
            tmpdir: Some(self.root().to_path_buf()),
            uid: nix::unistd::getuid().as_raw(),
        };
        proto::paths::resolve(None, &env)
            .expect("resolve endpoint")
            .socket_path
    }

    /// The parsed `<cfg>/events/default/bus.meta`, if it exists and is JSON.
    pub fn bus_meta(&self) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.work_dir().join("bus.meta")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// `bus.meta`'s `pid`, if any.
    pub fn bus_meta_pid(&self) -> Option<i32> {
        self.bus_meta()?.get("pid")?.as_i64().map(|p| p as i32)
    }

    /// `bus.meta`'s `socket`, if any.
    pub fn bus_meta_socket(&self) -> Option<PathBuf> {
        self.bus_meta()?.get("socket")?.as_str().map(PathBuf::from)
    }

    /// Pids of the live (non-zombie) `busd` processes started in this env:
    /// their exe or argv[0] is `busd` and their environment holds this env's
    /// `DWS_CONFIG_DIR`.
    pub fn busd_pids(&self) -> Vec<i32> {
        let mut needle = b"DWS_CONFIG_DIR=".to_vec();
        needle.extend_from_slice(self.cfg_dir().as_os_str().as_bytes());
        let busd = busd_bin();
        let mut pids = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return pids;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if is_busd(pid, &busd) && environ_has(pid, &needle) && is_live(pid) {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids
    }

    /// Waits until no `busd` of this env is alive.
    pub fn wait_no_busd(&self, timeout: Duration, what: &str) {
        self.wait_until(timeout, what, || self.busd_pids().is_empty());
    }

    /// Polls `cond` until it holds; panics after `timeout` naming `what`, with
    /// the tail of `bus.log`.
    pub fn wait_until(&self, timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if cond() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for: {what}\nbusd pids of this env: {:?}\n{}",
                    self.busd_pids(),
                    log_section(&self.bus_log_path())
                );
            }
            thread::sleep(POLL);
        }
    }

    /// The last lines of `bus.log` (empty if there is none).
    pub fn bus_log_tail(&self) -> String {
        tail_of(&self.bus_log_path())
    }

    /// A `dws` command in this env.
    pub fn dws<I, S>(&self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd(dws_bin(), args)
    }

    /// A `busd` command in this env.
    pub fn busd<I, S>(&self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd(busd_bin(), args)
    }

    /// Any program, with this env's environment (used by the harness's own tests).
    pub fn command<I, S>(&self, program: impl Into<PathBuf>, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd(program.into(), args)
    }

    fn cmd<I, S>(&self, program: PathBuf, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut path = bin_dir().into_os_string();
        path.push(":");
        path.push(
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        );
        let mut envs: Vec<(OsString, OsString)> = vec![
            ("PATH".into(), path),
            ("HOME".into(), self.home_dir().into()),
            ("DWS_CONFIG_DIR".into(), self.cfg_dir().into()),
            ("XDG_RUNTIME_DIR".into(), self.run_dir().into()),
            ("TMPDIR".into(), self.root().as_os_str().to_owned()),
        ];
        envs.extend(self.extra.iter().cloned());
        Cmd {
            program,
            args: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            envs,
            stdin: StdinMode::Null,
            merge_output: false,
            close_stdout_after: None,
            log_path: self.bus_log_path(),
            listen_fd: None,
        }
    }

    /// `dws event status --format json`, asserting exit 0; the document.
    pub fn status(&self) -> serde_json::Value {
        let out = self
            .dws(["event", "status", "--format", "json"])
            .run_with_timeout(EXIT_TIMEOUT);
        out.assert_code(0);
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("status is not JSON ({e})\n{out}"))
    }

    /// Polls `status --format json` until `cond` holds; panics after
    /// `timeout` naming `what`, with the last document.
    pub fn wait_status(
        &self,
        timeout: Duration,
        what: &str,
        mut cond: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status();
            if cond(&st) {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for: {what}\n{st:#}"
            );
            thread::sleep(POLL);
        }
    }

    /// `dws event subscribe ARGS...`, asserting exit 0.
    pub fn subscribe(&self, args: &[&str]) {
        let mut a = vec!["event", "subscribe"];
        a.extend_from_slice(args);
        self.dws(&a).run_with_timeout(EXIT_TIMEOUT).assert_code(0);
    }

    /// `dws event publish <event_type> <data> [extra...]`, asserting exit 0 and
    /// one JSON line on stdout; returns that JSON.
    pub fn publish(&self, event_type: &str, data: &str, extra: &[&str]) -> serde_json::Value {
        let mut args = vec!["event", "publish", event_type, data];
        args.extend_from_slice(extra);
        let out = self.dws(&args).run_with_timeout(EXIT_TIMEOUT);
        out.publish_json()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // Kill every daemon this test caused, then wait (bounded) until gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.busd_pids();
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            thread::sleep(POLL);
        }
    }
}

fn read_proc(pid: i32, what: &str) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/{what}")).ok()
}

fn is_busd(pid: i32, busd: &Path) -> bool {
    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        let s = exe.to_string_lossy();
        let s = s.strip_suffix(" (deleted)").unwrap_or(&s);
        if Path::new(s) == busd || Path::new(s).file_name() == Some(OsStr::new("busd")) {
            return true;
        }
    }
    read_proc(pid, "cmdline").is_some_and(|c| {
        let argv0 = c.split(|b| *b == 0).next().unwrap_or_default();
        Path::new(OsStr::from_bytes(argv0)).file_name() == Some(OsStr::new("busd"))
    })
}

fn environ_has(pid: i32, needle: &[u8]) -> bool {
    read_proc(pid, "environ").is_some_and(|e| e.split(|b| *b == 0).any(|kv| kv == needle))
}

/// Polls until `proc` has exited (`true`) or `timeout` passed (`false`).
fn wait_exited(
    proc: &mut std::process::Child,
    status: &mut Option<std::process::ExitStatus>,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    while poll_running(proc, status) {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
    true
}

/// `true` while `proc` runs; records its exit status once it has ended.
fn poll_running(
    proc: &mut std::process::Child,
    status: &mut Option<std::process::ExitStatus>,
) -> bool {
    if status.is_some() {
        return false;
    }
    match proc.try_wait() {
        Ok(Some(st)) => {
            *status = Some(st);
            false
        }
        Ok(None) => true,
        Err(_) => false,
    }
}

/// `true` if `pid` exists and is not a zombie.
pub fn is_live(pid: i32) -> bool {
    let Some(stat) = read_proc(pid, "stat") else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let Some(close) = stat.iter().rposition(|b| *b == b')') else {
        return false;
    };
    !matches!(stat.get(close + 2), Some(b'Z') | Some(b'X') | None)
}

/// The argv of every process on the machine, one per line: where a secret
/// must never show up.
pub fn all_process_argv() -> String {
    let mut argvs = String::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            argvs.push_str(&String::from_utf8_lossy(&cmdline).replace('\0', " "));
            argvs.push('\n');
        }
    }
    argvs
}

/// Asserts that `secret` (named `name` in the message) appears in none of
/// `places`, given as `(what, text)`.
pub fn assert_absent(name: &str, secret: &str, places: &[(&str, &str)]) {
    for (what, text) in places {
        assert!(!text.contains(secret), "{name} appears in {what}:\n{text}");
    }
}

/// Waits until `pid` is gone (or a zombie).
pub fn wait_pid_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !is_live(pid) {
            return true;
        }
        thread::sleep(POLL);
    }
    !is_live(pid)
}

fn tail_of(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(40);
    lines[from..].join("\n")
}

fn log_section(path: &Path) -> String {
    let tail = tail_of(path);
    if tail.is_empty() {
        format!("--- {} (tail): <missing or empty> ---", path.display())
    } else {
        format!("--- {} (tail) ---\n{tail}", path.display())
    }
}

// ------------------------------------------------------------------ Cmd

enum StdinMode {
    Null,
    Pipe,
    Hold,
    Bytes(Vec<u8>),
}

/// A command about to run in a [`TestEnv`].
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
        let mut s = self
            .program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for a in &self.args {
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

    /// Starts the process.
    pub fn spawn(self) -> Child {
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
                Capture::spawn(r, self.close_stdout_after),
                Capture::finished(),
            ),
            None => (
                Capture::spawn(
                    proc.stdout.take().expect("stdout piped"),
                    self.close_stdout_after,
                ),
                Capture::spawn(proc.stderr.take().expect("stderr piped"), None),
            ),
        };
        Child {
            display,
            proc,
            stdin,
            stdout,
            stderr,
            log_path: self.log_path,
            started: Instant::now(),
            status: None,
        }
    }

    /// Runs to completion; panics (killing the process) after `timeout`.
    pub fn run_with_timeout(self, timeout: Duration) -> Output {
        self.spawn().wait_exit(timeout)
    }
}

// ------------------------------------------------------------------ capture

#[derive(Default)]
struct Stream {
    buf: Vec<u8>,
    /// No more bytes will come: EOF, read error, or closed by the test.
    done: bool,
}

#[derive(Clone)]
struct Capture(Arc<(Mutex<Stream>, Condvar)>);

impl Capture {
    fn finished() -> Capture {
        Capture(Arc::new((
            Mutex::new(Stream {
                buf: Vec::new(),
                done: true,
            }),
            Condvar::new(),
        )))
    }

    fn spawn<R: Read + Send + 'static>(mut r: R, close_after_lines: Option<usize>) -> Capture {
        let cap = Capture(Arc::new((Mutex::new(Stream::default()), Condvar::new())));
        let shared = cap.clone();
        thread::spawn(move || {
            let mut chunk = vec![0u8; 64 * 1024];
            // `close_stdout_after_lines(0)`: close without reading anything.
            let mut loop_open = close_after_lines != Some(0);
            if !loop_open {
                let (lock, cv) = &*shared.0;
                lock.lock().unwrap_or_else(|e| e.into_inner()).done = true;
                cv.notify_all();
            }
            while loop_open {
                let n = match r.read(&mut chunk) {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                let (lock, cv) = &*shared.0;
                let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
                s.buf.extend_from_slice(&chunk[..n]);
                let enough = close_after_lines
                    .is_some_and(|want| s.buf.iter().filter(|b| **b == b'\n').count() >= want);
                if n == 0 || enough {
                    s.done = true;
                    loop_open = false;
                }
                cv.notify_all();
            }
            // Dropping `r` here closes our read end (the `| head` case).
            drop(r);
        });
        cap
    }

    fn text(&self) -> String {
        let s = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&s.buf).into_owned()
    }

    fn is_done(&self) -> bool {
        self.0 .0.lock().unwrap_or_else(|e| e.into_inner()).done
    }

    /// Blocks until `f(complete lines, done)` returns `Some`, or the deadline.
    fn wait_for<T>(
        &self,
        deadline: Instant,
        mut f: impl FnMut(&[&str], bool) -> Option<T>,
    ) -> Result<T, bool> {
        let (lock, cv) = &*self.0;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let text = String::from_utf8_lossy(&s.buf);
            let complete = match text.rfind('\n') {
                Some(i) => &text[..i],
                None => "",
            };
            let lines: Vec<&str> = if complete.is_empty() && !text.starts_with('\n') {
                Vec::new()
            } else {
                complete.split('\n').collect()
            };
            if let Some(v) = f(&lines, s.done) {
                return Ok(v);
            }
            if s.done {
                return Err(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(false);
            }
            s = cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

// ------------------------------------------------------------------ Child

/// A running process. Dropping it SIGKILLs and reaps it.
pub struct Child {
    display: String,
    proc: std::process::Child,
    stdin: Option<ChildStdin>,
    stdout: Capture,
    stderr: Capture,
    log_path: PathBuf,
    started: Instant,
    status: Option<std::process::ExitStatus>,
}

impl Child {
    pub fn pid(&self) -> i32 {
        self.proc.id() as i32
    }

    /// The complete stdout lines captured so far (the process runs on).
    pub fn stdout_so_far(&self) -> Vec<String> {
        let text = self.stdout.text();
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().map(str::to_owned).collect()
    }

    /// The complete stderr lines captured so far (the process runs on).
    pub fn stderr_so_far(&self) -> Vec<String> {
        let text = self.stderr.text();
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().map(str::to_owned).collect()
    }

    /// Waits (up to `timeout`) for a stderr line matching `pred`; `None`
    /// when none came (the caller's assertion says what was missing).
    pub fn try_wait_stderr_line(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> Option<String> {
        let deadline = Instant::now() + timeout;
        self.stderr
            .wait_for(deadline, |lines, _| {
                lines.iter().find(|l| pred(l)).map(|l| l.to_string())
            })
            .ok()
    }

    /// The command line, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// `true` while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        poll_running(&mut self.proc, &mut self.status)
    }

    /// Everything captured so far, for failure messages.
    pub fn report(&self) -> String {
        format!(
            "command: {}\npid: {}\nstatus: {}\nelapsed: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
            self.display,
            self.proc.id(),
            self.status.map(describe_status).unwrap_or_else(|| "running".into()),
            self.started.elapsed(),
            self.stdout.text(),
            self.stderr.text(),
            log_section(&self.log_path)
        )
    }

    /// Waits for a stderr line matching `pred` and returns it. Panics on
    /// timeout, or as soon as stderr closes without such a line, naming `what`.
    pub fn wait_stderr_line(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let r = self.stderr.wait_for(deadline, |lines, _| {
            lines.iter().find(|l| pred(l)).map(|l| l.to_string())
        });
        match r {
            Ok(line) => line,
            Err(closed) => {
                let _ = self.is_running();
                panic!(
                    "{} waiting for stderr line: {what}\n{}",
                    if closed {
                        "stderr closed while"
                    } else {
                        "timed out"
                    },
                    self.report()
                )
            }
        }
    }

    /// Waits for the ready line and parses it strictly.
    pub fn wait_ready(&mut self) -> Ready {
        let line = self.wait_stderr_line("the `[event] ready ...` line", READY_TIMEOUT, |l| {
            l.starts_with("[event] ready")
        });
        Ready::parse(&line)
            .unwrap_or_else(|e| panic!("malformed ready line {line:?}: {e}\n{}", self.report()))
    }

    /// Waits until stdout holds at least `n` complete lines; returns the first `n`.
    pub fn wait_stdout_lines(&mut self, n: usize, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let r = self.stdout.wait_for(deadline, |lines, _| {
            (lines.len() >= n).then(|| lines[..n].iter().map(|l| l.to_string()).collect())
        });
        match r {
            Ok(v) => v,
            Err(closed) => {
                let _ = self.is_running();
                panic!(
                    "{} waiting for {n} stdout line(s)\n{}",
                    if closed {
                        "stdout closed while"
                    } else {
                        "timed out"
                    },
                    self.report()
                )
            }
        }
    }

    /// Waits for a stdout line matching `pred` and returns every line up to
    /// and including it. Panics on timeout or EOF, naming `what`.
    pub fn wait_stdout_line(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let r = self.stdout.wait_for(deadline, |lines, _| {
            lines
                .iter()
                .position(|l| pred(l))
                .map(|i| lines[..=i].iter().map(|l| l.to_string()).collect())
        });
        match r {
            Ok(v) => v,
            Err(closed) => {
                let _ = self.is_running();
                panic!(
                    "{} waiting for stdout line: {what}\n{}",
                    if closed {
                        "stdout closed while"
                    } else {
                        "timed out"
                    },
                    self.report()
                )
            }
        }
    }

    /// Like [`Child::wait_stdout_lines`] but returns `None` instead of
    /// panicking when the lines are not there in time (or stdout closed).
    pub fn try_wait_stdout_lines(&mut self, n: usize, timeout: Duration) -> Option<Vec<String>> {
        let deadline = Instant::now() + timeout;
        self.stdout
            .wait_for(deadline, |lines, _| {
                (lines.len() >= n).then(|| lines[..n].iter().map(|l| l.to_string()).collect())
            })
            .ok()
    }

    /// Writes to the stdin pipe (see [`Cmd::stdin_pipe`]).
    pub fn write_stdin(&mut self, data: &[u8]) {
        let s = self
            .stdin
            .as_mut()
            .expect("stdin is not a pipe held by the test");
        s.write_all(data).expect("write to child stdin");
    }

    /// Closes the stdin pipe: the process sees EOF.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig)
            .unwrap_or_else(|e| panic!("kill -{sig} {}: {e}", self.pid()));
    }

    /// Waits for the process to exit and for its stdout/stderr to close.
    /// Panics (after killing it) if it is still running after `timeout`, or
    /// if its pipes stay open after it exited (a descendant holds them).
    pub fn wait_exit(mut self, timeout: Duration) -> Output {
        if !wait_exited(&mut self.proc, &mut self.status, timeout) {
            let msg = format!(
                "`{}` still running after {timeout:?}\n{}",
                self.display,
                self.report()
            );
            let _ = self.proc.kill();
            panic!("{msg}");
        }
        let pipes_deadline = Instant::now() + PIPE_GRACE;
        for (name, cap) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if cap
                .wait_for(pipes_deadline, |_, done| done.then_some(()))
                .is_err()
                && !cap.is_done()
            {
                panic!(
                    "`{}` exited but its {name} was still open {PIPE_GRACE:?} later: a descendant \
                     (a spawned busd?) inherited it, so `dws ... | cat` would never finish\n{}",
                    self.display,
                    self.report()
                );
            }
        }
        let status = self.status.expect("exited");
        Output {
            display: self.display.clone(),
            code: status.code(),
            signal: status.signal(),
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
            bus_log: log_section(&self.log_path),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stdin = None;
        if self.status.is_none() {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}

fn describe_status(st: std::process::ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{st:?}"),
    }
}

// ------------------------------------------------------------------ Output

/// A finished process: status, everything it wrote, and the bus log tail at
/// that moment. `Display` prints all of it, for assertion messages.
pub struct Output {
    pub display: String,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub bus_log: String,
    pub elapsed: Duration,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "unknown".into(),
        };
        write!(
            f,
            "command: {}\nstatus: {status}\nelapsed: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
            self.display, self.elapsed, self.stdout, self.stderr, self.bus_log
        )
    }
}

impl Output {
    pub fn stdout_lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }

    /// Asserts the exit code.
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "expected exit code {code}\n{self}");
        self
    }

    /// The one `[event] exited ...` line, parsed strictly.
    pub fn exited(&self) -> Exited {
        let lines: Vec<&str> = self
            .stderr_lines()
            .into_iter()
            .filter(|l| l.starts_with("[event] exited"))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "expected exactly one `exited` line on stderr\n{self}"
        );
        Exited::parse(lines[0])
            .unwrap_or_else(|e| panic!("malformed exited line {:?}: {e}\n{self}", lines[0]))
    }

    /// Asserts a clean end: exit 0, no `Error:` line, the ready line first and
    /// the exited line last on stderr, every stderr line starting `[event] `,
    /// with `reason` and `count`. Returns the exited line.
    pub fn assert_clean_exit(&self, reason: &str, count: u64) -> Exited {
        self.assert_code(0);
        let lines = self.stderr_lines();
        assert!(
            !lines.iter().any(|l| l.starts_with("Error:")),
            "clean exit must not print an Error: line\n{self}"
        );
        for l in &lines {
            assert!(
                l.starts_with("[event] "),
                "stderr line {l:?} does not start with `[event] `\n{self}"
            );
        }
        let ex = self.exited();
        assert_eq!(
            lines.last().copied(),
            Some(ex.line.as_str()),
            "the exited line must be the last stderr line\n{self}"
        );
        assert_eq!(ex.reason, reason, "exit reason\n{self}");
        assert_eq!(ex.count, count, "event count in the exited line\n{self}");
        ex
    }

    /// Asserts a clean end with reason `source_lost` and no event; returns
    /// the `[event] source lost (…)` line, which says why.
    pub fn assert_source_lost(&self) -> String {
        self.assert_clean_exit("source_lost", 0);
        self.stderr_lines()
            .into_iter()
            .find(|l| l.starts_with("[event] source lost"))
            .unwrap_or_else(|| panic!("no `[event] source lost` line\n{self}"))
            .to_owned()
    }

    /// Asserts a failure: `code`, no `exited` line, exactly one line starting
    /// `Error: `. Returns that line.
    pub fn assert_error(&self, code: i32) -> String {
        self.assert_code(code);
        let lines = self.stderr_lines();
        assert!(
            !lines.iter().any(|l| l.contains("[event] exited")),
            "a failed run must not print an exited line\n{self}"
        );
        let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("Error: ")).collect();
        assert_eq!(
            errors.len(),
            1,
            "expected exactly one `Error: ` line on stderr\n{self}"
        );
        assert!(
            errors[0].len() > "Error: ".len(),
            "empty error message\n{self}"
        );
        errors[0].to_string()
    }

    /// Parses stdout as the one JSON line `dws event publish` prints.
    pub fn publish_json(&self) -> serde_json::Value {
        self.assert_code(0);
        let lines = self.stdout_lines();
        assert_eq!(
            lines.len(),
            1,
            "publish must print exactly one line on stdout\n{self}"
        );
        serde_json::from_str(lines[0])
            .unwrap_or_else(|e| panic!("publish output is not JSON ({e})\n{self}"))
    }

    /// Parses every stdout line as JSON.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout_lines()
            .iter()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON ({e})\n{self}"))
            })
            .collect()
    }
}

// ------------------------------------------------------------------ contract lines

/// `[event] ready event_key=<keys joined by ,> bus_pid=<pid> subscribe_id=<id>`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub event_key: String,
    pub bus_pid: i32,
    pub subscribe_id: String,
}

impl Ready {
    pub fn parse(line: &str) -> Result<Ready, String> {
        let rest = line
            .strip_prefix("[event] ready event_key=")
            .ok_or("does not start with `[event] ready event_key=`")?;
        let (keys, rest) = rest.split_once(" bus_pid=").ok_or("no ` bus_pid=`")?;
        let (pid, id) = rest
            .split_once(" subscribe_id=")
            .ok_or("no ` subscribe_id=`")?;
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bus_pid {pid:?} is not a number"));
        }
        if !proto::is_valid_id(id) {
            return Err(format!("subscribe_id {id:?} is not a valid id"));
        }
        if keys.is_empty() || keys.contains(' ') {
            return Err(format!("event_key {keys:?}"));
        }
        Ok(Ready {
            event_key: keys.to_owned(),
            bus_pid: pid.parse().map_err(|e| format!("bus_pid: {e}"))?,
            subscribe_id: id.to_owned(),
        })
    }
}

/// `[event] exited — received <N> event(s) in <S>s (reason: <reason>)`
#[derive(Debug, Clone, PartialEq)]
pub struct Exited {
    pub line: String,
    pub count: u64,
    /// `<S>` exactly as printed.
    pub seconds_text: String,
    pub seconds: f64,
    pub reason: String,
}

/// The exit reasons of the contract.
pub const REASONS: [&str; 7] = [
    "limit",
    "timeout",
    "signal",
    "bus_shutdown",
    "source_lost",
    "halted",
    "taken_over",
];

impl Exited {
    pub fn parse(line: &str) -> Result<Exited, String> {
        let rest = line
            .strip_prefix("[event] exited \u{2014} received ")
            .ok_or("does not start with `[event] exited — received ` (em dash U+2014)")?;
        let (n, rest) = rest
            .split_once(" event(s) in ")
            .ok_or("no ` event(s) in `")?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("count {n:?} is not a number"));
        }
        let (s, rest) = rest.split_once("s (reason: ").ok_or("no `s (reason: `")?;
        let (int, frac) = s
            .split_once('.')
            .ok_or(format!("seconds {s:?} have no decimal point"))?;
        if int.is_empty()
            || !int.bytes().all(|b| b.is_ascii_digit())
            || frac.len() != 3
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(format!("seconds {s:?} are not <digits>.<3 digits>"));
        }
        let reason = rest.strip_suffix(')').ok_or("does not end with `)`")?;
        if !REASONS.contains(&reason) {
            return Err(format!("unknown reason {reason:?}"));
        }
        Ok(Exited {
            line: line.to_owned(),
            count: n.parse().map_err(|e| format!("count: {e}"))?,
            seconds_text: s.to_owned(),
            seconds: s.parse().map_err(|e| format!("seconds: {e}"))?,
            reason: reason.to_owned(),
        })
    }
}

// ------------------------------------------------------------------ unread stdout

/// A running process whose stdout is a pipe the test holds but never reads,
/// like a consumer whose reader stalled: once the pipe buffer (64 KiB on
/// Linux) is full, its writes block. stderr is captured as usual. Dropping it
/// SIGKILLs and reaps the process.
pub struct UnreadChild {
    display: String,
    proc: std::process::Child,
    stdin: Option<ChildStdin>,
    stdout: Option<std::process::ChildStdout>,
    stderr: Capture,
    log_path: PathBuf,
    started: Instant,
    status: Option<std::process::ExitStatus>,
}

impl Cmd {
    /// Starts the process with a stdout pipe that is never read until
    /// [`UnreadChild::wait_exit_then_read_stdout`]. stdin is `/dev/null` for
    /// [`Cmd::stdin_null`] (the default), otherwise a pipe held open by the
    /// test until the process is dropped (no data is written to it).
    pub fn spawn_stdout_unread(self) -> UnreadChild {
        let display = self.display();
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).env_clear();
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        cmd.stdin(match self.stdin {
            StdinMode::Null => Stdio::null(),
            _ => Stdio::piped(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut proc = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn `{display}`: {e}"));
        let stdin = proc.stdin.take();
        let stdout = proc.stdout.take();
        let stderr = Capture::spawn(proc.stderr.take().expect("stderr piped"), None);
        UnreadChild {
            display,
            proc,
            stdin,
            stdout,
            stderr,
            log_path: self.log_path,
            started: Instant::now(),
            status: None,
        }
    }
}

impl UnreadChild {
    pub fn pid(&self) -> i32 {
        self.proc.id() as i32
    }

    /// `true` while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        poll_running(&mut self.proc, &mut self.status)
    }

    /// Everything captured so far (stderr only: stdout is not read).
    pub fn report(&self) -> String {
        format!(
            "command: {}\npid: {}\nstatus: {}\nelapsed: {:?}\n--- stdout ---\n<not read>\n--- stderr ---\n{}\n{}",
            self.display,
            self.proc.id(),
            self.status.map(describe_status).unwrap_or_else(|| "running".into()),
            self.started.elapsed(),
            self.stderr.text(),
            log_section(&self.log_path)
        )
    }

    /// Waits for the ready line and parses it strictly.
    pub fn wait_ready(&mut self) -> Ready {
        let deadline = Instant::now() + READY_TIMEOUT;
        let r = self.stderr.wait_for(deadline, |lines, _| {
            lines
                .iter()
                .find(|l| l.starts_with("[event] ready"))
                .map(|l| l.to_string())
        });
        match r {
            Ok(line) => Ready::parse(&line).unwrap_or_else(|e| {
                panic!("malformed ready line {line:?}: {e}\n{}", self.report())
            }),
            Err(_) => {
                let _ = self.is_running();
                panic!("no `[event] ready ...` line\n{}", self.report())
            }
        }
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig)
            .unwrap_or_else(|e| panic!("kill -{sig} {}: {e}", self.pid()));
    }

    /// Takes the stdout pipe for a caller that reads it itself (the
    /// benchmark checks every line as it comes); `None` once taken.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.stdout.take()
    }

    /// The exit status, once the process has exited (reaps it).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        let _ = self.is_running();
        self.status
    }

    /// Starts reading stdout now (a reader that stalled and came back).
    pub fn start_reading(self) -> Child {
        // `UnreadChild`'s `Drop` kills the process: move the fields out
        // of a `ManuallyDrop` instead, each exactly once.
        let mut this = std::mem::ManuallyDrop::new(self);
        let stdout = Capture::spawn(this.stdout.take().expect("stdout pipe"), None);
        // SAFETY: every field is read exactly once and `this` is never
        // dropped, so nothing is dropped twice.
        unsafe {
            Child {
                display: std::ptr::read(&this.display),
                proc: std::ptr::read(&this.proc),
                stdin: std::ptr::read(&this.stdin),
                stdout,
                stderr: std::ptr::read(&this.stderr),
                log_path: std::ptr::read(&this.log_path),
                started: this.started,
                status: this.status,
            }
        }
    }

    /// Waits for the process to exit (panics after killing it on timeout),
    /// then reads what is left in its stdout pipe to EOF (bounded) and
    /// returns everything like [`Child::wait_exit`].
    pub fn wait_exit_then_read_stdout(mut self, timeout: Duration) -> Output {
        if !wait_exited(&mut self.proc, &mut self.status, timeout) {
            let msg = format!(
                "`{}` still running after {timeout:?}\n{}",
                self.display,
                self.report()
            );
            let _ = self.proc.kill();
            panic!("{msg}");
        }
        let stdout = Capture::spawn(self.stdout.take().expect("stdout pipe"), None);
        let pipes_deadline = Instant::now() + PIPE_GRACE;
        for (name, cap) in [("stdout", &stdout), ("stderr", &self.stderr)] {
            if cap
                .wait_for(pipes_deadline, |_, done| done.then_some(()))
                .is_err()
                && !cap.is_done()
            {
                panic!(
                    "`{}` exited but its {name} was still open {PIPE_GRACE:?} later: a \
                     descendant inherited it\n{}",
                    self.display,
                    self.report()
                );
            }
        }
        let status = self.status.expect("exited");
        Output {
            display: self.display.clone(),
            code: status.code(),
            signal: status.signal(),
            stdout: stdout.text(),
            stderr: self.stderr.text(),
            bus_log: log_section(&self.log_path),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for UnreadChild {
    fn drop(&mut self) {
        self.stdin = None;
        if self.status.is_none() {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_contract_lines() {
        let r = Ready::parse("[event] ready event_key=a.b,c.* bus_pid=42 subscribe_id=sub-1")
            .expect("ready");
        assert_eq!(r.event_key, "a.b,c.*");
        assert_eq!(r.bus_pid, 42);
        assert_eq!(r.subscribe_id, "sub-1");
        assert!(Ready::parse("[event] ready event_key=a bus_pid=x subscribe_id=s").is_err());

        let e =
            Exited::parse("[event] exited \u{2014} received 2 event(s) in 0.031s (reason: limit)")
                .expect("exited");
        assert_eq!(
            (e.count, e.seconds_text.as_str(), e.reason.as_str()),
            (2, "0.031", "limit")
        );
        assert!(
            Exited::parse("[event] exited - received 2 event(s) in 0.031s (reason: limit)")
                .is_err()
        );
        assert!(Exited::parse(
            "[event] exited \u{2014} received 2 event(s) in 0.03s (reason: limit)"
        )
        .is_err());
        assert!(Exited::parse(
            "[event] exited \u{2014} received 2 event(s) in 0.031s (reason: bored)"
        )
        .is_err());
    }

    fn sh(env: &TestEnv, script: &str) -> Cmd {
        env.command("/bin/sh", ["-c", script])
    }

    #[test]
    fn merged_output_keeps_byte_order() {
        let env = TestEnv::new();
        let out = sh(&env, "echo err1 >&2; echo out1; echo err2 >&2")
            .merge_output()
            .run_with_timeout(EXIT_TIMEOUT);
        assert_eq!(out.stdout, "err1\nout1\nerr2\n", "{out}");
        assert_eq!(out.stderr, "");
    }

    #[test]
    fn env_is_cleared_and_isolated() {
        let env = TestEnv::with_env(&[("EXTRA", "1")]);
        let out = sh(&env, "env | sort").run_with_timeout(EXIT_TIMEOUT);
        let cfg = format!("DWS_CONFIG_DIR={}", env.cfg_dir().display());
        assert!(out.stdout.lines().any(|l| l == cfg), "{out}");
        assert!(out.stdout.lines().any(|l| l == "EXTRA=1"), "{out}");
        assert!(!out.stdout.contains("CARGO"), "{out}");
    }

    #[test]
    fn stdin_modes() {
        let env = TestEnv::new();
        let out = sh(&env, "cat")
            .stdin_bytes("abc")
            .run_with_timeout(EXIT_TIMEOUT);
        assert_eq!(out.stdout, "abc");
        let out = sh(&env, "cat").run_with_timeout(EXIT_TIMEOUT);
        assert_eq!(out.stdout, "");
        let mut c = sh(&env, "cat").stdin_pipe().spawn();
        c.write_stdin(b"line\n");
        assert_eq!(
            c.wait_stdout_lines(1, EXIT_TIMEOUT),
            vec!["line".to_string()]
        );
        c.close_stdin();
        c.wait_exit(EXIT_TIMEOUT).assert_code(0);
        let mut c = sh(&env, "cat").stdin_hold().spawn();
        thread::sleep(Duration::from_millis(300));
        assert!(c.is_running());
    }

    #[test]
    fn stdout_closed_after_lines_gives_the_writer_a_broken_pipe() {
        let env = TestEnv::new();
        let mut c = sh(
            &env,
            "trap '' PIPE; i=0; while echo $i; do i=$((i+1)); sleep 0.05; done; echo broken >&2",
        )
        .close_stdout_after_lines(1)
        .spawn();
        c.wait_stdout_lines(1, EXIT_TIMEOUT);
        c.wait_stderr_line("broken", EXIT_TIMEOUT, |l| l == "broken");
        c.wait_exit(EXIT_TIMEOUT).assert_code(0);
    }

    #[test]
    fn busd_scan_finds_and_drop_kills_processes_named_busd() {
        let env = TestEnv::new();
        let fake = env.root().join("bin").join("busd");
        std::fs::create_dir(env.root().join("bin")).expect("mkdir");
        std::fs::copy("/bin/sleep", &fake).expect("copy sleep");
        // Detached like a daemon: the test does not hold it as a Child.
        let out = sh(
            &env,
            &format!(
                "{} 300 >/dev/null 2>&1 </dev/null & echo $!",
                fake.display()
            ),
        )
        .run_with_timeout(EXIT_TIMEOUT);
        let pid: i32 = out.stdout.trim().parse().expect("pid");
        env.wait_until(EXIT_TIMEOUT, "fake busd visible", || {
            env.busd_pids() == vec![pid]
        });
        let other = TestEnv::new();
        assert!(other.busd_pids().is_empty(), "another env does not see it");
        drop(env);
        assert!(
            wait_pid_gone(pid, EXIT_TIMEOUT),
            "TestEnv drop kills its busd"
        );
    }

    #[test]
    fn wait_exit_reports_a_descendant_holding_stdout() {
        let env = TestEnv::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sh(&env, "sleep 5 & echo started").run_with_timeout(EXIT_TIMEOUT)
        }));
        let msg = r
            .err()
            .and_then(|e| e.downcast_ref::<String>().cloned())
            .expect("panics");
        assert!(msg.contains("inherited"), "{msg}");
    }
}
