//! What a stored subscriptions snapshot (`subscriptions.json`) must satisfy
//! before the bus trusts it: [`check_snapshot`]. Anything this build cannot
//! restore as it was saved — a head beyond [`MAX_SEQ`], a cursor or a kept
//! seq beyond the head, a pattern, filter, id, state or policy this build
//! refuses, a timestamp or counter that arithmetic on it could overflow — is
//! refused with the entry and the reason; the caller refuses to start and
//! leaves the file as it is (a downgrade must never destroy data). Pure.

use std::{collections::HashSet, fmt};

use proto::limits::{check_backoff, check_subscription_id, MAX_SEQ, MAX_SUBSCRIPTIONS};

use crate::{
    pattern::Selector,
    store::{Snapshot, SubRecord, SNAPSHOT_FORMAT},
};

/// Why a snapshot cannot be restored: which entry (`None`: the snapshot
/// itself) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotError {
    /// The subscription's id (clipped), or its index when the id is bad.
    pub entry: Option<String>,
    pub why: String,
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entry {
            Some(e) => write!(f, "subscription {e}: {}", self.why),
            None => f.write_str(&self.why),
        }
    }
}

fn whole(why: String) -> SnapshotError {
    SnapshotError { entry: None, why }
}

/// Checks every entry of `snap`; the first problem found is returned.
pub fn check_snapshot(snap: &Snapshot) -> Result<(), SnapshotError> {
    if snap.format != SNAPSHOT_FORMAT {
        return Err(whole(format!(
            "format {} is not one this busd knows (it reads {SNAPSHOT_FORMAT})",
            snap.format
        )));
    }
    let head = snap.head_seq;
    if head > MAX_SEQ {
        return Err(whole(format!(
            "head_seq {head} is beyond the highest seq a bus assigns ({MAX_SEQ})"
        )));
    }
    if snap.log_floor > head.saturating_add(1) {
        return Err(whole(format!(
            "log_floor {} is beyond head_seq {head}",
            snap.log_floor
        )));
    }
    if snap.saved_at_unix_ms < 0 {
        return Err(whole(format!(
            "saved_at_unix_ms {} is before 1970",
            snap.saved_at_unix_ms
        )));
    }
    if snap.subscriptions.len() > MAX_SUBSCRIPTIONS {
        return Err(whole(format!(
            "{} subscriptions; this busd holds at most {MAX_SUBSCRIPTIONS}",
            snap.subscriptions.len()
        )));
    }
    let mut ids = HashSet::new();
    for (i, rec) in snap.subscriptions.iter().enumerate() {
        let entry = match check_subscription_id("id", &rec.id) {
            Ok(()) => rec.id.clone(),
            Err(why) => {
                return Err(SnapshotError {
                    entry: Some(format!("#{}", i + 1)),
                    why,
                })
            }
        };
        let at = |why: String| SnapshotError {
            entry: Some(entry.clone()),
            why,
        };
        if !ids.insert(rec.id.as_str()) {
            return Err(at("the id appears twice".into()));
        }
        check_record(rec, head).map_err(at)?;
    }
    Ok(())
}

