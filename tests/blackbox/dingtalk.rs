//! The `dingtalk` source against the loopback fake gateway
//! (`dws_tests::fake_dingtalk`): conformance checks of the protocol note §8
//! (client side: OPEN-3..6, TKT-3, FRM-1..6, PING-1/2/4/5, DISC-2, ACK-5,
//! RECO-1..3) and end-to-end runs through real `busd` and `dws event
//! consume` processes: one upstream connection shared by two consumers,
//! nothing lost across a server `disconnect` and a dropped TCP connection,
//! a lost source ending consumers with `source_lost`, and the client secret
//! and tickets never showing up anywhere.
//!
//! Submodules: [`frames`] (FRM, PING), [`session`] (DISC, ACK, RECO),
//! [`portal`] (the reference CLI's portal ticket mode).
//!
//! Each test has its own fake (on `127.0.0.1:0`) and its own [`TestEnv`];
//! the bus is pointed at the fake by a 0600 `config.toml`. Backoff and the
//! pong deadline are shortened through the source's test knobs
//! (`DWS_DINGTALK_BACKOFF_MIN_MS`, …). Waits are bounded and generous;
//! the only timing assertions are lower bounds (backoff waited at least
//! this long) and upper bounds far above the expected value.

mod frames;
mod portal;
mod session;

use std::{collections::BTreeMap, time::Duration};

use dws_tests::{
    fake_dingtalk::{dingtalk_env, Event, FakeDingTalk, Options},
    Child, Sig, TestEnv, EXIT_TIMEOUT,
};
use serde_json::{json, Value};

/// Bound of every wait in this module.
const T: Duration = Duration::from_secs(30);

const UNAVAILABLE: &str = r#"{"code":"unavailable","message":"try later"}"#;
const AUTH_FAILED: &str = r#"{"requestid":"5f1c7e3a-0000-4000-a000-000000000001","code":"authFailed","message":"auth failed"}"#;

/// Bus settings for one test.
struct Bus<'a> {
    keepalive: &'a str,
    max_attempts: u32,
    knobs: Vec<(&'a str, String)>,
}

impl Default for Bus<'_> {
    fn default() -> Self {
        Bus {
            keepalive: "30s",
            max_attempts: 0,
            knobs: vec![],
        }
    }
}

impl<'a> Bus<'a> {
    fn knob(mut self, k: &'a str, v: impl ToString) -> Self {
        self.knobs.push((k, v.to_string()));
        self
    }

    /// A [`TestEnv`] whose default profile's bus uses `fake`.
    fn env(self, fake: &FakeDingTalk) -> TestEnv {
        dingtalk_env(
            &fake.app_profile(&format!(
                "max_attempts = {}\nkeepalive = \"{}\"\n",
                self.max_attempts, self.keepalive
            )),
            &self.knobs,
        )
    }
}

fn fake_with(f: impl FnOnce(&mut Options)) -> FakeDingTalk {
    let mut o = Options::default();
    f(&mut o);
    FakeDingTalk::start_with(o)
}

/// `dws event consume '*'`, resident until the test ends it; waits for ready.
fn consumer(env: &TestEnv) -> Child {
    let mut c = env
        .dws(["event", "consume", "*", "--from", "earliest"])
        .stdin_hold()
        .spawn();
    c.wait_ready();
    c
}

/// The `event_id`s of the first `n` NDJSON lines, once there are `n`.
fn event_ids(c: &mut Child, n: usize) -> Vec<String> {
    c.wait_stdout_lines(n, T)
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON: {e}"));
            v["event_id"].as_str().unwrap_or("").to_owned()
        })
        .collect()
}

/// The NDJSON line of the event with `id`, once it has arrived.
fn event_line(c: &mut Child, id: &str) -> Value {
    let lines = c.wait_stdout_line(&format!("event {id}"), T, |l| {
        l.contains(&format!("\"event_id\":\"{id}\""))
    });
    serde_json::from_str(lines.last().expect("the matching line")).expect("event line is JSON")
}

fn ev(id: &str) -> Event {
    Event::new(id, "user_add_org", json!({"userId": [id]}).to_string())
}

fn accepted_handshakes(fake: &FakeDingTalk) -> usize {
    fake.with_state(|s| s.handshakes.iter().filter(|h| h.accepted).count())
}

/// Ends a resident consumer with SIGTERM; returns its output.
fn finish(c: Child, expected_events: u64) -> dws_tests::Output {
    c.signal(Sig::SIGTERM);
    let out = c.wait_exit(EXIT_TIMEOUT);
    out.assert_clean_exit("signal", expected_events);
    out
}

fn counts(ids: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in ids {
        *m.entry(i.clone()).or_insert(0) += 1;
    }
    m
}

