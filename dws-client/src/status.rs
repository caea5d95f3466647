//! `dws event status`: the bus's own status document (JSON, documented in
//! the README) passed through, or rendered as a readable report. Never
//! spawns a bus: with none running it says so and exits 0.

use std::fmt::Write as _;

use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S},
};
use serde_json::Value;

use crate::{
    bus::BusConn,
    cli::{StatusArgs, TextOrJson},
    exit::{CliError, Result},
};

/// Fetches the status document, or `None` when no bus is running.
pub async fn fetch(endpoint: &Endpoint) -> Result<Option<Value>> {
    let Some(mut bus) = BusConn::open(endpoint).await? else {
        return Ok(None);
    };
    let reply = bus
        .request(|request_id| C::StatusRequest(v1::StatusRequest { request_id }))
        .await?;
    bus.bye().await;
    let S::StatusReply(r) = reply else {
        return Err(CliError::runtime(
            "the bus answered StatusRequest with an unexpected frame",
        ));
    };
    serde_json::from_str(&r.json)
        .map(Some)
        .map_err(|e| CliError::runtime(format!("the bus sent an unreadable status document: {e}")))
}

pub async fn run(args: StatusArgs, endpoint: &Endpoint) -> Result<()> {
    if args.watch {
        return watch(&args, endpoint).await;
    }
    let doc = fetch(endpoint).await?;
    crate::print_stdout(&report(args.format, doc, endpoint, true))
}

/// One status as printed: the document (pretty or one line) or the text
/// report; without a bus, the `running: false` document or line.
fn report(format: TextOrJson, doc: Option<Value>, endpoint: &Endpoint, pretty: bool) -> String {
    let doc = doc.unwrap_or_else(|| not_running(endpoint));
    match format {
        TextOrJson::Json if pretty => format!("{doc:#}\n"),
        TextOrJson::Json => format!("{doc}\n"),
        TextOrJson::Text if doc["running"] == true => render(&doc),
        TextOrJson::Text => format!(
            "bus not running (profile {}, socket {}){}\n",
            endpoint.profile,
            endpoint.socket_path.display(),
            doc["error"]
                .as_str()
                .map_or(String::new(), |e| format!(": {e}"))
        ),
    }
}

fn not_running(endpoint: &Endpoint) -> Value {
    serde_json::json!({
        "running": false,
        "profile": endpoint.profile,
        "socket": endpoint.socket_path,
    })
}

/// `status --watch`: one report per interval until SIGINT or SIGTERM (exit
/// 0) or until stdout's reader goes away. On a terminal the text report is
/// redrawn in place; otherwise each report is appended (text: after a
/// `--- <time>` line; json: one document per line). Never starts a bus: a
/// bus that is not running, or that fails to answer, is reported and asked
/// again at the next interval.
async fn watch(args: &StatusArgs, endpoint: &Endpoint) -> Result<()> {
    use std::io::IsTerminal;
    use tokio::signal::unix::{signal, SignalKind};
    let sig =
        |kind| signal(kind).map_err(|e| CliError::runtime(format!("cannot watch signals: {e}")));
    let (mut term, mut int) = (sig(SignalKind::terminate())?, sig(SignalKind::interrupt())?);
    let in_place = args.format == TextOrJson::Text && std::io::stdout().is_terminal();
    loop {
        let fetched = tokio::select! {
            r = fetch(endpoint) => r,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        let doc = match fetched {
            Ok(doc) => doc,
            Err(e) => {
                let mut doc = not_running(endpoint);
                doc["error"] = Value::String(e.message);
                Some(doc)
            }
        };
        let body = report(args.format, doc, endpoint, false);
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let frame = match args.format {
            TextOrJson::Json => body,
            // Home, clear the screen, redraw: one write, so no flicker.
            TextOrJson::Text if in_place => format!(
                "\x1b[H\x1b[2J--- {now}  every {}  (Ctrl-C to quit)\n{body}",
                humantime::format_duration(args.interval)
            ),
            TextOrJson::Text => format!("--- {now}\n{body}"),
        };
        if !write_frame(&frame)? {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        }
    }
}

/// Writes one report; `false` once stdout's reader has gone away.
fn write_frame(frame: &str) -> Result<bool> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(frame.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(CliError::runtime(format!("cannot write to stdout: {e}"))),
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn ago(now_ms: i64, v: &Value) -> String {
    match v.as_i64() {
        Some(t) => format!("{:.1}s ago", (now_ms - t) as f64 / 1000.0),
        None => "-".into(),
    }
}

fn until(now_ms: i64, v: &Value) -> String {
    match v.as_i64() {
        Some(t) => format!("in {:.1}s", (t - now_ms) as f64 / 1000.0),
        None => "-".into(),
    }
}

/// Formats rows as left-aligned columns.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut l = String::from("  ");
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(c.chars().count());
            l.push_str(c);
            if i + 1 < cells.len() {
                l.push_str(&" ".repeat(pad + 2));
            }
        }
        l.trim_end().to_owned() + "\n"
    };
    out.push_str(&line(header.iter().map(|h| h.to_string()).collect()));
    for r in rows {
        out.push_str(&line(r.clone()));
    }
}

