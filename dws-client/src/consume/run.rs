//! [`run`]: one consume run after validation — subscribe and attach, the
//! ready line, the stream loop (bus frames into stdout chunks, acks after
//! what the stdout writer reports written or what stdin settles, every
//! reason to stop), then the clean exit: stdout drained (bounded after a
//! signal), acked, an owned subscription removed, Bye, the exited line.

use std::{collections::BTreeSet, time::Duration};

use futures_util::FutureExt;
use proto::{
    paths::Endpoint,
    time::sleep_until_opt,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S},
};
use tokio::time::Instant;

use super::{
    complaints::{write_stderr_nowait, Complaints},
    format::Formatter,
    stderr_line,
    watch::{
        recv_line, recv_opt, settle, stdout_closed, watch_stdin_eof, watch_stdout_close, Signals,
    },
    written::WriteAcks,
    Plan, Reason,
};
use crate::{
    acks::Input,
    bus::BusConn,
    cli::{DataMode, Format},
    exit::{CliError, Result},
    pump::{Chunk, Direct, Progress, ProgressWatch, StdoutPump, WriteFailure},
    ring::RingView,
    validate,
};

/// After a signal, how long the exit waits for stdout to take what was
/// already formatted: long enough for a healthy reader, short enough that a
/// stalled one cannot keep the consumer alive.
const DRAIN_AFTER_SIGNAL: Duration = Duration::from_secs(2);

/// How long an ack of written events may wait for more to join it: the
/// timer that sends it when no more events come.
const ACK_DELAY: Duration = Duration::from_millis(20);
/// An ack waiting this long goes out with the next events written, in the
/// wake-up they cost anyway: while events flow the timer never fires, and
/// the bus gets one ack per this interval, not one wake-up per event.
const ACK_PIGGYBACK: Duration = Duration::from_millis(10);
/// Written but unacked events that make the ack go out at once (well below
/// the bus's credit window, so a fast stream never waits for credit).
const ACK_EAGER: u64 = 256;

