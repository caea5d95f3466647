//! The performance goals the peer comparison judges (docs/benchmark.md,
//! "Comparing with the peers"): each one ours against theirs, or against a
//! figure of our own, with its rule, met or missed; and the judgement as
//! text, with every ratio of a bus column to a peer. Pure, on the cells of
//! [`Table`].

use crate::table::{thousands, Col, Fmt, Ratios, Row, Table};

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
const GOALS: [Goal; 24] = {
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
            "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, memory store, 256 B N=4",
            (BrokerCpuN4, BusMemory),
            Than::Cell(BrokerCpuN4, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, memory store, 256 B N=16",
            (BrokerCpuN16, BusMemory),
            Than::Cell(BrokerCpuN16, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, memory store, 4 KiB N=4",
            (BrokerCpu4kN4, BusMemory),
            Than::Cell(BrokerCpu4kN4, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, disk store, 256 B N=4",
            (BrokerCpuN4, BusDisk),
            Than::Cell(BrokerCpuN4, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, disk store, 256 B N=16",
            (BrokerCpuN16, BusDisk),
            Than::Cell(BrokerCpuN16, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, disk store, 4 KiB N=4",
            (BrokerCpu4kN4, BusDisk),
            Than::Cell(BrokerCpu4kN4, RedisPubsub),
            Rule::Le(1.0),
        ),
        goal(
            "busd CPU per delivery at N=16 ≤ ¼ of N=1, memory store (256 B)",
            (BusdN16, BusMemory),
            Than::Cell(BusdN1, BusMemory),
            Rule::Le(0.25),
        ),
        goal(
            "busd CPU per delivery at N=16 ≤ ¼ of N=1, disk store (256 B)",
            (BusdN16, BusDisk),
            Than::Cell(BusdN1, BusDisk),
            Rule::Le(0.25),
        ),
        goal(
            "memory store RSS ≤ 1.3× the retained payload (B per 256 B event)",
            (RssPerEvent, BusMemory),
            Than::Const(256.0),
            Rule::Le(1.3),
        ),
    ]
};

impl Table {
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

    /// The goals and the ratios as text, one line each.
    pub fn render_judgement(&self) -> String {
        let mut out = self.render_goals();
        out.push('\n');
        out.push_str(&self.render_ratios());
        out
    }

    /// Every goal, met, missed or not measured, one line each.
    pub fn render_goals(&self) -> String {
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
            out.push_str(&format!("  {:<86} {:<32} {verdict}\n", j.what, detail));
        }
        out.push_str(
            "  retention of 10M × 256 B on the disk store with busd RSS < 100 MiB; a subscription 1M events \
             behind catching up at ≥ 500k events/s: not measured by dws-bench\n",
        );
        out
    }

    /// Every ratio of a bus column to a peer, one line each.
    pub fn render_ratios(&self) -> String {
        let mut out = String::from(
            "Every ratio, bus / peer (throughput: higher is better; CPU, latency: lower is better):\n",
        );
        for Ratios { row, bus, peers } in self.ratios() {
            let list: Vec<String> = peers
                .iter()
                .map(|(p, r)| format!("×{r:.2} {}", p.name()))
                .collect();
            out.push_str(&format!(
                "  {:<46} {:<26} {}\n",
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
        t.set(Row::RssPerEvent, Col::BusMemory, Some(300.0));
        let j = judged(
            &t,
            "memory store RSS ≤ 1.3× the retained payload (B per 256 B event)",
        );
        assert_eq!(j.verdict.map(|v| v.met), Some(true));
    }

    #[test]
    fn cpu_goals_judge_the_broker_and_consumers_without_the_publishers() {
        let mut t = Table::default();
        // With the publishers counted the bus would lose; without, it wins.
        t.set(Row::CpuN4, Col::BusMemory, Some(1.60));
        t.set(Row::CpuN4, Col::RedisPubsub, Some(1.36));
        t.set(Row::BrokerCpuN4, Col::BusMemory, Some(1.02));
        t.set(Row::BrokerCpuN4, Col::RedisPubsub, Some(1.10));
        t.set(Row::BrokerCpu4kN4, Col::BusDisk, Some(4.0));
        t.set(Row::BrokerCpu4kN4, Col::RedisPubsub, Some(3.0));
        let mem =
            "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, memory store, 256 B N=4";
        let j = judged(&t, mem);
        assert_eq!(j.verdict.map(|v| v.met), Some(true));
        assert_eq!((j.ours, j.theirs), (Some(1.02), Some(1.10)));
        let disk = "CPU per delivery (broker + consumers) ≤ Redis pub/sub's, disk store, 4 KiB N=4";
        assert_eq!(judged(&t, disk).verdict.map(|v| v.met), Some(false));
        assert!(
            !t.goals()
                .iter()
                .any(|g| g.what.contains("with the publisher")),
            "the with-publisher line is shown, not judged"
        );
    }

    #[test]
    fn busd_at_n16_is_judged_against_its_own_n1() {
        let mut t = Table::default();
        t.set(Row::BusdN1, Col::BusMemory, Some(2.40));
        t.set(Row::BusdN16, Col::BusMemory, Some(0.60));
        t.set(Row::BusdN1, Col::BusDisk, Some(2.40));
        t.set(Row::BusdN16, Col::BusDisk, Some(0.61));
        let j = judged(
            &t,
            "busd CPU per delivery at N=16 ≤ ¼ of N=1, memory store (256 B)",
        );
        assert_eq!(j.verdict.map(|v| v.met), Some(true), "0.60 is ¼ of 2.40");
        assert!((j.verdict.map_or(0.0, |v| v.ratio) - 0.25).abs() < 1e-9);
        let j = judged(
            &t,
            "busd CPU per delivery at N=16 ≤ ¼ of N=1, disk store (256 B)",
        );
        assert_eq!(j.verdict.map(|v| v.met), Some(false));
        let text = t.render_judgement();
        assert!(text.contains("0.60 vs 2.40 (×0.25)"), "{text}");
        assert!(text.contains("not measured"), "{text}");
    }
}
