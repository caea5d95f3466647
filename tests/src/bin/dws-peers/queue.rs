//! The work-queue workloads (`redis-streams-queue`, `jetstream-queue`): one
//! producer and `--subs` worker processes sharing one queue, every job acked
//! by the worker that got it, as a user of each would write it:
//!
//! - Redis Streams (AOF, `appendfsync always`): one consumer group `work`,
//!   each worker a consumer of it; `XREADGROUP ... COUNT --fetch BLOCK
//!   --idle-ms STREAMS bench >`, then one `XACK` naming the batch's ids, then
//!   the next read (two round trips per batch).
//! - JetStream (file store): one durable pull consumer `work` with explicit
//!   acks, shared by the workers; each fetches up to `--fetch` messages and
//!   acks every one (`+ACK`, one per message).
//!
//! The producer is the one of the durable-publish workloads (pipelined XADD,
//! windowed JetStream publishes), or with `--rate` one publish at a time at
//! that rate for `--duration`. A job's latency runs from the producer's
//! stamp just before it publishes the job to the moment its worker issues
//! the job's ack (the XACK of its batch sent, its `+ACK` handed to the
//! client); jobs/s is the acked jobs over the producer's start → the last
//! ack issued. A worker stops after `--idle-ms` without a job.

use crate::nats_roles::{self, STREAM};
use crate::procs::{children_cpu_s, now_ns, Proc};
use crate::redis_roles::{self, entries_of};
use crate::role::{print_ready, read_samples, write_samples, RoleArgs, RoleKind};
use crate::stats::{self, header, latency_keys, num, round3};
use crate::workloads::{role_args, run_all, Sys};
use crate::{Opts, PeersError};
use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::Duration;

/// The consumer group / durable consumer the workers share.
pub const QUEUE: &str = "work";
/// Jobs a worker asks for at a time.
pub const FETCH: usize = 64;
/// A worker stops after this long without a job.
pub const IDLE_MS: u64 = 1000;
/// Slow agents: a job unacked this long after its delivery goes to another
/// worker (the bus's `--ack-wait 2s`).
pub const CLAIM_MS: u64 = 2000;
/// Slow agents: how long the hung worker holds its job before it exits.
const HANG_MS: u64 = 8000;
const LONG: Duration = Duration::from_secs(1800);

/// The summary keys of a queue run.
pub const QUEUE_KEYS: &[&str] = &[
    "jobs_rate",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "pub_rate",
    "cpu_us_per_job",
    "server_cpu_s",
    "clients_cpu_s",
    "unacked",
];

/// How each system's workers ack, for the summary line.
fn ack_rule(sys: Sys) -> &'static str {
    match sys {
        Sys::RedisStreams => "XREADGROUP COUNT 64, then one XACK of the batch's ids",
        _ => "pull consumer, explicit ack: fetch up to 64, one +ACK per message",
    }
}

