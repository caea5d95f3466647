//! A work queue's promise when its workers are unequal: jobs go to the
//! least loaded worker, and a job a worker cannot finish goes to another at
//! once — when it is killed, stopped (SIGSTOP) past its ack wait, or alive
//! but never acking — never back to it while another worker is attached;
//! `stop --subscribe-id` stops every worker.

use std::time::{Duration, Instant};

use dws_tests::{
    common::{queue_worker, subscribe_ok},
    Child, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(30);

fn queue() -> TestEnv {
    let env = TestEnv::new();
    subscribe_ok(
        &env,
        &["job.*", "--id", "work", "--delivery", "shared"],
        "work",
    );
    env
}

/// A worker with explicit acks that acks nothing unless the test says so.
fn worker(env: &TestEnv, extra: &[&str]) -> Child {
    let mut c = queue_worker(env, "work", extra).spawn();
    c.wait_ready();
    c
}

fn publish_jobs(env: &TestEnv, n: usize) {
    for i in 0..n {
        env.publish("job.x", &format!("{{\"n\":{i}}}"), &[]);
    }
}

/// One job per line of `input`, through `publish --lines`.
fn publish_lines(env: &TestEnv, input: String) {
    env.dws(["event", "publish", "job.x", "--lines"])
        .stdin_bytes(input.into_bytes())
        .run_with_timeout(LONG)
        .assert_code(0);
}

/// The (seq, redelivered) of each line a worker printed so far.
fn lines(c: &Child) -> Vec<(u64, bool)> {
    c.stdout_so_far()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            (
                v["seq"].as_u64().unwrap_or(0),
                v["redelivered"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// Waits until the workers together printed `n` lines; returns each one's.
fn wait_total(workers: &[&Child], n: usize, within: Duration, what: &str) -> Vec<Vec<(u64, bool)>> {
    let deadline = Instant::now() + within;
    loop {
        let got: Vec<_> = workers.iter().map(|c| lines(c)).collect();
        if got.iter().map(Vec::len).sum::<usize>() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {n} lines wanted within {within:?}, got {:?}",
            got.iter().map(Vec::len).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn jobs_published_one_by_one_go_to_the_least_loaded_worker() {
    let env = queue();
    let ws: Vec<Child> = (0..3).map(|_| worker(&env, &[])).collect();
    publish_jobs(&env, 12);
    let got = wait_total(&ws.iter().collect::<Vec<_>>(), 12, LONG, "12 jobs");
    let counts: Vec<usize> = got.iter().map(Vec::len).collect();
    assert!(
        counts.iter().all(|&n| (3..=5).contains(&n)),
        "4 each (±1): {counts:?}"
    );
}

/// One worker holds 8 jobs while three others attach and idle; `hold`
/// then makes it unable to finish them.
fn held_then(hold: impl FnOnce(&mut Child), wait: &str, within: Duration) {
    let env = queue();
    let mut slow = worker(&env, &["--ack-wait", wait]);
    publish_jobs(&env, 8);
    slow.wait_stdout_lines(8, LONG);
    let others: Vec<Child> = (0..3).map(|_| worker(&env, &[])).collect();
    hold(&mut slow);
    let started = Instant::now();
    let got = wait_total(
        &others.iter().collect::<Vec<_>>(),
        8,
        within,
        "the held jobs on the others",
    );
    let mut seqs: Vec<u64> = got.iter().flatten().map(|(s, _)| *s).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=8).collect::<Vec<_>>(), "{got:?}");
    assert!(
        got.iter().flatten().all(|(_, r)| *r),
        "marked redelivered: {got:?}"
    );
    assert!(
        got.iter().filter(|g| !g.is_empty()).count() >= 2,
        "spread over the idle workers: {got:?}"
    );
    eprintln!("taken over in {:?}", started.elapsed());
}

#[test]
fn a_killed_workers_jobs_go_to_the_idle_ones_at_once() {
    held_then(|c| c.signal(Sig::SIGKILL), "1h", Duration::from_secs(5));
}

#[test]
fn a_stopped_workers_jobs_go_to_the_others_after_its_ack_wait() {
    held_then(|c| c.signal(Sig::SIGSTOP), "2s", Duration::from_secs(2 + 3));
}

#[test]
fn a_live_worker_that_never_acks_gets_none_of_its_jobs_back_while_others_can_take_them() {
    let env = queue();
    let mut hung = worker(&env, &["--ack-wait", "1s"]);
    publish_jobs(&env, 4);
    hung.wait_stdout_lines(4, LONG);
    let mut ok = worker(&env, &[]);
    // The healthy worker acks what it gets: all four, once each.
    let mut acked = 0;
    let deadline = Instant::now() + Duration::from_secs(1 + 3);
    while acked < 4 {
        let got = lines(&ok);
        for (seq, redelivered) in &got[acked..] {
            assert!(redelivered, "{got:?}");
            ok.write_stdin(format!("ack {seq}\n").as_bytes());
        }
        acked = got.len();
        assert!(Instant::now() < deadline, "only {got:?} taken over");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Three more ack waits: nothing comes back to the hung worker.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lines(&hung).len(), 4, "{:?}", hung.stdout_so_far());
    assert_eq!(lines(&ok).len(), 4, "{:?}", ok.stdout_so_far());
}

#[test]
fn stop_by_subscription_stops_every_worker() {
    let env = queue();
    let ws: Vec<Child> = (0..4).map(|_| worker(&env, &[])).collect();
    let dry = env
        .dws(["event", "stop", "--subscribe-id", "work", "--dry-run"])
        .run_with_timeout(EXIT_TIMEOUT);
    dry.assert_code(0);
    for w in &ws {
        assert!(
            dry.stdout.contains(&w.pid().to_string()),
            "the dry run names pid {}\n{dry}",
            w.pid()
        );
    }
    let out = env
        .dws(["event", "stop", "--subscribe-id", "work"])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    // Each worker ends (a wait that times out fails with what it printed).
    for w in ws {
        w.wait_exit(LONG);
    }
}

#[test]
fn a_stopped_worker_whose_buffer_is_full_still_gives_its_jobs_up_after_its_ack_wait() {
    let env = queue();
    // Its lines as bytes (the line ring would hold them outside the
    // buffer).
    let mut slow = queue_worker(&env, "work", &["--ack-wait", "2s"])
        .env("DWS_LINE_RING", "off")
        .spawn();
    slow.wait_ready();
    slow.signal(Sig::SIGSTOP);
    // 10 jobs of 60 KiB: more than the stopped worker's socket and the
    // bus's buffer for it hold, so the bus stops writing to it.
    let pad = "j".repeat(60 * 1024);
    let input: String = (0..10)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"{pad}\"}}\n"))
        .collect();
    publish_lines(&env, input);
    let others: Vec<Child> = (0..2).map(|_| worker(&env, &[])).collect();
    let got = wait_total(
        &others.iter().collect::<Vec<_>>(),
        10,
        Duration::from_secs(2 + 5),
        "every job on the live workers",
    );
    let mut seqs: Vec<u64> = got.iter().flatten().map(|(s, _)| *s).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>(), "{got:?}");
    slow.signal(Sig::SIGCONT);
}

#[test]
fn a_work_queues_bytes_in_flight_stay_within_retentions_byte_bound() {
    // 1 MiB of retention; four workers with windows of 1,000 that never
    // ack; 40 jobs of 64 KiB (2.5 MiB).
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_BYTES", "1048576")]);
    subscribe_ok(
        &env,
        &["job.*", "--id", "work", "--delivery", "shared"],
        "work",
    );
    let ws: Vec<Child> = (0..4)
        .map(|_| worker(&env, &["--max-in-flight", "1000"]))
        .collect();
    let pad = "j".repeat(64 * 1024);
    let input: String = (0..40)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"{pad}\"}}\n"))
        .collect();
    publish_lines(&env, input);
    std::thread::sleep(Duration::from_millis(500));
    let st = env.status();
    let work = dws_tests::common::listed(&st, "work");
    let in_flight = work["in_flight"].as_u64().unwrap_or(0);
    // 1 MiB holds 15 of these events (each a little over 64 KiB); one
    // more may go when none is in flight.
    assert!((1..=16).contains(&in_flight), "{work:#}");
    let printed: usize = ws.iter().map(|w| lines(w).len()).sum();
    assert_eq!(printed as u64, in_flight, "{work:#}");
}

