//! How an event is written to stdout in each `--format`.
//!
//! The NDJSON object uses the reference CLI's field names, in this order,
//! with empty optional fields omitted:
//! `type, seq, event_id, event_born_time, event_corp_id, event_type,
//! event_unified_app_id, subscribe_id, source_id, rule_type, data, headers,
//! received_at_unix_ms, redelivered, delivery` (fields are only ever
//! added, at the end).

use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use proto::v1;
use serde::Serialize;

use crate::cli::Format;

fn is_zero(v: &i64) -> bool {
    *v == 0
}

#[derive(Serialize)]
struct EventLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    #[serde(skip_serializing_if = "str::is_empty")]
    event_id: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    event_born_time: i64,
    #[serde(skip_serializing_if = "str::is_empty")]
    event_corp_id: &'a str,
    event_type: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    event_unified_app_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    subscribe_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    source_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    rule_type: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    data: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: &'a BTreeMap<String, String>,
    received_at_unix_ms: i64,
    redelivered: bool,
    /// How many times the subscription delivered this event (this one too).
    #[serde(skip_serializing_if = "is_zero_u32")]
    delivery: u32,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

impl<'a> From<&'a v1::Event> for EventLine<'a> {
    fn from(e: &'a v1::Event) -> Self {
        EventLine {
            kind: "event",
            seq: e.seq,
            event_id: &e.event_id,
            event_born_time: e.event_born_time,
            event_corp_id: &e.event_corp_id,
            event_type: &e.event_type,
            event_unified_app_id: &e.event_unified_app_id,
            subscribe_id: &e.subscription_id,
            source_id: &e.source_id,
            rule_type: &e.rule_type,
            data: &e.data,
            headers: &e.headers,
            received_at_unix_ms: e.received_at_unix_ms,
            redelivered: e.redelivered,
            delivery: e.delivery,
        }
    }
}

/// Writes events in one format; knows the framing of `json` (an array).
pub struct EventWriter {
    format: Format,
    written: u64,
}

impl EventWriter {
    pub fn new(format: Format) -> EventWriter {
        EventWriter { format, written: 0 }
    }

    /// For `json`: the opening bracket, written before the first event.
    pub fn begin(&mut self, out: &mut impl Write) -> io::Result<()> {
        if self.format == Format::Json {
            out.write_all(b"[")?;
        }
        Ok(())
    }

    pub fn event(&mut self, out: &mut impl Write, e: &v1::Event) -> io::Result<()> {
        let line = EventLine::from(e);
        match self.format {
            Format::Ndjson => {
                serde_json::to_writer(&mut *out, &line)?;
                out.write_all(b"\n")?;
            }
            Format::Pretty => {
                serde_json::to_writer_pretty(&mut *out, &line)?;
                out.write_all(b"\n")?;
            }
            Format::Json => {
                out.write_all(if self.written == 0 { b"\n  " } else { b",\n  " })?;
                serde_json::to_writer(&mut *out, &line)?;
            }
            Format::Raw => {
                out.write_all(e.data.as_bytes())?;
                out.write_all(b"\n")?;
            }
        }
        self.written += 1;
        Ok(())
    }

    /// For `json`: the closing bracket.
    pub fn end(&mut self, out: &mut impl Write) -> io::Result<()> {
        if self.format == Format::Json {
            out.write_all(if self.written == 0 { b"]\n" } else { b"\n]\n" })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev() -> v1::Event {
        v1::Event {
            seq: 3,
            event_id: "ev-2".into(),
            event_type: "demo.hello".into(),
            data: "{\"n\":2}".into(),
            received_at_unix_ms: 10,
            ..Default::default()
        }
    }

    #[test]
    fn ndjson_field_order_and_omission() {
        let mut out = vec![];
        EventWriter::new(Format::Ndjson)
            .event(&mut out, &ev())
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"type\":\"event\",\"seq\":3,\"event_id\":\"ev-2\",\"event_type\":\"demo.hello\",\
             \"data\":\"{\\\"n\\\":2}\",\"received_at_unix_ms\":10,\"redelivered\":false}\n"
        );
    }

    #[test]
    fn json_array_is_valid() {
        for n in 0..3 {
            let mut out = vec![];
            let mut w = EventWriter::new(Format::Json);
            w.begin(&mut out).unwrap();
            for _ in 0..n {
                w.event(&mut out, &ev()).unwrap();
            }
            w.end(&mut out).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v.as_array().unwrap().len(), n);
        }
    }

    #[test]
    fn raw_is_payload() {
        let mut out = vec![];
        EventWriter::new(Format::Raw)
            .event(&mut out, &ev())
            .unwrap();
        assert_eq!(out, b"{\"n\":2}\n");
    }
}
