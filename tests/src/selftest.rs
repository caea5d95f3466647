//! The harness's own tests: real processes (`/bin/sh`) through
//! [`TestEnv`], [`Cmd`] and [`Child`] — isolation, stdin modes, merged
//! output, `| head`, stdout left unread, the busd scan and its cleanup,
//! and a descendant holding a pipe.

use std::{thread, time::Duration};

use crate::{wait_pid_gone, Cmd, TestEnv, EXIT_TIMEOUT};

fn sh(env: &TestEnv, script: &str) -> Cmd {
    env.command("/bin/sh", ["-c", script])
}

#[test]
fn merged_output_keeps_byte_order() {
    let env = TestEnv::new();
    let out = sh(&env, "echo err1 >&2; echo out1; echo err2 >&2")
        .merge_output()
        .run_with_timeout(EXIT_TIMEOUT);
    assert_eq!(out.stdout, "err1\nout1\nerr2\n", "{out}");
    assert_eq!(out.stderr, "");
}

#[test]
fn env_is_cleared_and_isolated() {
    let env = TestEnv::with_env(&[("EXTRA", "1")]);
    let out = sh(&env, "env | sort").run_with_timeout(EXIT_TIMEOUT);
    let cfg = format!("DWS_CONFIG_DIR={}", env.cfg_dir().display());
    assert!(out.stdout.lines().any(|l| l == cfg), "{out}");
    assert!(out.stdout.lines().any(|l| l == "EXTRA=1"), "{out}");
    assert!(!out.stdout.contains("CARGO"), "{out}");
}

#[test]
fn stdin_modes() {
    let env = TestEnv::new();
    let out = sh(&env, "cat")
        .stdin_bytes("abc")
        .run_with_timeout(EXIT_TIMEOUT);
    assert_eq!(out.stdout, "abc");
    let out = sh(&env, "cat").run_with_timeout(EXIT_TIMEOUT);
    assert_eq!(out.stdout, "");
    let mut c = sh(&env, "cat").stdin_pipe().spawn();
    c.write_stdin(b"line\n");
    assert_eq!(
        c.wait_stdout_lines(1, EXIT_TIMEOUT),
        vec!["line".to_string()]
    );
    c.close_stdin();
    c.wait_exit(EXIT_TIMEOUT).assert_code(0);
    let mut c = sh(&env, "cat").stdin_hold().spawn();
    thread::sleep(Duration::from_millis(300));
    assert!(c.is_running());
}

#[test]
fn stdout_closed_after_lines_gives_the_writer_a_broken_pipe() {
    let env = TestEnv::new();
    let mut c = sh(
        &env,
        "trap '' PIPE; i=0; while echo $i; do i=$((i+1)); sleep 0.05; done; echo broken >&2",
    )
    .close_stdout_after_lines(1)
    .spawn();
    c.wait_stdout_lines(1, EXIT_TIMEOUT);
    c.wait_stderr_line("broken", EXIT_TIMEOUT, |l| l == "broken");
    c.wait_exit(EXIT_TIMEOUT).assert_code(0);
}

#[test]
fn busd_scan_finds_and_drop_kills_processes_named_busd() {
    let env = TestEnv::new();
    let fake = env.root().join("bin").join("busd");
    std::fs::create_dir(env.root().join("bin")).expect("mkdir");
    std::fs::copy("/bin/sleep", &fake).expect("copy sleep");
    // Detached like a daemon: the test does not hold it as a Child.
    let out = sh(
        &env,
        &format!(
            "{} 300 >/dev/null 2>&1 </dev/null & echo $!",
            fake.display()
        ),
    )
    .run_with_timeout(EXIT_TIMEOUT);
    let pid: i32 = out.stdout.trim().parse().expect("pid");
    env.wait_until(EXIT_TIMEOUT, "fake busd visible", || {
        env.busd_pids() == vec![pid]
    });
    let other = TestEnv::new();
    assert!(other.busd_pids().is_empty(), "another env does not see it");
    drop(env);
    assert!(
        wait_pid_gone(pid, EXIT_TIMEOUT),
        "TestEnv drop kills its busd"
    );
}

#[test]
fn wait_exit_reports_a_descendant_holding_stdout() {
    let env = TestEnv::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sh(&env, "sleep 5 & echo started").run_with_timeout(EXIT_TIMEOUT)
    }));
    let msg = r
        .err()
        .and_then(|e| e.downcast_ref::<String>().cloned())
        .expect("panics");
    assert!(msg.contains("inherited"), "{msg}");
}

#[test]
fn an_unread_stdout_blocks_the_writer_until_the_test_reads_it() {
    let env = TestEnv::new();
    // 200 KiB: more than a pipe holds, so `head` blocks until read.
    let script = "echo started >&2; head -c 204800 /dev/zero | tr '\\0' x; echo; echo done >&2";
    let mut c = sh(&env, script).spawn_stdout_unread();
    c.wait_stderr_line("started", EXIT_TIMEOUT, |l| l == "started");
    assert_eq!(c.stdout_so_far(), Vec::<String>::new());
    assert!(
        c.try_wait_stderr_line(Duration::from_millis(300), |l| l == "done")
            .is_none(),
        "the writer is blocked on the full pipe\n{}",
        c.report()
    );
    assert!(c.report().contains("<not read>"));
    let mut c = c.start_reading();
    c.wait_stderr_line("done", EXIT_TIMEOUT, |l| l == "done");
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_code(0);
    assert_eq!(
        out.stdout.len(),
        204_801,
        "every byte, read after the stall"
    );
}

#[test]
fn an_unread_stdout_is_read_to_eof_after_the_exit() {
    let env = TestEnv::new();
    let c = sh(&env, "echo a; echo b").spawn_stdout_unread();
    let out = c.wait_exit_then_read_stdout(EXIT_TIMEOUT);
    assert_eq!(out.stdout, "a\nb\n", "{out}");
}
