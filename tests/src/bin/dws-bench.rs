//! `dws-bench`: the fan-out benchmark of the event bus (run it through
//! `scripts/bench.sh`, which builds in release mode first).
//!
//! What it measures, against the real `busd` and real `dws event consume`
//! processes, each scenario in a fresh isolated temp dir with its own bus:
//!
//! - **Fan-out throughput**: N consumers (1, 4, 16) × payload 256 B / 4 KiB.
//!   A publisher speaks the wire protocol directly on the bus socket and sends
//!   `Publish` frames as fast as it can (pipelined, at most `--inflight`
//!   unacknowledged). Every consumer runs
//!   `dws event consume bench.x --format raw --quiet --max-events E` with its
//!   stdout piped to a reader thread here, which timestamps every chunk it
//!   reads and parses the send time the publisher wrote at the start of each
//!   payload. Reported: events/s per consumer (E / (last receive − first
//!   send)), aggregate deliveries/s, p50/p99 publish-to-stdout latency, and
//!   busd's peak RSS; each scenario runs `--runs` times (fresh bus each) and
//!   the median run by deliveries/s is shown, since short runs on a shared
//!   2-core machine are noisy. Also CPU µs per delivery: utime + stime (from
//!   /proc/<pid>/stat, in clock ticks) of busd and of every consumer process
//!   from just before the first publish until the consumers exit (a consumer
//!   is read as a zombie, before it is reaped), over N × E; the publisher is
//!   this benchmark and is not counted. Median over the runs.
//! - **Latency at a fixed rate**: 4 consumers, 256 B, 2000 events/s for ~3 s
//!   (the design's reference point: Redis pub/sub p99 ≈ 90 µs at 2k msg/s),
//!   with CPU µs per delivery as above.
//! - **Redis pub/sub in the same run** (`--peers`): right after the fan-out
//!   table, `redis_fanout.py` (in `--peers-dir`) for the table's rows among
//!   N=4 and 16 at 256 B and N=4 at 4 KiB, and after the fixed-rate run
//!   `redis_latency.py` at the same rate; their final JSON summary lines give
//!   the medians printed next to ours (deliveries/s, CPU µs per delivery,
//!   p50/p99), with the ratio. Needs python3 and redis-server on PATH (the
//!   distribution's packages) and the peer client `$PEERS_BIN/redis_client`
//!   (docs/benchmark.md); without `--peers` one line says how.
//! - **Memory with a stalled consumer**: one fast consumer plus one whose
//!   stdout pipe is never read, 200 000 × 256 B events, retention 20 000
//!   events. Reported: busd's peak RSS (VmHWM), that the fast consumer got
//!   everything, and the stalled subscription's `lost_to_retention`.
//! - **Durable publish** (no consumers): P publisher connections (1, 8), each
//!   flooding its share of the events with at most `--inflight` unacked, on a
//!   disk store with `DWS_EVENT_BUS_DURABILITY` fsync and none, 256 B / 4 KiB.
//!   A PublishAck comes only once the event is written (and fdatasync'ed), so
//!   this measures the group commit. Reported: acked publishes/s (events /
//!   (last ack − first send)) and publish→ack latency; median of
//!   `--durable-runs` runs. Then publish→ack latency of 1 publisher at a
//!   fixed rate (`--durable-rate`, default 1000/s), fsync and none.
//! - **Fan-out, disk store vs memory store**: the flood fan-out with 4
//!   consumers and 256 B events on `DWS_EVENT_BUS_STORE=memory` and on the
//!   default disk store (fsync), and the ratio of their deliveries/s.
//!
//! The fan-out table runs on the store chosen with `--store` / `--durability`
//! (default: disk, fsync, the bus's own default); the fixed-rate latency and
//! memory runs always use the bus defaults.
//!
//! Every payload is `"<send unix nanos> <index> "` padded with `x` to the
//! size, so a reader also checks that it got every event once, in order, at
//! the right size. Every wait is bounded, every process this starts is
//! stopped on the way out (also on failure and on SIGINT/SIGTERM), and all
//! traffic stays on the Unix socket. Exit 0 when every scenario passed.

