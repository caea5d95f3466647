//! Hub-level unit tests over an empty store (no sockets, no committer
//! thread: each test plays the committer by hand): staging and the durable
//! head, dedup, subscribe/attach/ack, takeover, saves a reply waits for,
//! a failed store, and the source's handle.

use std::time::Duration;

use proto::v1::{self, ByeReason};

use super::{CommitWork, Hub, HubConfig, NewEvent};
use crate::{eventlog::Retention, shutdown, store::Recovered, store::StoreInfo};

fn config(inline_commit: bool) -> HubConfig {
    HubConfig {
        profile: "test".into(),
        socket: "/nonexistent/bus.sock".into(),
        work_dir: "/nonexistent".into(),
        retention: Retention {
            max_events: 1000,
            max_bytes: 1 << 20,
            hot_events: 100,
        },
        default_ttl: Duration::from_secs(60),
        default_window: 10,
        dedup_capacity: 100,
        dedup_keeps_retained: false,
        idle_timeout: Duration::ZERO,
        source_kind: "local".into(),
        inline_commit,
        clustered: false,
    }
}

fn hub_with(inline_commit: bool) -> (Hub, shutdown::Shutdown) {
    let (trigger, listener) = shutdown::channel();
    let hub = Hub::new(
        config(inline_commit),
        trigger,
        None,
        Recovered::default(),
        StoreInfo::default(),
    );
    (hub, listener)
}

fn hub() -> Hub {
    hub_with(false).0
}

fn ev(id: &str) -> NewEvent {
    NewEvent {
        scope: "local".into(),
        event_id: id.into(),
        event_type: "chat.message".into(),
        data: "{}".into(),
        ..Default::default()
    }
}

fn subscribe(id: &str, attach: bool) -> v1::Subscribe {
    v1::Subscribe {
        subscription_id: id.into(),
        patterns: vec!["*".into()],
        attach,
        ..Default::default()
    }
}

/// Plays the committer for one round: must be an append; makes it durable.
fn commit_staged(hub: &Hub) -> Vec<u64> {
    // Just saved: a lazy save is not due, so staged events go first.
    match hub.next_commit_work(std::time::Instant::now()) {
        CommitWork::Append(batch) => {
            let seqs = batch.iter().map(|e| e.seq).collect();
            hub.committed(batch, StoreInfo::default());
            seqs
        }
        _ => panic!("expected staged events"),
    }
}

#[test]
fn an_event_is_delivered_only_once_durable_and_an_ack_settles_it() {
    let hub = hub();
    let (conn, _handle) = hub.register_conn();
    let (reply, gen) = hub.subscribe(conn, &subscribe("s", true), None).unwrap();
    assert!(reply.created && reply.attached);
    assert_eq!(
        gen,
        Some(1),
        "a named subscription is saved before the reply"
    );
    let a = hub.append(ev("a")).unwrap();
    assert_eq!((a.seq, a.duplicate), (1, false));
    assert_eq!(hub.head_seq(), 0, "staged is not durable");
    assert!(
        hub.pull(conn, 10, 1 << 20).0.is_none(),
        "nothing durable yet"
    );
    assert_eq!(commit_staged(&hub), vec![1]);
    assert_eq!(hub.head_seq(), 1);
    assert_eq!(hub.durable().borrow().seq, 1);
    let d = hub.pull(conn, 10, 1 << 20).0.expect("a delivery");
    assert_eq!(d.subscription_id, "s");
    assert_eq!(d.events.iter().map(|e| e.0.seq).collect::<Vec<_>>(), [1]);
    hub.ack(
        conn,
        &v1::Ack {
            seq: 1,
            ..Default::default()
        },
    );
    let status = hub.status_json(10);
    assert_eq!(status["subscriptions"][0]["acked"], 1);
    assert_eq!(status["consumers"][0]["delivered"], 1);
    assert_eq!(status["consumers"][0]["acked"], 1);
}

