//! The dedup window's ids of released events (disk store): `dedup.ids` in
//! the store directory. The dedup window (`--dedup-capacity`, 65,536 seqs)
//! used to keep every log segment it covered, payloads included, so disk use
//! was bounded by the window rather than by retention (200 × 1 MiB events
//! with 16 MiB retention left 201 MiB on disk). Now retention alone decides
//! which segments go; before a segment the window still covers is released,
//! the committer appends the ids of its deduplicated events here (one line
//! each, made durable first), and a restart seeds the window from this file
//! and then from the segments. So the window keeps ids, not payloads.
//!
//! A line is `CRC32 [seq,"scope","id"]\n` (the checksum, 8 hex digits, is of
//! the JSON). A torn last line (a crash mid-append: its segments were not
//! released yet, so its ids are still in them) or a line that fails its
//! checksum (an id only there could be published again once) is skipped;
//! the start logs how many. The first write of a run and every write that
//! would pass twice the window rewrite the file atomically with only the
//! window's ids, so it stays within about twice the window's ids.

use std::{
    collections::VecDeque,
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use super::StoreError;
use crate::eventlog::LoggedEvent;

/// The file's name in the store directory.
pub const FILE: &str = "dedup.ids";

/// One id of the window: `(seq, scope, event id)`.
pub type Entry = (u64, String, String);

fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK);
    o
}

fn io_err(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

/// One line of the file.
fn encode_line(e: &Entry, out: &mut Vec<u8>) {
    let json = serde_json::to_string(&(e.0, &e.1, &e.2)).unwrap_or_default();
    let crc = crc32fast::hash(json.as_bytes());
    out.extend_from_slice(format!("{crc:08x} {json}\n").as_bytes());
}

/// Parses one line (without its `\n`); `None` when it is damaged.
fn decode_line(line: &[u8]) -> Option<Entry> {
    let text = std::str::from_utf8(line).ok()?;
    let (crc, json) = text.split_once(' ')?;
    let crc = u32::from_str_radix(crc, 16).ok()?;
    if crc != crc32fast::hash(json.as_bytes()) {
        return None;
    }
    serde_json::from_str::<Entry>(json).ok()
}

/// Parses the file's bytes: the entries in seq order, and how many lines
/// were skipped as damaged or torn. Pure; linear in the input.
pub fn parse(bytes: &[u8]) -> (Vec<Entry>, usize) {
    let mut entries = Vec::new();
    let mut skipped = 0;
    let mut rest = bytes;
    while !rest.is_empty() {
        let (line, next) = match rest.iter().position(|b| *b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            // A last line without its newline is torn.
            None => (rest, &[][..]),
        };
        match decode_line(line).filter(|_| next.len() < rest.len() - line.len()) {
            Some(e) => entries.push(e),
            None => skipped += 1,
        }
        rest = next;
    }
    entries.sort_by_key(|e| e.0);
    (entries, skipped)
}

/// Reads `dedup.ids` of the store at `dir` (none yet: empty). Refuses a
/// file that is not a regular file (a FIFO would block the start).
pub fn load(dir: &Path) -> Result<(Vec<Entry>, usize), StoreError> {
    let path = dir.join(FILE);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], 0)),
        Err(e) => return Err(io_err("cannot read", &path, e)),
        Ok(m) if !m.file_type().is_file() => {
            let kind = if m.file_type().is_fifo() {
                "a FIFO"
            } else {
                "not a regular file"
            };
            return Err(StoreError::Refused(format!(
                "{} is {kind}; refusing to open it",
                path.display()
            )));
        }
        Ok(_) => {}
    }
    let bytes = options()
        .read(true)
        .open(&path)
        .and_then(|mut f| {
            let mut v = vec![];
            std::io::Read::read_to_end(&mut f, &mut v).map(|_| v)
        })
        .map_err(|e| io_err("cannot read", &path, e))?;
    Ok(parse(&bytes))
}

