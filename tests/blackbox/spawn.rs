//! On-demand start of the daemon: many clients starting at once end on
//! exactly one `busd`; a daemon killed with SIGKILL leaves a stale lock and
//! socket that the next client recovers from; the socket sits at the
//! documented path with mode 0600 in a 0700 dir; `--dry-run` starts nothing;
//! `busd --foreground` serves clients from the terminal.

use std::{
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    time::Duration,
};

use dws_tests::{Sig, TestEnv, EXIT_TIMEOUT, READY_TIMEOUT};

#[test]
fn ten_consumers_started_at_once_share_exactly_one_bus() {
    let env = TestEnv::new();
    let mut children: Vec<_> = (0..10)
        .map(|i| {
            env.dws(["event", "consume", &format!("many.{i}"), "many.all"])
                .spawn()
        })
        .collect();
    let readies: Vec<_> = children.iter_mut().map(|c| c.wait_ready()).collect();
    let pid = readies[0].bus_pid;
    for (i, r) in readies.iter().enumerate() {
        assert_eq!(
            r.bus_pid,
            pid,
            "consumer {i} is on another bus: {readies:?}\n{}",
            children[i].report()
        );
    }
    let mut ids: Vec<_> = readies.iter().map(|r| r.subscribe_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        10,
        "each run gets its own subscription: {readies:?}"
    );
    assert_eq!(
        env.busd_pids(),
        vec![pid],
        "exactly one busd for this env\n{}",
        env.bus_log_tail()
    );
    assert_eq!(env.bus_meta_pid(), Some(pid), "bus.meta names the winner");
    // Every one of them is really served.
    env.publish("many.all", "to-all", &[]);
    for c in &mut children {
        let lines = c.wait_stdout_lines(1, EXIT_TIMEOUT);
        assert!(lines[0].contains("to-all"), "{}", c.report());
    }
}

#[test]
fn kill_9_of_the_daemon_then_a_new_consume_starts_a_new_bus() {
    let env = TestEnv::new();
    let mut first = env.dws(["event", "consume", "k9.k"]).stdin_hold().spawn();
    let old = first.wait_ready().bus_pid;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), Sig::SIGKILL).expect("kill -9 busd");
    assert!(
        dws_tests::wait_pid_gone(old, EXIT_TIMEOUT),
        "busd {old} survived SIGKILL"
    );
    // The attached consumer saw its bus close under it.
    first
        .wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("bus_shutdown", 0);

    // bus.lock and the socket file are stale now; the next client must recover.
    let mut second = env
        .dws(["event", "consume", "k9.k", "--max-events", "1"])
        .spawn();
    let ready = second.wait_ready();
    assert_ne!(
        ready.bus_pid,
        old,
        "a new bus must be started\n{}",
        second.report()
    );
    assert_eq!(
        env.bus_meta_pid(),
        Some(ready.bus_pid),
        "bus.meta names the new bus"
    );
    env.publish("k9.k", "after-restart", &[]);
    let out = second.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 1);
    assert_eq!(out.json_lines()[0]["data"], "after-restart", "{out}");
    assert_eq!(env.busd_pids(), vec![ready.bus_pid], "exactly one busd");
}

#[test]
fn publish_after_kill_9_of_the_daemon_starts_a_new_bus() {
    let env = TestEnv::new();
    env.publish("k9p.k", "first", &[]);
    let old = env.bus_meta_pid().expect("bus.meta after publish");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), Sig::SIGKILL).expect("kill -9 busd");
    assert!(
        dws_tests::wait_pid_gone(old, EXIT_TIMEOUT),
        "busd {old} survived SIGKILL"
    );
    env.publish("k9p.k", "second", &[]);
    let new = env.bus_meta_pid().expect("bus.meta after second publish");
    assert_ne!(new, old);
    assert_eq!(env.busd_pids(), vec![new]);
}