use std::{
    collections::VecDeque,
    ffi::OsString,
    io::{BufReader, Read, Write},
    net::Shutdown,
    os::unix::{net::UnixStream, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Barrier, Condvar, Mutex,
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bytes::BytesMut;
use dws_tests::{busd_bin, dws_bin, TestEnv};
use nix::{
    sys::{
        resource::{getrusage, UsageWho},
        signal::{kill, SigSet, Signal},
        wait::{waitid, Id, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};
use prost::Message;
use proto::v1::{
    client_frame, server_frame, Bye, ByeReason, ClientFrame, Hello, Publish, ServerFrame,
};
use serde_json::Value;

type Res<T> = Result<T, String>;

const EVENT_TYPE: &str = "bench.x";
/// How long a scenario waits for its consumers to attach.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `dws event status|stop` may take.
const CMD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the publisher waits without any PublishAck progress.
const ACK_STALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Socket read/write timeout of the publisher.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);
/// How long consumers may take to deliver everything after the last publish.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the consumers may go without printing anything while events are due.
const STALL_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a consumer may take to exit after its last event.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long busd may take to exit after `dws event stop`.
const BUS_EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval of the waits that have nothing to block on.
const POLL: Duration = Duration::from_millis(20);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The URL of the private PostgreSQL server a `--store postgres` run starts.
static PG_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Clusters handed out so far: each bus of a postgres run gets its own.
static CLUSTERS: AtomicU64 = AtomicU64::new(0);

fn check_interrupted() -> Res<()> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        Err("interrupted by a signal".into())
    } else {
        Ok(())
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

// ------------------------------------------------------------------ options

struct Opts {
    consumers: Vec<usize>,
    events_small: u64,
    events_large: u64,
    inflight: u64,
    rate: u64,
    rate_secs: f64,
    rate_consumers: usize,
    memory_events: u64,
    memory_retention: u64,
    runs: usize,
    skip_latency: bool,
    skip_memory: bool,
    /// The store of the main fan-out table.
    store: StoreSel,
    skip_durable: bool,
    skip_store_compare: bool,
    /// Set by `--only-durable` / `--only-store-compare`: skip the fan-out
    /// table, the fixed-rate latency and the memory runs.
    only: bool,
    durable_events_small: u64,
    durable_events_large: u64,
    durable_publishers: Vec<usize>,
    durable_runs: usize,
    durable_rate: u64,
    compare_consumers: usize,
    /// `--peers`: compare with Redis pub/sub (the scripts in `peers_dir`).
    peers: bool,
    peers_dir: PathBuf,
    peers_msgs_small: u64,
    peers_msgs_large: u64,
    /// `--where EXPR`: the fan-out with this jq expression on every
    /// consumer against the same run without it.
    where_expr: Option<String>,
}

/// Which store a bus runs on (env `DWS_EVENT_BUS_STORE` and
/// `DWS_EVENT_BUS_DURABILITY`, always set explicitly).
#[derive(Clone, Copy, PartialEq, Eq)]
struct StoreSel {
    /// "disk" or "memory".
    kind: &'static str,
    /// "fsync" or "none" (ignored by the memory store, which reports "none").
    durability: &'static str,
}

impl StoreSel {
    const DISK_FSYNC: StoreSel = StoreSel {
        kind: "disk",
        durability: "fsync",
    };
    const DISK_NONE: StoreSel = StoreSel {
        kind: "disk",
        durability: "none",
    };
    const MEMORY: StoreSel = StoreSel {
        kind: "memory",
        durability: "none",
    };
    /// The cluster store on the private server [`PG_URL`] points at; every
    /// bus gets a cluster of its own (a fresh log), see [`BusEnv::new`].
    const POSTGRES: StoreSel = StoreSel {
        kind: "postgres",
        durability: "postgres",
    };

    fn env(&self) -> Vec<(&'static str, &'static str)> {
        let mut env = vec![
            ("DWS_EVENT_BUS_STORE", self.kind),
            ("DWS_EVENT_BUS_DURABILITY", self.durability),
        ];
        if self.kind == "postgres" {
            env.push(("DWS_POSTGRES_URL", PG_URL.get().map_or("", String::as_str)));
            env.push(("DWS_CLUSTER_HOST", "bench"));
        }
        env
    }

    fn describe(&self) -> String {
        match self.kind {
            "memory" => "memory store (DWS_EVENT_BUS_STORE=memory)".into(),
            "postgres" => "postgres store (DWS_EVENT_BUS_STORE=postgres; a private PostgreSQL, fsync=on, on loopback TCP; one host)".into(),
            k => format!(
                "{k} store, durability {} (DWS_EVENT_BUS_STORE={k}, DWS_EVENT_BUS_DURABILITY={})",
                self.durability, self.durability
            ),
        }
    }

    /// Fails unless `status` shows a bus running on this store.
    fn check(&self, status: &Value) -> Res<()> {
        let kind = status["store"]["kind"].as_str();
        let durability = status["store"]["durability"].as_str();
        if kind == Some(self.kind) && durability == Some(self.durability) {
            Ok(())
        } else {
            Err(format!(
                "the bus runs on store {kind:?} / durability {durability:?}, expected {} / {}",
                self.kind, self.durability
            ))
        }
    }
}

const USAGE: &str = "\
dws-bench: fan-out and durable-publish benchmark of the dws event bus
(real busd + real consumers)

usage: dws-bench [--bin-dir DIR] [options]

  --bin-dir DIR              directory holding dws and busd (default: next to dws-bench)
  --consumers LIST           consumer counts, comma separated (default 1,4,16)
  --events-256 N             events per 256 B scenario (default 200000, as many as the Redis run)
  --events-4k N              events per 4 KiB scenario (default 20000, as many as the Redis run)
  --inflight N               most unacknowledged publishes (default 1024)
  --runs N                   runs per fan-out scenario; the median is shown (default 5)
  --rate R                   fixed-rate latency run: events/s (default 2000)
  --rate-secs S              fixed-rate latency run: duration in s (default 3)
  --rate-consumers N         fixed-rate latency run: consumers (default 4)
  --memory-events N          stalled-consumer run: events (default 200000)
  --memory-retention N       stalled-consumer run: DWS_EVENT_BUS_RETENTION_EVENTS (default 20000)
  --skip-latency             skip the fixed-rate latency run
  --skip-memory              skip the stalled-consumer memory run
  --store disk|memory        store of the fan-out table's buses (default disk)
  --durability fsync|none    durability of the fan-out table's disk store (default fsync)

durable publish (disk store, no consumers; fsync and none):
  --durable-events-256 N     events per 256 B durable-publish scenario (default 100000)
  --durable-events-4k N      events per 4 KiB durable-publish scenario (default 20000)
  --durable-publishers LIST  publisher connections, comma separated (default 1,8)
  --durable-runs N           runs per durable-publish scenario; the median is shown (default 3)
  --durable-rate R           publish->ack latency run: publishes/s, for --rate-secs (default 1000)
  --skip-durable             skip the durable-publish throughput and ack-latency runs
  --only-durable             run only those (combines with --only-store-compare)

fan-out on the disk store vs the memory store (256 B, flood, --runs each):
  --compare-consumers N      consumers (default 4)
  --skip-store-compare       skip this comparison
  --only-store-compare       run only this comparison (combines with --only-durable)

Redis pub/sub in the same run (the peer benchmarks; see docs/benchmark.md):
  --peers                    after the fan-out table, run DIR/redis_fanout.py for N=4 and N=16 at 256 B
                             and N=4 at 4 KiB (those --consumers has, --runs runs each), after the
                             fixed-rate run DIR/redis_latency.py, and print ours vs Redis. Needs
                             python3 and redis-server on PATH (apt-get install redis-server python3)
                             and the compiled peer client $PEERS_BIN/redis_client (default DIR/bin)
  --peers-dir DIR            the peer benchmarks (default bench/peers, from the current dir)
  --peers-msgs-256 M         messages per Redis 256 B run (default 200000)
  --peers-msgs-4k M          messages per Redis 4 KiB run (default 20000)

the cost of --where (issue 25): 256 B flood, --compare-consumers consumers, --runs each:
  --where EXPR               run it without and with `--where EXPR` on every consumer (the payload is
                             not JSON: `data` is a string; e.g. '(.data | length) > 0', true for all)
  --only-where               run only this comparison (needs --where)

  -h, --help                 this help
";

fn parse_opts() -> Res<Opts> {
    let mut o = Opts {
        consumers: vec![1, 4, 16],
        events_small: 200_000,
        events_large: 20_000,
        inflight: 1024,
        rate: 2000,
        rate_secs: 3.0,
        rate_consumers: 4,
        memory_events: 200_000,
        memory_retention: 20_000,
        runs: 5,
        skip_latency: false,
        skip_memory: false,
        store: StoreSel::DISK_FSYNC,
        skip_durable: false,
        skip_store_compare: false,
        only: false,
        durable_events_small: 100_000,
        durable_events_large: 20_000,
        durable_publishers: vec![1, 8],
        durable_runs: 3,
        durable_rate: 1000,
        compare_consumers: 4,
        peers: false,
        peers_dir: PathBuf::from("bench/peers"),
        peers_msgs_small: 200_000,
        peers_msgs_large: 20_000,
        where_expr: None,
    };
    let (mut only_durable, mut only_compare, mut only_where) = (false, false, false);
    let mut durability: Option<&'static str> = None;
    let mut args = std::env::args().skip(1);
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Res<T> {
        let v = v.ok_or(format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag}: bad value {v:?}"))
    }
    fn list(flag: &str, v: Option<String>) -> Res<Vec<usize>> {
        let v = v.ok_or(format!("{flag} needs a value"))?;
        v.split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(format!("{flag}: bad list {v:?} (numbers 1-256)"))
    }
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            "--bin-dir" => {
                let dir = PathBuf::from(args.next().ok_or("--bin-dir needs a value")?);
                let dws = dir.join("dws");
                let busd = dir.join("busd");
                for p in [&dws, &busd] {
                    if !p.is_file() {
                        return Err(format!(
                            "{} not found (build with `cargo build --release --workspace --bins`)",
                            p.display()
                        ));
                    }
                }
                // Read by the harness's dws_bin()/busd_bin(); no thread runs yet.
                std::env::set_var("DWS_BIN", dws);
                std::env::set_var("BUSD_BIN", busd);
            }
            "--consumers" => o.consumers = list(&a, args.next())?,
            "--durable-publishers" => o.durable_publishers = list(&a, args.next())?,
            "--store" => {
                o.store.kind = match args.next().as_deref() {
                    Some("disk") => "disk",
                    Some("memory") => "memory",
                    Some("postgres") => "postgres",
                    v => {
                        return Err(format!(
                            "--store: bad value {v:?} (disk, memory or postgres)"
                        ))
                    }
                }
            }
            "--durability" => {
                durability = Some(match args.next().as_deref() {
                    Some("fsync") => "fsync",
                    Some("none") => "none",
                    v => return Err(format!("--durability: bad value {v:?} (fsync or none)")),
                })
            }
            "--durable-events-256" => o.durable_events_small = num(&a, args.next())?,
            "--durable-events-4k" => o.durable_events_large = num(&a, args.next())?,
            "--durable-runs" => o.durable_runs = num(&a, args.next())?,
            "--durable-rate" => o.durable_rate = num(&a, args.next())?,
            "--compare-consumers" => o.compare_consumers = num(&a, args.next())?,
            "--skip-durable" => o.skip_durable = true,
            "--peers" => o.peers = true,
            "--peers-dir" => {
                o.peers_dir = PathBuf::from(args.next().ok_or("--peers-dir needs a value")?)
            }
            "--peers-msgs-256" => o.peers_msgs_small = num(&a, args.next())?,
            "--peers-msgs-4k" => o.peers_msgs_large = num(&a, args.next())?,
            "--only-durable" => only_durable = true,
            "--skip-store-compare" => o.skip_store_compare = true,
            "--only-store-compare" => only_compare = true,
            "--where" => o.where_expr = Some(args.next().ok_or("--where needs a value")?),
            "--only-where" => only_where = true,
            "--events-256" => o.events_small = num(&a, args.next())?,
            "--events-4k" => o.events_large = num(&a, args.next())?,
            "--inflight" => o.inflight = num(&a, args.next())?,
            "--rate" => o.rate = num(&a, args.next())?,
            "--rate-secs" => o.rate_secs = num(&a, args.next())?,
            "--rate-consumers" => o.rate_consumers = num(&a, args.next())?,
            "--memory-events" => o.memory_events = num(&a, args.next())?,
            "--memory-retention" => o.memory_retention = num(&a, args.next())?,
            "--runs" => o.runs = num(&a, args.next())?,
            "--skip-latency" => o.skip_latency = true,
            "--skip-memory" => o.skip_memory = true,
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    if o.events_small == 0
        || o.events_large == 0
        || o.memory_events == 0
        || o.inflight == 0
        || o.runs == 0
    {
        return Err("event counts, --inflight and --runs must be at least 1".into());
    }
    if o.rate == 0 || !(o.rate_secs > 0.0 && o.rate_secs <= 600.0) || o.rate_consumers == 0 {
        return Err("--rate, --rate-secs (0-600) and --rate-consumers must be positive".into());
    }
    if o.durable_events_small == 0
        || o.durable_events_large == 0
        || o.durable_runs == 0
        || o.durable_rate == 0
        || o.compare_consumers == 0
        || o.peers_msgs_small == 0
        || o.peers_msgs_large == 0
    {
        return Err(
            "--durable-events-*, --durable-runs, --durable-rate, --compare-consumers and --peers-msgs-* must be at least 1"
                .into(),
        );
    }
    o.store.durability = match (o.store.kind, durability) {
        ("memory" | "postgres", Some(_)) => {
            return Err("--durability applies to --store disk only".into())
        }
        ("memory", None) => "none",
        ("postgres", None) => "postgres",
        (_, d) => d.unwrap_or("fsync"),
    };
    if only_where && o.where_expr.is_none() {
        return Err("--only-where needs --where EXPR".into());
    }
    if only_durable || only_compare || only_where {
        if (only_durable && o.skip_durable) || (only_compare && o.skip_store_compare) {
            return Err("--only-X and --skip-X of the same section contradict each other".into());
        }
        o.only = true;
        o.skip_durable = !only_durable;
        o.skip_store_compare = !only_compare;
    }
    Ok(o)
}

// ------------------------------------------------------------------ bus env

/// One isolated bus world: the harness's [`TestEnv`] (temp dir, env vars,
/// kills its busd on drop) plus graceful stop.
struct BusEnv {
    env: TestEnv,
    extra: Vec<(String, String)>,
    stopped: bool,
}

impl BusEnv {
    fn new(extra: &[(&str, &str)]) -> BusEnv {
        let mut extra: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // A bus leaked by a hard kill of this benchmark goes away on its own.
        extra.push(("DWS_EVENT_BUS_IDLE_TIMEOUT".into(), "60s".into()));
        let env = TestEnv::with_env(
            &extra
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
        );
        if extra
            .iter()
            .any(|(k, v)| k == "DWS_EVENT_BUS_STORE" && v == "postgres")
        {
            let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
            let cluster = format!("bench-{}-{n}", std::process::id());
            let _ = std::fs::write(
                env.cfg_dir().join("config.toml"),
                format!("[profiles.default]\ncluster = \"{cluster}\"\n"),
            );
        }
        BusEnv {
            env,
            extra,
            stopped: false,
        }
    }

    /// `dws <args>` with this env's environment (and nothing else but PATH).
    fn dws_command(&self, args: &[&str]) -> Command {
        let dws = dws_bin();
        let mut path: OsString = dws
            .parent()
            .unwrap_or(Path::new("/"))
            .as_os_str()
            .to_owned();
        path.push(":");
        path.push(
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        );
        let mut cmd = Command::new(dws);
        cmd.args(args)
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.env.home_dir())
            .env("DWS_CONFIG_DIR", self.env.cfg_dir())
            .env("XDG_RUNTIME_DIR", self.env.run_dir())
            .env("TMPDIR", self.env.root());
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
        // So consumers (and the busd they spawn) can be stopped with SIGTERM.
        unblock_watched_in_child(&mut cmd);
        cmd
    }

    /// Runs `dws <args>` to completion within `timeout` (killed after it).
    fn run_dws(&self, args: &[&str], timeout: Duration) -> Res<(ExitStatus, String, String)> {
        let what = format!("dws {}", args.join(" "));
        let mut child = self
            .dws_command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot spawn `{what}`: {e}"))?;
        let out = capture(child.stdout.take());
        let err = capture(child.stderr.take());
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("`{what}` did not finish within {timeout:?}"));
                }
                Err(e) => return Err(format!("waiting for `{what}`: {e}")),
            }
        };
        let out = out.recv_timeout(Duration::from_secs(3)).unwrap_or_default();
        let err = err.recv_timeout(Duration::from_secs(3)).unwrap_or_default();
        Ok((
            status,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        ))
    }

    /// `dws event status --format json`, parsed.
    fn status(&self) -> Res<Value> {
        let (st, out, err) = self.run_dws(&["event", "status", "--format", "json"], CMD_TIMEOUT)?;
        if !st.success() {
            return Err(format!("`dws event status` failed ({st}): {}", err.trim()));
        }
        serde_json::from_str(&out).map_err(|e| format!("status output is not JSON ({e}): {out}"))
    }

    /// Waits until the bus shows `n` attached consumers; returns that status.
    /// Fails early when a consumer already exited.
    fn wait_consumers(&self, n: usize, consumers: &mut [ConsumerProc]) -> Res<Value> {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            check_interrupted()?;
            for c in consumers.iter_mut() {
                if let Some(st) = c.exited() {
                    return Err(format!(
                        "consumer pid {} exited ({st}) before {n} consumer(s) were attached; its stderr: {}",
                        c.pid,
                        c.stderr_text()
                    ));
                }
            }
            let status = self.status()?;
            let attached = status["consumers"].as_array().map_or(0, |a| a.len());
            if attached == n && status["running"] == Value::Bool(true) {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out after {ATTACH_TIMEOUT:?} waiting for {n} attached consumer(s); last status: running={} consumers={attached}\n{}",
                    status["running"],
                    self.log_tail()
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self) -> String {
        format!("--- bus.log (tail) ---\n{}", self.env.bus_log_tail())
    }

    /// `dws event stop`, then waits (bounded) until this env has no busd.
    fn stop(&mut self) -> Res<()> {
        self.stopped = true;
        let stop = self.run_dws(&["event", "stop"], CMD_TIMEOUT);
        let deadline = Instant::now() + BUS_EXIT_TIMEOUT;
        while !self.env.busd_pids().is_empty() {
            if Instant::now() >= deadline {
                return Err(format!(
                    "busd still running {BUS_EXIT_TIMEOUT:?} after `dws event stop` (pids {:?}; stop said: {})",
                    self.env.busd_pids(),
                    match &stop {
                        Ok((st, out, err)) => format!("{st}: {} {}", out.trim(), err.trim()),
                        Err(e) => e.clone(),
                    }
                ));
            }
            thread::sleep(POLL);
        }
        match stop {
            Ok((st, _, _)) if st.success() => Ok(()),
            Ok((st, out, err)) => Err(format!(
                "`dws event stop` failed ({st}): {} {}",
                out.trim(),
                err.trim()
            )),
            Err(e) => Err(e),
        }
    }
}

impl Drop for BusEnv {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.stop();
        }
        // TestEnv's drop then SIGKILLs any busd of this env that is left.
    }
}

