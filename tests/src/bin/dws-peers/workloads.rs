//! The workloads: what runs in a run, how its numbers are computed, the line
//! per run and the final JSON summary line (printed last on stdout).

use crate::nats_roles::{js_check, js_setup, JS_SUBJECT};
use crate::procs::{children_cpu_s, now_ns, Proc};
use crate::role::{read_samples, Pacer};
use crate::server::{dir_bytes, fs_of, require, version, Broker, Kind, JS_LAZY_NOTE};
use crate::stats::{self, fanout_result, latency_keys, num, round3, split, summarize};
use crate::{Opts, PeersError};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::Duration;

/// The system a workload measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sys {
    Redis,
    Nats,
    RedisStreams,
    JetStream,
}

impl Sys {
    pub fn name(self) -> &'static str {
        match self {
            Sys::Redis => "redis",
            Sys::Nats => "nats",
            Sys::RedisStreams => "redis-streams",
            Sys::JetStream => "jetstream",
        }
    }

    fn kind(self) -> Kind {
        match self {
            Sys::Redis => Kind::Redis,
            Sys::Nats => Kind::Nats,
            Sys::RedisStreams => Kind::RedisAof,
            Sys::JetStream => Kind::JetStream,
        }
    }

    fn durable(self) -> bool {
        matches!(self, Sys::RedisStreams | Sys::JetStream)
    }

    /// (subscriber role, publisher role, fixed-rate publisher role).
    pub fn roles(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Sys::Redis => ("redis-sub", "redis-pub", "redis-latpub"),
            Sys::Nats => ("nats-sub", "nats-pub", "nats-pub"),
            Sys::RedisStreams => ("xread-sub", "xadd-pub", "xadd-latpub"),
            Sys::JetStream => ("js-sub", "js-pub", "js-latpub"),
        }
    }

    pub fn pub_topic(self) -> &'static str {
        if self == Sys::JetStream {
            JS_SUBJECT
        } else {
            "bench"
        }
    }
}

const LONG: Duration = Duration::from_secs(1800);

/// `role` arguments: the kind, the broker's URL and `--flag value` pairs.
pub fn role_args(kind: &str, b: &Broker, topic: &str, flags: &[(&str, String)]) -> Vec<String> {
    let mut v = vec![
        kind.to_string(),
        "--url".into(),
        b.url(),
        "--topic".into(),
        topic.into(),
    ];
    for (k, val) in flags {
        v.push(format!("--{k}"));
        if !val.is_empty() {
            v.push(val.clone());
        }
    }
    v
}

/// Stored messages after a durable run (XLEN / stream msgs).
fn stored(sys: Sys, b: &Broker) -> Result<u64, PeersError> {
    match sys {
        Sys::RedisStreams => {
            let mut c = crate::redis_roles::connect(&b.url(), Duration::from_secs(30))?;
            Ok(redis::cmd("XLEN").arg("bench").query::<u64>(&mut c)?)
        }
        Sys::JetStream => Ok(js_check(&b.url())?["msgs"].as_u64().unwrap_or(0)),
        Sys::Redis | Sys::Nats => Ok(0),
    }
}

fn start(sys: Sys, o: &Opts) -> Result<Broker, PeersError> {
    let b = Broker::start(sys.kind(), o.dir.as_deref())?;
    if sys == Sys::JetStream {
        js_setup(&b.url())?;
    }
    Ok(b)
}

/// `--runs` runs of one workload, each against a fresh broker (`one` gets
/// the run's index and the broker, and returns the run's numbers), then the
/// summary line with `keys` and `extra`.
pub fn run_all(
    sys: Sys,
    o: &Opts,
    keys: &[&str],
    extra: Value,
    mut one: impl FnMut(u32, &Broker) -> Result<Map<String, Value>, PeersError>,
) -> Result<(), PeersError> {
    require(sys.kind().program())?;
    let mut runs = Vec::new();
    let mut durability = Value::Null;
    for i in 0..o.runs {
        let b = start(sys, o)?;
        durability = b.durability();
        let r = one(i, &b)?;
        drop(b);
        runs.push(Value::Object(r));
    }
    emit(sys, &runs, keys, durability, extra);
    Ok(())
}

