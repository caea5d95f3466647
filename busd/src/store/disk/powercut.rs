//! Property tests of the disk store against power cuts and hostile bytes,
//! over the recording file system ([`super::simfs`]).
//!
//! Power cut: any sequence of appends, saves and releases (small segments,
//! so they roll), the power going after any file operation (a write cut
//! short keeps a prefix), a crash that keeps the durable state plus, maybe,
//! a random subset of unsynced pages, or a `kill -9` that keeps the page
//! cache (a later power cut may still drop what nobody synced) — then, maybe, an operator's damage
//! (the newest segment truncated or removed, the oldest removed). Recovery
//! must yield every acknowledged event (content and seq) and the last
//! acknowledged save (cursors), serve only what it made durable (a second
//! crash right after recovery keeps it), report every missing acknowledged
//! seq up to the saved head as lost or damaged, and never call a torn tail
//! corruption.
//!
//! Fuzz: recovery from arbitrary segment bytes (random, and a valid segment
//! mutated) and arbitrary `subscriptions.json` bytes never panics, reports
//! every seq up to the saved head that it did not recover, and its checksum
//! work stays linear.
//!
//! `DWS_POWERCUT_CASES` sets the number of cases (default 200; the fuzz
//! runs the same number).

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use bytes::Bytes;
use proptest::prelude::*;

use super::{simfs::SimFs, DiskStore};
use crate::{
    eventlog::LoggedEvent,
    store::{Durability, Recovered, Snapshot, Store, SubRecord, SNAPSHOT_FORMAT},
};

const SEGMENT: u64 = 700;

fn cases() -> u32 {
    std::env::var("DWS_POWERCUT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn dir() -> PathBuf {
    PathBuf::from("/sim/store")
}

fn event(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "a.b".into(),
        scope: "local".into(),
        event_id: format!("id-{seq}").into(),
        encoded: Bytes::from(vec![(seq % 251) as u8; 40 + (seq % 7) as usize * 30]).into(),
        ..LoggedEvent::default()
    })
}

