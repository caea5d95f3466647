//! Acknowledged events missing at either end of the disk store's log are
//! reported, never lost silently: 20 acked publishes to a named
//! subscription, a clean stop, then the newest segment emptied, truncated,
//! zero-filled, removed or overwritten with random bytes, or the first of
//! two segments deleted. After the restart every missing seq up to the
//! saved head is listed under `status.store.damaged`, the subscription
//! counts it lost (`lost_to_retention`) and its consumer gets a gap line
//! for it (one that had read everything gets none); delivered + lost covers every published seq; `bus.log` never
//! calls an acknowledged batch "never acknowledged"; and the loss is
//! reported once (a second restart is quiet). Hostile bytes: a record with
//! seq 2^64−1 or 10^12, and a segment announcing a 4 MiB record at every
//! 4th offset, neither crash nor stall the start.

use std::path::{Path, PathBuf};

use dws_tests::common::*;
use dws_tests::{Output, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

/// How the store is damaged while the bus is down.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Emptied,
    Truncated,
    ZeroFilled,
    Removed,
    RandomBytes,
}

fn store_dir(env: &TestEnv) -> PathBuf {
    env.work_dir().join("store")
}

fn segments(store: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(store)
        .unwrap_or_else(|e| panic!("read {}: {e}", store.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs
}

fn stop_bus(env: &TestEnv) {
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after `dws event stop`");
}

fn consume(env: &TestEnv, args: &[&str]) -> Output {
    let mut a = vec!["event", "consume"];
    a.extend_from_slice(args);
    env.dws(&a).run_with_timeout(EXIT_TIMEOUT)
}

/// Publishes `n` events of `len` bytes to `dm.k`, one at a time (each
/// acknowledged); returns their seqs.
fn publish(env: &TestEnv, n: usize, len: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let mut data = format!("DM-{i:04}");
            while data.len() < len {
                data.push('.');
            }
            let p = env.publish("dm.k", &data, &["--id", &format!("dm-{i}")]);
            u64_of(&p, "seq")
        })
        .collect()
}

fn xorshift_bytes(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn damage(seg: &Path, how: Damage) {
    let len = std::fs::metadata(seg).expect("segment").len() as usize;
    match how {
        Damage::Emptied => std::fs::write(seg, b"").expect("empty"),
        Damage::Truncated => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(seg)
                .expect("open");
            f.set_len((len / 2) as u64).expect("truncate");
        }
        Damage::ZeroFilled => std::fs::write(seg, vec![0u8; len]).expect("zero"),
        Damage::Removed => std::fs::remove_file(seg).expect("remove"),
        Damage::RandomBytes => {
            std::fs::write(seg, xorshift_bytes(len, 0x9E37_79B9_7F4A_7C15)).expect("random")
        }
    }
}

/// Lines of `bus.log` written since `from` bytes.
fn log_since(env: &TestEnv, from: usize) -> String {
    let log = std::fs::read(env.bus_log_path()).unwrap_or_default();
    String::from_utf8_lossy(&log[from.min(log.len())..]).into_owned()
}

fn log_len(env: &TestEnv) -> usize {
    std::fs::metadata(env.bus_log_path()).map_or(0, |m| m.len() as usize)
}