/// Reads `r` to the end on a thread; the bytes arrive on the channel.
fn capture<R: Read + Send + 'static>(r: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut r) = r {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    } else {
        let _ = tx.send(Vec::new());
    }
    rx
}

// ------------------------------------------------------------------ consumers

/// A running `dws event consume` process; dropping it stops it (closes its
/// stdout if still held, SIGTERM, then SIGKILL after a grace period).
struct ConsumerProc {
    child: Child,
    pid: i32,
    stdout: Option<ChildStdout>,
    stderr: Arc<Mutex<Vec<u8>>>,
    status: Option<ExitStatus>,
    /// utime + stime in clock ticks, read from /proc while the exited
    /// process was still a zombie (reaping it removes /proc/<pid>).
    final_cpu_ticks: Option<u64>,
}

impl ConsumerProc {
    fn spawn(env: &BusEnv, extra_args: &[&str]) -> Res<ConsumerProc> {
        let mut args = vec!["event", "consume", EVENT_TYPE, "--format", "raw", "--quiet"];
        args.extend_from_slice(extra_args);
        let mut child = env
            .dws_command(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot spawn `dws {}`: {e}", args.join(" ")))?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut e) = child.stderr.take() {
            let sink = stderr.clone();
            thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = e.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                    if s.len() < 64 * 1024 {
                        s.extend_from_slice(&chunk[..n]);
                    }
                }
            });
        }
        Ok(ConsumerProc {
            pid: child.id() as i32,
            stdout: child.stdout.take(),
            child,
            stderr,
            status: None,
            final_cpu_ticks: None,
        })
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            // Look without reaping first: an exited child stays a zombie, and
            // its /proc/<pid>/stat still holds its final CPU times.
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            match waitid(Id::Pid(Pid::from_raw(self.pid)), flags) {
                Ok(WaitStatus::StillAlive) => return None,
                Ok(_) => self.final_cpu_ticks = proc_cpu_ticks(self.pid as i64),
                Err(_) => {}
            }
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// CPU time (utime + stime, clock ticks) used so far, or in all once it
    /// exited (then known only if [`ConsumerProc::exited`] saw it exit).
    fn cpu_ticks(&mut self) -> Option<u64> {
        match self.exited() {
            Some(_) => self.final_cpu_ticks,
            None => proc_cpu_ticks(self.pid as i64),
        }
    }

    fn stderr_text(&self) -> String {
        let s = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let t = String::from_utf8_lossy(&s).trim().to_owned();
        if t.is_empty() {
            "<empty>".into()
        } else {
            t
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for ConsumerProc {
    fn drop(&mut self) {
        self.stdout = None;
        if self.exited().is_some() {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
        if self.wait_exit(Duration::from_secs(3)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a reader thread saw on one consumer's stdout.
#[derive(Default)]
struct ReadResult {
    lines: u64,
    first_recv_ns: u64,
    last_recv_ns: u64,
    /// Publish-to-read latency of every line, in ns.
    latencies: Vec<u64>,
    /// The first malformed, missing, duplicate or out-of-order line.
    error: Option<String>,
}

/// Reads a consumer's stdout to EOF on a thread and sends what it saw.
/// `size` is the payload size: every line is `size` bytes plus `\n`.
fn spawn_reader(
    progress: Arc<AtomicU64>,
    idx: usize,
    mut out: ChildStdout,
    size: usize,
    expect: u64,
    tx: mpsc::Sender<(usize, ReadResult)>,
) {
    thread::spawn(move || {
        let mut r = ReadResult {
            latencies: Vec::with_capacity(expect as usize),
            ..ReadResult::default()
        };
        let mut buf = vec![0u8; 256 * 1024];
        let mut have = 0usize;
        loop {
            if have == buf.len() {
                // A line longer than the buffer: not one of ours.
                r.error
                    .get_or_insert_with(|| format!("line longer than {} bytes", buf.len()));
                have = 0;
            }
            let n = match out.read(&mut buf[have..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = unix_nanos();
            have += n;
            let mut pos = 0;
            while pos < have {
                // Fast path: lines are exactly `size` bytes.
                let end = if pos + size < have && buf[pos + size] == b'\n' {
                    pos + size
                } else {
                    match buf[pos..have].iter().position(|b| *b == b'\n') {
                        Some(i) => pos + i,
                        None => break,
                    }
                };
                check_line(&mut r, &buf[pos..end], size, now);
                pos = end + 1;
            }
            progress.store(r.lines, Ordering::Relaxed);
            buf.copy_within(pos..have, 0);
            have -= pos;
        }
        if have > 0 {
            r.error
                .get_or_insert_with(|| format!("{have} trailing bytes without a newline"));
        }
        let _ = tx.send((idx, r));
    });
}

fn check_line(r: &mut ReadResult, line: &[u8], size: usize, now: u64) {
    let expected_index = r.lines;
    r.lines += 1;
    if r.first_recv_ns == 0 {
        r.first_recv_ns = now;
    }
    r.last_recv_ns = now;
    let mut fields = line.splitn(3, |b| *b == b' ');
    let sent = fields.next().and_then(parse_u64);
    let index = fields.next().and_then(parse_u64);
    match (sent, index) {
        (Some(sent), Some(index)) => {
            r.latencies.push(now.saturating_sub(sent));
            if r.error.is_none() && index != expected_index {
                r.error = Some(format!("line {expected_index} carries event index {index} (lost, duplicated or reordered)"));
            }
        }
        _ => {
            r.error.get_or_insert_with(|| {
                format!(
                    "line {expected_index} is not `<nanos> <index> ...`: {:?}",
                    String::from_utf8_lossy(&line[..line.len().min(60)])
                )
            });
        }
    }
    if r.error.is_none() && line.len() != size {
        r.error = Some(format!(
            "line {expected_index} has {} bytes, expected {size}",
            line.len()
        ));
    }
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

// ------------------------------------------------------------------ publisher

#[derive(Default)]
struct AckState {
    acked: u64,
    /// Why the ack reader stopped (error frame, Bye, EOF, bad frame).
    ended: Option<String>,
    /// With latency tracking: (request id, when its frame was written) of
    /// every unacknowledged publish, oldest first (the bus acks in order).
    sent_at: VecDeque<(u64, Instant)>,
    /// With latency tracking: write-to-PublishAck time of every ack, in ns.
    ack_latencies: Vec<u64>,
    /// CPU time of the ack reader thread over its life, in µs, set when it ends.
    reader_cpu_us: Option<f64>,
}

type Shared = Arc<(Mutex<AckState>, Condvar)>;

/// A client of the bus socket that publishes `bench.x` events; a second
/// thread drains the PublishAck frames.
struct Publisher {
    stream: UnixStream,
    acks: Shared,
    sent: u64,
    buf: BytesMut,
    /// Publish frames encoded into `buf` but not written yet.
    pending: u64,
    /// Record write-to-ack latencies (see [`Publisher::track_latency`]).
    track: bool,
}

/// Reads one frame (4-byte big-endian length + protobuf body); `None` on a
/// clean EOF before the frame.
fn read_frame(r: &mut impl Read, body: &mut Vec<u8>) -> Res<Option<ServerFrame>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(format!("reading from the bus: {e}")),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > proto::MAX_FRAME_LEN {
        return Err(format!("bus sent a frame of {len} bytes"));
    }
    body.resize(len, 0);
    r.read_exact(body)
        .map_err(|e| format!("reading a frame body from the bus: {e}"))?;
    ServerFrame::decode(body.as_slice())
        .map(Some)
        .map_err(|e| format!("undecodable frame from the bus: {e}"))
}

impl Publisher {
    fn connect(socket: &Path) -> Res<Publisher> {
        let mut stream = UnixStream::connect(socket)
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        stream
            .set_read_timeout(Some(SOCKET_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(SOCKET_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut buf = BytesMut::with_capacity(256 * 1024);
        let hello = ClientFrame {
            kind: Some(client_frame::Kind::Hello(Hello {
                protocol_version: proto::PROTOCOL_VERSION,
                client_pid: std::process::id(),
                client_name: "dws-bench".into(),
                build: proto::BUILD.into(),
            })),
        };
        proto::encode_frame(&hello, &mut buf).map_err(|e| e.to_string())?;
        stream
            .write_all(&buf)
            .map_err(|e| format!("sending Hello: {e}"))?;
        buf.clear();
        let mut body = Vec::new();
        match read_frame(&mut stream, &mut body)? {
            Some(ServerFrame {
                kind: Some(server_frame::Kind::HelloAck(_)),
            }) => {}
            other => return Err(format!("expected HelloAck, got {other:?}")),
        }
        let acks: Shared = Arc::new((Mutex::new(AckState::default()), Condvar::new()));
        let reader = stream
            .try_clone()
            .map_err(|e| format!("clone socket: {e}"))?;
        let shared = acks.clone();
        thread::spawn(move || drain_acks(reader, shared));
        Ok(Publisher {
            stream,
            acks,
            sent: 0,
            buf,
            pending: 0,
            track: false,
        })
    }

    /// From now on, record for every publish the time between writing its
    /// frame and reading its PublishAck ([`Publisher::take_latencies`]).
    fn track_latency(&mut self) {
        self.track = true;
    }

    /// The write-to-ack latencies recorded so far, in ns, in ack order.
    fn take_latencies(&self) -> Vec<u64> {
        let mut st = self.acks.0.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut st.ack_latencies)
    }

    fn encode_publish(&mut self, size: usize) -> Res<()> {
        let mut data = format!("{} {} ", unix_nanos(), self.sent).into_bytes();
        data.resize(data.len().max(size), b'x');
        let data = String::from_utf8(data).map_err(|e| e.to_string())?;
        let frame = ClientFrame {
            kind: Some(client_frame::Kind::Publish(Publish {
                request_id: self.sent + 1,
                event_type: EVENT_TYPE.into(),
                event_id: String::new(),
                data,
                headers: Default::default(),
            })),
        };
        proto::encode_frame(&frame, &mut self.buf).map_err(|e| e.to_string())?;
        self.sent += 1;
        self.pending += 1;
        Ok(())
    }

    fn flush(&mut self) -> Res<()> {
        if self.track && self.pending > 0 {
            // Recorded before the write, so before any of these acks can
            // arrive; request ids are `sent + 1` at encode time.
            let now = Instant::now();
            let mut st = self.acks.0.lock().unwrap_or_else(|p| p.into_inner());
            for id in self.sent - self.pending + 1..=self.sent {
                st.sent_at.push_back((id, now));
            }
        }
        self.pending = 0;
        if !self.buf.is_empty() {
            self.stream
                .write_all(&self.buf)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                        "the bus read nothing from the publisher for {SOCKET_TIMEOUT:?} (stuck?)"
                    ),
                    _ => format!("writing to the bus: {e}"),
                })?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Blocks until fewer than `limit` publishes are unacknowledged; returns
    /// the number acked so far.
    fn wait_acks_below(&self, limit: u64) -> Res<u64> {
        let (lock, cv) = &*self.acks;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut last_progress = (st.acked, Instant::now());
        while self.sent - st.acked >= limit.max(1) {
            if let Some(why) = &st.ended {
                return Err(format!(
                    "publisher connection ended after {} of {} acks: {why}",
                    st.acked, self.sent
                ));
            }
            check_interrupted()?;
            if st.acked != last_progress.0 {
                last_progress = (st.acked, Instant::now());
            } else if last_progress.1.elapsed() >= ACK_STALL_TIMEOUT {
                return Err(format!(
                    "no PublishAck for {ACK_STALL_TIMEOUT:?} ({} of {} acked): the bus stopped accepting publishes",
                    st.acked, self.sent
                ));
            }
            st = cv
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(st.acked)
    }

    /// Publishes `n` events as fast as possible, at most `inflight`
    /// unacknowledged, in batches of up to 64 frames per write. With
    /// `max_lag = (printed, lag)`, it also stays at most `lag` events ahead of
    /// what a consumer printed (so that consumer never loses events to
    /// retention). Returns the unix-nanos time of the first send.
    fn flood(
        &mut self,
        n: u64,
        size: usize,
        inflight: u64,
        max_lag: Option<(&AtomicU64, u64)>,
    ) -> Res<u64> {
        let first = unix_nanos();
        let mut lag_since: Option<(u64, Instant)> = None;
        while self.sent < n {
            check_interrupted()?;
            if let Some((printed, lag)) = max_lag {
                let p = printed.load(Ordering::Relaxed);
                if self.sent.saturating_sub(p) >= lag {
                    match lag_since {
                        Some((q, t)) if q == p && t.elapsed() >= STALL_TIMEOUT => {
                            return Err(format!(
                                "the consumer printed nothing for {STALL_TIMEOUT:?} ({p} of {} published)",
                                self.sent
                            ))
                        }
                        Some((q, _)) if q == p => {}
                        _ => lag_since = Some((p, Instant::now())),
                    }
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
            }
            let acked = self.wait_acks_below(inflight)?;
            let room = inflight - (self.sent - acked);
            let batch = room.min(64).min(n - self.sent);
            for _ in 0..batch {
                self.encode_publish(size)?;
            }
            self.flush()?;
        }
        self.wait_acks_below(1)?;
        Ok(first)
    }

    /// Publishes `n` events at `rate`/s, one write each. Returns the unix-nanos
    /// time of the first send.
    fn paced(&mut self, n: u64, size: usize, rate: u64, inflight: u64) -> Res<u64> {
        let start = Instant::now();
        let first = unix_nanos();
        for i in 0..n {
            let due = start + Duration::from_nanos(i.saturating_mul(1_000_000_000) / rate);
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if i % 256 == 0 {
                check_interrupted()?;
            }
            self.wait_acks_below(inflight)?;
            self.encode_publish(size)?;
            self.flush()?;
        }
        self.wait_acks_below(1)?;
        Ok(first)
    }

    /// Says goodbye and closes the connection. Returns the CPU time the ack
    /// reader thread used, in µs (`None` if it did not end within 2 s).
    fn close(mut self) -> Option<f64> {
        let bye = ClientFrame {
            kind: Some(client_frame::Kind::Bye(Bye {
                reason: ByeReason::ClientDone as i32,
                message: String::new(),
            })),
        };
        if proto::encode_frame(&bye, &mut self.buf).is_ok() {
            let _ = self.flush();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        let (lock, cv) = &*self.acks;
        let st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (st, _) = cv
            .wait_timeout_while(st, Duration::from_secs(2), |st| st.reader_cpu_us.is_none())
            .unwrap_or_else(|p| p.into_inner());
        st.reader_cpu_us
    }
}

fn drain_acks(stream: UnixStream, shared: Shared) {
    let mut r = BufReader::with_capacity(256 * 1024, stream);
    let mut body = Vec::new();
    let (lock, cv) = &*shared;
    loop {
        let frame = read_frame(&mut r, &mut body);
        let now = Instant::now();
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        match frame {
            Ok(Some(f)) => match f.kind {
                Some(server_frame::Kind::PublishAck(a)) => {
                    if a.duplicate {
                        st.ended = Some(format!(
                            "publish {} acknowledged as a duplicate",
                            a.request_id
                        ));
                    } else {
                        st.acked += 1;
                        match st.sent_at.pop_front() {
                            Some((id, at)) if id == a.request_id => {
                                st.ack_latencies
                                    .push(now.saturating_duration_since(at).as_nanos() as u64)
                            }
                            Some((id, _)) => {
                                st.ended = Some(format!(
                                    "PublishAck for request {} while {id} was the oldest unacknowledged",
                                    a.request_id
                                ))
                            }
                            None => {}
                        }
                    }
                }
                Some(server_frame::Kind::Error(e)) => {
                    st.ended = Some(format!(
                        "bus error {} (request {}): {}",
                        e.code, e.request_id, e.message
                    ));
                }
                Some(server_frame::Kind::Bye(b)) => {
                    st.ended = Some(format!("bus said Bye (reason {}): {}", b.reason, b.message));
                }
                _ => {}
            },
            Ok(None) => st.ended = Some("the bus closed the connection".into()),
            Err(e) => st.ended = Some(e),
        }
        let done = st.ended.is_some();
        if done {
            st.reader_cpu_us = Some(thread_cpu_us());
        }
        drop(st);
        cv.notify_all();
        if done {
            return;
        }
    }
}

// ------------------------------------------------------------------ scenarios

/// utime + stime of process `pid` (all its threads, not its children) in
/// clock ticks, from /proc/<pid>/stat (fields 14 and 15).
fn proc_cpu_ticks(pid: i64) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything.
    let mut fields = text.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second of /proc's CPU times (sysconf(_SC_CLK_TCK)).
fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// CPU time (user + system) of the calling thread, in µs.
fn thread_cpu_us() -> f64 {
    getrusage(UsageWho::RUSAGE_THREAD).map_or(f64::NAN, |u| {
        let (user, sys) = (u.user_time(), u.system_time());
        (user.tv_sec() + sys.tv_sec()) as f64 * 1e6 + (user.tv_usec() + sys.tv_usec()) as f64
    })
}

fn read_proc_kb(pid: i64, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim_start_matches(':')
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn bus_info(status: &Value) -> Res<(PathBuf, i64)> {
    let socket = status["bus"]["socket"]
        .as_str()
        .ok_or("status has no bus.socket")?;
    let pid = status["bus"]["pid"]
        .as_i64()
        .ok_or("status has no bus.pid")?;
    Ok((PathBuf::from(socket), pid))
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

struct FanoutResult {
    per_consumer_avg: f64,
    per_consumer_min: f64,
    aggregate: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    busd_hwm_kb: Option<u64>,
    /// The bus ran with retention raised to hold every event.
    retention_raised: bool,
    /// CPU µs of busd and all consumer processes per delivery, from just
    /// before the first publish until the consumers exited.
    cpu_us_per_delivery: Option<f64>,
    /// The same plus this benchmark's publisher threads (the publishing one
    /// and its ack reader): comparable with peers that count their publisher.
    cpu_with_pub_us_per_delivery: Option<f64>,
    /// busd's part of `cpu_us_per_delivery`.
    busd_cpu_us_per_delivery: Option<f64>,
    /// The clock ticks behind `cpu_us_per_delivery` (the fewest of the runs
    /// in a table row): below [`COARSE_CPU_TICKS`] the figure is coarse.
    cpu_ticks: Option<u64>,
}

/// CPU figures measured from fewer clock ticks than this are marked coarse:
/// every process's figure is only good to ±1 tick.
const COARSE_CPU_TICKS: u64 = 20;

#[derive(Clone, Copy)]
enum Mode {
    Flood,
    Rate(u64),
}

/// Waits for the reader results of `consumers` (bounded) and checks every
/// consumer got exactly `events` events and exited 0. Fails early when the
/// consumers stop making progress or one of them loses events to retention.
fn collect(
    rx: &mpsc::Receiver<(usize, ReadResult)>,
    progress: &[Arc<AtomicU64>],
    consumers: &mut [ConsumerProc],
    events: u64,
    env: &BusEnv,
) -> Res<Vec<ReadResult>> {
    let n = consumers.len();
    let mut results: Vec<Option<ReadResult>> = (0..n).map(|_| None).collect();
    let started = Instant::now();
    let deadline = started + DELIVERY_TIMEOUT;
    let total = || {
        progress
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let (mut last_total, mut last_change) = (total(), Instant::now());
    let mut next_status = started + Duration::from_secs(2);
    let pids: Vec<i64> = consumers.iter().map(|c| c.pid as i64).collect();
    let mut got = 0;
    while got < n {
        check_interrupted()?;
        let why = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((i, r)) => {
                results[i] = Some(r);
                got += 1;
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => "a reader thread vanished".to_string(),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                let t = total();
                if t != last_total {
                    (last_total, last_change) = (t, now);
                }
                let mut why = None;
                if now >= deadline {
                    why = Some(format!("timed out after {DELIVERY_TIMEOUT:?}"));
                } else if now - last_change >= STALL_TIMEOUT {
                    why = Some(format!(
                        "no consumer printed anything for {STALL_TIMEOUT:?}"
                    ));
                } else if now >= next_status {
                    // Slow to finish: is it because events were evicted?
                    next_status = now + Duration::from_secs(2);
                    let status = env.status()?;
                    let lost: Vec<String> = status["subscriptions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|s| {
                            s["attached_pid"]
                                .as_i64()
                                .is_some_and(|p| pids.contains(&p))
                        })
                        .filter(|s| s["lost_to_retention"].as_u64().unwrap_or(0) > 0)
                        .map(|s| {
                            format!("pid {} lost {}", s["attached_pid"], s["lost_to_retention"])
                        })
                        .collect();
                    if !lost.is_empty() {
                        why = Some(format!(
                            "consumers lost events to log retention ({}): the publisher outran them by more than the \
                             log holds; use fewer events or raise DWS_EVENT_BUS_RETENTION_EVENTS/BYTES",
                            lost.join(", ")
                        ));
                    }
                }
                match why {
                    Some(w) => w,
                    None => continue,
                }
            }
        };
        let status = env.status().map_or_else(
            |e| e,
            |s| {
                format!(
                    "consumers: {}, subscriptions: {}",
                    s["consumers"], s["subscriptions"]
                )
            },
        );
        let missing: Vec<String> = consumers
            .iter_mut()
            .zip(&results)
            .zip(progress)
            .filter(|((_, r), _)| r.is_none())
            .map(|((c, _), p)| {
                let state = c.exited().map_or("running".into(), |s| s.to_string());
                format!(
                    "pid {} ({state}, {} of {events} lines)",
                    c.pid,
                    p.load(Ordering::Relaxed)
                )
            })
            .collect();
        return Err(format!(
            "{why}: {} of {n} consumers did not finish: {}\nbus status: {status}\n{}",
            missing.len(),
            missing.join(", "),
            env.log_tail()
        ));
    }
    let mut out = Vec::with_capacity(n);
    let mut problems = Vec::new();
    for (c, r) in consumers.iter_mut().zip(results) {
        let r = r.unwrap_or_default();
        let st = c.wait_exit(EXIT_TIMEOUT);
        if r.lines != events {
            problems.push(format!(
                "consumer pid {} printed {} of {events} events",
                c.pid, r.lines
            ));
        }
        if let Some(e) = &r.error {
            problems.push(format!("consumer pid {}: {e}", c.pid));
        }
        match st {
            Some(s) if s.success() => {}
            Some(s) => problems.push(format!(
                "consumer pid {} exited with {s}; stderr: {}",
                c.pid,
                c.stderr_text()
            )),
            None => problems.push(format!(
                "consumer pid {} still running {EXIT_TIMEOUT:?} after its stdout closed",
                c.pid
            )),
        }
        out.push(r);
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("\n"))
    }
}

/// Retention bounds that hold `events` events of `size` bytes when the bus
/// defaults (100 000 events, 64 MiB) would not: a flooding publisher is never
/// throttled by consumers, so a long run would otherwise make the consumers
/// lose events to retention instead of measuring them.
fn retention_for(events: u64, size: usize) -> Option<(String, String)> {
    let bytes = events.saturating_mul(size as u64 + 1024);
    (events > 100_000 || bytes > 64 << 20)
        .then(|| ((events + 1024).to_string(), bytes.max(64 << 20).to_string()))
}

fn run_fanout(
    n: usize,
    size: usize,
    events: u64,
    mode: Mode,
    inflight: u64,
    store: StoreSel,
) -> Res<FanoutResult> {
    run_fanout_with(n, size, events, mode, inflight, store, &[])
}

/// [`run_fanout`] with `extra` on every consumer's command line.
fn run_fanout_with(
    n: usize,
    size: usize,
    events: u64,
    mode: Mode,
    inflight: u64,
    store: StoreSel,
    extra: &[&str],
) -> Res<FanoutResult> {
    let retention = retention_for(events, size);
    let mut vars = store.env().to_vec();
    if let Some((ev, bytes)) = &retention {
        vars.push(("DWS_EVENT_BUS_RETENTION_EVENTS", ev.as_str()));
        vars.push(("DWS_EVENT_BUS_RETENTION_BYTES", bytes.as_str()));
    }
    let mut env = BusEnv::new(&vars);
    let max = events.to_string();
    let mut args = vec!["--max-events", max.as_str()];
    args.extend_from_slice(extra);
    let mut consumers = Vec::with_capacity(n);
    // The first consumer starts the bus; the others join it.
    consumers.push(ConsumerProc::spawn(&env, &args)?);
    env.wait_consumers(1, &mut consumers)?;
    for _ in 1..n {
        consumers.push(ConsumerProc::spawn(&env, &args)?);
    }
    let status = env.wait_consumers(n, &mut consumers)?;
    store.check(&status)?;
    let (socket, bus_pid) = bus_info(&status)?;

    let (tx, rx) = mpsc::channel();
    let progress: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::default()).collect();
    for (i, c) in consumers.iter_mut().enumerate() {
        let out = c.stdout.take().ok_or("consumer stdout already taken")?;
        spawn_reader(progress[i].clone(), i, out, size, events, tx.clone());
    }
    drop(tx);

    // CPU baselines: busd and every consumer, and this (publishing) thread.
    let busd_cpu0 = proc_cpu_ticks(bus_pid);
    let consumers_cpu0: Vec<Option<u64>> = consumers.iter_mut().map(|c| c.cpu_ticks()).collect();
    let pub_cpu0 = thread_cpu_us();
    let mut publisher = Publisher::connect(&socket)?;
    let first_send = match mode {
        Mode::Flood => publisher.flood(events, size, inflight, None)?,
        Mode::Rate(rate) => publisher.paced(events, size, rate, inflight)?,
    };
    let pub_cpu_us = thread_cpu_us() - pub_cpu0 + publisher.close().unwrap_or(f64::NAN);

    let results = collect(&rx, &progress, &mut consumers, events, &env)?;
    let busd_hwm_kb = read_proc_kb(bus_pid, "VmHWM");
    // The consumers have exited (collect waited for each), busd still runs.
    let mut ticks = busd_cpu0
        .zip(proc_cpu_ticks(bus_pid))
        .map(|(a, b)| b.saturating_sub(a));
    let busd_ticks = ticks;
    for (c, before) in consumers.iter_mut().zip(consumers_cpu0) {
        let used = before.zip(c.cpu_ticks()).map(|(a, b)| b.saturating_sub(a));
        ticks = ticks.zip(used).map(|(t, u)| t + u);
    }
    env.stop()?;
    let deliveries = (n as u64 * events) as f64;
    let cpu_us_per_delivery = ticks.map(|t| t as f64 / clock_ticks_per_sec() * 1e6 / deliveries);
    let cpu_with_pub_us_per_delivery = cpu_us_per_delivery
        .map(|c| c + pub_cpu_us / deliveries)
        .filter(|c| c.is_finite());
    let busd_cpu_us_per_delivery =
        busd_ticks.map(|t| t as f64 / clock_ticks_per_sec() * 1e6 / deliveries);

    let rates: Vec<f64> = results
        .iter()
        .map(|r| events as f64 / (r.last_recv_ns.saturating_sub(first_send).max(1) as f64 / 1e9))
        .collect();
    let last = results
        .iter()
        .map(|r| r.last_recv_ns)
        .max()
        .unwrap_or(first_send);
    let mut lat: Vec<u64> = results.into_iter().flat_map(|r| r.latencies).collect();
    lat.sort_unstable();
    Ok(FanoutResult {
        per_consumer_avg: rates.iter().sum::<f64>() / rates.len() as f64,
        per_consumer_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
        aggregate: (n as u64 * events) as f64
            / (last.saturating_sub(first_send).max(1) as f64 / 1e9),
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        max_us: lat.last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
        busd_hwm_kb,
        retention_raised: retention.is_some(),
        cpu_us_per_delivery,
        cpu_with_pub_us_per_delivery,
        busd_cpu_us_per_delivery,
        cpu_ticks: ticks,
    })
}

struct DurableResult {
    /// Acked publishes/s: events / (last ack − first send).
    rate: f64,
    ack_p50_us: f64,
    ack_p99_us: f64,
    ack_max_us: f64,
    acks: usize,
}

/// Starts the bus of `env` without a consumer (by publishing one event of
/// another type through `dws event publish`) and checks it runs on `store`.
/// Returns the bus socket.
fn start_bus(env: &BusEnv, store: StoreSel) -> Res<PathBuf> {
    let (st, out, err) = env.run_dws(&["event", "publish", "bench.start"], CMD_TIMEOUT)?;
    if !st.success() {
        return Err(format!(
            "`dws event publish bench.start` failed ({st}): {} {}\n{}",
            out.trim(),
            err.trim(),
            env.log_tail()
        ));
    }
    let status = env.status()?;
    if status["running"] != Value::Bool(true) {
        return Err(format!(
            "no bus running after `dws event publish`: {status}"
        ));
    }
    store.check(&status)?;
    Ok(bus_info(&status)?.0)
}

/// `publishers` connections to a fresh bus on `store` with no consumers
/// publish `events` events of `size` bytes between them (the first ones
/// take one more when it does not divide), each from its own thread: in
/// `Mode::Flood`, as fast as acks allow with at most `inflight` unacked per
/// connection, all starting together; in `Mode::Rate(r)`, at `r`/s each.
/// The events are not consumed; default retention drops old ones.
fn run_durable(
    store: StoreSel,
    size: usize,
    publishers: usize,
    events: u64,
    mode: Mode,
    inflight: u64,
) -> Res<DurableResult> {
    let mut env = BusEnv::new(&store.env());
    let socket = start_bus(&env, store)?;
    let head_before = env.status()?["log"]["head_seq"].as_u64().unwrap_or(0);
    let mut pubs = Vec::with_capacity(publishers);
    for _ in 0..publishers {
        let mut p = Publisher::connect(&socket)?;
        p.track_latency();
        pubs.push(p);
    }
    let per = events / publishers as u64;
    let extra = events % publishers as u64;
    let start = Barrier::new(publishers);
    let outcomes: Vec<Res<(u64, u64, Vec<u64>)>> = thread::scope(|s| {
        let handles: Vec<_> = pubs
            .into_iter()
            .enumerate()
            .map(|(i, mut p)| {
                let n = per + u64::from((i as u64) < extra);
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let first = match mode {
                        Mode::Flood => p.flood(n, size, inflight, None)?,
                        Mode::Rate(rate) => p.paced(n, size, rate, inflight)?,
                    };
                    let last = unix_nanos();
                    let lat = p.take_latencies();
                    p.close();
                    Ok((first, last, lat))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a publisher thread panicked".into()))
            })
            .collect()
    });
    let mut first = u64::MAX;
    let mut last = 0;
    let mut lat = Vec::with_capacity(events as usize);
    for (i, o) in outcomes.into_iter().enumerate() {
        let (f, l, mut v) =
            o.map_err(|e| format!("publisher {}: {e}\n{}", i + 1, env.log_tail()))?;
        first = first.min(f);
        last = last.max(l);
        lat.append(&mut v);
    }
    let status = env.status()?;
    let head = status["log"]["head_seq"].as_u64().unwrap_or(0);
    if head < head_before + events {
        return Err(format!(
            "all {events} publishes acked, but the log head moved only from {head_before} to {head}"
        ));
    }
    if !status["store"]["last_error"].is_null() {
        return Err(format!("store error: {}", status["store"]["last_error"]));
    }
    if lat.len() as u64 != events {
        return Err(format!(
            "{} ack latencies recorded for {events} publishes",
            lat.len()
        ));
    }
    env.stop()?;
    lat.sort_unstable();
    Ok(DurableResult {
        rate: events as f64 / (last.saturating_sub(first).max(1) as f64 / 1e9),
        ack_p50_us: percentile(&lat, 0.50),
        ack_p99_us: percentile(&lat, 0.99),
        ack_max_us: lat.last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
        acks: lat.len(),
    })
}

/// Runs `f` `runs` times and keeps the median result by `key`.
fn median_of<T>(runs: usize, key: impl Fn(&T) -> f64, f: impl Fn() -> Res<T>) -> Res<T> {
    let mut rs = (0..runs).map(|_| guarded(&f)).collect::<Res<Vec<_>>>()?;
    rs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    Ok(rs.swap_remove(rs.len() / 2))
}

struct MemoryResult {
    fast_received: u64,
    fast_rate: f64,
    fast_p99_us: f64,
    busd_rss_before_kb: Option<u64>,
    busd_hwm_kb: Option<u64>,
    busd_rss_after_kb: Option<u64>,
    stalled: Value,
    log: Value,
}

fn run_memory(events: u64, retention: u64, inflight: u64) -> Res<MemoryResult> {
    let retention_s = retention.to_string();
    let mut env = BusEnv::new(&[("DWS_EVENT_BUS_RETENTION_EVENTS", &retention_s)]);
    let max = events.to_string();
    let mut consumers = Vec::with_capacity(2);
    consumers.push(ConsumerProc::spawn(&env, &["--max-events", &max])?);
    env.wait_consumers(1, &mut consumers)?;
    // The stalled one: unbounded, stdin /dev/null (no EOF exit), its stdout
    // pipe held here and never read.
    consumers.push(ConsumerProc::spawn(&env, &[])?);
    let status = env.wait_consumers(2, &mut consumers)?;
    let (socket, bus_pid) = bus_info(&status)?;
    let stalled_pid = consumers[1].pid;
    let busd_rss_before_kb = read_proc_kb(bus_pid, "VmRSS");

    let (tx, rx) = mpsc::channel();
    let out = consumers[0]
        .stdout
        .take()
        .ok_or("consumer stdout already taken")?;
    let progress: Arc<AtomicU64> = Arc::default();
    spawn_reader(progress.clone(), 0, out, 256, events, tx);

    let mut publisher = Publisher::connect(&socket)?;
    // Paced by the fast consumer so that it, unlike the stalled one, never
    // falls further behind than half the retention.
    let first_send = publisher.flood(
        events,
        256,
        inflight,
        Some((&progress, (retention / 2).max(1))),
    )?;
    publisher.close();

    let results = collect(
        &rx,
        std::slice::from_ref(&progress),
        &mut consumers[..1],
        events,
        &env,
    )?;
    let fast = &results[0];
    let busd_hwm_kb = read_proc_kb(bus_pid, "VmHWM");
    let busd_rss_after_kb = read_proc_kb(bus_pid, "VmRSS");
    let status = env.status()?;
    if consumers[1].exited().is_some() {
        return Err(format!(
            "the stalled consumer exited; stderr: {}",
            consumers[1].stderr_text()
        ));
    }
    let stalled = status["subscriptions"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["attached_pid"].as_i64() == Some(stalled_pid as i64)))
        .cloned()
        .ok_or_else(|| format!("no subscription attached to the stalled consumer (pid {stalled_pid}) in status: {}", status["subscriptions"]))?;
    let log = status["log"].clone();

    // Unstick and end the stalled consumer: closing its stdout gives it EPIPE.
    drop(consumers);
    env.stop()?;

    let mut lat = fast.latencies.clone();
    lat.sort_unstable();
    let r = MemoryResult {
        fast_received: fast.lines,
        fast_rate: events as f64
            / (fast.last_recv_ns.saturating_sub(first_send).max(1) as f64 / 1e9),
        fast_p99_us: percentile(&lat, 0.99),
        busd_rss_before_kb,
        busd_hwm_kb,
        busd_rss_after_kb,
        stalled,
        log,
    };
    let lost = r.stalled["lost_to_retention"].as_u64().unwrap_or(0);
    let log_events = r.log["events"].as_u64().unwrap_or(0);
    let mut problems = Vec::new();
    if events > retention + 2 * inflight.max(1024) && lost == 0 {
        problems.push(format!(
            "the stalled subscription reports lost_to_retention = 0 although {events} events went through a log of {retention}"
        ));
    }
    // The log may exceed retention by at most one pinned window (default 1024).
    if log_events > retention + 1024 {
        problems.push(format!(
            "the log holds {log_events} events, more than retention {retention} + one window"
        ));
    }
    if problems.is_empty() {
        Ok(r)
    } else {
        Err(format!("{}\n{}", problems.join("\n"), describe_memory(&r)))
    }
}

fn kb(v: Option<u64>) -> String {
    v.map_or("?".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

fn describe_memory(r: &MemoryResult) -> String {
    let s = &r.stalled;
    format!(
        "  fast consumer:       received {} events, {:.0} ev/s, p99 {:.0} µs\n\
         \x20 stalled consumer:    matched {}, delivered {}, in_flight {}, pending {}, lag {}, lost_to_retention {}\n\
         \x20 log:                 events {} (max {}), bytes {} (max {})\n\
         \x20 busd RSS:            {} before publishing, {} after; peak (VmHWM) {}",
        r.fast_received,
        r.fast_rate,
        r.fast_p99_us,
        s["matched"],
        s["delivered"],
        s["in_flight"],
        s["pending"],
        s["lag"],
        s["lost_to_retention"],
        r.log["events"],
        r.log["max_events"],
        r.log["bytes"],
        r.log["max_bytes"],
        kb(r.busd_rss_before_kb),
        kb(r.busd_rss_after_kb),
        kb(r.busd_hwm_kb),
    )
}

// ------------------------------------------------------------------ main

/// Runs `f`, turning a panic of the harness into a failure message.
fn guarded<T>(f: impl FnOnce() -> Res<T>) -> Res<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into())),
    }
}

/// The signals that interrupt the benchmark (it then cleans up and exits 1).
fn watched_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set
}

/// This process blocks the signals it sigwaits for, and a child inherits the
/// mask: unblock them in `cmd`'s child so it can be stopped with SIGTERM.
fn unblock_watched_in_child(cmd: &mut Command) {
    let watched = watched_signals();
    // SAFETY: only pthread_sigmask, which is async-signal-safe, runs
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || watched.thread_unblock().map_err(std::io::Error::from));
    }
}

fn install_signal_watch() -> Res<()> {
    let set = watched_signals();
    // Blocked in every thread spawned from here on (and unblocked again in
    // every child, see `BusEnv::dws_command`).
    set.thread_block()
        .map_err(|e| format!("sigprocmask: {e}"))?;
    thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            if INTERRUPTED.swap(true, Ordering::Relaxed) {
                eprintln!("dws-bench: second {sig:?}, exiting without cleanup");
                std::process::exit(130);
            }
            eprintln!("dws-bench: {sig:?}, cleaning up");
        }
    });
    Ok(())
}

fn size_name(size: usize) -> String {
    if size >= 1024 && (size / 1024) * 1024 == size {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

fn main() {
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("dws-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = guarded(|| Ok((dws_bin(), busd_bin()))).and_then(|(d, b)| {
        println!("dws-bench: dws = {}, busd = {}", d.display(), b.display());
        install_signal_watch()
    }) {
        eprintln!("dws-bench: {e}");
        std::process::exit(2);
    }
    let started = Instant::now();
    let mut failures: Vec<String> = Vec::new();
    // `--store postgres`: one private server for the whole run.
    let _pg = (opts.store == StoreSel::POSTGRES).then(|| {
        let server = dws_tests::pg::PgServer::start_durable();
        let _ = PG_URL.set(server.url());
        println!(
            "PostgreSQL: a private server on 127.0.0.1:{}",
            server.port()
        );
        server
    });

    if !opts.only {
        run_classic_sections(&opts, &mut failures);
    }
    if !opts.skip_durable && !INTERRUPTED.load(Ordering::Relaxed) {
        run_durable_sections(&opts, &mut failures);
    }
    if !opts.skip_store_compare && !INTERRUPTED.load(Ordering::Relaxed) {
        run_store_compare(&opts, &mut failures);
    }
    if let Some(expr) = &opts.where_expr {
        if !INTERRUPTED.load(Ordering::Relaxed) {
            run_where_compare(&opts, expr, &mut failures);
        }
    }

    if INTERRUPTED.load(Ordering::Relaxed) {
        failures.push("interrupted by a signal; remaining scenarios skipped".into());
    }
    println!();
    println!("total time {:.1} s", started.elapsed().as_secs_f64());
    if failures.is_empty() {
        println!("all scenarios passed");
    } else {
        eprintln!();
        for f in &failures {
            eprintln!("FAILED: {f}\n");
        }
        eprintln!("dws-bench: {} scenario(s) failed", failures.len());
        std::process::exit(1);
    }
}

/// The fan-out table, the fixed-rate latency run and the memory run; with
/// `--peers`, Redis pub/sub runs right after the table and after the
/// fixed-rate run, each followed by ours vs Redis.
fn run_classic_sections(opts: &Opts, failures: &mut Vec<String>) {
    // Checked first, so a missing prerequisite shows before the long runs.
    let peers_ready = opts.peers && {
        match peers_missing(&opts.peers_dir) {
            Some(why) => {
                println!();
                println!("--peers: the Redis pub/sub comparison will be skipped: {why}");
                false
            }
            None => true,
        }
    };
    println!();
    println!("Fan-out throughput: 1 publisher (pipelined, ≤{} in flight) → N × `dws event consume --format raw`", opts.inflight);
    println!("(bus on the {})", opts.store.describe());
    println!(
        "(median of {} run(s) by deliveries/s, each on a fresh bus; latency here includes queueing under \
         saturation, see the fixed-rate run for unloaded latency)",
        opts.runs
    );
    println!(
        "(cpu µs/deliv: CPU time of busd plus every `dws event consume` process (utime + stime from /proc/<pid>/stat, \
         in 1/{} s ticks), from just before the first publish until the consumers exit, divided by the N × events \
         deliveries; median over the runs. Not counted: the publisher, which is this benchmark itself, and its \
         stdout readers)",
        clock_ticks_per_sec()
    );
    println!();
    println!(
        "{:>4}  {:>7}  {:>7}  {:>13}  {:>13}  {:>15}  {:>9}  {:>9}  {:>9}  {:>12}  {:>9}  {:>10}",
        "N",
        "payload",
        "events",
        "ev/s/cons avg",
        "ev/s/cons min",
        "deliveries/s",
        "p50 µs",
        "p99 µs",
        "max µs",
        "cpu µs/deliv",
        "busd part",
        "busd peak"
    );
    let mut raised_any = false;
    let mut coarse_any = false;
    // Every row's (N, payload, events, median result) for the Redis comparison.
    let mut rows: Vec<(usize, usize, u64, Option<FanoutResult>)> = Vec::new();
    for &size in &[256usize, 4096] {
        for &n in &opts.consumers {
            if INTERRUPTED.load(Ordering::Relaxed) {
                break;
            }
            let events = if size == 256 {
                opts.events_small
            } else {
                opts.events_large
            };
            // The median of `runs` runs (by aggregate deliveries/s): short
            // runs on a shared 2-core machine are noisy. The CPU figures are
            // medians of their own.
            let result = (0..opts.runs)
                .map(|_| {
                    guarded(|| run_fanout(n, size, events, Mode::Flood, opts.inflight, opts.store))
                })
                .collect::<Res<Vec<_>>>()
                .map(|mut rs| {
                    let cpu = median(rs.iter().filter_map(|r| r.cpu_us_per_delivery).collect());
                    let cpu_pub = median(
                        rs.iter()
                            .filter_map(|r| r.cpu_with_pub_us_per_delivery)
                            .collect(),
                    );
                    let busd_cpu = median(
                        rs.iter()
                            .filter_map(|r| r.busd_cpu_us_per_delivery)
                            .collect(),
                    );
                    let ticks = rs.iter().filter_map(|r| r.cpu_ticks).min();
                    rs.sort_by(|a, b| a.aggregate.total_cmp(&b.aggregate));
                    let mut r = rs.swap_remove(rs.len() / 2);
                    r.cpu_ticks = ticks;
                    r.cpu_us_per_delivery = cpu;
                    r.cpu_with_pub_us_per_delivery = cpu_pub;
                    r.busd_cpu_us_per_delivery = busd_cpu;
                    r
                });
            match result {
                Ok(r) => {
                    raised_any |= r.retention_raised;
                    coarse_any |= r.cpu_coarse();
                    println!(
                    "{:>4}  {:>7}  {:>7}  {:>13.0}  {:>13.0}  {:>15.0}  {:>9.0}  {:>9.0}  {:>9.0}  {:>12}  {:>9}  {:>10}",
                    n,
                    size_name(size),
                    events,
                    r.per_consumer_avg,
                    r.per_consumer_min,
                    r.aggregate,
                    r.p50_us,
                    r.p99_us,
                    r.max_us,
                    fmt_cpu(r.cpu_us_per_delivery, &r),
                    fmt_cpu(r.busd_cpu_us_per_delivery, &r),
                    kb(r.busd_hwm_kb) + if r.retention_raised { " *" } else { "" }
                    );
                    rows.push((n, size, events, Some(r)));
                }
                Err(e) => {
                    println!(
                        "{:>4}  {:>7}  {:>7}  FAILED (see below)",
                        n,
                        size_name(size),
                        events
                    );
                    failures.push(format!("fan-out N={n} payload={}: {e}", size_name(size)));
                    rows.push((n, size, events, None));
                }
            }
        }
    }

    if raised_any {
        println!(
            "  * bus retention raised to hold every event (DWS_EVENT_BUS_RETENTION_EVENTS/BYTES)"
        );
    }
    if coarse_any {
        println!("{COARSE_NOTE}");
    }

    if !opts.peers {
        println!();
        println!(
            "Redis pub/sub comparison: not run; pass --peers (needs python3, redis-server, the peer scripts in \
             --peers-dir (default {}) and $PEERS_BIN/redis_client; see docs/benchmark.md)",
            opts.peers_dir.display()
        );
    } else if peers_ready && !INTERRUPTED.load(Ordering::Relaxed) {
        run_peer_fanout(opts, &rows, failures);
    }

    if !opts.skip_latency && !INTERRUPTED.load(Ordering::Relaxed) {
        let events = ((opts.rate as f64 * opts.rate_secs).round() as u64).max(1);
        println!();
        println!(
            "Latency at a fixed rate: {} events/s for {:.1} s, {} consumers, 256 B, {} (reference: Redis pub/sub p99 ≈ 90 µs at 2k msg/s)",
            opts.rate,
            opts.rate_secs,
            opts.rate_consumers,
            opts.store.describe()
        );
        println!(
            "(cpu µs/deliv: busd + consumers as in the table above; the publisher, this benchmark, not counted)"
        );
        let ours = match guarded(|| {
            run_fanout(
                opts.rate_consumers,
                256,
                events,
                Mode::Rate(opts.rate),
                opts.inflight,
                opts.store,
            )
        }) {
            Ok(r) => {
                println!(
                    "  p50 {:.0} µs   p99 {:.0} µs   max {:.0} µs   cpu {} µs/deliv, busd part {}   ({} deliveries; busd peak {})",
                    r.p50_us,
                    r.p99_us,
                    r.max_us,
                    fmt_cpu(r.cpu_us_per_delivery, &r),
                    fmt_cpu(r.busd_cpu_us_per_delivery, &r),
                    events * opts.rate_consumers as u64,
                    kb(r.busd_hwm_kb)
                );
                if r.cpu_coarse() {
                    println!("{COARSE_NOTE}");
                }
                Some(r)
            }
            Err(e) => {
                println!("  FAILED (see below)");
                failures.push(format!("fixed-rate latency: {e}"));
                None
            }
        };
        if peers_ready && !INTERRUPTED.load(Ordering::Relaxed) {
            run_peer_latency(opts, ours.as_ref(), failures);
        }
    }

    if !opts.skip_memory && !INTERRUPTED.load(Ordering::Relaxed) {
        println!();
        println!(
            "Memory with a stalled consumer: {} × 256 B events, 1 fast + 1 stalled consumer (stdout never read), retention {} events, disk store, fsync",
            opts.memory_events, opts.memory_retention
        );
        match guarded(|| run_memory(opts.memory_events, opts.memory_retention, opts.inflight)) {
            Ok(r) => println!("{}", describe_memory(&r)),
            Err(e) => {
                println!("  FAILED (see below)");
                failures.push(format!("stalled-consumer memory: {e}"));
            }
        }
    }
}

const COARSE_NOTE: &str =
    "  ~ CPU from fewer than 20 clock ticks: coarse, each process counts only to ±1 tick \
     (more events make it finer)";

impl FanoutResult {
    fn cpu_coarse(&self) -> bool {
        self.cpu_ticks.is_some_and(|t| t < COARSE_CPU_TICKS)
    }
}

/// A CPU µs/delivery figure of `r`, "~"-marked when coarse.
fn fmt_cpu(v: Option<f64>, r: &FanoutResult) -> String {
    let s = fmt_opt(v, 2);
    if r.cpu_coarse() && v.is_some() {
        format!("~{s}")
    } else {
        s
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// `v` with `prec` decimals, "?" when unknown.
fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or("?".into(), |x| format!("{x:.prec$}"))
}

// ------------------------------------------------------------------ Redis pub/sub (--peers)

/// The (N, payload) fan-out scenarios run on Redis pub/sub too.
const PEER_SCENARIOS: [(usize, usize); 3] = [(4, 256), (16, 256), (4, 4096)];

/// The longest a peer script may take per fan-out run it makes.
const PEER_TIMEOUT_PER_RUN: Duration = Duration::from_secs(120);
/// The runs benchlib.py makes when not given `--runs`.
const PEER_DEFAULT_RUNS: u32 = 3;

/// Where the peers' C clients are: $PEERS_BIN, else DIR/bin (as benchlib.py).
fn peers_bin(dir: &Path) -> PathBuf {
    std::env::var_os("PEERS_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| dir.join("bin"), PathBuf::from)
}

fn find_on_path(exe: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(exe))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Why the Redis runs cannot happen here, if they cannot.
fn peers_missing(dir: &Path) -> Option<String> {
    let mut missing = Vec::new();
    for exe in ["python3", "redis-server"] {
        if find_on_path(exe).is_none() {
            missing.push(format!("`{exe}` is not on PATH"));
        }
    }
    for script in ["redis_fanout.py", "redis_latency.py"] {
        let p = dir.join(script);
        if !p.is_file() {
            missing.push(format!("{} not found (--peers-dir)", p.display()));
        }
    }
    let bin = peers_bin(dir);
    let client = bin.join("redis_client");
    if !client.is_file() {
        missing.push(format!(
            "{} not found (build it: make -C {} BIN={}; set PEERS_BIN to that dir)",
            client.display(),
            dir.display(),
            bin.display()
        ));
    }
    (!missing.is_empty()).then(|| missing.join("; "))
}

/// Runs `python3 DIR/<script> <args>` (stopped after `timeout`) and returns
/// its final JSON line, which has a "summary", and how long it took.
fn run_peer(
    opts: &Opts,
    script: &str,
    args: &[String],
    timeout: Duration,
) -> Res<(Value, Duration)> {
    let path = opts.peers_dir.join(script);
    let what = format!("python3 {} {}", path.display(), args.join(" "));
    let mut cmd = Command::new("python3");
    cmd.arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    unblock_watched_in_child(&mut cmd);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot spawn `{what}`: {e}"))?;
    let out = capture(child.stdout.take());
    let err = capture(child.stderr.take());
    let deadline = started + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {
                let why = if INTERRUPTED.load(Ordering::Relaxed) {
                    Some("interrupted by a signal".to_string())
                } else if Instant::now() >= deadline {
                    Some(format!("did not finish within {:?}", deadline - started))
                } else {
                    None
                };
                if let Some(why) = why {
                    // SIGTERM first: benchlib.py then stops the redis-server
                    // and clients it started.
                    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
                    let grace = Instant::now() + Duration::from_secs(10);
                    while matches!(child.try_wait(), Ok(None)) && Instant::now() < grace {
                        thread::sleep(POLL);
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("`{what}` {why}"));
                }
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("waiting for `{what}`: {e}")),
        }
    };
    let took = started.elapsed();
    let out =
        String::from_utf8_lossy(&out.recv_timeout(Duration::from_secs(3)).unwrap_or_default())
            .into_owned();
    let err =
        String::from_utf8_lossy(&err.recv_timeout(Duration::from_secs(3)).unwrap_or_default())
            .into_owned();
    let summary = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["summary"].is_object());
    match summary {
        Some(v) if status.success() => Ok((v, took)),
        _ => {
            let tail = |s: &str| {
                let lines: Vec<&str> = s.trim().lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n    ")
            };
            Err(format!(
                "`{what}` failed ({status}, no JSON summary line)\n  stdout:\n    {}\n  stderr:\n    {}",
                tail(&out),
                tail(&err)
            ))
        }
    }
}

/// "7.0.15" out of benchlib's "Redis server v=7.0.15 sha=…".
fn redis_version(v: &Value) -> Option<String> {
    let full = v["version"].as_str()?;
    Some(
        full.split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or(full)
            .to_string(),
    )
}

fn summary_median(v: &Value, key: &str) -> Option<f64> {
    v["summary"][key]["median"].as_f64()
}

/// Messages lost per run, as benchlib.py reports them (one entry per run).
fn summary_lost(v: &Value) -> Vec<u64> {
    v["summary"]["lost_per_run"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect())
        .unwrap_or_default()
}

/// Redis pub/sub for the rows of the fan-out table that are in
/// [`PEER_SCENARIOS`], then ours vs Redis.
fn run_peer_fanout(
    opts: &Opts,
    rows: &[(usize, usize, u64, Option<FanoutResult>)],
    failures: &mut Vec<String>,
) {
    let scenarios: Vec<_> = PEER_SCENARIOS
        .iter()
        .filter_map(|&(n, size)| rows.iter().find(|r| r.0 == n && r.1 == size))
        .collect();
    println!();
    if scenarios.is_empty() {
        println!(
            "Redis pub/sub fan-out: not run, the table has none of its scenarios (N=4 and N=16 at 256 B, N=4 at 4 KiB; see --consumers)"
        );
        return;
    }
    println!(
        "Redis pub/sub fan-out in the same run (private redis-server on a Unix socket, persists nothing; \
         hiredis C clients: 1 publisher pipelining PUBLISH, N subscriber processes counting in memory):"
    );
    let mut peer: Vec<Option<Value>> = Vec::new();
    let mut version = None;
    for &&(n, size, _, _) in &scenarios {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return;
        }
        let msgs = if size == 256 {
            opts.peers_msgs_small
        } else {
            opts.peers_msgs_large
        };
        let args: Vec<String> = [
            "--subs".into(),
            n.to_string(),
            "--msgs".into(),
            msgs.to_string(),
            "--size".into(),
            size.to_string(),
            "--runs".into(),
            opts.runs.to_string(),
        ]
        .into();
        let timeout = Duration::from_secs(60) + PEER_TIMEOUT_PER_RUN * opts.runs as u32;
        match run_peer(opts, "redis_fanout.py", &args, timeout) {
            Ok((v, took)) => {
                println!(
                    "  python3 {} {}   ({:.1} s)",
                    opts.peers_dir.join("redis_fanout.py").display(),
                    args.join(" "),
                    took.as_secs_f64()
                );
                version = version.or_else(|| redis_version(&v));
                peer.push(Some(v));
            }
            Err(e) => {
                println!(
                    "  python3 {} {}   FAILED (see below)",
                    opts.peers_dir.join("redis_fanout.py").display(),
                    args.join(" ")
                );
                failures.push(format!(
                    "Redis fan-out N={n} payload={}: {e}",
                    size_name(size)
                ));
                peer.push(None);
            }
        }
    }

    println!();
    println!(
        "Ours vs Redis pub/sub{}, flood fan-out; ours = the table above, on the {}",
        version.map_or(String::new(), |v| format!(" {v}")),
        opts.store.describe()
    );
    println!(
        "(ours: {} events per 256 B scenario, {} per 4 KiB; Redis: {} / {} messages; medians of {} run(s) each; \
         ratio = ours / Redis)",
        opts.events_small, opts.events_large, opts.peers_msgs_small, opts.peers_msgs_large, opts.runs
    );
    println!(
        "(cpu µs/deliv: ours = busd + consumers, the publisher not counted; ours+pub = that plus this benchmark's \
         publisher threads; Redis = redis-server + subscribers + its publisher process, as benchlib.py counts)"
    );
    println!();
    println!(
        "{:>12}  {:>13}  {:>13}  {:>10}  {:>17}  {:>12}  {:>18}",
        "scenario",
        "ours deliv/s",
        "Redis deliv/s",
        "ours/Redis",
        "ours cpu µs/deliv",
        "ours+pub cpu",
        "Redis cpu µs/deliv"
    );
    let mut lossy = Vec::new();
    let mut coarse_any = false;
    for (&&(n, size, _, ref ours), peer) in scenarios.iter().zip(&peer) {
        coarse_any |= ours.as_ref().is_some_and(|r| r.cpu_coarse());
        let ours_rate = ours.as_ref().map(|r| r.aggregate);
        let redis_rate = peer.as_ref().and_then(|v| summary_median(v, "total_rate"));
        let ratio = ours_rate.zip(redis_rate).map(|(a, b)| a / b);
        let lost = peer.as_ref().map(summary_lost).unwrap_or_default();
        let scenario = format!("N={n}, {}", size_name(size));
        if lost.iter().any(|&l| l > 0) {
            lossy.push(format!("{scenario}: lost per run {lost:?}"));
        }
        println!(
            "{:>12}  {:>13}  {:>13}  {:>10}  {:>17}  {:>12}  {:>18}",
            scenario,
            fmt_opt(ours_rate, 0),
            fmt_opt(redis_rate, 0),
            fmt_opt(ratio, 2),
            ours.as_ref()
                .map_or("?".into(), |r| fmt_cpu(r.cpu_us_per_delivery, r)),
            ours.as_ref()
                .map_or("?".into(), |r| fmt_cpu(r.cpu_with_pub_us_per_delivery, r)),
            fmt_opt(
                peer.as_ref()
                    .and_then(|v| summary_median(v, "cpu_us_per_delivery")),
                2
            ),
        );
    }
    if coarse_any {
        println!("{COARSE_NOTE}");
    }
    if !lossy.is_empty() {
        println!(
            "  Redis lost messages (a subscriber over client-output-buffer-limit pubsub is disconnected; its rate \
             counts only what arrived): {}",
            lossy.join("; ")
        );
    }
}

/// Redis pub/sub at the fixed rate of the latency run, then ours vs Redis.
fn run_peer_latency(opts: &Opts, ours: Option<&FanoutResult>, failures: &mut Vec<String>) {
    let args: Vec<String> = [
        "--subs".into(),
        opts.rate_consumers.to_string(),
        "--rate".into(),
        opts.rate.to_string(),
        "--duration".into(),
        opts.rate_secs.to_string(),
    ]
    .into();
    let cmd = format!(
        "python3 {} {}",
        opts.peers_dir.join("redis_latency.py").display(),
        args.join(" ")
    );
    let timeout =
        (Duration::from_secs(60) + Duration::from_secs_f64(opts.rate_secs)) * PEER_DEFAULT_RUNS;
    let v = match run_peer(opts, "redis_latency.py", &args, timeout) {
        Ok((v, took)) => {
            println!(
                "  Redis pub/sub at the same rate: {cmd}   ({:.1} s, median of {} run(s))",
                took.as_secs_f64(),
                summary_lost(&v).len()
            );
            v
        }
        Err(e) => {
            println!("  Redis pub/sub at the same rate: {cmd}   FAILED (see below)");
            failures.push(format!("Redis fixed-rate latency: {e}"));
            return;
        }
    };
    println!(
        "  {:>8}  {:>20}  {:>8}  {:>10}",
        "",
        format!("ours ({}, {})", opts.store.kind, opts.store.durability),
        format!(
            "Redis{}",
            redis_version(&v).map_or(String::new(), |s| format!(" {s}"))
        ),
        "ours/Redis"
    );
    for (name, ours_v, key) in [
        ("p50 µs", ours.map(|r| r.p50_us), "p50_us"),
        ("p99 µs", ours.map(|r| r.p99_us), "p99_us"),
    ] {
        let redis = summary_median(&v, key);
        println!(
            "  {:>8}  {:>20}  {:>8}  {:>10}",
            name,
            fmt_opt(ours_v, 0),
            fmt_opt(redis, 0),
            fmt_opt(ours_v.zip(redis).map(|(a, b)| a / b), 2)
        );
    }
    let lost = summary_lost(&v);
    if lost.iter().any(|&l| l > 0) {
        println!("  Redis lost messages per run: {lost:?}");
    }
    println!(
        "  (ours: publisher send → line read from a consumer's stdout, one run; Redis: publisher send → subscriber \
         receive)"
    );
}

/// Durable-publish throughput (durability × payload × publishers) and the
/// publish→ack latency at a fixed rate.
fn run_durable_sections(opts: &Opts, failures: &mut Vec<String>) {
    println!();
    println!(
        "Durable publish: P publisher connections flood `{EVENT_TYPE}` (pipelined, ≤{} unacked each), no consumers, disk store",
        opts.inflight
    );
    println!(
        "(publishes/s = events / (last PublishAck − first send); ack µs = frame written → its PublishAck read, \
         under saturation; median of {} run(s) by publishes/s, each on a fresh bus)",
        opts.durable_runs
    );
    println!();
    println!(
        "{:>10}  {:>7}  {:>10}  {:>7}  {:>12}  {:>8}  {:>10}  {:>10}  {:>10}",
        "durability",
        "payload",
        "publishers",
        "events",
        "publishes/s",
        "MiB/s",
        "ack p50 µs",
        "ack p99 µs",
        "ack max µs"
    );
    for store in durable_stores(opts) {
        for &size in &[256usize, 4096] {
            for &p in &opts.durable_publishers {
                if INTERRUPTED.load(Ordering::Relaxed) {
                    return;
                }
                let events = if size == 256 {
                    opts.durable_events_small
                } else {
                    opts.durable_events_large
                };
                let result = median_of(
                    opts.durable_runs,
                    |r: &DurableResult| r.rate,
                    || run_durable(store, size, p, events, Mode::Flood, opts.inflight),
                );
                match result {
                    Ok(r) => println!(
                        "{:>10}  {:>7}  {:>10}  {:>7}  {:>12.0}  {:>8.1}  {:>10.0}  {:>10.0}  {:>10.0}",
                        store.durability,
                        size_name(size),
                        p,
                        events,
                        r.rate,
                        r.rate * size as f64 / (1024.0 * 1024.0),
                        r.ack_p50_us,
                        r.ack_p99_us,
                        r.ack_max_us
                    ),
                    Err(e) => {
                        println!(
                            "{:>10}  {:>7}  {:>10}  {:>7}  FAILED (see below)",
                            store.durability,
                            size_name(size),
                            p,
                            events
                        );
                        failures.push(format!(
                            "durable publish durability={} payload={} publishers={p}: {e}",
                            store.durability,
                            size_name(size)
                        ));
                    }
                }
            }
        }
    }

    let events = ((opts.durable_rate as f64 * opts.rate_secs).round() as u64).max(1);
    println!();
    println!(
        "Publish→ack latency at a fixed rate: 1 publisher, {} publishes/s for {:.1} s, 256 B, no consumers, disk store",
        opts.durable_rate, opts.rate_secs
    );
    for store in durable_stores(opts) {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return;
        }
        match guarded(|| {
            run_durable(
                store,
                256,
                1,
                events,
                Mode::Rate(opts.durable_rate),
                opts.inflight,
            )
        }) {
            Ok(r) => println!(
                "  {:<5}  p50 {:.0} µs   p99 {:.0} µs   max {:.0} µs   ({} acks)",
                store.durability, r.ack_p50_us, r.ack_p99_us, r.ack_max_us, r.acks
            ),
            Err(e) => {
                println!("  {:<5}  FAILED (see below)", store.durability);
                failures.push(format!(
                    "publish→ack latency durability={}: {e}",
                    store.durability
                ));
            }
        }
    }
}

