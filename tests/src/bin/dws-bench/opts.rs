//! The command line of `dws-bench` (clap), turned into [`Opts`], and the
//! store a bus of a scenario runs on ([`StoreSel`]).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde_json::Value;

use crate::Res;

/// The URL of the private PostgreSQL server a `--store postgres` run starts.
pub static PG_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The command line. Flag names and defaults are those `scripts/bench.sh`
/// and docs/benchmark.md use.
#[derive(Parser, Debug)]
#[command(
    name = "dws-bench",
    about = "dws-bench: fan-out and durable-publish benchmark of the dws event bus \
             (real busd + real consumers)"
)]
struct Cli {
    /// Directory holding dws and busd (default: next to dws-bench).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Consumer counts, comma separated (1-256 each).
    #[arg(long, value_name = "LIST", default_value = "1,4,16", value_parser = parse_list)]
    consumers: CountList,
    /// Events per 256 B scenario (as many as the peer runs).
    #[arg(long = "events-256", value_name = "N", default_value_t = 200_000, value_parser = at_least_1)]
    events_small: u64,
    /// Events per 4 KiB scenario (as many as the peer runs).
    #[arg(long = "events-4k", value_name = "N", default_value_t = 20_000, value_parser = at_least_1)]
    events_large: u64,
    /// Most unacknowledged publishes.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = at_least_1)]
    inflight: u64,
    /// Runs per fan-out scenario; the median is shown.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = at_least_1)]
    runs: u64,
    /// Fixed-rate latency run: events/s.
    #[arg(long, value_name = "R", default_value_t = 2000, value_parser = at_least_1)]
    rate: u64,
    /// Fixed-rate latency run: duration in s (0-600).
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = parse_secs)]
    rate_secs: f64,
    /// Fixed-rate latency run: consumers.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = at_least_1)]
    rate_consumers: u64,
    /// Stalled-consumer run: events.
    #[arg(long, value_name = "N", default_value_t = 200_000, value_parser = at_least_1)]
    memory_events: u64,
    /// Stalled-consumer run: DWS_EVENT_BUS_RETENTION_EVENTS.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    memory_retention: u64,
    /// Skip the fixed-rate latency run.
    #[arg(long)]
    skip_latency: bool,
    /// Skip the stalled-consumer memory run.
    #[arg(long)]
    skip_memory: bool,
    /// Run only the fixed-rate runs: fan-out latency and publish→ack
    /// latency (on the fsync disk store each with raw fdatasync at the same
    /// rate next to it).
    #[arg(long, conflicts_with = "skip_latency")]
    only_latency: bool,
    /// Store of the fan-out table's buses.
    #[arg(long, value_enum, default_value_t = StoreKind::Disk)]
    store: StoreKind,
    /// Durability of the fan-out table's disk store [default: fsync].
    #[arg(long, value_enum)]
    durability: Option<Durability>,

    /// Events per 256 B durable-publish scenario.
    #[arg(long = "durable-events-256", value_name = "N", default_value_t = 100_000,
          value_parser = at_least_1, help_heading = "Durable publish (disk store, no consumers; fsync and none)")]
    durable_events_small: u64,
    /// Events per 4 KiB durable-publish scenario.
    #[arg(long = "durable-events-4k", value_name = "N", default_value_t = 20_000,
          value_parser = at_least_1, help_heading = "Durable publish (disk store, no consumers; fsync and none)")]
    durable_events_large: u64,
    /// Publisher connections, comma separated.
    #[arg(long, value_name = "LIST", default_value = "1,8", value_parser = parse_list,
          help_heading = "Durable publish (disk store, no consumers; fsync and none)")]
    durable_publishers: CountList,
    /// Runs per durable-publish scenario; the median is shown.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = at_least_1,
          help_heading = "Durable publish (disk store, no consumers; fsync and none)")]
    durable_runs: u64,
    /// Publish->ack latency run: publishes/s, for --rate-secs.
    #[arg(long, value_name = "R", default_value_t = 1000, value_parser = at_least_1,
          help_heading = "Durable publish (disk store, no consumers; fsync and none)")]
    durable_rate: u64,
    /// Skip the durable-publish throughput and ack-latency runs.
    #[arg(
        long,
        help_heading = "Durable publish (disk store, no consumers; fsync and none)"
    )]
    skip_durable: bool,
    /// Run only those (combines with --only-store-compare).
    #[arg(
        long,
        help_heading = "Durable publish (disk store, no consumers; fsync and none)"
    )]
    only_durable: bool,
    /// Lines of the `dws event publish --lines` run (256 B each, fsync).
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = at_least_1,
          help_heading = "Durable publish (disk store, no consumers; fsync and none)")]
    lines_events: u64,
    /// Run only the `dws event publish --lines` row.
    #[arg(long, conflicts_with_all = ["only_durable", "only_store_compare", "only_where", "only_latency", "skip_durable"],
          help_heading = "Durable publish (disk store, no consumers; fsync and none)")]
    only_lines: bool,

    /// Jobs of each work-queue flood (256 B).
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = at_least_1,
          help_heading = "The work queue (with --peers, or --only-queue; docs/benchmark.md)")]
    queue_jobs: u64,
    /// Workers of the work queue (`dws event consume --subscribe-id work --ack
    /// explicit` each; the peers' as many).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = at_least_1,
          help_heading = "The work queue (with --peers, or --only-queue; docs/benchmark.md)")]
    queue_workers: u64,
    /// Jobs/s of the work queue's latency run, for --rate-secs.
    #[arg(long, value_name = "R", default_value_t = 1000, value_parser = at_least_1,
          help_heading = "The work queue (with --peers, or --only-queue; docs/benchmark.md)")]
    queue_rate: u64,
    /// Run only the work-queue row: the bus on both stores and, with
    /// --peers, Redis Streams and JetStream as work queues.
    #[arg(long, conflicts_with_all = ["only_durable", "only_store_compare", "only_where", "only_latency", "only_lines", "skip_queue"],
          help_heading = "The work queue (with --peers, or --only-queue; docs/benchmark.md)")]
    only_queue: bool,
    /// Leave the work-queue row out of a --peers run.
    #[arg(
        long,
        help_heading = "The work queue (with --peers, or --only-queue; docs/benchmark.md)"
    )]
    skip_queue: bool,

    /// Consumers of the disk vs memory store comparison.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = at_least_1,
          help_heading = "Fan-out on the disk store vs the memory store (256 B, flood, --runs each)")]
    compare_consumers: u64,
    /// Skip this comparison.
    #[arg(
        long,
        help_heading = "Fan-out on the disk store vs the memory store (256 B, flood, --runs each)"
    )]
    skip_store_compare: bool,
    /// Run only this comparison (combines with --only-durable).
    #[arg(
        long,
        help_heading = "Fan-out on the disk store vs the memory store (256 B, flood, --runs each)"
    )]
    only_store_compare: bool,

    /// Also run the peers (Redis pub/sub, NATS core, Redis Streams with
    /// appendfsync always, JetStream file store) through `dws-peers` on the
    /// same scenarios, and print the peer comparison table with every goal's ratio.
    /// Needs redis-server and nats-server on PATH
    /// (apt-get install redis-server nats-server).
    #[arg(long, help_heading = "The peers in the same run (docs/benchmark.md)")]
    peers: bool,
    /// The peer benchmark binary (default: dws-peers next to dws-bench).
    #[arg(
        long,
        value_name = "PATH",
        help_heading = "The peers in the same run (docs/benchmark.md)"
    )]
    peers_bin: Option<PathBuf>,
    /// Messages per peer 256 B fan-out run.
    #[arg(long = "peers-msgs-256", value_name = "M", default_value_t = 200_000,
          value_parser = at_least_1, help_heading = "The peers in the same run (docs/benchmark.md)")]
    peers_msgs_small: u64,
    /// Messages per peer 4 KiB fan-out run.
    #[arg(long = "peers-msgs-4k", value_name = "M", default_value_t = 20_000,
          value_parser = at_least_1, help_heading = "The peers in the same run (docs/benchmark.md)")]
    peers_msgs_large: u64,

    /// Run the 256 B flood without and with `--where EXPR` on every consumer
    /// (the payload is not JSON: `data` is a string; e.g. '(.data | length) > 0').
    #[arg(
        long = "where",
        value_name = "EXPR",
        help_heading = "The cost of --where (256 B flood, --compare-consumers consumers, --runs each)"
    )]
    where_expr: Option<String>,
    /// Run only this comparison (needs --where).
    #[arg(
        long,
        requires = "where_expr",
        help_heading = "The cost of --where (256 B flood, --compare-consumers consumers, --runs each)"
    )]
    only_where: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    Disk,
    Memory,
    Postgres,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Durability {
    Fsync,
    None,
}

