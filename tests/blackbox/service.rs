//! The bus as a service: systemd socket activation (`LISTEN_FDS`), the
//! watchdog (`WATCHDOG=1` at half of `WATCHDOG_USEC`), a service manager
//! that stops reading or is gone (never a stall, one log line a minute), the units
//! `scripts/install-systemd.sh` renders (checked by `systemd-analyze verify`
//! when it is installed), and `dws event doctor`.
//!
//! The test plays systemd: it binds the profile's socket, passes it to busd
//! as fd 3 and keeps its own copy listening, so after `dws event stop` the
//! next client's connection waits in that socket until the test starts the
//! next busd on it, as systemd would.

use std::{
    os::{
        fd::AsRawFd,
        unix::{
            fs::DirBuilderExt,
            net::{UnixDatagram, UnixListener},
        },
    },
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use dws_tests::common::{repo, tool};
use dws_tests::{Child, Sig, TestEnv, EXIT_TIMEOUT};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

/// Binds `path` as systemd's `ListenStream=` would (its directory 0700).
fn listen_at(path: &Path) -> UnixListener {
    let dir = path.parent().expect("socket has a dir");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .expect("mkdir the socket dir");
    UnixListener::bind(path).expect("bind the socket")
}

/// `busd --foreground`, socket-activated with `listener`.
fn activated_busd(env: &TestEnv, listener: &UnixListener) -> Child {
    env.busd(["--foreground"])
        .listen_fd(listener.as_raw_fd())
        .spawn()
}

/// Waits until a client's connection is queued on `listener`.
fn wait_pending(listener: &UnixListener, what: &str) {
    use nix::libc::{poll, pollfd, POLLIN};
    let mut fds = [pollfd {
        fd: listener.as_raw_fd(),
        events: POLLIN,
        revents: 0,
    }];
    let ms = i32::try_from(T.as_millis()).expect("timeout in ms");
    // SAFETY: one valid pollfd, for the length given.
    let n = unsafe { poll(fds.as_mut_ptr(), 1, ms) };
    assert_eq!(n, 1, "no connection queued on the listening socket: {what}");
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn a_socket_passed_by_systemd_is_served_and_outlives_dws_event_stop() {
    let env = TestEnv::new();
    let socket = env.expected_socket_path();
    let listener = listen_at(&socket);
    let first = activated_busd(&env, &listener);
    // dws connects to the socket the test holds; the activated bus answers.
    let st = env.status();
    assert_eq!(st["bus"]["pid"], first.pid(), "{st:#}\n{}", first.report());
    let reply = env.publish("sa.k", "kept", &[]);
    assert_eq!(reply["seq"], 1, "{reply}");

    env.dws(["event", "stop"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    first.wait_exit(EXIT_TIMEOUT).assert_code(0);
    assert!(
        socket.exists(),
        "an activated bus leaves systemd's socket in place"
    );

    // A bus started by hand (or by a dws whose wait ran out) leaves the
    // socket systemd listens on to the bus systemd starts.
    let by_hand = env.busd(["--foreground"]).run_with_timeout(EXIT_TIMEOUT);
    by_hand.assert_code(0);
    assert!(
        by_hand.stderr.contains("service manager"),
        "says why it left\n{by_hand}"
    );
    wait_pending(
        &listener,
        "the by-hand bus's probe reached systemd's socket",
    );
    drop(listener.accept().expect("accept the probe"));
    // The doctor tells a socket unit whose service does not start.
    let (code, doc, _) = doctor_json(&env);
    assert_eq!(code, Some(1), "{doc:#}");
    assert_eq!(status_of(&doc, "bus", "default"), "fail");
    let hint = checks(&doc, "bus", "default")[0]["hint"].to_string();
    assert!(hint.contains("systemctl --user status"), "{hint}");

    // The next client does not spawn a bus of its own: its connection waits
    // in systemd's socket, which starts the unit again.
    let waiting = env.dws(["event", "status", "--format", "json"]).spawn();
    wait_pending(&listener, "the client after `stop`");
    assert!(
        env.busd_pids().is_empty(),
        "dws spawned a bus of its own: {:?}",
        env.busd_pids()
    );
    let second = activated_busd(&env, &listener);
    let out = waiting.wait_exit(EXIT_TIMEOUT);
    out.assert_code(0);
    let st = json_of(&out.stdout);
    assert_eq!(st["bus"]["pid"], second.pid(), "{st:#}");
    assert_eq!(st["log"]["head_seq"], 1, "the store survived: {st:#}");
    assert_eq!(env.busd_pids(), vec![second.pid()]);
    second.signal(Sig::SIGTERM);
    second.wait_exit(EXIT_TIMEOUT).assert_code(0);
}

#[test]
fn a_socket_bound_where_dws_does_not_look_is_refused() {
    let env = TestEnv::new();
    let elsewhere = env.root().join("elsewhere").join("bus.sock");
    let listener = listen_at(&elsewhere);
    let out = activated_busd(&env, &listener).wait_exit(EXIT_TIMEOUT);
    out.assert_code(1);
    let want = format!("ListenStream={}", env.expected_socket_path().display());
    assert!(out.stderr.contains(&want), "names what to set\n{out}");
    assert!(env.busd_pids().is_empty());
}

/// A fake service manager's notify socket.
fn notify_socket(env: &TestEnv) -> (UnixDatagram, PathBuf) {
    let path = env.root().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    (sock, path)
}

#[test]
fn the_watchdog_is_pinged_while_the_bus_serves() {
    let env = TestEnv::new();
    let (sock, path) = notify_socket(&env);
    // 400 ms: busd pings every 200 ms.
    let bus = env
        .busd(["--foreground"])
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000")
        .spawn();
    let deadline = Instant::now() + T;
    let (mut pings, mut ready) = (0, false);
    while pings < 3 {
        assert!(
            Instant::now() < deadline,
            "{pings} WATCHDOG=1 so far\n{}",
            bus.report()
        );
        let mut buf = [0u8; 4096];
        if let Ok(n) = sock.recv(&mut buf) {
            let d = String::from_utf8_lossy(&buf[..n]).into_owned();
            ready |= d.lines().any(|l| l == "READY=1");
            if d.lines().any(|l| l == "WATCHDOG=1") {
                assert!(ready, "pings start once the bus serves");
                pings += 1;
            }
        }
    }
    bus.signal(Sig::SIGTERM);
    bus.wait_exit(EXIT_TIMEOUT).assert_code(0);
}

#[test]
fn a_service_manager_that_stops_reading_never_stalls_the_bus() {
    let env = TestEnv::new();
    // A notify socket nobody reads: its queue fills within a few pings.
    let (_stalled, path) = notify_socket(&env);
    let mut bus = env
        .busd(["--foreground"])
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "20000")
        .spawn();
    bus.wait_stderr_line("the bus serving", T, |l| l.contains("bus ready"));
    // Far past the point where the queue is full (the stall began at 6 s
    // with a 2 s watchdog; here pings go every 10 ms).
    std::thread::sleep(Duration::from_secs(2));
    let mut consumer = env.dws(["event", "consume", "svc.*"]).stdin_hold().spawn();
    consumer.wait_ready();
    for i in 0..5 {
        let started = Instant::now();
        env.publish("svc.x", &format!("while-stalled-{i}"), &[]);
        assert!(started.elapsed() < T, "{:?}", started.elapsed());
    }
    consumer.wait_stdout_line("the last event", T, |l| l.contains("while-stalled-4"));
    bus.signal(Sig::SIGTERM);
    let out = bus.wait_exit(EXIT_TIMEOUT);
    out.assert_code(0);
    // Dropped notifications are logged at most once a minute.
    let said = out
        .stderr
        .lines()
        .filter(|l| l.contains("cannot notify the service manager"))
        .count();
    assert!(said <= 1, "{said} lines\n{out}");
}

#[test]
fn a_notify_socket_that_is_gone_is_logged_once_a_minute_not_per_ping() {
    let env = TestEnv::new();
    let gone = env.root().join("no-such-notify.sock");
    let bus = env
        .busd(["--foreground"])
        .env("NOTIFY_SOCKET", &gone)
        .env("WATCHDOG_USEC", "20000")
        .spawn();
    env.wait_until(T, "the bus to serve", || {
        env.dws(["event", "status"]).run_with_timeout(T).code == Some(0)
    });
    // About 200 pings.
    std::thread::sleep(Duration::from_secs(2));
    bus.signal(Sig::SIGTERM);
    let out = bus.wait_exit(EXIT_TIMEOUT);
    out.assert_code(0);
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    let said = log
        .lines()
        .filter(|l| l.contains("cannot notify the service manager"))
        .count();
    assert!((1..=2).contains(&said), "{said} lines\n{log}");
}

/// Runs `scripts/install-systemd.sh --no-enable` for the binaries in `bin`
/// into `units`; the paths of the socket and service units.
fn render_units(env: &TestEnv, bin: &Path, units: &Path) -> (PathBuf, PathBuf) {
    let out = env
        .command(
            repo().join("scripts/install-systemd.sh"),
            [
                "--bin".as_ref(),
                bin.as_os_str(),
                "--unit-dir".as_ref(),
                units.as_os_str(),
                "--no-enable".as_ref(),
            ],
        )
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    (
        units.join("dws-bus@default.socket"),
        units.join("dws-bus@default.service"),
    )
}

/// A prefix as `scripts/install.sh --root DIR` leaves it: DIR/bin/{busd,dws}
/// (links to the built ones) and their man pages in DIR/share/man/man1.
fn installed_prefix(env: &TestEnv) -> PathBuf {
    let prefix = env.root().join("prefix");
    let bin = prefix.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir prefix/bin");
    for b in ["busd", "dws"] {
        std::os::unix::fs::symlink(dws_tests::bin_dir().join(b), bin.join(b)).expect("link");
    }
    let man1 = prefix.join("share/man/man1");
    env.command(
        bin.join("busd"),
        ["--generate-man".as_ref(), man1.as_os_str()],
    )
    .run_with_timeout(EXIT_TIMEOUT)
    .assert_code(0);
    env.command(bin.join("dws"), ["manpages".as_ref(), man1.as_os_str()])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_code(0);
    prefix
}

/// `systemd-analyze --user verify` of `units`, its man page checks on,
/// with a PATH that does not name the prefix and no MANPATH (so `man`
/// finds a page only where the unit says it is); skipped when the tool is
/// absent (not under CI).
fn assert_units_verify(env: &TestEnv, units: &[&Path]) {
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    let out = Command::new(analyze)
        .args(["--user", "verify"])
        .args(units)
        .env("HOME", env.home_dir())
        .env("XDG_RUNTIME_DIR", env.run_dir())
        .env("PATH", "/usr/bin:/bin")
        .env_remove("MANPATH")
        .output()
        .expect("run systemd-analyze");
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The comment lines of a unit, in order.
fn comments(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with('#')).collect()
}

#[test]
fn install_systemd_renders_the_units_with_real_paths_and_they_verify() {
    let env = TestEnv::new();
    let prefix = installed_prefix(&env);
    let bin = prefix.join("bin");
    let (socket_unit, service_unit) = render_units(&env, &bin, &env.root().join("units"));
    let socket = std::fs::read_to_string(&socket_unit).expect("the socket unit");
    let service = std::fs::read_to_string(&service_unit).expect("the service unit");
    let busd = bin.join("busd");
    let cfg = env.cfg_dir();
    let man1 = prefix.join("share/man/man1");
    let docs = format!(
        "Documentation=man:{} man:{}",
        man1.join("busd.1").display(),
        man1.join("dws.1").display()
    );
    for (text, want) in [
        (
            &socket,
            format!("ListenStream={}", env.expected_socket_path().display()),
        ),
        (&socket, "SocketMode=0600".to_owned()),
        (&socket, docs.clone()),
        (
            &service,
            format!("ExecStart={} --foreground --profile %i", busd.display()),
        ),
        (
            &service,
            format!("Environment=DWS_CONFIG_DIR={}", cfg.display()),
        ),
        (&service, format!("ReadWritePaths={} %t", cfg.display())),
        (&service, "Type=notify".to_owned()),
        (&service, "WatchdogSec=30s".to_owned()),
        (&service, "SystemCallFilter=@system-service".to_owned()),
        (&service, "Requires=dws-bus@%i.socket".to_owned()),
        (&service, docs.clone()),
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "a unit has {want:?}:\n{text}"
        );
    }
    for (text, template) in [(&socket, "dws-bus@.socket"), (&service, "dws-bus@.service")] {
        let template = std::fs::read_to_string(repo().join("contrib/systemd").join(template))
            .expect("the template");
        assert!(
            !text.contains("%h/")
                && !text.lines().filter(|l| !l.starts_with('#')).any(|l| {
                    ["@BUSD@", "@SOCKET@", "@CONFIG_ROOT@", "@DOCUMENTATION@"]
                        .iter()
                        .any(|p| l.contains(p))
                }),
            "every path substituted:\n{text}"
        );
        assert_eq!(
            comments(text),
            comments(&template),
            "the comments are the template's, placeholders and all"
        );
        assert!(!text.lines().any(|l| l.starts_with("PrivateTmp=")));
    }
    assert_units_verify(&env, &[&socket_unit, &service_unit]);
}

#[test]
fn install_systemd_without_installed_man_pages_names_none_and_the_units_verify() {
    let env = TestEnv::new();
    // The build directory has no share/man beside it.
    let (socket_unit, service_unit) =
        render_units(&env, &dws_tests::bin_dir(), &env.root().join("units"));
    for unit in [&socket_unit, &service_unit] {
        let text = std::fs::read_to_string(unit).expect("the unit");
        assert!(
            !text.lines().any(|l| l.starts_with("Documentation=")),
            "no Documentation= naming pages that are not installed:\n{text}"
        );
    }
    assert_units_verify(&env, &[&socket_unit, &service_unit]);
}

// ------------------------------------------------------------------ doctor

/// `dws event doctor --format json`: its exit code and document, validated
/// against `schemas/doctor.schema.json`.
fn doctor_json(env: &TestEnv) -> (Option<i32>, Value, String) {
    let out = env
        .dws(["event", "doctor", "--format", "json"])
        .run_with_timeout(Duration::from_secs(60));
    let doc = json_of(out.stdout.trim());
    crate::ecosystem::assert_valid("doctor", &doc);
    (out.code, doc, out.stderr.clone())
}

/// The checks named `name` about `profile`.
fn checks<'a>(doc: &'a Value, name: &str, profile: &str) -> Vec<&'a Value> {
    doc["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["check"] == name && c["profile"] == profile)
        .collect()
}

fn status_of(doc: &Value, name: &str, profile: &str) -> String {
    let found = checks(doc, name, profile);
    assert_eq!(found.len(), 1, "one {name} check for {profile}: {doc:#}");
    found[0]["status"].as_str().expect("status").to_owned()
}

#[test]
fn doctor_checks_every_profile_on_its_own_and_one_typo_blocks_no_other() {
    let env = TestEnv::new();
    let cfg = env.cfg_dir();
    std::fs::create_dir_all(&cfg).expect("mkdir cfg");
    let loose = env.root().join("loose.secret");
    std::fs::write(&loose, "CANARY-LOOSE\n").expect("write");
    let private = env.root().join("private.secret");
    std::fs::write(&private, "CANARY-PRIVATE\n").expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    std::fs::write(
        cfg.join("config.toml"),
        format!(
            "[profiles.typo]\nsoruce = \"local\"\n\n\
             [profiles.good]\nsource = \"local\"\n\n\
             [profiles.loose]\nsource = \"dingtalk\"\nclient_id = \"id\"\nclient_secret_file = \"{}\"\n\n\
             [profiles.offline]\nsource = \"dingtalk\"\nclient_id = \"id\"\nclient_secret_file = \"{}\"\n\
             open_api = \"http://127.0.0.1:{port}\"\n",
            loose.display(),
            private.display()
        ),
    )
    .expect("write config.toml");

    // Before: the typo in [profiles.typo] made every profile exit 2.
    for profile in ["good", "default"] {
        env.dws(["--profile", profile, "event", "publish", "d.k", "x"])
            .run_with_timeout(EXIT_TIMEOUT)
            .assert_code(0);
    }
    let err = env
        .dws(["--profile", "typo", "event", "publish", "d.k", "x"])
        .run_with_timeout(EXIT_TIMEOUT)
        .assert_error(2);
    assert!(
        err.contains("[profiles.typo]") && err.contains("soruce"),
        "{err}"
    );

    let (code, doc, stderr) = doctor_json(&env);
    assert_eq!(code, Some(1), "a failed check is exit 1: {doc:#}");
    assert_eq!(doc["ok"], false);
    assert!(
        stderr.starts_with("Error: ") && stderr.lines().count() == 1,
        "one Error: line: {stderr}"
    );
    assert_eq!(status_of(&doc, "config", "typo"), "fail");
    assert_eq!(status_of(&doc, "config", "good"), "ok");
    assert_eq!(status_of(&doc, "config", "default"), "ok");
    assert_eq!(status_of(&doc, "config", "loose"), "fail");
    assert!(
        checks(&doc, "config", "loose")[0]["hint"]
            .as_str()
            .is_some_and(|h| h.contains("chmod 600")),
        "{doc:#}"
    );
    assert_eq!(status_of(&doc, "config", "offline"), "ok");
    // An upstream that does not answer is a warning, never a failure.
    assert_eq!(status_of(&doc, "upstream", "offline"), "warn");
    assert_eq!(status_of(&doc, "bus", "default"), "ok");
    assert_eq!(status_of(&doc, "store", "default"), "ok");
    let text = doc.to_string();
    assert!(!text.contains("CANARY"), "no secret in the report: {text}");

    // Text: one line per check, the failing one says what to do.
    let out = env
        .dws(["event", "doctor"])
        .run_with_timeout(Duration::from_secs(60));
    out.assert_code(1);
    assert_eq!(
        out.stdout.lines().count(),
        doc["checks"].as_array().map_or(0, Vec::len),
        "{out}"
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("fail  config (profile typo): ") && l.contains("soruce")),
        "{out}"
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("warn  upstream (profile offline): ")),
        "{out}"
    );

    // With the bad profiles fixed, only warnings remain: exit 0.
    std::fs::write(
        cfg.join("config.toml"),
        format!(
            "[profiles.offline]\nsource = \"dingtalk\"\nclient_id = \"id\"\nclient_secret_file = \"{}\"\n\
             open_api = \"http://127.0.0.1:{port}\"\n",
            private.display()
        ),
    )
    .expect("write config.toml");
    let (code, doc, _) = doctor_json(&env);
    assert_eq!(code, Some(0), "{doc:#}");
    assert_eq!(doc["ok"], true);
}

