//! How a consume run and the bus end, each with its exact exit reason:
//! SIGTERM/SIGINT to the consumer (`signal`), the reader closing stdout
//! (`| head -1`, `signal`), the bus stopped under the consumer
//! (`bus_shutdown`, by SIGTERM or `dws event stop`), and the daemon's idle
//! shutdown once no consumer is attached (socket removed, process gone).

use std::time::Duration;

use dws_tests::{Sig, TestEnv, EXIT_TIMEOUT};

fn signal_mid_run(sig: Sig) {
    let env = TestEnv::new();
    let mut c = env.dws(["event", "consume", "sig.k"]).spawn();
    c.wait_ready();
    env.publish("sig.k", "one", &[]);
    c.wait_stdout_lines(1, EXIT_TIMEOUT);
    c.signal(sig);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", 1);
    assert_eq!(out.stdout_lines().len(), 1, "{out}");
}

#[test]
fn sigterm_mid_run_exits_0_with_reason_signal() {
    signal_mid_run(Sig::SIGTERM);
}

#[test]
fn sigint_mid_run_exits_0_with_reason_signal() {
    signal_mid_run(Sig::SIGINT);
}

#[test]
fn stdout_closed_by_reader_exits_0_with_reason_signal() {
    // dws event consume k | head -1
    let env = TestEnv::new();
    let mut c = env
        .dws(["event", "consume", "head.k"])
        .close_stdout_after_lines(1)
        .spawn();
    c.wait_ready();
    env.publish("head.k", "first", &[]);
    c.wait_stdout_lines(1, EXIT_TIMEOUT);
    // Our read end is closed now; the next writes hit a broken pipe.
    for i in 0..50 {
        if !c.is_running() {
            break;
        }
        env.publish("head.k", &format!("more-{i}"), &[]);
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = c.wait_exit(EXIT_TIMEOUT);
    assert_eq!(out.signal, None, "must not die of SIGPIPE\n{out}");
    out.assert_code(0);
    let ex = out.exited();
    assert_eq!(ex.reason, "signal", "{out}");
    assert!(ex.count >= 1, "{out}");
}

#[test]
fn bus_sigterm_under_a_consumer_ends_it_with_reason_bus_shutdown() {
    let env = TestEnv::new();
    let mut c = env.dws(["event", "consume", "bye.k"]).stdin_hold().spawn();
    let ready = c.wait_ready();
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    assert!(socket.exists(), "socket exists while the bus runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(ready.bus_pid), Sig::SIGTERM)
        .expect("kill busd");
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("bus_shutdown", 0);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after SIGTERM");
    assert!(
        !socket.exists(),
        "a clean bus shutdown removes its socket {}",
        socket.display()
    );
}

#[test]
fn stop_ends_the_bus_and_an_attached_consumer_sees_bus_shutdown() {
    let env = TestEnv::new();
    let mut c = env.dws(["event", "consume", "stop.k"]).spawn();
    c.wait_ready();
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    let stop = env.dws(["event", "stop"]).run_with_timeout(EXIT_TIMEOUT);
    stop.assert_code(0);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("bus_shutdown", 0);
    env.wait_no_busd(EXIT_TIMEOUT, "busd to exit after `dws event stop`");
    assert!(
        !socket.exists(),
        "stop removes the socket {}",
        socket.display()
    );
}

#[test]
fn stop_without_a_bus_is_not_an_error_and_starts_nothing() {
    let env = TestEnv::new();
    let out = env.dws(["event", "stop"]).run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    assert!(
        !out.stderr_lines().iter().any(|l| l.starts_with("Error:")),
        "{out}"
    );
    assert!(
        env.busd_pids().is_empty(),
        "stop must not spawn a bus\n{out}"
    );
}

#[test]
fn idle_timeout_shuts_the_bus_down_after_the_last_consumer_and_removes_the_socket() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_IDLE_TIMEOUT", "2s")]);
    let mut c = env
        .dws(["event", "consume", "idle.k", "--max-events", "1"])
        .spawn();
    let ready = c.wait_ready();
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    env.publish("idle.k", "x", &[]);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("limit", 1);
    // Time-based on purpose: 2 s idle timeout, bounded at ~10 s.
    env.wait_until(
        Duration::from_secs(12),
        "busd to exit on idle timeout (2s)",
        || !dws_tests::is_live(ready.bus_pid),
    );
    assert!(env.busd_pids().is_empty(), "no busd left");
    env.wait_until(
        Duration::from_secs(2),
        "idle shutdown to remove the socket",
        || !socket.exists(),
    );
}

#[test]
fn idle_timeout_does_not_fire_while_a_consumer_is_attached() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_IDLE_TIMEOUT", "2s")]);
    let mut c = env.dws(["event", "consume", "busy.k"]).spawn();
    let ready = c.wait_ready();
    // Time-based on purpose: twice the idle timeout with one consumer attached.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        dws_tests::is_live(ready.bus_pid),
        "bus exited although a consumer was attached\n{}",
        c.report()
    );
    assert!(c.is_running(), "{}", c.report());
    env.publish("busy.k", "still", &[]);
    c.wait_stdout_lines(1, EXIT_TIMEOUT);
    c.signal(Sig::SIGTERM);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("signal", 1);
}

