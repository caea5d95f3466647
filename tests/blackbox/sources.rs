//! Profile configuration and the `exec` source, through the real binaries:
//! events from a command's stdout reach consumers, malformed lines are
//! counted and skipped, the command is restarted; every wrong configuration
//! value is a clear `Error:` with its exit code (2 for a bad value, 3 for a
//! secret others can read), and the secret never shows up anywhere.

use std::os::unix::fs::PermissionsExt;

use dws_tests::{TestEnv, EXIT_TIMEOUT};

fn write_config(env: &TestEnv, body: &str, mode: u32) {
    std::fs::create_dir_all(env.cfg_dir()).expect("cfg dir");
    let p = env.cfg_dir().join("config.toml");
    std::fs::write(&p, body).expect("write config.toml");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod config");
}

/// A feed script: three good lines, one malformed, one with a bad type, then
/// it stays alive (so the test controls when it ends).
const FEED: &str = r#"
echo '{"event_type":"feed.a","event_id":"f1","data":{"n":1}}'
echo 'not json'
echo '{"event_type":"feed.*"}'
echo '{"event_type":"feed.b","event_id":"f2","data":"two","headers":{"h":"v"}}'
echo '{"event_type":"feed.a","event_id":"f3"}'
sleep 30
"#;

#[test]
fn exec_source_lines_become_events_and_malformed_lines_are_counted() {
    let env = TestEnv::new();
    let script = env.root().join("feed.sh");
    std::fs::write(&script, FEED).expect("feed script");
    write_config(
        &env,
        &format!(
            "[profiles.default]\nsource = \"exec\"\ncommand = [\"sh\", \"{}\"]\n",
            script.display()
        ),
        0o644,
    );
    let out = env
        .dws([
            "event",
            "consume",
            "feed.*",
            "--from",
            "earliest",
            "--max-events",
            "3",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 3);
    let lines = out.json_lines();
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["event_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["f1", "f2", "f3"], "{out}");
    assert_eq!(
        lines[0]["data"], "{\"n\":1}",
        "non-string data is its JSON text"
    );
    assert_eq!(lines[1]["data"], "two");
    assert_eq!(lines[1]["headers"]["h"], "v");
    assert_eq!(lines[0]["source_id"], "exec");
    let st = env.status();
    assert_eq!(st["source"]["kind"], "exec");
    assert_eq!(st["source"]["state"], "connected", "{st:#}");
    assert_eq!(st["source"]["malformed"], 2, "{st:#}");
}

#[test]
fn exec_source_restarts_the_command_and_dedups_replayed_ids() {
    let env = TestEnv::new();
    write_config(
        &env,
        "[profiles.default]\nsource = \"exec\"\nrestart_min = \"100ms\"\nrestart_max = \"200ms\"\n\
         command = [\"sh\", \"-c\", \"echo '{\\\"event_type\\\":\\\"r.a\\\",\\\"event_id\\\":\\\"same\\\"}'; echo \\\"{\\\\\\\"event_type\\\\\\\":\\\\\\\"r.a\\\\\\\",\\\\\\\"event_id\\\\\\\":\\\\\\\"$$\\\\\\\"}\\\"\"]\n",
        0o644,
    );
    // Each run of the command prints the same id once and a fresh id (its
    // pid): restarts bring new events, the replayed id is dropped.
    let out = env
        .dws([
            "event",
            "consume",
            "r.a",
            "--from",
            "earliest",
            "--max-events",
            "3",
        ])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_clean_exit("limit", 3);
    let lines = out.json_lines();
    let same = lines.iter().filter(|l| l["event_id"] == "same").count();
    assert_eq!(same, 1, "the replayed id is delivered once\n{out}");
    let st = env.status();
    assert!(
        st["source"]["reconnects"].as_u64().unwrap_or(0) >= 1,
        "{st:#}"
    );
    let dups = st["event_types"][0]["duplicates"].as_u64().unwrap_or(0);
    assert!(dups >= 1, "replays are counted as duplicates: {st:#}");
}

#[test]
fn config_errors_are_exit_2_with_the_reason_and_start_no_bus() {
    let cases: &[(&str, &str)] = &[
        ("[profiles.default]\nsource = \"nope\"\n", "unknown source \"nope\""),
        ("[profiles.default]\nsource = \"exec\"\n", "the exec source needs a command"),
        ("[profiles.default]\nsource = \"exec\"\ncomand = [\"x\"]\n", "unknown key `comand` (did you mean `command`?)"),
        (
            "[profiles.default]\nsource = \"exec\"\ncommand = [\"x\"]\nrestart_min = \"soon\"\n",
            "restart_min = \"soon\"",
        ),
        ("[profiles.default\n", "config.toml"),
        ("[profiles.default]\nsource = \"dingtalk\"\n", "needs profiles.default.client_id"),
        (
            "[profiles.default]\nsource = \"dingtalk\"\nclient_id = \"i\"\nclient_secret = \"s\"\nopen_api = \"http://example.com\"\n",
            "plain http is allowed only for loopback hosts",
        ),
        // The personal stream needs the client id of the app that issued
        // the user token, as the reference CLI does.
        (
            "[profiles.default]\nsource = \"personal\"\naccess_token = \"t\"\n",
            "the personal source needs profiles.default.client_id",
        ),
        (
            "[profiles.default]\nsource = \"personal\"\nclient_id = \"c\"\naccess_token = \"t\"\nstream_ticket_mode = \"custom\"\n",
            "stream_ticket_mode = \"custom\" needs the app's client secret",
        ),
        (
            "[profiles.default]\nsource = \"personal\"\nclient_id = \"c\"\naccess_token = \"t\"\noauth_url = \"https://x\"\n",
            "there is no refresh token",
        ),
        // One loopback rule: `[::1]` and all of 127/8 are loopback.
        (
            "[profiles.default]\nsource = \"dingtalk\"\nclient_id = \"i\"\nclient_secret = \"s\"\nopen_api = \"http://[::2]:9\"\n",
            "plain http is allowed only for loopback hosts",
        ),
    ];
    for (body, want) in cases {
        let env = TestEnv::new();
        write_config(&env, body, 0o600);
        let out = env
            .dws(["event", "consume", "k"])
            .run_with_timeout(EXIT_TIMEOUT);
        let line = out.assert_error(2);
        assert!(line.contains("cannot start the bus: "), "{out}");
        assert!(line.contains(want), "expected {want:?} in {line:?}\n{out}");
        assert!(out.stdout.is_empty(), "{out}");
        env.wait_no_busd(EXIT_TIMEOUT, "a bus that failed to start");
    }
}

#[test]
fn a_secret_in_a_readable_file_is_exit_3_and_never_printed() {
    let env = TestEnv::new();
    let canary = "CANARY-s3cr3t-5e1f";
    write_config(
        &env,
        &format!("[profiles.default]\nsource = \"dingtalk\"\nclient_id = \"i\"\nclient_secret = \"{canary}\"\n"),
        0o644,
    );
    let out = env
        .dws(["event", "consume", "k"])
        .run_with_timeout(EXIT_TIMEOUT);
    let line = out.assert_error(3);
    assert!(line.contains("chmod 600"), "{out}");
    assert!(
        !out.stderr.contains(canary) && !out.stdout.contains(canary),
        "{out}"
    );
    let log = std::fs::read_to_string(env.bus_log_path()).unwrap_or_default();
    assert!(!log.contains(canary), "secret in bus.log:\n{log}");

    // A secret file that others can read is refused the same way.
    let secret = env.cfg_dir().join("app.secret");
    std::fs::write(&secret, canary).expect("secret file");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    write_config(
        &env,
        "[profiles.default]\nsource = \"dingtalk\"\nclient_id = \"i\"\nclient_secret_file = \"app.secret\"\n",
        0o644,
    );
    let out = env
        .dws(["event", "consume", "k"])
        .run_with_timeout(EXIT_TIMEOUT);
    let line = out.assert_error(3);
    assert!(line.contains("app.secret"), "{out}");
    assert!(!out.stderr.contains(canary), "{out}");
}

#[test]
fn env_overrides_select_the_source() {
    let env = TestEnv::with_env(&[
        ("DWS_EVENT_SOURCE", "exec"),
        ("DWS_EXEC_COMMAND", "sh -c exit"),
    ]);
    let out = env
        .dws(["event", "consume", "k", "--dry-run"])
        .run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    env.publish("k", "x", &[]);
    let st = env.status();
    assert_eq!(st["source"]["kind"], "exec", "{st:#}");
}
