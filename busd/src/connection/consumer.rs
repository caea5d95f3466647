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
    /// NDJSON lines rendered by this connection (`EventLines`) when a pull
    /// cannot go as shared lines; else `Event` frames.
    pub(super) lines: bool,
    /// Lines rendered once for every consumer.
    pub(super) shared: Shared,
    /// `WhereNotice` frames.
    pub(super) where_notices: bool,
}

/// Whether, and how, a consumer takes lines rendered once for every
/// consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shared {
    No,
    /// As bytes (`LineBatch`), of this kind.
    Batches(LineKind),
    /// As `RingBatch`es of the line ring (a consumer that took the ring on
    /// a connection of its own; an older dws never asks), else as bytes.
    Ring(LineKind),
}

/// How one pull goes out: chosen by [`Form::frames`], the one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Frames {
    /// Shared pieces of delivery `delivery`, held in the ring with `ring`.
    Pieces {
        kind: LineKind,
        delivery: u32,
        ring: bool,
    },
    /// NDJSON lines this connection renders (`EventLines`).
    Lines,
    /// One `Event` frame per event.
    Events,
}

impl Form {
    /// The form `req` asks for; `None` when it does not attach.
    pub(super) fn of(req: &v1::Subscribe) -> Option<Form> {
        if !req.attach {
            return None;
        }
        let lines = req.ndjson_lines;
        let kind = match (req.raw_lines, lines && req.line_batches) {
            (true, _) => Some(LineKind::Raw),
            (false, true) => Some(LineKind::Ndjson),
            (false, false) => None,
        };
        Some(Form {
            lines,
            shared: match kind {
                Some(k) if req.ring_batches => Shared::Ring(k),
                Some(k) => Shared::Batches(k),
                None => Shared::No,
            },
            where_notices: req.where_notices,
        })
    }

    /// Whether it reads the line ring.
    pub(super) fn reads_ring(&self) -> bool {
        matches!(self.shared, Shared::Ring(_))
    }

    /// How `events` (one pull) go out: as shared pieces when `shareable`
    /// gives the delivery they share for a kind, else as this connection's
    /// own lines or frames.
    pub(super) fn frames(&self, shareable: impl FnOnce(LineKind) -> Option<u32>) -> Frames {
        let (kind, ring) = match self.shared {
            Shared::Batches(k) => (Some(k), false),
            Shared::Ring(k) => (Some(k), true),
            Shared::No => (None, false),
        };
        match kind.and_then(|k| Some((k, shareable(k)?))) {
            Some((kind, delivery)) => Frames::Pieces {
                kind,
                delivery,
                ring,
            },
            None if self.lines => Frames::Lines,
            None => Frames::Events,
        }
    }
}

/// One attached consumer's delivery state (see the module doc).
pub(super) struct Consumer {
    /// Set through [`Consumer::set_form`]: the ring counts its readers.
    form: Form,
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
        if form.reads_ring() {
            rendered.reading_ring(true);
        }
        Consumer {
            form,
            redeliver_at: None,
            line_buf: Vec::new(),
            ring_holds: VecDeque::new(),
            next_ring_id: 1,
            rendered,
        }
    }

    pub(super) fn form(&self) -> Form {
        self.form
    }

    /// It attached again, asking for `form`.
    pub(super) fn set_form(&mut self, form: Form) {
        if form.reads_ring() != self.form.reads_ring() {
            self.rendered.reading_ring(form.reads_ring());
        }
        self.form = form;
    }

    /// It reads the ring no more (`Ack.ring_off`): shared lines come as
    /// bytes.
    pub(super) fn ring_off(&mut self) {
        if let Shared::Ring(k) = self.form.shared {
            self.set_form(Form {
                shared: Shared::Batches(k),
                ..self.form
            });
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
        if self.form.reads_ring() {
            self.rendered.reading_ring(false);
        }
        if !self.ring_holds.is_empty() {
            self.rendered
                .release(self.ring_holds.drain(..).map(|(_, chunk)| chunk));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Form, Frames, Shared};
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
        assert_eq!(f.shared, Shared::Batches(LineKind::Ndjson));
        assert!(f.lines && !f.reads_ring() && !f.where_notices);
        req.raw_lines = true;
        req.ring_batches = true;
        assert_eq!(
            Form::of(&req).map(|f| f.shared),
            Some(Shared::Ring(LineKind::Raw))
        );
        req.raw_lines = false;
        req.ndjson_lines = false;
        assert_eq!(
            Form::of(&req).map(|f| f.shared),
            Some(Shared::No),
            "line batches need NDJSON lines"
        );
    }

    #[test]
    fn one_place_chooses_how_a_pull_goes_out() {
        let form = |lines, shared| Form {
            lines,
            shared,
            where_notices: false,
        };
        let ring = form(true, Shared::Ring(LineKind::Ndjson));
        assert_eq!(
            ring.frames(|_| Some(1)),
            Frames::Pieces {
                kind: LineKind::Ndjson,
                delivery: 1,
                ring: true
            }
        );
        assert_eq!(ring.frames(|_| None), Frames::Lines, "not shareable");
        let raw = form(false, Shared::Batches(LineKind::Raw));
        assert_eq!(
            raw.frames(|k| (k == LineKind::Raw).then_some(2)),
            Frames::Pieces {
                kind: LineKind::Raw,
                delivery: 2,
                ring: false
            }
        );
        assert_eq!(raw.frames(|_| None), Frames::Events);
        assert_eq!(form(false, Shared::No).frames(|_| Some(1)), Frames::Events);
    }
}
