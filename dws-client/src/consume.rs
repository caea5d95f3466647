//! `dws event consume`: the consumer contract of DESIGN §6.
//!
//! Order of a run: validate every flag (exit 2 before anything is created),
//! connect or spawn the bus, subscribe and attach, print the ready line, then
//! stream. Events are written through a `BufWriter` on the locked stdout and
//! flushed whenever the socket has nothing more to read right now; the
//! cumulative Ack follows each successful flush, so only what reached stdout
//! is ever acked. A clean exit acks, unsubscribes an owned subscription, says
//! Bye and prints the exited line.

use std::{
    io::{self, IsTerminal, Write},
    os::fd::{AsFd, AsRawFd},
    time::Duration,
};

use futures_util::FutureExt;
use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S, ByeReason},
};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::oneshot,
    time::Instant,
};

use crate::{
    bus::BusConn,
    cli::{ConsumeArgs, Format, From},
    exit::{CliError, Result},
    output::EventWriter,
    pump::{Chunk, Progress, StdoutPump, WriteFailure},
    validate,
};

/// Why a run ended, as printed in the exited line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Limit,
    Timeout,
    Signal,
    BusShutdown,
    SourceLost,
    /// The subscription stopped at a poison event.
    Halted,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::Timeout => "timeout",
            Reason::Signal => "signal",
            Reason::BusShutdown => "bus_shutdown",
            Reason::SourceLost => "source_lost",
            Reason::Halted => "halted",
        }
    }

    /// The bus ended the run: the subscription is not ours to clean up.
    fn bus_ended(self) -> bool {
        matches!(
            self,
            Reason::BusShutdown | Reason::SourceLost | Reason::Halted
        )
    }
}

/// A consume run after validation: everything needed, nothing connected.
#[derive(Debug)]
pub struct Plan {
    pub keys: Vec<String>,
    pub filter: String,
    pub subscribe_id: Option<String>,
    pub ephemeral: bool,
    pub from: From,
    pub ttl: Option<Duration>,
    pub max_events: Option<u64>,
    pub duration: Option<Duration>,
    pub format: Format,
    pub quiet: bool,
    pub takeover: bool,
    pub dry_run: bool,
    pub upstream: Option<v1::UpstreamSpec>,
    /// `--ack explicit`: how long an unacked event waits before it comes again.
    pub explicit_ack: Option<Duration>,
    pub max_deliver: u32,
    pub on_poison: v1::PoisonPolicy,
}

/// `--ack-wait` when not given.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// `--max-deliver` / `--on-poison`, checked: what a new subscription gets.
pub fn poison(args: &crate::cli::PoisonArgs) -> Result<(u32, v1::PoisonPolicy)> {
    use crate::cli::OnPoison;
    let policy = match args.on_poison {
        None | Some(OnPoison::Halt) => v1::PoisonPolicy::PoisonHalt,
        Some(OnPoison::Park) => v1::PoisonPolicy::PoisonPark,
    };
    if args.on_poison.is_some() && args.max_deliver.unwrap_or(0) == 0 {
        return Err(CliError::usage(
            "--on-poison needs --max-deliver N (N >= 1): without a limit nothing is poison",
        ));
    }
    Ok((args.max_deliver.unwrap_or(0), policy))
}

