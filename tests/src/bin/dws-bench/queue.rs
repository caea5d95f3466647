//! The work-queue row, the bus's side: a fresh bus, `dws event subscribe
//! 'job.*' --id work --delivery shared`, then `--queue-workers` ×
//! `dws event consume --subscribe-id work --ack explicit`, each a worker:
//! this benchmark reads its stdout (NDJSON, one job a line) and answers
//! every job with `ack <seq>` on its stdin (the lines one read brought in
//! one write), as a worker that handled it would. One publisher speaks the
//! wire protocol and publishes `job.x` events of 256 B.
//!
//! - **jobs/s**: a flood of `--queue-jobs` jobs (at most `--inflight`
//!   unacknowledged publishes): the jobs acked / (first publish → the last
//!   ack written), the median of `--durable-runs` runs;
//! - **latency**: `--queue-rate` jobs/s for `--rate-secs`; a job's latency
//!   runs from the publisher's stamp in its payload, taken just before its
//!   Publish frame is written, to the moment its worker writes `ack <seq>`
//!   to its `dws`; p50 and p99 over every job.
//!
//! The run ends once every job was acked: each worker's stdin is closed
//! and its `dws` exits (after applying the acks before the EOF). A bus that
//! refuses `--delivery shared` on its store is a row of its own, not a
//! failure: "n/a (this bus refuses --delivery shared on its store)".

use std::{
    io::{Read, Write},
    process::{ChildStdin, ChildStdout},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    fanout::{retention_for, Mode},
    opts::{Opts, StoreSel},
    procs::{bus_info, check_interrupted, guarded, interrupted, BusEnv, Consumer, CMD_TIMEOUT},
    publisher::Publisher,
    report::percentile,
    table::{thousands, Col, Row, Table},
    unix_nanos, Res,
};

/// What the table and the section print for a bus that refuses the row.
pub const REFUSED: &str = "n/a (this bus refuses --delivery shared on its store)";
/// The subscription the workers share, its keys and the jobs' type.
const QUEUE_ID: &str = "work";
const QUEUE_KEYS: &str = "job.*";
const JOB_TYPE: &str = "job.x";
const SIZE: usize = 256;
/// How long the workers may ack nothing while jobs are due.
const STALL_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the whole wait for the acks may take after the last publish.
const ACK_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a worker may take to exit once its stdin is closed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// One job line of a worker's stdout, as far as the worker needs it.
#[derive(Debug, PartialEq, Eq)]
pub struct Job {
    pub seq: u64,
    /// The publisher's stamp (unix ns) and the job's index, from its data.
    pub sent_ns: u64,
    pub index: u64,
    pub redelivered: bool,
}

/// Reads a job off an NDJSON event line (`"seq":N`, then `"data":"<nanos>
/// <index> x…"`, in the contract's field order).
pub fn parse_job(line: &[u8]) -> Option<Job> {
    fn after<'a>(s: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
        s.windows(key.len())
            .position(|w| w == key)
            .map(|i| &s[i + key.len()..])
    }
    fn digits(s: &[u8]) -> Option<(u64, usize)> {
        let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
        let v = std::str::from_utf8(&s[..n]).ok()?.parse().ok()?;
        Some((v, n))
    }
    // In the contract's order, each looked for after the one before; the
    // redelivered flag is among the line's last fields (fields are only
    // ever added after them).
    let rest = after(line, b"\"seq\":")?;
    let (seq, _) = digits(rest)?;
    let data = after(rest, b"\"data\":\"")?;
    let (sent_ns, n) = digits(data)?;
    let (index, _) = digits(data.get(n..)?.strip_prefix(b" ")?)?;
    let tail = &line[line.len().saturating_sub(160)..];
    let redelivered = after(tail, b"\"redelivered\":true").is_some();
    Some(Job {
        seq,
        sent_ns,
        index,
        redelivered,
    })
}

/// The refusal of `--delivery shared` in a failed subscribe's stderr, if
/// that is why it failed.
pub fn refusal(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .find(|l| l.contains("--delivery shared") || l.contains("shared delivery"))
        .map(|l| l.trim().to_owned())
}

/// The jobs acked so far, by index, across the workers.
struct Acked {
    seen: Mutex<Vec<bool>>,
    distinct: AtomicU64,
    duplicates: AtomicU64,
}

