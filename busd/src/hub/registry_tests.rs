//! Unit tests of the registry without sockets: connections come and go,
//! attach and detach, removal and who is told, TTL expiry, activity.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use proto::v1::ByeReason;

use super::{Detached, Registry};
use crate::{eventlog::LoggedEvent, pattern::Selector, subscription::Subscription};

fn sub(id: &str, owned: bool, ttl: Duration) -> Subscription {
    let sel = Selector::new(&["*".into()], "").unwrap();
    Subscription::new(
        id.into(),
        sel,
        owned,
        ttl,
        None,
        0,
        (Instant::now(), 1_000),
        10,
    )
}

fn ev(seq: u64) -> Arc<LoggedEvent> {
    Arc::new(LoggedEvent {
        seq,
        event_type: "t".into(),
        encoded: Bytes::from_static(b"x").into(),
        ..LoggedEvent::default()
    })
}

fn registry(subs: Vec<Subscription>) -> Registry {
    Registry::new(subs.into_iter().map(|s| (s.id.clone(), s)).collect())
}

/// Attaches `conn` to `id` the way the hub does: the subscription, then
/// the connection's record.
fn attach(r: &mut Registry, conn: u64, id: &str) {
    r.get_mut(id).unwrap().attach(conn, 10, None);
    r.set_attached(conn, id);
}

#[test]
fn connections_get_distinct_ids_and_make_the_bus_busy_once_they_do_something() {
    let mut r = Registry::new(BTreeMap::new());
    assert!(!r.busy(true));
    let (a, _) = r.register();
    let (b, _) = r.register();
    assert_ne!(a, b);
    assert!(
        !r.busy(true),
        "a connection that only reads status is not activity"
    );
    assert!(r.mark_active(a));
    assert!(!r.mark_active(a), "once");
    assert!(r.busy(true) && r.busy(false));
    r.identify(a, 42, &"x".repeat(100));
    assert_eq!(r.conn(a).map(|c| c.pid()), Some(42));
    assert_eq!(r.unregister(a), Detached::default());
    assert_eq!(r.unregister(b), Detached::default());
    assert!(!r.busy(true));
    assert_eq!(r.conn_count(), 0);
}

#[test]
fn subscriptions_keep_the_bus_busy_only_where_they_hold_it() {
    let r = registry(vec![sub("named", false, Duration::MAX)]);
    assert!(r.busy(true));
    assert!(!r.busy(false));
}

#[test]
fn detaching_a_consumer_of_a_named_subscription_asks_for_a_save() {
    let mut r = registry(vec![sub("named", false, Duration::MAX)]);
    let (c, _) = r.register();
    attach(&mut r, c, "named");
    r.get_mut("named").unwrap().offer(&ev(1));
    let (conn, s) = r.attached_mut(c).unwrap();
    assert_eq!(
        s.pull_within(10, 1 << 20, 1, Instant::now()).events.len(),
        1
    );
    conn.count_delivered(1, 0);
    assert_eq!(r.consumer_pids(), vec![0]);
    let d = r.detach(c);
    assert_eq!(
        d,
        Detached {
            named: true,
            given_back: None,
            others_take: None,
        }
    );
    let s = r.get("named").unwrap();
    assert_eq!(s.consumer(), None);
    assert_eq!(
        (s.in_flight(), s.pending_len()),
        (0, 1),
        "in flight is pending again"
    );
    assert!(r.attached_mut(c).is_none());
    // Detaching again changes nothing.
    assert_eq!(r.detach(c), Detached::default());
}

#[test]
fn an_owned_subscription_needs_no_save_and_a_shared_one_gives_back_what_it_held() {
    let mut r = registry(vec![
        sub("owned", true, Duration::MAX),
        sub("shared", false, Duration::MAX),
    ]);
    let (a, _) = r.register();
    let (b, _) = r.register();
    attach(&mut r, a, "owned");
    assert!(!r.detach(a).named);
    let shared = r.get_mut("shared").unwrap();
    shared.shared = true;
    shared.set_claimed(true);
    attach(&mut r, b, "shared");
    assert!(r.get_mut("shared").unwrap().push_claimed(ev(7), 0));
    let d = r.detach(b);
    assert_eq!(d.given_back, Some(("shared".to_owned(), vec![7])));
    assert!(d.named);
}

#[test]
fn a_connection_attached_elsewhere_does_not_detach_the_new_consumer() {
    // The subscription was taken over by `b`; `a` still names it.
    let mut r = registry(vec![sub("s", false, Duration::MAX)]);
    let (a, _) = r.register();
    let (b, _) = r.register();
    attach(&mut r, a, "s");
    attach(&mut r, b, "s");
    assert_eq!(r.detach(a), Detached::default());
    assert_eq!(r.get("s").unwrap().consumer(), Some(b));
}

#[test]
fn removing_a_subscription_kicks_its_consumer_unless_it_asked() {
    let mut r = registry(vec![
        sub("x", false, Duration::MAX),
        sub("y", false, Duration::MAX),
    ]);
    let (a, handle_a) = r.register();
    let (b, _) = r.register();
    attach(&mut r, a, "x");
    attach(&mut r, b, "y");
    let (removed, kick) = r.remove("x", b).unwrap();
    assert_eq!(removed.id, "x");
    let kick = kick.into_iter().next().expect("the consumer of x is told");
    assert!(Arc::ptr_eq(&kick, &handle_a));
    kick.kick(ByeReason::Unsubscribed);
    assert_eq!(handle_a.take_kick(), Some(ByeReason::Unsubscribed));
    assert_eq!(r.conn(a).and_then(|c| c.attached()), None);
    // The requester itself is not kicked.
    let (_, kick) = r.remove("y", b).unwrap();
    assert!(kick.is_empty());
    assert!(r.remove("y", b).is_none());
}

#[test]
fn generated_ids_skip_those_taken() {
    let mut r = registry(vec![sub("sub-7-1", false, Duration::MAX)]);
    assert_eq!(r.generate_id(7), "sub-7-2");
    assert_eq!(r.generate_id(7), "sub-7-3");
}

#[test]
fn detached_subscriptions_expire_after_their_ttl_and_are_recorded() {
    let mut r = registry(vec![
        sub("gone", true, Duration::ZERO),
        sub("kept", false, Duration::MAX),
    ]);
    let (c, _) = r.register();
    let before = r.activity();
    assert!(r.next_expiry().is_some());
    let removed = r.expire(Instant::now(), 5_000);
    assert_eq!(
        removed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        vec!["gone"]
    );
    assert!(r.activity() > before, "an expiry is activity");
    let doc = r.expired_doc();
    assert_eq!(doc.total, 1);
    assert_eq!(doc.recent[0].id, "gone");
    assert_eq!(doc.recent[0].expired_at_unix_ms, 5_000);
    // An attached subscription never expires.
    attach(&mut r, c, "kept");
    assert!(r.next_expiry().is_none());
    assert!(r.expire(Instant::now(), 6_000).is_empty());
    assert_eq!(r.len(), 1);
}