/// One queue workload: `--runs` runs, each on a fresh broker.
pub fn queue(sys: Sys, o: &Opts) -> Result<(), PeersError> {
    if !matches!(sys, Sys::RedisStreams | Sys::JetStream) {
        return Err(PeersError::Run(format!("{sys:?} has no work queue")));
    }
    let jobs = match o.rate {
        Some(rate) => (rate * o.duration) as u64,
        None => o.msgs,
    };
    let extra = json!({
        "mode": if o.rate.is_some() { "queue-rate" } else { "queue" },
        "workers": o.subs, "size": o.size, "jobs": jobs, "rate": o.rate,
        "ack": ack_rule(sys), "latency": "producer's stamp before the publish → the worker issues its ack",
    });
    run_all(sys, o, QUEUE_KEYS, extra, |i, b| {
        let (c0, s0) = (children_cpu_s(), b.cpu_s());
        let lat_file = |k: u32| {
            b.dir()
                .join(format!("lat{k}.bin"))
                .to_string_lossy()
                .to_string()
        };
        let worker = if sys == Sys::RedisStreams {
            "xqueue-worker"
        } else {
            "js-queue-worker"
        };
        let mut workers = Vec::new();
        let slow = o.work_ms > 0;
        for k in 0..o.subs {
            // Slow agents: one job at a time, waiting past the claim time
            // for what others hold; the first worker hangs a third of the
            // way in.
            let hang_after = if slow && k == 0 {
                (jobs / (3 * u64::from(o.subs))).max(1)
            } else {
                0
            };
            let f = [
                ("msgs", jobs.to_string()),
                ("size", o.size.to_string()),
                ("name", QUEUE.to_string()),
                ("fetch", if slow { 1 } else { FETCH }.to_string()),
                (
                    "idle-ms",
                    if slow { 2 * CLAIM_MS } else { IDLE_MS }.to_string(),
                ),
                ("latfile", lat_file(k)),
                ("work-ms", o.work_ms.to_string()),
                ("hang-after", hang_after.to_string()),
            ];
            workers.push(Proc::role(&role_args(worker, b, "bench", &f), false)?);
        }
        for w in &mut workers {
            w.ready()?;
        }
        let (_, pub_role, lat_role) = sys.roles();
        let mut f = vec![("size", o.size.to_string())];
        let role = match o.rate {
            Some(rate) => {
                f.push(("rate", rate.to_string()));
                f.push(("duration", o.duration.to_string()));
                lat_role
            }
            None => {
                f.push(("msgs", jobs.to_string()));
                pub_role
            }
        };
        let producer = Proc::role(&role_args(role, b, sys.pub_topic(), &f), false)?.result(LONG)?;
        let results = workers
            .into_iter()
            .map(|w| w.result(LONG))
            .collect::<Result<Vec<_>, _>>()?;
        let cpu = (b.cpu_s() - s0, children_cpu_s() - c0);
        let mut samples: Vec<i64> = (0..o.subs)
            .flat_map(|k| read_samples(Path::new(&lat_file(k))))
            .collect();
        let mut r = queue_result(&producer, &results, &mut samples, jobs, cpu);
        r.insert("unacked".into(), unacked(sys, &b.url()));
        say!(
            "run {i}: {} queue, {} workers, {} B{}: {:.0} jobs/s, acked per worker {}, p50={:.0}us p99={:.0}us \
             pub={:.0}/s lost={} unacked={} cpu/job={:.2}us",
            sys.name(),
            o.subs,
            o.size,
            o.rate.map(|r| format!(" at {r}/s")).unwrap_or_default(),
            fv(&r, "jobs_rate"),
            r["acked_per_worker"],
            fv(&r, "p50_us"),
            fv(&r, "p99_us"),
            fv(&r, "pub_rate"),
            r["lost"],
            r["unacked"],
            fv(&r, "cpu_us_per_job"),
        );
        Ok(r)
    })
}

