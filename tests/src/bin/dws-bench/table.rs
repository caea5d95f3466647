//! The peer comparison table (the bus on its memory and disk stores next to Redis
//! pub/sub, NATS core, Redis Streams with `appendfsync always` and JetStream
//! on its file store): its columns, its rows, the cells the sections fill
//! and how it renders, and every ratio of a bus column to a peer. Pure: the
//! sections fill the cells, this renders them; [`crate::goals`] judges them.

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

/// A measured figure (one part of a table line where the line shows more).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Row {
    Rate256N4,
    Rate256N16,
    Rate4kN4,
    /// CPU µs per delivery of the broker and the consuming processes (busd
    /// and every `dws event consume`; redis-server and its subscriber
    /// processes), the publisher left out on both sides.
    BrokerCpuN4,
    BrokerCpuN16,
    BrokerCpu4kN4,
    /// The same with the publisher counted too (the bus's is this
    /// benchmark; the peers' their own publishing process).
    CpuN4,
    CpuN16,
    /// The broker process alone (busd, redis-server), 256 B.
    BusdN1,
    BusdN16,
    LatP50,
    LatP99,
    Pub1,
    Pub8,
    AckP50,
    AckP99,
    /// The work queue: jobs/s of a flood, and at a fixed rate the latency
    /// from the publish of a job to its worker's ack.
    QueueRate,
    QueueP50,
    QueueP99,
    /// busd's peak RSS per retained event, bytes (256 B, N=4 flood).
    RssPerEvent,
}

/// Which figure of a fan-out run a row takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fig {
    /// Deliveries/s.
    Rate,
    /// CPU µs/delivery, broker + consumers.
    BrokerConsumers,
    /// CPU µs/delivery, broker + consumers + publisher.
    WithPublisher,
    /// CPU µs/delivery of the broker alone.
    Broker,
}

impl Fig {
    /// The `dws-peers` summary key of this figure.
    pub fn peer_key(self) -> &'static str {
        match self {
            Fig::Rate => "total_rate",
            Fig::BrokerConsumers => "broker_subs_cpu_us_per_delivery",
            Fig::WithPublisher => "cpu_us_per_delivery",
            Fig::Broker => "server_cpu_us_per_delivery",
        }
    }

    /// This figure of a bus run.
    pub fn of(self, r: &FanoutResult) -> Option<f64> {
        match self {
            Fig::Rate => Some(r.aggregate),
            Fig::BrokerConsumers => r.cpu_us_per_delivery,
            Fig::WithPublisher => r.cpu_with_pub_us_per_delivery,
            Fig::Broker => r.busd_cpu_us_per_delivery,
        }
    }
}

