//! The durable store seen from outside: the files under
//! `<cfg>/events/<profile>/store/` (`FORMAT`, `log-<seq>.seg` segments of
//! `[u32 len][u32 crc32][payload]` records, `subscriptions.json`), the
//! `store` object of `status --format json`, bad `store`/`durability`
//! values, and what survives a restart: named subscriptions (cursor, filter,
//! unacked events, remaining TTL), the log, the dedup window and the seq
//! counter — after `dws event stop` and after `kill -9` of `busd`.
//!
//! Damage: a torn tail (the newest segment truncated at many offsets) is
//! cut back to exactly the complete batches; a flipped byte inside an event
//! is never delivered and is reported (`status.store.damaged`, `checksum` in
//! `bus.log`, `Error: … damaged` for a consumer that must read past it); an
//! unknown `FORMAT` version refuses to start and is left alone; a failed
//! write (a full tmpfs, root only) stops the bus and is reported.
//!
//! Then a regression (pending of a detached subscription bounded by
//! retention + one window after `kill -9` of its consumer) and two chaos
//! tests that `kill -9` the bus at random moments (seeded xorshift; the seed
//! is printed, `DWS_CHAOS_SEED` replays one) while events are published
//! locally or pushed by the fake DingTalk server: nothing replied or acked
//! upstream is lost, a seq is never reused for another event, and a
//! duplicate arrival is always marked `"redelivered":true`.
//!
//! Every wait is bounded; the only sleeps are the chaos pauses and the TTL
//! test, whose behaviour is about time.

use std::os::unix::fs::DirBuilderExt;
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use dws_tests::common::*;
use dws_tests::{
    fake_dingtalk::{dingtalk_env, Event, FakeDingTalk},
    wait_pid_gone, Output, Sig, TestEnv, EXIT_TIMEOUT,
};
use nix::{sys::signal::kill, unistd::Pid};
use serde_json::{json, Value};

/// Bytes of a segment record header: `u32 len`, `u32 crc32`.
const HEADER: usize = 8;

// ------------------------------------------------------------------ helpers

/// `<cfg>/events/default/store`.
fn store_dir(env: &TestEnv) -> PathBuf {
    env.work_dir().join("store")
}

/// `status.store`, asserting the bus runs and the object is there.
fn store_status(st: &Value) -> &Value {
    assert_eq!(st["running"], true, "{st:#}");
    let s = &st["store"];
    assert!(s.is_object(), "status has no `store` object:\n{st:#}");
    s
}

/// `dws event stop`, then waits until no `busd` of `env` is left.
fn stop_bus(env: &TestEnv) {
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after `dws event stop`");
}

/// SIGKILLs every `busd` of `env` and waits until they are gone; returns
/// how many there were.
fn kill_bus(env: &TestEnv) -> usize {
    let pids = env.busd_pids();
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Sig::SIGKILL);
    }
    for &p in &pids {
        assert!(wait_pid_gone(p, EXIT_TIMEOUT), "busd {p} survived SIGKILL");
    }
    pids.len()
}

/// `dws event consume <args…>` run to completion.
fn consume(env: &TestEnv, args: &[&str]) -> Output {
    let mut a = vec!["event", "consume"];
    a.extend_from_slice(args);
    env.dws(&a).run_with_timeout(EXIT_TIMEOUT)
}

fn seqs_of(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| u64_of(e, "seq")).collect()
}

/// Publishes `(id, data)` of `event_type` one after the other; returns the
/// seq of each.
fn publish_seq(env: &TestEnv, event_type: &str, items: &[(String, String)]) -> Vec<u64> {
    items
        .iter()
        .map(|(id, data)| {
            let p = env.publish(event_type, data, &["--id", id]);
            assert_eq!(p["duplicate"], false, "{p}");
            assert_eq!(p["event_id"], id.as_str(), "{p}");
            u64_of(&p, "seq")
        })
        .collect()
}

/// `(id, data)` pairs: ids `<prefix>-NNNN`, data `<marker>-NNNN` padded
/// with `.` to `len` bytes.
fn items(
    prefix: &str,
    marker: &str,
    range: std::ops::Range<usize>,
    len: usize,
) -> Vec<(String, String)> {
    range
        .map(|i| {
            let mut data = format!("{marker}-{i:04}");
            while data.len() < len {
                data.push('.');
            }
            (format!("{prefix}-{i:04}"), data)
        })
        .collect()
}

/// The segment files of the store, oldest first, asserting their names are
/// `log-<20 digits>.seg`.
fn segments(store: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(store)
        .unwrap_or_else(|e| panic!("read {}: {e}", store.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    for p in &segs {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        let digits = name
            .strip_prefix("log-")
            .and_then(|r| r.strip_suffix(".seg"))
            .unwrap_or("");
        assert!(
            digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()),
            "segment file {name:?} is not named log-<20 digits>.seg"
        );
    }
    segs
}

/// Every file directly in `dir` (name → bytes).
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let bytes = std::fs::read(e.path()).expect("read store file");
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

/// Makes `dir` hold exactly the files of `snap`.
fn restore(dir: &Path, snap: &BTreeMap<String, Vec<u8>>) {
    for e in std::fs::read_dir(dir).expect("read store dir").flatten() {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(e.path()).expect("remove store file");
        }
    }
    for (name, bytes) in snap {
        std::fs::write(dir.join(name), bytes).expect("write store file");
    }
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), as `crc32` means.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// The records of a segment as `[start, end)` byte ranges: it must parse as
/// `[u32 len][u32 crc32(payload)][payload]` records (little endian) to EOF,
/// every checksum right.
fn records(bytes: &[u8]) -> Result<Vec<(usize, usize)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes.len() - at < HEADER {
            return Err(format!(
                "{} trailing byte(s) at offset {at}: not a whole record header",
                bytes.len() - at
            ));
        }
        let word = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let len = word(at) as usize;
        let crc = word(at + 4);
        let end = at + HEADER + len;
        if end > bytes.len() {
            return Err(format!(
                "record at offset {at} claims {len} payload bytes, only {} left",
                bytes.len() - at - HEADER
            ));
        }
        let actual = crc32(&bytes[at + HEADER..end]);
        if actual != crc {
            return Err(format!(
                "record at offset {at} ({len} bytes): stored crc32 {crc:#010x}, computed {actual:#010x}"
            ));
        }
        out.push((at, end));
        at = end;
    }
    Ok(out)
}