/// The text form of the status document.
pub fn render(doc: &Value) -> String {
    let now = doc["bus"]["started_at_unix_ms"].as_i64().unwrap_or(0)
        + doc["bus"]["uptime_ms"].as_i64().unwrap_or(0);
    let bus = &doc["bus"];
    let src = &doc["source"];
    let log = &doc["log"];
    let mut o = String::new();
    let _ = writeln!(
        o,
        "bus        pid {}  profile {}  version {}  up {:.1}s",
        s(&bus["pid"]),
        s(&bus["profile"]),
        s(&bus["version"]),
        bus["uptime_ms"].as_f64().unwrap_or(0.0) / 1000.0
    );
    let idle = bus["idle_timeout_ms"].as_u64().unwrap_or(0);
    let _ = writeln!(
        o,
        "           idle timeout {}  socket {}",
        if idle == 0 {
            "never".to_owned()
        } else {
            format!("{}s", idle as f64 / 1000.0)
        },
        s(&bus["socket"])
    );
    let _ = writeln!(
        o,
        "source     {} {}  since {}  reconnects {}  last error {}  next retry {}",
        s(&src["kind"]),
        s(&src["state"]),
        ago(now, &src["since_unix_ms"]),
        s(&src["reconnects"]),
        s(&src["last_error"]),
        until(now, &src["next_retry_at_unix_ms"]),
    );
    let _ = writeln!(
        o,
        "log        seq {}..{}  {} event(s)  {} byte(s)  (max {} / {})  retention held by {}",
        s(&log["oldest_seq"]),
        s(&log["head_seq"]),
        s(&log["events"]),
        s(&log["bytes"]),
        s(&log["max_events"]),
        s(&log["max_bytes"]),
        s(&log["retention_held_by"]),
    );
    let empty = vec![];
    let consumers = doc["consumers"].as_array().unwrap_or(&empty);
    let _ = writeln!(o, "\nconsumers ({})", consumers.len());
    if !consumers.is_empty() {
        let rows: Vec<Vec<String>> = consumers
            .iter()
            .map(|c| {
                vec![
                    s(&c["pid"]),
                    s(&c["subscription_id"]),
                    s(&c["delivered"]),
                    s(&c["acked"]),
                    s(&c["in_flight"]),
                ]
            })
            .collect();
        table(
            &mut o,
            &["PID", "SUBSCRIPTION", "DELIVERED", "ACKED", "IN FLIGHT"],
            &rows,
        );
    }
    let subs = doc["subscriptions"].as_array().unwrap_or(&empty);
    let _ = writeln!(o, "\nsubscriptions ({})", subs.len());
    if !subs.is_empty() {
        let rows: Vec<Vec<String>> = subs
            .iter()
            .map(|x| {
                let patterns = x["patterns"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
                    .unwrap_or_default();
                let attached = match x["attached_pid"].as_u64() {
                    Some(pid) => format!("pid {pid}"),
                    None => format!("detached {}", ago(now, &x["detached_since_unix_ms"])),
                };
                let age = x["oldest_unacked_age_ms"]
                    .as_f64()
                    .map_or("-".to_owned(), |ms| format!("{:.1}s", ms / 1000.0));
                vec![
                    s(&x["id"]),
                    patterns,
                    s(&x["filter"]),
                    if x["owned"].as_bool() == Some(true) {
                        "yes".into()
                    } else {
                        "no".into()
                    },
                    attached,
                    until(now, &x["expires_at_unix_ms"]),
                    s(&x["cursor"]),
                    s(&x["head_seq"]),
                    s(&x["lag"]),
                    age,
                    s(&x["redelivered"]),
                    s(&x["lost_to_retention"]),
                ]
            })
            .collect();
        table(
            &mut o,
            &[
                "ID",
                "KEYS",
                "FILTER",
                "OWNED",
                "CONSUMER",
                "EXPIRES",
                "CURSOR",
                "HEAD",
                "LAG",
                "OLDEST UNACKED",
                "REDELIVERED",
                "LOST",
            ],
            &rows,
        );
    }
    let types = doc["event_types"].as_array().unwrap_or(&empty);
    let _ = writeln!(o, "\nevent types ({})", types.len());
    if !types.is_empty() {
        let rows: Vec<Vec<String>> = types
            .iter()
            .map(|t| vec![s(&t["event_type"]), s(&t["received"]), s(&t["duplicates"])])
            .collect();
        table(&mut o, &["TYPE", "RECEIVED", "DUPLICATES DROPPED"], &rows);
    }
    o
}