/// The committer's side: the ids of the window that live only in segments
/// (`recent`), and the file the ids of released segments go to.
pub struct DedupIds {
    dir: PathBuf,
    fsync: bool,
    capacity: u64,
    /// Ids of deduplicated events at or above `persisted_below`, in seq
    /// order, within the window.
    recent: VecDeque<Entry>,
    /// Ids already in the file (within the window), in seq order.
    persisted: VecDeque<Entry>,
    /// Every id below this seq that the window still covers is in the file.
    persisted_below: u64,
    /// Lines in the file now.
    lines: usize,
    file: Option<File>,
}

impl DedupIds {
    /// The window as the start found it: `loaded` from the file, then the
    /// ids of the events the segments returned.
    pub fn new(
        dir: PathBuf,
        fsync: bool,
        capacity: u64,
        loaded: Vec<Entry>,
        events: &[Arc<LoggedEvent>],
    ) -> DedupIds {
        let persisted_below = loaded.last().map_or(0, |e| e.0 + 1);
        let lines = loaded.len();
        let mut d = DedupIds {
            dir,
            fsync,
            capacity: capacity.max(1),
            recent: VecDeque::new(),
            persisted: loaded.into(),
            persisted_below,
            lines,
            file: None,
        };
        d.appended(events);
        d
    }

    /// Events made durable: their ids join the window.
    pub fn appended(&mut self, events: &[Arc<LoggedEvent>]) {
        for e in events {
            if !e.scope.is_empty() && !e.damaged && e.seq >= self.persisted_below {
                self.recent
                    .push_back((e.seq, e.scope.to_string(), e.event_id.to_string()));
            }
        }
        if let Some(head) = events.last().map(|e| e.seq) {
            let floor = (head + 1).saturating_sub(self.capacity);
            while self.recent.front().is_some_and(|e| e.0 < floor) {
                self.recent.pop_front();
            }
            while self.persisted.front().is_some_and(|e| e.0 < floor) {
                self.persisted.pop_front();
            }
        }
    }

    /// Segments below `keep_from` are about to be released: the ids the
    /// window still covers there are made durable in the file first.
    pub fn before_release(&mut self, keep_from: u64) -> Result<(), StoreError> {
        if keep_from <= self.persisted_below {
            return Ok(());
        }
        let n = self.recent.iter().take_while(|e| e.0 < keep_from).count();
        let moved: Vec<Entry> = self.recent.drain(..n).collect();
        self.persisted_below = keep_from;
        if moved.is_empty() {
            return Ok(());
        }
        self.persisted.extend(moved.iter().cloned());
        // The first write of a run replaces the file: a torn last line a
        // crash left must not swallow the next one.
        if self.file.is_none() || self.lines + moved.len() > 2 * self.capacity as usize {
            return self.rewrite();
        }
        let mut buf = Vec::with_capacity(moved.len() * 64);
        for e in &moved {
            encode_line(e, &mut buf);
        }
        let path = self.dir.join(FILE);
        let fsync = self.fsync;
        let Some(file) = self.file.as_mut() else {
            return self.rewrite();
        };
        file.write_all(&buf)
            .map_err(|e| io_err("cannot write", &path, e))?;
        if fsync {
            file.sync_data()
                .map_err(|e| io_err("cannot fsync", &path, e))?;
        }
        self.lines += moved.len();
        Ok(())
    }