/// Checks every flag; no I/O. Errors are usage errors (exit 2).
pub fn plan(args: ConsumeArgs) -> Result<Plan> {
    let keys = validate::event_keys(&args.keys)?;
    if keys.is_empty() && args.subscribe_id.is_none() {
        return Err(CliError::usage(
            "at least one EVENT_KEY is required (or --subscribe-id to resume a subscription)",
        ));
    }
    if let Some(id) = &args.subscribe_id {
        validate::subscription_id("--subscribe-id", id)?;
    }
    let filter = validate::filter(args.filter)?;
    let upstream = validate::upstream(&keys, &args.upstream)?;
    if upstream.is_some() && args.subscribe_id.is_some() {
        return Err(CliError::usage(
            "--rule, --user, --open-dingtalk-id, --group, --query and --filter-json apply to a subscription this run creates; they cannot be used with --subscribe-id",
        ));
    }
    let bounded = args.max_events.is_some() || args.duration.is_some();
    if args.format == Format::Json && !bounded {
        return Err(CliError::usage(
            "--format json writes one array and needs a bound: add --max-events or --duration (or use --format ndjson)",
        ));
    }
    if args.subscribe_id.is_some() && (args.from.is_some() || args.ttl.is_some()) {
        return Err(CliError::usage(
            "--from and --ttl apply to a subscription this run creates; they cannot be used with --subscribe-id",
        ));
    }
    if args.subscribe_id.is_some()
        && (args.poison.max_deliver.is_some() || args.poison.on_poison.is_some())
    {
        return Err(CliError::usage(
            "--max-deliver and --on-poison apply to a subscription this run creates; set them with `dws event subscribe`",
        ));
    }
    let (max_deliver, on_poison) = poison(&args.poison)?;
    let explicit_ack = match (args.ack, args.ack_wait) {
        (crate::cli::AckMode::Explicit, wait) => Some(wait.unwrap_or(DEFAULT_ACK_WAIT)),
        (crate::cli::AckMode::Write, Some(_)) => {
            return Err(CliError::usage("--ack-wait applies to --ack explicit"))
        }
        (crate::cli::AckMode::Write, None) => None,
    };
    Ok(Plan {
        keys,
        filter,
        subscribe_id: args.subscribe_id,
        ephemeral: args.ephemeral,
        from: args.from.unwrap_or(From::Latest),
        ttl: args.ttl,
        max_events: args.max_events,
        duration: args.duration,
        format: args.format,
        quiet: args.quiet,
        takeover: args.takeover,
        dry_run: args.dry_run,
        upstream,
        explicit_ack,
        max_deliver,
        on_poison,
    })
}

impl Plan {
    fn owned(&self) -> bool {
        self.subscribe_id.is_none() || self.ephemeral
    }

    fn bounded(&self) -> bool {
        self.max_events.is_some() || self.duration.is_some()
    }

    /// The resolved configuration, printed by `--dry-run`.
    pub fn describe(&self, endpoint: &Endpoint, stdin_eof_exits: bool) -> serde_json::Value {
        serde_json::json!({
            "profile": endpoint.profile,
            "socket": endpoint.socket_path,
            "work_dir": endpoint.work_dir,
            "event_keys": self.keys,
            "filter": (!self.filter.is_empty()).then_some(&self.filter),
            "subscribe_id": self.subscribe_id,
            "remove_subscription_on_exit": self.owned(),
            "from": match self.from {
                From::Latest => serde_json::json!("latest"),
                From::Earliest => serde_json::json!("earliest"),
                From::Seq(n) => serde_json::json!(n),
            },
            "ttl_ms": self.ttl.map(|d| d.as_millis() as u64),
            "max_events": self.max_events,
            "duration_ms": self.duration.map(|d| d.as_millis() as u64),
            "format": format!("{:?}", self.format).to_lowercase(),
            "quiet": self.quiet,
            "takeover": self.takeover,
            "upstream": self.upstream.as_ref().map(|u| serde_json::json!({
                "rule_type": u.rule_type,
                "user": u.user,
                "open_dingtalk_id": u.open_dingtalk_id,
                "group": u.group,
                "query": u.query,
                "filter_json": u.filter_json,
            })),
            "stdin_eof_exits": stdin_eof_exits,
            "ack": if self.explicit_ack.is_some() { "explicit" } else { "write" },
            "ack_wait_ms": self.explicit_ack.map(|d| d.as_millis() as u64),
            "max_deliver": self.max_deliver,
            "on_poison": if self.on_poison == v1::PoisonPolicy::PoisonPark { "park" } else { "halt" },
        })
    }
}

/// EOF on stdin ends an unbounded run only when stdin is a pipe, socket or
/// regular file: a terminal or `/dev/null` (a character device) never arms it.
pub fn stdin_eof_armed(plan: &Plan) -> bool {
    if plan.bounded() {
        return false;
    }
    let stdin = io::stdin();
    if stdin.is_terminal() {
        return false;
    }
    match nix::sys::stat::fstat(stdin.as_fd().as_raw_fd()) {
        Ok(st) => {
            let kind = st.st_mode & nix::libc::S_IFMT;
            kind == nix::libc::S_IFIFO || kind == nix::libc::S_IFREG || kind == nix::libc::S_IFSOCK
        }
        Err(_) => false,
    }
}