/// The stores of the durable-publish section: the disk store fsynced and
/// not, and the cluster store with `--store postgres`.
fn durable_stores(opts: &Opts) -> Vec<StoreSel> {
    let mut stores = vec![StoreSel::DISK_FSYNC, StoreSel::DISK_NONE];
    if opts.store == StoreSel::POSTGRES {
        stores.push(StoreSel::POSTGRES);
    }
    stores
}

/// Two hosts of one cluster: the owner's busd is killed with SIGKILL; the
/// time until the other host's status says it owns the cluster.
fn measure_failover() -> Res<Duration> {
    let mut env = StoreSel::POSTGRES.env();
    env.retain(|(k, _)| *k != "DWS_CLUSTER_HOST");
    let mut a_env = env.clone();
    a_env.push(("DWS_CLUSTER_HOST", "host-a"));
    let a = BusEnv::new(&a_env);
    let cluster = std::fs::read_to_string(a.env.cfg_dir().join("config.toml"))
        .map_err(|e| format!("cannot read host-a's config: {e}"))?;
    let mut b_env = env;
    b_env.push(("DWS_CLUSTER_HOST", "host-b"));
    let b = BusEnv::new(&b_env);
    std::fs::write(b.env.cfg_dir().join("config.toml"), cluster)
        .map_err(|e| format!("cannot write host-b's config: {e}"))?;
    start_bus(&a, StoreSel::POSTGRES)?;
    let role = |env: &BusEnv| -> Res<String> {
        Ok(env.status()?["cluster"]["role"]
            .as_str()
            .unwrap_or("")
            .to_owned())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while role(&a)? != "owner" {
        if Instant::now() >= deadline {
            return Err(format!("host-a never became the owner\n{}", a.log_tail()));
        }
        thread::sleep(POLL);
    }
    start_bus(&b, StoreSel::POSTGRES)?;
    let pids = a.env.busd_pids();
    let killed = Instant::now();
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    while role(&b)? != "owner" {
        if killed.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "host-b did not take over within 30 s\n{}",
                b.log_tail()
            ));
        }
        thread::sleep(POLL);
    }
    Ok(killed.elapsed())
}

