//! Pure arithmetic of dws-peers: the payload layout, a subscriber's
//! accounting, percentiles, and the median/min/max summary the last JSON line
//! carries (the same keys as the reference harness: fan-out, latency,
//! publish and fixed-rate publish runs).

use serde_json::{json, Map, Value};

/// Bytes 0..8: sequence number; 8..16: CLOCK_MONOTONIC send time in ns (both
/// little endian); the rest is filler.
pub const HEADER: usize = 16;

/// A payload of `size` bytes (at least [`HEADER`]) with the filler written.
pub fn new_payload(size: usize) -> Vec<u8> {
    let size = size.max(HEADER);
    (0..size)
        .map(|i| if i < HEADER { 0 } else { b'a' + (i % 26) as u8 })
        .collect()
}

/// Stamps sequence and send time into a payload made by [`new_payload`].
pub fn stamp(buf: &mut [u8], seq: u64, sent_ns: u64) {
    if buf.len() >= HEADER {
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        buf[8..16].copy_from_slice(&sent_ns.to_le_bytes());
    }
}

/// Sequence number and send time of a payload, if it has a header.
pub fn header(p: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_le_bytes(p.get(..8)?.try_into().ok()?);
    let sent = u64::from_le_bytes(p.get(8..16)?.try_into().ok()?);
    Some((seq, sent))
}

/// One subscriber's accounting (as the reference clients': gaps by sequence,
/// reorders, first and last receive time, latency samples if asked).
#[derive(Debug, Default)]
pub struct SubStats {
    pub recv: u64,
    pub gaps: u64,
    pub reordered: u64,
    pub bytes: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    next_seq: u64,
    pub samples: Option<Vec<i64>>,
}

impl SubStats {
    pub fn new(latency: bool) -> SubStats {
        SubStats {
            samples: latency.then(Vec::new),
            ..SubStats::default()
        }
    }

    /// Counts one message received at `now_ns`.
    pub fn add(&mut self, payload: &[u8], now_ns: u64) {
        if self.recv == 0 {
            self.first_ns = now_ns;
        }
        self.last_ns = now_ns;
        self.recv += 1;
        self.bytes += payload.len() as u64;
        if let Some((seq, sent)) = header(payload) {
            if seq > self.next_seq {
                self.gaps += seq - self.next_seq;
            } else if seq < self.next_seq {
                self.reordered += 1;
            }
            self.next_seq = seq.saturating_add(1);
            if let Some(s) = self.samples.as_mut() {
                s.push(now_ns.wrapping_sub(sent) as i64);
            }
        }
    }

    /// The subscriber's JSON result line (`extra` members appended).
    pub fn to_json(&self, extra: Value) -> Value {
        let mut v = json!({
            "role": "sub", "recv": self.recv, "gaps": self.gaps, "reordered": self.reordered,
            "bytes": self.bytes, "first_ns": self.first_ns, "last_ns": self.last_ns,
            "client_dropped": 0,
        });
        merge(&mut v, extra);
        v
    }
}

/// Adds the members of object `extra` to object `v`.
pub fn merge(v: &mut Value, extra: Value) {
    if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
        m.extend(e);
    }
}

/// The q-quantile of sorted ns samples, in µs (the reference's index rule:
/// `s[min(n-1, floor(q*n))]`); NaN when empty.
pub fn pct_us(sorted: &[i64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64) as usize).min(sorted.len() - 1);
    sorted[i] as f64 / 1e3
}

/// p50/p99/p99.9/max of ns samples, in µs, under `prefix` (`""` or `"ack_"`).
pub fn latency_keys(samples: &mut [i64], prefix: &str) -> Map<String, Value> {
    samples.sort_unstable();
    let mut m = Map::new();
    m.insert("samples".into(), json!(samples.len()));
    for (k, q) in [("p50_us", 0.50), ("p99_us", 0.99), ("p999_us", 0.999)] {
        m.insert(format!("{prefix}{k}"), num(pct_us(samples, q)));
    }
    let max = samples.last().map_or(f64::NAN, |&x| x as f64 / 1e3);
    m.insert(format!("{prefix}max_us"), num(max));
    m
}

