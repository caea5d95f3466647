//! [`TestEnv`]: one isolated world per test — a temp dir under `/tmp` with
//! `cfg/`, `run/` and `home/`, the environment every command gets, the
//! paths the contract derives from them, its `config.toml`, and shortcuts
//! for the `dws` commands tests run most (status, publish, subscribe).
//! Dropping it kills the daemons started in it.

use std::{
    ffi::{OsStr, OsString},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use crate::{
    bins::{bin_dir, busd_bin, dws_bin},
    cmd::Cmd,
    output::log_section,
    pids, EXIT_TIMEOUT, POLL,
};

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

    /// Writes `<cfg>/<name>` with `contents`, mode 0600 (a file the bus
    /// accepts secrets from); returns its path.
    pub fn write_private(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let p = self.cfg_dir().join(name);
        std::fs::write(&p, contents).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("chmod 0600 {}: {e}", p.display()));
        p
    }

    /// Writes `<cfg>/config.toml` (mode 0600) whose one section is
    /// `[profiles.default]` holding `section` (whole lines, e.g. from
    /// [`crate::fake_dingtalk::FakeDingTalk::app_profile`]); returns its path.
    pub fn write_default_profile(&self, section: &str) -> PathBuf {
        self.write_private("config.toml", format!("[profiles.default]\n{section}"))
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
        pids::busd_pids_with_config_dir(&self.cfg_dir(), &busd_bin())
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
        crate::output::tail_of(&self.bus_log_path())
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
        Cmd::new(
            program,
            args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            envs,
            self.bus_log_path(),
        )
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