/// The gap lines of a consume run: the sum of their `lost` counts.
fn gap_lost(out: &Output) -> u64 {
    out.stderr_lines()
        .iter()
        .filter_map(|l| l.strip_prefix("[event] gap — lost "))
        .filter_map(|rest| rest.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Restarts the bus over the damaged store (a publish starts it: seq
/// `head + 1`), then checks that every seq of `published` is delivered to
/// s1 or reported lost: in `store.damaged`, in s1's `lost_to_retention`,
/// in a gap line.
fn check_reported(env: &TestEnv, published: &[u64], what: &str) {
    let head = *published.last().expect("published");
    let from = log_len(env);
    let after = env.publish("dm.k", "after", &["--id", "dm-after"]);
    assert_eq!(
        u64_of(&after, "seq"),
        head + 1,
        "{what}: seqs are not reused"
    );
    let st = env.status();
    let damaged: Vec<Value> = st["store"]["damaged"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let pending = u64_of(listed(&st, "s1"), "pending");
    let lost = u64_of(listed(&st, "s1"), "lost_to_retention");
    let log = log_since(env, from);
    let out = consume(
        env,
        &["--subscribe-id", "s1", "--max-events", &pending.to_string()],
    );
    out.assert_clean_exit("limit", pending);
    let got: Vec<u64> = out.json_lines().iter().map(|e| u64_of(e, "seq")).collect();
    assert_eq!(
        got.last(),
        Some(&(head + 1)),
        "{what}: the new event comes\n{out}"
    );
    let missing: Vec<u64> = published
        .iter()
        .copied()
        .filter(|s| !got.contains(s))
        .collect();
    assert!(
        !missing.is_empty(),
        "{what}: the damage lost something\n{out}"
    );
    for s in &missing {
        assert!(
            damaged
                .iter()
                .any(|d| u64_of(d, "from_seq") <= *s && *s <= u64_of(d, "to_seq")),
            "{what}: lost seq {s} is listed under store.damaged\n{st:#}\n{log}"
        );
    }
    assert_eq!(
        lost,
        missing.len() as u64,
        "{what}: s1 counts every missing seq lost\n{st:#}\n{log}"
    );
    assert_eq!(
        gap_lost(&out),
        missing.len() as u64,
        "{what}: the consumer gets a gap line for every missing seq\n{out}\n{log}"
    );
    assert!(
        !log.contains("never acknowledged"),
        "{what}: acknowledged events are not called never acknowledged\n{log}"
    );
    // Reported once: after another restart nothing new is lost.
    stop_bus(env);
    env.publish("dm.k", "again", &["--id", "dm-again"]);
    let st = env.status();
    assert_eq!(
        u64_of(listed(&st, "s1"), "lost_to_retention"),
        lost,
        "{what}: the loss is not counted twice\n{st:#}"
    );
    let out = consume(env, &["--subscribe-id", "s1", "--max-events", "1"]);
    out.assert_clean_exit("limit", 1);
    assert_eq!(gap_lost(&out), 0, "{what}: no second gap\n{out}");
    assert_eq!(out.json_lines()[0]["event_id"], "dm-again", "{what}\n{out}");
}

fn newest_segment_damaged(how: Damage) {
    let env = TestEnv::new();
    subscribe_ok(&env, &["dm.k", "--id", "s1"], "s1");
    subscribe_ok(&env, &["dm.k", "--id", "s2"], "s2");
    let seqs = publish(&env, 20, 64);
    // s2 read everything before the damage: it lost nothing.
    consume(&env, &["--subscribe-id", "s2", "--max-events", "20"]).assert_clean_exit("limit", 20);
    stop_bus(&env);
    let segs = segments(&store_dir(&env));
    damage(segs.last().expect("a segment"), how);
    check_reported(&env, &seqs, &format!("{how:?}"));
    let st = env.status();
    assert_eq!(
        u64_of(listed(&st, "s2"), "lost_to_retention"),
        0,
        "{how:?}: s2 had read it all\n{st:#}"
    );
    let out = consume(&env, &["--subscribe-id", "s2", "--max-events", "2"]);
    out.assert_clean_exit("limit", 2);
    assert_eq!(gap_lost(&out), 0, "{how:?}: no gap for s2\n{out}");
}

#[test]
fn a_emptied_newest_segment_is_reported() {
    newest_segment_damaged(Damage::Emptied);
}

#[test]
fn a_truncated_newest_segment_is_reported() {
    newest_segment_damaged(Damage::Truncated);
}

#[test]
fn a_zero_filled_newest_segment_is_reported() {
    newest_segment_damaged(Damage::ZeroFilled);
}

#[test]
fn a_removed_newest_segment_is_reported() {
    newest_segment_damaged(Damage::Removed);
}

#[test]
fn random_bytes_in_the_newest_segment_are_reported() {
    newest_segment_damaged(Damage::RandomBytes);
}

/// Two segments (4 MiB each), the first deleted: its seqs are lost, and
/// reported, not skipped by a cursor jumping forward.
#[test]
fn a_deleted_first_segment_is_reported() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["dm.k", "--id", "s1"], "s1");
    let seqs = publish(&env, 46, 100 * 1024);
    stop_bus(&env);
    let segs = segments(&store_dir(&env));
    assert!(segs.len() >= 2, "two segments: {segs:?}");
    damage(&segs[0], Damage::Removed);
    check_reported(&env, &seqs, "first segment removed");
}

// ------------------------------------------------- hostile segment bytes

/// CRC-32 (IEEE), as the store checksums its records.
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn record(payload: &[u8]) -> Vec<u8> {
    let mut r = (payload.len() as u32).to_le_bytes().to_vec();
    r.extend_from_slice(&crc32(payload).to_le_bytes());
    r.extend_from_slice(payload);
    r
}

/// A checksummed batch of one event with `seq` (type `x.y`, no payload).
fn crafted_batch(seq: u64) -> Vec<u8> {
    let mut ev = vec![1u8];
    ev.extend_from_slice(&seq.to_le_bytes());
    ev.extend_from_slice(&0i64.to_le_bytes());
    for s in ["", "crafted", "x.y", ""] {
        ev.extend_from_slice(&(s.len() as u32).to_le_bytes());
        ev.extend_from_slice(s.as_bytes());
    }
    ev.extend_from_slice(&0u32.to_le_bytes());
    let mut commit = vec![2u8];
    commit.extend_from_slice(&seq.to_le_bytes());
    commit.extend_from_slice(&seq.to_le_bytes());
    let mut out = record(&ev);
    out.extend(record(&commit));
    out
}

/// A checksummed record with seq 2^64−1 or 10^12 appended to the log: the
/// bus starts (no panic, no absurd allocation) and keeps publishing.
#[test]
fn a_record_with_an_absurd_seq_does_not_stop_the_bus() {
    for seq in [u64::MAX, 1_000_000_000_000] {
        let env = TestEnv::new();
        let seqs = publish(&env, 3, 16);
        stop_bus(&env);
        let segs = segments(&store_dir(&env));
        let newest = segs.last().expect("a segment");
        let mut bytes = std::fs::read(newest).expect("read");
        bytes.extend(crafted_batch(seq));
        std::fs::write(newest, bytes).expect("write");
        let p = env.publish("dm.k", "after", &["--id", "dm-after"]);
        let got = u64_of(&p, "seq");
        assert!(got > seqs[2], "seq {seq}: the next publish gets {got}\n{p}");
        let st = env.status();
        assert_eq!(st["running"], true, "seq {seq}\n{st:#}");
        assert!(
            !log_since(&env, 0).contains("panicked"),
            "seq {seq}: no panic\n{}",
            env.bus_log_tail()
        );
    }
}

/// A 6 MiB segment in which every 4th offset announces a 4 MiB record: the
/// bus still starts within `dws`'s start timeout (recovery is linear in the
/// file size), and what the segment hid is reported.
#[test]
fn a_crafted_segment_does_not_stall_the_start() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["dm.k", "--id", "s1"], "s1");
    publish(&env, 3, 16);
    stop_bus(&env);
    let segs = segments(&store_dir(&env));
    let newest = segs.last().expect("a segment");
    let n = 6 << 20;
    let mut bytes = vec![0u8; n];
    for p in (0..n - 8).step_by(4) {
        bytes[p..p + 4].copy_from_slice(&((4u32 << 20) | 1).to_le_bytes());
    }
    std::fs::write(newest, bytes).expect("write");
    let p = env.publish("dm.k", "after", &["--id", "dm-after"]);
    assert_eq!(u64_of(&p, "seq"), 4, "{p}");
    let st = env.status();
    assert_eq!(
        u64_of(listed(&st, "s1"), "lost_to_retention"),
        3,
        "the three events the segment held are reported lost\n{st:#}"
    );
}