/// Runs the consumer; returns after the exited line was printed.
pub async fn run(plan: Plan, endpoint: &Endpoint, stdin_armed: bool) -> Result<()> {
    let started = Instant::now();
    let mut signals = Signals::watch()?;

    // The line ring is asked for on the bus the Subscribe goes to (a retry
    // after a bus went away asks its successor), before subscribing:
    // Subscribe.ring_batches says whether this run reads it.
    let mut ring = None;
    let (mut bus, reply) = BusConn::open_and_request(endpoint, |request_id| {
        ring = wants_ring(&plan)
            .then(|| RingView::ask(&endpoint.socket_path))
            .flatten();
        subscribe(&plan, request_id, ring.is_some())
    })
    .await?;
    let S::Subscribed(sub) = reply else {
        return Err(CliError::runtime(
            "the bus answered Subscribe with an unexpected frame",
        ));
    };
    validate::where_echoed(&plan.wheres, &sub)?;
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
    let mut delivered_seqs: BTreeSet<u64> = Default::default();
    let deadline = plan.duration.map(|d| started + d);
    let mut pump = StdoutPump::start();
    let mut progress = pump.watch();
    let mut out = Formatter::new(&plan, &sub.subscription_id, ring);
    out.begin();
    // A chunk the pump could not take yet: while one waits, the socket is
    // not read (the bus's credit window bounds what is in flight).
    let mut waiting: Option<Chunk> = None;
    // `--ack write`: the seqs formatted, acked by name once written.
    let mut write_acks = WriteAcks::default();
    // Bad ack lines: reported within bounds, never waited for.
    let mut complaints = Complaints::default();
    // Acks are coalesced: while events flow, one per ACK_PIGGYBACK sent in
    // a wake-up that wrote events anyway; else after ACK_DELAY; at once when
    // ACK_EAGER events are waiting. A stream of events costs the bus one
    // ack wake-up per 10 ms per consumer, and the consumer no timer wake-up.
    let mut ack_due: Option<Instant> = None;
    // Ring batches read (the formatter copies their lines out at once):
    // told to the bus with the next ack, within ACK_DELAY.
    let mut ring_read = RingRead::default();
    let reason: Result<Reason> = loop {
        if waiting.is_none() && !out.chunk.bytes.is_empty() {
            if pump.can_write_direct() {
                // The fast path: no thread hand-off while stdout keeps up.
                let chunk = std::mem::take(&mut out.chunk);
                match pump.write_direct(chunk) {
                    Direct::Written(empty) => {
                        out.chunk = empty;
                        let p = pump.progress();
                        schedule_ack(&p, &write_acks, &mut ack_due);
                        if piggyback(ack_due, Instant::now()) {
                            ack_due = None;
                            send_acks(&mut bus, &mut write_acks, p.written, &mut ring_read).await;
                        }
                    }
                    Direct::Rest(rest) => waiting = Some(rest),
                    Direct::Failed => {
                        break failure_reason(&pump.progress()).unwrap_or(Ok(Reason::Signal))
                    }
                }
            } else {
                // The next chunk starts as large as this one: no regrowth.
                let next = Chunk::with_capacity(out.chunk.bytes.len());
                waiting = Some(std::mem::replace(&mut out.chunk, next));
            }
        }
        tokio::select! {
            biased;
            _ = signals.recv() => break Ok(Reason::Signal),
            _ = sleep_until_opt(deadline) => break Ok(Reason::Timeout),
            _ = recv_opt(&mut stdin_eof) => break Ok(Reason::Signal),
            _ = stdout_closed(stdout_watch.as_ref()) => break Ok(Reason::Signal),
            line = recv_line(&mut ack_lines) => match line {
                Some(Input::Line(n, text)) => {
                    match settle(&text, &mut delivered_seqs) {
                        Ok(ack) => {
                            let _ = bus.send(C::Ack(ack)).await;
                        }
                        Err(why) => complaints.complain(plan.quiet, n, &why),
                    }
                }
                Some(Input::Refused(n, why)) => complaints.complain(plan.quiet, n, &why),
                Some(Input::Eof) | None => {
                    ack_lines = None;
                    if stdin_armed {
                        break Ok(Reason::Signal);
                    }
                }
            },
            _ = sleep_until_opt(ack_due) => {
                ack_due = None;
                send_acks(&mut bus, &mut write_acks, pump.progress().written, &mut ring_read).await;
            }
            _ = progress.changed() => {
                let p = pump.progress();
                if let Some(r) = failure_reason(&p) {
                    break r;
                }
                schedule_ack(&p, &write_acks, &mut ack_due);
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
                // A ring batch that failed its check: its events again, as
                // bytes, and no more ring (with the batches read so far).
                if !out.ring_dropped.is_empty() {
                    ring_read.read = ring_read.read.max(out.ring_read);
                    let ack = v1::Ack {
                        nacks: out
                            .ring_dropped
                            .drain(..)
                            .map(|seq| v1::Nack { seq, delay_ms: 0 })
                            .collect(),
                        ring_off: true,
                        ring_read: ring_read.read,
                        ..v1::Ack::default()
                    };
                    ring_read.told = ring_read.read;
                    let _ = bus.send(C::Ack(ack)).await;
                }
                // Ring batches read out: the bus may write over them soon.
                if out.ring_read > ring_read.read {
                    ring_read.read = out.ring_read;
                    let soon = Instant::now() + ACK_DELAY;
                    ack_due = Some(ack_due.map_or(soon, |d| d.min(soon)));
                }
                // Explicit acks settle against what this run delivered;
                // write acks name what the writer wrote.
                if plan.explicit_ack.is_some() {
                    delivered_seqs.extend(out.take_seqs());
                } else {
                    write_acks.formatted(out.take_seqs());
                }
                if let Some(r) = ended {
                    break r;
                }
            }
        }
    };
    let reason = reason?;

    // Clean exit: finish writing, ack what reached stdout, remove an owned
    // subscription, say goodbye.
    out.end();
    let mut rest = waiting.into_iter().collect::<Vec<_>>();
    if !out.chunk.bytes.is_empty() {
        rest.push(std::mem::take(&mut out.chunk));
    }
    let progress = drain(rest, &mut pump, &mut progress, &mut signals, reason).await;
    if !reason.bus_ended() {
        send_acks(&mut bus, &mut write_acks, progress.written, &mut ring_read).await;
        if plan.owned() {
            unsubscribe(&mut bus, &plan, &sub.subscription_id).await;
        }
        bus.bye().await;
    }
    if let Some(line) = complaints.summary().filter(|_| !plan.quiet) {
        write_stderr_nowait(&line);
    }
    let secs = started.elapsed().as_secs_f64();
    stderr_line(
        plan.quiet,
        &format!(
            "[event] exited — received {} event(s) in {secs:.3}s (reason: {})",
            progress.written,
            reason.as_str()
        ),
    );
    Ok(())
}

