//! The history checker of the fault suite (`tests/faults/`): what the
//! publishers were told, what the cluster's log holds and what every
//! consumer run printed, checked against the bus's promise — an event the
//! bus acknowledged is delivered at least once, in order, or its loss is
//! reported. Pure: the suite records, [`History::check`] judges.
//!
//! The rules (each a [`Violation`]):
//! - every answered publish is in the log exactly once, under the seq it
//!   was answered with (a duplicate answer names the original's seq);
//! - a publish answered with a failure is not in the log;
//! - no seq names two events (the log and every delivery agree);
//! - each consumer run's deliveries are in strictly increasing seq order,
//!   and an event a subscription delivered before comes again only marked
//!   `redelivered`;
//! - every answered event at or after a subscription's start is delivered
//!   by it at least once, or covered by a gap line of one of its runs;
//! - at most one host appended under each epoch;
//! - every publish was answered (ok, failed, or outcome unknown) within the
//!   workload's deadline ([`Outcome::Unanswered`] is a violation);
//! - a shared subscription (`--delivery shared`, named in
//!   [`History::shared`]) is one subscription across hosts: its runs count
//!   together (as host [`SHARED_HOST`]), and an event is handled by one
//!   consumer at a time — delivered without `redelivered` at most once,
//!   across every host; a marked redelivery (a claim taken over from
//!   another host) may come out of its run's seq order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// What a publisher was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0: the event is in the log at `seq` (the original's, when a
    /// duplicate).
    Answered { seq: u64, duplicate: bool },
    /// The bus answered with an error: the event must not be in the log.
    Failed(String),
    /// No answer (the connection broke), or an answer that says the outcome
    /// is unknown: either way is allowed.
    Unknown(String),
    /// Still waiting at the workload's deadline: the bus left a publish
    /// hanging, past every bound it documents.
    Unanswered(String),
}

/// The host name under which a shared subscription's runs count.
pub const SHARED_HOST: &str = "*";

/// One publish: its unique token (in the payload) and what it was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub token: String,
    pub host: String,
    pub outcome: Outcome,
}

/// One line a consumer run printed that the checker reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Event {
        seq: u64,
        token: String,
        redelivered: bool,
    },
    /// `[event] gap — lost N event(s) before seq S`.
    Gap { before: u64 },
}

/// One `dws event consume` run of a subscription on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub host: String,
    pub subscription: String,
    pub seen: Vec<Seen>,
}

/// Everything recorded in one scenario.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub publishes: Vec<Publish>,
    /// The cluster's log at the end: seq → token (`None`: an event that is
    /// not the workload's, e.g. a warm-up).
    pub log: BTreeMap<u64, Option<String>>,
    pub runs: Vec<Run>,
    /// `(host, subscription)` → the log's head when it was created: every
    /// answered event above it is owed to it.
    pub starts: HashMap<(String, String), u64>,
    /// `(epoch, host)` for every time a host became the appender.
    pub owners: Vec<(i64, String)>,
    /// The shared subscriptions (see the module doc).
    pub shared: BTreeSet<String>,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    AnsweredNotInLog {
        token: String,
        seq: u64,
    },
    AnsweredWrongSeq {
        token: String,
        answered: u64,
        log: u64,
    },
    FailedButAppended {
        token: String,
        seq: u64,
        why: String,
    },
    AppendedTwice {
        token: String,
        seqs: Vec<u64>,
    },
    SeqNamesTwoEvents {
        seq: u64,
        a: String,
        b: String,
    },
    OutOfOrder {
        host: String,
        subscription: String,
        after: u64,
        seq: u64,
    },
    UnmarkedRepeat {
        host: String,
        subscription: String,
        seq: u64,
    },
    Missing {
        host: String,
        subscription: String,
        seq: u64,
        token: String,
    },
    TwoAppenders {
        epoch: i64,
        hosts: Vec<String>,
    },
    Unanswered {
        token: String,
        host: String,
        why: String,
    },
    SharedHandledTwice {
        subscription: String,
        seq: u64,
        times: usize,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Violation::*;
        match self {
            AnsweredNotInLog { token, seq } => {
                write!(f, "{token}: answered with seq {seq} but not in the log")
            }
            AnsweredWrongSeq { token, answered, log } => write!(
                f,
                "{token}: answered with seq {answered} but the log has it at {log}"
            ),
            FailedButAppended { token, seq, why } => {
                write!(f, "{token}: told it failed ({why}) yet appended at {seq}")
            }
            AppendedTwice { token, seqs } => write!(f, "{token}: appended twice at {seqs:?}"),
            SeqNamesTwoEvents { seq, a, b } => write!(f, "seq {seq} names {a} and {b}"),
            OutOfOrder { host, subscription, after, seq } => write!(
                f,
                "{host}/{subscription}: a run delivered seq {seq} after {after}"
            ),
            UnmarkedRepeat { host, subscription, seq } => write!(
                f,
                "{host}/{subscription}: seq {seq} delivered again without `redelivered`"
            ),
            Missing { host, subscription, seq, token } => write!(
                f,
                "{host}/{subscription}: answered event {token} (seq {seq}) neither delivered nor in a gap"
            ),
            TwoAppenders { epoch, hosts } => write!(f, "epoch {epoch} appended by {hosts:?}"),
            Unanswered { token, host, why } => {
                write!(f, "{token} (published on {host}) got no answer: {why}")
            }
            SharedHandledTwice { subscription, seq, times } => write!(
                f,
                "{subscription} (shared): seq {seq} delivered {times} times without `redelivered`"
            ),
        }
    }
}