/// Resolves when stdin reaches EOF (or fails). Reads on a plain thread, which
/// the process abandons at exit, so a stdin that never ends costs nothing.
fn watch_stdin_eof() -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        let mut stdin = io::stdin().lock();
        loop {
            match io::Read::read(&mut stdin, &mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    });
    rx
}

fn stderr_line(quiet: bool, line: &str) {
    if !quiet {
        let mut err = io::stderr().lock();
        let _ = writeln!(err, "{line}");
    }
}

/// Runs the consumer; returns after the exited line was printed.
pub async fn run(plan: Plan, endpoint: &Endpoint, stdin_armed: bool) -> Result<()> {
    let started = Instant::now();
    let mut sigterm = signal(SignalKind::terminate())
        .map_err(|e| CliError::runtime(format!("cannot watch signals: {e}")))?;
    let mut sigint = signal(SignalKind::interrupt())
        .map_err(|e| CliError::runtime(format!("cannot watch signals: {e}")))?;

    let (mut bus, reply) = BusConn::open_and_request(endpoint, |request_id| {
        let (start, start_seq) = validate::start(Some(plan.from));
        C::Subscribe(v1::Subscribe {
            request_id,
            subscription_id: plan.subscribe_id.clone().unwrap_or_default(),
            patterns: plan.keys.clone(),
            filter: plan.filter.clone(),
            start: start as i32,
            start_seq,
            ttl_ms: plan.ttl.map_or(0, |d| d.as_millis() as u64),
            attach: true,
            takeover: plan.takeover,
            must_exist: plan.subscribe_id.is_some(),
            owned: plan.subscribe_id.is_none(),
            window: 0,
            upstream: plan.upstream.clone(),
            max_deliver: plan.max_deliver,
            on_poison: plan.on_poison as i32,
            explicit_ack: plan.explicit_ack.is_some(),
            ack_wait_ms: plan.explicit_ack.map_or(0, |d| d.as_millis() as u64),
            // NDJSON is what the bus can render once for every consumer.
            ndjson_lines: plan.format == Format::Ndjson,
        })
    })
    .await?;
    let S::Subscribed(sub) = reply else {
        return Err(CliError::runtime(
            "the bus answered Subscribe with an unexpected frame",
        ));
    };
    stderr_line(
        plan.quiet,
        &format!(
            "[event] ready event_key={} bus_pid={} subscribe_id={}",
            sub.patterns.join(","),
            bus.hello.bus_pid,
            sub.subscription_id
        ),
    );

    let stdout_watch = watch_stdout_close();
    // With explicit acks stdin carries them (and its end still ends an armed
    // run); otherwise it is only watched for its end.
    let mut ack_lines = plan.explicit_ack.map(|_| crate::acks::read_stdin());
    let mut stdin_eof = if stdin_armed && ack_lines.is_none() {
        Some(watch_stdin_eof())
    } else {
        None
    };
    let mut delivered_seqs: std::collections::BTreeSet<u64> = Default::default();
    let deadline = plan.duration.map(|d| started + d);
    let mut pump = StdoutPump::start();
    let mut progress = pump.watch();
    let mut out = Formatter {
        plan: &plan,
        writer: EventWriter::new(plan.format),
        chunk: Chunk::default(),
        received: 0,
        seqs: Vec::new(),
    };
    out.begin();
    // A chunk the pump could not take yet: while one waits, the socket is
    // not read (the bus's credit window bounds what is in flight).
    let mut waiting: Option<Chunk> = None;
    let mut acked_seq: u64 = 0;
    let reason: Result<Reason> = loop {
        if waiting.is_none() && !out.chunk.bytes.is_empty() {
            // The next chunk starts as large as this one: no regrowth.
            let next = Chunk::with_capacity(out.chunk.bytes.len());
            waiting = Some(std::mem::replace(&mut out.chunk, next));
        }
        tokio::select! {
            biased;
            _ = sigterm.recv() => break Ok(Reason::Signal),
            _ = sigint.recv() => break Ok(Reason::Signal),
            _ = sleep_until_opt(deadline) => break Ok(Reason::Timeout),
            _ = recv_opt(&mut stdin_eof) => break Ok(Reason::Signal),
            _ = stdout_closed(stdout_watch.as_ref()) => break Ok(Reason::Signal),
            line = recv_line(&mut ack_lines) => match line {
                Some(crate::acks::Input::Line(n, text)) => {
                    delivered_seqs.extend(out.take_seqs());
                    match settle(&text, &mut delivered_seqs) {
                        Ok(ack) => {
                            let _ = bus.send(C::Ack(ack)).await;
                        }
                        Err(why) => stderr_line(plan.quiet, &format!("[event] stdin line {n} ignored: {why}")),
                    }
                }
                Some(crate::acks::Input::Eof) | None => {
                    ack_lines = None;
                    if stdin_armed {
                        break Ok(Reason::Signal);
                    }
                }
            },
            p = progress.changed() => {
                if let Some(r) = failure_reason(&p) {
                    break r;
                }
                if plan.explicit_ack.is_none() && p.written_seq > acked_seq {
                    acked_seq = p.written_seq;
                    let _ = bus
                        .send(C::Ack(v1::Ack {
                            seq: acked_seq,
                            ..v1::Ack::default()
                        }))
                        .await;
                }
            }
            permit = pump.reserve(), if waiting.is_some() => match permit {
                Some(permit) => {
                    if let Some(chunk) = waiting.take() {
                        permit.send(chunk);
                    }
                }
                // The writer stopped; its progress says why.
                None => break failure_reason(&pump.progress()).unwrap_or(Ok(Reason::Signal)),
            },
            f = bus.next(), if waiting.is_none() => {
                // Handle this frame and whatever else is readable right now,
                // so one burst becomes one chunk (one write to stdout).
                let mut frame = Some(gone_is_eof(f));
                let mut ended = None;
                while let Some(f) = frame.take() {
                    match f.and_then(|f| out.handle(f)) {
                        Ok(None) => frame = bus.next().now_or_never().map(gone_is_eof),
                        Ok(Some(r)) => ended = Some(Ok(r)),
                        Err(e) => ended = Some(Err(e)),
                    }
                }
                if let Some(r) = ended {
                    break r;
                }
            }
        }
    };
    let reason = reason?;

    // Clean exit: finish writing (interruptible by a signal, and bounded
    // when a signal ended the run), ack what reached stdout, remove an owned
    // subscription, say goodbye.
    out.end();
    let mut rest = waiting.into_iter().collect::<Vec<_>>();
    if !out.chunk.bytes.is_empty() {
        rest.push(std::mem::take(&mut out.chunk));
    }
    let drain = async {
        for chunk in rest {
            if pump.send(chunk).await.is_err() {
                break;
            }
        }
        pump.close();
        while !pump.progress().done {
            progress.changed().await;
        }
    };
    let drain_bound = if reason == Reason::Signal {
        DRAIN_AFTER_SIGNAL
    } else {
        Duration::MAX
    };
    tokio::select! {
        _ = drain => {}
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {}
        _ = tokio::time::sleep(drain_bound.min(Duration::from_secs(86_400 * 365))) => {}
    }
    let progress = pump.progress();
    let received = progress.written;
    if !reason.bus_ended() {
        if plan.explicit_ack.is_none() && progress.written_seq > acked_seq {
            let _ = bus
                .send(C::Ack(v1::Ack {
                    seq: progress.written_seq,
                    ..v1::Ack::default()
                }))
                .await;
        }
        if plan.owned() {
            let id = sub.subscription_id.clone();
            let unsubscribed = tokio::time::timeout(
                Duration::from_secs(2),
                bus.request(|request_id| {
                    C::Unsubscribe(v1::Unsubscribe {
                        request_id,
                        subscription_ids: vec![id],
                    })
                }),
            )
            .await;
            if !matches!(unsubscribed, Ok(Ok(_))) {
                stderr_line(
                    plan.quiet,
                    &format!(
                        "[event] warning: could not remove subscription {}; it expires with its ttl",
                        sub.subscription_id
                    ),
                );
            }
        }
        bus.bye().await;
    }
    let secs = started.elapsed().as_secs_f64();
    stderr_line(
        plan.quiet,
        &format!(
            "[event] exited — received {received} event(s) in {secs:.3}s (reason: {})",
            reason.as_str()
        ),
    );
    Ok(())
}

