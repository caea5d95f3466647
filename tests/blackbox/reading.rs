//! Reading the bus without a consume run's defaults: `consume` and
//! `subscribe --from TIME` (RFC 3339), `dws event get SEQ`, `dws event
//! subscription list` / `info ID` (against their JSON Schemas), and
//! `consume --data json`.

use dws_tests::common::*;
use dws_tests::{Output, TestEnv, EXIT_TIMEOUT};
use serde_json::{json, Value};

use crate::ecosystem::assert_valid;

/// `dws ARGS` run to completion.
fn dws(env: &TestEnv, args: &[&str]) -> Output {
    env.dws(args).run_with_timeout(EXIT_TIMEOUT)
}

/// `dws event get SEQ [extra]` that must succeed: the one JSON line.
fn get(env: &TestEnv, seq: u64, extra: &[&str]) -> Value {
    let seq = seq.to_string();
    let mut args = vec!["event", "get", seq.as_str()];
    args.extend_from_slice(extra);
    let out = dws(env, &args);
    out.assert_code(0);
    let lines = out.json_lines();
    assert_eq!(lines.len(), 1, "get prints one line\n{out}");
    lines[0].clone()
}

/// Unix ms as RFC 3339 UTC with milliseconds (`…T12:00:00.123Z`).
fn rfc3339(ms: u64) -> String {
    let (days, rest) = (ms / 86_400_000, ms % 86_400_000);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000
    )
}

#[test]
fn rfc3339_of_known_times() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339(1_796_040_000_250), "2026-11-30T12:00:00.250Z");
    assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
}

/// Publishes `ids` (data = the id) and returns their seqs.
fn publish_all(env: &TestEnv, ids: &[&str]) -> Vec<u64> {
    ids.iter()
        .map(|id| u64_of(&env.publish("rd.x", id, &["--id", id]), "seq"))
        .collect()
}

/// The `received_at_unix_ms` of the retained event `seq`.
fn received_at(env: &TestEnv, seq: u64) -> u64 {
    u64_of(&get(env, seq, &[]), "received_at_unix_ms")
}

/// Publishes a, b, then (once the clock moved past b's time) c, d; returns
/// the seqs and the time c was received.
fn two_batches(env: &TestEnv) -> (Vec<u64>, u64) {
    let mut seqs = publish_all(env, &["a", "b"]);
    let b_at = received_at(env, seqs[1]);
    env.wait_until(EXIT_TIMEOUT, "the clock to pass b's time", || {
        now_ms() > b_at + 2
    });
    seqs.extend(publish_all(env, &["c", "d"]));
    let c_at = received_at(env, seqs[2]);
    assert!(c_at > b_at, "c received after b: {c_at} > {b_at}");
    (seqs, c_at)
}

#[test]
fn consume_from_a_time_starts_at_the_first_event_received_at_or_after_it() {
    let env = TestEnv::new();
    let (seqs, c_at) = two_batches(&env);
    let from = rfc3339(c_at);
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "rd.*",
            "--from",
            &from,
            "--max-events",
            "2",
        ],
    );
    out.assert_clean_exit("limit", 2);
    let events = complete_events(&out);
    assert_eq!(ids_of(&events), ["c", "d"], "{out}");
    assert_eq!(u64_of(&events[0], "seq"), seqs[2]);

    // The same instant written with an offset (+08:00 or -08:00, whichever
    // keeps the date).
    let (date, time) = from.split_once('T').expect("a T");
    let hour: u64 = time[..2].parse().expect("an hour");
    let rest = &time[2..time.len() - 1];
    let shifted = if hour < 16 {
        format!("{date}T{:02}{rest}+08:00", hour + 8)
    } else {
        format!("{date}T{:02}{rest}-08:00", hour - 8)
    };
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "rd.*",
            "--from",
            &shifted,
            "--max-events",
            "2",
        ],
    );
    out.assert_clean_exit("limit", 2);
    assert_eq!(ids_of(&complete_events(&out)), ["c", "d"], "{out}");

    // A time older than the log: from the oldest retained event, no gap line.
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "rd.*",
            "--from",
            "2000-01-01T00:00:00Z",
            "--max-events",
            "4",
        ],
    );
    out.assert_clean_exit("limit", 4);
    assert_eq!(ids_of(&complete_events(&out)), ["a", "b", "c", "d"]);
    assert!(!out.stderr.contains("gap"), "{out}");

    // A named subscription from a time, consumed later.
    subscribe_ok(&env, &["rd.*", "--id", "t1", "--from", &from], "t1");
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "--subscribe-id",
            "t1",
            "--max-events",
            "2",
        ],
    );
    out.assert_clean_exit("limit", 2);
    assert_eq!(ids_of(&complete_events(&out)), ["c", "d"], "{out}");

    // A time after the newest event: the next event.
    subscribe_ok(
        &env,
        &["rd.*", "--id", "t2", "--from", &rfc3339(now_ms() + 60_000)],
        "t2",
    );
    publish_all(&env, &["e"]);
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "--subscribe-id",
            "t2",
            "--max-events",
            "1",
        ],
    );
    out.assert_clean_exit("limit", 1);
    assert_eq!(ids_of(&complete_events(&out)), ["e"], "{out}");

    // Not a time: a usage error naming the forms.
    let out = dws(&env, &["event", "consume", "rd.*", "--from", "yesterday"]);
    out.assert_code(2);
    assert!(out.stderr.contains("a time like"), "{out}");
}

