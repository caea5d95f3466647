//! The outbound side of a connection: every frame goes into its outbound
//! buffer through [`Connection::send`]. This file owns delivery — moving
//! events, gaps and source-state changes from the hub into that buffer
//! within [`OUT_HIGH_WATER`] ([`Connection::fill`]), as `Event` frames or as
//! `EventLines` batches of NDJSON lines rendered here, or `LineBatch` and
//! `RingBatch` frames of lines rendered once for every consumer taking the
//! same events (`crate::lines`, `line_frames`) — and
//! the frames that end a connection or a request: `Error` and `Bye`
//! (including the `Bye` of a halted subscription and the `Error` of a
//! failed store).

use std::sync::Arc;

use proto::{
    codec::{encode_event_frame, encode_frame},
    ndjson,
    v1::{self, server_frame::Kind as S, ByeReason, ErrorCode},
};

use super::{
    consumer::{Consumer, Frames},
    replies::store_failed_message,
    Connection, Phase,
};
use crate::eventlog::LoggedEvent;

/// Stop pulling events into the outbound buffer above this many bytes: the
/// consumer is not keeping up, and the credit window already bounds what is
/// in flight.
const OUT_HIGH_WATER: usize = 256 * 1024;

/// Events pulled from the hub per wake-up.
const PULL_BATCH: usize = 256;

impl Connection {
    /// Appends one frame to the outbound buffer.
    pub(super) fn send(&mut self, kind: S) {
        let frame = v1::ServerFrame { kind: Some(kind) };
        if let Err(e) = encode_frame(&frame, self.out.buf()) {
            // Only a reply over MAX_FRAME_LEN can fail here.
            tracing::error!(conn = self.id, cause = %e, "cannot encode a reply");
        }
    }

    pub(super) fn error(&mut self, request_id: u64, code: ErrorCode, message: impl Into<String>) {
        self.send(S::Error(v1::Error {
            request_id,
            code: code as i32,
            message: message.into(),
        }));
    }

    /// Sends the source state if it changed since this connection last saw it.
    /// The generation is read without the hub lock: this runs on every wake-up.
    fn source_state_if_changed(&mut self) {
        if self.session.source_gen() != self.source_gen {
            let (state, gen) = self.session.source_state();
            self.source_gen = gen;
            self.send(S::SourceState(state));
        }
    }

    pub(super) fn bye(&mut self, reason: ByeReason) {
        // A bus stopped by its store says so: it is an error, not a goodbye.
        // The replies waiting for the store go first, each with its own
        // answer: `dws` takes the first Error as its request's answer, and
        // a forwarded publish the owner may still append must read
        // "outcome unknown", not this "failed" (the fault suite's
        // `busd_sessions_terminated` saw one told failed, then appended).
        if let Some(why) = self.session.store_error() {
            self.answer_durable();
            self.error(0, ErrorCode::Internal, store_failed_message(&why));
            self.closing = true;
            return;
        }
        // A source that was lost says why before the Bye that follows it.
        if matches!(self.phase, Phase::Ready) {
            self.source_state_if_changed();
        }
        self.send(S::Bye(v1::Bye {
            reason: reason as i32,
            message: String::new(),
        }));
        self.closing = true;
    }

    /// When what its consumer holds back becomes deliverable.
    pub(super) fn redeliver_at(&self) -> Option<std::time::Instant> {
        self.consumer.as_ref().and_then(|c| c.redeliver_at)
    }

    /// Moves source-state changes and, to a consumer, deliverable events
    /// and gaps from the hub into the outbound buffer, within the
    /// high-water mark.
    pub(super) fn fill(&mut self) {
        self.source_state_if_changed();
        if let Some(mut c) = self.consumer.take() {
            self.fill_for(&mut c);
            self.consumer = Some(c);
        }
    }

