//! The bus's line ring, read in place (`proto::ring`): a consumer asks for
//! it on a connection of its own (the answer carries the ring's memory
//! file, SCM_RIGHTS), maps it read-only, and then expands the lines the
//! bus names in `RingBatch` frames straight from it, instead of being sent
//! their bytes. Taken only when everything checks out — the bus lists
//! `line_ring`, the file is sealed against shrinking, growing and any
//! write but the bus's own mapping, opened read-only, of the size the bus
//! says — else the run goes on with bytes
//! over the socket, as with an older bus. A batch that does not check out
//! ([`RingView::batch`]) is never printed: the consumer drops it, asks for
//! its events again (`Ack.ring_off` with their nacks: they come back as
//! bytes, marked redelivered) and reads the ring no more that run.

use std::{
    io::{IoSliceMut, Write},
    num::NonZeroUsize,
    os::{
        fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::net::UnixStream,
    },
    path::Path,
    ptr::NonNull,
    time::Duration,
};

use nix::{
    fcntl::{fcntl, FcntlArg, OFlag, SealFlag},
    sys::{
        mman::{mmap, munmap, MapFlags, ProtFlags},
        socket::{recvmsg, ControlMessageOwned, MsgFlags},
    },
};
use proto::{
    ring::{self, Header, RingError, CHUNKS, CHUNK_SIZE},
    v1::{self, client_frame::Kind as C, server_frame::Kind as S},
};
use tokio_util::{bytes::BytesMut, codec::Decoder};

/// How long asking for the ring may take before the run goes on without.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// The ring, mapped read-only.
pub struct RingView {
    map: NonNull<u8>,
    len: usize,
    _fd: OwnedFd,
}

// SAFETY: a read-only mapping owned by the view, valid until Drop.
unsafe impl Send for RingView {}

impl std::fmt::Debug for RingView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingView").field("len", &self.len).finish()
    }
}

impl RingView {
    /// Asks the bus at `socket` for its ring; `None` when it has none, is
    /// older, or anything does not check out (the run then takes bytes).
    pub fn ask(socket: &Path) -> Option<RingView> {
        let (fd, offer) = ask(socket).ok()??;
        RingView::map(fd, &offer)
    }

    fn map(fd: OwnedFd, offer: &v1::RingOffer) -> Option<RingView> {
        let len = CHUNKS * CHUNK_SIZE;
        if offer.chunks as usize != CHUNKS || offer.chunk_size as usize != CHUNK_SIZE {
            return None;
        }
        let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).ok()?);
        if flags & OFlag::O_ACCMODE != OFlag::O_RDONLY {
            return None;
        }
        let seals =
            SealFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).ok()?);
        // Nobody but the bus's own mapping may write it (no write, no new
        // writable mapping, even through a descriptor reopened via /proc).
        let sealed =
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_FUTURE_WRITE;
        if seals & sealed != sealed {
            return None;
        }
        let size = nix::sys::stat::fstat(fd.as_raw_fd()).ok()?.st_size;
        if usize::try_from(size).ok()? != len {
            return None;
        }
        // SAFETY: a read-only shared mapping of a file whose size is sealed
        // at `len`: every byte of it stays mapped; unmapped in Drop.
        let map = unsafe {
            mmap(
                None,
                NonZeroUsize::new(len)?,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
            .ok()?
        };
        Some(RingView {
            map: map.cast(),
            len,
            _fd: fd,
        })
    }

    /// The lines of `b`: their cuts and body (a batch of their own, as a
    /// `LineBatch` holds them) and the first seq, copied out of the ring and
    /// checked on the copy against the batch's header and checksum: what
    /// is printed is what was checked, whatever the ring holds meanwhile.
    #[cfg(test)]
    pub fn batch(&self, b: &v1::RingBatch) -> Result<(Header, Vec<u8>, Vec<u8>), RingError> {
        let mut copy = Vec::new();
        let (h, cuts, body) = self.batch_in(b, &mut copy)?;
        Ok((h, cuts.to_vec(), body.to_vec()))
    }

    /// [`RingView::batch`], copied once into `copy` (a consumer's buffer,
    /// reused from batch to batch: no allocation once it is large enough)
    /// and read in place there.
    pub fn batch_in<'c>(
        &self,
        b: &v1::RingBatch,
        copy: &'c mut Vec<u8>,
    ) -> Result<(Header, &'c [u8], &'c [u8]), RingError> {
        // SAFETY: the whole mapping, valid for `self`'s life. Its bytes are
        // only copied out here (the bus may write them meanwhile: a copy
        // that changed under the copying fails its checks below).
        let all = unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) };
        let rest = ring::chunk_rest(all, b.chunk, b.offset)?;
        copy.clear();
        copy.extend_from_slice(&rest[..rest.len().min(ring::HEADER_LEN)]);
        let len = ring::batch_len(copy).and_then(|n| {
            if n <= rest.len() {
                Ok(n)
            } else {
                Err(RingError("runs past its chunk"))
            }
        })?;
        copy.clear();
        copy.extend_from_slice(&rest[..len]);
        let (h, cuts, body) = ring::parse_batch(copy, b.batch)?;
        let (cuts, body) = proto::lines::sub_batch(h.count, cuts, body, b.first_line, b.count)
            .map_err(|_| RingError("names lines it does not hold"))?;
        if h.first_seq.checked_add(u64::from(b.first_line)) != Some(b.first_seq) {
            return Err(RingError("is of other seqs than the frame says"));
        }
        Ok((h, cuts, body))
    }
}