/// Whether a run could read the bus's line ring: the formats whose lines
/// the bus renders once for every consumer.
/// `DWS_LINE_RING=off` says no: every line is sent (the same bytes).
fn wants_ring(plan: &Plan) -> bool {
    let off = std::env::var_os("DWS_LINE_RING").is_some_and(|v| v == "off");
    !off && (plan.format == Format::Raw
        || (plan.format == Format::Ndjson && plan.data == DataMode::String))
}

/// The Subscribe request of a run: create (or resume) and attach; `ring`:
/// this run holds the bus's line ring.
fn subscribe(plan: &Plan, request_id: u64, ring: bool) -> C {
    let (start, start_seq, start_unix_ms) = validate::start(Some(plan.from));
    C::Subscribe(v1::Subscribe {
        request_id,
        subscription_id: plan.subscribe_id.clone().unwrap_or_default(),
        patterns: plan.keys.clone(),
        filter: plan.filter.clone(),
        where_exprs: plan.wheres.clone(),
        start: start as i32,
        start_seq,
        start_unix_ms,
        ttl_ms: plan.ttl.map_or(0, proto::limits::ttl_to_ms),
        attach: true,
        takeover: plan.takeover,
        must_exist: plan.subscribe_id.is_some(),
        owned: plan.subscribe_id.is_none(),
        window: plan.window,
        upstream: plan.upstream.clone(),
        max_deliver: plan.max_deliver,
        on_poison: plan.on_poison as i32,
        backoff_ms: plan.backoff_ms.clone(),
        explicit_ack: plan.explicit_ack.is_some(),
        // Not named: 0, the subscription's own default (`subscribe
        // --ack-wait`) or 30 s; an older bus gets 30 s (`BusConn::send`).
        ack_wait_ms: match plan.explicit_ack {
            Some(d) if plan.ack_wait_named => d.as_millis() as u64,
            _ => 0,
        },
        default_ack_wait_ms: 0,
        // NDJSON is what the bus can render once for every consumer.
        // --data json needs the payload parsed, which the client does.
        ndjson_lines: plan.format == Format::Ndjson && plan.data == DataMode::String,
        // And the lines rendered once for every consumer (LineBatch), with
        // this subscription's id inserted here; raw lines are used as sent.
        line_batches: plan.format == Format::Ndjson && plan.data == DataMode::String,
        raw_lines: plan.format == Format::Raw,
        // A consume run attaches; the mode is the subscription's own.
        shared: false,
        // Told on stderr when the subscription's --where passes a limit.
        where_notices: true,
        ring_batches: ring,
    })
}

