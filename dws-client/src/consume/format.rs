//! The output side of a run: [`Formatter`] turns the bus's frames into the
//! next chunk for the stdout writer thread — events formatted in the run's
//! `--format`, or `EventLines` the bus already rendered as NDJSON, passed
//! through and cut at `--max-events` — and prints the stderr line of the
//! other frames (gap, source state, halt). It says when a frame ends the
//! run.

use proto::v1::{self, server_frame::Kind as S, ByeReason};

use super::{stderr_line, Plan, Reason};
use crate::{
    exit::{CliError, Result},
    output::EventWriter,
    pump::Chunk,
};

/// Printed before the exited line when the connection ended without a Bye
/// frame (EOF, reset, a frame cut short): the bus crashed or was killed,
/// rather than stopped. The reason stays `bus_shutdown`.
pub const LOST_WITHOUT_BYE: &str = "[event] bus connection lost without goodbye";

/// The output side of a run: formats events into the next chunk for the
/// stdout pump, prints stderr lines for the other frames, and counts.
pub(super) struct Formatter<'a> {
    plan: &'a Plan,
    writer: EventWriter,
    /// What is formatted and not yet handed to the stdout pump.
    pub(super) chunk: Chunk,
    /// Events taken from the bus (for `--max-events`).
    received: u64,
    /// Seqs formatted since the last [`Formatter::take_seqs`], in delivery
    /// order (what explicit acks settle against, what write acks name).
    seqs: Vec<u64>,
    /// What goes into each line of a `LineBatch` (`proto::lines`).
    fragment: Vec<u8>,
    /// The bus's line ring, when this run reads it (`RingBatch`).
    ring: Option<crate::ring::RingView>,
    /// The last `RingBatch` read out of the ring (what `Ack.ring_read`
    /// tells the bus).
    pub(super) ring_read: u64,
    /// The seqs of ring batches that failed their check (dropped, never
    /// printed): the run asks for them again as bytes (`Ack.ring_off` and
    /// nacks) and reads the ring no more.
    pub(super) ring_dropped: Vec<u64>,
    /// A ring batch failed its check this run (told once on stderr).
    ring_off: bool,
    /// Where a ring batch is copied out and checked, reused.
    ring_copy: Vec<u8>,
}