#[test]
fn doctor_finds_a_stale_bus_a_socket_with_no_process_and_a_loose_directory() {
    use nix::{sys::signal::kill, unistd::Pid};
    let env = TestEnv::new();
    let (code, doc, _) = doctor_json(&env);
    assert_eq!(code, Some(0), "a fresh setup is fine: {doc:#}");
    assert_eq!(status_of(&doc, "bus", "default"), "ok");
    assert!(env.busd_pids().is_empty(), "doctor starts no bus");

    env.publish("st.k", "x", &[]);
    let pid = env.status()["bus"]["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .expect("bus pid");
    // A stopped bus holds the lock and never answers.
    kill(Pid::from_raw(pid), Sig::SIGSTOP).expect("SIGSTOP");
    let (code, doc, _) = doctor_json(&env);
    kill(Pid::from_raw(pid), Sig::SIGCONT).expect("SIGCONT");
    assert_eq!(code, Some(1), "{doc:#}");
    assert_eq!(status_of(&doc, "bus", "default"), "fail");
    let msg = checks(&doc, "bus", "default")[0]["message"].to_string();
    assert!(
        msg.contains("stale") && msg.contains(&pid.to_string()),
        "{msg}"
    );

    // kill -9 leaves the socket file with no process behind it: a warning.
    kill(Pid::from_raw(pid), Sig::SIGKILL).expect("SIGKILL");
    env.wait_no_busd(T, "the killed bus is gone");
    assert!(env.expected_socket_path().exists());
    let (code, doc, _) = doctor_json(&env);
    assert_eq!(code, Some(0), "{doc:#}");
    assert_eq!(status_of(&doc, "bus", "default"), "warn");
    assert!(env.busd_pids().is_empty(), "doctor starts no bus");

    // A work directory others can write is refused by the bus: a failure.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.work_dir(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let (code, doc, _) = doctor_json(&env);
    assert_eq!(code, Some(1), "{doc:#}");
    assert_eq!(status_of(&doc, "work_dir", "default"), "fail");
    let hint = checks(&doc, "work_dir", "default")[0]["hint"].to_string();
    assert!(hint.contains("chmod 700"), "{hint}");
}

/// Issue 36 row 12: the doctor opens the store's files as busd does: a FIFO
/// at `store/FORMAT` hung it (it waited for a writer), a symlink to
/// `/dev/zero` read until memory ran out. Now each is one failed check at
/// once, as is a file far larger than a format file can be.
#[test]
fn doctor_refuses_a_fifo_a_symlink_or_a_huge_file_as_the_store_format_file() {
    let env = TestEnv::new();
    let store = env.work_dir().join("store");
    std::fs::create_dir_all(&store).expect("mkdir store");
    let format = store.join("FORMAT");
    nix::unistd::mkfifo(&format, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let expect_fail = |what: &str| {
        let (code, doc, _) = doctor_json(&env);
        assert_eq!(code, Some(1), "{what}: {doc:#}");
        assert_eq!(status_of(&doc, "store", "default"), "fail", "{what}");
        let msg = checks(&doc, "store", "default")[0]["message"].to_string();
        assert!(msg.contains(what), "{what}: {msg}");
        assert!(env.busd_pids().is_empty(), "doctor starts no bus");
    };
    expect_fail("a FIFO");
    std::fs::remove_file(&format).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", &format).expect("symlink");
    expect_fail("a symbolic link");
    std::fs::remove_file(&format).expect("rm");
    std::fs::write(&format, vec![b'1'; 1 << 20]).expect("write");
    expect_fail("1048576 bytes");
}
