//! The hub's dedup window: `(scope, event id) → seq` of the events whose id
//! a new event may not reuse.
//!
//! An LRU of `dedup_capacity` keys, as on one host. On the cluster store
//! (`keep_retained`) the log's unique index refuses a repeated id anywhere
//! in what the database still holds, which can reach past the LRU (events
//! pinned in flight or parked keep the log's low end). There a key the LRU
//! evicts is kept aside (`overflow`) while its event may still be in the
//! database — at or above the oldest seq the store last reported
//! ([`Dedup::retained_from`]) — so a repeated id is answered as a duplicate
//! with the original's seq instead of failing the append. The overflow
//! holds only keys of rows the database retains beyond the LRU, and is
//! pruned as retention deletes them.

use std::{collections::HashMap, num::NonZeroUsize};

use lru::LruCache;

type Key = (String, String);

pub(super) struct Dedup {
    lru: LruCache<Key, u64>,
    /// `Some` on the cluster store (see the module doc).
    overflow: Option<HashMap<Key, u64>>,
    /// The oldest seq the store holds, as last reported.
    floor: u64,
}

impl Dedup {
    pub(super) fn new(capacity: usize, keep_retained: bool) -> Dedup {
        let cap = NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        Dedup {
            lru: LruCache::new(cap),
            overflow: keep_retained.then(HashMap::new),
            floor: 0,
        }
    }

    /// The seq of the event that holds `key`, if any.
    pub(super) fn get(&mut self, key: &Key) -> Option<u64> {
        if let Some(seq) = self.lru.get(key) {
            return Some(*seq);
        }
        self.overflow.as_ref()?.get(key).copied()
    }

    pub(super) fn put(&mut self, key: Key, seq: u64) {
        // One host: the LRU alone, no key copied on the append path.
        let Some(o) = self.overflow.as_mut() else {
            self.lru.push(key, seq);
            return;
        };
        o.remove(&key);
        let pushed = key.clone();
        if let Some((old, old_seq)) = self.lru.push(key, seq) {
            if old != pushed && old_seq >= self.floor {
                o.insert(old, old_seq);
            }
        }
    }

    /// Adds ids older than every id present (seq order) behind them, as
    /// long as the window has room: the newest of them first, each put at
    /// the least recently used end.
    pub(super) fn seed_older(&mut self, older: &[(u64, String, String)]) {
        for (seq, scope, id) in older.iter().rev() {
            if self.lru.len() >= self.lru.cap().get() {
                break;
            }
            let key = (scope.clone(), id.clone());
            if self.lru.contains(&key) {
                continue;
            }
            self.lru.push(key.clone(), *seq);
            self.lru.demote(&key);
        }
    }

    /// The store holds nothing below `floor` any more: keys of older events
    /// leave the overflow.
    pub(super) fn retained_from(&mut self, floor: u64) {
        if floor <= self.floor {
            return;
        }
        self.floor = floor;
        if let Some(o) = self.overflow.as_mut() {
            o.retain(|_, seq| *seq >= floor);
        }
    }

    /// Keys kept beyond the LRU (for tests and status).
    #[cfg(test)]
    pub(super) fn overflow_len(&self) -> usize {
        self.overflow.as_ref().map_or(0, HashMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::Dedup;

    fn k(id: &str) -> (String, String) {
        ("local".into(), id.into())
    }

    #[test]
    fn an_evicted_key_stays_while_the_store_retains_its_event() {
        let mut d = Dedup::new(2, true);
        for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
            d.put(k(id), i as u64 + 1);
        }
        assert_eq!(d.get(&k("a")), Some(1));
        assert_eq!(d.get(&k("d")), Some(4));
        assert_eq!(d.overflow_len(), 2);
        d.retained_from(2);
        assert_eq!(d.get(&k("a")), None, "its event is gone from the store");
        assert_eq!(d.get(&k("b")), Some(2));
        // A key evicted below the floor is not kept.
        d.put(k("e"), 5);
        d.put(k("f"), 6);
        d.retained_from(5);
        assert_eq!(d.get(&k("b")), None);
        assert_eq!(d.get(&k("e")), Some(5));
        // Updating a present key evicts nothing.
        d.put(k("f"), 6);
        assert_eq!(d.overflow_len(), 0);
    }

    #[test]
    fn older_ids_are_seeded_behind_the_recovered_ones_while_there_is_room() {
        let mut d = Dedup::new(3, false);
        d.put(k("c"), 10);
        let older = [
            (1, "local".into(), "z".into()),
            (2, "local".into(), "a".into()),
            (3, "local".into(), "b".into()),
        ];
        d.seed_older(&older);
        // Room for two: the newest two of the older ones.
        assert_eq!(d.get(&k("b")), Some(3));
        assert_eq!(d.get(&k("a")), Some(2));
        assert_eq!(d.get(&k("z")), None);
        // The next put evicts the oldest: "a" (seq 2), not "c".
        let mut d = Dedup::new(3, false);
        d.put(k("c"), 10);
        d.seed_older(&older);
        d.put(k("d"), 11);
        assert_eq!(d.get(&k("a")), None);
        assert_eq!(d.get(&k("c")), Some(10));
        assert_eq!(d.get(&k("b")), Some(3));
    }

    #[test]
    fn one_host_forgets_what_the_lru_evicts() {
        let mut d = Dedup::new(1, false);
        d.put(k("a"), 1);
        d.put(k("b"), 2);
        assert_eq!(d.get(&k("a")), None);
        assert_eq!(d.get(&k("b")), Some(2));
    }
}
