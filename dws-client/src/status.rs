//! `dws event status`: the bus's own status document (JSON, documented in
//! docs/guide.md) passed through, or rendered as a readable report. Never
//! spawns a bus: with none running it says so and exits 0.

use std::fmt::Write as _;

use proto::{
    paths::Endpoint,
    status::{NotRunningDoc, StatusDoc},
    v1::{self, client_frame::Kind as C, server_frame::Kind as S},
};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    bus::BusConn,
    cli::{StatusArgs, StatusFormat},
    exit::{CliError, Result},
    human,
    metrics::{self, Flavor},
};

/// A status document as the bus sent it (passed through as is by `--format
/// json`, so fields this build does not know are kept) and as read.
pub struct Fetched {
    pub json: Value,
    pub doc: StatusDoc,
}

/// Fetches the status document, or `None` when no bus is running.
pub async fn fetch(endpoint: &Endpoint) -> Result<Option<Fetched>> {
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
    let unreadable = |e: serde_json::Error| {
        CliError::runtime(format!("the bus sent an unreadable status document: {e}"))
    };
    let json: Value = serde_json::from_str(&r.json).map_err(unreadable)?;
    let doc = StatusDoc::deserialize(&json).map_err(unreadable)?;
    Ok(Some(Fetched { json, doc }))
}

pub async fn run(args: StatusArgs, endpoint: &Endpoint) -> Result<()> {
    if args.watch {
        return watch(&args, endpoint).await;
    }
    let report = match fetch(endpoint).await? {
        Some(fetched) => Report::Running(Box::new(fetched)),
        None => Report::NotRunning(not_running(endpoint)),
    };
    report.note_cut(args.format);
    crate::print_stdout(&report.print(args.format, endpoint, true))
}

/// When the bus cut its lists to fit one frame: what is missing, for
/// stderr (`[event] ` and this).
pub fn cut_note(doc: &StatusDoc) -> Option<String> {
    let t = doc.truncated.as_ref()?;
    let mut what = vec![];
    if (doc.subscriptions.len() as u64) < t.subscriptions_total {
        what.push(format!(
            "{} of its {} subscriptions",
            doc.subscriptions.len(),
            t.subscriptions_total
        ));
    }
    if (doc.consumers.len() as u64) < t.consumers_total {
        what.push(format!(
            "{} of its {} consumers",
            doc.consumers.len(),
            t.consumers_total
        ));
    }
    (!what.is_empty()).then(|| {
        format!(
            "the bus listed {} (the status document must fit one frame); its totals \
             (subscription_totals, the dws_subscriptions metrics) count them all",
            what.join(" and ")
        )
    })
}

/// What one status says: a bus's document, or that none runs.
enum Report {
    Running(Box<Fetched>),
    NotRunning(NotRunningDoc),
}

impl Report {
    /// The [`cut_note`] on stderr: for the formats a program reads (the
    /// text report says it in its own lines).
    fn note_cut(&self, format: StatusFormat) {
        if let (Report::Running(f), false) = (self, format == StatusFormat::Text) {
            if let Some(note) = cut_note(&f.doc) {
                eprintln!("[event] {note}");
            }
        }
    }

    /// One status as printed: the document (pretty or one line) or the
    /// text report; without a bus, the `running: false` document or line.
    fn print(&self, format: StatusFormat, endpoint: &Endpoint, pretty: bool) -> String {
        let flavor = match format {
            StatusFormat::Prometheus => Some(Flavor::Prometheus),
            StatusFormat::Openmetrics => Some(Flavor::OpenMetrics),
            StatusFormat::Text | StatusFormat::Json => None,
        };
        if let Some(flavor) = flavor {
            return match self {
                Report::Running(f) if f.doc.running => metrics::render(&f.doc, flavor),
                _ => metrics::render_not_running(&endpoint.profile, flavor),
            };
        }
        let not_running_json;
        let json = match self {
            Report::Running(f) => &f.json,
            Report::NotRunning(doc) => {
                not_running_json = serde_json::to_value(doc).unwrap_or_else(
                    |e| serde_json::json!({"running": false, "error": e.to_string()}),
                );
                &not_running_json
            }
        };
        match (format, self) {
            (StatusFormat::Json, _) if pretty => format!("{json:#}\n"),
            (StatusFormat::Json, _) => format!("{json}\n"),
            (_, Report::Running(f)) if f.doc.running => render(&f.doc),
            (_, Report::Running(f)) => not_running_line(endpoint, f.json["error"].as_str()),
            (_, Report::NotRunning(doc)) => not_running_line(endpoint, doc.error.as_deref()),
        }
    }
}