/// A comma-separated list of counts (1-256).
#[derive(Clone, Debug, PartialEq, Eq)]
struct CountList(Vec<usize>);

fn parse_list(v: &str) -> Result<CountList, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=256).contains(n))
        })
        .collect::<Option<Vec<_>>>()
        .map(CountList)
        .ok_or(format!("bad list {v:?} (numbers 1-256, comma separated)"))
}

fn at_least_1(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{v:?} is not a whole number of at least 1")),
    }
}

fn parse_secs(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 600.0 => Ok(s),
        _ => Err(format!("{v:?} is not a duration in s between 0 and 600")),
    }
}

/// What the scenarios read: the command line, checked.
pub struct Opts {
    pub bin_dir: Option<PathBuf>,
    pub consumers: Vec<usize>,
    pub events_small: u64,
    pub events_large: u64,
    pub inflight: u64,
    pub rate: u64,
    pub rate_secs: f64,
    pub rate_consumers: usize,
    pub memory_events: u64,
    pub memory_retention: u64,
    pub runs: usize,
    pub skip_latency: bool,
    pub skip_memory: bool,
    /// `--only-latency`: the fixed-rate runs alone (no fan-out table, no
    /// durable floods).
    pub only_latency: bool,
    /// The store of the main fan-out table.
    pub store: StoreSel,
    pub skip_durable: bool,
    pub skip_store_compare: bool,
    /// Set by `--only-durable` / `--only-store-compare` / `--only-where`:
    /// skip the fan-out table, the fixed-rate latency and the memory runs.
    pub only: bool,
    pub durable_events_small: u64,
    pub durable_events_large: u64,
    pub durable_publishers: Vec<usize>,
    pub durable_runs: usize,
    pub durable_rate: u64,
    /// `--lines-events`: lines of the `publish --lines` run.
    pub lines_events: u64,
    /// `--only-lines`: that run alone.
    pub only_lines: bool,
    pub compare_consumers: usize,
    /// The work queue: jobs per flood, workers, jobs/s of the latency run.
    pub queue_jobs: u64,
    pub queue_workers: usize,
    pub queue_rate: u64,
    /// `--only-queue`: the work-queue row alone (and its peers with --peers).
    pub only_queue: bool,
    /// `--skip-queue`: no work-queue row in a --peers run.
    pub skip_queue: bool,
    /// `--peers`: the peers through `dws-peers`, and the peer comparison table.
    pub peers: bool,
    pub peers_bin: Option<PathBuf>,
    pub peers_msgs_small: u64,
    pub peers_msgs_large: u64,
    /// `--where EXPR`: the fan-out with this jq expression on every
    /// consumer against the same run without it.
    pub where_expr: Option<String>,
}