impl<'a> Formatter<'a> {
    pub(super) fn new(
        plan: &'a Plan,
        subscription_id: &str,
        ring: Option<crate::ring::RingView>,
    ) -> Formatter<'a> {
        Formatter {
            ring,
            ring_read: 0,
            ring_dropped: Vec::new(),
            ring_off: false,
            ring_copy: Vec::new(),
            plan,
            writer: EventWriter::new(plan.format, plan.data),
            chunk: Chunk::default(),
            received: 0,
            seqs: Vec::new(),
            // Raw lines (Subscribe.raw_lines) get nothing inserted.
            fragment: if plan.format == crate::cli::Format::Raw {
                Vec::new()
            } else {
                proto::lines::subscription_fragment(subscription_id)
            },
        }
    }

    /// Opens the output (the `json` array).
    pub(super) fn begin(&mut self) {
        // Writing into a Vec cannot fail.
        let _ = self.writer.begin(&mut self.chunk.bytes);
    }

    /// Closes the output (the `json` array).
    pub(super) fn end(&mut self) {
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
        self.chunk.events += take as u64;
        self.received += take as u64;
        self.seqs.extend_from_slice(&b.seqs[..take]);
        self.plan
            .max_events
            .is_some_and(|max| self.received >= max)
            .then_some(Reason::Limit)
    }

    /// Lines the bus rendered once for every subscription: this one's id
    /// inserted in each, cut at `--max-events`.
    fn line_batch(&mut self, b: &v1::LineBatch) -> Result<Option<Reason>> {
        self.expand(b.first_seq, b.count, &b.cuts, &b.body)
    }

    /// The same lines, read out of the bus's line ring.
    fn ring_batch(&mut self, b: &v1::RingBatch) -> Result<Option<Reason>> {
        let Some(ring) = self.ring.take() else {
            return Err(CliError::runtime(
                "the bus sent a ring batch to a consumer that does not read its ring",
            ));
        };
        self.ring_read = b.id;
        let mut copy = std::mem::take(&mut self.ring_copy);
        let (h, cuts, body) = match ring.batch_in(b, &mut copy) {
            Ok(c) => c,
            Err(e) => {
                // Dropped, never printed: its events are asked for again as
                // bytes, and the ring is read no more this run.
                if !self.ring_off {
                    self.ring_off = true;
                    stderr_line(
                        self.plan.quiet,
                        &format!(
                            "[event] {e}: its {} event(s) come again as bytes, and this run \
                             reads the line ring no more",
                            b.count
                        ),
                    );
                }
                self.ring_dropped
                    .extend((0..u64::from(b.count)).map(|i| b.first_seq + i));
                self.ring = Some(ring);
                self.ring_copy = copy;
                return Ok(None);
            }
        };
        let raw = self.plan.format == crate::cli::Format::Raw;
        let told = if (h.kind == proto::ring::Kind::Raw) != raw {
            Err(CliError::runtime(
                "the bus sent a ring batch of lines of another format",
            ))
        } else {
            self.expand(b.first_seq, b.count, cuts, body)
        };
        self.ring = Some(ring);
        self.ring_copy = copy;
        told
    }

    fn expand(
        &mut self,
        first_seq: u64,
        count: u32,
        cuts: &[u8],
        body: &[u8],
    ) -> Result<Option<Reason>> {
        let room = self
            .plan
            .max_events
            .map_or(u64::MAX, |max| max.saturating_sub(self.received));
        let take = u64::from(count).min(room);
        let seqs = first_seq
            .checked_add(take)
            .map(|end| first_seq..end)
            .ok_or_else(|| CliError::runtime("the bus sent a line batch past the last seq"))?;
        proto::lines::expand(
            count,
            cuts,
            body,
            take as usize,
            &self.fragment,
            &mut self.chunk.bytes,
        )
        .map_err(|e| CliError::runtime(format!("the bus sent {e}")))?;
        self.chunk.events += take;
        self.received += take;
        self.seqs.extend(seqs);
        Ok(self
            .plan
            .max_events
            .is_some_and(|max| self.received >= max)
            .then_some(Reason::Limit))
    }

    /// The seqs formatted since the last call, in delivery order.
    pub(super) fn take_seqs(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.seqs)
    }

    /// Handles one frame; `Some(reason)` ends the run.
    pub(super) fn handle(&mut self, frame: Option<S>) -> Result<Option<Reason>> {
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
                self.chunk.events += 1;
                self.seqs.push(e.seq);
                self.received += 1;
                if self.plan.max_events.is_some_and(|max| self.received >= max) {
                    return Ok(Some(Reason::Limit));
                }
            }
            S::EventLines(b) => return Ok(self.lines(&b)),
            S::LineBatch(b) => return self.line_batch(&b),
            S::RingBatch(b) => return self.ring_batch(&b),
            S::Gap(g) => stderr_line(
                self.plan.quiet,
                &format!(
                    "[event] gap — lost {} event(s) before seq {} (retention)",
                    g.lost, g.resume_seq
                ),
            ),
            S::WhereNotice(n) => stderr_line(self.plan.quiet, &where_line(&n)),
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
                    ByeReason::TakenOver => Reason::TakenOver,
                    ByeReason::SubscriptionStopped => Reason::Stopped,
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

