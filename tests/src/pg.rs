//! A private PostgreSQL server per test ([`PgServer`]): `initdb` into a fresh
//! temp dir, a postmaster on a private Unix socket and a free loopback port,
//! a password-protected test role and database, and nothing left behind.
//!
//! Why it looks the way it does:
//!
//! - **A real server, never skipped.** The cluster store's tests are about
//!   PostgreSQL's behaviour (advisory locks, `FOR SHARE`, terminated
//!   backends, restarts), which no fake reproduces. When the server binaries
//!   are missing, [`PgServer::start`] panics saying how to install them
//!   (`scripts/test.sh` installs them on a Debian machine), so CI cannot go
//!   green by skipping.
//! - **Unprivileged.** PostgreSQL refuses to run as root. When the tests run
//!   as root, the temp dir is chowned to the `postgres` system user and every
//!   server-side program (`initdb`, `postgres`, `pg_isready`, `psql`) runs as
//!   that user, through `Command::uid/gid` (which also drops root's
//!   supplementary groups): no `runuser`/`setpriv` process in between, so the
//!   postmaster is this process's own child, its pid is the one we signal,
//!   and we reap it ourselves (the sandbox's PID 1 reaps nothing).
//! - **Two ways in.** The harness is a superuser (`dws_admin`) over the Unix
//!   socket with `trust`: the socket lives in the 0700 temp dir, so only the
//!   server user (and root) can reach it. busd connects like a real host, over
//!   TCP to `127.0.0.1` with SCRAM (`scram-sha-256`) as an ordinary role that
//!   owns its database ([`PgServer::url`]), so wrong passwords and missing
//!   permissions behave as in production. SQL reaches `psql` on stdin, never
//!   in argv.
//! - **Parallel-safe.** Each server has its own dir, socket dir and port. The
//!   port is found by binding port 0 and releasing it; if another process
//!   takes it before the postmaster binds it, the start is retried with a new
//!   port. Servers are small (16 MB shared buffers, `fsync=off`: the tests
//!   kill processes, never the machine, and WAL is still written before a
//!   commit returns).
//! - **Signals, not `pg_ctl`.** The postmaster is started in the foreground
//!   and stopped by the signals `pg_ctl stop` sends: SIGINT (fast shutdown)
//!   for [`PgServer::stop`], SIGQUIT (immediate) on `Drop`; anything still
//!   alive after the bound is SIGKILLed with its children. [`PgServer::kill9`]
//!   stops the postmaster (SIGSTOP, so it forks nothing more), SIGKILLs its
//!   children and then itself: a crash of the whole server, from which
//!   [`PgServer::start_again`] recovers on the same data dir and port. The
//!   postmaster also gets SIGQUIT when the test process dies
//!   (`PR_SET_PDEATHSIG`, armed from one spawner thread that lives as long as
//!   the process, since the signal follows the forking *thread*), so a test
//!   binary killed by a timeout leaves no server behind.
//! - **TLS when asked.** [`PgServer::start_tls`] serves TLS (`ssl=on`) with
//!   the certificate and key a test made (the tests make them with `rcgen`),
//!   both in the server's 0700 dir, the key 0600 and the server user's, as
//!   PostgreSQL insists; TCP connections may still be plain.
//! - **Bounded waits.** Every wait has a deadline and panics naming what it
//!   waited for, with the tail of the server log.

use std::{
    fs::File,
    io::{Read, Write},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, OnceLock},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::{geteuid, Pid, User},
};

/// The harness's superuser (Unix socket, trust).
pub const ADMIN: &str = "dws_admin";
/// The role busd connects as (TCP, SCRAM); it owns [`DB`].
pub const USER: &str = "dws";
/// The database the tests use.
pub const DB: &str = "dws";

/// How long a server may take to accept connections after its start.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a shutdown may take before the processes are SIGKILLed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Starts retried when the chosen port was taken meanwhile.
const PORT_ATTEMPTS: usize = 8;
const POLL: Duration = Duration::from_millis(25);