/// Every offset of `needle` in `hay`.
fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

/// A seeded xorshift64: chaos that can be replayed (`DWS_CHAOS_SEED`).
struct XorShift(u64);

impl XorShift {
    fn seeded(what: &str) -> XorShift {
        let seed = std::env::var("DWS_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos() as u64
            })
            | 1;
        eprintln!("{what}: chaos seed {seed} (replay with DWS_CHAOS_SEED={seed})");
        XorShift(seed)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Sets the flag when dropped, so a panicking thread still stops the others.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `kills` times: waits 150–450 ms (random), then SIGKILLs every `busd` of
/// `env` (a moment without one does not count). Bounded at 120 s.
fn kill_busd_at_random(env: &TestEnv, rng: &mut XorShift, kills: usize) {
    let started = Instant::now();
    let mut done = 0;
    while done < kills {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "only {done} of {kills} kills in 120 s: no busd came up to kill\n{}",
            env.bus_log_tail()
        );
        thread::sleep(Duration::from_millis(rng.range(150, 450)));
        if kill_bus(env) > 0 {
            done += 1;
        }
    }
}

/// Runs `dws event consume --subscribe-id <id>` again and again (each run
/// ends when its bus is killed) until `stop`; then SIGTERMs the current run.
/// With `kill9`, each run is also `kill -9`ed itself at a random moment.
/// Returns every run's output, in order.
fn consumer_loop(
    env: &TestEnv,
    id: &str,
    stop: &AtomicBool,
    mut kill9: Option<XorShift>,
) -> Vec<Output> {
    let mut runs = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let mut c = env.dws(["event", "consume", "--subscribe-id", id]).spawn();
        let started = Instant::now();
        let kill_at = kill9
            .as_mut()
            .map(|rng| Duration::from_millis(rng.range(100, 900)));
        while c.is_running() {
            if stop.load(Ordering::SeqCst) {
                c.signal(Sig::SIGTERM);
                break;
            }
            if kill_at.is_some_and(|at| started.elapsed() >= at) {
                c.signal(Sig::SIGKILL);
                break;
            }
            thread::sleep(Duration::from_millis(30));
        }
        let out = c.wait_exit(EXIT_TIMEOUT);
        assert!(
            matches!(out.code, Some(0) | Some(1)) || out.signal == Some(9),
            "a consumer run ended with an unexpected status\n{out}"
        );
        runs.push(out);
        thread::sleep(Duration::from_millis(30));
    }
    runs
}

/// The chaos invariants over consumer runs (in the order they ran):
/// arrivals are events we tried to publish (`tried`), each id always
/// arrives with one seq (that of its publish reply, if `replied` has it), a
/// seq always carries one id, seqs increase within a run, and any repeat of
/// an id is marked `"redelivered":true`. Returns the ids that arrived.
fn check_arrivals(
    runs: &[Output],
    tried: &BTreeSet<String>,
    replied: &BTreeMap<String, u64>,
) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_seq: BTreeMap<u64, String> = BTreeMap::new();
    for (i, run) in runs.iter().enumerate() {
        let mut last = 0;
        for e in complete_events(run) {
            let id = str_of(&e, "event_id").to_owned();
            let seq = u64_of(&e, "seq");
            assert!(
                tried.contains(&id),
                "run {i}: {id} arrived but was never published: {e}\n{run}"
            );
            assert!(seq > last, "run {i}: seq {seq} after {last}: {e}\n{run}");
            last = seq;
            if let Some(&want) = replied.get(&id) {
                assert_eq!(
                    seq, want,
                    "run {i}: {id} arrived with seq {seq} but its publish replied seq {want}: {e}\n{run}"
                );
            }
            if let Some(other) = by_seq.insert(seq, id.clone()) {
                assert_eq!(
                    other, id,
                    "run {i}: seq {seq} was reused for another event ({other} then {id})\n{run}"
                );
            }
            match seen.get(&id) {
                Some(&first) => {
                    assert_eq!(
                        first, seq,
                        "run {i}: {id} arrived again with another seq ({first} then {seq}): \
                         a duplicate got past dedup\n{run}"
                    );
                    assert_eq!(
                        e["redelivered"], true,
                        "run {i}: {id} arrived again without \"redelivered\":true: {e}\n{run}"
                    );
                }
                None => {
                    seen.insert(id, seq);
                }
            }
        }
    }
    seen.into_keys().collect()
}

/// A tmpfs mounted over a directory; unmounted (lazily if busy) on drop.
struct Tmpfs {
    dir: PathBuf,
    mounted: bool,
}

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir: dir.to_owned(),
            mounted: true,
        })
    }

    fn unmount(&mut self) {
        if !self.mounted {
            return;
        }
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        self.mounted = false;
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        self.unmount();
    }
}

// ------------------------------------------------------------------ format

#[test]
fn crc32_helper_matches_the_standard_check_value() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
}

