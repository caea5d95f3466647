//! How an event is written to stdout in each `--format`. The NDJSON object
//! itself (field names and order, omissions) is `proto::ndjson::EventLine`,
//! shared with the bus, which renders the same lines for `ndjson` consumers.

use std::io::{self, Write};

use proto::{ndjson::EventLine, v1};

use crate::cli::{DataMode, Format};

/// Writes events in one format; knows the framing of `json` (an array).
pub struct EventWriter {
    format: Format,
    data: DataMode,
    written: u64,
}

impl EventWriter {
    pub fn new(format: Format, data: DataMode) -> EventWriter {
        EventWriter {
            format,
            data,
            written: 0,
        }
    }

    /// For `json`: the opening bracket, written before the first event.
    pub fn begin(&mut self, out: &mut impl Write) -> io::Result<()> {
        if self.format == Format::Json {
            out.write_all(b"[")?;
        }
        Ok(())
    }

    pub fn event(&mut self, out: &mut impl Write, e: &v1::Event) -> io::Result<()> {
        let line = match self.data {
            DataMode::String => EventLine::from(e),
            DataMode::Json => EventLine::from(e).data_as_json(),
        };
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
        EventWriter::new(Format::Ndjson, DataMode::String)
            .event(&mut out, &ev())
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"type\":\"event\",\"seq\":3,\"event_id\":\"ev-2\",\"event_type\":\"demo.hello\",\
             \"data\":\"{\\\"n\\\":2}\",\"received_at_unix_ms\":10,\"redelivered\":false}\n"
        );
    }

    #[test]
    fn data_json_writes_the_payload_as_a_value() {
        let mut out = vec![];
        EventWriter::new(Format::Ndjson, DataMode::Json)
            .event(&mut out, &ev())
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"type\":\"event\",\"seq\":3,\"event_id\":\"ev-2\",\"event_type\":\"demo.hello\",\
             \"data\":{\"n\":2},\"received_at_unix_ms\":10,\"redelivered\":false}\n"
        );
    }

    #[test]
    fn json_array_is_valid() {
        for n in 0..3 {
            let mut out = vec![];
            let mut w = EventWriter::new(Format::Json, DataMode::String);
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
        EventWriter::new(Format::Raw, DataMode::String)
            .event(&mut out, &ev())
            .unwrap();
        assert_eq!(out, b"{\"n\":2}\n");
    }
}
