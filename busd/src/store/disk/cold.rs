//! Reads event bodies back from the disk store's segments, for the events
//! that left the log's hot tail ([`crate::eventlog::body`]): `pread` through
//! one read window shared by every read of the store, so that a lagging
//! subscription catching up reads each stretch of a segment once, from the
//! page cache, and the records it reads are checked against their
//! checksum again.

use std::{
    fs::File,
    io,
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use bytes::Bytes;

use crate::{eventlog::ColdSource, store::record::HEADER};

/// Bytes read at once: the window a catch-up walks through.
pub const WINDOW: usize = 1 << 20;

/// No record is longer: an event fits in a frame, with its fields.
const MAX_RECORD: usize = 2 * proto::MAX_FRAME_LEN;

#[derive(Debug, Default)]
struct Window {
    /// The segment last opened, and its file.
    file: Option<(Arc<PathBuf>, File)>,
    /// What the window holds: `bytes` from offset `at` of `segment`.
    segment: Option<Arc<PathBuf>>,
    at: u64,
    bytes: Bytes,
}

/// The store's reader of cold bodies.
#[derive(Debug, Default)]
pub struct SegmentReader {
    window: Mutex<Window>,
    /// The first read that failed since the committer last asked.
    failure: Mutex<Option<String>>,
}

fn open(path: &PathBuf) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
}

/// Reads up to `buf.len()` bytes at `at`; fewer only at the end of the file.
fn read_full(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The last `len` bytes of the payload of the record `rec` (its header
/// and payload), if it checks out.
pub fn body_of(rec: &Bytes, payload_len: usize, len: usize) -> io::Result<Bytes> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    if rec.len() != HEADER + payload_len || len > payload_len {
        return Err(bad("record length mismatch"));
    }
    let stored_len = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize;
    let crc = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
    if stored_len != payload_len {
        return Err(bad("the record's length changed"));
    }
    if crc32fast::hash(&rec[HEADER..]) != crc {
        return Err(bad("the record failed its checksum"));
    }
    Ok(rec.slice(rec.len() - len..))
}

impl Window {
    /// Makes the window hold `need` bytes from `at` of `segment` (reading
    /// [`WINDOW`] bytes or more from there when it does not), and returns
    /// where `at` is in it. Fewer than `need` bytes: the segment ends first.
    fn cover(&mut self, segment: &Arc<PathBuf>, at: u64, need: usize) -> io::Result<usize> {
        let hit = self.segment.as_ref().is_some_and(|s| **s == **segment)
            && at >= self.at
            && at + need as u64 <= self.at + self.bytes.len() as u64;
        if !hit {
            if self.file.as_ref().is_none_or(|(p, _)| **p != **segment) {
                self.file = None;
                self.file = Some((segment.clone(), open(segment)?));
            }
            let Some((_, file)) = self.file.as_ref() else {
                return Err(io::Error::other("no segment open"));
            };
            let mut buf = vec![0; need.max(WINDOW)];
            let n = read_full(file, &mut buf, at)?;
            buf.truncate(n);
            self.segment = Some(segment.clone());
            self.at = at;
            self.bytes = Bytes::from(buf);
        }
        Ok((at - self.at) as usize)
    }

    /// The record at `at` (header and payload): its payload's last `len`
    /// bytes, checked.
    fn record(&mut self, segment: &Arc<PathBuf>, at: u64, len: usize) -> io::Result<Bytes> {
        let eof = || {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the segment ends before the record",
            )
        };
        let off = self.cover(segment, at, HEADER)?;
        let head = self.bytes.get(off..off + HEADER).ok_or_else(eof)?;
        let payload_len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if payload_len > MAX_RECORD {
            let what = "the record's length is implausible";
            return Err(io::Error::new(io::ErrorKind::InvalidData, what));
        }
        let need = HEADER + payload_len;
        let off = self.cover(segment, at, need)?;
        if self.bytes.len() < off + need {
            return Err(eof());
        }
        body_of(&self.bytes.slice(off..off + need), payload_len, len)
    }
}

impl ColdSource for SegmentReader {
    fn read(&self, segment: &Arc<PathBuf>, at: u64, len: usize) -> io::Result<Bytes> {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        w.record(segment, at, len)
    }

    fn failed(&self, why: &str) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert_with(|| why.to_owned());
    }

    fn take_failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, sync::Arc};

    use bytes::Bytes;

    use crate::{
        eventlog::LoggedEvent,
        store::{disk::DiskStore, Durability, Store},
    };

    fn body(seq: u64) -> Bytes {
        Bytes::from(vec![seq as u8; 20 + (seq as usize % 9) * 37])
    }

    fn ev(seq: u64) -> Arc<LoggedEvent> {
        Arc::new(LoggedEvent {
            seq,
            event_type: "a.b".into(),
            encoded: body(seq).into(),
            ..LoggedEvent::default()
        })
    }

    #[test]
    fn cooled_bodies_are_read_back_from_their_segment_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let mut s = DiskStore::new(dir.clone(), Durability::None).with_segment_bytes(2000);
        s.recover().unwrap();
        let events: Vec<_> = (1..=60).map(ev).collect();
        for batch in events.chunks(7) {
            s.append(batch).unwrap();
        }
        assert!(s.info().segments > 3, "{} segments", s.info().segments);
        for e in &events {
            e.cool();
            assert!(!e.encoded.is_resident(), "seq {}", e.seq);
        }
        // Forwards (through the window) and backwards (a miss each time).
        for e in events.iter().chain(events.iter().rev()) {
            assert_eq!(e.encoded().unwrap(), body(e.seq), "seq {}", e.seq);
        }

        // After a restart the recovered events are cold from the start.
        drop(s);
        let mut s = DiskStore::new(dir.clone(), Durability::None).with_segment_bytes(2000);
        let r = s.recover().unwrap();
        assert_eq!(r.events.len(), 60);
        // A record changed behind the store's back fails its checksum on
        // the read: a store failure, noted for the committer.
        let last = s.segments.last().unwrap().path.clone();
        let mut bytes = fs::read(&*last).unwrap();
        let at = bytes.len() - 26;
        bytes[at] ^= 0xff;
        fs::write(&*last, &bytes).unwrap();
        let newest = r.events.last().unwrap();
        let err = newest.encoded().unwrap_err();
        assert!(err.0.contains("checksum"), "{err}");
        assert!(s
            .take_read_failure()
            .is_some_and(|w| w.contains("checksum")));
        assert_eq!(s.take_read_failure(), None, "taken once");
        for e in &r.events[..50] {
            assert!(!e.encoded.is_resident());
            assert_eq!(e.encoded().unwrap(), body(e.seq), "seq {}", e.seq);
        }
        // Held past retention: back in memory before its segment goes.
        let held = r.events[0].clone();
        held.keep_resident();
        let first = (*s.segments[0].path).clone();
        s.release_below(40).unwrap();
        assert!(!first.exists());
        assert!(held.encoded.is_resident());
        assert_eq!(held.encoded().unwrap(), body(1));
    }
}