impl Drop for RingView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of that length.
        unsafe {
            let _ = munmap(self.map.cast(), self.len);
        }
    }
}

/// Hello, then RingRequest, on a connection of its own; the offer and the
/// descriptor that came with it.
fn ask(socket: &Path) -> std::io::Result<Option<(OwnedFd, v1::RingOffer)>> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(ASK_TIMEOUT))?;
    s.set_write_timeout(Some(ASK_TIMEOUT))?;
    let mut out = BytesMut::new();
    let hello = v1::ClientFrame {
        kind: Some(C::Hello(v1::Hello {
            protocol_version: proto::PROTOCOL_VERSION,
            client_pid: std::process::id(),
            client_name: "dws-ring".into(),
            build: env!("CARGO_PKG_VERSION").into(),
        })),
    };
    proto::codec::encode_frame(&hello, &mut out).map_err(std::io::Error::other)?;
    s.write_all(&out)?;
    let mut reader = Reader::default();
    let Some(S::HelloAck(ack)) = reader.frame(&s)? else {
        return Ok(None);
    };
    if !ack.features.iter().any(|f| f == proto::FEATURE_LINE_RING) {
        return Ok(None);
    }
    out.clear();
    let ask = v1::ClientFrame {
        kind: Some(C::RingRequest(v1::RingRequest { request_id: 1 })),
    };
    proto::codec::encode_frame(&ask, &mut out).map_err(std::io::Error::other)?;
    s.write_all(&out)?;
    let offer = match reader.frame(&s)? {
        Some(S::RingOffer(o)) => o,
        _ => return Ok(None),
    };
    Ok(reader.fds.pop().map(|fd| (fd, offer)))
}

/// Frames read with `recvmsg`, keeping the descriptors that come along.
#[derive(Default)]
struct Reader {
    buf: BytesMut,
    codec: proto::ClientCodec,
    fds: Vec<OwnedFd>,
}