// ------------------------------------------------------------------ end to end

#[test]
fn two_consumers_share_one_upstream_connection_and_lose_nothing_across_disconnect_and_drop() {
    let fake = fake_with(|o| o.disconnect_close_after = Duration::from_secs(2));
    let env = Bus::default().env(&fake);
    let mut a = consumer(&env);
    let mut b = consumer(&env);
    fake.wait_connected(T);

    let mut pushed = vec![];
    let mut push = |range: std::ops::RangeInclusive<u32>| {
        for i in range {
            let id = format!("e2e-{i:02}");
            fake.push_event(&ev(&id));
            pushed.push(id);
        }
    };
    push(1..=5);
    event_ids(&mut a, 5);
    event_ids(&mut b, 5);
    assert_eq!(
        fake.open_count(),
        1,
        "two consumers, one upstream connection\n{}",
        fake.summary()
    );
    assert_eq!(accepted_handshakes(&fake), 1, "{}", fake.summary());

    // Server-initiated disconnect, events pushed right behind it.
    fake.send_disconnect("connection is expired")
        .expect("a live connection");
    push(6..=10);
    event_ids(&mut a, 10);
    event_ids(&mut b, 10);
    assert_eq!(
        accepted_handshakes(&fake),
        2,
        "one replacement connection\n{}",
        fake.summary()
    );

    // A dropped TCP connection, events pushed right behind it.
    fake.drop_tcp().expect("a live connection");
    push(11..=15);
    let ids_a = event_ids(&mut a, 15);
    let ids_b = event_ids(&mut b, 15);
    fake.wait_until("every event acked", T, |s| s.unacked() == 0);

    let want: BTreeMap<String, usize> = pushed.iter().map(|i| (i.clone(), 1)).collect();
    assert_eq!(counts(&ids_a), want, "consumer A: every event exactly once");
    assert_eq!(counts(&ids_b), want, "consumer B: every event exactly once");
    let tickets = fake.tickets();
    assert_eq!(
        tickets.len(),
        3,
        "one open per connection\n{}",
        fake.summary()
    );
    let distinct: std::collections::BTreeSet<_> = tickets.iter().collect();
    assert_eq!(distinct.len(), 3, "a fresh ticket each time");

    // Nothing more arrives later (no duplicate after redelivery).
    let last = fake.push_event(&ev("e2e-last"));
    fake.wait_ack(&last, T);
    event_ids(&mut a, 16);
    event_ids(&mut b, 16);
    let out_a = finish(a, 16);
    let out_b = finish(b, 16);
    for out in [&out_a, &out_b] {
        let ids: Vec<String> = out
            .json_lines()
            .iter()
            .map(|l| l["event_id"].as_str().unwrap_or("").to_owned())
            .collect();
        assert!(
            counts(&ids).values().all(|n| *n == 1),
            "duplicates delivered\n{out}"
        );
    }
    let line = &out_a.json_lines()[0];
    assert_eq!(line["event_type"], "user_add_org", "{out_a}");
    assert_eq!(line["event_corp_id"], "dingfakecorp", "{out_a}");
    assert_eq!(line["event_unified_app_id"], "fake-unified-app", "{out_a}");
    assert_eq!(
        line["data"],
        json!({"userId": ["e2e-01"]}).to_string(),
        "{out_a}"
    );
    assert_eq!(
        line["headers"]["eventType"], "user_add_org",
        "frame headers pass through\n{out_a}"
    );
}

#[test]
fn lost_source_after_max_attempts_ends_consumers_with_source_lost() {
    let fake = FakeDingTalk::start();
    fake.fail_next_opens(1000, 503, UNAVAILABLE);
    // Backoff 1 s → 2 s: the consumers are attached well before attempt 3.
    let env = Bus {
        max_attempts: 3,
        ..Bus::default()
    }
    .knob("DWS_DINGTALK_BACKOFF_MIN_MS", 1000)
    .knob("DWS_DINGTALK_BACKOFF_MAX_MS", 2000)
    .env(&fake);
    let a = consumer(&env);
    let b = consumer(&env);
    for c in [a, b] {
        let out = c.wait_exit(T);
        let lost = out.assert_source_lost();
        assert!(
            lost.contains("503") && lost.contains("unavailable"),
            "the reason says why: {lost}\n{out}"
        );
        assert!(
            lost.contains("3 consecutive failed attempts"),
            "{lost}\n{out}"
        );
    }
    assert_eq!(
        fake.open_count(),
        3,
        "max_attempts = 3 means exactly 3 open calls\n{}",
        fake.summary()
    );
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit after losing its source");
}

