//! A lost lease fences the old owner: its lease session is terminated
//! (`pg_terminate_backend`) while it runs, while it is frozen (`SIGSTOP`)
//! between transactions, and while it is frozen inside a transaction that
//! holds the cluster's row. The other host takes over within the bound; the
//! old owner acks nothing it had not appended, appends nothing more, and
//! its bus stops with the fenced error.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use dws_tests::{
    fake_dingtalk::FakeDingTalk, freeze_when, pg::PgServer, wait_pid_gone, Sig, EXIT_TIMEOUT,
};

use super::{
    seqs_and_ids,
    upstream::{
        acked_count, acked_on, assert_log_is, assert_once_in_order,
        assert_one_connection_at_a_time, assert_prefix_consistent, assert_survivor_has_everything,
        busd_pid, ev, head_seq, lines_until, push_stream, signal, teardown, wait_new_connection,
        TwoHosts, T, TAKEOVER_BOUND,
    },
    wait_cluster,
};

/// What a consumer of a bus that lost the lease prints (see
/// `connection::replies::store_failed_message` and `cluster::lease`).
const FENCED_ERROR: &str =
    "Error: the bus stopped: its store failed (lost the cluster's upstream lease: ";

/// Ends the owner's lease session from the server side, as an operator or a
/// network loss would: `pg_terminate_backend` of its `…/lease` session.
fn terminate_lease_session(server: &PgServer, host: &str) {
    let out = server.psql(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'busd/default/{host}/lease'"
    ));
    assert_eq!(out, "t", "one lease session of {host} terminated");
}

/// The owner's lease session is terminated mid-stream: its bus stops (its
/// consumer ends with exit 1 and the fenced error, its busd exits, its
/// upstream connection closes), the other host takes the lease and the
/// upstream, every event the fake saw acked arrives at the survivor once
/// and in order, and the log holds exactly the survivor's stream. The next
/// `dws` command on the old owner's host starts a follower there; publishes
/// from both hosts keep working.
#[test]
fn a_terminated_lease_session_stops_the_old_owner_and_the_other_host_takes_over() {
    let server = PgServer::start();
    let fake = FakeDingTalk::start();
    let (owner, c_owner, follower, mut c_follower, owner_name, follower_name) =
        TwoHosts::start(&server, &fake).split();
    let old_pid = busd_pid(&owner);
    let old_conn = fake.wait_connected(T);

    const N: usize = 800;
    let ids: Vec<String> = (1..=N).map(|i| format!("ll-{i:04}")).collect();
    let done = AtomicBool::new(false);
    let (new_conn, takeover, out_owner) = std::thread::scope(|s| {
        let pusher = s.spawn(|| push_stream(&fake, &ids, &done));
        fake.wait_until("100 events acked by the first owner", T, |s| {
            acked_count(s) >= 100
        });
        let cut_at = Instant::now();
        terminate_lease_session(&server, owner_name);
        let out = c_owner.wait_exit(T);
        let (new_conn, takeover) = wait_new_connection(&fake, cut_at);
        assert!(
            !done.load(Ordering::Acquire),
            "the stream ended before the takeover: push more events\n{}\n{}",
            owner.bus_log_tail(),
            follower.bus_log_tail()
        );
        pusher.join().expect("pusher");
        (new_conn, takeover, out)
    });
    eprintln!(
        "cluster failover: the lease session of {owner_name} terminated; {follower_name} \
         opened the upstream {takeover:?} later"
    );
    assert!(takeover < TAKEOVER_BOUND, "the takeover took {takeover:?}");

    // The old owner's bus stopped, saying why.
    let err = out_owner.assert_error(1);
    assert!(err.starts_with(FENCED_ERROR), "{out_owner}");
    assert!(
        wait_pid_gone(old_pid, EXIT_TIMEOUT),
        "the fenced busd {old_pid} is still running\n{}",
        owner.bus_log_tail()
    );
    let conns = fake.connections();
    assert_eq!(
        conns.iter().map(|c| c.id).collect::<Vec<_>>(),
        [old_conn, new_conn],
        "{}",
        fake.summary()
    );
    assert_one_connection_at_a_time(&fake);

    let got = assert_survivor_has_everything(
        &server,
        &fake,
        &mut c_follower,
        &ids,
        "ll-last",
        &out_owner.stdout_lines(),
        "the fenced owner's consumer",
    );
    wait_cluster(&follower, "the survivor owns the upstream", |c| {
        c["owner"] == follower_name && c["role"] == "owner"
    });

    // Publishing works on the new owner, and from the old owner's host,
    // whose next command starts a follower there.
    let head = got.last().map(|(s, _)| *s).unwrap_or_default();
    let p1 = follower.publish("after.x", "{}", &["--id", "after-1"]);
    assert_eq!(p1["seq"].as_u64(), Some(head + 1), "{p1}");
    let p2 = owner.publish("after.x", "{}", &["--id", "after-2"]);
    assert_eq!(p2["seq"].as_u64(), Some(head + 2), "{p2}");
    let c = wait_cluster(&owner, "the old owner's host back as a follower", |c| {
        c["role"] == "follower" && c["owner"] == follower_name
    });
    assert_eq!(c["host"], owner_name, "{c:#}");
    let after = lines_until(&mut c_follower, "after-2");
    assert_eq!(
        after[after.len() - 2..],
        [
            (head + 1, "after-1".to_owned()),
            (head + 2, "after-2".to_owned())
        ]
    );
    teardown(server, &[&owner, &follower]);
}

