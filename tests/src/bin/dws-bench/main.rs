//! `dws-bench`: the fan-out benchmark of the event bus (run it through
//! `scripts/bench.sh`, which builds in release mode first).
//!
//! What it measures, against the real `busd` and real `dws event consume`
//! processes, each scenario in a fresh isolated temp dir with its own bus:
//!
//! - **Fan-out throughput** ([`fanout`], [`classic`]): N consumers (1, 4,
//!   16) × payload 256 B / 4 KiB. A publisher speaks the wire protocol
//!   directly on the bus socket and sends `Publish` frames as fast as it can
//!   (pipelined, at most `--inflight` unacknowledged). Every consumer runs
//!   `dws event consume bench.x --format raw --quiet --max-events E` with
//!   its stdout read here by a thread ([`reader`]) that timestamps every
//!   chunk and parses the send time the publisher wrote at the start of
//!   each payload. Reported: events/s per consumer, aggregate deliveries/s,
//!   p50/p99 publish-to-stdout latency, busd's peak RSS, and CPU µs per
//!   delivery (utime + stime of busd and every consumer from /proc, over N
//!   × E; the publisher is this benchmark and is not counted); the median
//!   of `--runs` runs, since short runs on a shared 2-core machine are noisy.
//! - **Latency at a fixed rate**: 4 consumers, 256 B, 2000 events/s for ~3 s,
//!   with CPU and context switches per delivery; on the fsync disk store
//!   next to raw `fdatasync` of 256 B appends at the same rate on the same
//!   file system ([`fsync_floor`]), the floor of a durable delivery.
//! - **Memory with a stalled consumer** ([`memory`]): one fast consumer plus
//!   one whose stdout pipe is never read; busd's peak RSS, also per
//!   retained event, and the stalled subscription's `lost_to_retention`.
//! - **Durable publish** ([`durable`]): P publisher connections (1, 8), no
//!   consumers, disk store fsync and none; acked publishes/s and
//!   publish→ack latency, then publish→ack at a fixed rate; and events/s of
//!   one `dws event publish --lines` fed 100k lines of 256 B ([`lines`]).
//! - **Disk store vs memory store**, and **the cost of `--where`** ([`compare`]).
//! - **The work queue** ([`queue`], with `--peers` or `--only-queue`): a
//!   `--delivery shared` subscription and 4 `dws event consume --ack
//!   explicit` workers acking every job; jobs/s and publish→ack latency.
//! - **The peers** (`--peers`, [`peer_table`]): Redis pub/sub, NATS core, Redis
//!   Streams (`appendfsync always`) and JetStream (file store) through the
//!   repository's `dws-peers` ([`peers`]), with the bus cells the other
//!   sections did not measure, then the peer comparison table ([`table`])
//!   and every goal's ratio, met or missed ([`goals`]).
//!
//! The fan-out table runs on the store chosen with `--store` /
//! `--durability` (default: disk, fsync, the bus's own default).
//!
//! Every payload is `"<send unix nanos> <index> "` padded with `x` to the
//! size, so a reader also checks that it got every event once, in order, at
//! the right size. Every wait is bounded, every process this starts is
//! stopped on the way out (the harness's guards; also on SIGINT/SIGTERM),
//! and all bus traffic stays on the Unix socket. Exit 0 when every scenario
//! passed, 1 when one failed, 2 on a usage error.

mod classic;
mod compare;
mod durable;
mod fanout;
mod fsync_floor;
mod goals;
mod lines;
mod memory;
mod opts;
mod peer_table;
mod peers;
mod procs;
mod publisher;
mod queue;
mod reader;
mod report;
mod slow_agents;
mod table;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dws_tests::{busd_bin, dws_bin};

use crate::{
    opts::{Opts, StoreSel, PG_URL},
    procs::{guarded, install_signal_watch, interrupted},
    table::Table,
};

/// The errors of the scenarios: a message for the failure list.
type Res<T> = Result<T, String>;

const EVENT_TYPE: &str = "bench.x";
/// Poll interval of the waits that have nothing to block on.
const POLL: Duration = Duration::from_millis(20);

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `--bin-dir DIR`: the harness finds dws and busd through DWS_BIN/BUSD_BIN.
fn use_bin_dir(dir: &std::path::Path) -> Res<()> {
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
    // Read by the harness's dws_bin()/busd_bin(); no other thread runs yet.
    std::env::set_var("DWS_BIN", dws);
    std::env::set_var("BUSD_BIN", busd);
    Ok(())
}

fn main() {
    let opts = match Opts::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("dws-bench: {e}");
            std::process::exit(2);
        }
    };
    let ready = opts
        .bin_dir
        .as_deref()
        .map_or(Ok(()), use_bin_dir)
        .and_then(|()| guarded(|| Ok((dws_bin(), busd_bin()))))
        .and_then(|(d, b)| {
            println!("dws-bench: dws = {}, busd = {}", d.display(), b.display());
            install_signal_watch()
        });
    if let Err(e) = ready {
        eprintln!("dws-bench: {e}");
        std::process::exit(2);
    }
    let started = Instant::now();
    let mut failures: Vec<String> = Vec::new();
    let mut table = Table::default();
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
        classic::run_classic_sections(&opts, &mut failures, &mut table);
    }
    if !opts.skip_durable && !interrupted() {
        durable::run_durable_sections(&opts, &mut failures, &mut table);
    }
    if !opts.skip_store_compare && !interrupted() {
        compare::run_store_compare(&opts, &mut failures);
    }
    if let Some(expr) = &opts.where_expr {
        if !interrupted() {
            compare::run_where_compare(&opts, expr, &mut failures);
        }
    }
    if (opts.only_queue || (opts.peers && !opts.skip_queue)) && !interrupted() {
        queue::run_queue_section(&opts, &mut failures, &mut table);
    }
    if opts.peers && !interrupted() {
        peer_table::run_peer_section(&opts, &mut failures, &mut table);
    } else if !opts.peers && !interrupted() {
        println!();
        println!(
            "Peer comparison: not run; pass --peers (needs redis-server and nats-server on \
             PATH: apt-get install redis-server nats-server; see docs/benchmark.md)"
        );
    }

    if interrupted() {
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
