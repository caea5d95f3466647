//! The peer comparison table (the bus on its memory and disk stores next to Redis
//! pub/sub, NATS core, Redis Streams with `appendfsync always` and JetStream
//! on its file store) and every goal's ratio, each met or missed. Pure: the
//! sections fill the cells, this renders them and judges the goals.

use std::collections::BTreeMap;

use crate::{fanout::FanoutResult, opts::StoreSel};

/// A column of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Col {
    BusMemory,
    BusDisk,
    RedisPubsub,
    NatsCore,
    RedisStreams,
    JetStream,
    /// Raw `fdatasync` of a small append, measured in the same run at the
    /// same rate (only the fixed-rate and publish→durable reply rows).
    Fsync,
}

impl Col {
    pub const ALL: [Col; 7] = [
        Col::BusMemory,
        Col::BusDisk,
        Col::RedisPubsub,
        Col::NatsCore,
        Col::RedisStreams,
        Col::JetStream,
        Col::Fsync,
    ];
    pub const PEERS: [Col; 4] = [
        Col::RedisPubsub,
        Col::NatsCore,
        Col::RedisStreams,
        Col::JetStream,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Col::BusMemory => "bus, memory store",
            Col::BusDisk => "bus, disk store (default)",
            Col::RedisPubsub => "Redis pub/sub",
            Col::NatsCore => "NATS core",
            Col::RedisStreams => "Redis Streams, AOF always",
            Col::JetStream => "JetStream file store",
            Col::Fsync => "fdatasync alone",
        }
    }

    /// The bus column of a store, if the table has one.
    pub fn of_store(store: StoreSel) -> Option<Col> {
        match store {
            StoreSel::MEMORY => Some(Col::BusMemory),
            StoreSel::DISK_FSYNC => Some(Col::BusDisk),
            _ => None,
        }
    }
}

/// A measured figure (one half of a table row where the row shows two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Row {
    Rate256N4,
    Rate256N16,
    Rate4kN4,
    CpuN4,
    CpuN16,
    LatP50,
    LatP99,
    Pub1,
    Pub8,
    AckP50,
    AckP99,
    /// busd's peak RSS per retained event, bytes (256 B, N=4 flood).
    RssPerEvent,
}

impl Row {
    /// The deliveries/s and CPU rows of a fan-out scenario, if in the table.
    pub fn of_fanout(n: usize, size: usize) -> Option<(Row, Option<Row>)> {
        match (n, size) {
            (4, 256) => Some((Row::Rate256N4, Some(Row::CpuN4))),
            (16, 256) => Some((Row::Rate256N16, Some(Row::CpuN16))),
            (4, 4096) => Some((Row::Rate4kN4, None)),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Row::Rate256N4 => "256 B, N=4, deliveries/s",
            Row::Rate256N16 => "256 B, N=16, deliveries/s",
            Row::Rate4kN4 => "4 KiB, N=4, deliveries/s",
            Row::CpuN4 => "CPU µs/delivery, N=4",
            Row::CpuN16 => "CPU µs/delivery, N=16",
            Row::LatP50 => "fixed rate, p50 µs",
            Row::LatP99 => "fixed rate, p99 µs",
            Row::Pub1 => "durable publishes/s, 1 publisher",
            Row::Pub8 => "durable publishes/s, 8 publishers",
            Row::AckP50 => "publish→durable reply, p50 µs",
            Row::AckP99 => "publish→durable reply, p99 µs",
            Row::RssPerEvent => "busd peak RSS per retained event",
        }
    }
}

/// A bus column's ratios to the peers in one row: bus / peer.
pub struct Ratios {
    pub row: Row,
    pub bus: Col,
    pub peers: Vec<(Col, f64)>,
}

/// The cells measured so far.
#[derive(Default)]
pub struct Table {
    cells: BTreeMap<(Row, Col), f64>,
}

