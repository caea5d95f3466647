//! The line ring's memory ([`Ring`]): a sealed memory file of
//! [`CHUNKS`] × [`CHUNK_SIZE`] bytes (`proto::ring`), mapped by busd to
//! write batches of lines and handed read-only to consumers, who read them
//! in place. Batches go one after another into the current chunk; a full
//! chunk is left for the free one with the lowest number (so a bus whose
//! consumers keep up touches few pages). A chunk is free once no
//! connection holds a batch in it ([`Ring::hold`], [`Ring::release`]), and
//! reusing it makes every slot in it stale, which [`Ring::hold`] then
//! refuses: a consumer is only ever told of a batch that stays as written
//! until it says it read it.
//!
//! The file's size is sealed (it can neither shrink nor grow), so a
//! consumer's mapping never faults; consumers get a descriptor opened
//! read-only, so they cannot write into it.

use std::{
    ffi::CString,
    fs::File,
    num::NonZeroUsize,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    ptr::NonNull,
};

use nix::{
    fcntl::{fcntl, FcntlArg, SealFlag},
    sys::{
        memfd::{memfd_create, MemFdCreateFlag},
        mman::{mmap, munmap, MapFlags, ProtFlags},
    },
};
use proto::ring::{self, Header, Kind, CHUNKS, CHUNK_SIZE};

/// Where a batch was written, and under which use of its chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub chunk: u32,
    pub offset: u32,
    pub batch: u64,
    /// The chunk's use when it was written: a reused chunk's slots are stale.
    generation: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Chunk {
    /// Batches in it that a connection was told of and has not released.
    holds: u32,
    /// Bytes written in its current use.
    used: usize,
    generation: u64,
}

/// The ring: its file, busd's writable mapping, and its chunks' state.
pub struct Ring {
    file: File,
    map: NonNull<u8>,
    chunks: Vec<Chunk>,
    current: usize,
    next_batch: u64,
}

// SAFETY: the mapping is owned by the ring and written only through
// `&mut self`; the pointer is valid for the ring's life on any thread.
unsafe impl Send for Ring {}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("current", &self.current)
            .field("next_batch", &self.next_batch)
            .finish()
    }
}

const LEN: usize = CHUNKS * CHUNK_SIZE;

impl Ring {
    /// A new ring, its size sealed.
    pub fn create() -> std::io::Result<Ring> {
        let name = CString::new("dws-line-ring").expect("no NUL");
        let fd = memfd_create(
            &name,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )?;
        let file = File::from(fd);
        file.set_len(LEN as u64)?;
        fcntl(
            file.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )?;
        // SAFETY: a fresh shared mapping of the whole file, whose size is
        // sealed; unmapped only in Drop (or below, if it cannot be sealed).
        let map = unsafe {
            mmap(
                None,
                NonZeroUsize::new(LEN).expect("not zero"),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                file.as_fd(),
                0,
            )?
        };
        // Once this mapping exists, nobody may write the file any more (a
        // descriptor reopened read-write through /proc, a new writable
        // mapping): only this mapping writes. A kernel without the seal
        // (before Linux 5.1) gets no ring: consumers are sent bytes.
        if let Err(e) = fcntl(
            file.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_FUTURE_WRITE | SealFlag::F_SEAL_SEAL),
        ) {
            // SAFETY: the mapping made above, of that length, used by nobody.
            unsafe {
                let _ = munmap(map, LEN);
            }
            return Err(std::io::Error::other(format!(
                "cannot seal the line ring against writes ({e}): the kernel predates F_SEAL_FUTURE_WRITE"
            )));
        }
        Ok(Ring {
            file,
            map: map.cast(),
            chunks: vec![Chunk::default(); CHUNKS],
            current: 0,
            next_batch: 1,
        })
    }

    /// A read-only descriptor of the ring's file, for a consumer.
    pub fn reader(&self) -> std::io::Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let f = std::fs::OpenOptions::new().read(true).open(path)?;
        Ok(OwnedFd::from(f))
    }

    /// Writes a batch into the ring; `None` when it cannot (larger than a
    /// chunk, or every chunk with room held by someone).
    pub fn write(
        &mut self,
        kind: Kind,
        first_seq: u64,
        count: u32,
        cuts: &[u8],
        body: &[u8],
    ) -> Option<Slot> {
        let header = Header {
            kind,
            batch: self.next_batch,
            first_seq,
            count,
            cuts_len: u32::try_from(cuts.len()).ok()?,
            body_len: u32::try_from(body.len()).ok()?,
        };
        // Batches start 8-byte aligned.
        let need = header.len().next_multiple_of(8);
        if need > CHUNK_SIZE {
            return None;
        }
        if self.chunks[self.current].used + need > CHUNK_SIZE {
            let free = (0..CHUNKS).find(|&i| i != self.current && self.chunks[i].holds == 0)?;
            let c = &mut self.chunks[free];
            c.used = 0;
            c.generation += 1;
            self.current = free;
        }
        let c = &mut self.chunks[self.current];
        let offset = c.used;
        let at = self.current * CHUNK_SIZE + offset;
        // SAFETY: `at + need <= LEN` (the chunk has room); only busd
        // writes the mapping, and never where a held batch is.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(at), need) };
        ring::write_batch(dst, &header, cuts, body);
        c.used += need;
        self.next_batch += 1;
        Some(Slot {
            chunk: self.current as u32,
            offset: offset as u32,
            batch: header.batch,
            generation: c.generation,
        })
    }

    /// A connection is about to tell its consumer of `slot`: its chunk is
    /// not reused until [`Ring::release`]. `false` (nothing held) when the
    /// chunk was reused since the slot was written.
    pub fn hold(&mut self, slot: &Slot) -> bool {
        match self.chunks.get_mut(slot.chunk as usize) {
            Some(c) if c.generation == slot.generation => {
                c.holds += 1;
                true
            }
            _ => false,
        }
    }

    /// A connection's consumer read a batch of `chunk` (or left).
    pub fn release(&mut self, chunk: u32) {
        if let Some(c) = self.chunks.get_mut(chunk as usize) {
            c.holds = c.holds.saturating_sub(1);
        }
    }

    /// Chunks now free (held by nobody, not being written).
    #[cfg(test)]
    fn free_chunks(&self) -> usize {
        (0..CHUNKS)
            .filter(|&i| i != self.current && self.chunks[i].holds == 0)
            .count()
    }

    /// The ring as a reader sees it (tests).
    #[cfg(test)]
    fn bytes(&self) -> &[u8] {
        // SAFETY: the whole mapping, for reading in a test.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), LEN) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, of that length.
        unsafe {
            let _ = munmap(self.map.cast(), LEN);
        }
    }
}

