//! The fault suite's workload: a cluster of hosts on one private
//! PostgreSQL, a publisher and a consumer loop on every host, and the
//! recording of everything they were told and printed into a
//! [`History`]. The nemeses (`nemesis.rs`) act on it meanwhile.
//!
//! Every publish carries a unique token in its payload (`{"t":"a-17"}`);
//! every other one also carries it as its `--id`, so both the dedup path
//! and id-less publishes (forwarded publishes must not be appended twice
//! either) are exercised. Consumers attach to one named per-host
//! subscription, `work`, created before the first publish; a consumer run
//! that ends (its bus was killed, fenced or stopped) is recorded and a new
//! run attaches again, which also restarts the host's bus on demand.
//!
//! [`Options`] add the network between each host and PostgreSQL (a
//! [`Proxy`] per host, for the network nemeses), explicit acks (each
//! consumer acks what it read on its stdin), and a second subscription,
//! `pool`, with `--delivery shared` and a consumer on every host.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use dws_tests::{
    common::{cluster_host_with, now_ms},
    history::{parse_gap, History, Outcome, Publish, Run, Seen, SHARED_HOST},
    pg::PgServer,
    proxy::Proxy,
    Child, TestEnv,
};
use prost::Message;
use serde_json::Value;

/// The named per-host subscription every consumer attaches to.
pub const SUB: &str = "work";
/// The shared subscription of [`Options::shared`].
pub const POOL: &str = "pool";
/// How long one publish may take before it counts as unanswered: past
/// every bound docs/cluster.md gives (an owner's append 60 s plus a
/// statement's 5 s), with room for a loaded machine. A publish without an
/// answer by then is a violation ([`Outcome::Unanswered`]).
const PUBLISH_DEADLINE: Duration = Duration::from_secs(90);
/// How long the end waits for every consumer to catch up.
const CATCH_UP: Duration = Duration::from_secs(120);
/// Errors `dws` reports on its own side of the socket: no answer came, so
/// the publish may or may not have been appended.
const NO_ANSWER: [&str; 9] = [
    "its outcome is unknown",
    "lost the connection",
    "closed the connection",
    "did not answer",
    "did not accept",
    "cannot reach",
    "cannot connect",
    "no bus answered",
    "timed out",
];

/// What a scenario's workload has beyond the plain one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// A proxy between each host and PostgreSQL.
    pub proxies: bool,
    /// Consumers run `--ack explicit` and ack on stdin what they read.
    pub explicit: bool,
    /// The shared subscription [`POOL`], a consumer of it on every host.
    pub shared: bool,
}

/// One host of the cluster.
pub struct Host {
    pub name: String,
    pub env: TestEnv,
    proxy: Option<Proxy>,
}

impl Host {
    /// The host's running busd processes.
    pub fn busd_pids(&self) -> Vec<i32> {
        self.env.busd_pids()
    }

    /// The proxy between this host and PostgreSQL (scenarios with
    /// [`Options::proxies`]).
    pub fn proxy(&self) -> &Proxy {
        self.proxy
            .as_ref()
            .expect("a network nemesis needs a scenario with proxies")
    }
}

/// What the publisher and consumer threads record.
#[derive(Default)]
struct Record {
    publishes: Mutex<Vec<Publish>>,
    runs: Mutex<Vec<Run>>,
}

/// A running scenario: the server, the hosts and their threads.
pub struct Cluster {
    pub server: PgServer,
    opts: Options,
    pub hosts: Vec<Arc<Host>>,
    stop_publishing: Arc<AtomicBool>,
    stop_consuming: Arc<AtomicBool>,
    record: Arc<Record>,
    /// host index → the highest seq its consumer printed so far.
    progress: Vec<Arc<AtomicU64>>,
    /// The highest seq any consumer of [`POOL`] printed so far.
    pool_progress: Arc<AtomicU64>,
    publishers: Vec<JoinHandle<()>>,
    consumers: Vec<JoinHandle<()>>,
}

