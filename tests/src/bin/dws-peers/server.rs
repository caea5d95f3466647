//! The private brokers dws-peers measures: redis-server (pub/sub, or with the
//! append-only file fsync'd always) on a Unix socket, nats-server (core, or
//! JetStream with file storage) on a free loopback port. Each starts in its
//! own temp dir, is stopped by its pid and the dir deleted (on drop, too).

use crate::procs::proc_cpu_s;
use crate::PeersError;
use serde_json::{json, Value};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which broker, configured how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Redis, no persistence (pub/sub).
    Redis,
    /// Redis with `--appendonly yes --appendfsync always` (Streams).
    RedisAof,
    /// NATS core.
    Nats,
    /// NATS with JetStream on a store dir in the temp dir.
    JetStream,
}

impl Kind {
    pub fn program(self) -> &'static str {
        match self {
            Kind::Redis | Kind::RedisAof => "redis-server",
            Kind::Nats | Kind::JetStream => "nats-server",
        }
    }
}

/// The exact server arguments and what an acknowledgement means.
pub fn durability(kind: Kind, args: &[String]) -> Value {
    let server_args = args
        .iter()
        .map(|a| {
            if a.is_empty() {
                "\"\"".into()
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>();
    let means = match kind {
        Kind::RedisAof => "XADD reply sent after the AOF write() and fdatasync() of the event-loop iteration that \
                           executed it (one fsync per iteration: a group commit over all clients' commands read in \
                           that iteration); no RDB snapshots, AOF rewrite off; XREADGROUP's pending-entry records \
                           and XACKs are appended and fsync'd the same way",
        Kind::JetStream => JS_LAZY_NOTE,
        Kind::Redis | Kind::Nats => "not durable: in-memory pub/sub, a message reaches the subscribers connected now",
    };
    json!({"server_args": server_args.join(" "), "durable_means": means})
}

pub const JS_LAZY_NOTE: &str = "stream BENCH (bench.>), file storage, 1 replica, limits retention. nats-server 2.9 \
    syncs its file store lazily: a PubAck means the message was write()n to the stream's block file (it survives a \
    nats-server crash), not fsync'd; streams are fsync'd by a 2-minute timer (2.9 has no setting for it; \
    sync_interval arrived in 2.10). Consumer ack state is rewritten without fsync. An OS crash or power loss can \
    lose acknowledged messages and acks.";

/// A running private broker.
pub struct Broker {
    pub kind: Kind,
    dir: Option<tempfile::TempDir>,
    child: Option<Child>,
    /// Unix socket path (Redis) or host (NATS).
    pub target: String,
    /// 0 for a Unix socket.
    pub port: u16,
    pub args: Vec<String>,
}

/// `Err(MissingServer)` unless `program` is on PATH.
pub fn require(program: &'static str) -> Result<(), PeersError> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| is_executable(&d.join(program))))
        .unwrap_or(false);
    if found {
        Ok(())
    } else {
        Err(PeersError::MissingServer(program))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The server's version line (`redis-server --version`, `nats-server --version`).
pub fn version(program: &str) -> String {
    match Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => {
            let s = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&s)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(_) => String::new(),
    }
}

/// A free loopback TCP port (bound and released; as the reference does).
pub fn free_port() -> Result<u16, PeersError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| PeersError::io("bind a free port", e))?;
    Ok(l.local_addr()
        .map_err(|e| PeersError::io("bind a free port", e))?
        .port())
}

impl Broker {
    /// Starts `kind` in a new temp dir under `base` (default the system temp
    /// dir) and waits until it accepts connections.
    pub fn start(kind: Kind, base: Option<&Path>) -> Result<Broker, PeersError> {
        require(kind.program())?;
        let dir = match base {
            Some(b) => {
                std::fs::create_dir_all(b).map_err(|e| PeersError::io("create --dir", e))?;
                tempfile::Builder::new().prefix("peers-").tempdir_in(b)
            }
            None => tempfile::Builder::new().prefix("peers-").tempdir(),
        }
        .map_err(|e| PeersError::io("create the broker's temp dir", e))?;
        let d = dir.path().to_string_lossy().to_string();
        let (target, port, args): (String, u16, Vec<String>) = match kind {
            Kind::Redis | Kind::RedisAof => {
                let sock = format!("{d}/redis.sock");
                if sock.len() > 100 {
                    return Err(PeersError::Run(format!(
                        "unix socket path too long: {sock} (use a shorter --dir)"
                    )));
                }
                let mut a: Vec<String> = vec!["--save".into(), "".into()];
                if kind == Kind::RedisAof {
                    a.extend(
                        [
                            "--appendonly",
                            "yes",
                            "--appendfsync",
                            "always",
                            "--auto-aof-rewrite-percentage",
                            "0",
                        ]
                        .map(String::from),
                    );
                } else {
                    a.extend(["--appendonly", "no"].map(String::from));
                }
                a.extend(
                    [
                        "--dir",
                        &d,
                        "--daemonize",
                        "no",
                        "--logfile",
                        "",
                        "--port",
                        "0",
                        "--unixsocket",
                        &sock,
                        "--unixsocketperm",
                        "700",
                    ]
                    .map(String::from),
                );
                (sock, 0, a)
            }
            Kind::Nats | Kind::JetStream => {
                let port = free_port()?;
                let mut a: Vec<String> = vec![
                    "-a".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    port.to_string(),
                ];
                if kind == Kind::JetStream {
                    a.extend(["-js".to_string(), "-sd".into(), format!("{d}/js")]);
                }
                ("127.0.0.1".into(), port, a)
            }
        };
        let log = File::create(dir.path().join("server.log"))
            .map_err(|e| PeersError::io("create server.log", e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| PeersError::io("server.log", e))?;
        let child = Command::new(kind.program())
            .args(&args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| PeersError::io(kind.program(), e))?;
        let mut b = Broker {
            kind,
            dir: Some(dir),
            child: Some(child),
            target,
            port,
            args,
        };
        b.wait_ready()?;
        Ok(b)
    }

    fn wait_ready(&mut self) -> Result<(), PeersError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    let log =
                        std::fs::read_to_string(self.dir().join("server.log")).unwrap_or_default();
                    return Err(PeersError::Run(format!(
                        "{} exited ({st}): {}",
                        self.kind.program(),
                        log.trim()
                    )));
                }
            }
            let ok = if self.port == 0 {
                std::os::unix::net::UnixStream::connect(&self.target).is_ok()
            } else {
                std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            };
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(PeersError::Run(format!(
            "{} did not come up within 10 s",
            self.kind.program()
        )))
    }

    pub fn dir(&self) -> PathBuf {
        self.dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default()
    }

    /// Where the broker keeps its data (the AOF dir, the JetStream store).
    pub fn data_dir(&self) -> PathBuf {
        match self.kind {
            Kind::RedisAof => self.dir().join("appendonlydir"),
            Kind::JetStream => self.dir().join("js"),
            Kind::Redis | Kind::Nats => self.dir(),
        }
    }

    /// The broker's user+system CPU seconds so far.
    pub fn cpu_s(&self) -> f64 {
        self.child.as_ref().map_or(0.0, |c| proc_cpu_s(c.id()))
    }

    /// The URL a client connects to.
    pub fn url(&self) -> String {
        if self.port == 0 {
            format!("redis+unix://{}", self.target)
        } else {
            format!("nats://127.0.0.1:{}", self.port)
        }
    }

    pub fn durability(&self) -> Value {
        let mut v = durability(self.kind, &self.args);
        v["data_fs"] = json!(fs_of(&self.dir()));
        v
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if !matches!(c.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }
}

/// The filesystem holding `path`: "fstype on device (mount)".
pub fn fs_of(path: &Path) -> String {
    let p = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(String, String, String)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [dev, mnt, typ, ..] = f[..] else { continue };
        let mnt = mnt.replace("\\040", " ");
        let under = p == Path::new(&mnt) || p.starts_with(&mnt);
        if under && best.as_ref().is_none_or(|b| mnt.len() >= b.1.len()) {
            best = Some((dev.to_string(), mnt, typ.to_string()));
        }
    }
    best.map_or_else(
        || "?".into(),
        |(dev, mnt, typ)| format!("{typ} on {dev} ({mnt})"),
    )
}

/// Total bytes of the files under `path`.
pub fn dir_bytes(path: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(path) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}
