//! The line ring: lines the bus renders once, in shared memory every
//! consumer of this user reads in place. The bus writes each batch of
//! lines (a `LineBatch`'s cuts and body, [`crate::lines`]) into a chunk of
//! a sealed memory file it hands to `dws` over the socket; a consumer is
//! then sent only where a batch is ([`crate::v1::RingBatch`]), not its
//! bytes, and expands it exactly as a `LineBatch` (so its stdout is byte
//! for byte the same). Both binaries share this file: the bus writes with
//! [`write_batch`]; `dws` reads with [`read_batch`], which refuses any
//! batch whose header does not describe what the frame names or whose
//! bytes fail their checksum (a rewritten or damaged ring is never a
//! wrong line).
//!
//! Layout: [`CHUNKS`] chunks of [`CHUNK_SIZE`] bytes. A batch is a
//! [`HEADER_LEN`]-byte header, its cuts, its body, within one chunk. A
//! chunk is written again only once every consumer told of a batch in it
//! said it read it (`Ack.ring_read`), so a consumer never finds its batch
//! overwritten unless something is wrong.

use std::fmt;

/// Bytes of one chunk.
pub const CHUNK_SIZE: usize = 1 << 20;
/// Chunks in the ring (its memory file is `CHUNKS × CHUNK_SIZE`; pages
/// take memory only once written).
pub const CHUNKS: usize = 32;
/// Bytes of a batch's header.
pub const HEADER_LEN: usize = 40;
const MAGIC: u32 = 0x5253_5744; // "DWSR", little-endian

/// What a batch's lines are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// NDJSON lines without `subscribe_id` (inserted at each cut).
    Ndjson = 1,
    /// `--format raw` lines (the payload and a newline).
    Raw = 2,
}

/// A batch's header, as written before its cuts and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// A number the bus gives each batch it writes, never reused.
    pub batch: u64,
    pub first_seq: u64,
    pub count: u32,
    pub cuts_len: u32,
    pub body_len: u32,
}

impl Header {
    /// Bytes the batch takes in its chunk, header included.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.cuts_len as usize + self.body_len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Why a batch cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingError(pub &'static str);

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a line ring batch that {}", self.0)
    }
}

impl std::error::Error for RingError {}