fn fv(r: &Map<String, Value>, k: &str) -> f64 {
    r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// What one queue run measured, from the producer's and the workers'
/// result lines and the workers' latency samples (ns).
pub fn queue_result(
    producer: &Value,
    workers: &[Value],
    samples: &mut [i64],
    jobs: u64,
    (server, clients): (f64, f64),
) -> Map<String, Value> {
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let start = u(producer, "start_ns");
    let acked: Vec<u64> = workers.iter().map(|w| u(w, "acked")).collect();
    let total: u64 = acked.iter().sum();
    let last = workers
        .iter()
        .map(|w| u(w, "last_ack_ns"))
        .max()
        .unwrap_or(0);
    let secs = |end: u64| end.saturating_sub(start) as f64 / 1e9;
    let mut m = latency_keys(samples, "");
    m.insert("sent".into(), json!(u(producer, "sent")));
    m.insert("acked".into(), json!(total));
    m.insert("acked_per_worker".into(), json!(acked));
    m.insert("lost".into(), json!(jobs as i64 - total as i64));
    m.insert(
        "jobs_rate".into(),
        num(if total > 0 {
            total as f64 / secs(last)
        } else {
            0.0
        }),
    );
    m.insert(
        "pub_rate".into(),
        num(u(producer, "sent") as f64 / secs(u(producer, "end_ns"))),
    );
    m.insert(
        "cpu_us_per_job".into(),
        if total > 0 {
            num((server + clients) / total as f64 * 1e6)
        } else {
            Value::Null
        },
    );
    m.insert("server_cpu_s".into(), num(round3(server)));
    m.insert("clients_cpu_s".into(), num(round3(clients)));
    m
}

/// Jobs the queue still holds unacked after the run (XPENDING of the group;
/// JetStream: ack-pending plus not yet delivered); null if it cannot say.
fn unacked(sys: Sys, url: &str) -> Value {
    let n = match sys {
        Sys::RedisStreams => redis_roles::connect(url, Duration::from_secs(30))
            .and_then(|mut c| {
                let v: redis::Value = redis::cmd("XPENDING")
                    .arg("bench")
                    .arg(QUEUE)
                    .query(&mut c)?;
                Ok(match v {
                    redis::Value::Array(v) => match v.first() {
                        Some(redis::Value::Int(n)) => Some(*n),
                        _ => None,
                    },
                    _ => None,
                })
            })
            .ok()
            .flatten(),
        _ => nats_roles::block_on(async {
            let js = jetstream::new(nats_roles::connect(url).await?);
            let s = js
                .get_stream(STREAM)
                .await
                .map_err(|e| PeersError::Client(format!("nats stream: {e}")))?;
            let mut c: consumer::PullConsumer = s
                .get_consumer(QUEUE)
                .await
                .map_err(|e| PeersError::Client(format!("nats consumer: {e}")))?;
            let i = c
                .info()
                .await
                .map_err(|e| PeersError::Client(format!("nats consumer info: {e}")))?;
            Ok(i.num_ack_pending as i64 + i.num_pending as i64)
        })
        .ok(),
    };
    n.map_or(Value::Null, |n| json!(n))
}

/// A worker's accounting: jobs acked, when the first came and the last ack
/// was issued, and each job's latency (ns).
#[derive(Default)]
struct Worker {
    acked: u64,
    batches: u64,
    first_ns: u64,
    last_ack_ns: u64,
    samples: Vec<i64>,
}

impl Worker {
    /// The acks of jobs sent at `sent` (monotonic ns) were issued now.
    fn acked(&mut self, sent: &[u64]) {
        let t = now_ns();
        if self.acked == 0 {
            self.first_ns = t;
        }
        self.last_ack_ns = t;
        self.acked += sent.len() as u64;
        self.batches += 1;
        self.samples
            .extend(sent.iter().map(|s| t.saturating_sub(*s) as i64));
    }

    fn finish(self, a: &RoleArgs, extra: Value) -> Result<Value, PeersError> {
        write_samples(a.latfile.as_deref(), &self.samples)?;
        let mut v = json!({
            "role": "worker", "acked": self.acked, "batches": self.batches,
            "first_ns": self.first_ns, "last_ack_ns": self.last_ack_ns,
        });
        stats::merge(&mut v, extra);
        Ok(v)
    }
}

/// The send time a payload carries (0 without a header).
fn sent_of(payload: &[u8]) -> u64 {
    header(payload).map_or(0, |(_, sent)| sent)
}

/// Runs a worker role.
pub fn run_worker(a: &RoleArgs) -> Result<Value, PeersError> {
    match a.kind {
        RoleKind::XqueueWorker => redis_worker(a),
        RoleKind::JsQueueWorker => nats_roles::block_on(js_worker(a)),
        _ => Err(PeersError::Run(format!(
            "{:?} is not a queue worker",
            a.kind
        ))),
    }
}

/// A consumer of group `--name`: XREADGROUP COUNT --fetch BLOCK --idle-ms,
/// then one XACK of the batch, until a read times out (or --msgs acked).
fn redis_worker(a: &RoleArgs) -> Result<Value, PeersError> {
    let mut con = redis_roles::connect(&a.url, Duration::from_millis(a.idle_ms + 30_000))?;
    let created: Result<redis::Value, _> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&a.topic)
        .arg(&a.name)
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut con);
    if let Err(e) = created {
        if e.code() != Some("BUSYGROUP") {
            return Err(e.into());
        }
    }
    let me = format!("w{}", std::process::id());
    print_ready();
    let mut w = Worker::default();
    let (mut ids, mut sent) = (Vec::new(), Vec::new());
    let slow = a.work_ms > 0;
    let mut idle_since = std::time::Instant::now();
    while w.acked < a.msgs {
        // Slow agents: what another worker left unacked past the claim
        // time first (XAUTOCLAIM), as a user of consumer groups does.
        if slow {
            let claimed: redis::Value = redis::cmd("XAUTOCLAIM")
                .arg(&a.topic)
                .arg(&a.name)
                .arg(&me)
                .arg(CLAIM_MS)
                .arg("0-0")
                .arg("COUNT")
                .arg(1)
                .query(&mut con)?;
            let wrapped = redis::Value::Array(vec![claimed]);
            let got: Vec<(Vec<u8>, u64)> = entries_of(&wrapped)
                .unwrap_or_default()
                .into_iter()
                .map(|(id, p)| (id.to_vec(), sent_of(p)))
                .collect();
            if let Some((id, s)) = got.into_iter().next() {
                std::thread::sleep(Duration::from_millis(a.work_ms));
                let _: i64 = redis::cmd("XACK")
                    .arg(&a.topic)
                    .arg(&a.name)
                    .arg(&id)
                    .query(&mut con)?;
                w.acked(&[s]);
                idle_since = std::time::Instant::now();
                continue;
            }
        }
        // Slow agents block briefly, to look for claimable jobs again.
        let block = if slow { 100 } else { a.idle_ms };
        let reply: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&a.name)
            .arg(&me)
            .arg("COUNT")
            .arg(a.fetch)
            .arg("BLOCK")
            .arg(block)
            .arg("STREAMS")
            .arg(&a.topic)
            .arg(">")
            .query(&mut con)?;
        let Some(entries) = entries_of(&reply) else {
            if slow && idle_since.elapsed() < Duration::from_millis(a.idle_ms) {
                continue;
            }
            break;
        };
        idle_since = std::time::Instant::now();
        if entries.is_empty() {
            continue;
        }
        ids.clear();
        sent.clear();
        for (id, payload) in entries {
            ids.push(id.to_vec());
            sent.push(sent_of(payload));
        }
        if a.hang_after > 0 && w.acked >= a.hang_after {
            // Hung with its job: never acked; another claims it.
            std::thread::sleep(Duration::from_millis(HANG_MS));
            break;
        }
        if slow {
            std::thread::sleep(Duration::from_millis(a.work_ms * ids.len() as u64));
        }
        w.acked(&sent);
        let n: i64 = redis::cmd("XACK")
            .arg(&a.topic)
            .arg(&a.name)
            .arg(&ids)
            .query(&mut con)?;
        if n != ids.len() as i64 {
            return Err(PeersError::Run(format!(
                "XACK acked {n} of {} ids",
                ids.len()
            )));
        }
    }
    w.finish(a, json!({"consumer": me}))
}

