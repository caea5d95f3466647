//! The hidden `role` subcommand: one client process of a run (publisher or
//! subscriber), as the reference C clients. A subscriber prints `READY` once
//! subscribed; a publisher given `--wait-go` prints `READY` and starts on a
//! line on stdin; each prints one JSON result line at exit.

use crate::procs::{now_ns, sleep_until_ns};
use crate::stats::stamp;
use crate::{nats_roles, redis_roles, PeersError};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RoleKind {
    /// PUBLISH, pipelined --batch at a time.
    RedisPub,
    /// One PUBLISH per tick at --rate for --duration.
    RedisLatpub,
    /// SUBSCRIBE, count messages.
    RedisSub,
    /// SUBSCRIBE, record latency samples into --latfile.
    RedisLatsub,
    /// XADD key * d <payload>, pipelined --batch at a time.
    XaddPub,
    /// One XADD at a time at --rate, waiting for each reply.
    XaddLatpub,
    /// A consumer group: XREADGROUP COUNT --fetch, one XACK per batch.
    XreadSub,
    /// NATS core publish, then flush.
    NatsPub,
    /// NATS core subscription.
    NatsSub,
    /// JetStream publish with at most --window PubAcks outstanding.
    JsPub,
    /// One JetStream publish at a time at --rate, waiting for each PubAck.
    JsLatpub,
    /// A durable pull consumer: Fetch --fetch, AckAll on each batch's last.
    JsSub,
    /// A work-queue worker: a consumer of group --name, XREADGROUP COUNT
    /// --fetch, one XACK per batch.
    XqueueWorker,
    /// A work-queue worker: a fetcher of the shared durable pull consumer
    /// --name, one explicit ack per message.
    JsQueueWorker,
}

#[derive(Args, Clone, Debug)]
pub struct RoleArgs {
    pub kind: RoleKind,
    /// redis+unix:///path or nats://host:port.
    #[arg(long)]
    pub url: String,
    /// Channel / stream key / subject.
    #[arg(long, default_value = "bench")]
    pub topic: String,
    #[arg(long, default_value_t = 200_000)]
    pub msgs: u64,
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    #[arg(long, default_value_t = 3000)]
    pub idle_ms: u64,
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Where latency samples go (raw little-endian i64 ns).
    #[arg(long)]
    pub latfile: Option<PathBuf>,
    /// Consumer group / durable consumer name.
    #[arg(long, default_value = "g0")]
    pub name: String,
    #[arg(long, default_value_t = 1000)]
    pub fetch: usize,
    #[arg(long, default_value_t = 4000)]
    pub window: usize,
    #[arg(long)]
    pub wait_go: bool,
    /// Slow agents: each job takes this long (ms) before its ack (0: none);
    /// a job left unacked that long past its delivery goes to another
    /// worker ([`crate::queue::CLAIM_MS`]).
    #[arg(long, default_value_t = 0)]
    pub work_ms: u64,
    /// Slow agents: after acking this many jobs the worker takes one more
    /// and hangs with it, never acking (0: never).
    #[arg(long, default_value_t = 0)]
    pub hang_after: u64,
}

impl RoleArgs {
    /// Messages of a fixed-rate run.
    pub fn lat_msgs(&self) -> u64 {
        (self.rate * self.duration) as u64
    }
}

/// Runs the role and prints its result line.
pub fn run(a: &RoleArgs) -> Result<(), PeersError> {
    use RoleKind::*;
    let v = match a.kind {
        RedisPub | RedisLatpub | RedisSub | RedisLatsub | XaddPub | XaddLatpub | XreadSub => {
            redis_roles::run(a)?
        }
        NatsPub | NatsSub | JsPub | JsLatpub | JsSub => nats_roles::run(a)?,
        XqueueWorker | JsQueueWorker => crate::queue::run_worker(a)?,
    };
    say!("{v}");
    Ok(())
}

pub fn print_ready() {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "READY");
    let _ = o.flush();
}

