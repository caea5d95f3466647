//! Recovery of the disk store: scans every segment, cuts a torn tail back,
//! and accounts for every seq the log should hold — from the lowest seq the
//! snapshot still needs (its `log_floor`, pinned and parked events) to its
//! `head_seq` — as an event, a damaged placeholder, or a loss reported once
//! (a gap line to every subscription that had not read it, then a loss mark
//! in the log). Nothing acknowledged goes missing without a word. What it
//! keeps is synced before it is served.

use std::sync::Arc;

use super::{io, placeholder, record, DiskStore, Segment};
use crate::store::{fileops::FileOps, Damage, Recovered, Snapshot, StoreError};

/// At most this many damaged seqs are held as placeholders (each stops its
/// subscriptions until retention drops it); a larger hole — a crafted seq,
/// a lost segment — is reported lost with a gap instead of allocated seq
/// by seq.
pub const MAX_PLACEHOLDERS: u64 = 1 << 16;

/// Sorted, disjoint, inclusive seq ranges.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    pub(crate) fn new(mut v: Vec<(u64, u64)>) -> Ranges {
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (a, b) in v {
            match out.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        Ranges(out)
    }

    /// The parts of `from..=to` no range covers.
    pub(crate) fn subtract(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut out = vec![];
        let mut at = from;
        for &(a, b) in &self.0 {
            if at > to {
                break;
            }
            if b < at {
                continue;
            }
            if a > at {
                out.push((at, (a - 1).min(to)));
            }
            at = at.max(b.saturating_add(1));
        }
        if at <= to {
            out.push((at, to));
        }
        out
    }
}

/// The lowest seq the snapshot says the log must still hold: its
/// `log_floor`, or an older pinned or parked event.
pub(crate) fn expected_from(snap: &Snapshot) -> u64 {
    let kept = snap.subscriptions.iter().flat_map(|s| {
        s.pinned
            .iter()
            .copied()
            .chain(s.parked.iter().map(|p| p.seq))
    });
    kept.chain([snap.log_floor]).min().unwrap_or(1).max(1)
}

/// The recovery walk's output, filled segment by segment.
struct Walk {
    out: Recovered,
    damaged: Vec<Damage>,
    unmarked: Vec<(u64, u64)>,
    placeholders_left: u64,
}

impl Walk {
    /// `from..=to` is missing between recovered records: placeholders
    /// while few, else a loss.
    fn hole(&mut self, marks: &Ranges, from: u64, to: u64, file: &str, offset: u64) {
        for (a, b) in marks.subtract(from, to) {
            let n = b - a + 1;
            if n <= self.placeholders_left {
                self.placeholders_left -= n;
                self.out.events.extend((a..=b).map(placeholder));
                self.damaged.push(Damage {
                    from_seq: a,
                    to_seq: b,
                    file: file.to_owned(),
                    offset,
                });
                self.out.notes.push(format!(
                    "events seq {a}..={b} failed their checksum in {file} (offset {offset}): \
                     they will not be delivered"
                ));
            } else {
                self.lost(a, b, file, offset, "are missing between the records");
            }
        }
    }