impl Opts {
    /// Parses the process's arguments; exits 2 (clap's usage error) on a bad
    /// one, 0 after `--help`.
    pub fn parse() -> Res<Opts> {
        Opts::from_cli(Cli::parse())
    }

    fn from_cli(c: Cli) -> Res<Opts> {
        let kind = match c.store {
            StoreKind::Disk => "disk",
            StoreKind::Memory => "memory",
            StoreKind::Postgres => "postgres",
        };
        let durability = match (kind, c.durability) {
            ("memory" | "postgres", Some(_)) => {
                return Err("--durability applies to --store disk only".into())
            }
            ("memory", None) => "none",
            ("postgres", None) => "postgres",
            (_, Some(Durability::None)) => "none",
            (_, _) => "fsync",
        };
        let mut o = Opts {
            bin_dir: c.bin_dir,
            consumers: c.consumers.0,
            events_small: c.events_small,
            events_large: c.events_large,
            inflight: c.inflight,
            rate: c.rate,
            rate_secs: c.rate_secs,
            rate_consumers: c.rate_consumers as usize,
            memory_events: c.memory_events,
            memory_retention: c.memory_retention,
            runs: c.runs as usize,
            skip_latency: c.skip_latency,
            skip_memory: c.skip_memory || c.only_latency,
            only_latency: c.only_latency,
            store: StoreSel { kind, durability },
            skip_durable: c.skip_durable,
            skip_store_compare: c.skip_store_compare || c.only_latency,
            only: false,
            durable_events_small: c.durable_events_small,
            durable_events_large: c.durable_events_large,
            durable_publishers: c.durable_publishers.0,
            durable_runs: c.durable_runs as usize,
            durable_rate: c.durable_rate,
            lines_events: c.lines_events,
            only_lines: c.only_lines,
            compare_consumers: c.compare_consumers as usize,
            queue_jobs: c.queue_jobs,
            queue_workers: c.queue_workers as usize,
            queue_rate: c.queue_rate,
            only_queue: c.only_queue,
            skip_queue: c.skip_queue,
            peers: c.peers,
            peers_bin: c.peers_bin,
            peers_msgs_small: c.peers_msgs_small,
            peers_msgs_large: c.peers_msgs_large,
            where_expr: c.where_expr,
        };
        if c.only_durable || c.only_store_compare || c.only_where {
            if (c.only_durable && o.skip_durable) || (c.only_store_compare && o.skip_store_compare)
            {
                return Err(
                    "--only-X and --skip-X of the same section contradict each other".into(),
                );
            }
            o.only = true;
            o.skip_durable = !c.only_durable;
            o.skip_store_compare = !c.only_store_compare;
        }
        if c.only_lines {
            o.only = true;
            o.skip_store_compare = true;
        }
        if c.only_queue {
            o.only = true;
            o.skip_durable = true;
            o.skip_store_compare = true;
        }
        Ok(o)
    }
}

