//! The on-disk record format of the segmented event log, and the scan that
//! recovers a segment: pure functions over bytes, no I/O.
//!
//! A segment is a sequence of records, each
//! `[u32 len][u32 crc32(payload)][payload]` (little endian). A payload is an
//! event (`1`, then seq, received-at, dedup scope, event id, event type,
//! route, encoded event) or a commit (`2`, then the first and last seq of the
//! batch it closes). A batch is durable once its commit record is.
//!
//! Recovery ([`scan`]) distinguishes two kinds of damage:
//! - a **torn tail**: the file ends inside a record, in zeros, or in bytes no
//!   valid record follows. Everything after the last commit is dropped — that
//!   batch was never acknowledged (acks follow the fsync of its commit).
//! - **corruption**: a record whose checksum fails *followed by* a valid
//!   record. The events around it are kept; the seqs it hid become a damaged
//!   range that is reported and never delivered.

use crate::eventlog::LoggedEvent;

/// Bytes of a record header: length and checksum.
pub const HEADER: usize = 8;
/// The largest payload a record may claim; anything larger is damage. Events
/// are bounded by the 4 MiB frame limit, so this leaves room for the fields.
pub const MAX_PAYLOAD: usize = 8 << 20;

const KIND_EVENT: u8 = 1;
const KIND_COMMIT: u8 = 2;

/// One event as it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub seq: u64,
    pub received_at_unix_ms: i64,
    /// Dedup scope; empty when the event is not deduplicated.
    pub scope: String,
    pub event_id: String,
    pub event_type: String,
    /// The upstream subscription the event was routed to (may be empty).
    pub route: String,
    /// `v1::Event`, encoded once.
    pub encoded: Vec<u8>,
}

impl EventRecord {
    /// The event as the log holds it in memory.
    pub fn into_logged(self) -> LoggedEvent {
        LoggedEvent {
            seq: self.seq,
            event_type: self.event_type,
            received_at_unix_ms: self.received_at_unix_ms,
            encoded: bytes::Bytes::from(self.encoded),
            scope: self.scope,
            event_id: self.event_id,
            route: self.route,
            damaged: false,
            line_parts: std::sync::OnceLock::new(),
            where_input: std::sync::OnceLock::new(),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

fn frame(out: &mut [u8], payload_start: usize) {
    let payload = &out[payload_start + HEADER..];
    let len = payload.len() as u32;
    let crc = crc32fast::hash(payload);
    out[payload_start..payload_start + 4].copy_from_slice(&len.to_le_bytes());
    out[payload_start + 4..payload_start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The fields of one event record, borrowed from wherever the event lives.
pub struct EventFields<'a> {
    pub seq: u64,
    pub received_at_unix_ms: i64,
    pub scope: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub route: &'a str,
    pub encoded: &'a [u8],
}

/// Appends one event record to `out`.
pub fn put_event(out: &mut Vec<u8>, e: &EventFields<'_>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    out.push(KIND_EVENT);
    out.extend_from_slice(&e.seq.to_le_bytes());
    out.extend_from_slice(&e.received_at_unix_ms.to_le_bytes());
    for s in [e.scope, e.event_id, e.event_type, e.route] {
        put_str(out, s.as_bytes());
    }
    put_str(out, e.encoded);
    frame(out, start);
}

/// Appends the commit record that closes a batch of seqs `first..=last`.
pub fn put_commit(out: &mut Vec<u8>, first: u64, last: u64) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    out.push(KIND_COMMIT);
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&last.to_le_bytes());
    frame(out, start);
}

enum Payload {
    Event(EventRecord),
    Commit,
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        Some(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?).ok()
    }
}

fn parse_payload(p: &[u8]) -> Option<Payload> {
    let (&kind, rest) = p.split_first()?;
    let mut c = Cursor { buf: rest };
    let payload = match kind {
        KIND_EVENT => Payload::Event(EventRecord {
            seq: c.u64()?,
            received_at_unix_ms: c.u64()? as i64,
            scope: c.string()?,
            event_id: c.string()?,
            event_type: c.string()?,
            route: c.string()?,
            encoded: c.bytes()?,
        }),
        KIND_COMMIT => {
            c.u64()?;
            c.u64()?;
            Payload::Commit
        }
        _ => return None,
    };
    c.buf.is_empty().then_some(payload)
}

/// A valid record at `pos`: its payload and total length.
fn record_at(buf: &[u8], pos: usize) -> Option<(Payload, usize)> {
    let head = buf.get(pos..pos + HEADER)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    if len == 0 || len > MAX_PAYLOAD {
        return None;
    }
    let payload = buf.get(pos + HEADER..pos + HEADER + len)?;
    // Cheap checks before the checksum: the resync scan tries every offset.
    if !matches!(payload[0], KIND_EVENT | KIND_COMMIT) || crc32fast::hash(payload) != crc {
        return None;
    }
    Some((parse_payload(payload)?, HEADER + len))
}

/// A stretch of a segment that failed its checksum, with valid records after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// Byte offset where the damage starts.
    pub offset: u64,
    /// Bytes skipped before the next valid record.
    pub len: u64,
}