/// The flood fan-out on the memory store and on the disk store (fsync).
fn run_store_compare(opts: &Opts, failures: &mut Vec<String>) {
    let n = opts.compare_consumers;
    let events = opts.events_small;
    println!();
    println!(
        "Fan-out, disk store vs memory store: 1 publisher (≤{} in flight) → {n} consumers, {events} × 256 B \
         (median of {} run(s) by deliveries/s)",
        opts.inflight, opts.runs
    );
    println!();
    println!(
        "{:>14}  {:>13}  {:>15}  {:>9}  {:>9}",
        "store", "ev/s/cons avg", "deliveries/s", "p50 µs", "p99 µs"
    );
    let mut rates = Vec::new();
    let mut stores = vec![StoreSel::MEMORY, StoreSel::DISK_FSYNC];
    if opts.store == StoreSel::POSTGRES {
        stores.push(StoreSel::POSTGRES);
    }
    for store in stores {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return;
        }
        let name = match store.kind {
            "memory" => "memory".to_string(),
            k => format!("{k}, {}", store.durability),
        };
        let result = median_of(
            opts.runs,
            |r: &FanoutResult| r.aggregate,
            || run_fanout(n, 256, events, Mode::Flood, opts.inflight, store),
        );
        match result {
            Ok(r) => {
                println!(
                    "{:>14}  {:>13.0}  {:>15.0}  {:>9.0}  {:>9.0}",
                    name, r.per_consumer_avg, r.aggregate, r.p50_us, r.p99_us
                );
                rates.push(r.aggregate);
            }
            Err(e) => {
                println!("{name:>14}  FAILED (see below)");
                failures.push(format!("fan-out store comparison, {name}: {e}"));
            }
        }
    }
    if let [memory, disk, ..] = rates[..] {
        println!("  disk/memory deliveries/s: {:.2}", disk / memory);
    }
    if let [_, disk, postgres] = rates[..] {
        println!("  postgres/disk deliveries/s: {:.2}", postgres / disk);
    }
    if opts.store == StoreSel::POSTGRES && !INTERRUPTED.load(Ordering::Relaxed) {
        match guarded(measure_failover) {
            Ok(t) => println!(
                "\nFailover (postgres): the owner's busd killed with -9 → the other host owns the cluster: {:.0} ms",
                t.as_secs_f64() * 1000.0
            ),
            Err(e) => failures.push(format!("failover: {e}")),
        }
    }
}

