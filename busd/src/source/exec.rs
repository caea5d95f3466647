//! The `exec` source: runs a configured command (argv, no shell) and turns
//! each stdout line into one event. A line is a JSON object:
//! `{"event_type": "…", "event_id"?: "…", "data"?: any, "headers"?: {…},
//! "born_time"?: ms}`; `data` that is not a string is stored as its JSON
//! text. A malformed line is counted and logged, never fatal. When the
//! command exits it is restarted with the sources' [`Backoff`] (reset after
//! a run that lasted longer than the backoff cap).
//!
//! Settings ([`settings`]): `command` (argv; env `DWS_EXEC_COMMAND`, split on
//! whitespace), `restart_min` (1s) and `restart_max` (30s).

use std::{collections::BTreeMap, process::Stdio, time::Duration};

use proto::v1;
use serde::Deserialize;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
    time::Instant,
};

use super::{stream::Backoff, Source, SourceContext, SourceFuture};
use crate::{
    clock::now_ms,
    hub::{NewEvent, SourceHandle},
    section::{ConfigError, SectionReader},
};

#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// argv; run without a shell.
    pub command: Vec<String>,
    /// Backoff between restarts when the command exits: doubles from `min` to `max`.
    pub restart_min: Duration,
    pub restart_max: Duration,
}

/// The exec source's settings from its profile section.
pub fn settings(r: &mut SectionReader<'_>) -> Result<ExecConfig, ConfigError> {
    let command = match &r.env.exec_command {
        Some(c) => c.split_whitespace().map(str::to_owned).collect(),
        None => r.section.command.take().unwrap_or_default(),
    };
    if command.is_empty() || command[0].is_empty() {
        return Err(ConfigError::Invalid(format!(
            "the exec source needs a command: set {} (an argv list) or DWS_EXEC_COMMAND",
            r.in_file("command")
        )));
    }
    let restart_min = r.duration(
        "restart_min",
        r.section.restart_min.as_deref(),
        Duration::from_secs(1),
    )?;
    let restart_max = r.duration(
        "restart_max",
        r.section.restart_max.as_deref(),
        Duration::from_secs(30),
    )?;
    if restart_min.is_zero() || restart_max < restart_min {
        return Err(ConfigError::Invalid(
            "restart_min must be more than 0 and at most restart_max".into(),
        ));
    }
    Ok(ExecConfig {
        command,
        restart_min,
        restart_max,
    })
}

/// Longest stdout line accepted; longer lines are counted as malformed.
const MAX_LINE: usize = 1024 * 1024;

pub struct ExecSource {
    pub config: ExecConfig,
}

#[derive(Deserialize)]
struct Line {
    event_type: String,
    #[serde(default)]
    event_id: Option<String>,
    #[serde(default)]
    data: Option<serde_json::Value>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    born_time: Option<i64>,
}

/// Why a stdout line is not an event.
#[derive(Debug, thiserror::Error)]
pub enum MalformedLine {
    #[error("not a JSON event object: {0}")]
    NotJson(serde_json::Error),
    #[error("invalid event_type {0:?}")]
    EventType(String),
}

/// Parses one stdout line into an event, or says why it is malformed.
pub fn parse_line(line: &str) -> Result<NewEvent, MalformedLine> {
    let l: Line = serde_json::from_str(line).map_err(MalformedLine::NotJson)?;
    if !proto::pattern::is_valid_event_type(&l.event_type) {
        return Err(MalformedLine::EventType(l.event_type));
    }
    let data = match l.data {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s,
        Some(other) => other.to_string(),
    };
    Ok(NewEvent {
        scope: "exec".into(),
        event_id: l.event_id.unwrap_or_default(),
        event_type: l.event_type,
        event_born_time: l.born_time.unwrap_or_else(now_ms),
        source_id: "exec".into(),
        data,
        headers: l.headers,
        ..NewEvent::default()
    })
}

fn state(
    status: v1::SourceStatus,
    attempt: u32,
    next_retry_at_unix_ms: i64,
    reason: String,
) -> v1::SourceState {
    v1::SourceState {
        state: status as i32,
        attempt,
        next_retry_at_unix_ms,
        reason,
        since_unix_ms: now_ms(),
    }
}