#[test]
fn the_client_secret_and_tickets_never_show_up_anywhere() {
    const CANARY: &str = "CANARY-s3cr3t-7f3a9c2e";
    let fake = fake_with(|o| {
        o.client_secret = CANARY.into();
        o.disconnect_close_after = Duration::from_secs(1);
    });
    fake.fail_next_opens(1, 503, UNAVAILABLE);
    fake.reject_handshakes(1);
    let env = Bus::default().knob("DWS_BUS_LOG", "debug").env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    fake.push_event(&ev("canary-1"));
    event_ids(&mut c, 1);
    fake.send_disconnect("rotate").expect("live connection");
    fake.wait_until("a replacement connection", T, |s| {
        s.handshakes.iter().filter(|h| h.accepted).count() == 2
    });
    fake.wait_connected(T);
    fake.drop_tcp();
    fake.push_event(&ev("canary-2"));
    event_ids(&mut c, 2);
    let opens = fake.opens();
    assert!(
        opens.iter().all(|o| o.body["clientSecret"] == CANARY),
        "the secret is sent to the gateway"
    );
    let tickets = fake.tickets();
    assert!(tickets.len() >= 4, "{}", fake.summary());

    let st = env.status().to_string();
    let meta = std::fs::read_to_string(env.work_dir().join("bus.meta")).unwrap_or_default();
    let argvs = dws_tests::all_process_argv();
    let out = finish(c, 2);
    let log = std::fs::read_to_string(env.bus_log_path()).expect("bus.log");
    assert!(
        log.contains("dingtalk"),
        "the debug log has the source's lines:\n{log}"
    );
    let places = [
        ("bus.log", log.as_str()),
        ("status JSON", &st),
        ("bus.meta", &meta),
        ("consumer stdout", &out.stdout),
        ("consumer stderr", &out.stderr),
        ("argv of the processes", &argvs),
    ];
    dws_tests::assert_absent("the client secret", CANARY, &places);
    for t in &tickets {
        dws_tests::assert_absent(&format!("ticket {t}"), t, &places);
    }

    // The lost reason and the state's last error, too.
    let fake2 = fake_with(|o| o.client_secret = CANARY.into());
    fake2.fail_next_opens(
        10,
        503,
        &UNAVAILABLE.replace("try later", &format!("try later, {CANARY}")),
    );
    let env2 = Bus {
        max_attempts: 2,
        ..Bus::default()
    }
    .knob("DWS_DINGTALK_BACKOFF_MIN_MS", 1000)
    .env(&fake2);
    let c2 = consumer(&env2);
    let out2 = c2.wait_exit(T);
    out2.assert_clean_exit("source_lost", 0);
    assert!(
        !out2.stderr.contains(CANARY),
        "a secret echoed by the gateway is redacted:\n{out2}"
    );
    assert!(out2.stderr.contains("<redacted>"), "{out2}");
    let log2 = std::fs::read_to_string(env2.bus_log_path()).unwrap_or_default();
    assert!(!log2.contains(CANARY), "{log2}");
}

// ------------------------------------------------------------------ OPEN

/// The reference's first `Start` failing ends `dws event consume`
/// (`internal/event/source/dingtalk.go` `Start`): a first open refused
/// 401 `authFailed` is not retried, the consumers end with source_lost.
#[test]
fn open_3_a_first_open_refused_auth_failed_ends_the_source() {
    let fake = FakeDingTalk::start();
    fake.fail_next_opens(1, 401, AUTH_FAILED);
    // The consumer attaches before the answer.
    fake.set_open_delay(Duration::from_millis(1500));
    let env = Bus::default().env(&fake);
    let c = consumer(&env);
    let out = c.wait_exit(T);
    let lost = out.assert_source_lost();
    assert!(
        lost.contains("401") && lost.contains("authFailed"),
        "{lost}\n{out}"
    );
    assert_eq!(fake.open_count(), 1, "not retried\n{}", fake.summary());
    env.wait_no_busd(EXIT_TIMEOUT, "the bus to exit after losing its source");
}

