//! The disk store: a segmented append-only event log and a subscriptions
//! file, under `events/<profile>/store/`:
//!
//! - `FORMAT`: `dws-event-store 1`. Any other version is refused, never
//!   overwritten.
//! - `log-<first seq, 20 digits>.seg`: checksummed records ([`super::record`]);
//!   one batch is written with one `write` and made durable with one
//!   `fdatasync`. A new segment is started past [`SEGMENT_BYTES`]; whole
//!   segments are deleted once every event in them is released.
//! - `subscriptions.json`: the named subscriptions ([`super::Snapshot`]),
//!   replaced atomically (write a temp file, fsync, rename, fsync the dir).
//!
//! Every file is opened with `O_NOFOLLOW`: a symlink planted in the store is
//! refused, never followed.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    record, Damage, Durability, Recovered, Snapshot, Store, StoreError, StoreInfo, SNAPSHOT_FORMAT,
};
use crate::eventlog::LoggedEvent;

/// The format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_PREFIX: &str = "dws-event-store ";
/// A segment is closed once it is this large.
pub const SEGMENT_BYTES: u64 = 4 << 20;
const SUBSCRIPTIONS: &str = "subscriptions.json";

struct Segment {
    path: PathBuf,
    first_seq: u64,
    /// 0 while empty.
    last_seq: u64,
    len: u64,
}

pub struct DiskStore {
    dir: PathBuf,
    durability: Durability,
    segments: Vec<Segment>,
    /// The newest segment, open for appending.
    active: Option<File>,
    buf: Vec<u8>,
    damaged: Vec<Damage>,
}

fn io(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

fn open_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC);
    o
}

fn segment_name(first_seq: u64) -> String {
    format!("log-{first_seq:020}.seg")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("log-")?.strip_suffix(".seg")?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

impl DiskStore {
    pub fn new(dir: PathBuf, durability: Durability) -> DiskStore {
        DiskStore {
            dir,
            durability,
            segments: vec![],
            active: None,
            buf: Vec::with_capacity(64 * 1024),
            damaged: vec![],
        }
    }

    fn fsync(&self) -> bool {
        self.durability == Durability::Fsync
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        if self.fsync() {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("cannot fsync", &self.dir, e))?;
        }
        Ok(())
    }

    /// Writes `contents` to `name` atomically: temp file, fsync, rename.
    fn replace_file(&self, name: &str, contents: &[u8]) -> Result<(), StoreError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let _ = fs::remove_file(&tmp);
        let mut f = open_options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io("cannot create", &tmp, e))?;
        f.write_all(contents)
            .map_err(|e| io("cannot write", &tmp, e))?;
        if self.fsync() {
            f.sync_all().map_err(|e| io("cannot fsync", &tmp, e))?;
        }
        fs::rename(&tmp, &path).map_err(|e| io("cannot rename", &tmp, e))?;
        self.sync_dir()
    }

    fn prepare_dir(&self) -> Result<(), StoreError> {
        let dir = &self.dir;
        match fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() || !m.is_dir() => {
                return Err(StoreError::Refused(format!(
                    "store {} is not a directory (a symlink or a file is refused)",
                    dir.display()
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(dir).map_err(|e| io("cannot create", dir, e))?;
            }
            Err(e) => return Err(io("cannot read", dir, e)),
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| io("cannot chmod 700", dir, e))
    }

    fn check_format(&self) -> Result<(), StoreError> {
        let path = self.dir.join("FORMAT");
        match read_nofollow(&path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let version = text
                    .trim()
                    .strip_prefix(FORMAT_PREFIX)
                    .and_then(|v| v.parse::<u32>().ok());
                match version {
                    Some(FORMAT_VERSION) => Ok(()),
                    Some(v) => Err(StoreError::Refused(format!(
                        "store {} has format version {v}, which this busd ({}) does not know \
                         (it reads version {FORMAT_VERSION}); refusing to touch it",
                        self.dir.display(),
                        proto::BUILD
                    ))),
                    None => Err(StoreError::Refused(format!(
                        "store {}: {} is not a dws event store format file; refusing to touch it",
                        self.dir.display(),
                        path.display()
                    ))),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.replace_file(
                "FORMAT",
                format!("{FORMAT_PREFIX}{FORMAT_VERSION}\n").as_bytes(),
            ),
            Err(e) => Err(io("cannot read", &path, e)),
        }
    }

    fn list_segments(&self) -> Result<Vec<(u64, PathBuf)>, StoreError> {
        let mut found = vec![];
        let entries = fs::read_dir(&self.dir).map_err(|e| io("cannot list", &self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io("cannot list", &self.dir, e))?;
            if let Some(first) = entry.file_name().to_str().and_then(parse_segment_name) {
                found.push((first, entry.path()));
            }
        }
        found.sort();
        Ok(found)
    }

    fn load_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        let path = self.dir.join(SUBSCRIPTIONS);
        let bytes = match read_nofollow(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("cannot read", &path, e)),
        };
        let snap: Snapshot = serde_json::from_slice(&bytes).map_err(|e| {
            StoreError::Refused(format!(
                "cannot read the subscriptions of {}: {e}; move the file away to start without them",
                path.display()
            ))
        })?;
        if snap.format != SNAPSHOT_FORMAT {
            return Err(StoreError::Refused(format!(
                "{} has format {}, which this busd does not know; refusing to touch it",
                path.display(),
                snap.format
            )));
        }
        Ok(Some(snap))
    }

    /// Opens a new segment starting at `first_seq` and makes it the active one.
    fn roll(&mut self, first_seq: u64) -> Result<(), StoreError> {
        let path = self.dir.join(segment_name(first_seq));
        let file = open_options()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io("cannot create", &path, e))?;
        self.sync_dir()?;
        self.segments.push(Segment {
            path,
            first_seq,
            last_seq: 0,
            len: 0,
        });
        self.active = Some(file);
        Ok(())
    }
}