/// The default store: where it is, what is in it, and how status reports it.
#[test]
fn a_fresh_disk_store_has_the_documented_files_and_status() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["ly.*", "--id", "s1"], "s1");
    let evs = items("ly", "LAYOUT", 0..3, 40);
    let seqs = publish_seq(&env, "ly.k", &evs);
    assert_eq!(seqs, [1, 2, 3], "a fresh store starts at seq 1");

    let st = env.status();
    let s = store_status(&st);
    assert_eq!(s["kind"], "disk", "the default store\n{st:#}");
    assert_eq!(s["durability"], "fsync", "the default durability\n{st:#}");
    let store = store_dir(&env);
    let path = PathBuf::from(str_of(s, "path"));
    assert_eq!(
        path.canonicalize().ok(),
        store.canonicalize().ok(),
        "store.path is <cfg>/events/default/store\n{st:#}"
    );
    assert_eq!(
        u64_of(s, "durable_seq"),
        3,
        "publish replies after the fsync: every replied seq is durable\n{st:#}"
    );
    assert_eq!(s["damaged"], json!([]), "healthy\n{st:#}");
    assert_eq!(s["last_error"], Value::Null, "healthy\n{st:#}");

    assert_eq!(
        std::fs::read_to_string(store.join("FORMAT"))
            .ok()
            .as_deref(),
        Some("dws-event-store 1\n"),
        "FORMAT"
    );
    let subs_text = std::fs::read_to_string(store.join("subscriptions.json"))
        .expect("subscriptions.json exists once a named subscription does");
    let subs: Value = serde_json::from_str(&subs_text)
        .unwrap_or_else(|e| panic!("subscriptions.json is not JSON ({e}):\n{subs_text}"));
    assert!(
        subs.to_string().contains("\"s1\""),
        "subscriptions.json names s1:\n{subs:#}"
    );

    let segs = segments(&store);
    assert_eq!(
        segs.first()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned()),
        Some("log-00000000000000000001.seg".to_owned()),
        "the first segment is named after its first seq, 1: {segs:?}"
    );
    let mut found = BTreeMap::new();
    for seg in &segs {
        let bytes = std::fs::read(seg).expect("read segment");
        let recs = records(&bytes).unwrap_or_else(|e| panic!("{}: {e}", seg.display()));
        for (_, data) in &evs {
            for at in find_all(&bytes, data.as_bytes()) {
                let inside = recs
                    .iter()
                    .any(|&(s, e)| at >= s + HEADER && at + data.len() <= e);
                assert!(
                    inside,
                    "{data} at offset {at} of {} is not inside a record payload",
                    seg.display()
                );
                *found.entry(data.clone()).or_insert(0) += 1;
            }
        }
        if seg == segs.last().expect("a segment") {
            assert!(
                recs.len() >= 2 * evs.len(),
                "3 sequential publishes: at least an event and a commit record each, found {}",
                recs.len()
            );
        }
    }
    for (_, data) in &evs {
        assert_eq!(
            found.get(data),
            Some(&1),
            "{data} is stored exactly once in the segments"
        );
    }

    stop_bus(&env);
    assert_eq!(
        std::fs::read_to_string(store.join("FORMAT"))
            .ok()
            .as_deref(),
        Some("dws-event-store 1\n")
    );
    assert!(
        !segments(&store).is_empty(),
        "the log stays on disk after stop"
    );
}

/// A config.toml under `cfg` with `[profiles.default]` holding `body`.
fn write_config(env: &TestEnv, body: &str) {
    env.write_default_profile(&format!("source = \"local\"\n{body}"));
}

#[test]
fn a_bad_store_or_durability_value_fails_with_exit_2_naming_it() {
    /// (environment, config.toml lines, the bad value)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Case; 4] = [
        (&[("DWS_EVENT_BUS_STORE", "tape")], "", "tape"),
        (
            &[("DWS_EVENT_BUS_DURABILITY", "sometimes")],
            "",
            "sometimes",
        ),
        (&[], "store = \"floppy\"\n", "floppy"),
        (&[], "durability = \"eventually\"\n", "eventually"),
    ];
    for (vars, config, bad) in cases {
        let env = TestEnv::with_env(vars);
        if !config.is_empty() {
            write_config(&env, config);
        }
        let out = env
            .dws(["event", "publish", "bv.k", "x"])
            .run_with_timeout(EXIT_TIMEOUT);
        let err = out.assert_error(2);
        assert!(
            err.starts_with("Error: cannot start the bus: ") && err.contains(bad),
            "the error names the bad value {bad:?}\n{out}"
        );
        assert_eq!(out.stdout, "", "{out}");
        env.wait_no_busd(EXIT_TIMEOUT, "no busd left after a configuration error");
    }
}

#[test]
fn store_and_durability_come_from_the_profile_and_the_environment_overrides_it() {
    // The file alone.
    let env = TestEnv::new();
    write_config(&env, "store = \"disk\"\ndurability = \"none\"\n");
    env.publish("cf.k", "x", &[]);
    let st = env.status();
    let s = store_status(&st);
    assert_eq!(
        (s["kind"].clone(), s["durability"].clone()),
        (json!("disk"), json!("none")),
        "{st:#}"
    );
    drop(env);

    // The environment wins over the file.
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_DURABILITY", "fsync")]);
    write_config(&env, "store = \"disk\"\ndurability = \"none\"\n");
    env.publish("cf.k", "x", &[]);
    let st = env.status();
    assert_eq!(store_status(&st)["durability"], "fsync", "{st:#}");
    drop(env);

    // A memory store writes no log to disk.
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_STORE", "memory")]);
    write_config(&env, "store = \"disk\"\n");
    subscribe_ok(&env, &["cf.*", "--id", "m"], "m");
    env.publish("cf.k", "MEMORY-ONLY", &["--id", "m-1"]);
    let st = env.status();
    assert_eq!(store_status(&st)["kind"], "memory", "{st:#}");
    let store = store_dir(&env);
    if store.is_dir() {
        assert!(
            segments(&store).is_empty(),
            "a memory store writes no segment: {:?}",
            snapshot(&store).keys().collect::<Vec<_>>()
        );
    }
}

// ------------------------------------------------------------------ restart