    fn fill_for(&mut self, c: &mut Consumer) {
        if self.out.len() >= OUT_HIGH_WATER {
            // Nothing taken now, but what this consumer holds past its ack
            // wait still goes to others (a stopped consumer's buffer
            // fills): at the time the last pull named.
            if c.redeliver_at
                .is_some_and(|t| t <= std::time::Instant::now())
            {
                c.redeliver_at = self.session.expire_held();
            }
            return;
        }
        c.redeliver_at = None;
        while self.out.len() < OUT_HIGH_WATER {
            // Bytes as well as events: a consumer that never reads must
            // not make the bus copy 256 large events into its buffer.
            let room = OUT_HIGH_WATER - self.out.len();
            let (d, next_due) = self.session.pull(PULL_BATCH, room);
            c.redeliver_at = next_due;
            let Some(d) = d else {
                break;
            };
            if let Some(gap) = d.gap {
                self.send(S::Gap(gap));
            }
            if let Some(notice) = d.where_notice {
                if c.form().where_notices {
                    self.send(S::WhereNotice(notice));
                }
            }
            let damaged = d.damaged;
            let n = d.events.len();
            match c
                .form()
                .frames(|kind| self.rendered.shareable(&d.events, kind))
            {
                Frames::Pieces {
                    kind,
                    delivery,
                    ring,
                } => match self.rendered.pieces(&d.events, delivery, kind, ring) {
                    Ok(pieces) => self.queue_pieces(c, pieces),
                    // Nothing of this pull is sent; the bus stops.
                    Err(e) => return self.session.store_failed(e.to_string()),
                },
                Frames::Lines => self.send_lines(c, &d.subscription_id, &d.events),
                Frames::Events => {
                    for (event, redelivered, delivery) in &d.events {
                        self.send_event(event, &d.subscription_id, *redelivered, *delivery);
                    }
                }
            }
            if let Some(why) = damaged {
                tracing::error!(conn = self.id, "{why}");
                self.error(0, ErrorCode::Internal, why);
                self.closing = true;
                break;
            }
            if let Some(line) = d.halted {
                self.send(S::Bye(v1::Bye {
                    reason: ByeReason::Halted as i32,
                    message: line,
                }));
                self.session.detach();
                self.closing = true;
                break;
            }
            if n < PULL_BATCH {
                break;
            }
        }
    }

    fn send_event(
        &mut self,
        event: &LoggedEvent,
        subscription_id: &str,
        redelivered: bool,
        delivery: u32,
    ) {
        // A body read back from the store that fails is a store failure:
        // the bus stops; the event stays unacknowledged.
        let encoded = match event.encoded() {
            Ok(b) => b,
            Err(e) => return self.session.store_failed(e.to_string()),
        };
        if let Err(e) = encode_event_frame(
            &encoded,
            subscription_id,
            redelivered,
            delivery,
            self.out.buf(),
        ) {
            tracing::error!(conn = self.id, seq = event.seq, cause = %e, "cannot encode event");
        }
    }

    /// One `EventLines` frame for a pulled batch: each event's line is its
    /// shared rendered parts plus this delivery's fields. A line too large
    /// for a frame goes as an `Event` frame (the client formats it).
    fn send_lines(
        &mut self,
        c: &mut Consumer,
        subscription_id: &str,
        events: &[(Arc<LoggedEvent>, bool, u32)],
    ) {
        const FRAME_BUDGET: usize = 1 << 20;
        let mut seqs = Vec::with_capacity(events.len());
        let counted = self.rendered.counted();
        let mut buf = std::mem::take(&mut c.line_buf);
        buf.clear();
        for (event, redelivered, delivery) in events {
            let (head, tail) = match event.line_parts(&counted) {
                Ok(parts) => parts,
                Err(e) => {
                    self.session.store_failed(e.to_string());
                    break;
                }
            };
            let start = buf.len();
            ndjson::write_line(
                &mut buf,
                &head,
                subscription_id,
                &tail,
                *redelivered,
                *delivery,
            );
            if buf.len() - start > proto::MAX_FRAME_LEN - 4096 {
                buf.truncate(start);
                self.flush_lines(&mut seqs, &mut buf);
                self.send_event(event, subscription_id, *redelivered, *delivery);
                continue;
            }
            seqs.push(event.seq);
            if buf.len() >= FRAME_BUDGET {
                self.flush_lines(&mut seqs, &mut buf);
            }
        }
        self.flush_lines(&mut seqs, &mut buf);
        c.line_buf = buf;
    }

    fn flush_lines(&mut self, seqs: &mut Vec<u64>, buf: &mut Vec<u8>) {
        if seqs.is_empty() {
            return;
        }
        self.send(S::EventLines(v1::EventLines {
            seqs: std::mem::take(seqs),
            lines: std::mem::take(buf),
        }));
    }
}