impl Table {
    /// Sets a cell; an unknown or non-finite value leaves it empty.
    pub fn set(&mut self, row: Row, col: Col, v: Option<f64>) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            self.cells.insert((row, col), v);
        }
    }

    pub fn get(&self, row: Row, col: Col) -> Option<f64> {
        self.cells.get(&(row, col)).copied()
    }

    /// A flood fan-out row's figures, when its store and scenario are in
    /// the table. CPU counts the publisher too, as the peers count theirs.
    pub fn record_fanout(&mut self, store: StoreSel, n: usize, size: usize, r: &FanoutResult) {
        let (Some(col), Some((rate, cpu))) = (Col::of_store(store), Row::of_fanout(n, size)) else {
            return;
        };
        self.set(rate, col, Some(r.aggregate));
        if let Some(cpu) = cpu {
            self.set(cpu, col, r.cpu_with_pub_us_per_delivery);
        }
        if rate == Row::Rate256N4 {
            let per_event = r.busd_hwm_kb.zip(r.retained_events.filter(|n| *n > 0));
            self.set(
                Row::RssPerEvent,
                col,
                per_event.map(|(kb, n)| kb as f64 * 1024.0 / n as f64),
            );
        }
    }

    /// The fixed-rate fan-out run's latencies.
    pub fn record_latency(&mut self, store: StoreSel, r: &FanoutResult) {
        if let Some(col) = Col::of_store(store) {
            self.set(Row::LatP50, col, Some(r.p50_us));
            self.set(Row::LatP99, col, Some(r.p99_us));
        }
    }

    /// A 256 B durable flood on the fsync disk store with `publishers`.
    pub fn record_durable_flood(&mut self, publishers: usize, rate: f64) {
        match publishers {
            1 => self.set(Row::Pub1, Col::BusDisk, Some(rate)),
            8 => self.set(Row::Pub8, Col::BusDisk, Some(rate)),
            _ => {}
        }
    }

    /// The table as Markdown, the rows and columns; "—" where
    /// nothing was measured.
    pub fn render(&self, rate: u64, consumers: usize, durable_rate: u64) -> String {
        let lines: [(String, Row, Option<Row>, Fmt); 8] = [
            (
                "256 B, N=4, deliveries/s".into(),
                Row::Rate256N4,
                None,
                Fmt::Rate,
            ),
            ("256 B, N=16".into(), Row::Rate256N16, None, Fmt::Rate),
            ("4 KiB, N=4".into(), Row::Rate4kN4, None, Fmt::Rate),
            (
                "CPU µs/delivery, N=4 / N=16".into(),
                Row::CpuN4,
                Some(Row::CpuN16),
                Fmt::Cpu,
            ),
            (
                format!(
                    "{} ev/s, {consumers} consumers, p50 / p99 µs",
                    thousands(rate as f64)
                ),
                Row::LatP50,
                Some(Row::LatP99),
                Fmt::Us,
            ),
            (
                "durable publishes/s, 1 / 8 publishers (256 B)".into(),
                Row::Pub1,
                Some(Row::Pub8),
                Fmt::Rate,
            ),
            (
                format!(
                    "publish→durable reply at {}/s, p50 / p99 µs",
                    thousands(durable_rate as f64)
                ),
                Row::AckP50,
                Some(Row::AckP99),
                Fmt::Us,
            ),
            (
                "busd peak RSS per retained event (256 B, N=4)".into(),
                Row::RssPerEvent,
                None,
                Fmt::Bytes,
            ),
        ];
        let mut out = String::from("| workload |");
        for c in Col::ALL {
            out.push_str(&format!(" {} |", c.name()));
        }
        out.push_str("\n|---|");
        out.push_str(&"---|".repeat(Col::ALL.len()));
        for (label, a, b, fmt) in lines {
            out.push_str(&format!("\n| {label} |"));
            for c in Col::ALL {
                let cell = match (self.get(a, c), b.map(|b| self.get(b, c))) {
                    (None, None | Some(None)) => "—".to_string(),
                    (x, None) => fmt.cell(x),
                    (x, Some(y)) => format!("{} / {}", fmt.cell(x), fmt.cell(y)),
                };
                out.push_str(&format!(" {cell} |"));
            }
        }
        out
    }

    /// Every performance goal that one run can judge.
    pub fn goals(&self) -> Vec<Judged> {
        GOALS
            .iter()
            .map(|g| {
                let ours = self.get(g.ours.0, g.ours.1);
                let theirs = match g.theirs {
                    Than::Cell(r, c) => self.get(r, c),
                    Than::Const(v) => Some(v),
                };
                let verdict = ours.zip(theirs).map(|(o, t)| g.rule.judge(o, t));
                Judged {
                    what: g.what,
                    rule: g.rule,
                    ours,
                    theirs,
                    verdict,
                }
            })
            .collect()
    }

    /// Every ratio of a bus column to a peer column in the rows both
    /// measured.
    pub fn ratios(&self) -> Vec<Ratios> {
        let rows = [
            Row::Rate256N4,
            Row::Rate256N16,
            Row::Rate4kN4,
            Row::CpuN4,
            Row::CpuN16,
            Row::LatP50,
            Row::LatP99,
            Row::Pub1,
            Row::Pub8,
            Row::AckP50,
            Row::AckP99,
        ];
        let mut out = Vec::new();
        for row in rows {
            for bus in [Col::BusMemory, Col::BusDisk] {
                let Some(ours) = self.get(row, bus) else {
                    continue;
                };
                let mut peers = Col::PEERS
                    .iter()
                    .filter_map(|&p| self.get(row, p).filter(|t| *t > 0.0).map(|t| (p, ours / t)))
                    .collect::<Vec<_>>();
                if matches!(row, Row::AckP50 | Row::AckP99 | Row::LatP50 | Row::LatP99) {
                    if let Some(t) = self.get(row, Col::Fsync).filter(|t| *t > 0.0) {
                        peers.push((Col::Fsync, ours / t));
                    }
                }
                if !peers.is_empty() {
                    out.push(Ratios { row, bus, peers });
                }
            }
        }
        out
    }

    /// The goals and the ratios as text, one line each.
    pub fn render_judgement(&self) -> String {
        let mut out = String::from("Performance goals (ratios in this run; ours / theirs):\n");
        for j in self.goals() {
            let verdict = match j.verdict {
                Some(Verdict { met: true, .. }) => "met".to_string(),
                Some(Verdict { met: false, .. }) => "MISSED".to_string(),
                None => "not measured".to_string(),
            };
            let detail = match (j.ours, j.theirs, j.verdict) {
                (Some(o), Some(t), Some(v)) => match j.rule {
                    Rule::LePlus(d) => format!("{} vs {} + {}", num(o), num(t), num(d)),
                    _ => format!("{} vs {} (×{:.2})", num(o), num(t), v.ratio),
                },
                _ => "—".to_string(),
            };
            out.push_str(&format!("  {:<78} {:<32} {verdict}\n", j.what, detail));
        }
        out.push_str(
            "  retention of 10M × 256 B on the disk store with busd RSS < 100 MiB; a subscription 1M events \
             behind catching up at ≥ 500k events/s: not measured by dws-bench\n",
        );
        out.push_str("\nEvery ratio, bus / peer (throughput: higher is better; CPU, latency: lower is better):\n");
        for Ratios { row, bus, peers } in self.ratios() {
            let list: Vec<String> = peers
                .iter()
                .map(|(p, r)| format!("×{r:.2} {}", p.name()))
                .collect();
            out.push_str(&format!(
                "  {:<36} {:<26} {}\n",
                row.name(),
                bus.name(),
                list.join(", ")
            ));
        }
        out
    }
}