/// What one worker did.
#[derive(Default)]
struct WorkerResult {
    acked: u64,
    redelivered: u64,
    last_ack_ns: u64,
    /// Publish→ack of every job it acked, ns.
    latencies: Vec<u64>,
    error: Option<String>,
}

/// A worker: reads its `dws`'s stdout to EOF and acks every job, the jobs
/// of one read in one write to its stdin (while the main thread has not
/// closed it).
fn work(
    mut out: ChildStdout,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    acked: Arc<Acked>,
) -> WorkerResult {
    let mut r = WorkerResult::default();
    let mut buf = vec![0u8; 256 * 1024];
    let (mut have, mut acks, mut sent, mut idx) = (0usize, Vec::new(), Vec::new(), Vec::new());
    loop {
        if have == buf.len() {
            r.error
                .get_or_insert_with(|| "a line longer than 256 KiB".into());
            have = 0;
        }
        let n = match out.read(&mut buf[have..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        have += n;
        let mut pos = 0;
        while let Some(i) = buf[pos..have].iter().position(|b| *b == b'\n') {
            let line = &buf[pos..pos + i];
            pos += i + 1;
            match parse_job(line) {
                Some(job) => {
                    acks.extend_from_slice(format!("ack {}\n", job.seq).as_bytes());
                    sent.push(job.sent_ns);
                    idx.push(job.index);
                    r.redelivered += u64::from(job.redelivered);
                }
                None => {
                    r.error.get_or_insert_with(|| {
                        format!(
                            "not a job line: {:?}",
                            String::from_utf8_lossy(&line[..line.len().min(120)])
                        )
                    });
                }
            }
        }
        buf.copy_within(pos..have, 0);
        have -= pos;
        if acks.is_empty() {
            continue;
        }
        let t = unix_nanos();
        {
            let mut pipe = stdin.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = pipe.as_mut() {
                if let Err(e) = p.write_all(&acks) {
                    r.error
                        .get_or_insert_with(|| format!("writing acks to dws: {e}"));
                }
            }
        }
        r.last_ack_ns = t;
        r.acked += sent.len() as u64;
        r.latencies
            .extend(sent.iter().map(|s| t.saturating_sub(*s)));
        let mut seen = acked.seen.lock().unwrap_or_else(|p| p.into_inner());
        for &i in &idx {
            match seen.get_mut(i as usize) {
                Some(s) if *s => {
                    acked.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                Some(s) => {
                    *s = true;
                    acked.distinct.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    r.error
                        .get_or_insert_with(|| format!("a job of index {i}, beyond the run's"));
                }
            }
        }
        drop(seen);
        acks.clear();
        sent.clear();
        idx.clear();
    }
    r
}

/// One measured work-queue run.
pub struct QueueResult {
    /// Jobs / (first publish → last ack written).
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub acked_per_worker: Vec<u64>,
    pub redelivered: u64,
    pub duplicates: u64,
}

/// A run measured, or refused by the bus.
pub enum Outcome {
    Measured(QueueResult),
    Refused(String),
}

/// One work-queue run on a fresh bus on `store`: `jobs` jobs, flooded or
/// at a rate, to `workers` workers.
pub fn run_queue(
    store: StoreSel,
    workers: usize,
    jobs: u64,
    mode: Mode,
    inflight: u64,
) -> Res<Outcome> {
    let retention = retention_for(jobs, SIZE);
    let mut vars = store.env().to_vec();
    if let Some((ev, bytes)) = &retention {
        vars.push(("DWS_EVENT_BUS_RETENTION_EVENTS", ev.as_str()));
        vars.push(("DWS_EVENT_BUS_RETENTION_BYTES", bytes.as_str()));
    }
    let mut env = BusEnv::new(&vars);
    let sub = env.run_dws(
        &[
            "event",
            "subscribe",
            QUEUE_KEYS,
            "--id",
            QUEUE_ID,
            "--delivery",
            "shared",
        ],
        CMD_TIMEOUT,
    )?;
    if !sub.ok {
        if let Some(why) = refusal(&sub.stderr) {
            return Ok(Outcome::Refused(why));
        }
        return Err(format!(
            "`dws event subscribe {QUEUE_KEYS} --id {QUEUE_ID} --delivery shared` failed ({:?}): {} {}\n{}",
            sub.code,
            sub.stdout.trim(),
            sub.stderr.trim(),
            env.log_tail()
        ));
    }
    store.check(&env.status()?)?;
    let args = [
        "event",
        "consume",
        "--subscribe-id",
        QUEUE_ID,
        "--ack",
        "explicit",
    ];
    let mut consumers = (0..workers)
        .map(|_| Consumer::spawn_worker(&env, &args))
        .collect::<Res<Vec<_>>>()?;
    let status = env.wait_consumers(workers, &mut consumers)?;
    let socket = bus_info(&status)?.0;
    let acked = Arc::new(Acked {
        seen: Mutex::new(vec![false; jobs as usize]),
        distinct: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
    });
    let mut stdins = Vec::with_capacity(workers);
    let mut threads = Vec::with_capacity(workers);
    for c in &mut consumers {
        let out = c.take_stdout()?;
        let stdin = Arc::new(Mutex::new(Some(c.take_stdin()?)));
        stdins.push(stdin.clone());
        let acked = acked.clone();
        threads.push(thread::spawn(move || work(out, stdin, acked)));
    }
    let mut publisher = Publisher::connect(&socket)?;
    publisher.set_event_type(JOB_TYPE);
    let first_send = match mode {
        Mode::Flood => publisher.flood(jobs, SIZE, inflight, None)?,
        Mode::Rate(rate) => publisher.paced(jobs, SIZE, rate, inflight)?,
    };
    publisher.close();
    let waited = wait_acked(&acked, jobs, &mut consumers);
    // However the wait ended: EOF on every worker's stdin, so each exits.
    for s in &stdins {
        s.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
    let mut problems: Vec<String> = waited.err().into_iter().collect();
    for c in &mut consumers {
        match c.wait_exit(EXIT_TIMEOUT) {
            Some(st) if st.success() => {}
            Some(st) => problems.push(format!("worker exited with {st}:\n{}", c.report())),
            None => problems.push(format!(
                "worker pid {} still running {EXIT_TIMEOUT:?} after its stdin closed",
                c.pid()
            )),
        }
    }
    drop(consumers);
    let results: Vec<WorkerResult> = threads
        .into_iter()
        .map(|t| t.join().unwrap_or_default())
        .collect();
    problems.extend(results.iter().filter_map(|r| r.error.clone()));
    if !problems.is_empty() {
        return Err(format!("{}\n{}", problems.join("\n"), env.log_tail()));
    }
    env.stop()?;
    let last = results
        .iter()
        .map(|r| r.last_ack_ns)
        .max()
        .unwrap_or(first_send);
    let mut lat: Vec<u64> = results
        .iter()
        .flat_map(|r| r.latencies.iter().copied())
        .collect();
    lat.sort_unstable();
    Ok(Outcome::Measured(QueueResult {
        rate: jobs as f64 / (last.saturating_sub(first_send).max(1) as f64 / 1e9),
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        acked_per_worker: results.iter().map(|r| r.acked).collect(),
        redelivered: results.iter().map(|r| r.redelivered).sum(),
        duplicates: acked.duplicates.load(Ordering::Relaxed),
    }))
}

/// Waits until every job was acked (bounded: no progress for
/// [`STALL_TIMEOUT`], [`ACK_TIMEOUT`] in all, a worker that exited).
fn wait_acked(acked: &Acked, jobs: u64, workers: &mut [Consumer]) -> Res<()> {
    let started = Instant::now();
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let n = acked.distinct.load(Ordering::Relaxed);
        if n >= jobs {
            return Ok(());
        }
        check_interrupted()?;
        if n != last {
            (last, since) = (n, Instant::now());
        }
        let why = if since.elapsed() >= STALL_TIMEOUT {
            Some(format!("no job acked for {STALL_TIMEOUT:?}"))
        } else if started.elapsed() >= ACK_TIMEOUT {
            Some(format!("not all acked within {ACK_TIMEOUT:?}"))
        } else {
            workers.iter_mut().find_map(|w| {
                w.exited()
                    .map(|st| format!("worker pid {} exited ({st})", w.pid()))
            })
        };
        if let Some(why) = why {
            return Err(format!("{why}: {n} of {jobs} jobs acked"));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The work-queue section: the bus on the memory and the disk store, each
/// a flood (median of `--durable-runs`) and a run at `--queue-rate`; the
/// figures, or the refusal, go into the table.
pub fn run_queue_section(opts: &Opts, failures: &mut Vec<String>, table: &mut Table) {
    let w = opts.queue_workers;
    let rate_jobs = ((opts.queue_rate as f64 * opts.rate_secs).round() as u64).max(1);
    println!();
    println!(
        "Work queue: `dws event subscribe '{QUEUE_KEYS}' --id {QUEUE_ID} --delivery shared`, {w} × \
         `dws event consume --subscribe-id {QUEUE_ID} --ack explicit`, each job acked (`ack SEQ` on its stdin), {SIZE} B"
    );
    println!(
        "(jobs/s: {} jobs flooded (≤{} publishes in flight) / first publish → last ack written, median of {} run(s); \
         latency: {rate_jobs} jobs at {}/s, from the publisher's stamp before each publish to its worker writing its ack)",
        opts.queue_jobs, opts.inflight, opts.durable_runs, opts.queue_rate
    );
    for store in [StoreSel::MEMORY, StoreSel::DISK_FSYNC] {
        if interrupted() {
            return;
        }
        let Some(col) = Col::of_store(store) else {
            continue;
        };
        let name = format!("{} store", store.kind);
        let first = guarded(|| run_queue(store, w, opts.queue_jobs, Mode::Flood, opts.inflight));
        let flood = match first {
            Ok(Outcome::Refused(why)) => {
                println!("  {name:<13} {REFUSED}   (it said: {why})");
                for row in [Row::QueueRate, Row::QueueP50, Row::QueueP99] {
                    table.set_note(row, col, REFUSED);
                }
                continue;
            }
            Ok(Outcome::Measured(r)) => flood_median(opts, store, r),
            Err(e) => Err(e),
        };
        let rated = guarded(|| {
            run_queue(
                store,
                w,
                rate_jobs,
                Mode::Rate(opts.queue_rate),
                opts.inflight,
            )
        });
        let flood_text = match flood {
            Ok(r) => {
                table.set(Row::QueueRate, col, Some(r.rate));
                format!(
                    "{} jobs/s (acked per worker {:?}, {} redelivered, {} acked twice)",
                    thousands(r.rate),
                    r.acked_per_worker,
                    r.redelivered,
                    r.duplicates
                )
            }
            Err(e) => {
                failures.push(format!("work queue, {name}, flood: {e}"));
                "FAILED (see below)".into()
            }
        };
        let rate_text = match rated {
            Ok(Outcome::Measured(r)) => {
                table.set(Row::QueueP50, col, Some(r.p50_us));
                table.set(Row::QueueP99, col, Some(r.p99_us));
                format!(
                    "p50 {} µs, p99 {} µs",
                    thousands(r.p50_us),
                    thousands(r.p99_us)
                )
            }
            Ok(Outcome::Refused(why)) => format!("{REFUSED} ({why})"),
            Err(e) => {
                failures.push(format!("work queue, {name}, at {}/s: {e}", opts.queue_rate));
                "FAILED (see below)".into()
            }
        };
        println!(
            "  {name:<13} {flood_text}; at {}/s: {rate_text}",
            thousands(opts.queue_rate as f64)
        );
    }
    run_slow_agents_line(opts, failures);
}

/// The slow-agents line: the makespan on the default (disk) store next to
/// the ideal, the median of `--durable-runs` runs.
fn run_slow_agents_line(opts: &Opts, failures: &mut Vec<String>) {
    use crate::slow_agents::{run_slow_agents, JOBS, WORK, WORKERS};
    println!(
        "Slow agents: {WORKERS} workers (`--max-in-flight 1 --ack-wait 2s`) that each take {} ms per \
         job, {JOBS} jobs published at once, one worker's dws SIGSTOPped once a third are acked; \
         makespan (first publish → last ack) against the ideal ({JOBS} × {} ms / {} live workers)",
        WORK.as_millis(),
        WORK.as_millis(),
        WORKERS - 1
    );
    let mut runs = vec![];
    for _ in 0..opts.durable_runs.max(1) {
        if interrupted() {
            return;
        }
        match guarded(|| run_slow_agents(StoreSel::DISK_FSYNC)) {
            Ok(r) => runs.push(r),
            Err(e) => {
                failures.push(format!("slow agents: {e}"));
                return;
            }
        }
    }
    runs.sort_by_key(|r| r.makespan);
    let r = &runs[runs.len() / 2];
    let ideal = r.ideal.as_secs_f64();
    println!(
        "  disk store    makespan {:.2} s, ideal {ideal:.2} s (×{:.2}; goal ≤ ×1.5), {} redelivered",
        r.makespan.as_secs_f64(),
        r.makespan.as_secs_f64() / ideal,
        r.redelivered
    );
    if !opts.peers {
        return;
    }
    // The peers as their users would do it: Redis Streams workers claim
    // what another left past 2 s (XAUTOCLAIM), JetStream redelivers past
    // its AckWait of 2 s; each worker fetches one job at a time.
    let bin = match crate::peers::locate(opts.peers_bin.as_deref()) {
        Ok(b) => b,
        Err(e) => return failures.push(format!("slow agents, peers: {e}")),
    };
    for (workload, name) in [
        ("redis-streams-queue", "Redis Streams"),
        ("jetstream-queue", "JetStream"),
    ] {
        if let Some(server) =
            crate::peers::server_of(workload).filter(|s| !crate::peers::on_path(s))
        {
            println!("  {name:<13} skipped: `{server}` is not on PATH");
            continue;
        }
        let args: Vec<String> = [
            "--subs",
            &WORKERS.to_string(),
            "--size",
            "256",
            "--msgs",
            &JOBS.to_string(),
            "--runs",
            &opts.durable_runs.max(1).to_string(),
            "--work-ms",
            &WORK.as_millis().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let run = crate::peers::run(&bin, workload, &args, false, Duration::from_secs(300));
        match run.map(|r| r.median("jobs_rate")) {
            Ok(Some(rate)) if rate > 0.0 => {
                let makespan = JOBS as f64 / rate;
                println!(
                    "  {name:<13} makespan {makespan:.2} s, ideal {ideal:.2} s (×{:.2})",
                    makespan / ideal
                );
            }
            Ok(_) => failures.push(format!("slow agents, {name}: no jobs_rate")),
            Err(e) => failures.push(format!("slow agents, {name}: {e}")),
        }
    }
}

/// The median by jobs/s of `first` and `--durable-runs` − 1 more floods.
fn flood_median(opts: &Opts, store: StoreSel, first: QueueResult) -> Res<QueueResult> {
    let mut runs = vec![first];
    for _ in 1..opts.durable_runs {
        let w = opts.queue_workers;
        match guarded(|| run_queue(store, w, opts.queue_jobs, Mode::Flood, opts.inflight))? {
            Outcome::Measured(r) => runs.push(r),
            Outcome::Refused(why) => {
                return Err(format!("refused after a run was measured: {why}"))
            }
        }
    }
    runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    Ok(runs.swap_remove(runs.len() / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] = br#"{"type":"event","seq":42,"event_id":"ev-42","event_type":"job.x","subscribe_id":"work","source_id":"local","data":"1700000000123456789 7 xxxx","received_at_unix_ms":1700000000124,"redelivered":false,"delivery":1}"#;

    #[test]
    fn a_job_line_gives_its_seq_stamp_and_index() {
        assert_eq!(
            parse_job(LINE),
            Some(Job {
                seq: 42,
                sent_ns: 1_700_000_000_123_456_789,
                index: 7,
                redelivered: false
            })
        );
        let again = String::from_utf8_lossy(LINE).replace(
            "\"redelivered\":false,\"delivery\":1",
            "\"redelivered\":true,\"delivery\":2",
        );
        assert!(parse_job(again.as_bytes()).is_some_and(|j| j.redelivered));
        assert_eq!(parse_job(b"{\"type\":\"event\",\"seq\":3}"), None);
        assert_eq!(parse_job(b"[event] gap"), None);
        let no_index = String::from_utf8_lossy(LINE).replace(" 7 xxxx", "xxxx");
        assert_eq!(parse_job(no_index.as_bytes()), None);
    }

    #[test]
    fn only_a_refused_shared_delivery_is_a_refusal() {
        let why =
            refusal("Error: --delivery shared needs store = \"postgres\" (a cluster of hosts)\n");
        assert_eq!(
            why.as_deref(),
            Some("Error: --delivery shared needs store = \"postgres\" (a cluster of hosts)")
        );
        assert!(refusal("Error: the bus is unreachable: connection refused\n").is_none());
        assert!(refusal("").is_none());
    }
}