impl History {
    /// Every broken rule, in a stable order.
    pub fn check(&self) -> Vec<Violation> {
        let mut v = Vec::new();
        let by_token = self.log_by_token(&mut v);
        self.check_publishes(&by_token, &mut v);
        self.check_runs(&mut v);
        self.check_owners(&mut v);
        v
    }

    /// token → its seqs in the log; an event appended twice is a violation.
    fn log_by_token(&self, v: &mut Vec<Violation>) -> BTreeMap<&str, Vec<u64>> {
        let mut by_token: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (seq, token) in &self.log {
            if let Some(t) = token {
                by_token.entry(t).or_default().push(*seq);
            }
        }
        for (token, seqs) in &by_token {
            if seqs.len() > 1 {
                v.push(Violation::AppendedTwice {
                    token: token.to_string(),
                    seqs: seqs.clone(),
                });
            }
        }
        by_token
    }

    fn check_publishes(&self, by_token: &BTreeMap<&str, Vec<u64>>, v: &mut Vec<Violation>) {
        for p in &self.publishes {
            let in_log = by_token.get(p.token.as_str()).and_then(|s| s.first());
            match (&p.outcome, in_log) {
                (Outcome::Answered { seq, .. }, None) => v.push(Violation::AnsweredNotInLog {
                    token: p.token.clone(),
                    seq: *seq,
                }),
                (Outcome::Answered { seq, .. }, Some(log)) if log != seq => {
                    v.push(Violation::AnsweredWrongSeq {
                        token: p.token.clone(),
                        answered: *seq,
                        log: *log,
                    })
                }
                (Outcome::Failed(why), Some(seq)) => v.push(Violation::FailedButAppended {
                    token: p.token.clone(),
                    seq: *seq,
                    why: why.clone(),
                }),
                (Outcome::Unanswered(why), _) => v.push(Violation::Unanswered {
                    token: p.token.clone(),
                    host: p.host.clone(),
                    why: why.clone(),
                }),
                _ => {}
            }
        }
    }