#[test]
fn list_and_info_show_every_worker_and_delivery_in_the_flags_words() {
    let env = queue();
    env.subscribe(&["job.*", "--id", "solo"]);
    let ws: Vec<Child> = (0..4).map(|_| worker(&env, &[])).collect();
    publish_jobs(&env, 4);
    wait_total(&ws.iter().collect::<Vec<_>>(), 4, LONG, "4 jobs");
    let list = env
        .dws(["event", "subscription", "list"])
        .run_with_timeout(EXIT_TIMEOUT);
    list.assert_code(0);
    let row = list
        .stdout
        .lines()
        .find(|l| l.starts_with("work "))
        .unwrap_or_else(|| panic!("a row for work\n{list}"));
    for w in &ws {
        assert!(row.contains(&w.pid().to_string()), "{row}");
    }
    assert!(row.contains("4: pid "), "{row}");
    let info = env
        .dws(["event", "subscription", "info", "work"])
        .run_with_timeout(EXIT_TIMEOUT);
    info.assert_code(0);
    assert!(info.stdout.contains("delivery: shared\n"), "{info}");
    for w in &ws {
        assert!(
            info.stdout
                .contains(&format!("pid {} (1 in flight)", w.pid())),
            "{info}"
        );
    }
    let json = env
        .dws(["event", "subscription", "info", "work", "--format", "json"])
        .run_with_timeout(EXIT_TIMEOUT);
    let v: Value = serde_json::from_str(json.stdout.trim()).expect("JSON");
    assert_eq!(v["workers"].as_array().map(Vec::len), Some(4), "{v:#}");
    let solo = env
        .dws(["event", "subscription", "info", "solo"])
        .run_with_timeout(EXIT_TIMEOUT);
    assert!(solo.stdout.contains("delivery: per-host\n"), "{solo}");
    assert!(solo.stdout.contains("workers: -\n"), "{solo}");
}

