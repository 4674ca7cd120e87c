//! The newest log entries, kept decoded in memory beside their stored bytes.
//!
//! openraft 0.9 reads every entry back from the log store after appending it: once to apply it
//! (RaftCore reads the committed range, in its own task) and, on the leader, once per follower
//! to replicate it. Decoding a ScheduleBatch entry of 10,000 timers from its bytes built 30,000
//! strings and vectors (packed `timer::Specs` now make it two buffers, but still a copy of every
//! byte), and the three nodes did it seven times per entry between them. The entries' commands
//! are `Arc`s, so an entry handed out of this cache is a few pointer copies.
//!
//! Invariants:
//! - The cache holds a contiguous suffix of the stored log, `[first, last]`, each entry equal to
//!   its stored bytes: `append` adds an entry only after its batch is written, `truncate` drops
//!   the suffix it deletes before deleting it, `purge` drops the prefix it deletes. Eviction
//!   takes the oldest entries first, so what stays is still a suffix.
//! - A read starting at or after `first` is served from here alone: every index from `first` to
//!   the log's last entry is present. Any other read goes to the log engine, as before the cache.
//! - Bounded by the entries' encoded size ([`CAP_BYTES`]): enough for the entries between an
//!   append and its apply under load, small beside the memtables.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::raft_types::Entry;

/// Most encoded bytes of entries the cache keeps (their decoded size is some 2-3 times this).
pub const CAP_BYTES: usize = 4 << 20;

/// See the module documentation.
#[derive(Default)]
pub struct LogCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// (encoded size, entry), by consecutive index.
    entries: VecDeque<(usize, Entry)>,
    bytes: usize,
}

impl Inner {
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|(_, e)| e.log_id.index)
    }

    fn pop_front(&mut self) {
        if let Some((size, _)) = self.entries.pop_front() {
            self.bytes -= size;
        }
    }
}

impl LogCache {
    /// Records entries just written to the log (consecutive, in order), with their encoded
    /// sizes. An entry that does not follow the cached ones (the first append after a restart,
    /// or after the cache was emptied) starts the cache afresh.
    pub fn appended(&self, entries: impl IntoIterator<Item = (usize, Entry)>) {
        let mut inner = self.inner.lock().expect("log cache lock");
        for (size, entry) in entries {
            let follows = match inner.entries.back() {
                Some((_, last)) => last.log_id.index + 1 == entry.log_id.index,
                None => true,
            };
            if !follows {
                inner.entries.clear();
                inner.bytes = 0;
            }
            inner.bytes += size;
            inner.entries.push_back((size, entry));
        }
        while inner.bytes > CAP_BYTES && inner.entries.len() > 1 {
            inner.pop_front();
        }
    }

    /// Forgets entries from `index` on (the log is about to delete them).
    pub fn truncate(&self, index: u64) {
        let mut inner = self.inner.lock().expect("log cache lock");
        while inner
            .entries
            .back()
            .is_some_and(|(_, e)| e.log_id.index >= index)
        {
            if let Some((size, _)) = inner.entries.pop_back() {
                inner.bytes -= size;
            }
        }
    }

    /// Forgets entries up to and including `index` (the log deleted them).
    pub fn purge(&self, index: u64) {
        let mut inner = self.inner.lock().expect("log cache lock");
        while inner.first().is_some_and(|first| first <= index) {
            inner.pop_front();
        }
    }