/// Printed before the exited line when the connection ended without a Bye
/// frame (EOF, reset, a frame cut short): the bus crashed or was killed,
/// rather than stopped. The reason stays `bus_shutdown`.
pub const LOST_WITHOUT_BYE: &str = "[event] bus connection lost without goodbye";

/// After a signal, how long the exit waits for stdout to take what was
/// already formatted: long enough for a healthy reader, short enough that a
/// stalled one cannot keep the consumer alive.
const DRAIN_AFTER_SIGNAL: Duration = Duration::from_secs(2);

/// A failed stdout ends the run: a closed pipe gracefully (reason
/// `signal`), anything else as a runtime failure.
fn failure_reason(p: &Progress) -> Option<Result<Reason>> {
    match &p.failed {
        Some(WriteFailure::BrokenPipe) => Some(Ok(Reason::Signal)),
        Some(WriteFailure::Other(e)) => Some(Err(CliError::runtime(format!(
            "cannot write to stdout: {e}"
        )))),
        None if p.done => Some(Ok(Reason::Signal)),
        None => None,
    }
}

/// After the ready line, losing the connection means the bus went away:
/// the run ends with reason `bus_shutdown`, like a clean close (but see
/// [`LOST_WITHOUT_BYE`]).
fn gone_is_eof(frame: Result<Option<S>>) -> Result<Option<S>> {
    match frame {
        Err(e) if e.bus_gone => Ok(None),
        other => other,
    }
}

