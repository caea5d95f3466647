//! `--where`: a subscription's jq expressions, compiled once
//! ([`proto::where_expr::Program`]) and run on each event whose type the
//! subscription already selects. The only place where busd reads an
//! event's payload: the input is the event's line as a consumer sees it
//! ([`proto::where_expr::event_value`]).

use std::sync::Arc;

use proto::where_expr::{EvalError, Program, WhereError};

use crate::eventlog::LoggedEvent;

/// A subscription's `--where` expressions (at least one).
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

    /// Whether `e` passes every expression; an error or the step bound is
    /// `Err` (no match, counted by the subscription).
    pub fn eval(&self, e: &LoggedEvent) -> Result<bool, EvalError> {
        self.0.matches(&e.where_input().0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn logged(event_type: &str, data: &str) -> LoggedEvent {
        let ev = proto::v1::Event {
            seq: 1,
            event_type: event_type.into(),
            data: data.into(),
            ..Default::default()
        };
        LoggedEvent {
            seq: 1,
            event_type: event_type.into(),
            encoded: ev.encode_to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_event_is_read_from_its_encoding() {
        let w = Wheres::compile(&[r#".data.n > 1 and .event_type == "a.b""#.into()])
            .unwrap()
            .unwrap();
        assert_eq!(w.eval(&logged("a.b", r#"{"n":2}"#)), Ok(true));
        assert_eq!(w.eval(&logged("a.b", r#"{"n":1}"#)), Ok(false));
        assert!(Wheres::compile(&[]).unwrap().is_none());
        assert!(Wheres::compile(&[".a ==".into()])
            .unwrap_err()
            .0
            .contains("column"));
        // Bytes that do not decode are an empty event: no match.
        let damaged = LoggedEvent {
            encoded: bytes::Bytes::from_static(b"\xff\xff").into(),
            ..Default::default()
        };
        assert_eq!(w.eval(&damaged), Ok(false));
    }
}
