//! Reading without consuming: `dws event get SEQ` (one retained event by
//! seq, the `GetEvent` request) and `dws event subscription list` / `info
//! ID` (the subscriptions as the status document shows them; no request of
//! their own). Without a bus, `list` says so as `status` does (`bus not
//! running …`, exit 0; JSON: the same `running: false` document): the named
//! subscriptions are on disk, not gone, so an empty list would mislead.

use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S, ErrorCode},
};
use serde_json::Value;

use crate::{
    bus::BusConn,
    cli::{DataMode, Format, GetArgs, InfoArgs, ListArgs, TextOrJson},
    exit::{clip, CliError, Result},
    human,
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

/// What `list` and `info` read: the status document's `subscriptions[]`,
/// the bus's clock, and a note when the bus cut the list to fit one frame.
struct Listed {
    list: Vec<Value>,
    now_ms: i64,
    note: Option<String>,
}

/// [`Listed`], or `None` when no bus runs.
async fn subscriptions(endpoint: &Endpoint) -> Result<Option<Listed>> {
    let Some(fetched) = status::fetch(endpoint).await? else {
        return Ok(None);
    };
    let list = match fetched.json.get("subscriptions") {
        Some(Value::Array(list)) => list.clone(),
        _ => Vec::new(),
    };
    let note = status::cut_note(&fetched.doc);
    let now_ms = fetched.doc.now_unix_ms();
    Ok(Some(Listed { list, now_ms, note }))
}

/// `dws event subscription list`.
pub async fn list(args: ListArgs, endpoint: &Endpoint) -> Result<()> {
    let Some(Listed { list, note, .. }) = subscriptions(endpoint).await? else {
        return print_stdout(&match args.format {
            TextOrJson::Json => format!("{}\n", pretty(&status::not_running_json(endpoint))),
            TextOrJson::Text => status::not_running_line(endpoint, None),
        });
    };
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
    let Some(Listed { list, now_ms, note }) = subscriptions(endpoint).await? else {
        return Err(CliError::runtime(format!(
            "cannot show subscription {}: {}",
            clip(&args.id),
            status::not_running_line(endpoint, None).trim_end()
        )));
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
        TextOrJson::Text => print_stdout(&key_values(&entry, now_ms)),
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
    // Every worker of a shared subscription, not only the first.
    let pids: Vec<String> = s
        .get("workers")
        .and_then(Value::as_array)
        .map(|w| {
            w.iter()
                .filter_map(|w| w.get("pid").and_then(Value::as_u64))
                .map(|p| p.to_string())
                .collect()
        })
        .unwrap_or_default();
    let consumer = match (pids.len(), s.get("attached_pid").and_then(Value::as_u64)) {
        (n, _) if n > 1 => format!("{n}: pid {}", pids.join(",")),
        (_, Some(pid)) => format!("pid {pid}"),
        _ => "detached".into(),
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
/// order; strings bare, everything else as compact JSON, except what
/// people read as time (`now_ms` is the bus's clock): a `…_unix_ms` field
/// is a local RFC 3339 time and how long ago (`detached_since:
/// 2026-12-04T09:52:00+08:00 (10m 31s ago)`), a `…_ms` one a duration
/// (`ttl: 2h`), each named without its unit; unset: `-` (a TTL: `never`).
pub fn key_values(entry: &Value, now_ms: i64) -> String {
    let Some(map) = entry.as_object() else {
        return format!("{entry}\n");
    };
    map.iter()
        .map(|(k, v)| {
            if let Some(name) = k.strip_suffix("_unix_ms") {
                let shown = v.as_i64().map_or("-".into(), |t| {
                    format!("{} ({})", human::local_time(t), human::ago(now_ms, t))
                });
                return format!("{name}: {shown}\n");
            }
            if let Some(name) = k.strip_suffix("_ms") {
                let shown = match v {
                    Value::Null if name == "ttl" => "never".to_owned(),
                    Value::Array(a) if a.is_empty() => "-".to_owned(),
                    Value::Array(a) => a.iter().map(ms_text).collect::<Vec<_>>().join(", "),
                    other => ms_text(other),
                };
                return format!("{name}: {shown}\n");
            }
            match (k.as_str(), v) {
                ("workers", Value::Array(w)) if w.is_empty() => "workers: -\n".into(),
                ("workers", Value::Array(w)) => format!(
                    "workers: {}\n",
                    w.iter()
                        .map(|w| format!(
                            "pid {} ({} in flight)",
                            w.get("pid").unwrap_or(&Value::Null),
                            w.get("in_flight").unwrap_or(&Value::Null)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                ("halted", Value::Object(h)) => format!(
                    "halted: at seq {} (event {}) after {}, since {}\n",
                    h.get("seq").unwrap_or(&Value::Null),
                    h.get("event_id").and_then(Value::as_str).unwrap_or("?"),
                    deliveries(h.get("deliveries").and_then(Value::as_u64).unwrap_or(0)),
                    h.get("since_unix_ms")
                        .and_then(Value::as_i64)
                        .map_or("-".into(), human::local_time)
                ),
                (_, Value::String(s)) => format!("{k}: {s}\n"),
                (_, other) => format!("{k}: {other}\n"),
            }
        })
        .collect()
}

/// A millisecond count as a duration; anything else as it is, `-` unset.
fn ms_text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        v => v
            .as_i64()
            .map_or_else(|| v.to_string(), human::duration_signed_ms),
    }
}

/// `1 delivery`, `3 deliveries`.
pub fn deliveries(n: u64) -> String {
    if n == 1 {
        "1 delivery".into()
    } else {
        format!("{n} deliveries")
    }
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
        let v = json!({"id": "s1", "filter": null, "state": "active", "patterns": ["a"]});
        assert_eq!(
            key_values(&v, 0),
            "id: s1\nfilter: null\nstate: active\npatterns: [\"a\"]\n"
        );
    }

    #[test]
    fn info_shows_times_and_durations_for_people() {
        let v = json!({"detached_since_unix_ms": 1_000_000_000_000i64, "expires_at_unix_ms": null,
                       "ttl_ms": null, "oldest_unacked_age_ms": 846_100, "backoff_ms": [1000, 60000],
                       "ack_wait_ms": null,
                       "halted": {"seq": 7, "event_id": "e7", "deliveries": 1,
                                  "since_unix_ms": 1_000_000_000_000i64}});
        let text = key_values(&v, 1_000_000_631_700);
        let local = human::local_time(1_000_000_000_000);
        assert_eq!(
            text,
            format!(
                "detached_since: {local} (10m 31s ago)\nexpires_at: -\nttl: never\n\
                 oldest_unacked_age: 14m 6s\nbackoff: 1s, 1m\nack_wait: -\n\
                 halted: at seq 7 (event e7) after 1 delivery, since {local}\n"
            )
        );
    }
}