/// What [`scan`] recovered from one segment.
#[derive(Debug, Default)]
pub struct Scanned {
    /// Committed events, in file order.
    pub events: Vec<EventRecord>,
    /// Damage with valid records after it.
    pub corruptions: Vec<Corruption>,
    /// Length of the valid prefix: everything up to the last commit. The
    /// file is cut back to this on recovery.
    pub committed_len: u64,
    /// Bytes after `committed_len` that were dropped (a torn tail).
    pub torn_bytes: u64,
    /// Events dropped with the torn tail (valid, but never committed).
    pub torn_events: usize,
}

/// Recovers a segment's records (see the module doc for the rules).
pub fn scan(buf: &[u8]) -> Scanned {
    let mut out = Scanned::default();
    let mut uncommitted: Vec<EventRecord> = vec![];
    let mut pos = 0;
    while pos < buf.len() {
        match record_at(buf, pos) {
            Some((payload, n)) => {
                pos += n;
                match payload {
                    Payload::Event(e) => uncommitted.push(e),
                    Payload::Commit => {
                        out.events.append(&mut uncommitted);
                        out.committed_len = pos as u64;
                    }
                }
            }
            None => {
                // Damage, or the torn end of the file: it is corruption only
                // if a valid record follows somewhere after it.
                match (pos + 1..buf.len()).find(|&p| record_at(buf, p).is_some()) {
                    Some(next) => {
                        out.corruptions.push(Corruption {
                            offset: pos as u64,
                            len: (next - pos) as u64,
                        });
                        pos = next;
                    }
                    None => break,
                }
            }
        }
    }
    out.torn_bytes = buf.len() as u64 - out.committed_len;
    out.torn_events = uncommitted.len();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(out: &mut Vec<u8>, seqs: std::ops::RangeInclusive<u64>) {
        for s in seqs.clone() {
            put_event(
                out,
                &EventFields {
                    seq: s,
                    received_at_unix_ms: 7,
                    scope: "local",
                    event_id: &format!("id-{s}"),
                    event_type: "a.b",
                    route: "",
                    encoded: &[s as u8; 40],
                },
            );
        }
        put_commit(out, *seqs.start(), *seqs.end());
    }

    fn seqs(s: &Scanned) -> Vec<u64> {
        s.events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn round_trip() {
        let mut buf = vec![];
        batch(&mut buf, 1..=3);
        batch(&mut buf, 4..=4);
        let s = scan(&buf);
        assert_eq!(seqs(&s), vec![1, 2, 3, 4]);
        assert_eq!(s.committed_len, buf.len() as u64);
        assert_eq!((s.torn_bytes, s.torn_events), (0, 0));
        assert!(s.corruptions.is_empty());
        assert_eq!(s.events[1].event_id, "id-2");
        assert_eq!(s.events[1].encoded, vec![2; 40]);
    }

    #[test]
    fn a_torn_tail_at_every_offset_drops_back_to_the_last_commit() {
        let mut buf = vec![];
        batch(&mut buf, 1..=2);
        let first_end = buf.len();
        batch(&mut buf, 3..=5);
        for cut in 0..buf.len() {
            let s = scan(&buf[..cut]);
            let want: Vec<u64> = if cut < first_end { vec![] } else { vec![1, 2] };
            assert_eq!(seqs(&s), want, "cut at {cut}");
            assert!(s.corruptions.is_empty(), "cut at {cut}");
            assert_eq!(s.committed_len + s.torn_bytes, cut as u64);
        }
        // Zeros where the tail should be (a file extended but never written).
        let mut zeroed = buf[..first_end].to_vec();
        zeroed.extend_from_slice(&[0; 100]);
        let s = scan(&zeroed);
        assert_eq!(seqs(&s), vec![1, 2]);
        assert_eq!(s.torn_bytes, 100);
    }

    #[test]
    fn a_flipped_bit_inside_is_corruption_and_the_rest_is_kept() {
        let mut buf = vec![];
        batch(&mut buf, 1..=3);
        let second = buf.len();
        batch(&mut buf, 4..=6);
        batch(&mut buf, 7..=7);
        // Flip a bit in the payload of seq 5 (second record of batch 2).
        let mut rec5 = second;
        for _ in 0..1 {
            let len = u32::from_le_bytes(buf[rec5..rec5 + 4].try_into().unwrap()) as usize;
            rec5 += HEADER + len;
        }
        buf[rec5 + HEADER + 20] ^= 0x10;
        let s = scan(&buf);
        assert_eq!(seqs(&s), vec![1, 2, 3, 4, 6, 7]);
        assert_eq!(s.corruptions.len(), 1);
        assert_eq!(s.corruptions[0].offset, rec5 as u64);
        assert_eq!(s.committed_len, buf.len() as u64);
    }

    #[test]
    fn garbage_records_are_refused() {
        assert!(record_at(&[0; 8], 0).is_none());
        let mut buf = vec![];
        put_commit(&mut buf, 1, 1);
        buf[HEADER] = 9; // unknown kind, checksum now wrong too
        assert!(record_at(&buf, 0).is_none());
    }
}
