//! `dws event publish EVENT_TYPE --lines`: one event per line of stdin,
//! pipelined over one connection, one summary on stdout
//! (`schemas/publish-lines.schema.json`), each refused line on stderr with
//! its number, exit 0 only when every non-empty line was accepted.

use std::time::Duration;

use dws_tests::{Child, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

/// Bound of the waits in this module (thousands of events under load).
const T: Duration = Duration::from_secs(60);

/// The one summary line of a `--lines` run, checked against its schema.
fn summary(out: &dws_tests::Output) -> Value {
    let lines = out.stdout_lines();
    assert_eq!(lines.len(), 1, "one summary line\n{out}");
    let v: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}\n{out}"));
    crate::ecosystem::assert_valid("publish-lines", &v);
    v
}

/// A consumer of `key`, ready, ending after `n` events.
fn consumer(env: &TestEnv, key: &str, n: usize) -> Child {
    let mut c = env
        .dws(["event", "consume", key, "--max-events", &n.to_string()])
        .spawn();
    c.wait_ready();
    c
}

/// `(seq, data)` of every event line.
fn seqs_and_data(lines: &[String]) -> Vec<(u64, String)> {
    lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            (
                v["seq"].as_u64().unwrap_or_else(|| panic!("no seq: {l}")),
                v["data"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Thousands of lines become as many events, in line order, each line's
/// text its data (a `\r\n` end is a line end, empty lines are skipped and
/// counted); one summary, nothing on stderr, exit 0.
#[test]
fn every_line_is_one_event_in_order_with_one_summary() {
    let env = TestEnv::new();
    const N: usize = 5000;
    let mut input = String::new();
    for i in 1..=N {
        input.push_str(&format!("{{\"i\":{i}}}"));
        input.push_str(if i % 1000 == 0 { "\r\n\n" } else { "\n" });
    }
    let mut c = consumer(&env, "pl.*", N);
    let out = env
        .dws(["event", "publish", "pl.x", "--lines"])
        .stdin_bytes(input)
        .run_with_timeout(T);
    out.assert_code(0);
    assert!(out.stderr.is_empty(), "{out}");
    let s = summary(&out);
    assert_eq!(s["lines"], N + N / 1000, "{s}");
    assert_eq!(s["published"], N, "{s}");
    assert_eq!(s["duplicates"], 0, "{s}");
    assert_eq!(s["refused"], 0, "{s}");
    assert_eq!(s["skipped"], N / 1000, "{s}");
    assert_eq!(s["unanswered"], 0, "{s}");
    let (first, last) = (s["first_seq"].as_u64(), s["last_seq"].as_u64());
    assert_eq!(
        last.zip(first).map(|(l, f)| l - f + 1),
        Some(N as u64),
        "{s}"
    );

    let got = seqs_and_data(&c.wait_stdout_lines(N, T));
    let want: Vec<String> = (1..=N).map(|i| format!("{{\"i\":{i}}}")).collect();
    assert_eq!(
        got.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>(),
        want,
        "every line, in line order, as the event's data"
    );
    assert_eq!(got.first().map(|g| g.0), first);
    assert_eq!(got.last().map(|g| g.0), last);
    c.wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("limit", N as u64);
}

/// A line too large for a frame and a line that is not UTF-8 are each
/// reported with their line number; the lines around them are published;
/// the run ends with one `Error:` line naming the first and exit 2.
#[test]
fn a_refused_line_is_reported_by_number_and_the_others_are_published() {
    let env = TestEnv::new();
    let mut input = b"first\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 5 << 20));
    input.extend_from_slice(b"\n\xff\xfe\nlast\n");
    let mut c = consumer(&env, "plr.*", 2);
    let out = env
        .dws(["event", "publish", "plr.x", "--lines"])
        .stdin_bytes(input)
        .run_with_timeout(T);
    let error = out.assert_error(2);
    let s = summary(&out);
    assert_eq!(
        (&s["lines"], &s["published"], &s["refused"]),
        (&4.into(), &2.into(), &2.into()),
        "{s}"
    );
    let refused: Vec<&str> = out
        .stderr_lines()
        .into_iter()
        .filter(|l| l.starts_with("[event] line "))
        .collect();
    assert_eq!(refused.len(), 2, "{out}");
    assert!(
        refused[0].starts_with(&format!(
            "[event] line 2 refused: event data is {} bytes",
            5 << 20
        )),
        "{out}"
    );
    assert_eq!(
        refused[1], "[event] line 3 refused: event data is not valid UTF-8",
        "{out}"
    );
    assert!(
        error.starts_with("Error: 2 of 4 line(s) refused (the first, line 2: event data is"),
        "{out}"
    );
    assert_eq!(out.stderr_lines().len(), 3, "{out}");
    let got = seqs_and_data(&c.wait_stdout_lines(2, T));
    assert_eq!(got[0].1, "first");
    assert_eq!(got[1].1, "last");
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("limit", 2);
}

/// Lines go out as they arrive, not at the end of the input: a consumer
/// gets the first two while stdin is still open; closing it after a last
/// line without a newline ends the run with that line published too. No
/// input at all is a summary of nothing, exit 0.
#[test]
fn lines_go_out_as_they_come_and_stdin_closed_mid_line_ends_the_run() {
    let env = TestEnv::new();
    let mut c = consumer(&env, "pls.*", 3);
    let mut p = env
        .dws(["event", "publish", "pls.x", "--lines"])
        .stdin_pipe()
        .spawn();
    p.write_stdin(b"one\ntwo\n");
    let got = seqs_and_data(&c.wait_stdout_lines(2, T));
    assert_eq!(got[1].1, "two", "published before stdin ended");
    assert!(p.is_running(), "still reading stdin");
    p.write_stdin(b"thr");
    p.close_stdin();
    let out = p.wait_exit(T);
    out.assert_code(0);
    let s = summary(&out);
    assert_eq!(
        (&s["lines"], &s["published"]),
        (&3.into(), &3.into()),
        "{s}"
    );
    let got = seqs_and_data(&c.wait_stdout_lines(3, T));
    assert_eq!(got[2].1, "thr", "the last line needs no newline");
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("limit", 3);

    let out = env
        .dws(["event", "publish", "pls.x", "--lines"])
        .stdin_bytes(Vec::new())
        .run_with_timeout(T);
    out.assert_code(0);
    let s = summary(&out);
    assert_eq!(
        (&s["lines"], &s["published"]),
        (&0.into(), &0.into()),
        "{s}"
    );
    assert_eq!(
        (&s["first_seq"], &s["last_seq"]),
        (&Value::Null, &Value::Null),
        "{s}"
    );
}

/// With `--id-prefix P`, line N is published as `P-N`: running the input
/// again, longer, publishes only the new lines; the others are counted as
/// duplicates. The exit code is 0 both times (a duplicate is accepted).
#[test]
fn an_id_prefix_makes_a_second_run_publish_only_what_is_new() {
    let env = TestEnv::new();
    let run = |input: &str| {
        let out = env
            .dws([
                "event",
                "publish",
                "pld.x",
                "--lines",
                "--id-prefix",
                "batch-7",
            ])
            .stdin_bytes(input.as_bytes().to_vec())
            .run_with_timeout(T);
        out.assert_code(0);
        summary(&out)
    };
    let first = run("a\nb\n\nc\n");
    assert_eq!(
        (&first["published"], &first["duplicates"], &first["skipped"]),
        (&3.into(), &0.into(), &1.into()),
        "{first}"
    );
    let second = run("a\nb\n\nc\nd\ne\n");
    assert_eq!(
        (&second["published"], &second["duplicates"]),
        (&2.into(), &3.into()),
        "{second}"
    );
    assert_eq!(
        second["first_seq"].as_u64(),
        first["last_seq"].as_u64().map(|s| s + 1),
        "{first} {second}"
    );
    let mut c = env
        .dws([
            "event",
            "consume",
            "pld.*",
            "--from",
            "earliest",
            "--max-events",
            "5",
        ])
        .spawn();
    let ids: Vec<String> = c
        .wait_stdout_lines(5, T)
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            v["event_id"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(
        ids,
        [
            "batch-7-1",
            "batch-7-2",
            "batch-7-4",
            "batch-7-5",
            "batch-7-6"
        ],
        "line numbers count the empty line too"
    );
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("limit", 5);
}

/// `--lines` takes its data from stdin only and its ids from
/// `--id-prefix`: DATA or `--id` with it, or `--id-prefix` without it, is a
/// usage error (exit 2) before any bus is started.
#[test]
fn lines_refuses_data_an_id_and_an_id_prefix_alone() {
    let env = TestEnv::new();
    for args in [
        vec!["event", "publish", "plu.x", "--lines", "data"],
        vec!["event", "publish", "plu.x", "--lines", "--id", "e-1"],
        vec!["event", "publish", "plu.x", "{}", "--id-prefix", "p"],
        vec!["event", "publish", "plu.*", "--lines"],
    ] {
        let out = env
            .dws(&args)
            .stdin_bytes(b"x\n".to_vec())
            .run_with_timeout(EXIT_TIMEOUT);
        out.assert_error(2);
        assert!(out.stdout.is_empty(), "{out}");
    }
    assert!(env.busd_pids().is_empty(), "no bus was started");
}

/// Issue 49, row 5: ids are printable and unambiguous — an `--id-prefix`
/// (or `--id`) that is empty or holds a newline, BEL or an RTL override is
/// a usage error (exit 2, one line naming the flag) before any bus starts.
#[test]
fn an_id_prefix_or_id_that_is_empty_or_unprintable_is_refused() {
    let env = TestEnv::new();
    for (flag, value) in [
        ("--id-prefix", ""),
        ("--id-prefix", "a\nb"),
        ("--id-prefix", "bell\u{7}"),
        ("--id-prefix", "ab\u{202E}cd"),
        ("--id", "a\nb"),
        ("--id", "x\u{202E}"),
    ] {
        let mut args = vec!["event", "publish", "plu.x"];
        if flag == "--id" {
            args.push("{}");
        } else {
            args.push("--lines");
        }
        args.extend([flag, value]);
        let out = env
            .dws(&args)
            .stdin_bytes(b"x\n".to_vec())
            .run_with_timeout(EXIT_TIMEOUT);
        out.assert_error(2);
        assert!(out.stderr.contains(flag), "{flag} {value:?}: {out}");
        assert!(out.stdout.is_empty(), "{out}");
    }
    assert!(env.busd_pids().is_empty(), "no bus was started");
}

/// Issue 49, row 4: `publish --lines` reads stdin ahead of the bus's
/// answers by at most its read-ahead bound (64 MiB; docs/guide.md,
/// Limits). With the bus stopped (SIGSTOP) after the first line, a writer
/// offering 300 lines of about 1 MiB gets no further than the bound plus a few
/// buffers, and dws's memory stays near it (before the fix it read all
/// 300 MiB, and up to 18 GiB in principle); once the bus runs again every
/// line is published.
#[test]
fn lines_read_ahead_of_a_stopped_bus_stays_within_its_bound() {
    use nix::{sys::signal::kill, unistd::Pid};
    use std::{
        io::Write,
        sync::{
            atomic::{AtomicU64, Ordering},
            Arc,
        },
        time::Instant,
    };
    const LINES: u64 = 300;
    const MIB: u64 = 1024 * 1024;
    let env = TestEnv::new();
    env.publish("plu.warm", "{}", &[]);
    let busd = env.bus_meta_pid().expect("the bus's pid");
    let mut c = env
        .dws(["event", "publish", "plu.big", "--lines"])
        .stdin_pipe()
        .spawn();
    let mut stdin = c.take_stdin().expect("dws's stdin");
    stdin.write_all(b"first\n").expect("the first line");
    stdin.flush().expect("flush");
    env.wait_until(T, "the first line is published", || {
        env.status()["log"]["head_seq"] == 2
    });
    kill(Pid::from_raw(busd), nix::sys::signal::SIGSTOP).expect("stop the bus");
    let written = Arc::new(AtomicU64::new(0));
    let counter = written.clone();
    let writer = std::thread::spawn(move || {
        // Lines of a little less than 1 MiB, four per write: stdin always
        // holds the start of the next line when one ends, as from a file.
        let mut line = vec![b'x'; MIB as usize - 1001];
        line.push(b'\n');
        let four = line.repeat(4);
        for _ in 0..LINES / 4 {
            if stdin.write_all(&four).is_err() {
                return;
            }
            counter.fetch_add(4 * MIB, Ordering::SeqCst);
        }
    });
    // Until the writer is held up (no progress for 2 s), at most 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (0, Instant::now());
    while Instant::now() < deadline && written.load(Ordering::SeqCst) < LINES * MIB {
        std::thread::sleep(Duration::from_millis(200));
        let now = written.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    let read = written.load(Ordering::SeqCst) / MIB;
    let rss_mib = dws_tests::proc_kb(c.pid(), "VmRSS") / 1024;
    kill(Pid::from_raw(busd), nix::sys::signal::SIGCONT).expect("continue the bus");
    assert!(
        read <= 80,
        "dws read {read} MiB of stdin ahead of a stopped bus (bound 64 MiB)"
    );
    assert!(
        rss_mib <= 200,
        "dws holds {rss_mib} MiB ahead of a stopped bus"
    );
    writer.join().expect("the writer");
    let out = c.wait_exit(T);
    out.assert_code(0);
    assert_eq!(summary(&out)["published"], LINES + 1, "{out}");
}