/// A descriptor as an `OwnedFd` (for a test's own reader).
#[cfg(test)]
fn dup(fd: &OwnedFd) -> OwnedFd {
    fd.try_clone().expect("dup")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_read_back_and_a_chunk_is_reused_only_once_released() {
        let mut r = Ring::create().unwrap();
        // Four of these fit in a chunk.
        let body = vec![b'x'; 250_000];
        let mut slots = vec![];
        for i in 0..5 {
            let s = r.write(Kind::Raw, i * 10, 1, b"cut-cut-", &body).unwrap();
            assert!(r.hold(&s));
            slots.push(s);
        }
        let (h, cuts, b) =
            ring::read_batch(r.bytes(), slots[3].chunk, slots[3].offset, slots[3].batch).unwrap();
        assert_eq!(
            (h.first_seq, cuts, b.len()),
            (30, &b"cut-cut-"[..], 250_000)
        );
        assert_eq!((slots[3].chunk, slots[4].chunk), (0, 1));
        // Chunk 0 is held: once chunk 1 is full, the next free one is 2.
        for _ in 0..4 {
            r.write(Kind::Raw, 0, 1, b"cut-cut-", &body).unwrap();
        }
        assert_eq!(r.current, 2);
        // Released, chunk 0 is the lowest free one again (1 is still held),
        // and its old slots are stale.
        for s in &slots[..4] {
            r.release(s.chunk);
        }
        for _ in 0..4 {
            r.write(Kind::Raw, 0, 1, b"cut-cut-", &body).unwrap();
        }
        assert_eq!(r.current, 0);
        assert!(!r.hold(&slots[0]), "a reused chunk's slot is stale");
        assert!(
            ring::read_batch(r.bytes(), slots[0].chunk, slots[0].offset, slots[0].batch).is_err()
        );
        assert!(r.hold(&slots[4]), "chunk 1 was never reused");
    }

    #[test]
    fn a_full_ring_writes_nothing_and_a_batch_over_a_chunk_never_goes_in() {
        let mut r = Ring::create().unwrap();
        assert!(r
            .write(Kind::Raw, 1, 1, b"", &vec![b'x'; CHUNK_SIZE])
            .is_none());
        let body = vec![b'x'; CHUNK_SIZE / 2];
        let mut n = 0;
        while let Some(s) = r.write(Kind::Raw, 1, 1, b"", &body) {
            assert!(r.hold(&s));
            n += 1;
        }
        assert_eq!(n, CHUNKS, "one such batch per chunk");
        assert_eq!(r.free_chunks(), 0);
    }

    #[test]
    fn a_consumer_gets_a_read_only_descriptor_of_a_sealed_file() {
        let r = Ring::create().unwrap();
        let fd = r.reader().unwrap();
        let f = File::from(dup(&fd));
        assert_eq!(f.metadata().unwrap().len(), LEN as u64);
        assert!(f.set_len(1).is_err(), "read-only, and sealed anyway");
        let seals = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).unwrap();
        let want = SealFlag::F_SEAL_SHRINK
            | SealFlag::F_SEAL_GROW
            | SealFlag::F_SEAL_FUTURE_WRITE
            | SealFlag::F_SEAL_SEAL;
        assert_eq!(SealFlag::from_bits_truncate(seals) & want, want);
        // SAFETY: a shared writable mapping of a read-only descriptor is refused.
        let w = unsafe {
            mmap(
                None,
                NonZeroUsize::new(4096).unwrap(),
                ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        };
        assert!(w.is_err());
    }

    /// Issue 49, row 3: a same-uid process reopening the ring read-write
    /// through /proc cannot write it, by `write` or by a new writable
    /// mapping; the bus's own mapping still writes.
    #[test]
    fn the_ring_reopened_read_write_through_proc_cannot_be_written() {
        use std::io::Write as _;
        let mut r = Ring::create().unwrap();
        let path = format!("/proc/self/fd/{}", r.file.as_raw_fd());
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        assert!(f.write_all(b"forged").is_err(), "a write through /proc");
        // SAFETY: an attempt at a shared writable mapping; refused.
        let w = unsafe {
            mmap(
                None,
                NonZeroUsize::new(4096).unwrap(),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                f.as_fd(),
                0,
            )
        };
        assert!(w.is_err(), "a writable mapping through /proc");
        assert!(r.write(Kind::Ndjson, 1, 1, &[], b"ok\n").is_some());
    }
}