/// A fetcher of the durable pull consumer `--name` (explicit acks): fetch
/// up to --fetch, ack each message, until a fetch comes back empty after
/// --idle-ms (or --msgs acked).
async fn js_worker(a: &RoleArgs) -> Result<Value, PeersError> {
    let client = nats_roles::connect(&a.url).await?;
    let js = jetstream::new(client.clone());
    let err = |what: &'static str| {
        move |e: &dyn std::fmt::Display| PeersError::Client(format!("nats {what}: {e}"))
    };
    let s = js
        .get_stream(STREAM)
        .await
        .map_err(|e| err("get stream")(&e))?;
    let slow = a.work_ms > 0;
    let mut cfg = consumer::pull::Config {
        durable_name: Some(a.name.clone()),
        deliver_policy: consumer::DeliverPolicy::All,
        ack_policy: consumer::AckPolicy::Explicit,
        ..Default::default()
    };
    if slow {
        // Slow agents: a job unacked past AckWait goes to another fetcher.
        cfg.ack_wait = Duration::from_millis(CLAIM_MS);
    }
    let c: consumer::PullConsumer = s
        .get_or_create_consumer(&a.name, cfg)
        .await
        .map_err(|e| err("create consumer")(&e))?;
    print_ready();
    let mut w = Worker::default();
    let idle = Duration::from_millis(a.idle_ms.max(1));
    while w.acked < a.msgs {
        let mut batch = c
            .batch()
            .max_messages(a.fetch.max(1))
            .expires(idle)
            .messages()
            .await
            .map_err(|e| err("fetch")(&e))?;
        let mut got = false;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| err("fetch")(&e))?;
            let sent = sent_of(&m.payload);
            if a.hang_after > 0 && w.acked >= a.hang_after {
                // Hung with its job: never acked; AckWait gives it to
                // another fetcher.
                tokio::time::sleep(Duration::from_millis(HANG_MS)).await;
                client.flush().await.map_err(|e| err("flush")(&e))?;
                return w.finish(a, json!({"ack_policy": "explicit", "hung": true}));
            }
            if slow {
                tokio::time::sleep(Duration::from_millis(a.work_ms)).await;
            }
            m.ack().await.map_err(|e| err("ack")(&e))?;
            w.acked(&[sent]);
            got = true;
        }
        if !got {
            break;
        }
    }
    client.flush().await.map_err(|e| err("flush")(&e))?;
    w.finish(a, json!({"ack_policy": "explicit"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_run_counts_acks_rate_and_loss() {
        let producer =
            json!({"sent": 100, "start_ns": 1_000_000_000u64, "end_ns": 1_250_000_000u64});
        let workers = [
            json!({"acked": 60, "last_ack_ns": 1_400_000_000u64}),
            json!({"acked": 38, "last_ack_ns": 1_500_000_000u64}),
        ];
        let mut samples = vec![3000, 1000, 2000];
        let r = queue_result(&producer, &workers, &mut samples, 100, (0.001, 0.000_96));
        assert_eq!(r["acked"], 98);
        assert_eq!(r["acked_per_worker"], json!([60, 38]));
        assert_eq!(r["lost"], 2);
        assert_eq!(r["jobs_rate"], 196.0);
        assert_eq!(r["pub_rate"], 400.0);
        assert_eq!(r["p50_us"], 2.0);
        assert_eq!(r["cpu_us_per_job"], 20.0);
    }

    #[test]
    fn a_worker_notes_each_jobs_latency_at_its_ack() {
        let mut w = Worker::default();
        let before = now_ns();
        w.acked(&[before - 5_000, before - 1_000]);
        w.acked(&[before]);
        assert_eq!((w.acked, w.batches), (3, 2));
        assert!(w.first_ns >= before && w.last_ack_ns >= w.first_ns);
        assert_eq!(w.samples.len(), 3);
        assert!(w.samples[0] >= 5_000 && w.samples[1] >= 1_000 && w.samples[2] >= 0);
        let mut p = stats::new_payload(32);
        stats::stamp(&mut p, 4, 77);
        assert_eq!((sent_of(&p), sent_of(b"short")), (77, 0));
    }
}