/// Which store a bus runs on (env `DWS_EVENT_BUS_STORE` and
/// `DWS_EVENT_BUS_DURABILITY`, always set explicitly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreSel {
    /// "disk", "memory" or "postgres".
    pub kind: &'static str,
    /// "fsync" or "none" (the memory store reports "none", postgres "postgres").
    pub durability: &'static str,
}

impl StoreSel {
    pub const DISK_FSYNC: StoreSel = StoreSel {
        kind: "disk",
        durability: "fsync",
    };
    pub const DISK_NONE: StoreSel = StoreSel {
        kind: "disk",
        durability: "none",
    };
    pub const MEMORY: StoreSel = StoreSel {
        kind: "memory",
        durability: "none",
    };
    /// The cluster store on the private server [`PG_URL`] points at; every
    /// bus gets a cluster of its own (a fresh log), see `BusEnv::new`.
    pub const POSTGRES: StoreSel = StoreSel {
        kind: "postgres",
        durability: "postgres",
    };

    pub fn env(&self) -> Vec<(&'static str, &'static str)> {
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

    pub fn describe(&self) -> String {
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
    pub fn check(&self, status: &Value) -> Res<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Res<Opts> {
        let mut argv = vec!["dws-bench"];
        argv.extend_from_slice(args);
        Opts::from_cli(Cli::try_parse_from(argv).map_err(|e| e.to_string())?)
    }

    #[test]
    fn defaults_are_those_the_docs_name() {
        let o = opts(&[]).expect("defaults");
        assert_eq!(o.consumers, vec![1, 4, 16]);
        assert_eq!((o.events_small, o.events_large), (200_000, 20_000));
        assert_eq!((o.inflight, o.runs, o.rate), (1024, 5, 2000));
        assert_eq!((o.rate_secs, o.rate_consumers), (3.0, 4));
        assert_eq!((o.memory_events, o.memory_retention), (200_000, 20_000));
        assert_eq!(o.store, StoreSel::DISK_FSYNC);
        assert_eq!(o.durable_publishers, vec![1, 8]);
        assert_eq!((o.durable_runs, o.durable_rate), (3, 1000));
        assert_eq!((o.peers_msgs_small, o.peers_msgs_large), (200_000, 20_000));
        assert!(!o.only && !o.peers && o.where_expr.is_none());
        assert_eq!(
            (o.queue_jobs, o.queue_workers, o.queue_rate),
            (20_000, 4, 1000)
        );
        assert!(!o.only_queue && !o.skip_queue);
    }

    #[test]
    fn only_queue_runs_the_work_queue_alone() {
        let o = opts(&["--only-queue", "--peers", "--queue-jobs", "500"]).expect("parses");
        assert!(o.only_queue && o.only && o.skip_durable && o.skip_store_compare);
        assert!(o.peers && o.queue_jobs == 500);
        for bad in [
            &["--only-queue", "--only-lines"][..],
            &["--only-queue", "--skip-queue"],
            &["--only-queue", "--only-durable"],
            &["--queue-workers", "0"],
        ] {
            assert!(opts(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn flags_of_scripts_and_docs_parse() {
        let o = opts(&[
            "--peers",
            "--runs",
            "3",
            "--store",
            "memory",
            "--skip-durable",
            "--rate-secs",
            "5",
            "--consumers",
            "4,16",
            "--events-256",
            "1000",
            "--events-4k",
            "100",
        ])
        .expect("parses");
        assert!(o.peers && o.skip_durable);
        assert_eq!((o.runs, o.rate_secs), (3, 5.0));
        assert_eq!(o.store, StoreSel::MEMORY);
        assert_eq!(o.consumers, vec![4, 16]);
        let o = opts(&["--only-durable", "--only-store-compare"]).expect("parses");
        assert!(o.only && !o.skip_durable && !o.skip_store_compare);
        let o = opts(&["--durability", "none"]).expect("parses");
        assert_eq!(o.store, StoreSel::DISK_NONE);
        let o = opts(&["--store", "postgres"]).expect("parses");
        assert_eq!(o.store, StoreSel::POSTGRES);
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["--consumers", "0"][..],
            &["--consumers", "4,x"],
            &["--runs", "0"],
            &["--rate-secs", "0"],
            &["--rate-secs", "601"],
            &["--store", "tape"],
            &["--store", "memory", "--durability", "fsync"],
            &["--only-where"],
            &["--only-durable", "--skip-durable"],
            &["--peers-dir", "x"],
        ] {
            assert!(opts(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