/// Watches stdout for the error condition a pipe reports once its reader
/// has gone (EPOLLERR), so a consumer whose reader died ends now (reason
/// `signal`) instead of at its next event. `None` when stdout cannot be
/// watched (a regular file or a terminal).
fn watch_stdout_close() -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    let fd = io::stdout().as_fd().try_clone_to_owned().ok()?;
    // SAFETY: `fd` is an open descriptor owned by the AsyncFd for its whole
    // life; OwnedFd always returns that same descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::ERROR) }.ok()
}

async fn stdout_closed(watch: Option<&tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>) {
    match watch {
        Some(w) => {
            let _ = w.ready(tokio::io::Interest::ERROR).await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The next line from the explicit-ack reader; pending forever without one.
async fn recv_line(
    rx: &mut Option<tokio::sync::mpsc::Receiver<crate::acks::Input>>,
) -> Option<crate::acks::Input> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Turns one explicit-ack line into an Ack frame for the events this run
/// delivered (`delivered` shrinks by what is settled).
fn settle(
    text: &str,
    delivered: &mut std::collections::BTreeSet<u64>,
) -> std::result::Result<v1::Ack, String> {
    use crate::acks::AckLine;
    let line = crate::acks::parse(text)?;
    let not_ours = |seq: u64| format!("seq {seq} was not delivered to this run (or is settled)");
    let mut ack = v1::Ack::default();
    match line {
        AckLine::Ack(seq) => {
            if !delivered.remove(&seq) {
                return Err(not_ours(seq));
            }
            ack.seqs.push(seq);
        }
        AckLine::AckUpto(seq) => {
            let upto: Vec<u64> = delivered.range(..=seq).copied().collect();
            if upto.is_empty() {
                return Err(not_ours(seq));
            }
            for s in &upto {
                delivered.remove(s);
            }
            ack.seqs = upto;
        }
        AckLine::Nack(seq, delay) => {
            if !delivered.remove(&seq) {
                return Err(not_ours(seq));
            }
            ack.nacks.push(v1::Nack {
                seq,
                delay_ms: delay.as_millis() as u64,
            });
        }
    }
    Ok(ack)
}

async fn recv_opt(rx: &mut Option<oneshot::Receiver<()>>) {
    match rx {
        Some(r) => {
            let _ = r.await;
        }
        None => std::future::pending().await,
    }
}

/// The output side of a run: formats events into the next chunk for the
/// stdout pump, prints stderr lines for the other frames, and counts.
struct Formatter<'a> {
    plan: &'a Plan,
    writer: EventWriter,
    chunk: Chunk,
    /// Events taken from the bus (for `--max-events`).
    received: u64,
    /// Seqs formatted since the last [`Formatter::take_seqs`] (explicit acks).
    seqs: Vec<u64>,
}

impl Formatter<'_> {
    fn begin(&mut self) {
        // Writing into a Vec cannot fail.
        let _ = self.writer.begin(&mut self.chunk.bytes);
    }

    /// Closes the output (the `json` array).
    fn end(&mut self) {
        let _ = self.writer.end(&mut self.chunk.bytes);
    }

    /// A batch of lines the bus rendered: passed to stdout as they are, cut
    /// at `--max-events`.
    fn lines(&mut self, b: &v1::EventLines) -> Option<Reason> {
        let room = self
            .plan
            .max_events
            .map_or(usize::MAX, |max| max.saturating_sub(self.received) as usize);
        let take = b.seqs.len().min(room);
        let end = if take == b.seqs.len() {
            b.lines.len()
        } else {
            // Lines end in '\n', which JSON text never contains raw.
            b.lines
                .iter()
                .enumerate()
                .filter(|(_, c)| **c == b'\n')
                .nth(take.saturating_sub(1))
                .map_or(0, |(i, _)| i + 1)
        };
        if take == 0 {
            return None;
        }
        self.chunk.bytes.extend_from_slice(&b.lines[..end]);
        self.chunk.last_seq = b.seqs[take - 1];
        self.chunk.events += take as u64;
        self.received += take as u64;
        if self.plan.explicit_ack.is_some() {
            self.seqs.extend_from_slice(&b.seqs[..take]);
        }
        self.plan
            .max_events
            .is_some_and(|max| self.received >= max)
            .then_some(Reason::Limit)
    }

    /// The seqs formatted since the last call, for explicit acks.
    fn take_seqs(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.seqs)
    }

    /// Handles one frame; `Some(reason)` ends the run.
    fn handle(&mut self, frame: Option<S>) -> Result<Option<Reason>> {
        let Some(frame) = frame else {
            // A bus that stops says Bye first (handled below); this one
            // vanished.
            stderr_line(self.plan.quiet, LOST_WITHOUT_BYE);
            return Ok(Some(Reason::BusShutdown));
        };
        match frame {
            S::Event(e) => {
                if let Err(err) = self.writer.event(&mut self.chunk.bytes, &e) {
                    return Err(CliError::runtime(format!("cannot format an event: {err}")));
                }
                self.chunk.last_seq = e.seq;
                self.chunk.events += 1;
                if self.plan.explicit_ack.is_some() {
                    self.seqs.push(e.seq);
                }
                self.received += 1;
                if self.plan.max_events.is_some_and(|max| self.received >= max) {
                    return Ok(Some(Reason::Limit));
                }
            }
            S::EventLines(b) => return Ok(self.lines(&b)),
            S::Gap(g) => stderr_line(
                self.plan.quiet,
                &format!(
                    "[event] gap — lost {} event(s) before seq {} (retention)",
                    g.lost, g.resume_seq
                ),
            ),
            S::SourceState(s) => {
                let status = v1::SourceStatus::try_from(s.state).unwrap_or_default();
                let name = proto::source_status_name(status);
                let detail = if s.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", s.reason)
                };
                stderr_line(self.plan.quiet, &format!("[event] source {name}{detail}"));
            }
            S::Bye(b) => {
                let reason = ByeReason::try_from(b.reason).unwrap_or(ByeReason::Unspecified);
                return Ok(Some(match reason {
                    ByeReason::SourceLost => Reason::SourceLost,
                    ByeReason::Halted => {
                        stderr_line(self.plan.quiet, &b.message);
                        Reason::Halted
                    }
                    _ => Reason::BusShutdown,
                }));
            }
            S::Error(e) => return Err(CliError::from_bus(e.code, &e.message)),
            _ => {}
        }
        Ok(None)
    }
}