/// Reads a store file: a regular file only, opened without blocking and
/// without following a symlink (`crate::regular`): a FIFO is refused.
fn read_nofollow(path: &Path) -> Result<Vec<u8>, crate::regular::OpenError> {
    crate::regular::read(path, crate::regular::Follow::No).map(|(bytes, _)| bytes)
}

fn placeholder(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        damaged: true,
        ..LoggedEvent::default()
    })
}

impl Store for DiskStore {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        self.prepare_dir()?;
        self.check_format()?;
        let snapshot = self.load_snapshot()?;
        let mut out = Recovered::default();
        let listed = self.list_segments()?;
        let count = listed.len();
        let mut prev: Option<u64> = None;
        for (i, (first_seq, path)) in listed.into_iter().enumerate() {
            let bytes = read_nofollow(&path).map_err(|e| io("cannot read", &path, e))?;
            let scanned = record::scan(&bytes);
            let file = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let last = i + 1 == count;
            let mut len = bytes.len() as u64;
            if scanned.torn_bytes > 0 {
                if last {
                    out.notes.push(format!(
                        "torn tail dropped: {} byte(s) after the last complete batch of {file} \
                         ({} uncommitted event(s), never acknowledged)",
                        scanned.torn_bytes, scanned.torn_events
                    ));
                    let f = open_options()
                        .write(true)
                        .open(&path)
                        .map_err(|e| io("cannot open", &path, e))?;
                    f.set_len(scanned.committed_len)
                        .and_then(|()| f.sync_all())
                        .map_err(|e| io("cannot truncate", &path, e))?;
                    len = scanned.committed_len;
                } else {
                    out.notes.push(format!(
                        "checksum failed: {} byte(s) at offset {} of {file} are damaged \
                         (a newer segment follows, so this is not a torn tail)",
                        scanned.torn_bytes, scanned.committed_len
                    ));
                }
            }
            for c in &scanned.corruptions {
                out.notes.push(format!(
                    "checksum failed: {} byte(s) at offset {} of {file} are damaged",
                    c.len, c.offset
                ));
            }
            let damage_offset = scanned
                .corruptions
                .first()
                .map(|c| c.offset)
                .unwrap_or(scanned.committed_len);
            // Seqs are consecutive across the whole log: a hole is damage.
            let mut expect = prev.map_or(first_seq, |p| p + 1);
            let mut last_seq = 0;
            for e in scanned.events {
                if prev.is_some_and(|p| e.seq <= p) {
                    out.notes.push(format!(
                        "seq {} in {file} repeats an earlier seq; skipped",
                        e.seq
                    ));
                    continue;
                }
                if e.seq > expect {
                    self.damaged.push(Damage {
                        from_seq: expect,
                        to_seq: e.seq - 1,
                        file: file.clone(),
                        offset: damage_offset,
                    });
                    out.events.extend((expect..e.seq).map(placeholder));
                }
                expect = e.seq + 1;
                prev = Some(e.seq);
                last_seq = e.seq;
                out.events.push(Arc::new(e.into_logged()));
            }
            self.segments.push(Segment {
                path,
                first_seq,
                last_seq,
                len,
            });
        }
        for d in &self.damaged {
            out.notes.push(format!(
                "events seq {}..={} failed their checksum in {} (offset {}): they will not be \
                 delivered",
                d.from_seq, d.to_seq, d.file, d.offset
            ));
        }
        if let Some(seg) = self.segments.last() {
            let file = open_options()
                .append(true)
                .open(&seg.path)
                .map_err(|e| io("cannot open", &seg.path, e))?;
            self.active = Some(file);
        }
        out.snapshot = snapshot;
        Ok(out)
    }

    fn append(&mut self, events: &[Arc<LoggedEvent>]) -> Result<(), StoreError> {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Ok(());
        };
        let full = self.segments.last().is_none_or(|s| s.len >= SEGMENT_BYTES);
        if self.active.is_none() || full {
            self.roll(first.seq)?;
        }
        self.buf.clear();
        for e in events {
            record::put_event(
                &mut self.buf,
                &record::EventFields {
                    seq: e.seq,
                    received_at_unix_ms: e.received_at_unix_ms,
                    scope: &e.scope,
                    event_id: &e.event_id,
                    event_type: &e.event_type,
                    route: &e.route,
                    encoded: &e.encoded,
                },
            );
        }
        record::put_commit(&mut self.buf, first.seq, last.seq);
        let fsync = self.fsync();
        let (Some(file), Some(seg)) = (self.active.as_mut(), self.segments.last_mut()) else {
            return Err(StoreError::Io("no active segment".into()));
        };
        file.write_all(&self.buf)
            .map_err(|e| io("cannot write", &seg.path, e))?;
        if fsync {
            file.sync_data()
                .map_err(|e| io("cannot fsync", &seg.path, e))?;
        }
        seg.len += self.buf.len() as u64;
        seg.last_seq = last.seq;
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::with_capacity(64 * 1024);
        }
        Ok(())
    }

    fn save(&mut self, snapshot: &Snapshot) -> Result<(), StoreError> {
        let json = serde_json::to_vec(snapshot)
            .map_err(|e| StoreError::Io(format!("cannot encode the subscriptions: {e}")))?;
        self.replace_file(SUBSCRIPTIONS, &json)
    }

    fn release_below(&mut self, seq: u64) -> Result<(), StoreError> {
        // The newest segment stays: it is where appends go, and it carries
        // the seq counter when everything else was released.
        while self.segments.len() > 1 && self.segments[0].last_seq < seq {
            let seg = self.segments.remove(0);
            fs::remove_file(&seg.path).map_err(|e| io("cannot remove", &seg.path, e))?;
            self.damaged.retain(|d| d.to_seq >= seg.first_seq.max(seq));
        }
        Ok(())
    }

    fn info(&self) -> StoreInfo {
        StoreInfo {
            kind: "disk",
            durability: self.durability.name(),
            path: Some(self.dir.clone()),
            segments: self.segments.len(),
            bytes: self.segments.iter().map(|s| s.len).sum(),
            damaged: self.damaged.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ev(seq: u64) -> Arc<LoggedEvent> {
        Arc::new(LoggedEvent {
            seq,
            event_type: "a.b".into(),
            scope: "local".into(),
            event_id: format!("id-{seq}"),
            encoded: Bytes::from(vec![seq as u8; 100]),
            ..LoggedEvent::default()
        })
    }

    fn seqs(r: &Recovered) -> Vec<(u64, bool)> {
        r.events.iter().map(|e| (e.seq, e.damaged)).collect()
    }

    #[test]
    fn appends_survive_a_reopen_and_the_format_is_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let mut s = DiskStore::new(dir.clone(), Durability::Fsync);
        assert!(s.recover().unwrap().events.is_empty());
        s.append(&[ev(1), ev(2)]).unwrap();
        s.append(&[ev(3)]).unwrap();
        let mut s = DiskStore::new(dir.clone(), Durability::Fsync);
        let r = s.recover().unwrap();
        assert_eq!(seqs(&r), vec![(1, false), (2, false), (3, false)]);
        assert_eq!(r.events[1].event_id, "id-2");
        s.append(&[ev(4)]).unwrap();
        assert_eq!(s.info().segments, 1);

        fs::write(dir.join("FORMAT"), "dws-event-store 99\n").unwrap();
        let err = DiskStore::new(dir.clone(), Durability::Fsync)
            .recover()
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Refused(m) if m.contains("format version 99")),
            "{err}"
        );
        assert_eq!(
            fs::read_to_string(dir.join("FORMAT")).unwrap(),
            "dws-event-store 99\n"
        );
    }

    #[test]
    fn segments_roll_and_are_released_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let mut s = DiskStore::new(dir.clone(), Durability::None);
        s.recover().unwrap();
        let big = |seq: u64| {
            Arc::new(LoggedEvent {
                seq,
                encoded: Bytes::from(vec![0; 1 << 20]),
                ..LoggedEvent::default()
            })
        };
        for seq in 1..=10 {
            s.append(&[big(seq)]).unwrap();
        }
        let n = s.info().segments;
        assert!(n >= 2, "{n} segments");
        s.release_below(6).unwrap();
        assert!(s.info().segments < n);
        let r = DiskStore::new(dir, Durability::None).recover().unwrap();
        assert_eq!(r.events.last().map(|e| e.seq), Some(10));
        assert!(r.events.first().is_some_and(|e| e.seq > 1 && e.seq <= 6));
    }

    #[test]
    fn a_flipped_bit_becomes_a_damaged_range() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let mut s = DiskStore::new(dir.clone(), Durability::None);
        s.recover().unwrap();
        for seq in 1..=5 {
            s.append(&[ev(seq)]).unwrap();
        }
        let seg = dir.join(segment_name(1));
        let mut bytes = fs::read(&seg).unwrap();
        let at = bytes.windows(4).position(|w| w == b"id-3").unwrap();
        bytes[at + 3] ^= 1;
        fs::write(&seg, &bytes).unwrap();
        let mut s = DiskStore::new(dir, Durability::None);
        let r = s.recover().unwrap();
        assert_eq!(
            seqs(&r),
            vec![(1, false), (2, false), (3, true), (4, false), (5, false)]
        );
        let d = &s.info().damaged;
        assert_eq!((d[0].from_seq, d[0].to_seq), (3, 3));
        assert!(
            r.notes.iter().any(|n| n.contains("checksum")),
            "{:?}",
            r.notes
        );
    }
}
