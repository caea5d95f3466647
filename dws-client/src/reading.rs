//! Reading without consuming: `dws event get SEQ` (one retained event by
//! seq, the `GetEvent` request) and `dws event subscription list` / `info
//! ID` (the subscriptions as the status document shows them; no request of
//! their own).

use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S, ErrorCode},
};
use serde_json::Value;

use crate::{
    bus::BusConn,
    cli::{DataMode, Format, GetArgs, InfoArgs, ListArgs, TextOrJson},
    exit::{clip, CliError, Result},
    output::EventWriter,
    print_stdout, status, validate,
};

/// `dws event get SEQ`: the event's NDJSON line; exit 1 when the seq is not
/// retained (or no bus runs: an event is read from a running bus only).
pub async fn get(args: GetArgs, endpoint: &Endpoint) -> Result<()> {
    let Some(mut bus) = BusConn::open(endpoint).await? else {
        return Err(CliError::runtime(format!(
            "seq {} is not retained (bus not running)",
            args.seq
        )));
    };
    let reply = bus
        .request(|request_id| {
            C::GetEvent(v1::GetEvent {
                request_id,
                seq: args.seq,
            })
        })
        .await?;
    bus.bye().await;
    let S::EventReply(v1::EventReply {
        event: Some(event), ..
    }) = reply
    else {
        return Err(CliError::runtime(
            "the bus answered GetEvent with an unexpected frame",
        ));
    };
    print_stdout(&line(&event, args.data))
}

/// The event as consume's NDJSON line, in the `--data` mode.
fn line(event: &v1::Event, data: DataMode) -> String {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = EventWriter::new(Format::Ndjson, data).event(&mut out, event);
    String::from_utf8_lossy(&out).into_owned()
}

/// The status document's `subscriptions[]`, and a note when the bus cut
/// the list to fit one frame. No bus: none.
async fn subscriptions(endpoint: &Endpoint) -> Result<Option<(Vec<Value>, Option<String>)>> {
    let Some(fetched) = status::fetch(endpoint).await? else {
        return Ok(None);
    };
    let list = match fetched.json.get("subscriptions") {
        Some(Value::Array(list)) => list.clone(),
        _ => Vec::new(),
    };
    let note = status::cut_note(&fetched.doc);
    Ok(Some((list, note)))
}

/// `dws event subscription list`.
pub async fn list(args: ListArgs, endpoint: &Endpoint) -> Result<()> {
    let (list, note) = subscriptions(endpoint).await?.unwrap_or_default();
    if let Some(note) = note {
        eprintln!("[event] {note}");
    }
    match args.format {
        TextOrJson::Json => print_stdout(&format!("{}\n", pretty(&Value::Array(list)))),
        TextOrJson::Text => print_stdout(&table(&list)),
    }
}

/// `dws event subscription info ID`: exit 1 for an id the bus does not hold.
pub async fn info(args: InfoArgs, endpoint: &Endpoint) -> Result<()> {
    validate::subscription_id("subscription id", &args.id)?;
    let not_found = |why: &str| {
        CliError::from_bus(
            ErrorCode::NotFound as i32,
            &format!("subscription {} not found{why}", clip(&args.id)),
        )
    };
    let Some((list, note)) = subscriptions(endpoint).await? else {
        return Err(not_found(" (bus not running)"));
    };
    let Some(entry) = list
        .into_iter()
        .find(|s| s.get("id").and_then(Value::as_str) == Some(&args.id))
    else {
        return Err(match note {
            Some(note) => not_found(&format!(" ({note})")),
            None => not_found(""),
        });
    };
    match args.format {
        TextOrJson::Json => print_stdout(&format!("{}\n", pretty(&entry))),
        TextOrJson::Text => print_stdout(&key_values(&entry)),
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// The text of `list`: a header, then one line per subscription.
pub fn table(list: &[Value]) -> String {
    let rows: Vec<[String; 6]> = list.iter().map(row).collect();
    let header = ["ID", "STATE", "KEYS", "LAG", "PENDING", "CONSUMER"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn row(s: &Value) -> [String; 6] {
    let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    let num = |k: &str| s.get(k).map_or("?".into(), Value::to_string);
    let keys = match s.get("patterns").and_then(Value::as_array) {
        Some(p) => p
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        None => "?".into(),
    };
    // As in status' STATE column: where a halted one stopped.
    let state = match s.get("halted").and_then(|h| h.get("seq")) {
        Some(seq) => format!("{}@{seq}", text("state")),
        None => text("state"),
    };
    let consumer = match s.get("attached_pid").and_then(Value::as_u64) {
        Some(pid) => format!("pid {pid}"),
        None => "detached".into(),
    };
    [
        text("id"),
        state,
        keys,
        num("lag"),
        num("pending"),
        consumer,
    ]
}

/// The text of `info`: one `key: value` line per field, in the document's
/// order; strings bare, everything else as compact JSON.
pub fn key_values(entry: &Value) -> String {
    let Some(map) = entry.as_object() else {
        return format!("{entry}\n");
    };
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}: {s}\n"),
            other => format!("{k}: {other}\n"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sub(id: &str, pid: Option<u32>) -> Value {
        json!({"id": id, "patterns": ["a.*", "b"], "state": "halted", "lag": 12,
               "pending": 3, "attached_pid": pid, "halted": {"seq": 7}})
    }

    #[test]
    fn the_table_has_a_header_and_one_line_per_subscription() {
        let t = table(&[sub("s1", Some(42)), sub("a-longer-id", None)]);
        assert_eq!(
            t,
            "ID           STATE     KEYS   LAG  PENDING  CONSUMER\n\
             s1           halted@7  a.*,b  12   3        pid 42\n\
             a-longer-id  halted@7  a.*,b  12   3        detached\n"
        );
        assert_eq!(table(&[]), "ID  STATE  KEYS  LAG  PENDING  CONSUMER\n");
        // Not an object: question marks, no panic.
        assert!(table(&[json!(7)]).contains('?'));
    }

    #[test]
    fn info_is_key_value_lines_in_document_order() {
        let v = json!({"id": "s1", "filter": null, "halted": {"seq": 3}, "patterns": ["a"]});
        assert_eq!(
            key_values(&v),
            "id: s1\nfilter: null\nhalted: {\"seq\":3}\npatterns: [\"a\"]\n"
        );
    }
}