#[test]
fn get_prints_one_retained_event_by_seq_and_exit_1_when_it_is_not_retained() {
    let env = TestEnv::new();
    // No bus: nothing is retained, and none is started.
    let out = dws(&env, &["event", "get", "1"]);
    out.assert_code(1);
    assert_eq!(
        out.stderr, "Error: seq 1 is not retained (bus not running)\n",
        "{out}"
    );
    assert!(env.busd_pids().is_empty(), "get starts no bus");

    let seqs = publish_all(&env, &["a", "b", "c"]);
    let line = get(&env, seqs[1], &[]);
    assert_valid("event", &line);
    assert_eq!(line["seq"], seqs[1]);
    assert_eq!(line["event_id"], "b");
    assert_eq!(line["data"], "b");
    assert_eq!(line["event_type"], "rd.x");
    assert!(line.get("subscribe_id").is_none(), "{line}");

    // Byte for byte what consume writes, less the per-delivery fields.
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "rd.*",
            "--from",
            "earliest",
            "--max-events",
            "3",
        ],
    );
    let mut consumed = complete_events(&out)[1].clone();
    let obj = consumed.as_object_mut().expect("an object");
    obj.remove("subscribe_id");
    obj.remove("delivery");
    assert_eq!(line, consumed);

    // Past the head: no event has it yet (issue 44 item 7: it said "not
    // retained").
    let head = env.status()["log"]["head_seq"].as_u64().unwrap_or(0);
    let out = dws(&env, &["event", "get", "99"]);
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        format!("Error: seq 99 is beyond the head, {head} (no event has it yet)\n"),
        "{out}"
    );
    assert!(out.stdout.is_empty(), "{out}");
    // Seq 0 is no seq at all (issue 34 item 7: it said "not retained").
    for bad in ["0", "x"] {
        let out = dws(&env, &["event", "get", bad]);
        out.assert_code(2);
    }
}

#[test]
fn get_of_a_seq_retention_evicted_is_exit_1_and_a_time_before_the_log_starts_at_the_oldest() {
    let env = TestEnv::with_env(&[("DWS_EVENT_BUS_RETENTION_EVENTS", "3")]);
    let seqs = publish_all(&env, &["a", "b", "c", "d", "e"]);
    env.wait_status(EXIT_TIMEOUT, "retention keeps 3 events", |st| {
        st["log"]["events"] == 3
    });
    let out = dws(&env, &["event", "get", &seqs[1].to_string()]);
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        format!("Error: seq {} is not retained\n", seqs[1]),
        "{out}"
    );
    assert_eq!(get(&env, seqs[2], &[])["event_id"], "c");
    // From a time before every event: the oldest retained, no gap line.
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "rd.*",
            "--from",
            "2000-01-01T00:00:00Z",
            "--max-events",
            "3",
        ],
    );
    out.assert_clean_exit("limit", 3);
    assert_eq!(ids_of(&complete_events(&out)), ["c", "d", "e"], "{out}");
}