impl Cluster {
    /// `names.len()` hosts on `server`, each with `extra` env vars; their
    /// buses start together (one thread each), `work` is created on the
    /// first and known by all before the workload starts.
    pub fn start(
        server: PgServer,
        names: &[&str],
        extra: &[(&str, &str)],
        opts: Options,
    ) -> Cluster {
        let hosts: Vec<Arc<Host>> = names
            .iter()
            .map(|n| {
                let proxy = opts.proxies.then(|| Proxy::start(server.port()));
                let url = proxy.as_ref().map(|p| p.url(&server.url()));
                let mut vars = extra.to_vec();
                if let Some(url) = &url {
                    vars.push(("DWS_POSTGRES_URL", url.as_str()));
                }
                let env = cluster_host_with(&server, n, &vars);
                Arc::new(Host {
                    name: n.to_string(),
                    env,
                    proxy,
                })
            })
            .collect();
        // Every bus at once: the hosts contend for the lease and migrate
        // the schema together.
        let starts: Vec<_> = hosts
            .iter()
            .map(|h| {
                let h = h.clone();
                thread::spawn(move || {
                    h.env.publish("warm.up", "{}", &[]);
                })
            })
            .collect();
        for s in starts {
            s.join().expect("a bus started");
        }
        hosts[0].env.subscribe(&["f.*", "--id", SUB]);
        let mut subs = vec![SUB];
        if opts.shared {
            hosts[0]
                .env
                .subscribe(&["f.*", "--id", POOL, "--delivery", "shared"]);
            subs.push(POOL);
        }
        for h in &hosts {
            h.env.wait_until(
                Duration::from_secs(30),
                "the subscriptions reached every host",
                || {
                    h.env.status()["subscriptions"]
                        .as_array()
                        .is_some_and(|v| subs.iter().all(|id| v.iter().any(|s| s["id"] == *id)))
                },
            );
        }
        let mut c = Cluster {
            server,
            opts,
            progress: hosts.iter().map(|_| Arc::new(AtomicU64::new(0))).collect(),
            pool_progress: Arc::new(AtomicU64::new(0)),
            hosts,
            stop_publishing: Arc::new(AtomicBool::new(false)),
            stop_consuming: Arc::new(AtomicBool::new(false)),
            record: Arc::new(Record::default()),
            publishers: vec![],
            consumers: vec![],
        };
        for (i, h) in c.hosts.iter().enumerate() {
            c.consumers.push(spawn_consumer(
                h.clone(),
                SUB,
                opts.explicit,
                c.stop_consuming.clone(),
                c.record.clone(),
                c.progress[i].clone(),
            ));
            if opts.shared {
                c.consumers.push(spawn_consumer(
                    h.clone(),
                    POOL,
                    opts.explicit,
                    c.stop_consuming.clone(),
                    c.record.clone(),
                    c.pool_progress.clone(),
                ));
            }
            c.publishers.push(spawn_publisher(
                h.clone(),
                c.stop_publishing.clone(),
                c.record.clone(),
            ));
        }
        c
    }