#[test]
fn a_repeated_id_gets_the_originals_seq_and_is_not_staged_again() {
    let hub = hub();
    assert_eq!(hub.append(ev("a")).unwrap().seq, 1);
    let dup = hub.append(ev("a")).unwrap();
    assert_eq!((dup.seq, dup.duplicate), (1, true));
    assert_eq!(hub.append(ev("b")).unwrap().seq, 2);
    assert_eq!(commit_staged(&hub), vec![1, 2]);
    let status = hub.status_json(10);
    assert_eq!(status["event_types"][0]["received"], 3);
    assert_eq!(status["event_types"][0]["duplicates"], 1);
    assert_eq!(status["store"]["staged"], 0);
}

#[test]
fn with_an_inline_commit_an_event_is_durable_at_once() {
    let (hub, _listener) = hub_with(true);
    hub.append(ev("a")).unwrap();
    assert_eq!(hub.head_seq(), 1);
    assert_eq!(hub.durable().borrow().seq, 1);
}

/// A commit from the committer's thread tells the durable head's watchers
/// also after the relay task is gone (before, it handed them to a relay
/// that no longer ran: nobody was told, ever).
#[test]
fn commits_wake_directly_once_the_relay_is_gone() {
    let (hub, _listener) = hub_with(false);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let relay = rt.spawn(hub.clone().wake_relay());
    rt.block_on(tokio::task::yield_now());
    relay.abort();
    let _ = rt.block_on(relay);
    let mut rx = hub.durable();
    rx.borrow_and_update();
    hub.after_fan_out(vec![], 7);
    assert!(rx.has_changed().unwrap(), "the head's watchers were told");
    assert_eq!(rx.borrow().seq, 7);
}

#[test]
fn a_too_large_event_is_refused_and_counted() {
    let hub = hub();
    let mut big = ev("big");
    big.data = "x".repeat(proto::limits::MAX_EVENT_ENCODED + 1);
    let refusal = hub.append(big).unwrap_err();
    assert_eq!(refusal.code, v1::ErrorCode::TooLarge);
    assert_eq!(hub.status_json(10)["bus"]["refused"]["too_large_events"], 1);
    assert_eq!(hub.append(ev("a")).unwrap().seq, 1, "no seq was spent");
}

#[test]
fn a_takeover_kicks_the_old_consumer_and_without_it_the_attach_is_refused() {
    let hub = hub();
    let (a, handle_a) = hub.register_conn();
    let (b, _) = hub.register_conn();
    hub.subscribe(a, &subscribe("s", true), None).unwrap();
    let refused = hub.subscribe(b, &subscribe("s", true), None).unwrap_err();
    assert_eq!(refused.code, v1::ErrorCode::AlreadyAttached);
    let mut take = subscribe("s", true);
    take.takeover = true;
    let (reply, gen) = hub.subscribe(b, &take, None).unwrap();
    assert!(!reply.created);
    assert_eq!(gen, None, "attaching needs no save before the reply");
    assert_eq!(handle_a.take_kick(), Some(ByeReason::TakenOver));
    assert_eq!(hub.consumer_pids().len(), 1);
}

#[test]
fn a_removal_waits_for_its_save_and_the_committer_saves_it_first() {
    let hub = hub();
    let (conn, _) = hub.register_conn();
    hub.subscribe(conn, &subscribe("s", false), None).unwrap();
    let (removed, unknown, gen) = hub.unsubscribe(conn, &["s".into(), "nope".into()]);
    assert_eq!(
        (removed, unknown),
        (vec!["s".to_owned()], vec!["nope".to_owned()])
    );
    assert_eq!(gen, Some(2));
    // Nothing staged and a reply waits: the save goes at once.
    match hub.next_commit_work(std::time::Instant::now()) {
        CommitWork::Save { snapshot, gen, .. } => {
            assert_eq!(gen, 2);
            assert!(snapshot.subscriptions.is_empty());
            hub.saved(gen, StoreInfo::default());
        }
        _ => panic!("expected a save"),
    }
    assert_eq!(hub.durable().borrow().subs_gen, 2);
    assert!(!hub.has_subscription("s"));
}