/// The one line that says no bus runs (text).
pub fn not_running_line(endpoint: &Endpoint, error: Option<&str>) -> String {
    format!(
        "bus not running (profile {}, socket {}){}\n",
        endpoint.profile,
        endpoint.socket_path.display(),
        error.map_or(String::new(), |e| format!(": {e}"))
    )
}

fn not_running(endpoint: &Endpoint) -> NotRunningDoc {
    NotRunningDoc::new(endpoint.profile.clone(), endpoint.socket_path.clone())
}

/// The `running: false` document (JSON).
pub fn not_running_json(endpoint: &Endpoint) -> Value {
    serde_json::to_value(not_running(endpoint))
        .unwrap_or_else(|e| serde_json::json!({"running": false, "error": e.to_string()}))
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
    let in_place = args.format == StatusFormat::Text && std::io::stdout().is_terminal();
    loop {
        let fetched = tokio::select! {
            r = fetch(endpoint) => r,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        let report = match fetched {
            Ok(Some(fetched)) => Report::Running(Box::new(fetched)),
            Ok(None) => Report::NotRunning(not_running(endpoint)),
            Err(e) => Report::NotRunning(NotRunningDoc {
                error: Some(e.message),
                ..not_running(endpoint)
            }),
        };
        report.note_cut(args.format);
        let body = report.print(args.format, endpoint, false);
        let now = human::local_time(human::now_ms());
        let frame = match args.format {
            StatusFormat::Json | StatusFormat::Prometheus | StatusFormat::Openmetrics => body,
            // Home, clear the screen, redraw: one write, so no flicker.
            StatusFormat::Text if in_place => format!(
                "\x1b[H\x1b[2J--- {now}  every {}  (Ctrl-C to quit)\n{body}",
                human::duration_ms(args.interval.as_millis() as u64)
            ),
            StatusFormat::Text => format!("--- {now}\n{body}"),
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

/// A value as shown, `-` when unset.
fn s<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A time relative to the bus's clock: `10m 31s ago`, `in 5s`; `-` unset.
fn ago(now_ms: i64, v: Option<i64>) -> String {
    v.map_or_else(|| "-".into(), |t| human::ago(now_ms, t))
}

fn until(now_ms: i64, v: Option<i64>) -> String {
    ago(now_ms, v)
}

/// What an operator should know after an upgrade: the running bus is not
/// the installed build, or not this client's version.
fn upgrade_warnings(bus: &proto::status::BusDoc) -> Vec<String> {
    let mut w = vec![];
    if bus.executable_replaced {
        w.push(
            "its executable was replaced on disk since it started (a new build is installed): \
             `dws event restart` runs the installed one"
                .to_owned(),
        );
    }
    if !bus.version.is_empty() && bus.version != proto::BUILD {
        w.push(format!(
            "it runs version {}, this dws is {}: `dws event restart` after installing",
            bus.version,
            proto::BUILD
        ));
    }
    w
}

/// A byte count as people read it: `512 B`, `4.0 KiB`, `64.0 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
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
pub fn render(doc: &StatusDoc) -> String {
    let now = doc.now_unix_ms();
    let (bus, src, log) = (&doc.bus, &doc.source, &doc.log);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "bus        pid {}  profile {}  version {}  up {}  (since {})",
        bus.pid,
        bus.profile,
        bus.version,
        human::duration_ms(bus.uptime_ms),
        human::local_time(bus.started_at_unix_ms)
    );
    for warning in upgrade_warnings(bus) {
        let _ = writeln!(o, "           ! {warning}");
    }
    let idle = bus.idle_timeout_ms;
    let _ = writeln!(
        o,
        "           idle timeout {}  socket {}",
        if idle == 0 {
            "never".to_owned()
        } else {
            human::duration_ms(idle)
        },
        bus.socket.display()
    );
    let _ = writeln!(
        o,
        "source     {} {}  since {}  reconnects {}  last error {}  next retry {}",
        src.kind,
        src.state,
        ago(now, src.since_unix_ms),
        src.reconnects,
        s(src.last_error.as_deref()),
        until(now, src.next_retry_at_unix_ms),
    );
    let _ = writeln!(
        o,
        "log        seq {}..{}  {} event(s)  {}  (max {} events / {})  retention held by {}",
        s(log.oldest_seq),
        log.head_seq,
        log.events,
        bytes(log.bytes),
        log.max_events,
        bytes(log.max_bytes),
        s(log.retention_held_by.as_deref()),
    );
    let consumers = &doc.consumers;
    let cut = doc.truncated.as_ref();
    let of = |listed: usize, total: Option<u64>| match total {
        Some(t) if (listed as u64) < t => {
            format!("{listed} of {t}: the bus cut the list to fit one frame")
        }
        _ => listed.to_string(),
    };
    let _ = writeln!(
        o,
        "\nconsumers ({})",
        of(consumers.len(), cut.map(|t| t.consumers_total))
    );
    if !consumers.is_empty() {
        let rows: Vec<Vec<String>> = consumers
            .iter()
            .map(|c| {
                vec![
                    c.pid.to_string(),
                    c.subscription_id.clone(),
                    c.delivered.to_string(),
                    c.acked.to_string(),
                    c.in_flight.to_string(),
                ]
            })
            .collect();
        table(
            &mut o,
            &["PID", "SUBSCRIPTION", "DELIVERED", "ACKED", "IN-FLIGHT"],
            &rows,
        );
    }
    let subs = &doc.subscriptions;
    let expired = &doc.bus.expired;
    let removed = match expired.recent.last() {
        Some(last) if expired.total > 0 => format!(
            "  {} removed by their ttl (last {} {})",
            expired.total,
            last.id,
            ago(now, Some(last.expired_at_unix_ms))
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        o,
        "\nsubscriptions ({}){removed}",
        of(subs.len(), cut.map(|t| t.subscriptions_total))
    );
    // What the rows cannot say when some are missing.
    let subs_cut = cut.is_some_and(|t| (subs.len() as u64) < t.subscriptions_total);
    if let Some(t) = doc.subscription_totals.as_ref().filter(|_| subs_cut) {
        let _ = writeln!(
            o,
            "  in all {}: {} attached, {} halted, {} disabled; {} pending, {} parked event(s)",
            t.count, t.attached, t.halted, t.disabled, t.pending, t.parked
        );
    }
    if !subs.is_empty() {
        let rows: Vec<Vec<String>> = subs
            .iter()
            .map(|x| {
                let attached = match x.attached_pid {
                    // A work queue's every worker.
                    Some(_) if x.workers.len() > 1 => format!(
                        "{}: pid {}",
                        x.workers.len(),
                        x.workers
                            .iter()
                            .map(|w| w.pid.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                    Some(pid) => format!("pid {pid}"),
                    None => format!("detached {}", ago(now, x.detached_since_unix_ms)),
                };
                let age = x
                    .oldest_unacked_age_ms
                    .map_or("-".to_owned(), human::duration_signed_ms);
                let state = match &x.halted {
                    Some(h) if x.state == "halted" => format!("halted@{}", h.seq),
                    _ => x.state.clone(),
                };
                vec![
                    x.id.clone(),
                    state,
                    x.patterns.join(","),
                    s(x.filter.as_deref()),
                    if x.owned { "yes" } else { "no" }.into(),
                    attached,
                    match (x.attached_pid, x.ttl_ms) {
                        (None, None) => "never".into(),
                        _ => until(now, x.expires_at_unix_ms),
                    },
                    x.cursor.to_string(),
                    x.head_seq.to_string(),
                    x.lag.to_string(),
                    age,
                    x.redelivered.to_string(),
                    match x.next_due_unix_ms {
                        Some(_) if x.delayed > 0 => {
                            format!("{} ({})", x.delayed, until(now, x.next_due_unix_ms))
                        }
                        _ => "-".into(),
                    },
                    x.parked.to_string(),
                    x.lost_to_retention.to_string(),
                ]
            })
            .collect();
        table(
            &mut o,
            &[
                "ID",
                "STATE",
                "KEYS",
                "FILTER",
                "OWNED",
                "CONSUMER",
                "EXPIRES",
                "CURSOR",
                "HEAD",
                "LAG",
                "OLDEST-UNACKED",
                "REDELIVERED",
                "DELAYED",
                "PARKED",
                "LOST",
            ],
            &rows,
        );
    }
    let types = &doc.event_types;
    let _ = writeln!(o, "\nevent types ({})", types.len());
    if !types.is_empty() {
        let rows: Vec<Vec<String>> = types
            .iter()
            .map(|t| {
                vec![
                    t.event_type.clone(),
                    t.received.to_string(),
                    t.duplicates.to_string(),
                ]
            })
            .collect();
        table(&mut o, &["TYPE", "RECEIVED", "DUPLICATES-DROPPED"], &rows);
    }
    if let Some(c) = &doc.cluster {
        render_cluster(&mut o, c, now);
    }
    o
}

/// The upstream lease on the database's clock: who holds it, its epoch,
/// when it expires or since when it has expired.
fn lease_line(l: &proto::status::ClusterLeaseDoc) -> String {
    let secs = |ms: i64| format!("{:.1}s", ms.unsigned_abs() as f64 / 1000.0);
    match (&l.holder, l.expires_in_ms) {
        (None, _) => format!("none (epoch {})", l.epoch),
        (Some(h), Some(ms)) if !l.expired => {
            format!("{h}  epoch {}  expires in {}", l.epoch, secs(ms))
        }
        (Some(h), Some(ms)) => format!(
            "{h}  epoch {}  expired {} ago: no owner until another host takes it",
            l.epoch,
            secs(ms)
        ),
        (Some(h), None) => format!("{h}  epoch {}  no expiry recorded", l.epoch),
    }
}

/// The cluster section (`store = "postgres"`): who owns the upstream, the
/// hosts, and every host's cursor of every named subscription.
fn render_cluster(o: &mut String, c: &proto::status::ClusterDoc, now: i64) {
    let _ = writeln!(
        o,
        "\ncluster    {}  this host {} ({})  owner {} since {}  epoch {}  head {}  read {:.1}s ago{}",
        c.name,
        c.host,
        c.role,
        s(c.owner.as_deref()),
        ago(now, c.owner_since_unix_ms),
        c.epoch,
        c.head_seq,
        c.read_age_ms as f64 / 1000.0,
        c.last_error
            .as_deref()
            .map_or(String::new(), |e| format!("  error: {e}")),
    );
    if let Some(l) = &c.lease {
        let _ = writeln!(o, "lease      {}", lease_line(l));
    }
    let hosts: Vec<Vec<String>> = c
        .hosts
        .iter()
        .map(|h| {
            vec![
                h.host.clone(),
                h.pid.to_string(),
                h.version.clone(),
                human::duration_ms(h.heartbeat_age_ms),
            ]
        })
        .collect();
    if !hosts.is_empty() {
        table(o, &["HOST", "PID", "VERSION", "HEARTBEAT AGE"], &hosts);
    }
    let cursors: Vec<Vec<String>> = c
        .cursors
        .iter()
        .map(|x| {
            vec![
                x.subscription.clone(),
                x.delivery.clone(),
                x.host.clone(),
                x.cursor.to_string(),
                x.lag.to_string(),
            ]
        })
        .collect();
    if !cursors.is_empty() {
        let _ = writeln!(o);
        table(
            o,
            &["SUBSCRIPTION", "DELIVERY", "HOST", "CURSOR", "LAG"],
            &cursors,
        );
    }
}