/// The fenced block of docs/guide.md in `lang` whose text holds `marker`.
fn guide_block(lang: &str, marker: &str) -> String {
    let guide = std::fs::read_to_string(dws_tests::common::repo().join("docs/guide.md"))
        .expect("docs/guide.md");
    let fence = format!("```{lang}\n");
    guide
        .split(&fence)
        .skip(1)
        .filter_map(|b| b.split("```\n").next())
        .find(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("no {lang} block with {marker} in docs/guide.md"))
        .to_owned()
}

#[test]
fn the_guides_worker_loops_run_as_written() {
    let env = queue();
    let dir = env.root().join("workers");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let sh = dir.join("worker.sh");
    let py = dir.join("worker.py");
    std::fs::write(&sh, guide_block("bash", "worker.sh")).expect("write");
    std::fs::write(&py, guide_block("python", "worker.py")).expect("write");
    let python_path = dws_tests::common::repo().join("python");
    let workers: Vec<Child> = vec![
        env.command("bash", [sh.as_os_str()]).spawn(),
        env.command("bash", [sh.as_os_str()]).spawn(),
        env.command("python3", [py.as_os_str()])
            .env("PYTHONPATH", &python_path)
            .spawn(),
    ];
    env.wait_status(LONG, "three workers", |st| {
        dws_tests::common::listed(st, "work")["consumers"] == 3
    });
    publish_jobs(&env, 6);
    // Six jobs of a second each over three workers: all acked in a few
    // seconds, and each worker did some.
    let st = env.wait_status(LONG, "every job acked", |st| {
        let w = dws_tests::common::listed(st, "work");
        w["acked"] == 6 && w["pending"] == 0
    });
    let work = dws_tests::common::listed(&st, "work");
    assert_eq!(work["redelivered"], 0, "{work:#}");
    for w in &workers {
        let said = w.stderr_so_far().join("\n");
        assert!(said.contains("working on"), "each worker works: {said}");
    }
}
