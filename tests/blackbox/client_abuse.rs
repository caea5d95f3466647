//! `dws` under hostile or careless use: a bus killed under a consumer (told
//! apart from a clean stop by one diagnostic line), arguments that are not
//! UTF-8 (a usage error, not a panic), huge invalid input (echoed only in
//! part), and something at the socket that accepts but never answers, or
//! refuses with an `Error` frame (a full connection table): the command fails
//! with exit 1 within the connect deadline and never spawns another bus.
//!
//! The last two use a fake bus: a plain Unix listener bound by the test at
//! the exact socket path of the env. `dws` discovers a bus by connecting to
//! that path (no lock or `bus.meta` is consulted), so the listener alone is
//! what `dws` takes for a running bus.

use std::{
    ffi::OsString,
    io::{ErrorKind, Write},
    os::unix::{
        ffi::OsStringExt,
        fs::DirBuilderExt,
        net::{UnixListener, UnixStream},
    },
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use bytes::BytesMut;
use dws_tests::{Output, Sig, TestEnv, EXIT_TIMEOUT};
use proto::v1::{server_frame, ErrorCode, ServerFrame};

/// The diagnostic a consumer prints when its bus vanished without a Bye.
const LOST: &str = "[event] bus connection lost without goodbye";

/// `dws`'s connect deadline (`dws_client::bus::CONNECT_DEADLINE`).
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------ a killed bus

#[test]
fn kill_9_of_the_bus_prints_connection_lost_then_exits_with_bus_shutdown() {
    let env = TestEnv::new();
    let mut loud = env.dws(["event", "consume", "k9.k"]).stdin_hold().spawn();
    let bus_pid = loud.wait_ready().bus_pid;
    let quiet = env
        .dws(["event", "consume", "k9.k", "--quiet"])
        .stdin_hold()
        .spawn();
    // --quiet prints no ready line: wait until the bus counts both.
    env.wait_until(EXIT_TIMEOUT, "two consumers attached", || {
        env.status()["consumers"]
            .as_array()
            .is_some_and(|c| c.len() == 2)
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(bus_pid), Sig::SIGKILL)
        .expect("kill -9 busd");

    let out = loud.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("bus_shutdown", 0);
    let lines = out.stderr_lines();
    assert_eq!(
        lines.iter().filter(|l| **l == LOST).count(),
        1,
        "exactly one `{LOST}` line\n{out}"
    );
    assert_eq!(
        lines[lines.len() - 2],
        LOST,
        "the lost line comes right before the exited line\n{out}"
    );

    let out = quiet.wait_exit(EXIT_TIMEOUT);
    out.assert_code(0);
    assert_eq!(
        out.stderr, "",
        "--quiet suppresses the lost line too\n{out}"
    );
}

fn assert_no_lost_line(out: &Output) {
    out.assert_clean_exit("bus_shutdown", 0);
    assert!(
        !out.stderr_lines().contains(&LOST),
        "a bus that said goodbye did not get lost\n{out}"
    );
}

#[test]
fn stop_and_sigterm_of_the_bus_say_goodbye_so_no_connection_lost_line() {
    let env = TestEnv::new();
    let mut c = env.dws(["event", "consume", "bye.k"]).stdin_hold().spawn();
    c.wait_ready();
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    assert_no_lost_line(&c.wait_exit(EXIT_TIMEOUT));

    let mut c = env.dws(["event", "consume", "bye.k"]).stdin_hold().spawn();
    let bus_pid = c.wait_ready().bus_pid;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(bus_pid), Sig::SIGTERM).expect("kill busd");
    assert_no_lost_line(&c.wait_exit(EXIT_TIMEOUT));
}

// ------------------------------------------------------------------ non-UTF-8 argv

#[test]
fn an_argument_that_is_not_utf8_is_a_usage_error_for_every_subcommand() {
    let env = TestEnv::new();
    let bad = || OsString::from_vec(b"x\xffy".to_vec());
    let s = |a: &str| OsString::from(a);
    let cases: Vec<(Vec<OsString>, usize)> = vec![
        (vec![s("event"), s("publish"), s("a.b"), bad()], 4),
        (vec![s("event"), s("publish"), bad()], 3),
        (
            vec![s("event"), s("consume"), s("k"), s("--filter"), bad()],
            5,
        ),
        (vec![s("event"), s("status"), s("--format"), bad()], 4),
        (vec![s("event"), s("stop"), s("--subscribe-id"), bad()], 4),
        (vec![s("event"), s("subscribe"), bad()], 3),
        (vec![s("event"), s("unsubscribe"), bad()], 3),
        (vec![s("event"), bad()], 2),
        (vec![s("--profile"), bad(), s("event"), s("status")], 2),
    ];
    for (args, index) in cases {
        let out = env.dws(&args).run_with_timeout(EXIT_TIMEOUT);
        assert_eq!(out.signal, None, "{out}");
        let err = out.assert_error(2);
        assert!(
            err.starts_with(&format!("Error: argument {index} is not valid UTF-8")),
            "{out}"
        );
        assert_eq!(out.stderr_lines().len(), 1, "only the Error line\n{out}");
        assert_eq!(out.stdout, "", "{out}");
    }
    assert!(env.busd_pids().is_empty(), "a usage error starts no bus");
}

// ------------------------------------------------------------------ huge input

/// Just below the kernel's limit on one argv string (`MAX_ARG_STRLEN`,
/// 128 KiB): the largest value a flag can carry.
const HUGE: usize = 120_000;

/// Runs `dws args…`, expects exit 2 with one short `Error:` line that
/// contains every one of `says`.
fn assert_short_usage_error(env: &TestEnv, args: &[&str], says: &[&str]) {
    let out = env.dws(args).run_with_timeout(EXIT_TIMEOUT);
    let err = out.assert_error(2);
    let shown = || format!("{}…", &err[..err.len().min(300)]);
    assert!(
        out.stderr.len() < 2048,
        "stderr is {} bytes: {}",
        out.stderr.len(),
        shown()
    );
    for s in says {
        assert!(err.contains(s), "the error does not say {s:?}: {}", shown());
    }
}

#[test]
fn huge_invalid_input_is_echoed_only_in_part() {
    let env = TestEnv::new();
    let regex = format!("({}", "a".repeat(HUGE));
    assert_short_usage_error(
        &env,
        &["event", "consume", "k", "--filter", &regex],
        &[
            "invalid --filter regex \"(aaa",
            &format!("…({} bytes)", HUGE + 1),
            "unclosed group",
        ],
    );
    assert_short_usage_error(
        &env,
        &["event", "subscribe", "k", "--filter", &regex],
        &["invalid --filter regex", "unclosed group"],
    );
    let key = format!("a b{}", "c".repeat(HUGE));
    assert_short_usage_error(
        &env,
        &["event", "consume", &key],
        &["invalid event key \"a bccc", "bytes)", "use an exact key"],
    );
    assert_short_usage_error(
        &env,
        &["event", "publish", &key, "data"],
        &["invalid event type \"a bccc", "bytes)", "no wildcards"],
    );
    let id = "i".repeat(HUGE);
    assert_short_usage_error(
        &env,
        &["event", "consume", "--subscribe-id", &id],
        &["invalid --subscribe-id \"iii", "bytes)", "1-64 characters"],
    );
    assert_short_usage_error(
        &env,
        &["--profile", &id, "event", "status"],
        &["invalid profile \"iii", "bytes)", "1-64 characters"],
    );
    // Errors found by the argument parser.
    let digits = format!("1{}", "x".repeat(HUGE));
    assert_short_usage_error(
        &env,
        &["event", "consume", "k", "--max-events", &digits],
        &["--max-events", "bytes)", "a whole number of 1 or more"],
    );
    let duration = format!("5{}", "x".repeat(HUGE));
    assert_short_usage_error(
        &env,
        &["event", "consume", "k", "--duration", &duration],
        &["--duration", "bytes)", "(ms, s, m, h, d)"],
    );
    let flag = format!("--{}", "f".repeat(HUGE));
    assert_short_usage_error(
        &env,
        &["event", "consume", "k", &flag],
        &["unexpected argument", "bytes)"],
    );
    assert!(env.busd_pids().is_empty(), "a usage error starts no bus");
}

// ------------------------------------------------------------------ fake bus

/// What the fake bus does with a connection.
enum Behaviour {
    /// Accepts and holds it, never writing a byte.
    Silent,
    /// Writes these bytes (an encoded frame) and closes, without reading
    /// anything.
    Refuse(Vec<u8>),
}

/// A Unix listener at the env's socket path, serving every connection
/// with one [`Behaviour`] from a thread until dropped.
struct FakeBus {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeBus {
    fn start(env: &TestEnv, behaviour: Behaviour) -> FakeBus {
        let socket = env.expected_socket_path();
        let dir = socket.parent().expect("socket dir");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .expect("create the socket dir 0700");
        let listener = UnixListener::bind(&socket)
            .unwrap_or_else(|e| panic!("bind {}: {e}", socket.display()));
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = thread::spawn(move || {
            let mut held: Vec<UnixStream> = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => match &behaviour {
                        Behaviour::Silent => held.push(conn),
                        Behaviour::Refuse(bytes) => {
                            conn.set_nonblocking(false).expect("blocking conn");
                            conn.set_write_timeout(Some(Duration::from_secs(10)))
                                .expect("write timeout");
                            let _ = conn.write_all(bytes);
                        }
                    },
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        FakeBus {
            socket,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeBus {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Every command that connects, each starting at once against the fake.
fn commands() -> Vec<Vec<&'static str>> {
    vec![
        vec!["event", "status"],
        vec!["event", "stop"],
        vec!["event", "publish", "fake.k", "x"],
        vec!["event", "consume", "fake.k"],
        vec!["event", "subscribe", "fake.k"],
        vec!["event", "unsubscribe", "s1"],
    ]
}

#[test]
fn a_bus_that_accepts_but_never_answers_fails_every_command_within_the_deadline() {
    let env = TestEnv::new();
    let fake = FakeBus::start(&env, Behaviour::Silent);
    let children: Vec<_> = commands()
        .into_iter()
        .map(|args| env.dws(args).spawn())
        .collect();
    for c in children {
        let out = c.wait_exit(CONNECT_DEADLINE + EXIT_TIMEOUT);
        let err = out.assert_error(1);
        assert!(
            err.contains(&format!(
                "the bus at {} accepted the connection but did not answer within 10s",
                fake.socket.display()
            )),
            "{out}"
        );
        assert!(
            out.elapsed >= CONNECT_DEADLINE - Duration::from_secs(1),
            "gave up before the deadline\n{out}"
        );
    }
    assert!(
        env.busd_pids().is_empty(),
        "a bus that answers nothing is not replaced by a spawned one"
    );
}

fn refusal(code: ErrorCode, message: &str) -> Behaviour {
    let frame = ServerFrame {
        kind: Some(server_frame::Kind::Error(proto::v1::Error {
            request_id: 0,
            code: code as i32,
            message: message.into(),
        })),
    };
    let mut b = BytesMut::new();
    proto::codec::encode_frame(&frame, &mut b).expect("encode frame");
    Behaviour::Refuse(b.to_vec())
}

#[test]
fn a_full_connection_table_is_reported_and_no_other_bus_is_spawned() {
    let env = TestEnv::new();
    let message = "too many connections (1024 open); try again later";
    let _fake = FakeBus::start(&env, refusal(ErrorCode::ResourceExhausted, message));
    // Several rounds: whether the refusal lands before or after the client's
    // Hello is a race; both orders must read the same.
    for _ in 0..5 {
        let children: Vec<_> = commands()
            .into_iter()
            .map(|args| env.dws(args).spawn())
            .collect();
        for c in children {
            let out = c.wait_exit(EXIT_TIMEOUT);
            let err = out.assert_error(1);
            assert_eq!(err, format!("Error: {message}"), "{out}");
            assert!(
                out.elapsed < Duration::from_secs(5),
                "a refusal must not be retried until the deadline\n{out}"
            );
        }
    }
    assert!(
        env.busd_pids().is_empty(),
        "a refusal is not a bus that went away: nothing may be spawned"
    );
}

#[test]
fn a_huge_error_message_from_the_bus_is_capped() {
    let env = TestEnv::new();
    let message = format!("bad value {} end", "v".repeat(1 << 20));
    let _fake = FakeBus::start(&env, refusal(ErrorCode::Internal, &message));
    let out = env.dws(["event", "status"]).run_with_timeout(EXIT_TIMEOUT);
    let err = out.assert_error(1);
    assert!(
        out.stderr.len() < 2048,
        "stderr is {} bytes",
        out.stderr.len()
    );
    assert!(err.starts_with("Error: bad value vvv"), "{}", &err[..200]);
    assert!(
        err.ends_with(&format!("…({} bytes)", message.len())),
        "{}",
        &err[..200]
    );
}
