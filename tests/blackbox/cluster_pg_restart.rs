//! PostgreSQL stopped and started again under a running cluster: the hosts
//! ride it out. Consumers on the owner and on a follower see `[event]`
//! state lines (the store reconnecting, then connected) — not errors — and
//! every event whose publish was answered arrives once on both hosts; a
//! publish made on the owner during the outage waits and is answered once
//! the database is back.

use std::{collections::BTreeSet, time::Duration};

use dws_tests::common::cluster_host as host;
use dws_tests::{pg::PgServer, Sig, EXIT_TIMEOUT};
use serde_json::Value;

fn ids(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            v["event_id"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

#[test]
fn a_postgres_restart_mid_stream_is_ridden_out_by_owner_and_follower() {
    let mut server = PgServer::start();
    let a = host(&server, "host-a");
    // host-a starts first and is the owner.
    let mut ca = a.dws(["event", "consume", "rs.*"]).spawn();
    ca.wait_ready();
    a.wait_until(Duration::from_secs(15), "host-a owns the cluster", || {
        a.status()["cluster"]["role"] == "owner"
    });
    let b = host(&server, "host-b");
    let mut cb = b.dws(["event", "consume", "rs.*"]).spawn();
    cb.wait_ready();

    for i in 0..5 {
        a.publish("rs.x", "{}", &["--id", &format!("before-{i}")]);
    }
    assert_eq!(ids(&ca.wait_stdout_lines(5, EXIT_TIMEOUT)).len(), 5);
    assert_eq!(ids(&cb.wait_stdout_lines(5, EXIT_TIMEOUT)).len(), 5);

    server.stop();
    // A publish on the owner during the outage waits for the database.
    let during = a
        .dws(["event", "publish", "rs.x", "{}", "--id", "during"])
        .spawn();
    std::thread::sleep(Duration::from_secs(2));
    server.start_again();
    let out = during.wait_exit(Duration::from_secs(60));
    let reply = out.publish_json();
    assert_eq!(reply["duplicate"], false, "{reply}");
    for i in 0..5 {
        a.publish("rs.x", "{}", &["--id", &format!("after-{i}")]);
    }

    let want: Vec<String> = (0..5)
        .map(|i| format!("before-{i}"))
        .chain(["during".to_owned()])
        .chain((0..5).map(|i| format!("after-{i}")))
        .collect();
    for (name, c) in [("owner", &mut ca), ("follower", &mut cb)] {
        let got = ids(&c.wait_stdout_lines(want.len(), Duration::from_secs(60)));
        assert_eq!(got, want, "{name}: every answered publish, once, in order");
        assert!(
            c.is_running(),
            "{name}'s consumer is still running\n{}",
            c.report()
        );
    }
    // The follower said so on stderr; nobody got an error.
    cb.wait_stderr_line(
        "the follower's reconnecting line",
        Duration::from_secs(5),
        |l| l.starts_with("[event] source reconnecting (the cluster store is reconnecting"),
    );
    cb.wait_stderr_line(
        "the follower's connected line",
        Duration::from_secs(15),
        |l| l.starts_with("[event] source connected (cluster follower"),
    );
    for (env, c) in [(&a, ca), (&b, cb)] {
        c.signal(Sig::SIGTERM);
        let out = c.wait_exit(EXIT_TIMEOUT);
        out.assert_clean_exit("signal", want.len() as u64);
        assert!(!out.stderr.contains("Error"), "{out}");
        let distinct: BTreeSet<u64> = out
            .json_lines()
            .iter()
            .filter_map(|v| v["seq"].as_u64())
            .collect();
        assert_eq!(distinct.len(), want.len(), "{out}");
        assert_eq!(env.status()["running"], true);
    }
}