impl Row {
    /// The rows a fan-out scenario (N consumers, payload bytes) fills, and
    /// with which figure; the first is the one that says it was measured.
    pub fn of_fanout(n: usize, size: usize) -> &'static [(Row, Fig)] {
        use Fig::*;
        match (n, size) {
            (1, 256) => &[(Row::BusdN1, Broker)],
            (4, 256) => &[
                (Row::Rate256N4, Rate),
                (Row::BrokerCpuN4, BrokerConsumers),
                (Row::CpuN4, WithPublisher),
            ],
            (16, 256) => &[
                (Row::Rate256N16, Rate),
                (Row::BrokerCpuN16, BrokerConsumers),
                (Row::CpuN16, WithPublisher),
                (Row::BusdN16, Broker),
            ],
            (4, 4096) => &[(Row::Rate4kN4, Rate), (Row::BrokerCpu4kN4, BrokerConsumers)],
            _ => &[],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Row::Rate256N4 => "256 B, N=4, deliveries/s",
            Row::Rate256N16 => "256 B, N=16, deliveries/s",
            Row::Rate4kN4 => "4 KiB, N=4, deliveries/s",
            Row::BrokerCpuN4 => "CPU µs/delivery, broker + consumers, N=4",
            Row::BrokerCpuN16 => "CPU µs/delivery, broker + consumers, N=16",
            Row::BrokerCpu4kN4 => "CPU µs/delivery, broker + consumers, 4 KiB N=4",
            Row::CpuN4 => "CPU µs/delivery with the publisher, N=4",
            Row::CpuN16 => "CPU µs/delivery with the publisher, N=16",
            Row::BusdN1 => "broker CPU µs/delivery, N=1",
            Row::BusdN16 => "broker CPU µs/delivery, N=16",
            Row::LatP50 => "fixed rate, p50 µs",
            Row::LatP99 => "fixed rate, p99 µs",
            Row::Pub1 => "durable publishes/s, 1 publisher",
            Row::Pub8 => "durable publishes/s, 8 publishers",
            Row::AckP50 => "publish→durable reply, p50 µs",
            Row::AckP99 => "publish→durable reply, p99 µs",
            Row::QueueRate => "work queue, jobs/s",
            Row::QueueP50 => "work queue, publish→ack p50 µs",
            Row::QueueP99 => "work queue, publish→ack p99 µs",
            Row::RssPerEvent => "busd peak RSS per retained event",
        }
    }

    /// Latency rows, which the `fdatasync alone` column is a floor of.
    fn is_latency(self) -> bool {
        matches!(
            self,
            Row::LatP50 | Row::LatP99 | Row::AckP50 | Row::AckP99 | Row::QueueP50 | Row::QueueP99
        )
    }
}

/// The parameters a few line labels name.
pub struct Labels {
    /// Events/s and consumers of the fixed-rate fan-out.
    pub rate: u64,
    pub consumers: usize,
    /// Publishes/s of the publish→durable reply run.
    pub durable_rate: u64,
    /// Workers of the work queue, and jobs/s of its latency run.
    pub queue_workers: usize,
    pub queue_rate: u64,
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
    /// Cells that hold a word instead of a figure (the bus refused the
    /// scenario), keyed by a row of the line they stand for.
    notes: BTreeMap<(Row, Col), String>,
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

    /// The line of `row` says `text` in column `col` instead of figures.
    pub fn set_note(&mut self, row: Row, col: Col, text: &str) {
        self.notes.insert((row, col), text.to_owned());
    }

