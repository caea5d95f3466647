//! One connection's pipelined publishes keep their order across its host's
//! takeover of the upstream lease: the publishes it forwarded while a
//! follower are not overtaken by the ones it sends once it owns the log.

use std::time::{Duration, Instant};

use dws_tests::{common::cluster_host, pg::PgServer, wire::Wire, Sig};
use proto::{
    v1::{client_frame::Kind as C, server_frame::Kind as S, ClientFrame, Publish},
    PROTOCOL_VERSION,
};

use super::upstream::{busd_pid, signal};

/// Publishes on one connection, and how many may wait for an answer.
const N: u64 = 3_000;
const WINDOW: u64 = 256;

#[test]
fn pipelined_publishes_keep_their_order_across_the_hosts_lease_takeover() {
    let server = PgServer::start();
    let b = cluster_host(&server, "host-b");
    b.publish("ord.warm", "{}", &[]);
    // b owns the upstream; a starts as its follower.
    let a = cluster_host(&server, "host-a");
    a.publish("ord.warm", "{}", &[]);
    let socket = a.bus_meta_socket().expect("host a's socket");
    let mut w = Wire::connect(&socket);
    w.hello(PROTOCOL_VERSION);
    assert!(matches!(
        w.read_frame(Duration::from_secs(10)).kind,
        Some(S::HelloAck(_))
    ));
    let publish = |i: u64| ClientFrame {
        kind: Some(C::Publish(Publish {
            request_id: i,
            event_type: "ord.x".into(),
            data: format!("{{\"i\":{i}}}"),
            ..Default::default()
        })),
    };
    // At most WINDOW unanswered, as a pipelining publisher keeps: new
    // publishes keep coming while the earlier ones wait for an owner.
    let mut sent = 0;
    let mut acks = Vec::new();
    let mut killed = false;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(180);
    while acks.len() < N as usize {
        assert!(
            Instant::now() < deadline,
            "{} of {N} publishes answered\n{}",
            acks.len(),
            a.bus_log_tail()
        );
        while sent < N && sent - (acks.len() as u64) < WINDOW {
            sent += 1;
            w.send(&publish(sent));
        }
        // The owner dies while a's publishes flow through the inbox: a
        // takes the lease in the middle of them.
        if !killed && acks.len() >= 200 {
            signal(busd_pid(&b), Sig::SIGKILL);
            killed = true;
        }
        if let Some(f) = w.try_read_frame(Duration::from_secs(1)) {
            match f.kind {
                Some(S::PublishAck(ack)) => acks.push((ack.request_id, ack.seq)),
                Some(S::Error(e)) => panic!("publish refused: {e:?}\n{}", a.bus_log_tail()),
                _ => {}
            }
        }
    }
    let log = a.bus_log_tail();
    assert!(
        log.contains("this host owns the cluster's upstream"),
        "host a took the lease:\n{log}"
    );
    for pair in acks.windows(2) {
        let ((r1, s1), (r2, s2)) = (pair[0], pair[1]);
        assert!(
            r1 < r2 && s1 < s2,
            "request {r1} got seq {s1}, the later request {r2} seq {s2}: \
             one connection's publishes out of order\n{log}"
        );
    }
}