    /// Stops the publishers, publishes one last event per host (retried
    /// until answered), waits until every consumer printed the highest
    /// answered seq (bounded), stops the consumers and returns the whole
    /// history, the log read from the server, and each host's view of the
    /// shared subscription at the end of the catch-up (for a diagnosis).
    pub fn finish(mut self) -> (History, PgServer, Vec<Arc<Host>>, Vec<String>) {
        self.stop_publishing.store(true, Ordering::SeqCst);
        for p in self.publishers.drain(..) {
            p.join().expect("a publisher thread");
        }
        for h in &self.hosts {
            let deadline = Instant::now() + Duration::from_secs(90);
            let mut n = 0;
            while Instant::now() < deadline {
                let token = format!("{}-last-{n}", h.name);
                n += 1;
                let p = publish_one(h, &token, true);
                let answered = matches!(p.outcome, Outcome::Answered { .. });
                lock(&self.record.publishes).push(p);
                if answered {
                    break;
                }
                thread::sleep(Duration::from_millis(500));
            }
        }
        let top = lock(&self.record.publishes)
            .iter()
            .filter_map(|p| match p.outcome {
                Outcome::Answered { seq, .. } => Some(seq),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let deadline = Instant::now() + CATCH_UP;
        let behind = |p: &AtomicU64| p.load(Ordering::SeqCst) < top;
        while Instant::now() < deadline
            && (self.progress.iter().any(|p| behind(p))
                || (self.opts.shared && behind(&self.pool_progress)))
        {
            thread::sleep(Duration::from_millis(200));
        }
        // The pool's progress is its highest seq delivered: an earlier event
        // whose claim a killed run still holds comes only once that claim
        // expired (HOLD after the run's last renewal), after later ones.
        // Caught up means no claim of it is open any more.
        let open_claims = || {
            self.server
                .psql(&format!(
                    "SELECT count(*) FROM dws_claim WHERE subscription = '{POOL}' AND NOT done"
                ))
                .trim()
                != "0"
        };
        while self.opts.shared && Instant::now() < deadline && open_claims() {
            thread::sleep(Duration::from_millis(200));
        }
        let shared_views: Vec<String> = if self.opts.shared {
            self.hosts.iter().map(|h| shared_view(h)).collect()
        } else {
            vec![]
        };
        self.stop_consuming.store(true, Ordering::SeqCst);
        for c in self.consumers.drain(..) {
            c.join().expect("a consumer thread");
        }
        let mut history = History {
            publishes: std::mem::take(&mut *lock(&self.record.publishes)),
            runs: std::mem::take(&mut *lock(&self.record.runs)),
            log: read_log(&self.server),
            ..History::default()
        };
        for h in &self.hosts {
            history.starts.insert((h.name.clone(), SUB.into()), 0);
            history.owners.extend(owners_in_log(h));
        }
        if self.opts.shared {
            history.starts.insert((SHARED_HOST.into(), POOL.into()), 0);
            history.shared.insert(POOL.into());
        }
        (history, self.server, self.hosts, shared_views)
    }
}

/// How `host` sees [`POOL`] now: its state, its workers and what it holds.
fn shared_view(host: &Host) -> String {
    let mut child = host
        .env
        .dws(["event", "subscription", "info", POOL, "--format", "json"])
        .stdin_null()
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.is_running() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    if child.is_running() {
        return format!("{}: {POOL}: no answer within 10 s", host.name);
    }
    let out = child.wait_exit(Duration::from_secs(5));
    let Ok(v) = serde_json::from_str::<Value>(out.stdout.trim()) else {
        let line = out.stderr.lines().next().unwrap_or("no answer").to_owned();
        return format!("{}: {POOL}: {line}", host.name);
    };
    format!(
        "{}: {POOL}: state {}, workers {}, pending {}, in flight {}, cursor {}, head {}",
        host.name,
        v["state"],
        v["workers"],
        v["pending"],
        v["in_flight"],
        v["cursor"],
        v["head_seq"]
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Publishes `token` on `host` and says what it was told.
fn publish_one(host: &Host, token: &str, with_id: bool) -> Publish {
    let data = format!("{{\"t\":\"{token}\"}}");
    let mut args = vec!["event", "publish", "f.ev", &data];
    if with_id {
        args.extend(["--id", token]);
    }
    let mut child = host.env.dws(&args).stdin_null().spawn();
    let deadline = Instant::now() + PUBLISH_DEADLINE;
    while child.is_running() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    let outcome = if child.is_running() {
        drop(child);
        Outcome::Unanswered(format!("no answer within {PUBLISH_DEADLINE:?}"))
    } else {
        let out = child.wait_exit(Duration::from_secs(5));
        classify(out.code, &out.stdout, &out.stderr)
    };
    Publish {
        token: token.into(),
        host: host.name.clone(),
        outcome,
    }
}

/// What a finished `dws event publish` said.
pub fn classify(code: Option<i32>, stdout: &str, stderr: &str) -> Outcome {
    if code == Some(0) {
        if let Ok(v) = serde_json::from_str::<Value>(stdout.trim()) {
            if let Some(seq) = v["seq"].as_u64() {
                return Outcome::Answered {
                    seq,
                    duplicate: v["duplicate"] == true,
                };
            }
        }
        return Outcome::Unknown(format!("exit 0 without a reply: {stdout}"));
    }
    let line = stderr
        .lines()
        .find(|l| l.starts_with("Error:"))
        .unwrap_or(stderr)
        .to_owned();
    if code.is_none() || NO_ANSWER.iter().any(|n| line.contains(n)) {
        Outcome::Unknown(line)
    } else {
        Outcome::Failed(line)
    }
}

fn spawn_publisher(host: Arc<Host>, stop: Arc<AtomicBool>, record: Arc<Record>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let token = format!("{}-{n}", host.name);
            let p = publish_one(&host, &token, n % 2 == 1);
            lock(&record.publishes).push(p);
            n += 1;
            thread::sleep(Duration::from_millis(10));
        }
    })
}

fn spawn_consumer(
    host: Arc<Host>,
    sub: &'static str,
    explicit: bool,
    stop: Arc<AtomicBool>,
    record: Arc<Record>,
    progress: Arc<AtomicU64>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let mut args = vec!["event", "consume", "--subscribe-id", sub];
            if explicit {
                args.extend(["--ack", "explicit"]);
            }
            let cmd = host.env.dws(&args);
            let started_ms = now_ms();
            let mut child = if explicit {
                cmd.stdin_pipe().spawn()
            } else {
                cmd.stdin_null().spawn()
            };
            let mut acked = 0;
            while child.is_running() && !stop.load(Ordering::SeqCst) {
                let seen = parse_events(&child.stdout_so_far());
                if let Some(top) = top_seq(&seen) {
                    progress.fetch_max(top, Ordering::SeqCst);
                }
                if explicit && seen.len() > acked {
                    // Every event read is handled at once: acked on stdin.
                    let acks: String = seen[acked..]
                        .iter()
                        .filter_map(|s| match s {
                            Seen::Event { seq, .. } => Some(format!("ack {seq}\n")),
                            Seen::Gap { .. } => None,
                        })
                        .collect();
                    acked = seen.len();
                    // A consumer already gone has nothing left to ack.
                    let _ = child.try_write_stdin(acks.as_bytes());
                }
                thread::sleep(Duration::from_millis(100));
            }
            end_run(&host, sub, child, started_ms, &record, &progress);
            if !stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(300));
            }
        }
    })
}