/// One publisher → N subscriber processes; `--msgs` each.
pub fn fanout(sys: Sys, o: &Opts) -> Result<(), PeersError> {
    let extra = json!({"mode": "fanout", "subs": o.subs, "size": o.size, "msgs": o.msgs});
    run_all(sys, o, stats::FANOUT_KEYS, extra, |i, b| {
        let (sub_role, pub_role, _) = sys.roles();
        let (c0, s0) = (children_cpu_s(), b.cpu_s());
        let mut subs = Vec::new();
        for k in 0..o.subs {
            let f = [
                ("msgs", o.msgs.to_string()),
                ("size", o.size.to_string()),
                ("name", format!("g{k}")),
            ];
            subs.push(Proc::role(&role_args(sub_role, b, "bench", &f), false)?);
        }
        for s in &mut subs {
            s.ready()?;
        }
        let f = [("msgs", o.msgs.to_string()), ("size", o.size.to_string())];
        let publisher =
            Proc::role(&role_args(pub_role, b, sys.pub_topic(), &f), false)?.result(LONG)?;
        // Reaped first (the subscribers are still running or unreaped), so
        // the children's CPU so far is the publisher's.
        let c1 = children_cpu_s();
        let results = subs
            .into_iter()
            .map(|s| s.result(LONG))
            .collect::<Result<Vec<_>, _>>()?;
        let cpu = stats::FanoutCpu {
            server: b.cpu_s() - s0,
            publisher: c1 - c0,
            subscribers: children_cpu_s() - c1,
        };
        let mut r = fanout_result(&publisher, &results, o.msgs, o.size as usize, cpu);
        if sys.durable() {
            r.insert("stored".into(), json!(stored(sys, b)?));
            r.insert("store_bytes".into(), json!(dir_bytes(&b.data_dir())));
        }
        say!(
            "run {i}: {} N={} {} B: total={:.0} deliveries/s per-sub median={:.0} min={:.0} pub={:.0} msg/s lost={} \
             gaps={} reordered={}{} recv={} cpu/delivery={:.2}us",
            sys.name(),
            o.subs,
            o.size,
            fv(&r, "total_rate"),
            fv(&r, "per_sub_rate_median"),
            fv(&r, "per_sub_rate_min"),
            fv(&r, "pub_rate"),
            r["lost"],
            r["gaps"],
            r["reordered_or_dup"],
            r.get("unacked").map(|u| format!(" unacked={u}")).unwrap_or_default(),
            r["recv_per_sub"],
            fv(&r, "cpu_us_per_delivery"),
        );
        Ok(r)
    })
}

/// Redis pub/sub at a fixed rate: latency publish → each subscriber.
pub fn redis_latency(o: &Opts) -> Result<(), PeersError> {
    let rate = o.rate.unwrap_or(2000.0);
    let expected = (rate * o.duration) as u64;
    let extra = json!({"mode": "latency", "subs": o.subs, "size": o.size, "rate": rate, "duration": o.duration});
    run_all(Sys::Redis, o, stats::LATENCY_KEYS, extra, |i, b| {
        let flags = |lat: String| {
            [
                ("size", o.size.to_string()),
                ("rate", rate.to_string()),
                ("duration", o.duration.to_string()),
                ("latfile", lat),
            ]
        };
        let lat_file = |k: u32| {
            b.dir()
                .join(format!("lat{k}.bin"))
                .to_string_lossy()
                .to_string()
        };
        let mut subs = Vec::new();
        for k in 0..o.subs {
            subs.push(Proc::role(
                &role_args("redis-latsub", b, "bench", &flags(lat_file(k))),
                false,
            )?);
        }
        for s in &mut subs {
            s.ready()?;
        }
        let pub_lat = b.dir().join("latpub.bin").to_string_lossy().to_string();
        let publisher = Proc::role(
            &role_args("redis-latpub", b, "bench", &flags(pub_lat)),
            false,
        )?
        .result(LONG)?;
        let results = subs
            .into_iter()
            .map(|s| s.result(LONG))
            .collect::<Result<Vec<_>, _>>()?;
        let mut samples: Vec<i64> = (0..o.subs)
            .flat_map(|k| read_samples(Path::new(&lat_file(k))))
            .collect();
        let delivered: u64 = results.iter().filter_map(|s| s["recv"].as_u64()).sum();
        let mut r = latency_keys(&mut samples, "");
        r.insert("sent".into(), publisher["sent"].clone());
        r.insert(
            "lost".into(),
            json!((u64::from(o.subs) * expected) as i64 - delivered as i64),
        );
        say!(
            "run {i}: redis {rate}/s x {}s, {} subs: p50={:.1}us p99={:.1}us max={:.1}us samples={} lost={}",
            o.duration, o.subs, fv(&r, "p50_us"), fv(&r, "p99_us"), fv(&r, "max_us"), r["samples"], r["lost"]
        );
        Ok(r)
    })
}