    /// The entries of `[start, end)`, if the cache can answer alone: it holds `start` and
    /// every later index up to `end` or to the byte bound; `None` sends the read to the log engine. `max_bytes` bounds the answer's encoded size
    /// (its first entry goes whatever its size), as [`super::log_store::MAX_APPEND_BYTES`]
    /// bounds replication.
    pub fn get(&self, start: u64, end: u64, max_bytes: usize) -> Option<Vec<Entry>> {
        let inner = self.inner.lock().expect("log cache lock");
        let first = inner.first()?;
        if start < first || start >= end {
            return None;
        }
        let from = (start - first) as usize;
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        for (size, entry) in inner.entries.range(from.min(inner.entries.len())..) {
            if entry.log_id.index >= end || (!out.is_empty() && bytes + size > max_bytes) {
                return Some(out);
            }
            bytes += size;
            out.push(entry.clone());
        }
        match out.last() {
            Some(last) if last.log_id.index + 1 >= end => Some(out),
            // The cache ends before `end`: only the log engine knows whether the log does too (an
            // append is written there before it is cached here).
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::EntryPayload;

    use crate::raft_types::log_id;

    use super::*;

    fn entry(index: u64) -> (usize, Entry) {
        let e = Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Blank,
        };
        (1 << 20, e)
    }

    fn indexes(got: Option<Vec<Entry>>) -> Option<Vec<u64>> {
        got.map(|v| v.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn answers_only_from_its_suffix_and_keeps_it_a_suffix() {
        let c = LogCache::default();
        assert_eq!(
            indexes(c.get(1, 5, usize::MAX)),
            None,
            "empty: to the log engine"
        );
        c.appended((5..=7).map(entry));
        assert_eq!(indexes(c.get(4, 8, usize::MAX)), None, "starts before it");
        assert_eq!(indexes(c.get(5, 8, usize::MAX)), Some(vec![5, 6, 7]));
        assert_eq!(indexes(c.get(6, 8, usize::MAX)), Some(vec![6, 7]));
        assert_eq!(
            indexes(c.get(6, 9, usize::MAX)),
            None,
            "ends past the cache"
        );
        assert_eq!(indexes(c.get(8, 10, usize::MAX)), None, "past the cache");
        // The bound counts the first entry's bytes too, as the log engine's read does.
        assert_eq!(indexes(c.get(5, 8, 3 << 20)), Some(vec![5, 6, 7]));
        assert_eq!(indexes(c.get(5, 8, (3 << 20) - 1)), Some(vec![5, 6]));
        assert_eq!(indexes(c.get(5, 8, 0)), Some(vec![5]), "at least one");

        c.truncate(6);
        assert_eq!(indexes(c.get(5, 6, usize::MAX)), Some(vec![5]));
        assert_eq!(indexes(c.get(5, 7, usize::MAX)), None, "truncated");
        c.appended([entry(6)]);
        assert_eq!(indexes(c.get(5, 7, usize::MAX)), Some(vec![5, 6]));
        c.purge(5);
        assert_eq!(indexes(c.get(5, 7, usize::MAX)), None, "purged");
        assert_eq!(indexes(c.get(6, 7, usize::MAX)), Some(vec![6]));

        // An append that does not follow (a snapshot moved the log on) starts afresh.
        c.appended([entry(20)]);
        assert_eq!(indexes(c.get(6, 7, usize::MAX)), None);
        assert_eq!(indexes(c.get(20, 21, usize::MAX)), Some(vec![20]));
    }

    #[test]
    fn evicts_the_oldest_past_its_cap_and_keeps_the_newest() {
        let c = LogCache::default();
        let n = (CAP_BYTES >> 20) as u64;
        c.appended((1..=n + 3).map(entry));
        assert_eq!(indexes(c.get(3, u64::MAX, 0)), None, "evicted");
        assert_eq!(indexes(c.get(4, 5, usize::MAX)), Some(vec![4]));
        assert_eq!(
            indexes(c.get(n + 2, n + 4, 0)),
            Some(vec![n + 2]),
            "the byte bound"
        );
        assert_eq!(indexes(c.get(n + 3, n + 4, 0)), Some(vec![n + 3]));
        // One entry over the cap alone is still kept: it is the log's newest.
        let c = LogCache::default();
        c.appended([(CAP_BYTES * 2, entry(1).1)]);
        assert_eq!(indexes(c.get(1, 2, usize::MAX)), Some(vec![1]));
    }
}
