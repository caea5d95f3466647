//! dws-peers: the peer brokers a user would pick instead of the bus, measured
//! the same way in the same sitting (Redis pub/sub, NATS core, Redis Streams
//! with the AOF fsync'd always, NATS JetStream with file storage, and a raw
//! fdatasync), and the durable peers as work queues ([`queue`]). Each
//! workload starts a private broker in a temp dir, one publisher and N
//! subscriber processes (this binary again, hidden `role` subcommand),
//! prints a line per run and, last, one JSON summary line `{"system",
//! "version", "summary": {KEY: {median, min, max}, "lost_per_run"}}` that
//! dws-bench reads.

/// `println!` that does not panic when stdout is gone (piped into `head`).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// `eprintln!` that does not panic when stderr is gone.
macro_rules! warn {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod nats_roles;
mod procs;
mod queue;
mod redis_roles;
mod resp;
mod role;
mod server;
mod stats;
mod workloads;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "dws-peers",
    about = "Peer broker benchmarks (Redis, NATS, Redis Streams, JetStream, fdatasync)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Redis pub/sub: one publisher (PUBLISH pipelined 64 at a time) → N subscribers.
    RedisFanout(Opts),
    /// Redis pub/sub at --rate for --duration: p50/p99/max publish → subscriber.
    RedisLatency(Opts),
    /// NATS core: one publisher → N subscribers (loopback TCP).
    NatsFanout(Opts),
    /// Redis Streams (AOF, appendfsync always): one publisher → N consumer groups.
    RedisStreamsFanout(Opts),
    /// Redis Streams durable publishes: --pubs publishers pipelining XADD; with --rate, one XADD at a time.
    RedisStreamsPublish(Opts),
    /// JetStream (file storage): one publisher → N durable pull consumers.
    JetstreamFanout(Opts),
    /// JetStream publishes: --pubs async publishers; with --rate, one publish at a time.
    JetstreamPublish(Opts),
    /// Raw fdatasync of --size byte appends to a file in --dir at --rate.
    FdatasyncLatency(Opts),
    /// Redis Streams work queue: one producer, --subs workers in one consumer
    /// group (XREADGROUP COUNT 64, one XACK per batch); with --rate, one XADD
    /// at a time at that rate for --duration (latency).
    RedisStreamsQueue(Opts),
    /// JetStream work queue: one producer, --subs workers fetching from one
    /// durable pull consumer, one explicit ack per job; with --rate, one
    /// publish at a time at that rate for --duration (latency).
    JetstreamQueue(Opts),
    /// One client process of a run (used by dws-peers itself).
    #[command(hide = true)]
    Role(role::RoleArgs),
}

/// The flags every workload takes (each uses those that apply).
#[derive(Args, Clone, Debug, PartialEq)]
pub struct Opts {
    /// Subscriber processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub subs: u32,
    /// Messages per run (split over --pubs publishers).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub msgs: u64,
    /// Payload bytes (at least 16: sequence number and send time).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=1 << 26))]
    pub size: u64,
    /// Runs; the summary gives median, min and max.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Messages per second (latency workloads; default 2000, fdatasync 1000;
    /// the publish workloads switch to fixed-rate mode with it).
    #[arg(long, value_parser = positive)]
    pub rate: Option<f64>,
    /// Seconds of a fixed-rate run.
    #[arg(long, default_value_t = 10.0, value_parser = positive)]
    pub duration: f64,
    /// Publisher connections (publish workloads).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub pubs: u32,
    /// Parent dir of the broker's temp dir (put it on the filesystem the bus writes to).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Work queues as slow agents: each job takes this many ms, workers
    /// fetch one at a time, and the first worker hangs with a job once
    /// about a third are done (it comes again to another after 2 s:
    /// XAUTOCLAIM, AckWait). 0: a plain work queue.
    #[arg(long, default_value_t = 0)]
    pub work_ms: u64,
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// Why dws-peers stopped.
#[derive(Debug)]
pub enum PeersError {
    /// A server binary is not on PATH (exit 2).
    MissingServer(&'static str),
    /// A system call or file failed.
    Io(String, std::io::Error),
    /// A client library reported an error.
    Client(String),
    /// The run went wrong otherwise.
    Run(String),
}

impl PeersError {
    pub fn io(what: &str, e: std::io::Error) -> PeersError {
        PeersError::Io(what.to_string(), e)
    }