fn snapshot(head: u64, floor: u64, cursor: u64) -> Snapshot {
    Snapshot {
        format: SNAPSHOT_FORMAT,
        clean: false,
        head_seq: head,
        log_floor: floor,
        saved_at_unix_ms: head as i64,
        subscriptions: vec![SubRecord {
            ttl_ms: 0,
            ..SubRecord::for_test("s", "*", cursor)
        }],
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A batch of this many events.
    Append(u64),
    /// Retention moves the floor up by this many, the subscriptions are
    /// saved, then the store releases below the floor.
    SaveRelease(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..4).prop_map(Op::Append),
        1 => (0u64..6).prop_map(Op::SaveRelease),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Harm {
    TruncateNewest(u16),
    RemoveNewest,
    RemoveOldest,
}

fn harm() -> impl Strategy<Value = Option<Harm>> {
    prop_oneof![
        4 => Just(None),
        1 => any::<u16>().prop_map(|k| Some(Harm::TruncateNewest(k))),
        1 => Just(Some(Harm::RemoveNewest)),
        1 => Just(Some(Harm::RemoveOldest)),
    ]
}

/// What the test saw acknowledged before the power went.
#[derive(Default)]
struct Model {
    acked: BTreeMap<u64, Arc<LoggedEvent>>,
    written: BTreeMap<u64, Arc<LoggedEvent>>,
    saved: Option<Snapshot>,
    /// A save the power cut interrupted: it may or may not be there.
    saving: Option<Snapshot>,
}

fn run_ops(fs: &SimFs, ops: &[Op], crash_after: Option<u64>) -> Model {
    let mut m = Model::default();
    let mut s =
        DiskStore::with_fs(fs.clone(), dir(), Durability::Fsync).with_segment_bytes(SEGMENT);
    s.recover().expect("a fresh store recovers");
    if let Some(n) = crash_after {
        fs.fail_after(n);
    }
    let (mut next, mut floor) = (1u64, 1u64);
    for op in ops {
        match *op {
            Op::Append(n) => {
                let batch: Vec<_> = (next..next + n).map(event).collect();
                for e in &batch {
                    m.written.insert(e.seq, e.clone());
                }
                if s.append(&batch).is_err() {
                    return m;
                }
                for e in batch {
                    m.acked.insert(e.seq, e);
                }
                next += n;
            }
            Op::SaveRelease(up) => {
                let head = next - 1;
                floor = (floor + up).min(head + 1);
                let snap = snapshot(head, floor, floor - 1);
                if s.save(&snap).is_err() {
                    m.saving = Some(snap);
                    return m;
                }
                m.saved = Some(snap);
                if s.release_below(floor).is_err() && fs.is_dead() {
                    return m;
                }
            }
        }
        if fs.is_dead() {
            return m;
        }
    }
    m
}

fn segments(fs: &SimFs) -> Vec<PathBuf> {
    fs.files()
        .into_keys()
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect()
}

fn apply(fs: &SimFs, harm: Harm) {
    let segs = segments(fs);
    let files = fs.files();
    match (harm, segs.first(), segs.last()) {
        (Harm::TruncateNewest(k), _, Some(p)) => {
            let b = &files[p];
            let cut = if b.is_empty() {
                0
            } else {
                k as usize % b.len()
            };
            fs.put(p, Some(b[..cut].to_vec()));
        }
        (Harm::RemoveNewest, _, Some(p)) => fs.put(p, None),
        (Harm::RemoveOldest, Some(p), _) if segs.len() > 1 => fs.put(p, None),
        _ => {}
    }
}

fn recover(fs: &SimFs) -> Recovered {
    DiskStore::with_fs(fs.clone(), dir(), Durability::Fsync)
        .with_segment_bytes(SEGMENT)
        .recover()
        .expect("recovery succeeds")
}

/// The seqs `r` accounts for as missing: placeholders and lost ranges.
fn reported(r: &Recovered, seq: u64) -> bool {
    r.lost.iter().any(|&(a, b)| a <= seq && seq <= b)
        || r.events.iter().any(|e| e.seq == seq && e.damaged)
}

fn check(m: &Model, r: &Recovered, harmed: bool) -> Result<(), TestCaseError> {
    let notes = r.notes.join("\n");
    prop_assert!(
        !notes.contains("checksum failed"),
        "a crash is never corruption:\n{notes}"
    );
    // The last acknowledged save, or the one the power cut.
    let ok = r.snapshot == m.saved || (m.saving.is_some() && r.snapshot == m.saving);
    prop_assert!(ok, "snapshot {:?}\nsaved {:?}", r.snapshot, m.saved);
    let got: BTreeMap<u64, &Arc<LoggedEvent>> = r
        .events
        .iter()
        .filter(|e| !e.damaged)
        .map(|e| (e.seq, e))
        .collect();
    for (seq, e) in &got {
        let w = m.written.get(seq);
        prop_assert!(
            w.is_some_and(|w| w.event_id == e.event_id && w.encoded().ok() == e.encoded().ok()),
            "seq {seq} was never written like this"
        );
    }
    let floor = r.snapshot.as_ref().map_or(1, |s| s.log_floor);
    let head = r.snapshot.as_ref().map_or(0, |s| s.head_seq);
    for seq in m.acked.keys().copied().filter(|&s| s >= floor) {
        if harmed {
            if seq <= head {
                prop_assert!(
                    got.contains_key(&seq) || reported(r, seq),
                    "acknowledged seq {seq} (saved head {head}) is neither recovered nor \
                     reported\n{notes}"
                );
            }
        } else {
            prop_assert!(
                got.contains_key(&seq),
                "acknowledged seq {seq} lost\n{notes}"
            );
        }
    }
    if !harmed {
        prop_assert!(r.lost.is_empty(), "nothing is lost: {:?}\n{notes}", r.lost);
        prop_assert!(r.events.iter().all(|e| !e.damaged), "{notes}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn a_power_cut_loses_nothing_acknowledged_and_serves_only_durable_events(
        ops in prop::collection::vec(op(), 1..40),
        crash_after in prop::option::weighted(0.8, 0u64..200),
        keep_pages in any::<bool>(),
        killed in prop::bool::weighted(0.3),
        harm in harm(),
        seed in any::<u64>(),
    ) {
        let fs = SimFs::new(seed);
        let m = run_ops(&fs, &ops, crash_after);
        // kill -9 keeps the page cache; a power cut keeps the disk.
        let after = if killed { fs.kill() } else { fs.crash(keep_pages) };
        if let Some(h) = harm {
            apply(&after, h);
        }
        let r = recover(&after);
        check(&m, &r, harm.is_some())?;
        // What recovery served is durable: another power cut right now
        // (no unsynced page survives) recovers all of it again.
        let again = recover(&after.crash(false));
        for e in r.events.iter().filter(|e| !e.damaged) {
            prop_assert!(
                again.events.iter().any(|g| g.seq == e.seq && !g.damaged),
                "seq {} was served but was not durable", e.seq
            );
        }
    }

    #[test]
    fn recovery_from_arbitrary_segment_bytes_never_panics_and_reports_every_loss(
        n in 1u64..30,
        edits in prop::collection::vec((any::<u16>(), any::<u8>(), 0u8..4), 0..6),
        random in prop::option::weighted(0.2, prop::collection::vec(any::<u8>(), 0..4096)),
        snap_bytes in prop::option::weighted(0.1, prop::collection::vec(any::<u8>(), 0..200)),
    ) {
        // A valid store of n single-event batches, saved at head n.
        let fs = SimFs::new(n);
        let m = run_ops(&fs, &[Op::Append(1)].repeat(n as usize).into_iter()
            .chain([Op::SaveRelease(0)]).collect::<Vec<_>>(), None);
        prop_assert_eq!(m.acked.len() as u64, n);
        let segs = segments(&fs);
        let files = fs.files();
        let target = segs[(n as usize) % segs.len()].clone();
        let mut bytes = files[&target].clone();
        if let Some(r) = random {
            bytes = r;
        }
        for (at, v, kind) in edits {
            if bytes.is_empty() {
                break;
            }
            let i = at as usize % bytes.len();
            match kind {
                0 => bytes[i] ^= v | 1,
                1 => bytes.truncate(i),
                2 => bytes.splice(i..i, std::iter::repeat_n(v, 1 + v as usize % 64)).for_each(drop),
                _ => bytes[i..].iter_mut().take(64).for_each(|b| *b = 0),
            }
        }
        fs.put(&target, Some(bytes));
        if let Some(b) = snap_bytes {
            fs.put(&dir().join("subscriptions.json"), Some(b));
            // Refused or read: never a panic.
            let _ = DiskStore::with_fs(fs.clone(), dir(), Durability::Fsync).recover();
            return Ok(());
        }
        let r = recover(&fs);
        for seq in 1..=n {
            let ok = r.events.iter().any(|e| e.seq == seq)
                || r.lost.iter().any(|&(a, b)| a <= seq && seq <= b);
            prop_assert!(ok, "seq {} is neither recovered nor reported\n{}", seq, r.notes.join("\n"));
        }
        for e in r.events.iter().filter(|e| !e.damaged) {
            let w = &m.written[&e.seq];
            prop_assert!(w.encoded().ok() == e.encoded().ok(), "seq {} changed", e.seq);
        }
    }
}

/// `kill -9` between a batch's write and its `fdatasync`: the restarted
/// store serves that batch only once it made it durable.
#[test]
fn a_batch_left_in_the_page_cache_is_synced_before_it_is_served() {
    let fs = SimFs::new(7);
    let mut s =
        DiskStore::with_fs(fs.clone(), dir(), Durability::Fsync).with_segment_bytes(SEGMENT);
    s.recover().unwrap();
    s.append(&[event(1), event(2)]).unwrap();
    // The write goes through, the fdatasync never happens.
    fs.fail_after(1);
    assert!(s.append(&[event(3)]).is_err());
    drop(s);
    let after = fs.kill();
    let r = recover(&after);
    assert_eq!(r.events.last().map(|e| e.seq), Some(3), "{:?}", r.notes);
    let again = recover(&after.crash(false));
    assert_eq!(
        again.events.last().map(|e| e.seq),
        Some(3),
        "served, so durable"
    );
}