/// Stops a consumer run (SIGTERM, then SIGKILL if it does not exit) and
/// records what it printed; appends a summary of the run (when, how it
/// ended, what it printed, its stderr) to `runs-<sub>.log` in the host's
/// directory, which a failed scenario keeps.
fn end_run(
    host: &Host,
    sub: &str,
    mut child: Child,
    started_ms: u64,
    record: &Record,
    progress: &AtomicU64,
) {
    if child.is_running() {
        child.signal(nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.is_running() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
    let (stdout, stderr, code) = if child.is_running() {
        let lines = child.stdout_so_far();
        drop(child);
        (lines.join("\n"), String::new(), "killed".to_owned())
    } else {
        let out = child.wait_exit(Duration::from_secs(5));
        let code = format!("code {:?} signal {:?}", out.code, out.signal);
        (out.stdout, out.stderr, code)
    };
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    let mut seen = parse_events(&lines);
    // Gap lines go to stderr: place each before the first event at or
    // after the seq it names.
    for gap in stderr.lines().filter_map(parse_gap) {
        let at = seen
            .iter()
            .position(|s| matches!(s, Seen::Event { seq, .. } if *seq >= gap))
            .unwrap_or(seen.len());
        seen.insert(at, Seen::Gap { before: gap });
    }
    if let Some(top) = top_seq(&seen) {
        progress.fetch_max(top, Ordering::SeqCst);
    }
    log_run(host, sub, started_ms, &code, &seen, &stderr);
    lock(&record.runs).push(Run {
        host: host.name.clone(),
        subscription: sub.into(),
        seen,
    });
}

/// One consumer run's summary, appended to `runs-<sub>.log` in the host's
/// directory (best effort: the log is evidence, not the check).
fn log_run(host: &Host, sub: &str, started_ms: u64, code: &str, seen: &[Seen], stderr: &str) {
    use std::io::Write as _;
    let seqs: Vec<u64> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Event { seq, .. } => Some(*seq),
            Seen::Gap { .. } => None,
        })
        .collect();
    let mut text = format!(
        "run {started_ms}..{} ms, {code}: {} event(s), seqs {:?}..{:?}, {} gap line(s)\n",
        now_ms(),
        seqs.len(),
        seqs.iter().min(),
        seqs.iter().max(),
        seen.len() - seqs.len()
    );
    for l in stderr.lines() {
        text.push_str("  | ");
        text.push_str(l);
        text.push('\n');
    }
    let path = host.env.root().join(format!("runs-{sub}.log"));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(text.as_bytes());
    }
}

/// The highest seq a run printed.
fn top_seq(seen: &[Seen]) -> Option<u64> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Event { seq, .. } => Some(*seq),
            Seen::Gap { .. } => None,
        })
        .max()
}

fn parse_events(lines: &[String]) -> Vec<Seen> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            let data: Value = serde_json::from_str(v["data"].as_str()?).ok()?;
            Some(Seen::Event {
                seq: v["seq"].as_u64()?,
                token: data["t"].as_str()?.to_owned(),
                redelivered: v["redelivered"] == true,
            })
        })
        .collect()
}

/// The cluster's log: seq → the workload's token (None for other events).
pub fn read_log(server: &PgServer) -> BTreeMap<u64, Option<String>> {
    let out = server.psql("SELECT seq, encode(encoded, 'hex') FROM dws_event ORDER BY seq");
    out.lines()
        .filter_map(|l| l.split_once('|'))
        .filter_map(|(seq, hex)| {
            let seq: u64 = seq.parse().ok()?;
            let bytes = decode_hex(hex)?;
            let ev = proto::v1::Event::decode(&bytes[..]).ok();
            let token = ev
                .and_then(|e| serde_json::from_str::<Value>(&e.data).ok())
                .and_then(|d| d["t"].as_str().map(str::to_owned));
            Some((seq, token))
        })
        .collect()
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `(epoch, host)` for every time `host`'s bus.log says it became the
/// appender (took the lease, or took it back).
fn owners_in_log(host: &Host) -> Vec<(i64, String)> {
    let path = host.env.bus_log_path();
    let mut text = String::new();
    for p in [path.with_extension("log.1"), path] {
        if let Ok(b) = std::fs::read(&p) {
            text.push_str(&String::from_utf8_lossy(&b));
        }
    }
    text.lines()
        .filter(|l| {
            l.contains("owns the cluster's upstream")
                || l.contains("took the cluster's upstream lease back")
        })
        .filter_map(|l| {
            let at = l.find("epoch=")? + "epoch=".len();
            let n: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            Some((n.parse().ok()?, host.name.clone()))
        })
        .collect()
}