/// Stops (`SIGSTOP`) the busd `pid` of `host` at a moment when none of its
/// database sessions is inside a transaction (a host frozen inside one
/// holds up the takeover until the server ends that session: see
/// [`an_owner_frozen_inside_a_transaction_holds_up_the_takeover_only_within_the_loss_bound`]).
/// Returns when it is stopped.
pub(super) fn freeze_between_transactions(server: &PgServer, pid: i32, host: &str) {
    // Whatever the server was still running for it finishes while it is
    // stopped, before the probe looks.
    let frozen = freeze_when(pid, 50, Duration::from_millis(37), || {
        let in_tx = server.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name LIKE 'busd/default/{host}/%' \
               AND state <> 'idle'"
        ));
        (in_tx == "0").then_some(())
    });
    if frozen.is_none() {
        panic!("busd {pid} of {host} was inside a transaction at each of 50 tries");
    }
}

/// The owner freezes (`SIGSTOP`), events reach its connection unread, and
/// its lease session is terminated: the other host takes over (while the
/// frozen owner still holds its upstream connection) and appends. When the
/// old owner wakes, it reads the frames waiting for it but is fenced: it
/// acks none of them and appends nothing (its consumer saw nothing past the
/// freeze and ends with the fenced error); once its connection is gone the
/// fake redelivers them to the new owner, and the survivor gets every event
/// once, in order.
#[test]
fn a_frozen_owner_whose_lease_was_taken_neither_appends_nor_acks_when_it_wakes() {
    let server = PgServer::start();
    let fake = FakeDingTalk::start();
    let (owner, mut c_owner, follower, mut c_follower, owner_name, follower_name) =
        TwoHosts::start(&server, &fake).split();
    let old_pid = busd_pid(&owner);
    let old_conn = fake.wait_connected(T);
    let ids = |stretch: &str| -> Vec<String> {
        (1..=10).map(|i| format!("fz-{stretch}-{i:02}")).collect()
    };
    let (before, frozen, after) = (ids("a"), ids("b"), ids("c"));

    for id in &before {
        fake.push_event(&ev(id));
    }
    fake.wait_until("the first stretch acked", T, |s| s.unacked() == 0);
    let seen_by_owner = lines_until(&mut c_owner, "fz-a-10");
    lines_until(&mut c_follower, "fz-a-10");

    freeze_between_transactions(&server, old_pid, owner_name);
    let frozen_at = Instant::now();
    for id in &frozen {
        fake.push_event(&ev(id));
    }
    fake.wait_until("the second stretch sent to the frozen owner", T, |s| {
        s.outbox
            .iter()
            .filter(|o| o.event_id.starts_with("fz-b-"))
            .all(|o| o.conn == Some(old_conn))
    });
    let cut_at = Instant::now();
    terminate_lease_session(&server, owner_name);
    let (new_conn, takeover) = wait_new_connection(&fake, cut_at);
    eprintln!(
        "cluster failover: the lease session of the frozen {owner_name} terminated; \
         {follower_name} opened the upstream {takeover:?} later"
    );
    assert!(takeover < TAKEOVER_BOUND, "the takeover took {takeover:?}");
    for id in &after {
        fake.push_event(&ev(id));
    }
    lines_until(&mut c_follower, "fz-c-10");

    let woke_at = Instant::now();
    signal(old_pid, Sig::SIGCONT);
    let out = c_owner.wait_exit(T);
    let err = out.assert_error(1);
    assert!(err.starts_with(FENCED_ERROR), "{out}");
    assert!(
        wait_pid_gone(old_pid, EXIT_TIMEOUT),
        "the fenced busd {old_pid} is still running\n{}",
        owner.bus_log_tail()
    );
    let dead = seqs_and_ids(
        &out.stdout_lines()
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        dead, seen_by_owner,
        "the fenced owner's consumer got nothing after the freeze"
    );

    fake.wait_until("every event acked", T, |s| {
        s.outbox.len() == 30 && s.unacked() == 0
    });
    fake.with_state(|s| {
        let late: Vec<_> = s
            .acks
            .iter()
            .filter(|a| a.conn == old_conn && a.at >= frozen_at)
            .map(|a| {
                (
                    a.message_id.clone(),
                    a.at.saturating_duration_since(woke_at),
                )
            })
            .collect();
        assert!(late.is_empty(), "the fenced owner acked {late:?}");
        for o in s.outbox.iter().filter(|o| o.event_id.starts_with("fz-b-")) {
            assert!(o.sends >= 2, "{} was redelivered: {o:?}", o.event_id);
            assert!(
                s.acks_for(&o.message_id).iter().all(|a| a.conn == new_conn),
                "{} acked on the new owner's connection only",
                o.event_id
            );
        }
    });
    let last = "fz-last";
    let mid = fake.push_event(&ev(last));
    fake.wait_ack(&mid, T);
    let got = lines_until(&mut c_follower, last);
    let want: Vec<String> = [before, frozen, after, vec![last.into()]].concat();
    assert_once_in_order(&got, &want, "the survivor's consumer");
    assert_log_is(&server, &got);
    let conns = fake.connections();
    assert_eq!(
        conns.iter().map(|c| c.id).collect::<Vec<_>>(),
        [old_conn, new_conn],
        "{}",
        fake.summary()
    );
    teardown(server, &[&owner, &follower]);
}

