//! The frames of lines rendered once for every consumer (`crate::lines`):
//! a piece whose run is in the line ring goes to a consumer that reads the
//! ring as a `RingBatch` (where the lines are; the connection holds that
//! batch until the consumer's `Ack.ring_read` says it read it: see
//! `consumer`), any other
//! as a `LineBatch` (the bytes, shared when large enough, copied
//! otherwise). And the ring itself, for a consumer that asks for it on a
//! connection of its own: a `RingOffer` with a read-only descriptor of
//! the ring's memory file passed with it.

use proto::{
    lines,
    ring::{CHUNKS, CHUNK_SIZE},
    v1::{self, server_frame::Kind as S, ErrorCode},
};

use super::{consumer::Consumer, Connection};
use crate::lines::{Piece, MIN_SHARED_SLICE};

impl Connection {
    /// Queues one frame per piece.
    pub(super) fn queue_pieces(&mut self, c: &mut Consumer, pieces: Vec<Piece>) {
        for p in pieces {
            match p.ring {
                Some((slot, first_line)) => {
                    let id = c.hold(slot.chunk);
                    self.send(S::RingBatch(v1::RingBatch {
                        id,
                        batch: slot.batch,
                        chunk: slot.chunk,
                        offset: slot.offset,
                        first_line,
                        count: p.count(),
                        first_seq: p.first_seq,
                    }));
                }
                None => self.queue_line_batch(p),
            }
        }
    }

    /// One `LineBatch` frame: its header encoded, its cuts and body shared
    /// when large enough, copied otherwise.
    fn queue_line_batch(&mut self, p: Piece) {
        let out = &mut self.out;
        let count = p.count();
        if lines::frame_prefix(p.first_seq, count, p.cuts.len(), p.body.len(), out.buf()).is_err() {
            // A run's body stays far below a frame (its budget plus one
            // bounded line).
            tracing::error!(seq = p.first_seq, "a line batch over the frame size");
            return;
        }
        let share = p.body.len() >= MIN_SHARED_SLICE;
        if share {
            out.push_shared(p.cuts);
        } else {
            out.buf().extend_from_slice(&p.cuts);
        }
        lines::body_key(p.body.len(), out.buf());
        if share {
            out.push_shared(p.body);
        } else {
            out.buf().extend_from_slice(&p.body);
        }
    }

    /// `RingRequest`: the ring's descriptor goes with the answer.
    pub(super) fn ring_offer(&mut self, request_id: u64) {
        let fd = match self.rendered.ring_reader() {
            Some(Ok(fd)) => fd,
            Some(Err(e)) => {
                tracing::warn!(conn = self.id, cause = %e, "cannot open the line ring for a consumer");
                return self.error(
                    request_id,
                    ErrorCode::FailedPrecondition,
                    "the line ring cannot be opened",
                );
            }
            None => {
                return self.error(
                    request_id,
                    ErrorCode::FailedPrecondition,
                    "this bus has no line ring",
                )
            }
        };
        if self.pass_fd.is_some() {
            return self.error(
                request_id,
                ErrorCode::BadRequest,
                "the line ring was asked for twice",
            );
        }
        self.pass_fd = Some(fd);
        self.send(S::RingOffer(v1::RingOffer {
            request_id,
            chunks: CHUNKS as u32,
            chunk_size: CHUNK_SIZE as u32,
        }));
    }
}