fn num(v: f64) -> String {
    if v >= 10_000.0 {
        Fmt::Rate.cell(Some(v))
    } else if v >= 100.0 {
        thousands(v)
    } else {
        format!("{v:.2}")
    }
}

/// How a row's cells print.
#[derive(Clone, Copy)]
enum Fmt {
    /// 841k, 1.21M.
    Rate,
    /// 1.43.
    Cpu,
    /// 1,112.
    Us,
    /// 380 B.
    Bytes,
}

impl Fmt {
    fn cell(self, v: Option<f64>) -> String {
        let Some(v) = v else {
            return "—".into();
        };
        match self {
            Fmt::Rate if v >= 1e6 => format!("{:.2}M", v / 1e6),
            Fmt::Rate if v >= 1e3 => format!("{:.0}k", v / 1e3),
            Fmt::Rate => format!("{v:.0}"),
            Fmt::Cpu => format!("{v:.2}"),
            Fmt::Us => thousands(v),
            Fmt::Bytes => format!("{v:.0} B"),
        }
    }
}

/// `v` rounded, with thousands separators: 1,112.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// What a goal compares ours with.
#[derive(Clone, Copy)]
enum Than {
    Cell(Row, Col),
    Const(f64),
}

/// How a goal judges ours against theirs.
#[derive(Clone, Copy, Debug)]
enum Rule {
    /// ours ≥ k × theirs.
    Ge(f64),
    /// ours ≤ k × theirs.
    Le(f64),
    /// ours ≤ theirs + µs.
    LePlus(f64),
}