/// A JSON number, or null for NaN/infinity (JSON has neither).
pub fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// Median of a non-empty list (mean of the middle two when even, as Python's).
pub fn median(vals: &[f64]) -> f64 {
    let mut v = vals.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `{key: {median, min, max}}` over the runs that have a numeric `key`, plus
/// `lost_per_run` (each run's `lost`).
pub fn summarize(runs: &[Value], keys: &[&str]) -> Value {
    let mut out = Map::new();
    for k in keys {
        let vals: Vec<f64> = runs.iter().filter_map(|r| r.get(*k)?.as_f64()).collect();
        if vals.is_empty() {
            continue;
        }
        let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
        let max = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out.insert(
            (*k).into(),
            json!({"median": num(median(&vals)), "min": num(min), "max": num(max)}),
        );
    }
    let lost: Vec<Value> = runs
        .iter()
        .map(|r| r.get("lost").cloned().unwrap_or(Value::Null))
        .collect();
    out.insert("lost_per_run".into(), Value::Array(lost));
    Value::Object(out)
}

/// Fan-out summary keys (`per_sub_rate` is the median subscriber's rate).
pub const FANOUT_KEYS: &[&str] = &[
    "total_rate",
    "per_sub_rate",
    "per_sub_rate_median",
    "per_sub_rate_min",
    "total_MBps",
    "pub_rate",
    "cpu_us_per_delivery",
    "broker_subs_cpu_us_per_delivery",
    "server_cpu_us_per_delivery",
    "server_cpu_s",
    "clients_cpu_s",
    "pub_cpu_s",
    "subs_cpu_s",
    "unacked",
];
pub const LATENCY_KEYS: &[&str] = &["p50_us", "p99_us", "p999_us", "max_us"];
pub const PUBLISH_KEYS: &[&str] = &[
    "publish_rate",
    "MiBps",
    "ack_p50_us",
    "ack_p99_us",
    "ack_p999_us",
    "ack_max_us",
    "cpu_us_per_publish",
    "server_cpu_s",
    "clients_cpu_s",
    "store_bytes_per_msg",
];
pub const RATE_KEYS: &[&str] = &[
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "achieved_rate",
    "late_sends",
];

/// The CPU seconds of one fan-out run: the broker's, the publisher
/// process's and the subscriber processes' together.
#[derive(Clone, Copy, Debug, Default)]
pub struct FanoutCpu {
    pub server: f64,
    pub publisher: f64,
    pub subscribers: f64,
}

/// What one fan-out run measured, from the publisher's and the subscribers'
/// result lines: rates over (last receive − publisher start), loss against
/// `expected_per_sub`, CPU µs per delivery: broker plus every client
/// (`cpu_us_per_delivery`), broker plus the subscribers, the publisher left
/// out (`broker_subs_cpu_us_per_delivery`), and the broker alone
/// (`server_cpu_us_per_delivery`).
pub fn fanout_result(
    publisher: &Value,
    subs: &[Value],
    expected_per_sub: u64,
    size: usize,
    cpu: FanoutCpu,
) -> Map<String, Value> {
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let start = u(publisher, "start_ns");
    let secs = |end: u64| end.saturating_sub(start) as f64 / 1e9;
    let delivered: u64 = subs.iter().map(|s| u(s, "recv")).sum();
    let got: Vec<&Value> = subs.iter().filter(|s| u(s, "recv") > 0).collect();
    let per_sub: Vec<f64> = got
        .iter()
        .map(|s| u(s, "recv") as f64 / secs(u(s, "last_ns")))
        .collect();
    let span = got.iter().map(|s| u(s, "last_ns")).max().map(secs);
    let (server, clients) = (cpu.server, cpu.publisher + cpu.subscribers);
    let mut m = Map::new();
    m.insert("sent".into(), json!(u(publisher, "sent")));
    m.insert(
        "recv_per_sub".into(),
        json!(subs.iter().map(|s| u(s, "recv")).collect::<Vec<_>>()),
    );
    let lost = (subs.len() as u64 * expected_per_sub) as i64 - delivered as i64;
    m.insert("lost".into(), json!(lost));
    m.insert(
        "gaps".into(),
        json!(subs.iter().map(|s| u(s, "gaps")).sum::<u64>()),
    );
    m.insert(
        "reordered_or_dup".into(),
        json!(subs.iter().map(|s| u(s, "reordered")).sum::<u64>()),
    );
    m.insert(
        "pub_rate".into(),
        num(u(publisher, "sent") as f64 / secs(u(publisher, "end_ns"))),
    );
    let med = if per_sub.is_empty() {
        0.0
    } else {
        median(&per_sub)
    };
    m.insert("per_sub_rate".into(), num(med));
    m.insert("per_sub_rate_median".into(), num(med));
    m.insert(
        "per_sub_rate_min".into(),
        num(per_sub
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
            .min(med)),
    );
    m.insert(
        "total_rate".into(),
        num(span.map_or(0.0, |s| delivered as f64 / s)),
    );
    m.insert(
        "total_MBps".into(),
        num(span.map_or(0.0, |s| (delivered * size as u64) as f64 / s / 1e6)),
    );
    let per = |s: f64| {
        if delivered > 0 {
            num(s / delivered as f64 * 1e6)
        } else {
            Value::Null
        }
    };
    m.insert("cpu_us_per_delivery".into(), per(server + clients));
    m.insert(
        "broker_subs_cpu_us_per_delivery".into(),
        per(server + cpu.subscribers),
    );
    m.insert("server_cpu_us_per_delivery".into(), per(server));
    m.insert("server_cpu_s".into(), num(round3(server)));
    m.insert("clients_cpu_s".into(), num(round3(clients)));
    m.insert("pub_cpu_s".into(), num(round3(cpu.publisher)));
    m.insert("subs_cpu_s".into(), num(round3(cpu.subscribers)));
    let pend: Vec<i64> = subs
        .iter()
        .filter_map(|s| s.get("pending_after")?.as_i64())
        .collect();
    if pend.len() == subs.len() && !pend.is_empty() {
        let unacked = if pend.iter().any(|&p| p < 0) {
            Value::Null
        } else {
            json!(pend.iter().sum::<i64>())
        };
        m.insert("unacked".into(), unacked);
    }
    m
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Sizes of P publishers' shares of `msgs` (the first ones take the remainder).
pub fn split(msgs: u64, pubs: usize) -> Vec<u64> {
    let p = pubs.max(1) as u64;
    (0..p).map(|i| msgs / p + u64::from(i < msgs % p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_its_header_and_fills_the_rest() {
        let mut p = new_payload(40);
        stamp(&mut p, 7, 123_456);
        assert_eq!(header(&p), Some((7, 123_456)));
        assert_eq!(p[16], b'q');
        assert_eq!(header(&p[..10]), None);
        assert_eq!(new_payload(3).len(), HEADER);
    }

    #[test]
    fn sub_stats_count_gaps_reorders_and_latency() {
        let mut s = SubStats::new(true);
        for (seq, now) in [(0u64, 100u64), (1, 200), (4, 300), (2, 400)] {
            let mut p = new_payload(16);
            stamp(&mut p, seq, 50);
            s.add(&p, now);
        }
        assert_eq!((s.recv, s.gaps, s.reordered), (4, 2, 1));
        assert_eq!((s.first_ns, s.last_ns), (100, 400));
        assert_eq!(s.samples.as_deref(), Some(&[50, 150, 250, 350][..]));
        assert_eq!(s.to_json(json!({"x": 1}))["x"], 1);
    }

    #[test]
    fn median_and_percentiles_follow_the_reference() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let s: Vec<i64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(pct_us(&s, 0.5), 51.0);
        assert_eq!(pct_us(&s, 0.99), 100.0);
        assert!(pct_us(&[], 0.5).is_nan());
        let mut v = vec![3000, 1000, 2000];
        let m = latency_keys(&mut v, "ack_");
        assert_eq!(m["ack_p50_us"], 2.0);
        assert_eq!(m["ack_max_us"], 3.0);
    }

    #[test]
    fn summary_has_median_min_max_and_loss_per_run() {
        let runs = [
            json!({"total_rate": 3.0, "lost": 0}),
            json!({"total_rate": 1.0, "lost": 2}),
            json!({"lost": 0}),
        ];
        let s = summarize(&runs, &["total_rate", "p50_us"]);
        assert_eq!(
            s["total_rate"],
            json!({"median": 2.0, "min": 1.0, "max": 3.0})
        );
        assert!(s.get("p50_us").is_none());
        assert_eq!(s["lost_per_run"], json!([0, 2, 0]));
    }

    #[test]
    fn fanout_rates_loss_and_cpu() {
        let publisher =
            json!({"sent": 100, "start_ns": 1_000_000_000u64, "end_ns": 1_500_000_000u64});
        let subs = [
            json!({"recv": 100, "last_ns": 2_000_000_000u64, "gaps": 0, "pending_after": 0}),
            json!({"recv": 50, "last_ns": 1_500_000_000u64, "gaps": 50, "pending_after": 3}),
        ];
        let cpu = FanoutCpu {
            server: 0.001,
            publisher: 0.0005,
            subscribers: 0.0015,
        };
        let r = fanout_result(&publisher, &subs, 100, 256, cpu);
        assert_eq!(r["lost"], 50);
        assert_eq!(r["total_rate"], 150.0);
        assert_eq!(r["pub_rate"], 200.0);
        assert_eq!(r["per_sub_rate_min"], 100.0);
        assert_eq!(r["per_sub_rate"], 100.0);
        assert_eq!(r["unacked"], 3);
        assert_eq!(r["cpu_us_per_delivery"], 20.0);
        assert_eq!(r["broker_subs_cpu_us_per_delivery"], 500.0 / 30.0);
        assert_eq!(r["server_cpu_us_per_delivery"], 1000.0 / 150.0);
        assert_eq!(
            (r["pub_cpu_s"].clone(), r["subs_cpu_s"].clone()),
            (json!(0.001), json!(0.002))
        );
    }

    #[test]
    fn split_gives_the_remainder_to_the_first_publishers() {
        assert_eq!(split(10, 3), vec![4, 3, 3]);
        assert_eq!(split(5, 0), vec![5]);
    }
}