/// Generous bound of a takeover held up by an owner frozen inside a
/// transaction: the server ends its sessions idle in a transaction after
/// busd's bound (4.5 s; two of them may hold the cluster's row in turn), and
/// the silent-loss target is 10 s.
const FROZEN_IN_TX_BOUND: Duration = Duration::from_secs(15);

/// Stops (`SIGSTOP`) the busd `pid` of `host` at a moment when one of its
/// database sessions is idle inside a transaction that locked the
/// cluster's row (its committer or inbox task between two statements);
/// retries until it is. Returns what `pg_stat_activity` showed of it.
fn freeze_inside_a_transaction(server: &PgServer, pid: i32, host: &str) -> String {
    let frozen = freeze_when(pid, 300, Duration::from_millis(13), || {
        let in_tx = server.psql(&format!(
            "SELECT string_agg(a.application_name || ': ' \
                    || regexp_replace(left(a.query, 60), '\\s+', ' ', 'g'), '; ') \
             FROM pg_stat_activity a \
             WHERE a.application_name LIKE 'busd/default/{host}/%' \
               AND a.state LIKE 'idle in transaction%' \
               AND EXISTS (SELECT 1 FROM pg_locks l \
                           WHERE l.pid = a.pid AND l.relation = 'dws_cluster'::regclass)"
        ));
        (!in_tx.is_empty()).then_some(in_tx)
    });
    frozen.unwrap_or_else(|| {
        panic!("busd {pid} of {host} was never caught inside a transaction in 300 tries")
    })
}