    fn check_runs(&self, v: &mut Vec<Violation>) {
        // seq → the token first seen for it (log first, then deliveries).
        let mut names: BTreeMap<u64, String> = self
            .log
            .iter()
            .filter_map(|(s, t)| t.clone().map(|t| (*s, t)))
            .collect();
        // (host, subscription) → seqs delivered, and the seqs gaps cover.
        let mut delivered: BTreeMap<(&str, &str), BTreeSet<u64>> = BTreeMap::new();
        let mut covered: BTreeMap<(&str, &str), Vec<(u64, u64)>> = BTreeMap::new();
        // (shared subscription, seq) → deliveries without `redelivered`.
        let mut first_hands: BTreeMap<(&str, u64), usize> = BTreeMap::new();
        for run in &self.runs {
            let shared = self.shared.contains(&run.subscription);
            let host = if shared {
                SHARED_HOST
            } else {
                run.host.as_str()
            };
            let key = (host, run.subscription.as_str());
            let mut last: Option<u64> = None;
            for s in &run.seen {
                match s {
                    Seen::Event {
                        seq,
                        token,
                        redelivered,
                    } => {
                        match names.get(seq) {
                            Some(t) if t != token => v.push(Violation::SeqNamesTwoEvents {
                                seq: *seq,
                                a: t.clone(),
                                b: token.clone(),
                            }),
                            Some(_) => {}
                            None => {
                                names.insert(*seq, token.clone());
                            }
                        }
                        // A shared event taken over from another host (its
                        // claim expired) comes again marked, when it is
                        // taken over: out of this run's order.
                        let taken_over = shared && *redelivered;
                        if let Some(after) = last.filter(|l| seq <= l && !taken_over) {
                            v.push(Violation::OutOfOrder {
                                host: run.host.clone(),
                                subscription: run.subscription.clone(),
                                after,
                                seq: *seq,
                            });
                        }
                        let set = delivered.entry(key).or_default();
                        let fresh = set.insert(*seq);
                        if shared {
                            // Runs of several hosts: their order is not
                            // the order of the deliveries, so count.
                            if !redelivered {
                                *first_hands.entry((key.1, *seq)).or_default() += 1;
                            }
                        } else if !fresh && !redelivered {
                            v.push(Violation::UnmarkedRepeat {
                                host: run.host.clone(),
                                subscription: run.subscription.clone(),
                                seq: *seq,
                            });
                        }
                        if !taken_over {
                            last = Some(*seq);
                        }
                    }
                    Seen::Gap { before } => {
                        covered
                            .entry(key)
                            .or_default()
                            .push((last.unwrap_or(0), *before));
                    }
                }
            }
        }
        for ((sub, seq), times) in first_hands {
            if times > 1 {
                v.push(Violation::SharedHandledTwice {
                    subscription: sub.to_owned(),
                    seq,
                    times,
                });
            }
        }
        let answered: BTreeMap<u64, &str> = self
            .publishes
            .iter()
            .filter_map(|p| match p.outcome {
                Outcome::Answered {
                    seq,
                    duplicate: false,
                } => Some((seq, p.token.as_str())),
                _ => None,
            })
            .collect();
        let mut keys: Vec<_> = self.starts.iter().collect();
        keys.sort();
        for ((host, sub), start) in keys {
            let key = (host.as_str(), sub.as_str());
            let got = delivered.get(&key);
            let gaps = covered.get(&key).map(Vec::as_slice).unwrap_or_default();
            for (seq, token) in answered.range(start + 1..) {
                let seen = got.is_some_and(|g| g.contains(seq));
                let in_gap = gaps.iter().any(|(from, before)| from < seq && seq < before);
                if !seen && !in_gap {
                    v.push(Violation::Missing {
                        host: host.clone(),
                        subscription: sub.clone(),
                        seq: *seq,
                        token: token.to_string(),
                    });
                }
            }
        }
    }

    fn check_owners(&self, v: &mut Vec<Violation>) {
        let mut by_epoch: BTreeMap<i64, BTreeSet<&str>> = BTreeMap::new();
        for (epoch, host) in &self.owners {
            by_epoch.entry(*epoch).or_default().insert(host);
        }
        for (epoch, hosts) in by_epoch {
            if hosts.len() > 1 {
                v.push(Violation::TwoAppenders {
                    epoch,
                    hosts: hosts.into_iter().map(str::to_owned).collect(),
                });
            }
        }
    }
}