#[test]
fn a_failed_store_stops_the_committer_and_the_bus() {
    let (hub, listener) = hub_with(false);
    hub.append(ev("a")).unwrap();
    hub.store_failed("disk gone".into());
    assert!(matches!(
        hub.next_commit_work(std::time::Instant::now()),
        CommitWork::Stop
    ));
    assert_eq!(hub.store_error().as_deref(), Some("disk gone"));
    assert_eq!(listener.reason(), Some(ByeReason::Shutdown));
    assert_eq!(
        hub.durable().borrow().failed.as_deref(),
        Some("disk gone"),
        "waiting publishers are told"
    );
}

#[test]
fn closing_flushes_the_staged_events_then_saves_the_final_snapshot() {
    let hub = hub();
    hub.append(ev("a")).unwrap();
    hub.close_store();
    assert_eq!(commit_staged(&hub), vec![1]);
    match hub.next_commit_work(std::time::Instant::now()) {
        CommitWork::Final(snapshot) => {
            assert!(snapshot.clean);
            assert_eq!(snapshot.head_seq, 1);
        }
        _ => panic!("expected the final snapshot"),
    }
}

#[test]
fn the_source_handle_reports_state_and_counts_bad_input() {
    let hub = hub();
    let (conn, handle) = hub.register_conn();
    hub.subscribe(conn, &subscribe("s", true), None).unwrap();
    assert!(ready_now(handle.wake.notified()), "the attach woke it");
    let source = hub.source_handle();
    let gen = hub.source_gen();
    source.set_source_state(
        v1::SourceState {
            state: v1::SourceStatus::Connected as i32,
            since_unix_ms: 5,
            ..Default::default()
        },
        None,
    );
    assert_eq!(hub.source_gen(), gen + 1);
    assert_eq!(hub.source_state().1, gen + 1);
    source.source_malformed("not json");
    source.source_unroutable("no-route", "x");
    let appended = source.append(ev("a")).unwrap();
    assert_eq!(appended.seq, 1);
    let status = hub.status_json(10);
    assert_eq!(status["source"]["state"], "connected");
    assert_eq!(status["source"]["malformed"], 1);
    assert_eq!(status["source"]["unroutable"]["no-route"], 1);
    // The consumer was woken to see the new state.
    assert!(ready_now(handle.wake.notified()));
}

/// Whether `fut` is ready at once (a stored `Notify` permit).
fn ready_now(fut: impl std::future::Future<Output = ()>) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(1), fut)
            .await
            .is_ok()
    })
}

/// Pulls until `n` events came (the filter thread judges meanwhile).
fn pull_n(hub: &Hub, conn: super::ConnId, n: usize) -> Vec<u64> {
    let mut got = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while got.len() < n && std::time::Instant::now() < deadline {
        match hub.pull(conn, 10, 1 << 20).0 {
            Some(d) => got.extend(d.events.iter().map(|e| e.0.seq)),
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    got
}

#[test]
fn a_where_is_judged_by_the_filter_thread_while_the_hub_serves_everyone_else() {
    use crate::judge::{spawn, Evaluator};
    let (hub, _shutdown) = hub_with(true);
    spawn(hub.filter_handle(), Evaluator::Here).unwrap();
    let (judged, _h1) = hub.register_conn();
    let (plain, _h2) = hub.register_conn();
    let mut req = subscribe("judged", true);
    req.where_exprs = vec![".data.n % 2 == 0".into()];
    hub.subscribe(judged, &req, None).unwrap();
    hub.subscribe(plain, &subscribe("plain", true), None)
        .unwrap();
    for i in 1..=6 {
        let mut e = ev(&format!("e{i}"));
        e.data = serde_json::json!({ "n": i }).to_string();
        hub.append(e).unwrap();
    }
    // The plain subscription never waits for the filter.
    assert_eq!(pull_n(&hub, plain, 6), [1, 2, 3, 4, 5, 6]);
    assert_eq!(pull_n(&hub, judged, 3), [2, 4, 6]);
    let st = hub.status_json(10);
    let sub = st["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "judged")
        .unwrap()
        .clone();
    assert_eq!(sub["matched"], 3, "{sub:#}");
    assert_eq!(sub["where_waiting"], 0, "{sub:#}");
    // Shutting down ends the thread.
    hub.shutdown_trigger().trigger(ByeReason::Shutdown);
}
