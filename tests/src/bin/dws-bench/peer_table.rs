//! `--peers`: the rest of the peer comparison table. The bus cells the other sections
//! did not measure (both stores, the table's scenarios), then every peer
//! workload through `dws-peers`, then the table and every goal's ratio.
//! With `--only-queue`, only the work queue's peers (the bus's side is
//! [`crate::queue`]).

use std::time::Duration;

use crate::{
    durable::{median_of, run_durable, DurableResult},
    fanout::{run_fanout_median, run_fixed_rate, Mode},
    opts::{Opts, StoreSel},
    peers,
    procs::{guarded, interrupted},
    report::{fmt_cpu, size_name},
    table::{Col, Fig, Labels, Row, Table},
};

/// The (N, payload) fan-out scenarios of the table (N=1 only for the
/// broker's own CPU, N=1 against N=16).
const FANOUT_SCENARIOS: [(usize, usize); 4] = [(1, 256), (4, 256), (16, 256), (4, 4096)];
/// Some of [`FANOUT_SCENARIOS`].
type Scenarios = &'static [(usize, usize)];
/// The longest a peer workload may take per run it makes.
const PEER_TIMEOUT_PER_RUN: Duration = Duration::from_secs(120);

/// One `dws-peers` invocation and where its summary keys go.
struct PeerJob {
    workload: &'static str,
    args: Vec<String>,
    /// Pass `--dir` (a temp dir on the same file system as the buses').
    with_dir: bool,
    runs: usize,
    /// (summary key, row, column).
    cells: Vec<(&'static str, Row, Col)>,
}

pub fn run_peer_section(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    println!();
    println!("The peer comparison: the bus on both stores and the peers, in one run");
    let bin = match peers::locate(opts.peers_bin.as_deref()) {
        Ok(b) => Some(b),
        Err(why) => {
            println!("  the peers will be skipped: {why}");
            None
        }
    };
    if !opts.only_queue {
        fill_bus_cells(opts, failures, table);
    }
    if let Some(bin) = bin {
        println!();
        println!(
            "The peers (`{}`, each starting its own server in a temp dir):",
            bin.display()
        );
        let jobs = if opts.only_queue {
            queue_jobs(opts)
        } else {
            peer_jobs(opts)
        };
        for job in jobs {
            if interrupted() {
                return;
            }
            run_job(&bin, &job, failures, table);
        }
    }
    println!();
    let labels = Labels {
        rate: opts.rate,
        consumers: opts.rate_consumers,
        durable_rate: opts.durable_rate,
        queue_workers: opts.queue_workers,
        queue_rate: opts.queue_rate,
    };
    println!("{}", table.render(&labels));
    if opts.only_queue {
        println!(
            "(work queue: {} workers, {} jobs per flood (median of {} run(s)), latency from the publish of a job to \
             its worker's ack, at {}/s for {:.1} s)",
            opts.queue_workers, opts.queue_jobs, opts.durable_runs, opts.queue_rate, opts.rate_secs
        );
    } else {
        print_table_notes(opts);
    }
    println!();
    if opts.only_queue {
        // No goal is about the work queue: its ratios only.
        print!("{}", table.render_ratios());
    } else {
        print!("{}", table.render_judgement());
    }
}

/// What the table's figures are, under it.
fn print_table_notes(opts: &Opts) {
    println!(
        "(deliveries/s: medians of {} run(s); CPU µs per delivery from /proc: broker + consumers is busd and every \
         `dws event consume` against redis-server (nats-server) and its subscriber processes, the publisher left out \
         on both sides; with the publisher adds this benchmark's publishing threads against the peer's publisher \
         process; broker alone is busd against redis-server; fixed rate: {} consumers, 256 B; durable: 256 B, {} \
         run(s); fdatasync alone: a 256 B append fdatasync'ed at the row's rate ({}/s for the fixed rate, {}/s for \
         the durable reply) in a temp dir of the same file system; work queue: {} workers, {} jobs per flood \
         (median of {} run(s)), latency from the publish of a job to its worker's ack, at {}/s for {:.1} s)",
        opts.runs,
        opts.rate_consumers,
        opts.durable_runs,
        opts.rate,
        opts.durable_rate,
        opts.queue_workers,
        opts.queue_jobs,
        opts.durable_runs,
        opts.queue_rate,
        opts.rate_secs
    );
}

/// The bus cells of the table that no earlier section measured.
fn fill_bus_cells(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    for store in [StoreSel::MEMORY, StoreSel::DISK_FSYNC] {
        let Some(col) = Col::of_store(store) else {
            continue;
        };
        for (n, size) in FANOUT_SCENARIOS {
            let Some(&(first_row, _)) = Row::of_fanout(n, size).first() else {
                continue;
            };
            if interrupted() || table.get(first_row, col).is_some() {
                continue;
            }
            let events = if size == 256 {
                opts.events_small
            } else {
                opts.events_large
            };
            let what = format!(
                "bus fan-out N={n} {} on the {} store",
                size_name(size),
                store.kind
            );
            match run_fanout_median(opts.runs, n, size, events, opts.inflight, store) {
                Ok(r) => {
                    println!(
                        "  {what}: {:.0} deliveries/s, CPU µs/delivery busd + consumers {}, busd {}",
                        r.aggregate,
                        fmt_cpu(r.cpu_us_per_delivery, &r),
                        fmt_cpu(r.busd_cpu_us_per_delivery, &r)
                    );
                    table.record_fanout(store, n, size, &r);
                }
                Err(e) => fail(failures, &what, e),
            }
        }
        if !interrupted() && table.get(Row::LatP99, col).is_none() {
            let what = format!("bus fixed-rate latency on the {} store", store.kind);
            let r = run_fixed_rate(opts, store);
            match r {
                Ok(r) => {
                    println!("  {what}: p50 {:.0} µs, p99 {:.0} µs", r.p50_us, r.p99_us);
                    table.record_latency(store, &r);
                }
                Err(e) => fail(failures, &what, e),
            }
        }
    }
    for p in [1usize, 8] {
        let row = if p == 1 { Row::Pub1 } else { Row::Pub8 };
        if interrupted() || table.get(row, Col::BusDisk).is_some() {
            continue;
        }
        let what = format!("bus durable publish, {p} publisher(s), 256 B, fsync");
        let r = median_of(
            opts.durable_runs,
            |r: &DurableResult| r.rate,
            || {
                run_durable(
                    StoreSel::DISK_FSYNC,
                    256,
                    p,
                    opts.durable_events_small,
                    Mode::Flood,
                    opts.inflight,
                )
            },
        );
        match r {
            Ok(r) => {
                println!("  {what}: {:.0} publishes/s", r.rate);
                table.record_durable_flood(p, r.rate);
            }
            Err(e) => fail(failures, &what, e),
        }
    }
    if !interrupted() && table.get(Row::AckP99, Col::BusDisk).is_none() {
        let events = ((opts.durable_rate as f64 * opts.rate_secs).round() as u64).max(1);
        let what = format!("bus publish→ack at {}/s, fsync", opts.durable_rate);
        let r = guarded(|| {
            run_durable(
                StoreSel::DISK_FSYNC,
                256,
                1,
                events,
                Mode::Rate(opts.durable_rate),
                opts.inflight,
            )
        });
        match r {
            Ok(r) => {
                println!(
                    "  {what}: p50 {:.0} µs, p99 {:.0} µs",
                    r.ack_p50_us, r.ack_p99_us
                );
                table.set(Row::AckP50, Col::BusDisk, Some(r.ack_p50_us));
                table.set(Row::AckP99, Col::BusDisk, Some(r.ack_p99_us));
            }
            Err(e) => fail(failures, &what, e),
        }
    }
}

fn fail(failures: &mut Vec<String>, what: &str, e: String) {
    println!("  {what}: FAILED (see below)");
    failures.push(format!("{what}: {e}"));
}

/// Every peer workload of the table, with the bus's own parameters.
fn peer_jobs(opts: &Opts) -> Vec<PeerJob> {
    let s = |v: &dyn ToString| v.to_string();
    let mut jobs = Vec::new();
    let fanouts: [(&str, Col, Scenarios); 4] = [
        ("redis-fanout", Col::RedisPubsub, &FANOUT_SCENARIOS),
        ("nats-fanout", Col::NatsCore, &FANOUT_SCENARIOS[1..]),
        (
            "redis-streams-fanout",
            Col::RedisStreams,
            &FANOUT_SCENARIOS[1..3],
        ),
        ("jetstream-fanout", Col::JetStream, &FANOUT_SCENARIOS[1..3]),
    ];
    for (workload, col, scenarios) in fanouts {
        for &(n, size) in scenarios {
            let msgs = if size == 256 {
                opts.peers_msgs_small
            } else {
                opts.peers_msgs_large
            };
            // The broker alone is compared with Redis pub/sub's (the goal
            // is busd's own N=16 against its N=1; Redis shows the scale).
            let cells: Vec<(&'static str, Row, Col)> = Row::of_fanout(n, size)
                .iter()
                .filter(|(_, fig)| *fig != Fig::Broker || col == Col::RedisPubsub)
                .map(|&(row, fig)| (fig.peer_key(), row, col))
                .collect();
            if cells.is_empty() {
                continue;
            }
            jobs.push(PeerJob {
                workload,
                args: vec![
                    "--subs".into(),
                    s(&n),
                    "--msgs".into(),
                    s(&msgs),
                    "--size".into(),
                    s(&size),
                    "--runs".into(),
                    s(&opts.runs),
                ],
                with_dir: false,
                runs: opts.runs,
                cells,
            });
        }
    }
    jobs.push(PeerJob {
        workload: "redis-latency",
        args: vec![
            "--subs".into(),
            s(&opts.rate_consumers),
            "--rate".into(),
            s(&opts.rate),
            "--duration".into(),
            s(&opts.rate_secs),
        ],
        with_dir: false,
        runs: 3,
        cells: vec![
            ("p50_us", Row::LatP50, Col::RedisPubsub),
            ("p99_us", Row::LatP99, Col::RedisPubsub),
        ],
    });
    for (workload, col) in [
        ("redis-streams-publish", Col::RedisStreams),
        ("jetstream-publish", Col::JetStream),
    ] {
        for (p, row) in [(1usize, Row::Pub1), (8, Row::Pub8)] {
            jobs.push(PeerJob {
                workload,
                args: vec![
                    "--pubs".into(),
                    s(&p),
                    "--msgs".into(),
                    s(&opts.durable_events_small),
                    "--size".into(),
                    "256".into(),
                    "--runs".into(),
                    s(&opts.durable_runs),
                ],
                with_dir: false,
                runs: opts.durable_runs,
                cells: vec![("publish_rate", row, col)],
            });
        }
    }
    let at_rate = vec![
        "--rate".into(),
        s(&opts.durable_rate),
        "--duration".into(),
        s(&opts.rate_secs),
    ];
    let mut one_pub = vec!["--pubs".into(), "1".into(), "--size".into(), "256".into()];
    one_pub.extend(at_rate.iter().cloned());
    jobs.push(PeerJob {
        workload: "redis-streams-publish",
        args: one_pub,
        with_dir: false,
        runs: 3,
        cells: vec![
            ("p50_us", Row::AckP50, Col::RedisStreams),
            ("p99_us", Row::AckP99, Col::RedisStreams),
        ],
    });
    if !opts.skip_queue {
        jobs.extend(queue_jobs(opts));
    }
    jobs.push(PeerJob {
        workload: "fdatasync-latency",
        args: at_rate,
        with_dir: true,
        runs: 3,
        cells: vec![
            ("p50_us", Row::AckP50, Col::Fsync),
            ("p99_us", Row::AckP99, Col::Fsync),
        ],
    });
    jobs
}

/// The work queue's peers: Redis Streams and JetStream with
/// `--queue-workers` workers, a flood of `--queue-jobs` (jobs/s, median of
/// `--durable-runs`) and a run at `--queue-rate` for `--rate-secs`
/// (latency).
fn queue_jobs(opts: &Opts) -> Vec<PeerJob> {
    let s = |v: &dyn ToString| v.to_string();
    let mut jobs = Vec::new();
    for (workload, col) in [
        ("redis-streams-queue", Col::RedisStreams),
        ("jetstream-queue", Col::JetStream),
    ] {
        let common = vec![
            "--subs".into(),
            s(&opts.queue_workers),
            "--size".into(),
            "256".into(),
        ];
        let mut flood = common.clone();
        flood.extend([
            "--msgs".into(),
            s(&opts.queue_jobs),
            "--runs".into(),
            s(&opts.durable_runs),
        ]);
        jobs.push(PeerJob {
            workload,
            args: flood,
            with_dir: false,
            runs: opts.durable_runs,
            cells: vec![("jobs_rate", Row::QueueRate, col)],
        });
        let mut rated = common;
        rated.extend([
            "--rate".into(),
            s(&opts.queue_rate),
            "--duration".into(),
            s(&opts.rate_secs),
            "--runs".into(),
            "1".into(),
        ]);
        jobs.push(PeerJob {
            workload,
            args: rated,
            with_dir: false,
            runs: 1,
            cells: vec![
                ("p50_us", Row::QueueP50, col),
                ("p99_us", Row::QueueP99, col),
            ],
        });
    }
    jobs
}

fn run_job(bin: &std::path::Path, job: &PeerJob, failures: &mut Vec<String>, table: &mut Table) {
    let line = format!("dws-peers {} {}", job.workload, job.args.join(" "));
    if let Some(server) = peers::server_of(job.workload).filter(|s| !peers::on_path(s)) {
        println!("  {line}   skipped: `{server}` is not on PATH (apt-get install redis-server nats-server)");
        return;
    }
    let timeout = Duration::from_secs(60) + PEER_TIMEOUT_PER_RUN * job.runs.max(1) as u32;
    match peers::run(bin, job.workload, &job.args, job.with_dir, timeout) {
        Ok(r) => {
            let figures: Vec<String> = job
                .cells
                .iter()
                .map(|&(key, row, col)| {
                    let v = r.median(key);
                    table.set(row, col, v);
                    format!("{key} {}", v.map_or("?".into(), |v| format!("{v:.2}")))
                })
                .collect();
            let lost = r.lost();
            let lost = if lost.iter().any(|&l| l > 0) {
                format!("; lost per run {lost:?}")
            } else {
                String::new()
            };
            println!(
                "  {line}   ({} {}, {:.1} s): {}{lost}",
                r.system,
                peers::short_version(&r.version),
                r.took.as_secs_f64(),
                figures.join(", ")
            );
        }
        Err(e) => {
            println!("  {line}   FAILED (see below)");
            failures.push(format!("peer {}: {e}", job.workload));
        }
    }
}
