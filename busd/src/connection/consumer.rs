//! A consumer's side of a connection, made when it attaches: the form its
//! deliveries take ([`Form`]: `Event` frames, NDJSON `EventLines`, shared
//! `LineBatch`es, the line ring's `RingBatch`es, `WhereNotice`s), when what
//! it holds past its ack wait is due to go to others, the buffer its lines
//! are rendered in, and the ring batches it was told of and has not said
//! it read. Those ring holds are given back to the ring when the consumer
//! reads them (`Ack.ring_read`) or, at the latest, when this is dropped
//! with its connection. A publisher's or a status reader's connection has
//! none of this.

use std::{collections::VecDeque, time::Instant};

use proto::v1;

use crate::lines::{LineKind, Lines};

/// How a consumer's deliveries are framed, as its attaching `Subscribe`
/// asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Form {
    /// NDJSON lines rendered by this connection (`EventLines`).
    pub(super) lines: bool,
    /// Lines rendered once for every consumer (`LineBatch`), of this kind.
    pub(super) line_batches: Option<LineKind>,
    /// `WhereNotice` frames.
    pub(super) where_notices: bool,
    /// First deliveries as `RingBatch`es of the line ring (a consumer that
    /// took the ring on a connection of its own; an older dws never asks).
    pub(super) ring_batches: bool,
}

impl Form {
    /// The form `req` asks for; `None` when it does not attach.
    pub(super) fn of(req: &v1::Subscribe) -> Option<Form> {
        if !req.attach {
            return None;
        }
        let lines = req.ndjson_lines;
        Some(Form {
            lines,
            line_batches: match (req.raw_lines, lines && req.line_batches) {
                (true, _) => Some(LineKind::Raw),
                (false, true) => Some(LineKind::Ndjson),
                (false, false) => None,
            },
            where_notices: req.where_notices,
            ring_batches: req.ring_batches,
        })
    }
}

/// One attached consumer's delivery state (see the module doc).
pub(super) struct Consumer {
    pub(super) form: Form,
    /// When an event held back (a nack's delay, an explicit ack's wait)
    /// becomes deliverable: the connection wakes then.
    pub(super) redeliver_at: Option<Instant>,
    /// Reused buffer for a batch of lines.
    pub(super) line_buf: Vec<u8>,
    /// The ring batches it was told of and has not said it read: their
    /// frame number and chunk, oldest first.
    ring_holds: VecDeque<(u64, u32)>,
    /// The number of the next `RingBatch` frame.
    next_ring_id: u64,
    /// The bus's renderings, where the holds go back.
    rendered: Lines,
}

impl Consumer {
    pub(super) fn new(form: Form, rendered: Lines) -> Consumer {
        Consumer {
            form,
            redeliver_at: None,
            line_buf: Vec::new(),
            ring_holds: VecDeque::new(),
            next_ring_id: 1,
            rendered,
        }
    }

    /// The ring's `chunk` is told to the consumer in a new `RingBatch`:
    /// held until it says it read it. The frame's number.
    pub(super) fn hold(&mut self, chunk: u32) -> u64 {
        let id = self.next_ring_id;
        self.next_ring_id += 1;
        self.ring_holds.push_back((id, chunk));
        id
    }

    /// The consumer read every ring batch up to frame `id`: they are free.
    pub(super) fn ring_read(&mut self, id: u64) {
        let mut freed = Vec::new();
        while self.ring_holds.front().is_some_and(|(i, _)| *i <= id) {
            if let Some((_, chunk)) = self.ring_holds.pop_front() {
                freed.push(chunk);
            }
        }
        if !freed.is_empty() {
            self.rendered.release(freed);
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if !self.ring_holds.is_empty() {
            self.rendered
                .release(self.ring_holds.drain(..).map(|(_, chunk)| chunk));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Form;
    use crate::lines::LineKind;
    use proto::v1;

    #[test]
    fn the_form_is_what_the_attaching_request_asked() {
        let mut req = v1::Subscribe::default();
        assert_eq!(Form::of(&req), None, "not attaching: no consumer");
        req.attach = true;
        req.ndjson_lines = true;
        req.line_batches = true;
        let f = Form::of(&req).expect("attaching");
        assert_eq!(f.line_batches, Some(LineKind::Ndjson));
        assert!(f.lines && !f.ring_batches && !f.where_notices);
        req.raw_lines = true;
        assert_eq!(
            Form::of(&req).and_then(|f| f.line_batches),
            Some(LineKind::Raw)
        );
        req.raw_lines = false;
        req.ndjson_lines = false;
        assert_eq!(
            Form::of(&req).and_then(|f| f.line_batches),
            None,
            "line batches need NDJSON lines"
        );
    }
}