/// After `dws event stop`: a named subscription comes back with its spec,
/// cursor, TTL and unacked events (delivered in order, with their seqs);
/// the log serves `--from earliest`; `--id` dedup answers with the original
/// seq; new seqs are higher; an owned subscription is not restored.
#[test]
fn after_stop_subscriptions_log_dedup_and_seqs_survive_but_owned_ones_do_not() {
    let env = TestEnv::new();
    subscribe_ok(
        &env,
        &[
            "rs.*",
            "--id",
            "s1",
            "--filter",
            r"^rs\.(a|b)$",
            "--ttl",
            "1h",
        ],
        "s1",
    );
    let mut owned = env.dws(["event", "consume", "rs.a"]).spawn();
    let owned_id = owned.wait_ready().subscribe_id;

    let mut seq = BTreeMap::new();
    for (t, id) in [("rs.a", "a-1"), ("rs.a", "a-2")] {
        seq.insert(id, u64_of(&env.publish(t, id, &["--id", id]), "seq"));
    }
    let out = consume(&env, &["--subscribe-id", "s1", "--max-events", "2"]);
    out.assert_clean_exit("limit", 2);
    assert_eq!(ids_of(&out.json_lines()), ["a-1", "a-2"], "{out}");
    for (t, id) in [
        ("rs.a", "a-3"),
        ("rs.c", "c-1"),
        ("rs.b", "b-1"),
        ("rs.a", "a-4"),
    ] {
        seq.insert(id, u64_of(&env.publish(t, id, &["--id", id]), "seq"));
    }
    owned.wait_stdout_lines(4, EXIT_TIMEOUT);
    let before = env.wait_status(EXIT_TIMEOUT, "s1 acked a-1 and a-2", |st| {
        listed(st, "s1")["cursor"] == seq["a-2"]
    });
    let s1 = listed(&before, "s1").clone();
    assert_eq!(s1["pending"], 3, "a-3 b-1 a-4\n{before:#}");
    assert_eq!(listed(&before, &owned_id)["owned"], true, "{before:#}");
    let head_before = u64_of(&before["log"], "head_seq");

    stop_bus(&env);
    owned
        .wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("bus_shutdown", 4);

    // Dedup across the restart (this publish starts the new bus).
    let dup = env.publish("rs.a", "again", &["--id", "a-2"]);
    assert_eq!(
        dup["duplicate"], true,
        "the dedup window survives a stop\n{dup}"
    );
    assert_eq!(dup["seq"], seq["a-2"], "with the original seq\n{dup}");

    let after = env.status();
    let r = listed(&after, "s1");
    for k in ["patterns", "filter", "ttl_ms", "cursor", "pending", "owned"] {
        assert_eq!(
            r[k], s1[k],
            "s1.{k} after the restart\nbefore: {s1:#}\nafter: {after:#}"
        );
    }
    assert_eq!(r["attached_pid"], Value::Null, "{after:#}");
    let expires = u64_of(r, "expires_at_unix_ms");
    let expires_before = u64_of(&s1, "expires_at_unix_ms");
    assert!(
        expires + 1000 >= expires_before && expires <= now_ms() + 3_600_000 + 1000,
        "s1 keeps its remaining TTL: expires_at {expires_before} before, {expires} after\n{after:#}"
    );
    assert!(
        sub(&after, &owned_id).is_none(),
        "an owned subscription is not restored\n{after:#}"
    );
    assert_eq!(
        after["subscriptions"].as_array().map(Vec::len),
        Some(1),
        "{after:#}"
    );

    // The filter still applies; new seqs are past every old one.
    for (t, id) in [("rs.c", "c-2"), ("rs.a", "a-5")] {
        seq.insert(id, u64_of(&env.publish(t, id, &["--id", id]), "seq"));
    }
    assert!(
        seq["c-2"] > head_before && seq["a-5"] > seq["c-2"],
        "seqs are never reused: head was {head_before} before the stop, got {seq:?}"
    );
    let out = consume(&env, &["--subscribe-id", "s1", "--max-events", "4"]);
    out.assert_clean_exit("limit", 4);
    let got = out.json_lines();
    assert_eq!(
        ids_of(&got),
        ["a-3", "b-1", "a-4", "a-5"],
        "s1's unacked events, in order\n{out}"
    );
    assert_eq!(
        seqs_of(&got),
        ["a-3", "b-1", "a-4", "a-5"].map(|i| seq[i]),
        "with their original seqs\n{out}"
    );

    // The log itself, from the start.
    let out = consume(&env, &["rs.*", "--from", "earliest", "--max-events", "8"]);
    out.assert_clean_exit("limit", 8);
    let got = out.json_lines();
    let want = ["a-1", "a-2", "a-3", "c-1", "b-1", "a-4", "c-2", "a-5"];
    assert_eq!(ids_of(&got), want, "the log survives the stop\n{out}");
    assert_eq!(seqs_of(&got), want.map(|i| seq[i]), "{out}");
    let st = env.wait_status(EXIT_TIMEOUT, "s1 fully acked", |st| {
        listed(st, "s1")["pending"] == 0
    });
    assert_eq!(listed(&st, "s1")["cursor"], st["log"]["head_seq"], "{st:#}");
}

/// The TTL of a detached subscription runs on while the bus is down: a 4 s
/// one is gone after 5 s of downtime, a 1 h one is still there. Time-based
/// on purpose.
#[test]
fn a_detached_ttl_keeps_running_while_the_bus_is_down() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["ttl.k", "--id", "short", "--ttl", "4s"], "short");
    subscribe_ok(&env, &["ttl.k", "--id", "long", "--ttl", "1h"], "long");
    let st = env.status();
    assert_eq!(listed(&st, "short")["ttl_ms"], 4000, "{st:#}");
    stop_bus(&env);
    thread::sleep(Duration::from_secs(5));
    env.publish("ttl.other", "x", &[]);
    // Up to 2 s for the reaper: a TTL restarted from scratch would keep it 4 s.
    let st = env.wait_status(Duration::from_secs(2), "short to be gone", |st| {
        sub(st, "short").is_none()
    });
    let long = listed(&st, "long");
    assert_eq!(long["ttl_ms"], 3_600_000, "{st:#}");
    let out = consume(&env, &["--subscribe-id", "short", "--max-events", "1"]);
    out.assert_error(1);
}