    /// A flood fan-out scenario's figures, when its store and scenario are
    /// in the table.
    pub fn record_fanout(&mut self, store: StoreSel, n: usize, size: usize, r: &FanoutResult) {
        let Some(col) = Col::of_store(store) else {
            return;
        };
        for &(row, fig) in Row::of_fanout(n, size) {
            self.set(row, col, fig.of(r));
        }
        if (n, size) == (4, 256) {
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

    /// The lines of the table: label, rows, format.
    fn lines(l: &Labels) -> Vec<(String, Vec<Row>, Fmt)> {
        use Row::*;
        vec![
            (
                "256 B, N=4, deliveries/s".into(),
                vec![Rate256N4],
                Fmt::Rate,
            ),
            ("256 B, N=16".into(), vec![Rate256N16], Fmt::Rate),
            ("4 KiB, N=4".into(), vec![Rate4kN4], Fmt::Rate),
            (
                "CPU µs/delivery, broker + consumers, 256 B N=4 / N=16 / 4 KiB N=4".into(),
                vec![BrokerCpuN4, BrokerCpuN16, BrokerCpu4kN4],
                Fmt::Cpu,
            ),
            (
                "CPU µs/delivery with the publisher, N=4 / N=16".into(),
                vec![CpuN4, CpuN16],
                Fmt::Cpu,
            ),
            (
                "broker alone, CPU µs/delivery, 256 B N=1 / N=16".into(),
                vec![BusdN1, BusdN16],
                Fmt::Cpu,
            ),
            (
                format!(
                    "{} ev/s, {} consumers, p50 / p99 µs",
                    thousands(l.rate as f64),
                    l.consumers
                ),
                vec![LatP50, LatP99],
                Fmt::Us,
            ),
            (
                "durable publishes/s, 1 / 8 publishers (256 B)".into(),
                vec![Pub1, Pub8],
                Fmt::Rate,
            ),
            (
                format!(
                    "publish→durable reply at {}/s, p50 / p99 µs",
                    thousands(l.durable_rate as f64)
                ),
                vec![AckP50, AckP99],
                Fmt::Us,
            ),
            (
                format!(
                    "work queue, {} workers acking each 256 B job, jobs/s",
                    l.queue_workers
                ),
                vec![QueueRate],
                Fmt::Rate,
            ),
            (
                format!(
                    "work queue at {} jobs/s, publish→ack p50 / p99 µs",
                    thousands(l.queue_rate as f64)
                ),
                vec![QueueP50, QueueP99],
                Fmt::Us,
            ),
            (
                "busd peak RSS per retained event (256 B, N=4)".into(),
                vec![RssPerEvent],
                Fmt::Bytes,
            ),
        ]
    }

    /// The table as Markdown; "—" where nothing was measured. A line with
    /// nothing in any column is left out.
    pub fn render(&self, labels: &Labels) -> String {
        let mut out = String::from("| workload |");
        for c in Col::ALL {
            out.push_str(&format!(" {} |", c.name()));
        }
        out.push_str("\n|---|");
        out.push_str(&"---|".repeat(Col::ALL.len()));
        for (label, rows, fmt) in Table::lines(labels) {
            let cells: Vec<Option<String>> = Col::ALL
                .iter()
                .map(|&c| {
                    if let Some(note) = rows.iter().find_map(|&r| self.notes.get(&(r, c))) {
                        return Some(note.clone());
                    }
                    let vals: Vec<Option<f64>> = rows.iter().map(|&r| self.get(r, c)).collect();
                    vals.iter().any(Option::is_some).then(|| {
                        vals.iter()
                            .map(|&v| fmt.cell(v))
                            .collect::<Vec<_>>()
                            .join(" / ")
                    })
                })
                .collect();
            if cells.iter().all(Option::is_none) {
                continue;
            }
            out.push_str(&format!("\n| {label} |"));
            for cell in cells {
                out.push_str(&format!(" {} |", cell.as_deref().unwrap_or("—")));
            }
        }
        out
    }

    /// Every ratio of a bus column to a peer column in the rows both
    /// measured (and to `fdatasync alone` in the latency rows).
    pub fn ratios(&self) -> Vec<Ratios> {
        let rows = Table::lines(&Labels {
            rate: 0,
            consumers: 0,
            durable_rate: 0,
            queue_workers: 0,
            queue_rate: 0,
        })
        .into_iter()
        .flat_map(|(_, rows, _)| rows)
        .filter(|r| *r != Row::RssPerEvent);
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
                if row.is_latency() {
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
}

/// How a row's cells print.
#[derive(Clone, Copy)]
pub enum Fmt {
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
    pub fn cell(self, v: Option<f64>) -> String {
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
pub fn thousands(v: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    pub fn labels() -> Labels {
        Labels {
            rate: 2000,
            consumers: 4,
            durable_rate: 1000,
            queue_workers: 4,
            queue_rate: 1000,
        }
    }

    #[test]
    fn the_table_has_every_column_and_ratio() {
        let mut t = Table::default();
        t.set(Row::Rate256N4, Col::BusDisk, Some(641_000.0));
        t.set(Row::Rate256N4, Col::NatsCore, Some(1_440_000.0));
        t.set(Row::Rate256N4, Col::JetStream, Some(242_000.0));
        t.set(Row::AckP50, Col::Fsync, Some(284.0));
        t.set(Row::AckP99, Col::Fsync, Some(1485.0));
        t.set(Row::LatP99, Col::BusMemory, Some(300.0));
        t.set(Row::Pub1, Col::BusDisk, Some(f64::NAN));
        let text = t.render(&labels());
        assert!(
            text.contains("| 256 B, N=4, deliveries/s | — | 641k | — | 1.44M | — | 242k | — |"),
            "{text}"
        );
        assert!(text.contains("284 / 1,485"), "{text}");
        assert!(
            text.contains("| 2,000 ev/s, 4 consumers, p50 / p99 µs | — / 300 |"),
            "{text}"
        );
        assert!(
            !text.contains("256 B, N=16"),
            "a line nothing filled is left out: {text}"
        );
        assert_eq!(t.get(Row::Pub1, Col::BusDisk), None, "NaN is not a figure");
        let ratios = t.ratios();
        assert_eq!(ratios.len(), 1);
        let Ratios { row, bus, peers } = &ratios[0];
        assert_eq!((*row, *bus), (Row::Rate256N4, Col::BusDisk));
        assert_eq!(
            peers.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![Col::NatsCore, Col::JetStream]
        );
    }

    #[test]
    fn a_fanout_scenario_fills_its_rows_with_its_figures() {
        assert_eq!(Row::of_fanout(1, 256), &[(Row::BusdN1, Fig::Broker)]);
        assert_eq!(Row::of_fanout(4, 4096)[0], (Row::Rate4kN4, Fig::Rate));
        assert!(Row::of_fanout(16, 4096).is_empty());
        let rows: Vec<Row> = Row::of_fanout(16, 256).iter().map(|r| r.0).collect();
        assert_eq!(
            rows,
            vec![
                Row::Rate256N16,
                Row::BrokerCpuN16,
                Row::CpuN16,
                Row::BusdN16
            ]
        );
        assert_eq!(Fig::Broker.peer_key(), "server_cpu_us_per_delivery");
        assert_eq!(
            Fig::BrokerConsumers.peer_key(),
            "broker_subs_cpu_us_per_delivery"
        );
    }

    #[test]
    fn cpu_lines_show_each_scenario_and_the_broker_alone() {
        let mut t = Table::default();
        t.set(Row::BrokerCpuN4, Col::BusMemory, Some(1.2));
        t.set(Row::BrokerCpuN16, Col::BusMemory, Some(0.9));
        t.set(Row::BrokerCpu4kN4, Col::BusMemory, Some(3.456));
        t.set(Row::BrokerCpuN4, Col::RedisStreams, Some(9.5));
        t.set(Row::BusdN1, Col::BusDisk, Some(2.4));
        t.set(Row::BusdN16, Col::BusDisk, Some(0.5));
        t.set(Row::BusdN16, Col::RedisPubsub, Some(0.1));
        let text = t.render(&labels());
        assert!(
            text.contains(
                "| CPU µs/delivery, broker + consumers, 256 B N=4 / N=16 / 4 KiB N=4 | 1.20 / 0.90 / 3.46 | — | — | — | 9.50 / — / — |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| broker alone, CPU µs/delivery, 256 B N=1 / N=16 | — | 2.40 / 0.50 | — / 0.10 |"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_refused_work_queue_says_so_in_its_cells() {
        let mut t = Table::default();
        let na = "n/a (this bus refuses --delivery shared on its store)";
        for r in [Row::QueueRate, Row::QueueP50, Row::QueueP99] {
            t.set_note(r, Col::BusMemory, na);
        }
        t.set(Row::QueueRate, Col::RedisStreams, Some(41_000.0));
        t.set(Row::QueueP50, Col::JetStream, Some(480.0));
        t.set(Row::QueueP99, Col::JetStream, Some(2_100.0));
        let text = t.render(&labels());
        assert!(
            text.contains(&format!(
                "| work queue, 4 workers acking each 256 B job, jobs/s | {na} | — | — | — | 41k | — | — |"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "| work queue at 1,000 jobs/s, publish→ack p50 / p99 µs | {na} | — | — | — | — | 480 / 2,100 | — |"
            )),
            "{text}"
        );
        assert!(t.ratios().is_empty(), "a refused cell is no figure");
        t.set(Row::QueueRate, Col::BusDisk, Some(82_000.0));
        let r = t.ratios();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].row, r[0].bus), (Row::QueueRate, Col::BusDisk));
        assert!((r[0].peers[0].1 - 2.0).abs() < 1e-9);
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(1112.4), "1,112");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }
}