/// Once an open succeeded, a refused one is retried like any failure (the
/// SDK's reconnect loop), with backoff, and counted.
#[test]
fn open_3_auth_failed_after_a_first_connection_is_retried_with_backoff_and_counted() {
    let fake = FakeDingTalk::start();
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    fake.fail_next_opens(2, 401, AUTH_FAILED);
    fake.drop_tcp();
    fake.wait_until("two refused opens, then a connection", T, |s| {
        s.opens.len() == 4 && s.target().is_some()
    });
    let opens = fake.opens();
    assert_eq!(
        opens.iter().map(|o| o.status).collect::<Vec<_>>(),
        [200, 401, 401, 200]
    );
    for o in &opens {
        assert_eq!(o.body["clientId"], fake.client_id());
        assert_eq!(o.body["clientSecret"], fake.client_secret());
        let subs = o.body["subscriptions"].as_array().expect("subscriptions");
        assert!(
            subs.contains(&json!({"type": "EVENT", "topic": "*"})),
            "{subs:?}"
        );
        assert!(!o.body["ua"].as_str().unwrap_or("").is_empty(), "ua is set");
    }
    assert!(
        opens[2].at.duration_since(opens[1].at) >= Duration::from_millis(90),
        "backoff between opens"
    );
    fake.push_event(&ev("open3"));
    assert_eq!(event_ids(&mut c, 1), ["open3"]);
    let st = env.status();
    assert_eq!(st["source"]["kind"], "dingtalk");
    assert_eq!(st["source"]["state"], "connected");
    assert!(
        st["source"]["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("401"),
        "the last error is kept: {st:#}"
    );
}

#[test]
fn open_4_server_errors_throttling_and_resets_are_retried_each_with_a_new_open() {
    let fake = FakeDingTalk::start();
    fake.fail_next_opens(1, 500, r#"{"code":"systemError","message":"system error"}"#);
    fake.fail_next_opens(1, 429, r#"{"code":"Throttling","message":"busy"}"#);
    fake.reset_next_opens(1);
    fake.fail_next_opens(1, 503, "<html>unavailable</html>");
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let statuses: Vec<u16> = fake.opens().iter().map(|o| o.status).collect();
    assert_eq!(statuses, [500, 429, 0, 503, 200], "{}", fake.summary());
    assert_eq!(fake.handshakes().len(), 1, "no handshake without a ticket");
    fake.push_event(&ev("open4"));
    assert_eq!(event_ids(&mut c, 1), ["open4"]);
}

#[test]
fn open_5_empty_endpoint_or_ticket_is_a_failure() {
    let fake = FakeDingTalk::start();
    fake.empty_next_opens(1, true, false);
    fake.empty_next_opens(1, false, true);
    fake.empty_next_opens(1, true, true);
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let opens = fake.opens();
    assert_eq!(opens.len(), 4, "{}", fake.summary());
    let hs = fake.handshakes();
    assert_eq!(
        hs.len(),
        1,
        "only the complete answer is dialled\n{}",
        fake.summary()
    );
    assert_eq!(
        Some(hs[0].ticket.clone()),
        opens[3].ticket,
        "the ticket of the 4th open"
    );
    fake.push_event(&ev("open5"));
    assert_eq!(event_ids(&mut c, 1), ["open5"]);
    let st = env.status();
    assert!(
        st["source"]["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("no endpoint")
            || st["source"]["last_error"]
                .as_str()
                .unwrap_or("")
                .contains("no ticket"),
        "{st:#}"
    );
}

#[test]
fn open_6_endpoint_path_and_query_are_kept_and_ticket_is_set() {
    let fake = FakeDingTalk::start();
    fake.set_endpoint_path("/gw/v2/connect?region=cn-test&x=a%20b");
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let hs = fake.handshakes();
    assert_eq!(hs.len(), 1, "{}", fake.summary());
    assert_eq!(hs[0].path, "/gw/v2/connect");
    let params = hs[0].params();
    let ticket = fake.tickets()[0].clone();
    assert_eq!(
        params,
        [
            ("region".to_owned(), "cn-test".to_owned()),
            ("x".to_owned(), "a b".to_owned()),
            ("ticket".to_owned(), ticket)
        ],
        "raw query {:?}",
        hs[0].query
    );
    fake.push_event(&ev("open6"));
    assert_eq!(event_ids(&mut c, 1), ["open6"]);
}

#[test]
fn tkt_3_rejected_handshake_reopens_for_a_new_ticket_never_reusing_one() {
    let fake = FakeDingTalk::start();
    fake.reject_handshakes(2);
    let env = Bus::default().env(&fake);
    let mut c = consumer(&env);
    fake.wait_connected(T);
    let tickets = fake.tickets();
    let hs = fake.handshakes();
    assert_eq!(tickets.len(), 3, "{}", fake.summary());
    assert_eq!(hs.len(), 3, "{}", fake.summary());
    assert_eq!(
        hs.iter().map(|h| h.accepted).collect::<Vec<_>>(),
        [false, false, true]
    );
    let used: Vec<String> = hs.iter().map(|h| h.ticket.clone()).collect();
    assert_eq!(
        used, tickets,
        "each handshake uses the ticket of the open just before it"
    );
    fake.push_event(&ev("tkt3"));
    assert_eq!(event_ids(&mut c, 1), ["tkt3"]);
}