#[test]
fn subscription_list_and_info_show_each_subscription_and_match_their_schemas() {
    let env = TestEnv::new();
    // No bus: said as `status` says it (issue 34 item 4: `list` printed a
    // bare header, exit 0, as if there were no subscriptions, while the
    // named ones wait on disk for the next bus), and nothing is started.
    let socket = env.expected_socket_path().display().to_string();
    let out = dws(&env, &["event", "subscription", "list"]);
    out.assert_code(0);
    assert_eq!(
        out.stdout,
        format!("bus not running (profile default, socket {socket})\n"),
        "{out}"
    );
    let status = dws(&env, &["event", "status"]);
    assert_eq!(out.stdout, status.stdout, "one behaviour");
    let out = dws(&env, &["event", "subscription", "list", "--format", "json"]);
    out.assert_code(0);
    let doc: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        doc,
        json!({"running": false, "profile": "default", "socket": socket})
    );
    assert_valid("subscription-list", &doc);
    let out = dws(&env, &["event", "subscription", "info", "s1"]);
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "Error: cannot show subscription s1: bus not running (profile default, socket {socket})\n"
        )
    );
    assert!(env.busd_pids().is_empty(), "reading starts no bus");

    subscribe_ok(&env, &["rd.*,other", "--id", "s1"], "s1");
    subscribe_ok(
        &env,
        &[
            "rd.x",
            "--id",
            "s2",
            "--max-deliver",
            "1",
            "--on-poison",
            "park",
        ],
        "s2",
    );
    publish_all(&env, &["a", "b"]);
    dws(&env, &["event", "subscription", "disable", "s2"]).assert_code(0);

    let out = dws(&env, &["event", "subscription", "list"]);
    out.assert_code(0);
    let lines = out.stdout_lines();
    assert_eq!(lines.len(), 3, "a header and one line each\n{out}");
    let cells = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert_eq!(
        cells(lines[0]),
        ["ID", "STATE", "KEYS", "LAG", "PENDING", "CONSUMER"]
    );
    let rows: Vec<Vec<String>> = lines[1..].iter().map(|l| cells(l)).collect();
    assert!(
        rows.contains(
            &["s1", "active", "rd.*,other", "2", "2", "detached"]
                .map(String::from)
                .to_vec()
        ),
        "{out}"
    );
    assert!(
        rows.contains(
            &["s2", "disabled", "rd.x", "2", "2", "detached"]
                .map(String::from)
                .to_vec()
        ),
        "{out}"
    );

    let list: Value = serde_json::from_str(
        &dws(&env, &["event", "subscription", "list", "--format", "json"]).stdout,
    )
    .expect("list --format json is JSON");
    assert_valid("subscription-list", &list);
    assert_eq!(list.as_array().map(Vec::len), Some(2), "{list:#}");

    let out = dws(
        &env,
        &["event", "subscription", "info", "s2", "--format", "json"],
    );
    out.assert_code(0);
    let info: Value = serde_json::from_str(&out.stdout).expect("info --format json is JSON");
    assert_valid("subscription-info", &info);
    let status = env.status();
    let entry = listed(&status, "s2");
    for k in [
        "id",
        "patterns",
        "state",
        "cursor",
        "pending",
        "max_deliver",
        "on_poison",
    ] {
        assert_eq!(info[k], entry[k], "{k}: info as in status");
    }

    let out = dws(&env, &["event", "subscription", "info", "s2"]);
    out.assert_code(0);
    for line in [
        "id: s2",
        "state: disabled",
        "pending: 2",
        "on_poison: park",
        "patterns: [\"rd.x\"]",
    ] {
        assert!(out.stdout_lines().contains(&line), "{line:?}\n{out}");
    }

    let out = dws(&env, &["event", "subscription", "info", "nope"]);
    out.assert_code(1);
    assert_eq!(out.stderr, "Error: subscription nope not found\n", "{out}");
    assert!(out.stdout.is_empty());
}

/// Issue 34 item 4: text output is for people — durations like `59m 20s`
/// (not `3560.5s`), times in local RFC 3339 (not `1796341920057`); JSON
/// keeps its numbers.
#[test]
fn text_output_shows_durations_and_local_times_for_people_and_json_keeps_numbers() {
    // A fixed zone 8 hours east of UTC, without tzdata.
    let env = TestEnv::with_env(&[("TZ", "XYZ-8")]);
    subscribe_ok(&env, &["rd.*", "--id", "s1", "--ttl", "2h"], "s1");
    publish_all(&env, &["a"]);
    let text = dws(&env, &["event", "status"]);
    text.assert_code(0);
    let seconds_with_a_point = regex_lite(&text.stdout);
    assert!(
        seconds_with_a_point.is_empty(),
        "durations as people read them, not {seconds_with_a_point:?}\n{text}"
    );
    let bus_line = text.stdout.lines().next().unwrap_or_default();
    assert!(bus_line.contains(" up "), "{bus_line}");
    let out = dws(&env, &["event", "subscription", "info", "s1"]);
    out.assert_code(0);
    let line = |key: &str| -> String {
        out.stdout_lines()
            .iter()
            .find(|l| l.starts_with(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("no {key} line\n{out}"))
            .to_string()
    };
    for key in ["detached_since", "created_at"] {
        let l = line(key);
        let t = l.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            t.len() == 25 && t.ends_with("+08:00") && t.as_bytes()[10] == b'T',
            "{l}"
        );
    }
    assert_eq!(line("ttl"), "ttl: 2h");
    assert!(!out.stdout.contains("_unix_ms"), "{out}");
    let json = dws(
        &env,
        &["event", "subscription", "info", "s1", "--format", "json"],
    );
    let doc: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert!(doc["detached_since_unix_ms"].is_u64(), "{doc:#}");
    assert_eq!(doc["ttl_ms"], 7_200_000);
}

