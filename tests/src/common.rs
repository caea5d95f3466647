//! Helpers shared by the black-box test modules: status lookups, the fields
//! of event JSON, publishing many events at once, work-queue workers, and
//! cluster hosts.

use std::{
    thread,
    time::{SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::{Cmd, Output, TestEnv, EXIT_TIMEOUT};

/// `dws event consume --subscribe-id ID --ack explicit EXTRA…` with its
/// stdin a pipe the test writes acks to: an explicit-ack consumer of a
/// named subscription, e.g. a worker of a work queue.
pub fn queue_worker(env: &TestEnv, id: &str, extra: &[&str]) -> Cmd {
    let mut a = vec![
        "event",
        "consume",
        "--subscribe-id",
        id,
        "--ack",
        "explicit",
    ];
    a.extend_from_slice(extra);
    env.dws(&a).stdin_pipe()
}

/// The subscription `id` in a status document, if listed.
pub fn sub<'a>(st: &'a Value, id: &str) -> Option<&'a Value> {
    st["subscriptions"]
        .as_array()
        .unwrap_or_else(|| panic!("status has no subscriptions array: {st:#}"))
        .iter()
        .find(|s| s["id"] == id)
}

/// Like [`sub`] but panics when `id` is not listed.
pub fn listed<'a>(st: &'a Value, id: &str) -> &'a Value {
    sub(st, id).unwrap_or_else(|| panic!("subscription {id:?} is not listed in status:\n{st:#}"))
}

/// `dws event subscribe <args...>`, asserting exit 0 and that exactly `id`
/// is printed.
pub fn subscribe_ok(env: &TestEnv, args: &[&str], id: &str) {
    let mut a = vec!["event", "subscribe"];
    a.extend_from_slice(args);
    let out = env.dws(&a).run_with_timeout(EXIT_TIMEOUT);
    out.assert_code(0);
    assert_eq!(
        out.stdout,
        format!("{id}\n"),
        "subscribe prints the id\n{out}"
    );
}

/// Publishes `(event_id, data)` pairs of `event_type` from `threads`
/// concurrent publishers; returns each publish's JSON in input order.
pub fn publish_parallel(
    env: &TestEnv,
    event_type: &str,
    items: &[(String, String)],
    threads: usize,
) -> Vec<Value> {
    let chunk = items.len().div_ceil(threads.max(1)).max(1);
    thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(id, data)| env.publish(event_type, data, &["--id", id]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("publisher thread panicked"))
            .collect()
    })
}

/// The complete NDJSON lines of `out.stdout` (a trailing line without `\n`,
/// cut by `kill -9`, is ignored), each parsed.
pub fn complete_events(out: &Output) -> Vec<Value> {
    let text = match out.stdout.rfind('\n') {
        Some(i) => &out.stdout[..=i],
        None => "",
    };
    text.lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON ({e})\n{out}"))
        })
        .collect()
}

pub fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str()
        .unwrap_or_else(|| panic!("field {k:?} missing or not a string in {v}"))
}

pub fn u64_of(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("field {k:?} missing or not a number in {v}"))
}

pub fn ids_of(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| str_of(e, "event_id").to_owned())
        .collect()
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// One "host" of a cluster on `server` (`store = "postgres"`): a
/// [`TestEnv`] of its own named `name` in the cluster, whose bus does not
/// go idle during a test.
pub fn cluster_host(server: &crate::pg::PgServer, name: &str) -> TestEnv {
    cluster_host_with(server, name, &[])
}

/// [`cluster_host`] with more environment (`extra`, e.g. a retention or a
/// lease bound), which wins over the defaults.
pub fn cluster_host_with(
    server: &crate::pg::PgServer,
    name: &str,
    extra: &[(&str, &str)],
) -> TestEnv {
    let url = server.url();
    let mut vars = vec![
        ("DWS_EVENT_BUS_STORE", "postgres"),
        ("DWS_POSTGRES_URL", url.as_str()),
        ("DWS_CLUSTER_HOST", name),
        ("DWS_EVENT_BUS_IDLE_TIMEOUT", "10m"),
    ];
    vars.extend_from_slice(extra);
    TestEnv::with_env(&vars)
}

/// Starts `env`'s bus (a publish) and waits until it knows subscription
/// `id` (created on another cluster host, adopted within about a second).
pub fn wait_subscription_known(env: &TestEnv, id: &str) {
    env.publish("warm.up", "{}", &[]);
    env.wait_until(
        std::time::Duration::from_secs(15),
        "the subscription reached this host",
        || {
            env.status()["subscriptions"]
                .as_array()
                .is_some_and(|v| v.iter().any(|s| s["id"] == id))
        },
    );
}

/// The repository's root (the parent of `tests/`).
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `name` on this process's PATH. Missing: `None` with a note, or a
/// failure under CI (which must not skip the checks that need it).
pub fn tool(name: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "`{name}` is not on PATH, and CI must not skip the checks that need it"
        );
        eprintln!("note: `{name}` is not on PATH: skipping the checks that need it");
    }
    found
}