#[test]
fn socket_is_0600_inside_a_0700_dir_at_the_documented_path() {
    let env = TestEnv::new();
    env.publish("perm.k", "x", &[]);
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    assert_eq!(
        socket,
        env.expected_socket_path(),
        "socket path of bus.meta vs the proto::paths rule"
    );
    let uid = nix::unistd::getuid().as_raw();
    let dir = socket.parent().expect("socket dir");
    assert_eq!(
        dir,
        env.run_dir().join(format!("dws-event-{uid}")),
        "<XDG_RUNTIME_DIR>/dws-event-<uid>"
    );
    let leaf = socket
        .file_name()
        .expect("leaf")
        .to_string_lossy()
        .into_owned();
    let hex = leaf.strip_suffix(".sock").expect("ends with .sock");
    assert!(
        hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "leaf {leaf:?} is <16 hex>.sock"
    );

    let dm = std::fs::metadata(dir).expect("stat socket dir");
    assert_eq!(
        dm.permissions().mode() & 0o777,
        0o700,
        "socket dir mode {:o}",
        dm.permissions().mode()
    );
    assert_eq!(dm.uid(), uid, "socket dir owner");
    let sm = std::fs::symlink_metadata(&socket).expect("stat socket");
    assert!(
        sm.file_type().is_socket(),
        "{} is a socket",
        socket.display()
    );
    assert_eq!(
        sm.permissions().mode() & 0o777,
        0o600,
        "socket mode {:o}",
        sm.permissions().mode()
    );
    assert_eq!(sm.uid(), uid, "socket owner");
}

#[test]
fn bus_meta_lock_and_log_are_written_in_the_profile_work_dir() {
    let env = TestEnv::new();
    env.publish("meta.k", "x", &[]);
    let meta = env.bus_meta().expect("bus.meta is JSON");
    for k in ["pid", "version", "profile", "started_at", "socket"] {
        assert!(meta.get(k).is_some(), "bus.meta lacks {k:?}: {meta}");
    }
    assert_eq!(meta["profile"], "default", "{meta}");
    assert_eq!(
        meta["pid"].as_i64().map(|p| p as i32),
        env.busd_pids().first().copied(),
        "{meta}"
    );
    assert!(env.work_dir().join("bus.lock").exists(), "bus.lock");
    assert!(env.work_dir().join("bus.log").exists(), "bus.log");
}

#[test]
fn dry_run_prints_the_resolved_configuration_as_json_and_starts_no_bus() {
    let env = TestEnv::new();
    let out = env
        .dws([
            "event",
            "consume",
            "dry.a",
            "dry.b",
            "--max-events",
            "3",
            "--dry-run",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("--dry-run stdout is not JSON ({e})\n{out}"));
    assert!(v.is_object(), "{out}");
    assert!(
        out.stdout.contains("dry.a") && out.stdout.contains("dry.b"),
        "the event keys are in the config\n{out}"
    );
    assert!(
        env.busd_pids().is_empty(),
        "--dry-run must not start a bus\n{out}"
    );
    assert!(
        env.bus_meta().is_none(),
        "--dry-run must not start a bus\n{out}"
    );
    assert!(
        !env.expected_socket_path().exists(),
        "--dry-run must not create the socket\n{out}"
    );
}

#[test]
fn busd_foreground_serves_consumers_and_exits_0_on_sigterm() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_IDLE_TIMEOUT", "0")]);
    let bus = env.busd(["--foreground"]).spawn();
    let socket = env.expected_socket_path();
    env.wait_until(
        READY_TIMEOUT,
        "busd --foreground to create its socket",
        || socket.exists(),
    );
    assert_eq!(
        env.bus_meta_pid(),
        Some(bus.pid()),
        "bus.meta names the foreground busd"
    );

    let mut c = env
        .dws(["event", "consume", "fg.k", "--max-events", "1"])
        .spawn();
    let ready = c.wait_ready();
    assert_eq!(
        ready.bus_pid,
        bus.pid(),
        "the consumer uses the running foreground bus"
    );
    env.publish("fg.k", "fg", &[]);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("limit", 1);

    bus.signal(Sig::SIGTERM);
    let out = bus.wait_exit(Duration::from_secs(10));
    out.assert_code(0);
    assert!(
        !socket.exists(),
        "busd removes its socket on SIGTERM\n{out}"
    );
}