/// Writes a batch at `dst` (its chunk, from the batch's offset on): the
/// header, then `cuts`, then `body`. `dst` must hold [`Header::len`] bytes.
pub fn write_batch(dst: &mut [u8], h: &Header, cuts: &[u8], body: &[u8]) {
    debug_assert_eq!(cuts.len(), h.cuts_len as usize);
    debug_assert_eq!(body.len(), h.body_len as usize);
    let crc = checksum(cuts, body);
    let mut head = [0u8; HEADER_LEN];
    head[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    head[4] = h.kind as u8;
    head[8..16].copy_from_slice(&h.batch.to_le_bytes());
    head[16..24].copy_from_slice(&h.first_seq.to_le_bytes());
    head[24..28].copy_from_slice(&h.count.to_le_bytes());
    head[28..32].copy_from_slice(&h.cuts_len.to_le_bytes());
    head[32..36].copy_from_slice(&h.body_len.to_le_bytes());
    head[36..40].copy_from_slice(&crc.to_le_bytes());
    dst[..HEADER_LEN].copy_from_slice(&head);
    dst[HEADER_LEN..HEADER_LEN + cuts.len()].copy_from_slice(cuts);
    let at = HEADER_LEN + cuts.len();
    dst[at..at + body.len()].copy_from_slice(body);
}

fn checksum(cuts: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(cuts);
    h.update(body);
    h.finalize()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The batch `batch` at `offset` of chunk `chunk` of `ring` (the whole
/// mapping): its header, cuts and body, once the header says it is that
/// batch, it fits its chunk and its bytes check out.
pub fn read_batch(
    ring: &[u8],
    chunk: u32,
    offset: u32,
    batch: u64,
) -> Result<(Header, &[u8], &[u8]), RingError> {
    parse_batch(chunk_rest(ring, chunk, offset)?, batch)
}

/// The bytes of chunk `chunk` of `ring` from `offset` to the chunk's end:
/// where a batch named by a frame lies.
pub fn chunk_rest(ring: &[u8], chunk: u32, offset: u32) -> Result<&[u8], RingError> {
    let chunk = chunk as usize;
    let offset = offset as usize;
    if chunk >= ring.len() / CHUNK_SIZE || offset + HEADER_LEN > CHUNK_SIZE {
        return Err(RingError("is outside the ring"));
    }
    let at = chunk * CHUNK_SIZE + offset;
    Ok(&ring[at..(chunk + 1) * CHUNK_SIZE])
}

/// How many bytes the batch whose header starts `head` says it takes:
/// what a reader copies out (if its chunk holds that many) before it checks
/// the copy ([`parse_batch`]).
pub fn batch_len(head: &[u8]) -> Result<usize, RingError> {
    Ok(header_of(head)?.len())
}

fn header_of(bytes: &[u8]) -> Result<Header, RingError> {
    let head = bytes
        .get(..HEADER_LEN)
        .ok_or(RingError("runs past its chunk"))?;
    if u32_at(head, 0) != MAGIC {
        return Err(RingError("has no header"));
    }
    let kind = match head[4] {
        1 => Kind::Ndjson,
        2 => Kind::Raw,
        _ => return Err(RingError("is of no known kind")),
    };
    Ok(Header {
        kind,
        batch: u64_at(head, 8),
        first_seq: u64_at(head, 16),
        count: u32_at(head, 24),
        cuts_len: u32_at(head, 28),
        body_len: u32_at(head, 32),
    })
}

/// The batch `batch` at the start of `bytes` (the rest of its chunk, or a
/// reader's copy of it): its header, cuts and body, once the header says
/// it is that batch, it fits and its bytes check out.
pub fn parse_batch(bytes: &[u8], batch: u64) -> Result<(Header, &[u8], &[u8]), RingError> {
    let h = header_of(bytes)?;
    if h.batch != batch {
        return Err(RingError("was written over (another batch is there)"));
    }
    if h.len() > bytes.len() {
        return Err(RingError("runs past its chunk"));
    }
    let cuts = &bytes[HEADER_LEN..HEADER_LEN + h.cuts_len as usize];
    let body_at = HEADER_LEN + h.cuts_len as usize;
    let body = &bytes[body_at..body_at + h.body_len as usize];
    if checksum(cuts, body) != u32_at(bytes, 36) {
        return Err(RingError("fails its checksum"));
    }
    Ok((h, cuts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(batch: u64, cuts: &[u8], body: &[u8]) -> Header {
        Header {
            kind: Kind::Ndjson,
            batch,
            first_seq: 7,
            count: 2,
            cuts_len: cuts.len() as u32,
            body_len: body.len() as u32,
        }
    }

    #[test]
    fn a_batch_reads_back_as_written_and_nothing_else_passes() {
        let mut ring = vec![0u8; 2 * CHUNK_SIZE];
        let (cuts, body) = (b"cutscuts".to_vec(), b"{\"a\":1}\n{\"b\":2}\n".to_vec());
        let h = header(42, &cuts, &body);
        let at = CHUNK_SIZE + 100;
        write_batch(&mut ring[at..], &h, &cuts, &body);
        let (got, c, b) = read_batch(&ring, 1, 100, 42).unwrap();
        assert_eq!((got, c, b), (h, &cuts[..], &body[..]));
        // Another batch number, place or chunk: refused.
        assert!(read_batch(&ring, 1, 100, 43).is_err());
        assert!(read_batch(&ring, 1, 101, 42).is_err());
        assert!(read_batch(&ring, 0, 100, 42).is_err());
        assert!(read_batch(&ring, 2, 100, 42).is_err());
        assert!(read_batch(&ring, 1, (CHUNK_SIZE - 10) as u32, 42).is_err());
        // A flipped byte of its lines: refused.
        ring[at + HEADER_LEN + cuts.len() + 3] ^= 1;
        assert_eq!(
            read_batch(&ring, 1, 100, 42).unwrap_err(),
            RingError("fails its checksum")
        );
        // A length that runs past the chunk: refused, never read past.
        let mut ring = vec![0u8; CHUNK_SIZE];
        let big = Header {
            body_len: CHUNK_SIZE as u32,
            ..h
        };
        let mut head = vec![0u8; HEADER_LEN + cuts.len() + body.len()];
        write_batch(&mut head, &h, &cuts, &body);
        head[32..36].copy_from_slice(&big.body_len.to_le_bytes());
        ring[..head.len()].copy_from_slice(&head);
        assert_eq!(
            read_batch(&ring, 0, 0, 42).unwrap_err(),
            RingError("runs past its chunk")
        );
    }
}