/// Hands the pump the chunks still formatted and waits until it wrote them
/// and stopped — or until a signal, or (when a signal ended the run)
/// [`DRAIN_AFTER_SIGNAL`]. Returns the pump's progress then.
async fn drain(
    rest: Vec<Chunk>,
    pump: &mut StdoutPump,
    progress: &mut ProgressWatch,
    signals: &mut Signals,
    reason: Reason,
) -> Progress {
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
        _ = signals.recv() => {}
        _ = tokio::time::sleep(drain_bound.min(Duration::from_secs(86_400 * 365))) => {}
    }
    pump.progress()
}

/// Acks what reached stdout (`written` events) and was not acked yet;
/// best effort: a bus gone by now redelivers them to the next consumer.
async fn send_acks(
    bus: &mut BusConn,
    write_acks: &mut WriteAcks,
    written: u64,
    ring: &mut RingRead,
) {
    let mut acks = write_acks.take(written);
    // The ring batches read out go with the first ack, or alone.
    if ring.read > ring.told {
        match acks.first_mut() {
            Some(a) => a.ring_read = ring.read,
            None => acks.push(v1::Ack {
                ring_read: ring.read,
                ..v1::Ack::default()
            }),
        }
        ring.told = ring.read;
    }
    for ack in acks {
        let _ = bus.send(C::Ack(ack)).await;
    }
}

/// The ring batches read out of the line ring, and what the bus was told.
#[derive(Debug, Default)]
struct RingRead {
    read: u64,
    told: u64,
}

/// Removes the subscription this run owns; warns (the TTL then removes it)
/// when the bus does not confirm within 2 s.
async fn unsubscribe(bus: &mut BusConn, plan: &Plan, id: &str) {
    let ids = vec![id.to_owned()];
    let unsubscribed = tokio::time::timeout(
        Duration::from_secs(2),
        bus.request(|request_id| {
            C::Unsubscribe(v1::Unsubscribe {
                request_id,
                subscription_ids: ids,
            })
        }),
    )
    .await;
    if !matches!(unsubscribed, Ok(Ok(_))) {
        stderr_line(
            plan.quiet,
            &format!(
                "[event] warning: could not remove subscription {id}; it expires with its ttl"
            ),
        );
    }
}

/// After stdout took more events: with write acks, an ack is due at once
/// when [`ACK_EAGER`] written events wait for one, else within
/// [`ACK_DELAY`]. (With explicit acks nothing is queued: none is due.)
fn schedule_ack(p: &Progress, write_acks: &WriteAcks, ack_due: &mut Option<Instant>) {
    let waiting = write_acks.waiting(p.written);
    if waiting == 0 {
        return;
    }
    if waiting >= ACK_EAGER {
        *ack_due = Some(Instant::now());
    } else {
        ack_due.get_or_insert_with(|| Instant::now() + ACK_DELAY);
    }
}

/// Whether an ack due at `due` (by the [`ACK_DELAY`] timer) has waited
/// [`ACK_PIGGYBACK`] already, so it goes out in this wake-up.
fn piggyback(due: Option<Instant>, now: Instant) -> bool {
    due.is_some_and(|due| due <= now + (ACK_DELAY - ACK_PIGGYBACK))
}

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
/// [`LOST_WITHOUT_BYE`](super::LOST_WITHOUT_BYE)).
fn gone_is_eof(frame: Result<Option<S>>) -> Result<Option<S>> {
    match frame {
        Err(e) if e.bus_gone => Ok(None),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_rides_on_events_written_once_it_waited_long_enough() {
        let now = Instant::now();
        assert!(!piggyback(None, now));
        // Just scheduled: waits for more.
        assert!(!piggyback(Some(now + ACK_DELAY), now));
        // Waited ACK_PIGGYBACK: goes with this write.
        assert!(piggyback(Some(now + ACK_DELAY - ACK_PIGGYBACK), now));
        // Due (eager, or the timer passed): goes.
        assert!(piggyback(Some(now), now));
    }
}
