//! `--where`: a subscription's jq expressions ([`proto::where_expr`]) and
//! where they run. The only place where busd reads an event's payload.
//!
//! An expression is one client's code, and some builtins cost more than
//! their input (`indices`, `test` with a large pattern, values doubled
//! many times), so it never runs under the hub lock nor in busd's own
//! process. Events a subscription's keys select wait in its `pending` for
//! a verdict (`subscription::selecting`); the filter thread (`crate::judge`)
//! takes them subscription by subscription, the one that used the least
//! time first ([`fair`]), and runs them in a worker process ([`child`],
//! [`worker`]: `busd` itself, started with [`worker::ARG`]) that has a
//! memory bound, a CPU budget per event and a lower priority. A worker
//! that passes a limit is killed by the kernel (or by busd, past the
//! wall-clock backstop) and started again; the event it was judging is a
//! failure ([`WhereFailure`]), counted in `where_errors`, the first one
//! told to the consumer. Nobody else waits: the committer, fan-out and
//! every other subscription go on while a filter runs. The limits are
//! in [`limits`] and docs/guide.md ("Limits").

mod child;
mod fair;
pub mod limits;
mod wire;
pub mod worker;

pub use child::Pool;
pub use fair::Fair;

use std::{fmt, sync::Arc};

use proto::where_expr::{EvalError, Program, WhereError};

/// A subscription's `--where` expressions (at least one), compiled when
/// the subscription is made (a refusal names the column).
#[derive(Debug, Clone)]
pub struct Wheres(Arc<Program>);

impl Wheres {
    /// `None` for no expressions; the refusal's text for a bad one.
    pub fn compile(exprs: &[String]) -> Result<Option<Wheres>, WhereError> {
        if exprs.is_empty() {
            return Ok(None);
        }
        Program::compile(exprs).map(|p| Some(Wheres(Arc::new(p))))
    }

    pub fn exprs(&self) -> &[String] {
        self.0.exprs()
    }

    /// Whether `other` is this very compilation: a verdict is applied only
    /// to the subscription whose program gave it (a subscription removed
    /// and made again under its id has another).
    pub fn same(&self, other: &Wheres) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Runs the expressions here, in this thread, without the worker's
    /// limits beyond the step bound: the unit tests' evaluator.
    pub fn eval_here(&self, encoded: &[u8]) -> Verdict {
        Verdict::of(self.0.matches(&worker::input_of(encoded).0))
    }
}

/// What the filter says of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Match,
    NoMatch,
    /// No answer: the event is not delivered, and counts in `where_errors`.
    Failed(WhereFailure),
}

impl Verdict {
    /// The interpreter's answer.
    pub fn of(r: Result<bool, EvalError>) -> Verdict {
        match r {
            Ok(true) => Verdict::Match,
            Ok(false) => Verdict::NoMatch,
            Err(EvalError::Raised) => Verdict::Failed(WhereFailure::Raised),
            Err(EvalError::Fuel) => Verdict::Failed(WhereFailure::Steps),
        }
    }
}

/// Why an expression gave no answer for an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhereFailure {
    /// The expression raised an error on this event (`.a.b` of a string):
    /// the usual way of not matching; not told to the consumer.
    Raised,
    /// Past the interpreter's step bound ([`proto::where_expr::FUEL`]).
    Steps,
    /// Past the CPU budget of one event ([`limits::CPU_BUDGET`]).
    Cpu,
    /// Past the worker's memory bound ([`limits::WORKER_MEMORY`]), or its
    /// stack.
    Memory,
    /// No answer within the wall-clock backstop ([`limits::STALL_AFTER`]).
    Stalled,
    /// The worker ended otherwise, or could not be started.
    Crashed,
}

impl WhereFailure {
    /// Past one of the filter's limits (told to the consumer), not an
    /// error of the expression on this event.
    pub fn past_a_limit(self) -> bool {
        self != WhereFailure::Raised
    }
}

impl fmt::Display for WhereFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WhereFailure::Raised => f.write_str("raised an error"),
            WhereFailure::Steps => write!(
                f,
                "ran past its step bound ({} steps)",
                proto::where_expr::FUEL
            ),
            WhereFailure::Cpu => write!(
                f,
                "ran past its CPU budget ({} ms per event)",
                limits::CPU_BUDGET.as_millis()
            ),
            WhereFailure::Memory => write!(
                f,
                "ran past its memory bound ({} MiB)",
                limits::WORKER_MEMORY >> 20
            ),
            WhereFailure::Stalled => write!(
                f,
                "gave no answer within {} s",
                limits::STALL_AFTER.as_secs()
            ),
            WhereFailure::Crashed => f.write_str("could not be run (the filter worker failed)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn encoded(event_type: &str, data: &str) -> Vec<u8> {
        proto::v1::Event {
            seq: 1,
            event_type: event_type.into(),
            data: data.into(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn an_event_is_judged_from_its_encoding() {
        let w = Wheres::compile(&[r#".data.n > 1 and .event_type == "a.b""#.into()])
            .unwrap()
            .unwrap();
        assert_eq!(w.eval_here(&encoded("a.b", r#"{"n":2}"#)), Verdict::Match);
        assert_eq!(w.eval_here(&encoded("a.b", r#"{"n":1}"#)), Verdict::NoMatch);
        assert_eq!(
            w.eval_here(&encoded("a.b", "text")),
            Verdict::Failed(WhereFailure::Raised)
        );
        assert!(Wheres::compile(&[]).unwrap().is_none());
        assert!(Wheres::compile(&[".a ==".into()])
            .unwrap_err()
            .0
            .contains("column"));
        // Bytes that do not decode are an empty event: no match.
        assert_eq!(w.eval_here(b"\xff\xff"), Verdict::NoMatch);
        // One compilation is itself, not another of the same text.
        let again = Wheres::compile(w.exprs()).unwrap().unwrap();
        assert!(w.same(&w.clone()) && !w.same(&again));
    }

    #[test]
    fn only_failures_past_a_limit_are_told() {
        assert!(!WhereFailure::Raised.past_a_limit());
        for f in [
            WhereFailure::Steps,
            WhereFailure::Cpu,
            WhereFailure::Memory,
            WhereFailure::Stalled,
            WhereFailure::Crashed,
        ] {
            assert!(f.past_a_limit());
            assert!(!f.to_string().is_empty());
        }
    }
}
