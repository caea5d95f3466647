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
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    fileops::{DirError, FileOps, RealFs},
    record, Damage, Durability, Recovered, Snapshot, Store, StoreError, StoreInfo, SNAPSHOT_FORMAT,
};
use crate::eventlog::{ColdSegment, ColdSource, LoggedEvent, Place};

pub mod cold;
mod recover;
#[cfg(test)]
pub(crate) use recover::{expected_from, Ranges};

/// The format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_PREFIX: &str = "dws-event-store ";
/// A segment is closed once it is this large.
pub const SEGMENT_BYTES: u64 = 4 << 20;
const SUBSCRIPTIONS: &str = "subscriptions.json";

struct Segment {
    path: Arc<PathBuf>,
    first_seq: u64,
    /// The highest seq it holds or marks lost; 0 while empty.
    last_seq: u64,
    len: u64,
}

/// The disk store over the file operations `F` (the real file system in the
/// bus; a recording one in the power-cut tests).
pub struct DiskStore<F: FileOps = RealFs> {
    fs: F,
    dir: PathBuf,
    durability: Durability,
    segment_bytes: u64,
    segments: Vec<Segment>,
    /// The newest segment, open for appending.
    active: Option<F::File>,
    buf: Vec<u8>,
    damaged: Vec<Damage>,
    /// Reads the bodies of appended events back, so that the log need not
    /// keep them (`None` on a file system that cannot).
    cold: Option<Arc<dyn ColdSource>>,
    /// The segment appended to last, as cold events name it (one handle
    /// per segment, shared by its events).
    cold_segment: Option<Arc<ColdSegment>>,
    /// Seq ranges recovery found missing and reported: marked in the log
    /// (a commit record with no events) by the next save, after the
    /// snapshot that carries their gaps is durable.
    unmarked: Vec<(u64, u64)>,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

fn segment_name(first_seq: u64) -> String {
    format!("log-{first_seq:020}.seg")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("log-")?.strip_suffix(".seg")?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

impl DiskStore<RealFs> {
    pub fn new(dir: PathBuf, durability: Durability) -> DiskStore<RealFs> {
        DiskStore::with_fs(RealFs, dir, durability)
    }
}

impl<F: FileOps> DiskStore<F> {
    pub fn with_fs(fs: F, dir: PathBuf, durability: Durability) -> DiskStore<F> {
        DiskStore {
            cold: fs.cold_source(),
            cold_segment: None,
            fs,
            dir,
            durability,
            segment_bytes: SEGMENT_BYTES,
            segments: vec![],
            active: None,
            buf: Vec::with_capacity(64 * 1024),
            damaged: vec![],
            unmarked: vec![],
        }
    }

    /// Rolls to a new segment past `bytes` (tests use small segments).
    #[cfg(test)]
    pub fn with_segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes;
        self
    }

    fn fsync(&self) -> bool {
        self.durability == Durability::Fsync
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        if self.fsync() {
            self.fs
                .sync_dir(&self.dir)
                .map_err(|e| io("cannot fsync", &self.dir, e))?;
        }
        Ok(())
    }

    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        self.fs.read(path)
    }

    /// Writes `contents` to `name` atomically: temp file, fsync, rename,
    /// fsync of the directory.
    fn replace_file(&self, name: &str, contents: &[u8]) -> Result<(), StoreError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let _ = self.fs.remove(&tmp);
        let mut f = self
            .fs
            .create_new(&tmp)
            .map_err(|e| io("cannot create", &tmp, e))?;
        self.fs
            .write(&mut f, contents)
            .map_err(|e| io("cannot write", &tmp, e))?;
        if self.fsync() {
            self.fs
                .sync_data(&mut f)
                .map_err(|e| io("cannot fsync", &tmp, e))?;
        }
        self.fs
            .rename(&tmp, &path)
            .map_err(|e| io("cannot rename", &tmp, e))?;
        self.sync_dir()
    }

    fn prepare_dir(&self) -> Result<(), StoreError> {
        self.fs.prepare_dir(&self.dir).map_err(|e| match e {
            DirError::NotADirectory => StoreError::Refused(format!(
                "store {} is not a directory (a symlink or a file is refused)",
                self.dir.display()
            )),
            DirError::Io(what, path, e) => io(what, &path, e),
        })
    }

    fn check_format(&self) -> Result<(), StoreError> {
        let path = self.dir.join("FORMAT");
        match self.read(&path) {
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
        let names = self
            .fs
            .list(&self.dir)
            .map_err(|e| io("cannot list", &self.dir, e))?;
        let mut found: Vec<(u64, PathBuf)> = names
            .iter()
            .filter_map(|n| Some((parse_segment_name(n)?, self.dir.join(n))))
            .collect();
        found.sort();
        Ok(found)
    }

    fn load_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        let path = self.dir.join(SUBSCRIPTIONS);
        let bytes = match self.read(&path) {
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

    /// Opens a new segment starting at `first_seq` and makes it the active
    /// one. The old one was synced by every append; it is synced once more
    /// so that a tail recovery kept without syncing (a build before this
    /// rule) is durable before it stops being the tail.
    fn roll(&mut self, first_seq: u64) -> Result<(), StoreError> {
        if let (Some(old), Some(seg)) = (self.active.as_mut(), self.segments.last()) {
            if self.durability == Durability::Fsync {
                self.fs
                    .sync_data(old)
                    .map_err(|e| io("cannot fsync", &seg.path, e))?;
            }
        }
        let path = self.dir.join(segment_name(first_seq));
        let file = self
            .fs
            .create_new(&path)
            .map_err(|e| io("cannot create", &path, e))?;
        self.sync_dir()?;
        self.segments.push(Segment {
            path: Arc::new(path),
            first_seq,
            last_seq: 0,
            len: 0,
        });
        self.active = Some(file);
        Ok(())
    }

    /// Writes `self.buf` to the active segment (rolling first when there is
    /// none or it is full) and makes it durable. Returns the segment and the
    /// offset the buffer went to.
    fn write_buf(
        &mut self,
        first_seq: u64,
        last_seq: u64,
    ) -> Result<(Arc<PathBuf>, u64), StoreError> {
        let full = self
            .segments
            .last()
            .is_none_or(|s| s.len >= self.segment_bytes);
        if self.active.is_none() || full {
            self.roll(first_seq)?;
        }
        let fsync = self.fsync();
        let (Some(file), Some(seg)) = (self.active.as_mut(), self.segments.last_mut()) else {
            return Err(StoreError::Io("no active segment".into()));
        };
        self.fs
            .write(file, &self.buf)
            .map_err(|e| io("cannot write", &seg.path, e))?;
        if fsync {
            self.fs
                .sync_data(file)
                .map_err(|e| io("cannot fsync", &seg.path, e))?;
        }
        let at = seg.len;
        seg.len += self.buf.len() as u64;
        seg.last_seq = seg.last_seq.max(last_seq);
        let path = seg.path.clone();
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::with_capacity(64 * 1024);
        }
        Ok((path, at))
    }

    /// Marks the ranges recovery reported lost, so that no later recovery
    /// reports them again.
    fn write_loss_marks(&mut self) -> Result<(), StoreError> {
        if self.unmarked.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        for &(from, to) in &self.unmarked {
            record::put_commit(&mut self.buf, from, to);
        }
        let first = self.unmarked.iter().map(|r| r.0).min().unwrap_or(1);
        let last = self.unmarked.iter().map(|r| r.1).max().unwrap_or(1);
        self.write_buf(first, last)?;
        self.unmarked.clear();
        Ok(())
    }
}