impl Reader {
    /// The next whole frame (`None` at the end of the stream or for a frame
    /// that does not decode).
    fn frame(&mut self, s: &UnixStream) -> std::io::Result<Option<S>> {
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(f)) => return Ok(f.kind),
                Ok(None) => {}
                Err(_) => return Ok(None),
            }
            let mut chunk = [0u8; 4096];
            let mut cmsg = nix::cmsg_space!([RawFd; 4]);
            let (n, fds) = {
                let mut iov = [IoSliceMut::new(&mut chunk)];
                let msg = recvmsg::<()>(
                    s.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .map_err(std::io::Error::from)?;
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(got) = c {
                        fds.extend(got);
                    }
                }
                (msg.bytes, fds)
            };
            for fd in fds {
                // SAFETY: the kernel gave us this descriptor; we own it now.
                self.fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use proto::ring::{Header, Kind};
    use std::{ffi::CString, fs::File, io::Seek};

    const LEN: usize = CHUNKS * CHUNK_SIZE;

    pub(crate) fn offer() -> v1::RingOffer {
        v1::RingOffer {
            request_id: 1,
            chunks: CHUNKS as u32,
            chunk_size: CHUNK_SIZE as u32,
        }
    }

    /// The bus's writable mapping of a test ring (made before the seals).
    pub(crate) struct Writable(NonNull<std::ffi::c_void>);

    impl Writable {
        /// Writes `bytes` at `at`, as the bus writes its ring.
        pub(crate) fn write_at(&self, at: usize, bytes: &[u8]) {
            assert!(at + bytes.len() <= LEN);
            // SAFETY: within the mapping of LEN bytes made in `ring_file`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    self.0.as_ptr().cast::<u8>().add(at),
                    bytes.len(),
                );
            }
        }
    }

    impl Drop for Writable {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `ring_file`, of LEN bytes.
            unsafe {
                let _ = munmap(self.0, LEN);
            }
        }
    }

    /// A ring file as the bus makes it, with one batch at chunk 1, offset
    /// 64; `seal`: sealed as the bus seals it (size, and every write but
    /// the mapping made before). Returns the file, the bus's mapping and a
    /// read-only descriptor of it.
    pub(crate) fn ring_file(seal: bool) -> (File, Writable, OwnedFd) {
        let name = CString::new("test-ring").unwrap();
        let fd = memfd_create(&name, MemFdCreateFlag::MFD_ALLOW_SEALING).unwrap();
        let f = File::from(fd);
        f.set_len(LEN as u64).unwrap();
        let (cuts, body) = batch();
        let h = Header {
            kind: Kind::Ndjson,
            batch: 9,
            first_seq: 100,
            count: 2,
            cuts_len: cuts.len() as u32,
            body_len: body.len() as u32,
        };
        let mut bytes = vec![0u8; h.len()];
        ring::write_batch(&mut bytes, &h, &cuts, &body);
        // SAFETY: a shared writable mapping of the whole file.
        let map = unsafe {
            mmap(
                None,
                NonZeroUsize::new(LEN).unwrap(),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                f.as_fd(),
                0,
            )
            .unwrap()
        };
        let w = Writable(map);
        w.write_at(CHUNK_SIZE + 64, &bytes);
        if seal {
            fcntl(
                f.as_raw_fd(),
                FcntlArg::F_ADD_SEALS(
                    SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_FUTURE_WRITE,
                ),
            )
            .unwrap();
        }
        let ro = std::fs::File::open(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
        (f, w, OwnedFd::from(ro))
    }

    fn batch() -> (Vec<u8>, Vec<u8>) {
        let (mut body, mut cuts) = (vec![], vec![]);
        for n in 0..2 {
            proto::lines::render_line(
                &mut body,
                &mut cuts,
                b"{\"seq\":1",
                format!("\"n\":{n}").as_bytes(),
                1,
            );
        }
        (cuts, body)
    }

    /// The ring of `ro`, as a consumer maps it.
    pub(crate) fn view(ro: OwnedFd) -> RingView {
        RingView::map(ro, &offer()).expect("a good ring is taken")
    }

    pub(crate) fn frame(first_line: u32, count: u32, first_seq: u64) -> v1::RingBatch {
        v1::RingBatch {
            id: 1,
            batch: 9,
            chunk: 1,
            offset: 64,
            first_line,
            count,
            first_seq,
        }
    }

    #[test]
    fn a_sealed_read_only_ring_is_read_in_place_and_a_rewritten_batch_refused() {
        let (mut f, w, ro) = ring_file(true);
        let view = RingView::map(ro, &offer()).expect("a good ring is taken");
        let (h, cuts, body) = view.batch(&frame(1, 1, 101)).unwrap();
        assert_eq!(h.first_seq, 100);
        let (c, b) = batch();
        assert_eq!(cuts, &c[8..]);
        assert_eq!(body, &b[b.len() / 2..]);
        // Lines it does not hold, or other seqs than the frame says.
        assert!(view.batch(&frame(1, 2, 101)).is_err());
        assert!(view.batch(&frame(0, 1, 101)).is_err());
        // Nobody but the bus's mapping writes it any more.
        f.seek(std::io::SeekFrom::Start((CHUNK_SIZE + 64 + 60) as u64))
            .unwrap();
        assert!(f.write_all(b"X").is_err(), "sealed against writes");
        // Its bytes written over behind the consumer's back: refused.
        w.write_at(CHUNK_SIZE + 64 + 60, b"X");
        assert!(view.batch(&frame(0, 2, 100)).is_err());
    }

    #[test]
    fn a_ring_that_is_not_sealed_or_not_read_only_or_of_another_size_is_not_taken() {
        let (_f, _w, ro) = ring_file(false);
        assert!(RingView::map(ro, &offer()).is_none(), "not sealed");
        let (f, _w, _ro) = ring_file(true);
        let rw = OwnedFd::from(f);
        assert!(RingView::map(rw, &offer()).is_none(), "writable");
        let (_f, _w, ro) = ring_file(true);
        let other = v1::RingOffer {
            chunks: 2,
            ..offer()
        };
        assert!(RingView::map(ro, &other).is_none(), "another size");
    }
}