/// The owner freezes while its committer is inside an append transaction
/// (it holds the cluster row's lock, which the next owner's epoch bump
/// needs), and its lease session is terminated. The server ends the frozen
/// session after busd's idle-in-transaction bound, so the other host takes
/// over within that bound instead of waiting for the frozen one to wake.
/// When the old owner wakes it is fenced: it acks nothing more, its bus
/// stops; the survivor gets every event once, in order.
#[test]
fn an_owner_frozen_inside_a_transaction_holds_up_the_takeover_only_within_the_loss_bound() {
    let server = PgServer::start();
    let fake = FakeDingTalk::start();
    let (owner, c_owner, follower, mut c_follower, owner_name, follower_name) =
        TwoHosts::start(&server, &fake).split();
    let old_pid = busd_pid(&owner);
    let old_conn = fake.wait_connected(T);

    // Bursts keep the owner's committer busy until it is caught frozen
    // inside a transaction.
    let stop = AtomicBool::new(false);
    let (pushed, caught, frozen_at) = std::thread::scope(|s| {
        let pusher = s.spawn(|| {
            let mut pushed = vec![];
            while !stop.load(Ordering::Acquire) {
                for _ in 0..10 {
                    let id = format!("fx-{:05}", pushed.len() + 1);
                    fake.push_event(&ev(&id));
                    pushed.push(id);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            pushed
        });
        fake.wait_until("20 events acked by the first owner", T, |s| {
            acked_count(s) >= 20
        });
        let caught = freeze_inside_a_transaction(&server, old_pid, owner_name);
        let frozen_at = Instant::now();
        stop.store(true, Ordering::Release);
        (pusher.join().expect("pusher"), caught, frozen_at)
    });
    let cut_at = Instant::now();
    terminate_lease_session(&server, owner_name);
    let (new_conn, takeover) = wait_new_connection(&fake, cut_at);
    eprintln!(
        "cluster failover: {owner_name} frozen inside a transaction ({caught}) and its lease \
         session terminated; {follower_name} opened the upstream {takeover:?} later"
    );
    assert!(
        takeover < FROZEN_IN_TX_BOUND,
        "the takeover took {takeover:?}"
    );
    // Nothing is pushed any more and the frozen owner's connection still
    // holds what it was sent: the log stands where the old owner left it.
    let head_at_takeover = head_seq(&server);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(head_seq(&server), head_at_takeover);

    signal(old_pid, Sig::SIGCONT);
    let out = c_owner.wait_exit(T);
    let err = out.assert_error(1);
    eprintln!("cluster failover: the frozen owner's consumer, once it woke: {err}");
    assert!(
        err.starts_with("Error: the bus stopped: its store failed ("),
        "{out}"
    );
    assert!(
        wait_pid_gone(old_pid, EXIT_TIMEOUT),
        "the fenced busd {old_pid} is still running\n{}",
        owner.bus_log_tail()
    );
    fake.wait_until("every event acked", T, |s| {
        s.outbox.len() == pushed.len() && s.unacked() == 0
    });
    let last = "fx-last";
    let mid = fake.push_event(&ev(last));
    fake.wait_ack(&mid, T);
    let got = lines_until(&mut c_follower, last);
    // Acks it owed for events it had appended before the freeze may leave
    // once it wakes; an ack for anything appended later (by the new owner)
    // would mean it acked what it had not appended.
    let old_acked = acked_on(&fake, old_conn);
    let late = old_acked.iter().filter(|(_, at)| *at >= frozen_at).count();
    eprintln!("cluster failover: {late} ack(s) the frozen owner owed left once it woke");
    for (id, _) in &old_acked {
        let seq = got.iter().find(|(_, i)| i == id).map(|(s, _)| *s);
        assert!(
            seq.is_some_and(|s| s <= head_at_takeover),
            "the fenced owner acked {id} (seq {seq:?}), which it had not appended \
             (the log stood at {head_at_takeover} when the other host took over)"
        );
    }
    let mut want = pushed;
    want.push(last.into());
    assert_once_in_order(&got, &want, "the survivor's consumer");
    let dead = seqs_and_ids(
        &out.stdout_lines()
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>(),
    );
    assert_prefix_consistent(&dead, &got, "the fenced owner's consumer");
    assert_log_is(&server, &got);
    let conns = fake.connections();
    assert_eq!(
        conns.iter().map(|c| c.id).collect::<Vec<_>>(),
        [old_conn, new_conn],
        "{}",
        fake.summary()
    );
    teardown(server, &[&owner, &follower]);
}