fn placeholder(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        damaged: true,
        ..LoggedEvent::default()
    })
}

impl<F: FileOps> Store for DiskStore<F> {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        recover::recover(self)
    }

    fn take_read_failure(&mut self) -> Option<String> {
        self.cold.as_ref().and_then(|c| c.take_failure())
    }

    fn append(&mut self, events: &[Arc<LoggedEvent>]) -> Result<(), StoreError> {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Ok(());
        };
        // Loss marks go first (only if a batch comes before the first save).
        self.write_loss_marks()?;
        self.buf.clear();
        let mut places = Vec::with_capacity(events.len());
        for e in events {
            let encoded = e.encoded().map_err(|e| StoreError::Io(e.to_string()))?;
            let at = self.buf.len();
            record::put_event(
                &mut self.buf,
                &record::EventFields {
                    seq: e.seq,
                    received_at_unix_ms: e.received_at_unix_ms,
                    scope: &e.scope,
                    event_id: &e.event_id,
                    event_type: &e.event_type,
                    route: &e.route,
                    encoded: &encoded,
                },
            );
            places.push(at as u64);
        }
        record::put_commit(&mut self.buf, first.seq, last.seq);
        let (segment, base) = self.write_buf(first.seq, last.seq)?;
        // Durable: from now on the log may drop the bytes and read them back.
        if let Some(source) = &self.cold {
            let seg = match &self.cold_segment {
                Some(s) if Arc::ptr_eq(&s.path, &segment) => s.clone(),
                _ => {
                    let s = Arc::new(ColdSegment {
                        source: source.clone(),
                        path: segment.clone(),
                    });
                    self.cold_segment = Some(s.clone());
                    s
                }
            };
            for (e, &at) in events.iter().zip(&places) {
                e.encoded.set_cold(Place {
                    segment: seg.clone(),
                    at: base + at,
                });
            }
        }
        Ok(())
    }

    fn save(&mut self, snapshot: &Snapshot) -> Result<(), StoreError> {
        let json = serde_json::to_vec(snapshot)
            .map_err(|e| StoreError::Io(format!("cannot encode the subscriptions: {e}")))?;
        self.replace_file(SUBSCRIPTIONS, &json)?;
        // The gaps of what recovery found lost are in this snapshot: from
        // now on the loss is reported, and is marked so that it is not
        // reported twice.
        self.write_loss_marks()
    }

    fn release_below(&mut self, seq: u64) -> Result<(), StoreError> {
        // The newest segment stays: it is where appends go, and it carries
        // the seq counter when everything else was released. A segment
        // leaves the list only once its unlink succeeded (else the next
        // release retries it).
        let mut removed = false;
        let mut result = Ok(());
        while self.segments.len() > 1 && self.segments[0].last_seq < seq {
            let seg = &self.segments[0];
            match self.fs.remove(&seg.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    result = Err(io("cannot remove", &seg.path, e));
                    break;
                }
            }
            let seg = self.segments.remove(0);
            removed = true;
            self.damaged.retain(|d| d.to_seq >= seg.first_seq.max(seq));
        }
        if removed {
            self.sync_dir()?;
        }
        result
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
mod powercut;
#[cfg(test)]
mod simfs;
#[cfg(test)]
mod tests;