    fn exit_code(&self) -> u8 {
        match self {
            PeersError::MissingServer(_) => 2,
            _ => 1,
        }
    }
}

impl std::fmt::Display for PeersError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeersError::MissingServer(p) => write!(f, "{p} not found (apt-get install {p})"),
            PeersError::Io(what, e) => write!(f, "{what}: {e}"),
            PeersError::Client(m) | PeersError::Run(m) => f.write_str(m),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.cmd {
        Cmd::Role(a) => role::run(a),
        Cmd::RedisFanout(o) => workloads::fanout(workloads::Sys::Redis, o),
        Cmd::NatsFanout(o) => workloads::fanout(workloads::Sys::Nats, o),
        Cmd::RedisStreamsFanout(o) => workloads::fanout(workloads::Sys::RedisStreams, o),
        Cmd::JetstreamFanout(o) => workloads::fanout(workloads::Sys::JetStream, o),
        Cmd::RedisLatency(o) => workloads::redis_latency(o),
        Cmd::RedisStreamsPublish(o) => workloads::publish(workloads::Sys::RedisStreams, o),
        Cmd::JetstreamPublish(o) => workloads::publish(workloads::Sys::JetStream, o),
        Cmd::FdatasyncLatency(o) => workloads::fdatasync(o),
        Cmd::RedisStreamsQueue(o) => queue::queue(workloads::Sys::RedisStreams, o),
        Cmd::JetstreamQueue(o) => queue::queue(workloads::Sys::JetStream, o),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            warn!("dws-peers: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("dws-peers").chain(args.iter().copied()))
    }

    #[test]
    fn the_contract_flags_parse_with_their_defaults() {
        let Ok(Cli {
            cmd: Cmd::RedisFanout(o),
        }) = parse(&["redis-fanout"])
        else {
            panic!("redis-fanout")
        };
        assert_eq!(
            (o.subs, o.msgs, o.size, o.runs, o.pubs),
            (4, 200_000, 256, 3, 1)
        );
        assert_eq!((o.rate, o.duration, o.dir), (None, 10.0, None));
        let args = [
            "jetstream-publish",
            "--subs",
            "16",
            "--msgs",
            "5000",
            "--size",
            "4096",
            "--runs",
            "1",
            "--rate",
            "1000",
            "--duration",
            "2.5",
            "--pubs",
            "8",
            "--dir",
            "/var/tmp",
        ];
        let Ok(Cli {
            cmd: Cmd::JetstreamPublish(o),
        }) = parse(&args)
        else {
            panic!("jetstream-publish")
        };
        assert_eq!(
            (o.subs, o.msgs, o.size, o.runs, o.pubs),
            (16, 5000, 4096, 1, 8)
        );
        assert_eq!((o.rate, o.duration), (Some(1000.0), 2.5));
        assert_eq!(o.dir, Some(PathBuf::from("/var/tmp")));
        for w in [
            "redis-latency",
            "nats-fanout",
            "redis-streams-fanout",
            "redis-streams-publish",
            "jetstream-fanout",
            "fdatasync-latency",
            "redis-streams-queue",
            "jetstream-queue",
        ] {
            assert!(parse(&[w]).is_ok(), "{w}");
        }
    }

    #[test]
    fn bad_values_are_refused() {
        for args in [
            &["redis-fanout", "--size", "8"][..],
            &["redis-fanout", "--subs", "0"],
            &["redis-latency", "--rate", "-1"],
            &["redis-latency", "--rate", "NaN"],
            &["nope"],
            &["redis-fanout", "--bogus"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn a_missing_server_says_how_to_install_it_and_exits_2() {
        let e = PeersError::MissingServer("redis-server");
        assert_eq!(
            e.to_string(),
            "redis-server not found (apt-get install redis-server)"
        );
        assert_eq!(e.exit_code(), 2);
        assert!(server::require("surely-not-a-program-dws").is_err());
    }
}