/// One subscription against the snapshot's head.
fn check_record(rec: &SubRecord, head: u64) -> Result<(), String> {
    Selector::stored(&rec.patterns, &rec.filter)
        .and_then(|sel| sel.with_where(&rec.where_exprs))
        .map_err(|e| format!("this busd refuses its patterns, filter or --where: {e}"))?;
    let beyond = |what: &str, seq: u64| -> Result<(), String> {
        if seq > head {
            Err(format!("{what} {seq} is beyond head_seq {head}"))
        } else {
            Ok(())
        }
    };
    beyond("cursor", rec.cursor)?;
    beyond("max_sent_seq", rec.max_sent_seq)?;
    beyond("shared_from", rec.shared_from)?;
    for &s in &rec.pinned {
        beyond("pinned seq", s)?;
    }
    for &s in &rec.acked {
        beyond("acked seq", s)?;
    }
    for &(s, _) in &rec.deliveries {
        beyond("delivered seq", s)?;
    }
    for p in &rec.parked {
        beyond("parked seq", p.seq)?;
    }
    if let Some(h) = &rec.halt {
        beyond("halted seq", h.seq)?;
    }
    let mut times = vec![("created_at_unix_ms", rec.created_at_unix_ms)];
    times.extend(
        rec.detached_since_unix_ms
            .map(|t| ("detached_since_unix_ms", t)),
    );
    times.extend(rec.delayed.iter().map(|&(_, t)| ("delayed due time", t)));
    times.extend(
        rec.parked
            .iter()
            .map(|p| ("parked_at_unix_ms", p.parked_at_unix_ms)),
    );
    times.extend(
        rec.halt
            .iter()
            .map(|h| ("halt since_unix_ms", h.since_unix_ms)),
    );
    if let Some((what, t)) = times.into_iter().find(|&(_, t)| t < 0) {
        return Err(format!("{what} {t} is before 1970"));
    }
    for &(s, _) in &rec.delayed {
        beyond("delayed seq", s)?;
    }
    let c = &rec.counters;
    let counters = [
        ("matched", c.matched),
        ("delivered", c.delivered),
        ("acked", c.acked),
        ("redelivered", c.redelivered),
        ("lost", c.lost),
        ("parked", c.parked),
        ("parked_dropped", c.parked_dropped),
        ("gap_lost", rec.gap_lost),
    ];
    if let Some((what, n)) = counters.into_iter().find(|&(_, n)| n > MAX_SEQ) {
        return Err(format!("counter {what} {n} is beyond {MAX_SEQ}"));
    }
    if let Some(&(s, n)) = rec.deliveries.iter().find(|&&(_, n)| n > u32::MAX / 2) {
        return Err(format!(
            "delivery count {n} of seq {s} is beyond {}",
            u32::MAX / 2
        ));
    }
    if !matches!(rec.on_poison.as_str(), "halt" | "park") {
        return Err(format!(
            "on_poison {} is not one this busd knows (halt, park)",
            proto::limits::quoted(&rec.on_poison)
        ));
    }
    match (rec.state.as_str(), &rec.halt) {
        ("active" | "disabled", _) | ("halted", Some(_)) => {}
        ("halted", None) => return Err("state halted without its halt record".into()),
        (other, _) => {
            return Err(format!(
                "state {} is not one this busd knows (active, halted, disabled)",
                proto::limits::quoted(other)
            ))
        }
    }
    check_backoff(&rec.backoff_ms)
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, Instant},
    };

    use proptest::prelude::*;

    use super::*;
    use crate::subscription::Subscription;

    fn record(id: &str) -> SubRecord {
        SubRecord {
            created_at_unix_ms: 1,
            detached_since_unix_ms: Some(2),
            ..SubRecord::for_test(id, "a.b", 5)
        }
    }

    fn snapshot(head: u64, subs: Vec<SubRecord>) -> Snapshot {
        Snapshot {
            format: SNAPSHOT_FORMAT,
            clean: true,
            head_seq: head,
            log_floor: 1,
            saved_at_unix_ms: 3,
            subscriptions: subs,
        }
    }

    #[test]
    fn a_sound_snapshot_passes() {
        assert_eq!(
            check_snapshot(&snapshot(10, vec![record("s1"), record("s2")])),
            Ok(())
        );
    }

    #[test]
    fn what_cannot_be_restored_is_named() {
        let why = |snap: Snapshot| check_snapshot(&snap).unwrap_err().to_string();
        assert!(why(snapshot(u64::MAX, vec![])).contains("head_seq 18446744073709551615 is beyond"));
        assert_eq!(check_snapshot(&snapshot(MAX_SEQ, vec![])), Ok(()));
        let mut r = record("s1");
        r.cursor = 11;
        assert_eq!(
            why(snapshot(10, vec![r])),
            "subscription s1: cursor 11 is beyond head_seq 10"
        );
        let mut r = record("s1");
        r.patterns = vec!["a.*.b".into()];
        assert!(why(snapshot(10, vec![r]))
            .starts_with("subscription s1: this busd refuses its patterns"));
        let mut r = record("s1");
        r.state = "paused".into();
        assert!(why(snapshot(10, vec![r])).contains("state \"paused\""));
        let mut r = record("bad id!");
        r.cursor = 0;
        assert!(why(snapshot(10, vec![r])).starts_with("subscription #1: "));
        assert!(why(snapshot(10, vec![record("s"), record("s")])).contains("appears twice"));
        let mut r = record("s1");
        r.detached_since_unix_ms = Some(i64::MIN);
        assert!(why(snapshot(10, vec![r])).contains("before 1970"));
        let mut r = record("s1");
        r.counters.matched = u64::MAX;
        assert!(why(snapshot(10, vec![r])).contains("counter matched"));
    }

    /// Restores a checked snapshot's subscriptions over an empty log.
    fn restore_all(snap: &Snapshot) {
        let now = (Instant::now(), crate::clock::now_ms());
        for rec in &snap.subscriptions {
            let sel = Selector::stored(&rec.patterns, &rec.filter).expect("checked");
            let sub = Subscription::restore(
                rec,
                sel,
                &[] as &[Arc<crate::eventlog::LoggedEvent>],
                (snap.log_floor, snap.head_seq, snap.clean),
                now,
                16,
            );
            let _ = sub.record(snap.log_floor, snap.head_seq, now);
            let _ = sub.expires_at();
        }
    }

    fn seq() -> impl Strategy<Value = u64> {
        prop_oneof![0..20u64, any::<u64>(), Just(u64::MAX), Just(MAX_SEQ)]
    }

    fn time() -> impl Strategy<Value = i64> {
        prop_oneof![0..20i64, any::<i64>(), Just(i64::MIN), Just(i64::MAX)]
    }

    prop_compose! {
        fn arb_record()(
            id in "[a-z]{1,3}|.{0,3}",
            pattern in prop_oneof![Just("a.b".to_owned()), Just("*".to_owned()), ".{0,6}"],
            ttl_ms in prop_oneof![Just(0u64), any::<u64>(), Just(u64::MAX)],
            (cursor, max_sent, shared_from, extra) in (seq(), seq(), seq(), seq()),
            (created, detached, due) in (time(), proptest::option::of(time()), time()),
            counter in seq(),
            state in prop_oneof![Just("active"), Just("halted"), Just("disabled"), Just("x")],
            backoff in proptest::collection::vec(any::<u64>(), 0..3),
        ) -> SubRecord {
            let mut r = record(&id);
            r.patterns = vec![pattern];
            r.ttl_ms = ttl_ms;
            r.cursor = cursor;
            r.max_sent_seq = max_sent;
            r.shared_from = shared_from;
            r.pinned = vec![extra];
            r.acked = vec![extra];
            r.deliveries = vec![(extra, u32::MAX)];
            r.delayed = vec![(extra, due)];
            r.created_at_unix_ms = created;
            r.detached_since_unix_ms = detached;
            r.counters.redelivered = counter;
            r.gap_lost = counter;
            r.state = state.into();
            r.backoff_ms = backoff;
            r
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Arbitrary bytes as `subscriptions.json`: parsing and checking
        /// never panic, and take time linear in the input.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let t = Instant::now();
            if let Ok(snap) = serde_json::from_slice::<Snapshot>(&bytes) {
                if check_snapshot(&snap).is_ok() {
                    restore_all(&snap);
                }
            }
            prop_assert!(t.elapsed() < Duration::from_secs(2));
        }

        /// Structured snapshots with extreme numbers: whatever the check
        /// lets through is restored and saved again without a panic.
        #[test]
        fn whatever_passes_the_check_restores_without_a_panic(
            head in seq(),
            floor in seq(),
            recs in proptest::collection::vec(arb_record(), 0..4),
        ) {
            let mut snap = snapshot(head, recs);
            snap.log_floor = floor;
            let text = serde_json::to_vec(&snap).unwrap();
            let back: Snapshot = serde_json::from_slice(&text).unwrap();
            if check_snapshot(&back).is_ok() {
                restore_all(&back);
            }
        }
    }
}