    /// Replaces the file with the window's persisted ids (temp file, fsync,
    /// rename, directory fsync) and keeps it open for the next appends.
    fn rewrite(&mut self) -> Result<(), StoreError> {
        let path = self.dir.join(FILE);
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let _ = fs::remove_file(&tmp);
        let mut buf = Vec::with_capacity(self.persisted.len() * 64);
        for e in &self.persisted {
            encode_line(e, &mut buf);
        }
        let mut f = options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io_err("cannot create", &tmp, e))?;
        f.write_all(&buf)
            .map_err(|e| io_err("cannot write", &tmp, e))?;
        if self.fsync {
            f.sync_all().map_err(|e| io_err("cannot fsync", &tmp, e))?;
        }
        fs::rename(&tmp, &path).map_err(|e| io_err("cannot rename", &tmp, e))?;
        self.lines = self.persisted.len();
        self.sync_dir()?;
        // The renamed file is the one appended to from now on.
        self.file = Some(f);
        Ok(())
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        if self.fsync {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err("cannot fsync", &self.dir, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, id: &str) -> Arc<LoggedEvent> {
        Arc::new(LoggedEvent {
            seq,
            scope: "local".into(),
            event_id: id.into(),
            ..LoggedEvent::default()
        })
    }

    #[test]
    fn lines_round_trip_and_damaged_or_torn_ones_are_skipped() {
        let mut buf = vec![];
        encode_line(&(3, "local".into(), "a\"b\n".into()), &mut buf);
        encode_line(&(1, "local".into(), "x".into()), &mut buf);
        assert_eq!(
            parse(&buf),
            (
                vec![
                    (1, "local".into(), "x".into()),
                    (3, "local".into(), "a\"b\n".into())
                ],
                0
            )
        );
        let mut flipped = buf.clone();
        flipped[12] ^= 1;
        assert_eq!(parse(&flipped).0.len(), 1);
        assert_eq!(parse(&flipped).1, 1);
        let torn = &buf[..buf.len() - 1];
        assert_eq!(parse(torn), (vec![(3, "local".into(), "a\"b\n".into())], 1));
        assert_eq!(parse(b"\xff\xfe garbage"), (vec![], 1));
    }

    #[test]
    fn released_ids_are_written_once_then_compacted_to_the_window_and_reloaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut d = DedupIds::new(dir.path().into(), false, 4, vec![], &[]);
        d.appended(&(1..=6).map(|s| ev(s, &format!("e{s}"))).collect::<Vec<_>>());
        // The window is seqs 3..=6; releasing below 5 writes 3 and 4.
        d.before_release(5).expect("write");
        let (loaded, _) = load(dir.path()).expect("load");
        assert_eq!(loaded.iter().map(|e| e.0).collect::<Vec<_>>(), vec![3, 4]);
        // Nothing new below 5: nothing written.
        d.before_release(5).expect("write");
        assert_eq!(load(dir.path()).expect("load").0.len(), 2);
        // Many more: the file is rewritten with the window only.
        d.appended(
            &(7..=20)
                .map(|s| ev(s, &format!("e{s}")))
                .collect::<Vec<_>>(),
        );
        d.before_release(21).expect("write");
        let (loaded, skipped) = load(dir.path()).expect("load");
        assert_eq!(skipped, 0);
        assert!(loaded.len() <= 8, "{loaded:?}");
        assert!(loaded.iter().any(|e| e.0 == 20), "{loaded:?}");
        // A restart continues from the file.
        let again = DedupIds::new(dir.path().into(), false, 4, loaded, &[ev(21, "e21")]);
        assert_eq!(again.persisted_below, 21);
        assert_eq!(again.recent.len(), 1);
    }

    #[test]
    fn a_torn_last_line_does_not_swallow_the_next_runs_first_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut buf = vec![];
        encode_line(&(1, "local".into(), "a".into()), &mut buf);
        buf.extend_from_slice(b"1234abcd [2,\"lo");
        fs::write(dir.path().join(FILE), &buf).expect("write");
        let (loaded, skipped) = load(dir.path()).expect("load");
        assert_eq!((loaded.len(), skipped), (1, 1));
        let mut d = DedupIds::new(dir.path().into(), false, 100, loaded, &[]);
        d.appended(&[ev(2, "b"), ev(3, "c")]);
        d.before_release(3).expect("write");
        d.appended(&[ev(4, "d")]);
        d.before_release(5).expect("write");
        let (loaded, skipped) = load(dir.path()).expect("load");
        assert_eq!(skipped, 0);
        assert_eq!(
            loaded.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
    }

    #[test]
    fn a_fifo_in_its_place_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        nix::unistd::mkfifo(&dir.path().join(FILE), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(matches!(load(dir.path()), Err(StoreError::Refused(_))));
    }
}