/// With --wait-go: READY, then one line on stdin.
pub fn wait_go(a: &RoleArgs) -> Result<(), PeersError> {
    if a.wait_go {
        print_ready();
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| PeersError::io("read GO", e))?;
    }
    Ok(())
}

/// The publisher's result line.
pub fn pub_json(sent: u64, start: u64, end: u64, extra: Value) -> Value {
    let mut v = json!({"role": "pub", "sent": sent, "start_ns": start, "end_ns": end});
    crate::stats::merge(&mut v, extra);
    v
}

/// Writes latency samples to --latfile, if given.
pub fn write_samples(path: Option<&Path>, samples: &[i64]) -> Result<(), PeersError> {
    let Some(p) = path else { return Ok(()) };
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    std::fs::write(p, bytes).map_err(|e| PeersError::io("write --latfile", e))
}

/// Reads the samples written by [`write_samples`] (missing file: none).
pub fn read_samples(path: &Path) -> Vec<i64> {
    std::fs::read(path)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

/// Fixed-rate schedule bookkeeping: sends later than one period, worst lag.
#[derive(Debug, Default)]
pub struct Lag {
    pub late: u64,
    pub max_lag_ns: u64,
}

impl Lag {
    pub fn note(&mut self, sched_ns: u64, now_ns: u64, period_ns: f64) {
        let lag = now_ns.saturating_sub(sched_ns);
        self.max_lag_ns = self.max_lag_ns.max(lag);
        if lag as f64 > period_ns {
            self.late += 1;
        }
    }

    pub fn json(&self) -> Value {
        json!({"late": self.late, "max_lag_us": self.max_lag_ns as f64 / 1e3, "lat_unit": "message"})
    }
}

/// The sends of a fixed-rate loop: `total` of them at `rate`/s from when it
/// was made. Each [`Pacer::tick`] sleeps until its slot, notes how late it
/// woke ([`Lag`]) and stamps the payload with its index and send time.
pub struct Pacer {
    start_ns: u64,
    period_ns: f64,
    total: u64,
    next: u64,
    pub lag: Lag,
}

impl Pacer {
    pub fn new(total: u64, rate: f64) -> Pacer {
        Pacer {
            start_ns: now_ns(),
            period_ns: 1e9 / rate,
            total,
            next: 0,
            lag: Lag::default(),
        }
    }

    /// When the loop started (monotonic ns).
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Waits for the next send's slot and stamps `buf`; its send time, or
    /// `None` after the last one.
    pub fn tick(&mut self, buf: &mut [u8]) -> Option<u64> {
        if self.next >= self.total {
            return None;
        }
        let sched = self.start_ns + (self.next as f64 * self.period_ns) as u64;
        sleep_until_ns(sched);
        let t = now_ns();
        self.lag.note(sched, t, self.period_ns);
        stamp(buf, self.next, t);
        self.next += 1;
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_round_trip_through_a_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("lat.bin");
        write_samples(Some(&p), &[1, -2, 300]).expect("write");
        assert_eq!(read_samples(&p), vec![1, -2, 300]);
        assert!(read_samples(&d.path().join("none")).is_empty());
    }

    #[test]
    fn lag_counts_sends_later_than_a_period() {
        let mut l = Lag::default();
        l.note(1000, 1200, 500.0);
        l.note(2000, 2600, 500.0);
        assert_eq!((l.late, l.max_lag_ns), (1, 600));
    }

    #[test]
    fn a_pacer_stamps_each_send_and_stops_after_the_last() {
        let mut p = Pacer::new(3, 1e6);
        let mut buf = crate::stats::new_payload(32);
        let mut sends = Vec::new();
        while let Some(t) = p.tick(&mut buf) {
            assert_eq!(crate::stats::header(&buf), Some((sends.len() as u64, t)));
            sends.push(t);
        }
        assert_eq!(sends.len(), 3);
        assert!(sends[0] >= p.start_ns() && sends.windows(2).all(|w| w[0] <= w[1]));
    }
}