impl Rule {
    fn judge(self, ours: f64, theirs: f64) -> Verdict {
        let ratio = if theirs > 0.0 {
            ours / theirs
        } else {
            f64::NAN
        };
        let met = match self {
            Rule::Ge(k) => ours >= k * theirs,
            Rule::Le(k) => ours <= k * theirs,
            Rule::LePlus(d) => ours <= theirs + d,
        };
        Verdict { ratio, met }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// ours / theirs.
    pub ratio: f64,
    pub met: bool,
}

struct Goal {
    what: &'static str,
    ours: (Row, Col),
    theirs: Than,
    rule: Rule,
}

/// A goal with this run's figures.
#[derive(Debug)]
pub struct Judged {
    pub what: &'static str,
    rule: Rule,
    pub ours: Option<f64>,
    pub theirs: Option<f64>,
    /// `None` when either side was not measured.
    pub verdict: Option<Verdict>,
}

const fn goal(what: &'static str, ours: (Row, Col), theirs: Than, rule: Rule) -> Goal {
    Goal {
        what,
        ours,
        theirs,
        rule,
    }
}

/// The performance goals (docs/benchmark.md), in order.
const GOALS: [Goal; 20] = {
    use Col::*;
    use Row::*;
    [
        goal(
            "memory store ≥ 1.5× Redis pub/sub, 256 B N=4",
            (Rate256N4, BusMemory),
            Than::Cell(Rate256N4, RedisPubsub),
            Rule::Ge(1.5),
        ),
        goal(
            "memory store ≥ 1.5× Redis pub/sub, 256 B N=16",
            (Rate256N16, BusMemory),
            Than::Cell(Rate256N16, RedisPubsub),
            Rule::Ge(1.5),
        ),
        goal(
            "memory store ≥ 1.5× Redis pub/sub, 4 KiB N=4",
            (Rate4kN4, BusMemory),
            Than::Cell(Rate4kN4, RedisPubsub),
            Rule::Ge(1.5),
        ),
        goal(
            "memory store p99 at the fixed rate ≤ Redis pub/sub's",
            (LatP99, BusMemory),
            Than::Cell(LatP99, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "disk store ≥ 1× Redis pub/sub, 256 B N=4",
            (Rate256N4, BusDisk),
            Than::Cell(Rate256N4, RedisPubsub),
            Rule::Ge(1.0),
        ),
        goal(
            "disk store ≥ 1× Redis pub/sub, 256 B N=16",
            (Rate256N16, BusDisk),
            Than::Cell(Rate256N16, RedisPubsub),
            Rule::Ge(1.0),
        ),
        goal(
            "disk store ≥ 1× Redis pub/sub, 4 KiB N=4",
            (Rate4kN4, BusDisk),
            Than::Cell(Rate4kN4, RedisPubsub),
            Rule::Ge(1.0),
        ),
        goal(
            "disk store ≥ 4× Redis Streams fan-out, 256 B N=4",
            (Rate256N4, BusDisk),
            Than::Cell(Rate256N4, RedisStreams),
            Rule::Ge(4.0),
        ),
        goal(
            "disk store ≥ 4× Redis Streams fan-out, 256 B N=16",
            (Rate256N16, BusDisk),
            Than::Cell(Rate256N16, RedisStreams),
            Rule::Ge(4.0),
        ),
        goal(
            "disk store ≥ 4× JetStream fan-out, 256 B N=4",
            (Rate256N4, BusDisk),
            Than::Cell(Rate256N4, JetStream),
            Rule::Ge(4.0),
        ),
        goal(
            "disk store ≥ 4× JetStream fan-out, 256 B N=16",
            (Rate256N16, BusDisk),
            Than::Cell(Rate256N16, JetStream),
            Rule::Ge(4.0),
        ),
        goal(
            "disk store p99 at the fixed rate ≤ raw fdatasync p99 + 300 µs",
            (LatP99, BusDisk),
            Than::Cell(LatP99, Fsync),
            Rule::LePlus(300.0),
        ),
        goal(
            "durable publishes ≥ 2× Redis Streams, 1 publisher",
            (Pub1, BusDisk),
            Than::Cell(Pub1, RedisStreams),
            Rule::Ge(2.0),
        ),
        goal(
            "durable publishes ≥ 2× Redis Streams, 8 publishers",
            (Pub8, BusDisk),
            Than::Cell(Pub8, RedisStreams),
            Rule::Ge(2.0),
        ),
        goal(
            "publish→durable reply p99 at the fixed rate ≤ Redis Streams's",
            (AckP99, BusDisk),
            Than::Cell(AckP99, RedisStreams),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery ≤ Redis pub/sub's, memory store, N=4",
            (CpuN4, BusMemory),
            Than::Cell(CpuN4, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery ≤ Redis pub/sub's, memory store, N=16",
            (CpuN16, BusMemory),
            Than::Cell(CpuN16, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery ≤ Redis pub/sub's, disk store, N=4",
            (CpuN4, BusDisk),
            Than::Cell(CpuN4, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery ≤ Redis pub/sub's, disk store, N=16",
            (CpuN16, BusDisk),
            Than::Cell(CpuN16, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "memory store RSS ≤ 1.3× the retained payload (B per 256 B event)",
            (RssPerEvent, BusMemory),
            Than::Const(256.0),
            Rule::Le(1.3),
        ),
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(t: &Table, what: &str) -> Judged {
        t.goals()
            .into_iter()
            .find(|j| j.what == what)
            .unwrap_or_else(|| panic!("no goal {what:?}"))
    }

    #[test]
    fn throughput_goals_are_ratios_at_least_k() {
        let mut t = Table::default();
        t.set(Row::Rate256N4, Col::BusMemory, Some(1.6e6));
        t.set(Row::Rate256N4, Col::RedisPubsub, Some(1.0e6));
        t.set(Row::Rate256N16, Col::BusMemory, Some(1.4e6));
        t.set(Row::Rate256N16, Col::RedisPubsub, Some(1.0e6));
        let j = judged(&t, "memory store ≥ 1.5× Redis pub/sub, 256 B N=4");
        assert_eq!(j.verdict.map(|v| v.met), Some(true));
        assert!((j.verdict.map_or(0.0, |v| v.ratio) - 1.6).abs() < 1e-9);
        let j = judged(&t, "memory store ≥ 1.5× Redis pub/sub, 256 B N=16");
        assert_eq!(j.verdict.map(|v| v.met), Some(false));
        let j = judged(&t, "memory store ≥ 1.5× Redis pub/sub, 4 KiB N=4");
        assert_eq!(j.verdict, None, "unmeasured goals are not judged");
    }

    #[test]
    fn latency_cpu_and_memory_goals_are_upper_bounds() {
        let mut t = Table::default();
        t.set(Row::LatP99, Col::BusDisk, Some(800.0));
        t.set(Row::LatP99, Col::Fsync, Some(485.0));
        let j = judged(
            &t,
            "disk store p99 at the fixed rate ≤ raw fdatasync p99 + 300 µs",
        );
        assert_eq!(j.verdict.map(|v| v.met), Some(false));
        t.set(Row::LatP99, Col::BusDisk, Some(785.0));
        let j = judged(
            &t,
            "disk store p99 at the fixed rate ≤ raw fdatasync p99 + 300 µs",
        );
        assert_eq!(j.verdict.map(|v| v.met), Some(true));
        t.set(Row::CpuN4, Col::BusMemory, Some(1.43));
        t.set(Row::CpuN4, Col::RedisPubsub, Some(1.08));
        let j = judged(&t, "CPU per delivery ≤ Redis pub/sub's, memory store, N=4");
        assert_eq!(j.verdict.map(|v| v.met), Some(false));
        t.set(Row::RssPerEvent, Col::BusMemory, Some(300.0));
        let j = judged(
            &t,
            "memory store RSS ≤ 1.3× the retained payload (B per 256 B event)",
        );
        assert_eq!(j.verdict.map(|v| v.met), Some(true));
    }

    #[test]
    fn the_table_has_every_column_and_ratio() {
        let mut t = Table::default();
        t.set(Row::Rate256N4, Col::BusDisk, Some(641_000.0));
        t.set(Row::Rate256N4, Col::NatsCore, Some(1_440_000.0));
        t.set(Row::Rate256N4, Col::JetStream, Some(242_000.0));
        t.set(Row::AckP50, Col::Fsync, Some(284.0));
        t.set(Row::AckP99, Col::Fsync, Some(1485.0));
        t.set(Row::Pub1, Col::BusDisk, Some(f64::NAN));
        let text = t.render(2000, 4, 1000);
        assert!(
            text.contains("| 256 B, N=4, deliveries/s | — | 641k | — | 1.44M | — | 242k | — |"),
            "{text}"
        );
        assert!(text.contains("284 / 1,485"), "{text}");
        assert!(text.contains("2,000 ev/s, 4 consumers"), "{text}");
        assert_eq!(t.get(Row::Pub1, Col::BusDisk), None, "NaN is not a figure");
        let ratios = t.ratios();
        assert_eq!(ratios.len(), 1);
        let Ratios { row, bus, peers } = &ratios[0];
        assert_eq!((*row, *bus), (Row::Rate256N4, Col::BusDisk));
        assert_eq!(
            peers.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![Col::NatsCore, Col::JetStream]
        );
        assert!(t.render_judgement().contains("not measured"));
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(1112.4), "1,112");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }
}