/// The consumer's line when its subscription's `--where` gave no answer
/// for an event within a limit (once per run, the first such event).
pub fn where_line(n: &v1::WhereNotice) -> String {
    format!(
        "[event] where — no answer for seq {} (the --where {}); events it cannot judge within \
         its limits are not delivered and count in status where_errors",
        n.seq, n.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, EventCmd, Top};
    use clap::Parser;

    fn plan(flags: &[&str]) -> Plan {
        let argv = ["dws", "event", "consume", "a.b"].iter().chain(flags);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Top::Event(EventCmd::Consume(args))) => super::super::plan(args).unwrap(),
            other => panic!("not a consume command line: {other:?}"),
        }
    }

    fn lines(seqs: &[u64]) -> S {
        let text: String = seqs.iter().map(|s| format!("{{\"seq\":{s}}}\n")).collect();
        S::EventLines(v1::EventLines {
            seqs: seqs.to_vec(),
            lines: text.into_bytes(),
        })
    }

    #[test]
    fn rendered_lines_pass_through_cut_at_max_events() {
        let plan = plan(&["--max-events", "3", "--ack", "explicit"]);
        let mut f = Formatter::new(&plan, "s1", None);
        assert_eq!(f.handle(Some(lines(&[4, 5]))), Ok(None));
        assert_eq!(f.handle(Some(lines(&[6, 7, 8]))), Ok(Some(Reason::Limit)));
        assert_eq!(f.chunk.bytes, b"{\"seq\":4}\n{\"seq\":5}\n{\"seq\":6}\n");
        assert_eq!(f.chunk.events, 3);
        assert_eq!(f.take_seqs(), [4, 5, 6]);
        assert!(f.take_seqs().is_empty());
    }

    fn batch(first_seq: u64, n: u64) -> S {
        let (mut body, mut cuts) = (vec![], vec![]);
        for seq in first_seq..first_seq + n {
            let head = format!("{{\"seq\":{seq}");
            proto::lines::render_line(&mut body, &mut cuts, head.as_bytes(), b"", 1);
        }
        S::LineBatch(v1::LineBatch {
            first_seq,
            count: n as u32,
            cuts: cuts.into(),
            body: body.into(),
        })
    }

    #[test]
    fn a_line_batch_gets_this_subscriptions_id_and_is_cut_at_max_events() {
        let plan = plan(&["--max-events", "3", "--ack", "explicit"]);
        let mut f = Formatter::new(&plan, "s1", None);
        assert_eq!(f.handle(Some(batch(4, 2))), Ok(None));
        assert_eq!(f.handle(Some(batch(6, 3))), Ok(Some(Reason::Limit)));
        let line = |s| {
            format!(
                "{{\"seq\":{s},\"subscribe_id\":\"s1\",\"redelivered\":false,\"delivery\":1}}\n"
            )
        };
        assert_eq!(
            String::from_utf8_lossy(&f.chunk.bytes),
            format!("{}{}{}", line(4), line(5), line(6))
        );
        assert_eq!(f.chunk.events, 3);
        assert_eq!(f.take_seqs(), [4, 5, 6]);
        let S::LineBatch(mut bad) = batch(9, 2) else {
            unreachable!()
        };
        bad.count = 3;
        let mut f = Formatter::new(&plan, "s1", None);
        assert!(f.handle(Some(S::LineBatch(bad))).is_err());
        assert!(f.chunk.bytes.is_empty() && f.take_seqs().is_empty());
    }

    /// Issue 49, row 3: a ring batch that fails its check is dropped (no
    /// line printed, nothing to ack) and its events asked for again; the
    /// run goes on (it used to end with exit 1, blaming the bus).
    #[test]
    fn a_ring_batch_that_fails_its_check_is_dropped_and_asked_for_again() {
        use crate::ring::tests::{frame, ring_file, view};
        let plan = plan(&["--quiet"]);
        let (_file, w, ro) = ring_file(true);
        let mut f = Formatter::new(&plan, "s1", Some(view(ro)));
        w.write_at(proto::ring::CHUNK_SIZE + 64 + 60, b"X");
        assert_eq!(f.handle(Some(S::RingBatch(frame(0, 2, 100)))), Ok(None));
        assert_eq!(f.ring_dropped, [100, 101]);
        assert_eq!(f.ring_read, 1, "the batch is released");
        assert!(f.chunk.bytes.is_empty() && f.take_seqs().is_empty());
    }

    #[test]
    fn bye_and_a_vanished_bus_end_the_run() {
        let plan = plan(&["--quiet"]);
        let mut f = Formatter::new(&plan, "s1", None);
        let bye = |reason: ByeReason| {
            Some(S::Bye(v1::Bye {
                reason: reason as i32,
                message: String::new(),
            }))
        };
        assert_eq!(
            f.handle(bye(ByeReason::SourceLost)),
            Ok(Some(Reason::SourceLost))
        );
        assert_eq!(f.handle(bye(ByeReason::Halted)), Ok(Some(Reason::Halted)));
        assert_eq!(
            f.handle(bye(ByeReason::TakenOver)),
            Ok(Some(Reason::TakenOver))
        );
        assert_eq!(
            f.handle(bye(ByeReason::Shutdown)),
            Ok(Some(Reason::BusShutdown))
        );
        assert_eq!(f.handle(None), Ok(Some(Reason::BusShutdown)));
        assert!(f.chunk.bytes.is_empty());
    }
}
