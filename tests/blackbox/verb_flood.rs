//! Issue 49, row 2: one client pipelining thousands of operator verbs on a
//! subscription with a large backlog never stalls the other clients. Each
//! verb used to copy the whole subscription on the bus's one serving
//! thread, and a connection decoded every frame of a read before anyone
//! else was served: 2,000 `show` verbs on 100k pending held another
//! client's publish for 9.4 s. `show` and `parked` now read the
//! subscription in place, and a connection's pipelined requests are served
//! a turn at a time; dry runs (which still work on a copy) take their turn
//! the same way.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use dws_tests::{wire::Wire, TestEnv};
use proto::v1::{
    client_frame::Kind as C, server_frame::Kind as S, ClientFrame, SubscriptionControl,
};

/// Events pending on the flooded subscription.
const BACKLOG: usize = 50_000;
/// Verbs in the one pipelined write.
const VERBS: u64 = 2_000;
/// What a publish from another client may take meanwhile: docs/guide.md,
/// Limits ("operator verbs"), with room for a loaded debug build.
const SERVED_WITHIN: Duration = Duration::from_secs(1);

fn verbs(verb: &str) -> Vec<u8> {
    let mut b = BytesMut::new();
    for i in 1..=VERBS {
        let f = ClientFrame {
            kind: Some(C::SubscriptionControl(SubscriptionControl {
                request_id: i,
                subscription_id: "big".into(),
                verb: verb.into(),
                dry_run: verb == "disable",
                ..SubscriptionControl::default()
            })),
        };
        proto::codec::encode_frame(&f, &mut b).expect("encode");
    }
    b.to_vec()
}

#[test]
fn thousands_of_pipelined_verbs_on_a_large_backlog_leave_others_served() {
    let env = TestEnv::new();
    env.subscribe(&["big.*", "--id", "big"]);
    let lines: String = (0..BACKLOG).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    env.dws(["event", "publish", "big.x", "--lines"])
        .stdin_bytes(lines.into_bytes())
        .run_with_timeout(Duration::from_secs(120))
        .assert_code(0);
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    for verb in ["show", "parked", "disable"] {
        let mut flooder = Wire::greeted(&socket);
        let sent = flooder.send_in_background(verbs(verb));
        // Another client publishes while the verbs are served.
        let mut slowest = Duration::ZERO;
        let mut answered = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while answered < VERBS && Instant::now() < deadline {
            let t = Instant::now();
            env.dws(["event", "publish", "other.x", "{}"])
                .run_with_timeout(Duration::from_secs(60))
                .assert_code(0);
            slowest = slowest.max(t.elapsed());
            while let Some(f) = flooder.try_read_frame(Duration::from_millis(1)) {
                match f.kind {
                    Some(S::SubscriptionState(_)) => answered += 1,
                    other => panic!("{verb}: expected the verb's answer, got {other:?}"),
                }
            }
        }
        while answered < VERBS {
            match flooder.read_frame(Duration::from_secs(60)).kind {
                Some(S::SubscriptionState(_)) => answered += 1,
                other => panic!("{verb}: expected the verb's answer, got {other:?}"),
            }
        }
        sent.join().expect("the writer");
        assert!(
            slowest <= SERVED_WITHIN,
            "{verb}: a publish from another client took {slowest:?} while {VERBS} verbs were served"
        );
    }
}