/// Durable publishes: --pubs publishers started together (no consumers), or
/// with --rate one publisher, one publish at a time.
pub fn publish(sys: Sys, o: &Opts) -> Result<(), PeersError> {
    let (keys, extra) = match o.rate {
        Some(rate) => (
            stats::RATE_KEYS,
            json!({"mode": "rate", "rate": rate, "duration": o.duration, "size": o.size}),
        ),
        None => (
            stats::PUBLISH_KEYS,
            json!({"mode": "publish", "pubs": o.pubs, "size": o.size, "msgs": o.msgs}),
        ),
    };
    run_all(sys, o, keys, extra, |i, b| {
        let (c0, s0) = (children_cpu_s(), b.cpu_s());
        let lat_file = |k: u32| {
            b.dir()
                .join(format!("lat{k}.bin"))
                .to_string_lossy()
                .to_string()
        };
        let (_, pub_role, lat_role) = sys.roles();
        let mut r = if let Some(rate) = o.rate {
            let f = [
                ("size", o.size.to_string()),
                ("rate", rate.to_string()),
                ("duration", o.duration.to_string()),
                ("latfile", lat_file(0)),
            ];
            let p =
                Proc::role(&role_args(lat_role, b, sys.pub_topic(), &f), false)?.result(LONG)?;
            let mut r = latency_keys(&mut read_samples(Path::new(&lat_file(0))), "");
            let u = |k: &str| p[k].as_u64().unwrap_or(0);
            let expected = (rate * o.duration) as u64;
            let stored = stored(sys, b)?;
            r.insert("sent".into(), json!(u("sent")));
            r.insert("stored".into(), json!(stored));
            r.insert("lost".into(), json!(expected as i64 - stored as i64));
            let secs = u("end_ns").saturating_sub(u("start_ns")) as f64 / 1e9;
            r.insert("achieved_rate".into(), num(u("sent") as f64 / secs));
            r.insert("late_sends".into(), json!(u("late")));
            r.insert("max_lag_us".into(), p["max_lag_us"].clone());
            r
        } else {
            let mut procs = Vec::new();
            for (k, share) in split(o.msgs, o.pubs as usize).into_iter().enumerate() {
                let f = [
                    ("msgs", share.to_string()),
                    ("size", o.size.to_string()),
                    ("latfile", lat_file(k as u32)),
                    ("wait-go", String::new()),
                ];
                procs.push(Proc::role(
                    &role_args(pub_role, b, sys.pub_topic(), &f),
                    true,
                )?);
            }
            for p in &mut procs {
                p.ready()?;
            }
            for p in &mut procs {
                p.go()?;
            }
            let res = procs
                .into_iter()
                .map(|p| p.result(LONG))
                .collect::<Result<Vec<_>, _>>()?;
            let mut samples: Vec<i64> = (0..o.pubs)
                .flat_map(|k| read_samples(Path::new(&lat_file(k))))
                .collect();
            let stored = stored(sys, b)?;
            let cpu = (b.cpu_s() - s0, children_cpu_s() - c0);
            publish_result(&res, &mut samples, stored, o, cpu, dir_bytes(&b.data_dir()))
        };
        if o.rate.is_some() {
            say!(
                "run {i}: {} {}/s x {}s one at a time: p50={:.1}us p99={:.1}us max={:.1}us achieved={:.0}/s late={} \
                 stored={} lost={}",
                sys.name(), o.rate.unwrap_or(0.0), o.duration, fv(&r, "p50_us"), fv(&r, "p99_us"), fv(&r, "max_us"),
                fv(&r, "achieved_rate"), r["late_sends"], r["stored"], r["lost"]
            );
        } else {
            r.insert("pubs".into(), json!(o.pubs));
            say!(
                "run {i}: {} pubs={}: {:.0} acked publishes/s ({:.1} MiB/s) ack p50={:.0}us p99={:.0}us (per {}) \
                 stored={} lost={} cpu/publish={:.2}us",
                sys.name(), o.pubs, fv(&r, "publish_rate"), fv(&r, "MiBps"), fv(&r, "ack_p50_us"), fv(&r, "ack_p99_us"),
                if sys == Sys::RedisStreams { "pipelined batch of 64" } else { "message" },
                r["stored"], r["lost"], fv(&r, "cpu_us_per_publish")
            );
        }
        Ok(r)
    })
}