/// `kill -9` of the bus: every replied publish is there with its seq, the
/// dedup window and the seq counter survive, and an owned subscription is
/// not restored.
#[test]
fn after_kill_9_of_busd_every_replied_event_is_there_with_its_seq() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["k9.*", "--id", "s1"], "s1");
    let mut owned = env.dws(["event", "consume", "k9.*"]).spawn();
    let owned_id = owned.wait_ready().subscribe_id;
    let evs = items("k9", "K9", 0..12, 64);
    let seqs = publish_seq(&env, "k9.e", &evs);
    let out = consume(&env, &["--subscribe-id", "s1", "--max-events", "3"]);
    out.assert_clean_exit("limit", 3);
    owned.wait_stdout_lines(evs.len(), EXIT_TIMEOUT);

    assert_eq!(kill_bus(&env), 1, "one busd");
    let _ = owned.wait_exit(EXIT_TIMEOUT);

    let dup = env.publish("k9.e", "again", &["--id", &evs[5].0]);
    assert_eq!(
        dup["duplicate"], true,
        "the dedup window survives kill -9\n{dup}"
    );
    assert_eq!(dup["seq"], seqs[5], "{dup}");
    let new = u64_of(&env.publish("k9.e", "new", &["--id", "k9-new"]), "seq");
    assert!(
        new > seqs[seqs.len() - 1],
        "seq {new} after {seqs:?}: seqs are never reused"
    );
    let st = env.status();
    assert!(
        sub(&st, &owned_id).is_none(),
        "owned is not restored\n{st:#}"
    );
    assert_eq!(listed(&st, "s1")["attached_pid"], Value::Null, "{st:#}");

    let mut c = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn();
    c.wait_ready();
    c.wait_stdout_line("k9-new", EXIT_TIMEOUT, |l| l.contains("\"k9-new\""));
    c.signal(Sig::SIGTERM);
    let out = c.wait_exit(EXIT_TIMEOUT);
    let got = out.json_lines();
    out.assert_clean_exit("signal", got.len() as u64);
    let mut want_seq: BTreeMap<String, u64> = evs
        .iter()
        .map(|(i, _)| i.clone())
        .zip(seqs.iter().copied())
        .collect();
    want_seq.insert("k9-new".into(), new);
    let mut last = 0;
    for e in &got {
        let id = str_of(e, "event_id");
        assert_eq!(
            want_seq.get(id),
            Some(&u64_of(e, "seq")),
            "{e}: its seq as published\n{out}"
        );
        assert!(u64_of(e, "seq") > last, "in order\n{out}");
        last = u64_of(e, "seq");
        if evs[..3].iter().any(|(i, _)| i == id) {
            assert_eq!(
                e["redelivered"], true,
                "an acked event may come again only marked redelivered: {e}\n{out}"
            );
        }
    }
    let ids: BTreeSet<String> = ids_of(&got).into_iter().collect();
    for (id, _) in &evs[3..] {
        assert!(
            ids.contains(id),
            "{id} (unacked, replied) is lost after kill -9\n{out}"
        );
    }
}

// ------------------------------------------------------------------ damage

