//! [`Outbox`]: a connection's outbound bytes, in order — small frames
//! encoded into one growing buffer, and shared buffers (a `LineBatch` body
//! rendered once for every consumer, see `crate::lines`) queued by reference,
//! never copied. Written with one vectored write per wake-up.

use std::{collections::VecDeque, io::IoSlice};

use super::socket::Writer;
use bytes::{Buf, Bytes, BytesMut};

/// Most buffers handed to one `writev`.
const MAX_IOV: usize = 64;

#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// Written before `tail`, oldest first.
    queued: VecDeque<Bytes>,
    queued_len: usize,
    /// Frames encoded since the last shared buffer.
    tail: BytesMut,
}

impl Outbox {
    pub(super) fn with_capacity(n: usize) -> Outbox {
        Outbox {
            tail: BytesMut::with_capacity(n),
            ..Outbox::default()
        }
    }

    /// Bytes not written yet.
    pub(super) fn len(&self) -> usize {
        self.queued_len + self.tail.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the next frame is encoded (after everything queued).
    pub(super) fn buf(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Queues a shared buffer after everything so far.
    pub(super) fn push_shared(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        if !self.tail.is_empty() {
            let frames = self.tail.split().freeze();
            self.queued_len += frames.len();
            self.queued.push_back(frames);
        }
        self.queued_len += b.len();
        self.queued.push_back(b);
    }

    /// One vectored write of what is queued; drops what was written.
    /// `fd` goes with it (SCM_RIGHTS), when given. Cancel-safe: nothing is
    /// dropped unless the write happened.
    pub(super) async fn write_to(
        &mut self,
        wr: &mut Writer,
        fd: Option<&std::os::fd::OwnedFd>,
    ) -> std::io::Result<usize> {
        let n = {
            let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(MAX_IOV.min(self.queued.len() + 1));
            iov.extend(self.queued.iter().take(MAX_IOV).map(|b| IoSlice::new(b)));
            if iov.len() < MAX_IOV && !self.tail.is_empty() {
                iov.push(IoSlice::new(&self.tail));
            }
            wr.write_vectored(&iov, fd).await?
        };
        self.consume(n);
        Ok(n)
    }

    /// Drops the first `n` bytes.
    fn consume(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.queued.front_mut() else {
                let k = n.min(self.tail.len());
                self.tail.advance(k);
                return;
            };
            let k = n.min(front.len());
            front.advance(k);
            self.queued_len -= k;
            n -= k;
            if front.is_empty() {
                self.queued.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(o: &Outbox) -> Vec<u8> {
        let mut v: Vec<u8> = o.queued.iter().flat_map(|b| b.iter().copied()).collect();
        v.extend_from_slice(&o.tail);
        v
    }

    #[test]
    fn shared_buffers_keep_their_place_among_frames_and_partial_writes_resume() {
        let mut o = Outbox::with_capacity(8);
        o.buf().extend_from_slice(b"ab");
        o.push_shared(Bytes::from_static(b"cde"));
        o.buf().extend_from_slice(b"f");
        o.push_shared(Bytes::from_static(b""));
        o.push_shared(Bytes::from_static(b"gh"));
        o.buf().extend_from_slice(b"ij");
        assert_eq!(all(&o), b"abcdefghij");
        assert_eq!(o.len(), 10);
        o.consume(3);
        assert_eq!(all(&o), b"defghij");
        assert_eq!(o.len(), 7);
        o.consume(6);
        assert_eq!(all(&o), b"j");
        o.consume(1);
        assert!(o.is_empty());
    }
}