/// Parses a consumer's stderr gap line: the seq delivery resumes at.
pub fn parse_gap(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("[event] gap")?;
    let at = rest.find("before seq ")? + "before seq ".len();
    rest[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(token: &str, seq: u64) -> Publish {
        Publish {
            token: token.into(),
            host: "a".into(),
            outcome: Outcome::Answered {
                seq,
                duplicate: false,
            },
        }
    }

    fn ev(seq: u64, token: &str, redelivered: bool) -> Seen {
        Seen::Event {
            seq,
            token: token.into(),
            redelivered,
        }
    }

    fn run(seen: Vec<Seen>) -> Run {
        Run {
            host: "a".into(),
            subscription: "s".into(),
            seen,
        }
    }

    fn base() -> History {
        let mut h = History::default();
        for (i, t) in ["x", "y", "z"].iter().enumerate() {
            h.publishes.push(answered(t, i as u64 + 1));
            h.log.insert(i as u64 + 1, Some(t.to_string()));
        }
        h.starts.insert(("a".into(), "s".into()), 0);
        h
    }

    #[test]
    fn a_clean_history_passes() {
        let mut h = base();
        h.runs.push(run(vec![ev(1, "x", false), ev(2, "y", false)]));
        h.runs.push(run(vec![ev(2, "y", true), ev(3, "z", false)]));
        h.owners = vec![(1, "a".into()), (2, "b".into())];
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn a_missing_event_is_found_unless_a_gap_covers_it() {
        let mut h = base();
        h.runs.push(run(vec![ev(1, "x", false), ev(3, "z", false)]));
        assert_eq!(
            h.check(),
            vec![Violation::Missing {
                host: "a".into(),
                subscription: "s".into(),
                seq: 2,
                token: "y".into()
            }]
        );
        h.runs[0].seen.insert(1, Seen::Gap { before: 3 });
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn publish_and_log_disagreements_are_found() {
        let mut h = base();
        h.publishes.push(Publish {
            token: "w".into(),
            host: "b".into(),
            outcome: Outcome::Failed("no owner".into()),
        });
        h.log.insert(4, Some("w".into()));
        h.log.insert(5, Some("x".into()));
        h.publishes.push(answered("v", 9));
        h.publishes[1].outcome = Outcome::Answered {
            seq: 7,
            duplicate: false,
        };
        h.starts.clear();
        let v = h.check();
        assert!(v.contains(&Violation::AppendedTwice {
            token: "x".into(),
            seqs: vec![1, 5]
        }));
        assert!(v
            .iter()
            .any(|x| matches!(x, Violation::FailedButAppended { seq: 4, .. })));
        assert!(v.contains(&Violation::AnsweredNotInLog {
            token: "v".into(),
            seq: 9
        }));
        assert!(v.contains(&Violation::AnsweredWrongSeq {
            token: "y".into(),
            answered: 7,
            log: 2
        }));
    }

    #[test]
    fn order_repeats_reused_seqs_and_two_appenders_are_found() {
        let mut h = base();
        h.runs.push(run(vec![
            ev(2, "y", false),
            ev(1, "x", false),
            ev(3, "q", false),
        ]));
        h.runs.push(run(vec![ev(2, "y", false)]));
        h.owners = vec![(1, "a".into()), (1, "b".into())];
        let v = h.check();
        assert!(v.iter().any(|x| matches!(
            x,
            Violation::OutOfOrder {
                seq: 1,
                after: 2,
                ..
            }
        )));
        assert!(v
            .iter()
            .any(|x| matches!(x, Violation::SeqNamesTwoEvents { seq: 3, .. })));
        assert!(v
            .iter()
            .any(|x| matches!(x, Violation::UnmarkedRepeat { seq: 2, .. })));
        assert!(v
            .iter()
            .any(|x| matches!(x, Violation::TwoAppenders { epoch: 1, .. })));
    }

    #[test]
    fn a_shared_subscription_counts_across_hosts_and_unanswered_publishes_are_found() {
        let mut h = base();
        h.starts.clear();
        h.starts.insert((SHARED_HOST.into(), "s".into()), 0);
        h.shared.insert("s".into());
        let on = |host: &str, seen| Run {
            host: host.into(),
            subscription: "s".into(),
            seen,
        };
        h.runs
            .push(on("b", vec![ev(2, "y", true), ev(3, "z", false)]));
        h.runs
            .push(on("a", vec![ev(1, "x", false), ev(2, "y", false)]));
        assert_eq!(h.check(), vec![], "one first delivery each, across hosts");
        h.runs.push(on("c", vec![ev(3, "z", false)]));
        h.publishes.push(Publish {
            token: "w".into(),
            host: "c".into(),
            outcome: Outcome::Unanswered("no answer within 90s".into()),
        });
        let v = h.check();
        assert!(v.contains(&Violation::SharedHandledTwice {
            subscription: "s".into(),
            seq: 3,
            times: 2
        }));
        assert!(v.iter().any(|x| matches!(x, Violation::Unanswered { .. })));
    }

    #[test]
    fn gap_lines_parse() {
        assert_eq!(
            parse_gap("[event] gap — lost 3 event(s) before seq 17 (retention)"),
            Some(17)
        );
        assert_eq!(parse_gap("[event] source connected"), None);
    }
}