/// The newest segment truncated at many offsets (every kind of position:
/// inside a header, right after it, mid-payload, one byte short, at a record
/// boundary): the next start keeps exactly the batches (event + commit
/// record) that are complete, logs `torn tail` when it dropped something,
/// and serves everything before it with the original seqs.
#[test]
fn a_torn_tail_recovers_exactly_the_complete_batches() {
    const N: usize = 3;
    let env = TestEnv::new();
    let evs = items("tt", "TORN", 0..N, 24);
    let seqs = publish_seq(&env, "tt.k", &evs);
    stop_bus(&env);
    let store = store_dir(&env);
    let pristine = snapshot(&store);
    let segs = segments(&store);
    let newest = segs.last().expect("a segment").clone();
    let name = newest
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let bytes = pristine[&name].clone();
    let recs = records(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    // Batch i is complete once the record after event i's record is.
    let batch_end: Vec<usize> = evs
        .iter()
        .map(|(_, data)| {
            let at = find_all(&bytes, data.as_bytes());
            assert_eq!(at.len(), 1, "{data} is in the newest segment {name} once");
            let r = recs
                .iter()
                .position(|&(s, e)| at[0] >= s && at[0] < e)
                .expect("inside a record");
            recs.get(r + 1)
                .unwrap_or_else(|| {
                    panic!("{data}: no commit record after its event record in {name}")
                })
                .1
        })
        .collect();
    let mut offsets = BTreeSet::from([0, 1, bytes.len()]);
    for &(s, e) in &recs {
        offsets.extend([
            s + 3,
            s + HEADER,
            s + HEADER + (e - s - HEADER) / 2,
            e - 1,
            e,
        ]);
    }
    let mut last_n = 0;
    let mut summary = Vec::new();
    for &k in offsets.iter().filter(|&&k| k <= bytes.len()) {
        restore(&store, &pristine);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(store.join(&name))
            .expect("open segment");
        f.set_len(k as u64).expect("truncate");
        drop(f);
        let log_from = std::fs::metadata(env.bus_log_path())
            .map(|m| m.len() as usize)
            .unwrap_or(0);

        let end = env.publish("tt.end", "end", &["--id", &format!("end-{k}")]);
        let n_log = u64_of(&env.status()["log"], "events") as usize;
        let max = n_log.to_string();
        let out = consume(&env, &["tt.*", "--from", "earliest", "--max-events", &max]);
        out.assert_clean_exit("limit", n_log as u64);
        stop_bus(&env);

        let got = out.json_lines();
        let (last, before) = got.split_last().expect("the sentinel at least");
        assert_eq!(
            last["event_id"],
            format!("end-{k}"),
            "truncated at {k}: the sentinel comes last\n{out}"
        );
        let n = before.len();
        let want = batch_end.iter().filter(|&&e| e <= k).count();
        summary.push(format!("{k}:{n}"));
        assert_eq!(
            ids_of(before),
            evs[..n.min(N)].iter().map(|(i, _)| i.clone()).collect::<Vec<_>>(),
            "truncated at {k} of {}: the recovered events are a prefix of the published ones\n{out}",
            bytes.len()
        );
        assert_eq!(seqs_of(before), seqs[..n.min(N)], "with their seqs\n{out}");
        assert_eq!(
            n, want,
            "truncated at {k} (batches end at {batch_end:?}): exactly the complete batches are kept\n{out}"
        );
        assert!(
            n >= last_n,
            "the prefix shrank from {last_n} to {n} at offset {k}"
        );
        last_n = n;
        assert_eq!(last["seq"], end["seq"], "{out}");
        assert!(
            u64_of(last, "seq") > before.last().map_or(0, |e| u64_of(e, "seq")),
            "{out}"
        );
        if k != 0 && !batch_end.contains(&k) {
            let log = std::fs::read(env.bus_log_path()).unwrap_or_default();
            let new = String::from_utf8_lossy(&log[log_from.min(log.len())..]).into_owned();
            assert!(
                new.contains("torn tail"),
                "truncated at {k} inside a batch: bus.log says `torn tail`\n{new}"
            );
        }
    }
    assert_eq!(last_n, N, "the untruncated file gives all {N}");
    eprintln!("torn tail offset:recovered = {}", summary.join(" "));
}

/// A flipped byte inside one event: never delivered, reported in status and
/// bus.log; a consumer that must read past it gets the events before it,
/// then `Error: … damaged` (exit 1); a subscription reading elsewhere works.
#[test]
fn a_flipped_byte_is_never_delivered_and_reported_as_damaged() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["fb.k", "--id", "s1"], "s1");
    let evs = items("fb", "PAYLOAD", 0..20, 32);
    let seqs = publish_seq(&env, "fb.k", &evs);
    stop_bus(&env);
    let store = store_dir(&env);
    let marker = b"PAYLOAD-0010";
    let mut hits = Vec::new();
    for seg in segments(&store) {
        let bytes = std::fs::read(&seg).expect("read segment");
        for at in find_all(&bytes, marker) {
            hits.push((seg.clone(), at));
        }
    }
    assert_eq!(hits.len(), 1, "PAYLOAD-0010 is stored once: {hits:?}");
    let (seg, at) = hits.remove(0);
    let mut bytes = std::fs::read(&seg).expect("read segment");
    bytes[at] ^= 0x20; // 'P' -> 'p'
    std::fs::write(&seg, &bytes).expect("write segment");
    let seg_name = seg
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();

    subscribe_ok(&env, &["fb.k", "--id", "s2"], "s2"); // starts the bus
    let st = env.status();
    let damaged = store_status(&st)["damaged"]
        .as_array()
        .unwrap_or_else(|| panic!("store.damaged is an array\n{st:#}"))
        .clone();
    let bad = seqs[10];
    let d = damaged
        .iter()
        .find(|d| u64_of(d, "from_seq") <= bad && bad <= u64_of(d, "to_seq"))
        .unwrap_or_else(|| panic!("store.damaged names seq {bad}\n{st:#}"));
    assert!(
        u64_of(d, "from_seq") > seqs[9],
        "the events before it are intact\n{st:#}"
    );
    assert!(
        str_of(d, "file").contains(&seg_name),
        "names the segment {seg_name}\n{st:#}"
    );
    assert!(
        u64_of(d, "offset") <= at as u64,
        "the damaged record starts at or before byte {at}\n{st:#}"
    );
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    assert!(
        log.lines().any(|l| l.contains("checksum")),
        "bus.log has a `checksum` line\n{}",
        env.bus_log_tail()
    );

    // s1 has read nothing: it must read through the damaged event.
    let out = consume(&env, &["--subscribe-id", "s1", "--max-events", "19"]);
    let err = out.assert_error(1);
    assert!(err.contains("damaged"), "{out}");
    let got = complete_events(&out);
    assert_eq!(
        ids_of(&got),
        evs[..10].iter().map(|(i, _)| i.clone()).collect::<Vec<_>>(),
        "{out}"
    );
    assert_eq!(seqs_of(&got), seqs[..10], "{out}");
    assert!(
        !out.stdout.contains("AYLOAD-0010"),
        "the damaged event is never delivered\n{out}"
    );

    // s2 reads only what comes after: served normally.
    let after = env.publish("fb.k", "after", &["--id", "fb-after"]);
    let out = consume(&env, &["--subscribe-id", "s2", "--max-events", "1"]);
    out.assert_clean_exit("limit", 1);
    let got = out.json_lines();
    assert_eq!(ids_of(&got), ["fb-after"], "{out}");
    assert_eq!(got[0]["seq"], after["seq"], "{out}");
    assert!(u64_of(&after, "seq") > seqs[19], "{after}");
}

#[test]
fn an_unknown_format_version_refuses_to_start_and_is_left_untouched() {
    let env = TestEnv::new();
    subscribe_ok(&env, &["fv.k", "--id", "s1"], "s1");
    publish_seq(&env, "fv.k", &items("fv", "FV", 0..3, 16));
    stop_bus(&env);
    let store = store_dir(&env);
    std::fs::write(store.join("FORMAT"), "dws-event-store 99\n").expect("write FORMAT");
    let before = snapshot(&store);
    for args in [
        &["event", "publish", "fv.k", "x"][..],
        &["event", "consume", "fv.k", "--max-events", "1"][..],
        &["event", "subscribe", "fv.k", "--id", "s9"][..],
    ] {
        let out = env.dws(args).run_with_timeout(EXIT_TIMEOUT);
        let err = out.assert_error(1);
        assert!(
            err.starts_with("Error: cannot start the bus: ") && err.contains("format version 99"),
            "{out}"
        );
        assert_eq!(out.stdout, "", "{out}");
        env.wait_no_busd(EXIT_TIMEOUT, "no busd after a refused start");
        assert!(
            snapshot(&store) == before,
            "the store is left untouched\n{out}"
        );
    }
}

