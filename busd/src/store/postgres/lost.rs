//! What a host's named subscriptions lost while the host was away: the
//! owner's retention holds back what they need (`log::retention_floor`)
//! only up to a hard cap, so a host that comes back after the cap deleted
//! part of its backlog finds its cursor (or a parked event) below the
//! oldest event the log still holds. Recovery reports that here, as a gap
//! of each such subscription, instead of silently starting further on.

use crate::store::SubRecord;

/// Counts, for every per-host subscription of `records`, the seqs after its
/// cursor and the parked events below `first_kept` (the oldest seq the log
/// still holds) as lost and moves its cursor up to them; returns a note per
/// subscription that lost any.
pub fn report_lost(records: &mut [SubRecord], first_kept: u64) -> Vec<String> {
    let mut notes = vec![];
    for r in records.iter_mut().filter(|r| !r.shared) {
        let behind = first_kept.saturating_sub(r.cursor.saturating_add(1));
        let parked_before = r.parked.len();
        r.parked.retain(|p| p.seq >= first_kept);
        let parked = (parked_before - r.parked.len()) as u64;
        let lost = behind + parked;
        if lost == 0 {
            continue;
        }
        r.gap_lost += lost;
        r.counters.lost += lost;
        r.cursor = r.cursor.max(first_kept.saturating_sub(1));
        r.max_sent_seq = r.max_sent_seq.max(r.cursor);
        notes.push(format!(
            "subscription {}: {lost} event(s) it had not acked were deleted from the cluster's \
             log while this host was away (past the hard cap of what a host may hold back); \
             reported as a gap",
            r.id
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ParkedRecord;

    fn rec(id: &str, cursor: u64, parked: &[u64]) -> SubRecord {
        SubRecord {
            ttl_ms: 60_000,
            parked: parked
                .iter()
                .map(|&seq| ParkedRecord {
                    seq,
                    deliveries: 1,
                    parked_at_unix_ms: 0,
                    reason: None,
                })
                .collect(),
            ..SubRecord::for_test(id, "a.*", cursor)
        }
    }

    #[test]
    fn a_backlog_below_the_kept_log_is_a_gap() {
        let mut rs = vec![
            rec("a", 3, &[]),
            rec("b", 300, &[2, 260]),
            rec("c", 299, &[]),
        ];
        let notes = report_lost(&mut rs, 256);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(
            (rs[0].gap_lost, rs[0].counters.lost, rs[0].cursor),
            (252, 252, 255)
        );
        assert_eq!((rs[1].gap_lost, rs[1].cursor), (1, 300));
        assert_eq!(rs[1].parked.len(), 1);
        assert_eq!(rs[2].gap_lost, 0, "nothing it needed is gone");
    }

    #[test]
    fn a_shared_subscription_loses_nothing_here() {
        let mut rs = vec![SubRecord {
            shared: true,
            ..rec("s", 3, &[])
        }];
        assert!(report_lost(&mut rs, 256).is_empty());
        assert_eq!(rs[0].gap_lost, 0);
    }
}