/// Issue 44, item 3: reading status is not activity. With a 2 s idle
/// timeout and `status` every 0.3 s, the bus still leaves about 2 s after
/// the publish that started it (before, it stayed up as long as anyone
/// looked at it).
#[test]
fn status_polling_does_not_keep_an_idle_bus_up() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_IDLE_TIMEOUT", "2s")]);
    env.publish("idle.k", "x", &[]);
    let pid = env.bus_meta_pid().expect("bus.meta names the pid");
    let started = std::time::Instant::now();
    while dws_tests::is_live(pid) && started.elapsed() < Duration::from_secs(12) {
        let _ = env
            .dws(["event", "status", "--format", "json"])
            .run_with_timeout(EXIT_TIMEOUT);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        !dws_tests::is_live(pid),
        "the bus stayed up under status polling for {:?}",
        started.elapsed()
    );
}

/// Issue 44, item 3: with a local source on the disk store, a named
/// subscription does not keep the bus up (it is on disk, and nothing
/// reaches it without a publish, which starts the bus again); on the
/// memory store, where leaving would lose it, it does.
#[test]
fn a_named_subscription_keeps_a_local_bus_up_only_on_the_memory_store() {
    for (store, stays) in [("disk", false), ("memory", true)] {
        let env = TestEnv::with_env(&[
            ("DWS_EVENT_BUS_IDLE_TIMEOUT", "2s"),
            ("DWS_EVENT_BUS_STORE", store),
        ]);
        env.subscribe(&["keep.*", "--id", "kept"]);
        let pid = env.bus_meta_pid().expect("bus.meta names the pid");
        // Time-based on purpose: three times the idle timeout.
        std::thread::sleep(Duration::from_secs(6));
        assert_eq!(dws_tests::is_live(pid), stays, "store {store}");
        if !stays {
            // The next publish starts it again, and the subscription got it.
            env.publish("keep.x", "back", &[]);
            let out = env
                .dws([
                    "event",
                    "consume",
                    "--subscribe-id",
                    "kept",
                    "--max-events",
                    "1",
                ])
                .run_with_timeout(EXIT_TIMEOUT);
            out.assert_code(0);
            assert!(out.stdout.contains("back"), "{out}");
        }
    }
}

