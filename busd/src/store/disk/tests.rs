//! Unit tests of the disk store over the real file system.

use std::fs;

use super::*;
use crate::store::SNAPSHOT_FORMAT;
use bytes::Bytes;

fn ev(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "a.b".into(),
        scope: "local".into(),
        event_id: format!("id-{seq}").into(),
        encoded: Bytes::from(vec![seq as u8; 100]).into(),
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
            encoded: Bytes::from(vec![0; 1 << 20]).into(),
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

fn snap(head: u64, floor: u64) -> Snapshot {
    Snapshot {
        format: SNAPSHOT_FORMAT,
        clean: true,
        head_seq: head,
        log_floor: floor,
        saved_at_unix_ms: 0,
        subscriptions: vec![],
    }
}

fn store_with(dir: &Path, n: u64, seg: u64) -> DiskStore {
    let mut s = DiskStore::new(dir.to_owned(), Durability::Fsync).with_segment_bytes(seg);
    s.recover().unwrap();
    for seq in 1..=n {
        s.append(&[ev(seq)]).unwrap();
    }
    s.save(&snap(n, 1)).unwrap();
    s
}

fn reopen(dir: &Path) -> (DiskStore, Recovered) {
    let mut s = DiskStore::new(dir.to_owned(), Durability::Fsync);
    let r = s.recover().unwrap();
    (s, r)
}

/// The newest segment emptied: seqs up to the saved head are lost and
/// reported once; the next start (after a save marked them) is quiet.
#[test]
fn a_missing_tail_is_reported_lost_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    drop(store_with(&dir, 20, 1 << 20));
    let seg = dir.join(segment_name(1));
    let bytes = fs::read(&seg).unwrap();
    fs::write(&seg, &bytes[..bytes.len() / 2]).unwrap();
    let (mut s, r) = reopen(&dir);
    let last = r.events.last().map_or(0, |e| e.seq);
    assert!(last < 20);
    assert_eq!(r.lost, vec![(last + 1, 20)]);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("were acknowledged and are lost")),
        "{:?}",
        r.notes
    );
    assert!(!r.notes.iter().any(|n| n.contains("never acknowledged")));
    assert_eq!(s.info().damaged.len(), 1);
    s.save(&snap(20, 1)).unwrap();
    s.append(&[ev(21)]).unwrap();
    drop(s);
    let (s, r) = reopen(&dir);
    assert!(r.lost.is_empty(), "{:?}", r.notes);
    assert!(r.events.iter().all(|e| !e.damaged), "{:?}", r.notes);
    assert_eq!(r.events.last().map(|e| e.seq), Some(21));
    assert_eq!(s.info().damaged[0].to_seq, 20, "the mark is listed");
}

#[test]
fn a_missing_first_segment_or_store_is_reported_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    drop(store_with(&dir, 30, 600));
    let segs = DiskStore::new(dir.clone(), Durability::Fsync)
        .list_segments()
        .unwrap();
    assert!(segs.len() >= 3, "{segs:?}");
    fs::remove_file(&segs[0].1).unwrap();
    let (_, r) = reopen(&dir);
    let first = r.events.first().unwrap().seq;
    assert_eq!(r.lost, vec![(1, first - 1)]);
    // Every segment gone: everything up to the head.
    for (_, p) in &segs[1..] {
        fs::remove_file(p).unwrap();
    }
    let (mut s, r) = reopen(&dir);
    assert_eq!(r.lost, vec![(1, 30)]);
    s.save(&snap(30, 31)).unwrap();
    drop(s);
    let (_, r) = reopen(&dir);
    assert!(r.lost.is_empty(), "{:?}", r.notes);
}

#[test]
fn a_huge_seq_is_a_loss_not_a_placeholder_per_seq() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut s = store_with(&dir, 3, 1 << 20);
    s.append(&[ev(1_000_000_000_000)]).unwrap();
    drop(s);
    let (_, r) = reopen(&dir);
    assert_eq!(r.events.len(), 4);
    assert_eq!(r.lost, vec![(4, 999_999_999_999)]);
}

/// A segment whose unlink failed stays listed and is retried.
#[test]
fn a_failed_unlink_keeps_the_segment_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut s = store_with(&dir, 30, 600);
    let n = s.info().segments;
    let first = (*s.segments[0].path).clone();
    // A directory in its place: unlink fails with EISDIR.
    fs::remove_file(&first).unwrap();
    fs::create_dir(&first).unwrap();
    assert!(s.release_below(10).is_err());
    assert_eq!(s.info().segments, n, "still listed");
    fs::remove_dir(&first).unwrap();
    s.release_below(10).unwrap();
    assert!(s.info().segments < n);
}

#[test]
fn expected_from_counts_pinned_and_parked_events() {
    let mut sn = snap(50, 40);
    assert_eq!(expected_from(&sn), 40);
    let rec: crate::store::SubRecord = serde_json::from_value(serde_json::json!({
        "id": "s", "patterns": ["*"], "ttl_ms": 0, "created_at_unix_ms": 0, "cursor": 0,
        "pinned": [12], "max_sent_seq": 0, "gap_lost": 0, "detached_since_unix_ms": null,
        "counters": {"matched": 0, "delivered": 0, "acked": 0, "redelivered": 0, "lost": 0},
        "parked": [{"seq": 7, "deliveries": 1, "parked_at_unix_ms": 0}]
    }))
    .unwrap();
    sn.subscriptions.push(rec);
    assert_eq!(expected_from(&sn), 7);
    let r = Ranges::new(vec![(5, 9), (1, 2), (3, 3), (20, 30)]);
    assert_eq!(r.subtract(0, 40), vec![(0, 0), (4, 4), (10, 19), (31, 40)]);
    assert_eq!(r.subtract(4, 8), vec![(4, 4)]);
}