/// A write that fails (a full 256 KiB tmpfs under the store) is fatal: the
/// publish that hit it fails naming the cause, the attached consumer ends
/// with an error, busd exits; what reached the disk is recovered. Root only.
#[test]
fn a_failed_store_write_stops_the_bus_and_what_was_written_is_recovered() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let env = TestEnv::new();
    let store = store_dir(&env);
    // 0700 like busd makes them: under umask 002 a default mode would be
    // group-writable, which busd refuses.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&store)
        .expect("mkdir store");
    let mut mnt = match Tmpfs::mount(&store, "256k") {
        Ok(m) => m,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    subscribe_ok(&env, &["wf.k", "--id", "s1"], "s1");
    let mut c = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn();
    c.wait_ready();
    let evs = items("wf", "WF", 0..400, 4096);
    let mut ok = Vec::new();
    let mut failed = None;
    for (id, data) in &evs {
        let out = env
            .dws(["event", "publish", "wf.k", data, "--id", id])
            .run_with_timeout(EXIT_TIMEOUT);
        if out.code == Some(0) {
            ok.push((id.clone(), u64_of(&out.publish_json(), "seq")));
        } else {
            failed = Some(out);
            break;
        }
    }
    let failed = failed.expect("400 × 4 KiB cannot fit in a 256 KiB tmpfs: some publish fails");
    let err = failed.assert_error(1);
    assert!(
        err.contains("No space left on device") || err.contains("store"),
        "the error names the cause\n{failed}"
    );
    assert!(
        !ok.is_empty(),
        "some 4 KiB events fit in 256 KiB before the failure\n{failed}"
    );
    eprintln!(
        "failed write: {} event(s) fit; then {}",
        ok.len(),
        err.trim_end()
    );
    let cout = c.wait_exit(EXIT_TIMEOUT);
    cout.assert_error(1);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after a failed store write");
    let seen = ids_of(&complete_events(&cout));
    let okids: Vec<String> = ok.iter().map(|(i, _)| i.clone()).collect();
    assert!(
        seen.len() <= okids.len() + 1
            && seen[..seen.len().min(okids.len())] == okids[..seen.len().min(okids.len())],
        "the consumer got a prefix of the published events\n{cout}"
    );

    let files = snapshot(&store);
    mnt.unmount();
    restore(&store, &files);
    let out = consume(
        &env,
        &[
            "wf.k",
            "--from",
            "earliest",
            "--max-events",
            &ok.len().to_string(),
        ],
    );
    out.assert_clean_exit("limit", ok.len() as u64);
    let got = out.json_lines();
    assert_eq!(
        ids_of(&got),
        okids,
        "every replied event is recovered, in order\n{}",
        out.stderr
    );
    assert_eq!(
        seqs_of(&got),
        ok.iter().map(|(_, s)| *s).collect::<Vec<_>>()
    );
    let st = env.status();
    assert!(sub(&st, "s1").is_some(), "{st:#}");
    let n = u64_of(&st["log"], "events") as usize;
    assert!(
        n == ok.len() || n == ok.len() + 1,
        "only replied events (and maybe the failed one)\n{st:#}"
    );
    assert_eq!(store_status(&st)["last_error"], Value::Null, "{st:#}");
}

// ------------------------------------------------------------------ regression

/// A detached subscription whose consumer died (`kill -9`) with a window of
/// events in flight: its pending stays bounded by retention + one window
/// however much is published after (it used to grow to 1,110).
#[test]
fn pending_stays_bounded_after_kill_9_of_a_consumer_with_events_in_flight() {
    const RETENTION: u64 = 100;
    const WINDOW: u64 = 10;
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_BUS_WINDOW", "10"),
        ("DWS_EVENT_BUS_RETENTION_EVENTS", "100"),
    ]);
    subscribe_ok(&env, &["rg.*", "--id", "s1"], "s1");
    let mut c = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn_stdout_unread();
    c.wait_ready();
    // 16 KB events: the 64 KiB pipe holds 4, then the window fills; 120 of
    // them push the in-flight ones out of the 100-event log while attached.
    publish_parallel(&env, "rg.big", &items("big", "BIG", 0..120, 16_000), 2);
    let mut last = None;
    let mut stable = 0;
    env.wait_status(
        EXIT_TIMEOUT,
        "the consumer to stall with events in flight",
        |st| {
            let s = listed(st, "s1");
            let now = (u64_of(s, "acked"), u64_of(s, "delivered"));
            stable = if last == Some(now) { stable + 1 } else { 0 };
            last = Some(now);
            u64_of(s, "in_flight") > 0 && stable >= 3
        },
    );
    c.signal(Sig::SIGKILL);
    let _ = c.wait_exit_then_read_stdout(EXIT_TIMEOUT);
    env.wait_status(EXIT_TIMEOUT, "s1 detached", |st| {
        listed(st, "s1")["attached_pid"] == Value::Null
    });

    publish_parallel(&env, "rg.small", &items("sm", "SM", 0..1000, 8), 4);
    let st = env.status();
    let s = listed(&st, "s1");
    let (matched, acked, pending, lost) = (
        u64_of(s, "matched"),
        u64_of(s, "acked"),
        u64_of(s, "pending"),
        u64_of(s, "lost_to_retention"),
    );
    assert!(
        pending <= RETENTION + WINDOW,
        "pending {pending} > retention {RETENTION} + window {WINDOW}\n{st:#}"
    );
    assert_eq!(
        matched,
        acked + pending + lost,
        "matched = acked + pending + lost_to_retention\n{st:#}"
    );
    assert!(
        lost > 0,
        "1,120 events through a 100-event log: some are lost to retention\n{st:#}"
    );
    assert!(
        u64_of(&st["log"], "events") <= RETENTION + WINDOW,
        "the log stays bounded\n{st:#}"
    );
}

// ------------------------------------------------------------------ chaos