#[test]
fn kill_9_of_a_consumer_leaves_its_subscription_resumable_without_loss() {
    let env = TestEnv::new();
    let mut c = env.dws(["event", "consume", "res.k"]).spawn();
    let id = c.wait_ready().subscribe_id;
    env.publish("res.k", "seen", &[]);
    c.wait_stdout_lines(1, EXIT_TIMEOUT);
    c.signal(Sig::SIGKILL);
    let _ = c.wait_exit(EXIT_TIMEOUT);
    // Published while the subscription lingers detached.
    env.publish("res.k", "while-dead", &[]);
    let mut resumed = env
        .dws(["event", "consume", "res.k", "--subscribe-id", &id])
        .spawn();
    assert_eq!(resumed.wait_ready().subscribe_id, id);
    let lines = resumed.wait_stdout_line("the event published while detached", EXIT_TIMEOUT, |l| {
        l.contains("while-dead")
    });
    // "seen" may come again if its ack had not reached the bus: then it is
    // marked redelivered. Nothing else may appear.
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).expect("NDJSON");
        match v["data"].as_str() {
            Some("while-dead") => assert_eq!(v["redelivered"], false, "{l}"),
            Some("seen") => assert_eq!(v["redelivered"], true, "a replayed event is marked: {l}"),
            _ => panic!("unexpected event {l}\n{}", resumed.report()),
        }
    }
    resumed.signal(Sig::SIGTERM);
    resumed.wait_exit(EXIT_TIMEOUT).assert_code(0);
}

/// The reader of stdout goes away while no event is flowing (`… | true`):
/// the consumer notices at once, not at its next event, and ends cleanly
/// with reason `signal`, removing its subscription.
#[test]
fn stdout_closed_while_idle_ends_the_run_without_waiting_for_an_event() {
    let env = TestEnv::new();
    let mut c = env
        .dws(["event", "consume", "idle.close"])
        .stdin_hold()
        .close_stdout_after_lines(0)
        .spawn();
    c.wait_ready();
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", 0);
    let st = env
        .dws(["event", "status", "--format", "json"])
        .run_with_timeout(EXIT_TIMEOUT);
    let doc: serde_json::Value = serde_json::from_str(&st.stdout).expect("status json");
    assert_eq!(doc["subscriptions"], serde_json::json!([]), "{doc:#}");
}

#[test]
fn restart_after_an_install_runs_the_new_build_and_keeps_the_durable_state() {
    // busd from a directory of our own, so the test can "install" over it.
    let bin = tempfile::tempdir().expect("a temp dir");
    let busd = bin.path().join("busd");
    std::fs::copy(dws_tests::busd_bin(), &busd).expect("copy busd");
    let env = TestEnv::with_env(&[("DWS_BUSD", &busd)]);
    env.subscribe(&["up.*", "--id", "s1"]);
    env.subscribe(&["up.*", "--id", "s2"]);
    for i in 0..3 {
        env.publish("up.k", &i.to_string(), &[]);
    }
    let old_pid = env.status()["bus"]["pid"].as_i64().expect("a pid");
    assert_eq!(env.status()["bus"]["executable_replaced"], false);
    let mut c = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--max-events",
            "1",
        ])
        .spawn();
    c.wait_ready();
    c.wait_stdout_lines(1, EXIT_TIMEOUT);
    c.wait_exit(EXIT_TIMEOUT).assert_clean_exit("limit", 1);
    let mut attached = env
        .dws(["event", "consume", "--subscribe-id", "s2"])
        .spawn();
    attached.wait_ready();
    attached.wait_stdout_lines(3, EXIT_TIMEOUT);
    // The install: a new file in place (a new inode, as install(1) and cp
    // to a fresh path do); the running bus still runs the old one.
    std::fs::remove_file(&busd).expect("remove busd");
    std::fs::copy(dws_tests::busd_bin(), &busd).expect("copy busd again");
    let st = env.status();
    assert_eq!(st["bus"]["executable_replaced"], true, "{st:#}");
    let text = env.dws(["event", "status"]).run_with_timeout(EXIT_TIMEOUT);
    assert!(
        text.stdout.contains("dws event restart"),
        "the text status says what to do\n{text}"
    );
    let out = env
        .dws(["event", "restart", "--format", "json"])
        .run_with_timeout(Duration::from_secs(90));
    out.assert_code(0);
    let doc: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(doc["old"]["pid"].as_i64(), Some(old_pid), "{out}");
    let new_pid = doc["new"]["pid"].as_i64().expect("new pid");
    assert_ne!(new_pid, old_pid, "{out}");
    // The attached consumer was told to come back.
    attached
        .wait_exit(EXIT_TIMEOUT)
        .assert_clean_exit("bus_shutdown", 3);
    let st = env.status();
    assert_eq!(st["bus"]["pid"].as_i64(), Some(new_pid), "{st:#}");
    assert_eq!(st["bus"]["executable_replaced"], false, "{st:#}");
    assert_eq!(env.busd_pids(), vec![new_pid as i32]);
    // The subscription and its backlog survived: events 2 and 3 come next.
    let out = env
        .dws([
            "event",
            "consume",
            "--subscribe-id",
            "s1",
            "--max-events",
            "2",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 2);
    let data: Vec<String> = out
        .stdout_lines()
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["data"].to_string())
        .collect();
    assert_eq!(data, ["\"1\"", "\"2\""], "{out}");
}