/// One private PostgreSQL server. Dropping it stops the server and removes
/// its directory.
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// `(uid, gid)` of the server user when the tests run as root.
    run_as: Option<(u32, u32)>,
    port: u16,
    password: String,
    postmaster: Option<Child>,
    /// `fsync=on`: the benchmark's server, whose commits must be durable.
    durable: bool,
    /// `ssl=on` with `server.crt`/`server.key` in the server's dir.
    tls: bool,
    /// More `-c name=value` settings of the postmaster (after the defaults).
    extra: Vec<String>,
}

impl PgServer {
    /// Creates, starts and prepares a server; panics with the reason (and
    /// how to install PostgreSQL when it is missing).
    pub fn start() -> PgServer {
        Self::start_with(false, None, vec![])
    }

    /// A server that also speaks TLS, with the certificate (chain) and the
    /// private key given as PEM.
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> PgServer {
        Self::start_with(false, Some((cert_pem, key_pem)), vec![])
    }

    /// A server that fsyncs its commits (and writes full pages), as a real
    /// one would: for benchmarks, where `fsync=off` would flatter the store.
    pub fn start_durable() -> PgServer {
        Self::start_with(true, None, vec![])
    }

    /// A server started with more `name=value` settings (each passed as
    /// `-c`, after the defaults, so they win), e.g. `synchronous_commit=off`
    /// for a server configured carelessly.
    pub fn start_with_settings(settings: &[&str]) -> PgServer {
        Self::start_with(
            false,
            None,
            settings.iter().map(|s| s.to_string()).collect(),
        )
    }

    fn start_with(durable: bool, tls: Option<(&str, &str)>, extra: Vec<String>) -> PgServer {
        let bin = bin_dir();
        let run_as = server_user();
        let dir = tempfile::Builder::new()
            .prefix("dwspg")
            .tempdir_in("/tmp")
            .expect("create temp dir under /tmp");
        if let Some((uid, gid)) = run_as {
            nix::unistd::chown(
                dir.path(),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .expect("chown the server's temp dir to the postgres user");
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod the server's temp dir 0700");
        let mut server = PgServer {
            dir,
            bin,
            run_as,
            port: 0,
            password: random_password(),
            postmaster: None,
            durable,
            tls: tls.is_some(),
            extra,
        };
        if let Some((cert, key)) = tls {
            server.write_server_file("server.crt", cert, 0o644);
            server.write_server_file("server.key", key, 0o600);
        }
        server.initdb();
        server.launch_on_free_port();
        server.psql_in(
            "postgres",
            &format!(
                "CREATE ROLE {USER} LOGIN PASSWORD '{}';\nCREATE DATABASE {DB} OWNER {USER};\n",
                server.password
            ),
        );
        server
    }

    /// The URL busd would be given: the test role over TCP with SCRAM.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/{DB}",
            self.password, self.port
        )
    }

    /// [`PgServer::url`] with another password (for refusal tests).
    pub fn url_with_password(&self, password: &str) -> String {
        format!("postgres://{USER}:{password}@127.0.0.1:{}/{DB}", self.port)
    }

