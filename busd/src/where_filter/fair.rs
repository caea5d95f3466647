//! Which subscription's events the filter judges next: the one that used
//! the least worker time since it last had work (virtual time, as a fair
//! scheduler keeps it), in batches of about [`SLICE`] of its own average
//! cost. So a subscription whose filter is cheap waits behind a costly one
//! for at most one batch of it (one event, once its cost is known), and a
//! costly one gets the worker only as much as every other one that wants it.

use std::{collections::HashMap, time::Duration};

use super::limits::MAX_BATCH;

/// The worker time one batch aims at.
pub const SLICE: Duration = Duration::from_millis(2);

#[derive(Debug, Default, Clone, Copy)]
struct Used {
    /// Worker time, in ns, as the fair share counts it.
    vtime: u64,
    /// Average cost of one event, in ns (0: unknown yet).
    avg: u64,
}

/// The scheduler's memory of what each subscription used.
#[derive(Debug, Default)]
pub struct Fair {
    used: HashMap<String, Used>,
    /// The least virtual time among those that had work last: a
    /// subscription coming back from idle starts there, with no credit.
    floor: u64,
}

impl Fair {
    /// The index in `ids` (subscriptions with events to judge; not empty)
    /// of the one to judge next.
    pub fn pick(&mut self, ids: &[&str]) -> usize {
        let floor = self.floor;
        let mut best = (u64::MAX, 0);
        for (i, id) in ids.iter().enumerate() {
            let v = self.used.get(*id).map_or(floor, |u| u.vtime.max(floor));
            if v < best.0 {
                best = (v, i);
            }
        }
        if best.0 != u64::MAX {
            self.floor = best.0;
        }
        if self.used.len() > 4 * ids.len() + 64 {
            self.used.retain(|k, _| ids.contains(&k.as_str()));
        }
        best.1
    }

    /// How many of `id`'s events go in one batch: one while its cost is
    /// not known (so a costly filter's first batch is one event too).
    pub fn batch_len(&self, id: &str) -> usize {
        match self.used.get(id).map_or(0, |u| u.avg) {
            0 => 1,
            avg => usize::try_from(SLICE.as_nanos() as u64 / avg)
                .unwrap_or(MAX_BATCH)
                .clamp(1, MAX_BATCH),
        }
    }

    /// `id`'s batch took `costs`, one per event.
    pub fn charge(&mut self, id: &str, costs: &[Duration]) {
        if costs.is_empty() {
            return;
        }
        let floor = self.floor;
        let u = self.used.entry(id.to_owned()).or_default();
        let total: u64 = costs
            .iter()
            .map(|c| u64::try_from(c.as_nanos()).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        u.vtime = u.vtime.max(floor).saturating_add(total);
        let per = (total / costs.len() as u64).max(1);
        // The newest batch weighs a quarter: a filter that became costly
        // is seen within a few batches.
        u.avg = if u.avg == 0 {
            per
        } else {
            (u.avg.saturating_mul(3) / 4).saturating_add(per / 4).max(1)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Runs `rounds` picks among subscriptions costing `cost[i]` per event;
    /// returns the events each got judged.
    fn simulate(cost: &[Duration], rounds: usize) -> Vec<usize> {
        let ids: Vec<String> = (0..cost.len()).map(|i| format!("s{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut fair = Fair::default();
        let mut judged = vec![0; cost.len()];
        for _ in 0..rounds {
            let i = fair.pick(&refs);
            let n = fair.batch_len(refs[i]);
            fair.charge(refs[i], &vec![cost[i]; n]);
            judged[i] += n;
        }
        judged
    }

    #[test]
    fn a_cheap_filter_is_not_held_up_by_a_costly_one() {
        // One subscription at the CPU budget per event, one at 10 µs.
        let costly = 20 * MS;
        let cheap = Duration::from_micros(10);
        let judged = simulate(&[costly, cheap], 200);
        // Both share the worker's time about evenly: the cheap one gets
        // thousands of events through for each costly one.
        assert!(judged[1] > judged[0] * 1000, "{judged:?}");
        // Once the costly one's cost is known it goes one event at a time.
        let mut fair = Fair::default();
        fair.charge("costly", &[costly]);
        assert_eq!(fair.batch_len("costly"), 1);
        assert_eq!(fair.batch_len("new"), 1);
        fair.charge("cheap", &[cheap]);
        assert_eq!(fair.batch_len("cheap"), MAX_BATCH);
    }

    #[test]
    fn many_costly_filters_share_and_a_newcomer_goes_next() {
        let mut cost = vec![20 * MS; 50];
        cost.push(Duration::from_micros(5));
        let judged = simulate(&cost, 500);
        // Every costly one got its turn.
        assert!(judged[..50].iter().all(|&n| n > 0), "{judged:?}");
        let mut fair = Fair::default();
        let ids = ["a", "b"];
        for _ in 0..10 {
            let i = fair.pick(&ids);
            fair.charge(ids[i], &[20 * MS]);
        }
        // A subscription that had no work until now starts at the least
        // time of those that had (no credit for its idle time), so it goes
        // next, but only once before the others get theirs.
        let with_new = ["a", "b", "c"];
        assert_eq!(with_new[fair.pick(&with_new)], "c");
        fair.charge("c", &[20 * MS]);
        assert_ne!(with_new[fair.pick(&with_new)], "c");
    }

    #[test]
    fn what_it_remembers_stays_bounded_by_those_with_work() {
        let mut fair = Fair::default();
        for i in 0..10_000 {
            let id = format!("s{i}");
            fair.charge(&id, &[MS]);
            fair.pick(&[id.as_str()]);
        }
        assert!(fair.used.len() <= 4 + 64, "{}", fair.used.len());
    }
}