/// A client that arrives while the bus is exiting (here: just after SIGTERM)
/// must still end up on a working bus: either the old one answers in time or
/// the client spawns a successor, which waits for the old one's lock.
#[test]
fn consumers_arriving_while_the_bus_exits_end_up_on_a_working_bus() {
    let env = TestEnv::new();
    env.publish("exit.k", "warm-up", &[]);
    let old = env.bus_meta_pid().expect("bus.meta after publish");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), Sig::SIGTERM).expect("SIGTERM busd");
    let mut children: Vec<_> = (0..4)
        .map(|_| env.dws(["event", "consume", "exit.k"]).stdin_hold().spawn())
        .collect();
    let readies: Vec<_> = children.iter_mut().map(|c| c.wait_ready()).collect();
    let pid = readies[0].bus_pid;
    assert!(
        readies.iter().all(|r| r.bus_pid == pid),
        "all on one bus: {readies:?}"
    );
    assert_ne!(pid, old, "the SIGTERMed bus must not take new consumers");
    env.publish("exit.k", "after-exit", &[]);
    for c in &mut children {
        let lines = c.wait_stdout_lines(1, EXIT_TIMEOUT);
        assert!(lines[0].contains("after-exit"), "{}", c.report());
    }
}

/// The same race against the idle timer: each consumer starts right about
/// when the previous bus decides it is idle.
#[test]
fn consumers_arriving_at_idle_exit_end_up_on_a_working_bus() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_IDLE_TIMEOUT", "1s")]);
    for round in 0..3 {
        env.publish("idle.race", "spawn", &[]);
        std::thread::sleep(Duration::from_millis(950 + 20 * round));
        let mut c = env
            .dws(["event", "consume", "idle.race", "--max-events", "1"])
            .spawn();
        c.wait_ready();
        env.publish("idle.race", "delivered", &[]);
        let out = c.wait_exit(EXIT_TIMEOUT);
        out.assert_clean_exit("limit", 1);
    }
}

/// Runs the `wire-probe` test binary (connect + Hello) against `socket` as
/// uid/gid 65534 (nobody), through `setpriv`.
fn probe_as_nobody(env: &TestEnv, socket: &std::path::Path) -> dws_tests::Output {
    let probe = dws_tests::bin_dir().join("wire-probe");
    let argv = [
        "--reuid=65534".to_owned(),
        "--regid=65534".to_owned(),
        "--clear-groups".to_owned(),
        probe.to_string_lossy().into_owned(),
        socket.to_string_lossy().into_owned(),
    ];
    env.command("/usr/bin/setpriv", &argv)
        .run_with_timeout(EXIT_TIMEOUT)
}

fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root() && std::path::Path::new("/usr/bin/setpriv").exists()
}

/// Another user cannot reach the socket: its directory is 0700.
#[test]
fn another_user_cannot_reach_the_socket() {
    if !running_as_root() {
        eprintln!("skipped: needs root and setpriv to act as another user");
        return;
    }
    let env = TestEnv::new();
    env.publish("perm.x", "warm-up", &[]);
    let bus = env.bus_meta_pid().expect("bus running");
    let socket = env.bus_meta_socket().expect("socket");
    // Let nobody traverse down to the socket directory, which stays 0700.
    for dir in [env.root().to_path_buf(), env.run_dir()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    }
    let out = probe_as_nobody(&env, &socket);
    assert!(
        out.stdout.starts_with("connect_error Permission denied"),
        "{out}"
    );
    assert_eq!(env.busd_pids(), vec![bus], "the bus is unharmed");
}

/// Even if the socket directory and socket were opened up by hand, the bus
/// checks the peer's uid on every connection and refuses a foreign one with
/// PERMISSION_DENIED, while it keeps serving everyone else.
#[test]
fn the_bus_refuses_a_connection_from_another_uid() {
    if !running_as_root() {
        eprintln!("skipped: needs root and setpriv to act as another user");
        return;
    }
    let env = TestEnv::new();
    let mut consumer = env.dws(["event", "consume", "peer.k"]).stdin_hold().spawn();
    let bus = consumer.wait_ready().bus_pid;
    let socket = env.bus_meta_socket().expect("socket");
    for dir in [
        env.root().to_path_buf(),
        env.run_dir(),
        socket.parent().expect("socket dir").to_path_buf(),
    ] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    }
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
        .expect("chmod socket");
    let out = probe_as_nobody(&env, &socket);
    assert_eq!(
        out.stdout.trim(),
        "error PERMISSION_DENIED connection from another user refused",
        "{out}"
    );
    env.publish("peer.k", "still-served", &[]);
    let lines = consumer.wait_stdout_lines(1, EXIT_TIMEOUT);
    assert!(lines[0].contains("still-served"), "{}", consumer.report());
    assert_eq!(env.busd_pids(), vec![bus]);
}