/// Throughput publish numbers from the publishers' result lines.
fn publish_result(
    res: &[Value],
    samples: &mut [i64],
    stored: u64,
    o: &Opts,
    (server, clients): (f64, f64),
    store: u64,
) -> Map<String, Value> {
    let u = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let sent: u64 = res.iter().map(|r| u(r, "sent")).sum();
    let first = res.iter().map(|r| u(r, "start_ns")).min().unwrap_or(0);
    let last = res.iter().map(|r| u(r, "end_ns")).max().unwrap_or(0);
    let span = last.saturating_sub(first) as f64 / 1e9;
    let mut r = latency_keys(samples, "ack_");
    r.insert("sent".into(), json!(sent));
    r.insert("stored".into(), json!(stored));
    r.insert("lost".into(), json!(o.msgs as i64 - stored as i64));
    r.insert("publish_rate".into(), num(sent as f64 / span));
    r.insert(
        "MiBps".into(),
        num((sent * o.size) as f64 / span / 1048576.0),
    );
    r.insert(
        "cpu_us_per_publish".into(),
        if sent > 0 {
            num((server + clients) / sent as f64 * 1e6)
        } else {
            Value::Null
        },
    );
    r.insert("server_cpu_s".into(), num(round3(server)));
    r.insert("clients_cpu_s".into(), num(round3(clients)));
    r.insert("store_bytes".into(), json!(store));
    r.insert(
        "store_bytes_per_msg".into(),
        if stored > 0 {
            num(store as f64 / stored as f64)
        } else {
            Value::Null
        },
    );
    let errors: u64 = res.iter().map(|r| u(r, "ack_errors")).sum();
    r.insert("ack_errors".into(), json!(errors));
    r
}

/// Raw fdatasync: --size byte appends to a file in --dir at --rate (default
/// 1000/s) for --duration, each followed by fdatasync; p50/p99/max of write +
/// fdatasync.
pub fn fdatasync(o: &Opts) -> Result<(), PeersError> {
    use std::io::Write;
    let rate = o.rate.unwrap_or(1000.0);
    let mut runs = Vec::new();
    let mut where_ = String::new();
    for i in 0..o.runs {
        let dir = match o.dir.as_deref() {
            Some(d) => tempfile::Builder::new().prefix("peers-").tempdir_in(d),
            None => tempfile::Builder::new().prefix("peers-").tempdir(),
        }
        .map_err(|e| PeersError::io("create a temp dir", e))?;
        where_ = fs_of(dir.path());
        let path = dir.path().join("append.log");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| PeersError::io("open the append file", e))?;
        let mut buf = stats::new_payload(o.size as usize);
        let total = (rate * o.duration) as u64;
        let mut samples = Vec::with_capacity(total as usize);
        let mut pace = Pacer::new(total, rate);
        while let Some(t) = pace.tick(&mut buf) {
            file.write_all(&buf)
                .map_err(|e| PeersError::io("append", e))?;
            file.sync_data()
                .map_err(|e| PeersError::io("fdatasync", e))?;
            samples.push(now_ns().saturating_sub(t) as i64);
        }
        let end = now_ns();
        let mut r = latency_keys(&mut samples, "");
        r.insert("lost".into(), json!(0));
        r.insert(
            "achieved_rate".into(),
            num(total as f64 / (end.saturating_sub(pace.start_ns()) as f64 / 1e9)),
        );
        let lag = pace.lag;
        r.insert("late_sends".into(), json!(lag.late));
        say!(
            "run {i}: fdatasync of {} B appends at {rate}/s x {}s on {where_}: p50={:.1}us p99={:.1}us max={:.1}us \
             late={}",
            o.size, o.duration, fv(&r, "p50_us"), fv(&r, "p99_us"), fv(&r, "max_us"), lag.late
        );
        runs.push(Value::Object(r));
    }
    let out = json!({
        "system": "fdatasync", "version": where_, "mode": "rate", "rate": rate, "duration": o.duration,
        "size": o.size, "summary": summarize(&runs, stats::RATE_KEYS),
    });
    say!("{out}");
    Ok(())
}

fn fv(r: &Map<String, Value>, k: &str) -> f64 {
    r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// Prints the final JSON line (after, for a durable peer, what "durable" means).
fn emit(sys: Sys, runs: &[Value], keys: &[&str], durability: Value, extra: Value) {
    let ver = version(sys.kind().program());
    if sys.durable() {
        say!(
            "{} ({ver}): durable means: {}",
            sys.name(),
            durability["durable_means"].as_str().unwrap_or("")
        );
        say!(
            "server arguments: {}",
            durability["server_args"].as_str().unwrap_or("")
        );
        say!("data on: {}", durability["data_fs"].as_str().unwrap_or("?"));
    } else {
        say!("{} ({ver})", sys.name());
    }
    let mut out = json!({"system": sys.name(), "version": ver});
    stats::merge(&mut out, extra);
    if sys.durable() {
        out["fsync"] = json!(if sys == Sys::RedisStreams {
            "always"
        } else {
            "default"
        });
        out["durability"] = durability;
        if sys == Sys::JetStream {
            out["note"] = json!(JS_LAZY_NOTE);
        }
    }
    out["summary"] = summarize(runs, keys);
    say!("{out}");
}
