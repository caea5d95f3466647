//! What a new user's mistakes get (issue 34 item 7): every error says what
//! is wrong and what is valid, in the one `Error:` line (a TTL that is not
//! a duration, a negative duration, seq 0, an unknown verb, an event key
//! with an empty segment), counts read as words (`1 delivery`), a bare
//! `busd` beside a running bus says so, and colour appears on a terminal
//! only (never on a pipe, never with `NO_COLOR`).

use std::time::Duration;

use dws_tests::{run_on_terminal, TestEnv, EXIT_TIMEOUT};

/// `dws ARGS` in a fresh env: the one `Error:` line of a usage error
/// (exit 2), nothing started.
fn usage_error(args: &[&str]) -> String {
    let env = TestEnv::new();
    let out = env.dws(args).run_with_timeout(EXIT_TIMEOUT);
    let msg = out.assert_error(2);
    assert!(env.busd_pids().is_empty(), "{args:?} started a bus\n{out}");
    msg
}

#[test]
fn a_value_that_is_not_valid_is_named_with_what_is_valid() {
    let msg = usage_error(&["event", "consume", "k", "--ttl", "forever"]);
    assert!(
        msg.contains("'forever'") && msg.contains("not a duration") && msg.contains("or never"),
        "{msg}"
    );
    assert!(!msg.contains("expected number at 0"), "{msg}");
    for flag in ["--duration", "--ack-wait"] {
        let mut args = vec!["event", "consume", "k", flag, "-1s"];
        if flag == "--ack-wait" {
            args.extend(["--ack", "explicit"]);
        }
        let msg = usage_error(&args);
        assert!(msg.contains("'-1s'") && msg.contains("negative"), "{msg}");
        assert!(!msg.contains("use '-- -1'"), "{msg}");
    }
    let msg = usage_error(&["event", "consume", "k", "--max-events", "-1"]);
    assert!(msg.contains("1 or more"), "{msg}");
    for seq in ["0", "-1"] {
        let msg = usage_error(&["event", "get", seq]);
        assert!(msg.contains("seqs start at 1"), "{msg}");
    }
}

#[test]
fn an_unknown_verb_lists_the_valid_ones() {
    let msg = usage_error(&["event", "subscription", "frobnicate"]);
    assert!(
        msg.contains(
            "valid subcommands: list, info, restart, skip, disable, enable, seek, parked, replay-parked"
        ),
        "{msg}"
    );
    let msg = usage_error(&["event", "frobnicate"]);
    assert!(msg.contains("valid subcommands: consume, publish"), "{msg}");
    assert!(!msg.contains("__subscription-ids"), "{msg}");
}

#[test]
fn an_event_key_with_an_empty_segment_is_refused_by_every_command() {
    for key in ["bad..key", ".x", "x.", "x..*"] {
        for args in [
            vec!["event", "consume", key],
            vec!["event", "subscribe", key, "--id", "s1"],
        ] {
            let msg = usage_error(&args);
            assert!(
                msg.contains("empty segment") && msg.contains("im.message"),
                "{args:?}: {msg}"
            );
        }
        if !key.ends_with('*') {
            let msg = usage_error(&["event", "publish", key, "1"]);
            assert!(msg.contains("empty segment"), "{key}: {msg}");
        }
    }
}

#[test]
fn parked_events_say_one_delivery_not_1_deliveries() {
    let env = TestEnv::new();
    env.subscribe(&[
        "k.*",
        "--id",
        "s1",
        "--max-deliver",
        "1",
        "--on-poison",
        "park",
    ]);
    env.publish("k.e", "x", &[]);
    let mut c = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--ack",
            "explicit",
        ])
        .stdin_pipe()
        .spawn();
    c.wait_ready();
    c.wait_stdout_lines(1, EXIT_TIMEOUT);
    c.write_stdin(b"term 1 cannot parse\n");
    env.wait_status(EXIT_TIMEOUT, "one parked", |st| {
        dws_tests::common::listed(st, "s1")["parked"] == 1
    });
    c.close_stdin();
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 1);
    let out = env
        .dws(["event", "subscription", "parked", "s1"])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    assert!(out.stdout.contains("(1 delivery)"), "{out}");
    assert!(!out.stdout.contains("deliveries)"), "{out}");
}

#[test]
fn a_bare_busd_beside_a_running_bus_says_so_and_exits_0() {
    let env = TestEnv::new();
    env.publish("k.e", "x", &[]);
    let pid = env.bus_meta_pid().expect("a bus");
    let out = env
        .busd::<[&str; 0], &str>([])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    let socket = env.expected_socket_path().display().to_string();
    assert_eq!(
        out.stderr,
        format!(
            "busd: a bus already serves profile default (pid {pid}, socket {socket}); nothing to do\n"
        ),
        "{out}"
    );
    assert_eq!(env.busd_pids(), vec![pid], "still one bus");
}

/// Whether `text` holds an ANSI escape sequence.
fn coloured(text: &str) -> bool {
    text.contains("\x1b[")
}

#[test]
fn colour_never_reaches_a_pipe() {
    let env = TestEnv::new();
    for args in [
        vec!["event", "consume", "k", "--durationn", "1s"],
        vec!["--help"],
        vec!["event", "consume", "--help"],
    ] {
        let out = env.dws(&args).run_with_timeout(EXIT_TIMEOUT);
        assert!(
            !coloured(&out.stdout) && !coloured(&out.stderr),
            "{args:?}\n{out}"
        );
    }
}

#[test]
fn colour_on_a_terminal_unless_no_color() {
    let env = TestEnv::new();
    let wait = Duration::from_secs(20);
    let error = run_on_terminal(
        env.dws(["event", "consume", "k", "--durationn", "1s"]),
        wait,
    );
    assert_eq!(error.code, Some(2), "{error:?}");
    assert!(
        error.shown.contains("\x1b[1m\x1b[31mError:\x1b[0m "),
        "the error word in bold red: {error:?}"
    );
    let help = run_on_terminal(env.dws(["event", "consume", "--help"]), wait);
    assert_eq!(help.code, Some(0), "{help:?}");
    assert!(coloured(&help.shown), "the help's headings: {help:?}");
    for cmd in [
        env.dws(["event", "consume", "k", "--durationn", "1s"]),
        env.dws(["event", "consume", "--help"]),
    ] {
        let plain = run_on_terminal(cmd.env("NO_COLOR", "1"), wait);
        assert!(!coloured(&plain.shown), "NO_COLOR: {plain:?}");
        assert!(!plain.shown.is_empty(), "{plain:?}");
    }
}