/// Every `<digits>.<digit>s` in `text`: a duration printed as fractional
/// seconds.
fn regex_lite(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut found = vec![];
    for (i, w) in b.windows(3).enumerate() {
        if w[0].is_ascii_digit() && w[1] == b'.' && w[2].is_ascii_digit() {
            let end = (i + 2..b.len())
                .find(|&j| !b[j].is_ascii_digit())
                .unwrap_or(b.len());
            if b.get(end) == Some(&b's') {
                found.push(String::from_utf8_lossy(&b[i..=end]).into_owned());
            }
        }
    }
    found
}

#[test]
fn the_subscription_schemas_describe_exactly_the_status_entry() {
    let read = |name: &str| -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../schemas")
            .join(format!("{name}.schema.json"));
        serde_json::from_str(&std::fs::read_to_string(&path).expect("schema readable"))
            .expect("schema is JSON")
    };
    let status = read("status");
    for name in ["subscription-info", "subscription-list"] {
        let s = read(name);
        for def in [
            "subscription",
            "ms",
            "ms_or_null",
            "count",
            "string_or_null",
        ] {
            assert_eq!(
                s["$defs"][def], status["$defs"][def],
                "{name}.schema.json's $defs/{def} must equal status.schema.json's"
            );
        }
    }
}

#[test]
fn data_json_writes_a_json_payload_as_a_value_and_any_other_as_the_string() {
    let env = TestEnv::new();
    let payloads = [r#"{"id":1,"a":[true,null]}"#, "hello", "[1,2]", "{broken"];
    for (i, p) in payloads.iter().enumerate() {
        env.publish("rd.x", p, &["--id", &format!("p{i}")]);
    }
    let consume = |extra: &[&str]| {
        let mut args = vec![
            "event",
            "consume",
            "rd.*",
            "--from",
            "earliest",
            "--max-events",
            "4",
        ];
        args.extend_from_slice(extra);
        let out = dws(&env, &args);
        out.assert_clean_exit("limit", 4);
        complete_events(&out)
    };
    let as_json = consume(&["--data", "json"]);
    let data: Vec<&Value> = as_json.iter().map(|e| &e["data"]).collect();
    assert_eq!(
        data,
        [
            &json!({"id": 1, "a": [true, null]}),
            &json!("hello"),
            &json!([1, 2]),
            &json!("{broken")
        ]
    );
    // Key order is the payload's.
    let out = dws(
        &env,
        &[
            "event",
            "consume",
            "rd.*",
            "--from",
            "earliest",
            "--max-events",
            "1",
            "--data",
            "json",
        ],
    );
    assert!(
        out.stdout.contains(r#""data":{"id":1,"a":[true,null]}"#),
        "{out}"
    );
    for e in &as_json {
        assert_valid("event", e);
    }
    // The default stays the string, in every format.
    let default = consume(&[]);
    assert_eq!(default[0]["data"], json!(payloads[0]));
    let pretty = dws(
        &env,
        &[
            "event",
            "consume",
            "rd.*",
            "--from",
            "earliest",
            "--max-events",
            "1",
            "--format",
            "json",
            "--data",
            "json",
        ],
    );
    pretty.assert_code(0);
    let arr: Value = serde_json::from_str(&pretty.stdout).expect("a JSON array");
    assert_eq!(arr[0]["data"]["id"], 1, "{pretty}");
    // get takes --data too.
    let seq = u64_of(&as_json[2], "seq");
    assert_eq!(get(&env, seq, &["--data", "json"])["data"], json!([1, 2]));
    assert_eq!(get(&env, seq, &[])["data"], json!("[1,2]"));
}

/// On a cluster, a named subscription from a time starts there on every
/// host: the host that defines it resolves the time against its log (here a
/// follower's), and the others adopt that start.
#[test]
fn cluster_a_named_subscription_from_a_time_starts_there_on_every_host() {
    let server = dws_tests::pg::PgServer::start();
    let a = cluster_host(&server, "host-a");
    let b = cluster_host(&server, "host-b");
    // Both buses run (get never starts one).
    b.publish("warm.up", "{}", &[]);
    let (seqs, c_at) = two_batches(&a);
    // b has read the log through d.
    let d = seqs[3].to_string();
    b.wait_until(EXIT_TIMEOUT, "host b to hold d", || {
        dws(&b, &["event", "get", &d]).code == Some(0)
    });
    assert_eq!(received_at(&b, seqs[2]), c_at, "one log, one time");
    subscribe_ok(&b, &["rd.*", "--id", "tc", "--from", &rfc3339(c_at)], "tc");
    wait_subscription_known(&a, "tc");
    for host in [&a, &b] {
        let out = dws(
            host,
            &[
                "event",
                "consume",
                "--subscribe-id",
                "tc",
                "--max-events",
                "2",
            ],
        );
        out.assert_clean_exit("limit", 2);
        assert_eq!(ids_of(&complete_events(&out)), ["c", "d"], "{out}");
    }
}