/// `kill -9` of busd at ≥ 20 random moments while a publisher publishes
/// sequentially and a consumer of s1 keeps re-attaching. Every replied
/// publish reaches s1 with the replied seq; nothing else arrives; a seq is
/// never reused; a repeat is marked redelivered.
#[test]
fn kill_9_chaos_loses_no_replied_event_and_never_reuses_a_seq() {
    // busd and the consumers are both killed at random moments.
    let env = TestEnv::new();
    subscribe_ok(&env, &["k.*", "--id", "s1"], "s1");
    let mut rng = XorShift::seeded("kill_9_chaos");
    let stop = AtomicBool::new(false);
    let tried = Mutex::new(BTreeSet::new());
    let replied = Mutex::new(BTreeMap::new());
    let failures = Mutex::new(0usize);
    let runs = thread::scope(|s| {
        let publisher = s.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("e-{n:05}");
                n += 1;
                tried.lock().expect("lock").insert(id.clone());
                let out = env
                    .dws([
                        "event",
                        "publish",
                        "k.e",
                        &format!("data-{id}"),
                        "--id",
                        &id,
                    ])
                    .run_with_timeout(EXIT_TIMEOUT);
                match out.code {
                    Some(0) => {
                        let p = out.publish_json();
                        assert_eq!(p["event_id"], id.as_str(), "{out}");
                        replied.lock().expect("lock").insert(id, u64_of(&p, "seq"));
                    }
                    Some(1) => *failures.lock().expect("lock") += 1,
                    _ => panic!("publish ended unexpectedly\n{out}"),
                }
            }
        });
        let consumer = s.spawn(|| {
            consumer_loop(
                &env,
                "s1",
                &stop,
                Some(XorShift::seeded("kill_9_chaos consumers")),
            )
        });
        {
            let _stop = SetOnDrop(&stop);
            kill_busd_at_random(&env, &mut rng, 20);
            // A few calm publishes at the end.
            let n = replied.lock().expect("lock").len();
            let calm = Instant::now();
            while replied.lock().expect("lock").len() < n + 5 && calm.elapsed() < EXIT_TIMEOUT {
                thread::sleep(Duration::from_millis(50));
            }
        }
        publisher.join().expect("publisher");
        consumer.join().expect("consumer loop")
    });
    let tried = tried.into_inner().expect("lock");
    let replied = replied.into_inner().expect("lock");
    eprintln!(
        "chaos: {} published, {} replied, {} failed, {} consumer runs",
        tried.len(),
        replied.len(),
        failures.into_inner().expect("lock"),
        runs.len()
    );
    assert!(
        replied.len() >= 10,
        "the publisher made progress through the chaos"
    );
    let mut seqs: BTreeMap<u64, &String> = BTreeMap::new();
    for (id, seq) in &replied {
        if let Some(other) = seqs.insert(*seq, id) {
            panic!("two publishes replied the same seq {seq}: {other} and {id}");
        }
    }

    let mut fin = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn();
    fin.wait_ready();
    let end = env.publish("k.e", "end", &["--id", "e-end"]);
    fin.wait_stdout_line("the sentinel", EXIT_TIMEOUT, |l| l.contains("\"e-end\""));
    fin.signal(Sig::SIGTERM);
    let fout = fin.wait_exit(EXIT_TIMEOUT);
    fout.assert_clean_exit("signal", fout.stdout_lines().len() as u64);

    let mut all_runs = runs;
    all_runs.push(fout);
    let mut tried_all = tried;
    tried_all.insert("e-end".into());
    let mut replied_all = replied.clone();
    replied_all.insert("e-end".into(), u64_of(&end, "seq"));
    let arrived = check_arrivals(&all_runs, &tried_all, &replied_all);
    for id in replied.keys() {
        assert!(
            arrived.contains(id),
            "{id} was replied (seq {}) but never reached s1",
            replied[id]
        );
    }
    let st = env.wait_status(EXIT_TIMEOUT, "s1 fully acked", |st| {
        listed(st, "s1")["pending"] == 0
    });
    assert_eq!(listed(&st, "s1")["cursor"], st["log"]["head_seq"], "{st:#}");
}

/// The same chaos with the events coming from the fake DingTalk server:
/// every event the fake saw acked reaches s1, once per seq, repeats marked
/// redelivered (dedup survives the kills).
#[test]
fn kill_9_chaos_under_dingtalk_loses_no_acked_event() {
    let fake = FakeDingTalk::start();
    let env = dingtalk_env(
        &fake.app_profile("max_attempts = 0\nkeepalive = \"30s\"\n"),
        &[] as &[(&str, &str)],
    );
    subscribe_ok(&env, &["*", "--id", "s1"], "s1");
    fake.wait_connected(Duration::from_secs(30));

    let mut rng = XorShift::seeded("kill_9_chaos_under_dingtalk");
    let stop = AtomicBool::new(false);
    let pushed = Mutex::new(Vec::new());
    let runs = thread::scope(|s| {
        let pusher = s.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("dt-{n:05}");
                n += 1;
                fake.push_event(&Event::new(
                    &id,
                    "user_add_org",
                    json!({ "userId": [&id] }).to_string(),
                ));
                pushed.lock().expect("lock").push(id);
                thread::sleep(Duration::from_millis(20));
            }
        });
        let consumer = s.spawn(|| consumer_loop(&env, "s1", &stop, None));
        {
            let _stop = SetOnDrop(&stop);
            kill_busd_at_random(&env, &mut rng, 20);
        }
        pusher.join().expect("pusher");
        consumer.join().expect("consumer loop")
    });
    let pushed: Vec<String> = pushed.into_inner().expect("lock");

    let mut fin = env
        .dws(["event", "consume", "--subscribe-id", "s1"])
        .spawn();
    fin.wait_ready();
    fake.wait_until("every pushed event acked", Duration::from_secs(30), |s| {
        s.unacked() == 0
    });
    let acked: Vec<String> = fake.with_state(|s| {
        pushed
            .iter()
            .filter(|id| s.event_acked(id))
            .cloned()
            .collect()
    });
    assert_eq!(acked.len(), pushed.len(), "{}", fake.summary());
    env.publish("user_add_org", "end", &["--id", "dt-end"]);
    fin.wait_stdout_line("the sentinel", Duration::from_secs(30), |l| {
        l.contains("\"dt-end\"")
    });
    fin.signal(Sig::SIGTERM);
    let fout = fin.wait_exit(EXIT_TIMEOUT);
    fout.assert_clean_exit("signal", fout.stdout_lines().len() as u64);
    eprintln!(
        "dingtalk chaos: {} pushed, {} consumer runs",
        pushed.len(),
        runs.len() + 1
    );

    let mut all_runs = runs;
    all_runs.push(fout);
    let mut tried: BTreeSet<String> = pushed.iter().cloned().collect();
    tried.insert("dt-end".into());
    let arrived = check_arrivals(&all_runs, &tried, &BTreeMap::new());
    for id in &acked {
        assert!(
            arrived.contains(id),
            "{id} was acked upstream but never reached s1\n{}",
            fake.summary()
        );
    }
}