    fn lost(&mut self, from: u64, to: u64, file: &str, offset: u64, why: &str) {
        self.damaged.push(Damage {
            from_seq: from,
            to_seq: to,
            file: file.to_owned(),
            offset,
        });
        self.out.lost.push((from, to));
        self.unmarked.push((from, to));
        self.out.notes.push(format!(
            "events seq {from}..={to} {why} of the store ({file}): they were acknowledged and \
             are lost; every subscription that had not read them is told with a gap"
        ));
    }
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub(super) fn recover<F: FileOps>(s: &mut DiskStore<F>) -> Result<Recovered, StoreError> {
    s.prepare_dir()?;
    s.check_format()?;
    let snapshot = s.load_snapshot()?;
    let listed = s.list_segments()?;
    let count = listed.len();
    let mut scans = Vec::with_capacity(count);
    // The recovered events' names, one copy each.
    let mut names = crate::eventlog::Interner::default();
    for (i, (first_seq, path)) in listed.into_iter().enumerate() {
        let bytes = s.read(&path).map_err(|e| io("cannot read", &path, e))?;
        let mut scanned = record::scan(&bytes, i + 1 == count);
        let file_len = bytes.len() as u64;
        drop(bytes);
        // The bodies stay on disk when the store can read them back: the
        // whole log is never in memory at once, not even here.
        let path = Arc::new(path);
        // One handle per segment, shared by every event in it.
        let segment = s.cold.as_ref().map(|source| {
            Arc::new(crate::eventlog::ColdSegment {
                source: source.clone(),
                path: path.clone(),
            })
        });
        let events: Vec<crate::eventlog::LoggedEvent> = std::mem::take(&mut scanned.events)
            .into_iter()
            .map(|e| match &segment {
                Some(seg) => e.into_cold(seg.clone(), &mut names),
                None => e.into_logged_with(&mut names),
            })
            .collect();
        scans.push((first_seq, path, file_len, scanned, events));
    }
    let marks = Ranges::new(
        scans
            .iter()
            .flat_map(|x| x.3.lost_marks.iter().copied())
            .collect(),
    );
    let head = snapshot.as_ref().map_or(0, |s| s.head_seq);
    let mut w = Walk {
        out: Recovered::default(),
        damaged: vec![],
        unmarked: vec![],
        placeholders_left: MAX_PLACEHOLDERS,
    };
    let mut prev: Option<u64> = None;
    let mut lowest: Option<u64> = None;
    let mut tail_file = String::new();
    let mut tail_len = 0;
    for (first_seq, path, file_len, scanned, events) in scans {
        let file = file_name(&path);
        let mut len = file_len;
        if scanned.torn_bytes > 0 {
            w.out.notes.push(torn_note(&scanned, &file, head));
            let mut f =
                s.fs.open_append(&path)
                    .map_err(|e| io("cannot open", &path, e))?;
            s.fs.set_len(&mut f, scanned.committed_len)
                .and_then(|()| s.fs.sync_data(&mut f))
                .map_err(|e| io("cannot truncate", &path, e))?;
            len = scanned.committed_len;
        }
        for c in &scanned.corruptions {
            w.out.notes.push(format!(
                "checksum failed: {} byte(s) at offset {} of {file} are damaged{}",
                c.len,
                c.offset,
                if file_len == len && scanned.torn_bytes == 0 && c.offset + c.len == file_len {
                    " (a newer segment follows, so this is not a torn tail)"
                } else {
                    ""
                }
            ));
        }
        for &(a, b) in &scanned.lost_marks {
            w.damaged.push(Damage {
                from_seq: a,
                to_seq: b,
                file: file.clone(),
                offset: 0,
            });
            w.out.notes.push(format!(
                "events seq {a}..={b} were found lost by an earlier start (marked in {file})"
            ));
        }
        // Seqs are consecutive across the whole log, from the first
        // segment's name on: a hole anywhere (an emptied older segment
        // included) is damage.
        let start = *lowest.get_or_insert(first_seq);
        let mut expect = prev.map_or(start, |p| p + 1);
        let mut last_seq = scanned.lost_marks.iter().map(|m| m.1).max().unwrap_or(0);
        for e in events {
            if prev.is_some_and(|p| e.seq <= p) {
                w.out.notes.push(format!(
                    "seq {} in {file} repeats an earlier seq; skipped",
                    e.seq
                ));
                continue;
            }
            if e.seq > expect {
                let at = hole_offset_of(
                    &scanned.corruptions,
                    scanned.committed_len,
                    expect,
                    e.seq - 1,
                );
                w.hole(&marks, expect, e.seq - 1, &file, at);
            }
            expect = e.seq + 1;
            prev = Some(e.seq);
            last_seq = last_seq.max(e.seq);
            w.out.events.push(Arc::new(e));
        }
        tail_file.clone_from(&file);
        tail_len = len;
        s.segments.push(Segment {
            path,
            first_seq,
            last_seq,
            len,
        });
    }
    // What the snapshot says the log must hold, and it does not.
    if let Some(snap) = &snapshot {
        let from = expected_from(snap);
        let lo = lowest.unwrap_or(u64::MAX);
        let hi = prev.unwrap_or(0);
        let missing: Vec<(u64, u64)> = marks
            .subtract(from, head)
            .into_iter()
            .flat_map(|(a, b)| {
                // Minus what the walk accounted for: lo..=hi.
                let below = (a < lo).then(|| (a, b.min(lo.saturating_sub(1))));
                let above = (b > hi).then(|| (a.max(hi.saturating_add(1)), b));
                below.into_iter().chain(above).filter(|(a, b)| a <= b)
            })
            .collect();
        for (a, b) in Ranges::new(missing).0 {
            if b < lo {
                let first = s
                    .segments
                    .first()
                    .map(|g| file_name(&g.path))
                    .unwrap_or_default();
                w.lost(a, b, &first, 0, "are missing at the start");
            } else {
                w.lost(a, b, &tail_file, tail_len, "are missing at the end");
            }
        }
    }
    if let Some(seg) = s.segments.last() {
        let mut file =
            s.fs.open_append(&seg.path)
                .map_err(|e| io("cannot open", &seg.path, e))?;
        if s.fsync() {
            // A batch written but not synced by a bus killed before its
            // fdatasync is in the page cache only: make it durable before
            // anything of it is served.
            s.fs.sync_data(&mut file)
                .map_err(|e| io("cannot fsync", &seg.path, e))?;
        }
        s.active = Some(file);
    }
    // Renames and creates of a run killed before its directory fsync.
    s.sync_dir()?;
    w.out.lost = Ranges::new(std::mem::take(&mut w.out.lost)).0;
    s.damaged = w.damaged;
    s.unmarked = w.unmarked;
    let mut out = w.out;
    out.snapshot = snapshot;
    Ok(out)
}

/// Where a hole `from..=to` was found damaged: the corruption naming those
/// seqs, else the first one, else the end of the valid records.
fn hole_offset_of(c: &[record::Corruption], committed_len: u64, from: u64, to: u64) -> u64 {
    c.iter()
        .find(|c| c.first_seq <= to && c.last_seq >= from)
        .or(c.first())
        .map_or(committed_len, |c| c.offset)
}

/// The `torn tail dropped` line: what was cut, and whether it had been
/// acknowledged (at or below the saved head; the loss line that follows
/// says what is reported lost).
fn torn_note(scanned: &record::Scanned, file: &str, head: u64) -> String {
    let what = format!(
        "torn tail dropped: {} byte(s) after the last complete batch of {file}",
        scanned.torn_bytes
    );
    match scanned.torn_seqs {
        Some((a, b)) if a <= head => format!(
            "{what} ({} event(s), seqs {a}..={b}; the saved head is {head}, so seqs \
             {a}..={} had been acknowledged)",
            scanned.torn_events,
            b.min(head)
        ),
        Some((a, b)) => format!(
            "{what} ({} uncommitted event(s), seqs {a}..={b}, beyond the saved head {head}: \
             never acknowledged)",
            scanned.torn_events
        ),
        None => format!("{what} (no complete event record in it)"),
    }
}