    /// The test role's password (to check it never shows up anywhere).
    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The temp dir holding `data/`, `sock/` and `postgres.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The postmaster's pid while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.postmaster.as_ref().map(|c| c.id() as i32)
    }

    /// The postmaster and its children (backends, background workers)
    /// right now: what must be gone after [`PgServer::kill9`] or `Drop`.
    pub fn processes(&self) -> Vec<i32> {
        let Some(pid) = self.pid() else {
            return vec![];
        };
        let mut all = children_of(pid);
        all.push(pid);
        all
    }

    /// Runs `sql` (fed on stdin, statements one by one) as the superuser in
    /// [`DB`] and returns psql's unaligned, tuples-only output; panics with
    /// psql's stderr when a statement fails.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in(DB, sql)
    }

    /// [`PgServer::psql`] in another database (`postgres` before [`DB`]
    /// exists).
    pub fn psql_in(&self, db: &str, sql: &str) -> String {
        let mut cmd = self.command("psql");
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.sock_dir())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                ADMIN,
                "-d",
                db,
                "-f",
                "-",
            ]);
        let out = run_with_stdin(cmd, sql.as_bytes(), Duration::from_secs(60));
        match out {
            Ok((0, stdout, _)) => stdout.trim_end_matches('\n').to_owned(),
            Ok((code, stdout, stderr)) => panic!(
                "psql failed (exit {code}) running:\n{}\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}\n{}",
                sql.replace(&self.password, "<password>"),
                self.log_section()
            ),
            Err(e) => panic!("psql: {e}\n{}", self.log_section()),
        }
    }

    /// Fast shutdown (SIGINT), waiting until the postmaster has exited.
    pub fn stop(&mut self) {
        self.shut_down(Signal::SIGINT);
    }

    /// Immediate shutdown (SIGQUIT, `pg_ctl stop -m immediate`): no
    /// checkpoint and no flush of WAL still in shared memory; the next start
    /// recovers from what reached the WAL files.
    pub fn stop_immediate(&mut self) {
        self.shut_down(Signal::SIGQUIT);
    }

    /// Starts the server again on the same data dir and port (after
    /// [`PgServer::stop`] or [`PgServer::kill9`]): PostgreSQL restarting
    /// under running clients.
    pub fn start_again(&mut self) {
        assert!(self.postmaster.is_none(), "start_again: the server runs");
        if let Err(e) = self.launch() {
            panic!(
                "PostgreSQL did not start again on port {}: {e}\n{}",
                self.port,
                self.log_section()
            );
        }
    }

    /// A crash of the whole server: every backend and the postmaster are
    /// SIGKILLed; returns once they are gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            kill_tree(&mut child);
        }
    }

    /// The last lines of the server log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    // ------------------------------------------------------------ internals

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
    fn sock_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// A file of the server user in the server's dir, with `mode`.
    fn write_server_file(&self, name: &str, body: &str, mode: u32) {
        let path = self.dir.path().join(name);
        std::fs::write(&path, body).unwrap_or_else(|e| panic!("write {name}: {e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {name}: {e}"));
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(
                &path,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .unwrap_or_else(|e| panic!("chown {name}: {e}"));
        }
    }

    fn log_section(&self) -> String {
        format!(
            "--- {} (tail) ---\n{}\n---",
            self.log_path().display(),
            self.log_tail()
        )
    }

    /// A server program, run as the server user, with a clean environment.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LC_ALL", "C")
            .current_dir(self.dir.path());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn initdb(&self) {
        std::fs::create_dir(self.sock_dir()).expect("create the socket dir");
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(
                &self.sock_dir(),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .expect("chown the socket dir");
        }
        let mut cmd = self.command("initdb");
        cmd.arg("-D").arg(self.data_dir()).args([
            "-U",
            ADMIN,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]);
        match run_with_stdin(cmd, b"", Duration::from_secs(120)) {
            Ok((0, _, _)) => {}
            Ok((code, stdout, stderr)) => {
                panic!("initdb failed (exit {code}):\n{stderr}\n{stdout}")
            }
            Err(e) => panic!("initdb: {e}"),
        }
    }

    /// Starts on a free port, retrying when the port was taken meanwhile.
    fn launch_on_free_port(&mut self) {
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            self.port = free_port();
            match self.launch() {
                Ok(()) => return,
                Err(e) if self.log_tail().contains("could not bind") => last = e,
                Err(e) => panic!("PostgreSQL did not start: {e}\n{}", self.log_section()),
            }
        }
        panic!(
            "PostgreSQL found no free port in {PORT_ATTEMPTS} attempts: {last}\n{}",
            self.log_section()
        );
    }

    /// Spawns the postmaster and waits until it accepts connections.
    fn launch(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the server log");
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.sock_dir());
        for setting in [
            "listen_addresses=127.0.0.1",
            "unix_socket_permissions=0700",
            "max_connections=60",
            "shared_buffers=16MB",
            if self.durable {
                "fsync=on"
            } else {
                "fsync=off"
            },
            if self.durable {
                "full_page_writes=on"
            } else {
                "full_page_writes=off"
            },
            "huge_pages=off",
            "log_min_messages=warning",
            "log_connections=off",
        ] {
            cmd.args(["-c", setting]);
        }
        if self.tls {
            let dir = self.dir.path();
            cmd.args(["-c", "ssl=on", "-c"])
                .arg(format!(
                    "ssl_cert_file={}",
                    dir.join("server.crt").display()
                ))
                .arg("-c")
                .arg(format!("ssl_key_file={}", dir.join("server.key").display()));
        }
        for setting in &self.extra {
            cmd.args(["-c", setting]);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the log fd"))
            .stderr(log);
        // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(std::io::Error::from)
            });
        }
        let child = spawn_anchored(cmd)
            .map_err(|e| format!("cannot run {}: {e}", self.bin.join("postgres").display()))?;
        self.postmaster = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.postmaster.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.postmaster = None;
                    return Err(format!("the postmaster exited at start ({status})"));
                }
            }
            if self.is_ready() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill9();
                return Err(format!("not accepting connections after {READY_TIMEOUT:?}"));
            }
            thread::sleep(POLL);
        }
    }

    fn is_ready(&self) -> bool {
        let mut cmd = self.command("pg_isready");
        cmd.args(["-q", "-h"]).arg(self.sock_dir()).args([
            "-p",
            &self.port.to_string(),
            "-U",
            ADMIN,
            "-d",
            "postgres",
            "-t",
            "2",
        ]);
        matches!(
            run_with_stdin(cmd, b"", Duration::from_secs(10)),
            Ok((0, _, _))
        )
    }

    fn shut_down(&mut self, signal: Signal) {
        let Some(mut child) = self.postmaster.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(POLL);
        }
        kill_tree(&mut child);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.shut_down(Signal::SIGQUIT);
    }
}

/// Spawns `cmd` from one thread that lives as long as the test process, so
/// the child's `PR_SET_PDEATHSIG` (which fires when the *thread* that forked
/// it ends) fires only when the whole process does.
fn spawn_anchored(cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("pg-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the postmaster spawner thread");
        tx
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// SIGSTOPs the postmaster (it forks nothing more), SIGKILLs its children,
/// then the postmaster; reaps it and waits (bounded) until the children are
/// gone or zombies.
fn kill_tree(child: &mut Child) {
    let pid = child.id() as i32;
    let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
    let children = children_of(pid);
    for c in &children {
        let _ = kill(Pid::from_raw(*c), Signal::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
    for c in children {
        crate::wait_pid_gone(c, STOP_TIMEOUT);
    }
}

/// The pids whose parent is `pid`, from `/proc/*/stat`.
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // "pid (comm) S ppid ...": fields after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<i32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// The directory of the server binaries: `$PG_BINDIR`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian), else the directory of `initdb` on
/// `PATH`. Panics saying how to install PostgreSQL.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PG_BINDIR") {
        let d = PathBuf::from(d);
        assert!(
            d.join("initdb").is_file(),
            "PG_BINDIR={} has no initdb",
            d.display()
        );
        return d;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .find(|d| d.join("initdb").is_file() && d.join("postgres").is_file())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "the PostgreSQL server binaries (initdb, postgres) are not installed: \
             these tests need a real PostgreSQL server. On Debian/Ubuntu run \
             `apt-get install -y postgresql` (scripts/test.sh does it when run as root), \
             or set PG_BINDIR to the directory holding initdb"
        )
    })
}

/// `(uid, gid)` of the `postgres` user when running as root; `None` when the
/// tests already run unprivileged.
fn server_user() -> Option<(u32, u32)> {
    if !geteuid().is_root() {
        return None;
    }
    match User::from_name("postgres") {
        Ok(Some(u)) => Some((u.uid.as_raw(), u.gid.as_raw())),
        _ => panic!(
            "the tests run as root and PostgreSQL refuses to: they run the server as the \
             `postgres` system user, which does not exist (the `postgresql` package creates it)"
        ),
    }
}

/// A loopback port nobody listened on a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// 24 hex digits from the kernel's random source, prefixed so a leak is easy
/// to grep for.
fn random_password() -> String {
    let mut bytes = [0u8; 12];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("pgpw{hex}")
}

/// Runs `cmd` with `input` on stdin; `(exit code, stdout, stderr)`, or why it
/// could not run or did not finish within `timeout` (then it is killed).
fn run_with_stdin(
    mut cmd: Command,
    input: &[u8],
    timeout: Duration,
) -> Result<(i32, String, String), String> {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_vec();
    let writer = thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} did not finish within {timeout:?}"));
            }
        }
    };
    let _ = writer.join();
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok((status.code().unwrap_or(-1), stdout, stderr))
}