/// The flood fan-out without and with `--where EXPR` on every consumer:
/// what the bus spends per delivery on one evaluation.
fn run_where_compare(opts: &Opts, expr: &str, failures: &mut Vec<String>) {
    let n = opts.compare_consumers;
    let events = opts.events_small;
    println!();
    println!(
        "Fan-out without and with --where {expr:?} on every consumer: 1 publisher (≤{} in flight) → \
         {n} consumers, {events} × 256 B, {} (median of {} run(s) by deliveries/s)",
        opts.inflight,
        opts.store.describe(),
        opts.runs
    );
    println!();
    println!(
        "{:>8}  {:>13}  {:>15}  {:>9}  {:>9}  {:>12}  {:>9}",
        "where", "ev/s/cons avg", "deliveries/s", "p50 µs", "p99 µs", "cpu µs/deliv", "busd part"
    );
    let mut busd = Vec::new();
    for (name, extra) in [("none", vec![]), ("--where", vec!["--where", expr])] {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return;
        }
        let result = median_of(
            opts.runs,
            |r: &FanoutResult| r.aggregate,
            || {
                run_fanout_with(
                    n,
                    256,
                    events,
                    Mode::Flood,
                    opts.inflight,
                    opts.store,
                    &extra,
                )
            },
        );
        match result {
            Ok(r) => {
                let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
                println!(
                    "{:>8}  {:>13.0}  {:>15.0}  {:>9.0}  {:>9.0}  {:>12}  {:>9}",
                    name,
                    r.per_consumer_avg,
                    r.aggregate,
                    r.p50_us,
                    r.p99_us,
                    f(r.cpu_us_per_delivery),
                    f(r.busd_cpu_us_per_delivery)
                );
                busd.push(r.busd_cpu_us_per_delivery);
            }
            Err(e) => {
                println!("{name:>8}  FAILED (see below)");
                failures.push(format!("fan-out with --where, {name}: {e}"));
            }
        }
    }
    if let [Some(without), Some(with)] = busd[..] {
        println!(
            "  --where costs busd {:.2} µs per delivery (one evaluation per event and consumer)",
            with - without
        );
    }
}