impl Source for ExecSource {
    fn kind(&self) -> &'static str {
        "exec"
    }

    fn run(self: Box<Self>, mut ctx: SourceContext) -> SourceFuture {
        Box::pin(async move {
            let cfg = self.config;
            let mut backoff = Backoff::new(cfg.restart_min, cfg.restart_max);
            let mut attempt: u32 = 0;
            loop {
                let started = Instant::now();
                let exit = tokio::select! {
                    r = run_once(&cfg, &ctx.hub) => r,
                    _ = ctx.shutdown.recv() => return,
                };
                if started.elapsed() > cfg.restart_max {
                    backoff.reset();
                    attempt = 0;
                }
                attempt += 1;
                let delay = backoff.next_delay();
                tracing::warn!(command = %cfg.command[0], %exit, retry_in = ?delay, "exec source command ended");
                let next = now_ms() + delay.as_millis() as i64;
                ctx.hub.set_source_state(
                    state(v1::SourceStatus::Reconnecting, attempt, next, exit.clone()),
                    Some(exit),
                );
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = ctx.shutdown.recv() => return,
                }
            }
        })
    }
}

/// Runs the command once; returns how it ended.
async fn run_once(cfg: &ExecConfig, hub: &SourceHandle) -> String {
    let mut child = match Command::new(&cfg.command[0])
        .args(&cfg.command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return format!("cannot run {}: {e}", cfg.command[0]),
    };
    let Some(stdout) = child.stdout.take() else {
        return "no stdout pipe".into();
    };
    hub.set_source_state(
        state(v1::SourceStatus::Connected, 0, 0, String::new()),
        None,
    );
    let mut lines = BufReader::with_capacity(64 * 1024, stdout);
    let mut buf = Vec::new();
    let mut line_no: u64 = 0;
    let mut not_yet_durable = 0;
    loop {
        buf.clear();
        match read_bounded_line(&mut lines, &mut buf).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return format!("reading stdout failed: {e}"),
        }
        line_no += 1;
        let text = String::from_utf8_lossy(&buf);
        let text = text.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        if buf.len() > MAX_LINE {
            hub.source_malformed(&format!("line {line_no}: longer than {MAX_LINE} bytes"));
            continue;
        }
        match parse_line(text) {
            Ok(ev) => {
                // Nothing is acked to a command, but a fast one must not
                // outrun the disk without bound: wait now and then.
                let seq = match hub.append(ev) {
                    Ok(a) => a.seq,
                    Err(r) => {
                        hub.source_malformed(&format!("line {line_no}: {}", r.message));
                        continue;
                    }
                };
                not_yet_durable += 1;
                if not_yet_durable >= DURABLE_EVERY {
                    not_yet_durable = 0;
                    if let Err(e) = hub.wait_durable(seq).await {
                        return format!("the store failed: {e}");
                    }
                }
            }
            Err(why) => hub.source_malformed(&format!("line {line_no}: {why}")),
        }
    }
    match child.wait().await {
        Ok(status) => format!("command exited ({status})"),
        Err(e) => format!("command wait failed: {e}"),
    }
}

/// Lines read between two waits for the disk (bounds what is staged).
const DURABLE_EVERY: u32 = 4096;

/// Reads one line, keeping at most `MAX_LINE + 1` bytes of it (the rest of a
/// longer line is consumed and dropped), so a runaway line cannot grow memory.
async fn read_bounded_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(total);
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = (MAX_LINE + 1).saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..take.min(room)]);
        r.consume(take);
        total += take;
        if done {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let e =
            parse_line(r#"{"event_type":"a.b","event_id":"x","data":{"k":1},"headers":{"h":"v"}}"#)
                .unwrap();
        assert_eq!(e.event_type, "a.b");
        assert_eq!(e.event_id, "x");
        assert_eq!(e.data, r#"{"k":1}"#);
        assert_eq!(e.headers["h"], "v");
        assert_eq!(
            parse_line(r#"{"event_type":"a","data":"s"}"#).unwrap().data,
            "s"
        );
        assert!(parse_line("nope").is_err());
        assert!(parse_line(r#"{"data":1}"#).is_err());
        assert!(parse_line(r#"{"event_type":"a.*"}"#).is_err());
    }
}