#[test]
fn restart_without_a_bus_starts_one() {
    let env = TestEnv::new();
    let out = env.dws(["event", "restart"]).run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    assert!(
        out.stdout.starts_with("no bus was running; started pid "),
        "{out}"
    );
    assert_eq!(env.busd_pids().len(), 1);
}

/// Issue 44, item 1: a shell whose environment computes another socket (no
/// or another `XDG_RUNTIME_DIR`: cron, ssh, `sudo -u`) finds the running
/// bus through the socket `bus.meta` records: status says it runs (same
/// pid), doctor does not call it stale, and a publish reaches it instead
/// of failing on its lock.
#[test]
fn another_shells_runtime_dir_finds_the_running_bus_through_bus_meta() {
    let env = TestEnv::new();
    env.publish("other.k", "first", &[]);
    let pid = env.bus_meta_pid().expect("bus.meta names the pid");
    let other = env.root().join("run2");
    std::fs::create_dir(&other).expect("another runtime dir");
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod");
    let elsewhere = |args: &[&str]| {
        env.dws(args)
            .env("XDG_RUNTIME_DIR", &other)
            .run_with_timeout(EXIT_TIMEOUT)
    };
    let st = elsewhere(&["event", "status", "--format", "json"]);
    st.assert_code(0);
    let doc: serde_json::Value = serde_json::from_str(&st.stdout).expect("status JSON");
    assert_eq!(
        (doc["running"].as_bool(), doc["bus"]["pid"].as_i64()),
        (Some(true), Some(pid as i64)),
        "{st}"
    );
    let doctor = elsewhere(&["event", "doctor"]);
    assert!(
        !doctor.stdout.contains("stale") && !doctor.stdout.contains("kill"),
        "{doctor}"
    );
    let published = elsewhere(&["event", "publish", "other.k", "second"]);
    published.assert_code(0);
    assert_eq!(env.busd_pids(), vec![pid], "one bus");
    assert_eq!(env.status()["log"]["head_seq"], 2);
}

/// Issue 44, item 9: `dws event logs [-n N] [-f]` prints the profile's
/// bus.log (a user hunted for the file), its last N lines, and with -f what
/// the bus writes next; a profile whose bus never ran has no log (exit 1).
#[test]
fn logs_prints_the_bus_log_its_tail_and_follows_it() {
    let env = TestEnv::new();
    env.dws(["event", "logs"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_error(1);
    env.publish("log.k", "x", &[]);
    let all = env.dws(["event", "logs"]).run_with_timeout(EXIT_TIMEOUT);
    all.assert_code(0);
    assert!(all.stdout.contains("bus ready"), "{all}");
    let one = env
        .dws(["event", "logs", "-n", "1"])
        .run_with_timeout(EXIT_TIMEOUT);
    one.assert_code(0);
    assert_eq!(one.stdout.lines().count(), 1, "{one}");
    assert!(all.stdout.ends_with(&one.stdout), "{one}");
    let mut f = env.dws(["event", "logs", "-f", "-n", "1"]).spawn();
    f.wait_stdout_lines(1, EXIT_TIMEOUT);
    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    f.wait_stdout_line("the stop, followed", EXIT_TIMEOUT, |l| {
        l.contains("shutting down")
    });
    f.signal(Sig::SIGTERM);
}
