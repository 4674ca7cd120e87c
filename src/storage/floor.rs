//! The deadline floor: a time at or below every open lease's deadline, kept in memory so that
//! the two scans of the `deadlines` family start past what no longer lives there.
//!
//! The family is a queue keyed by time: a lease's deadline is written when the lease is granted
//! and deleted when it passes (a Fire's expiry) or the lease is acked whole. RocksDB keeps each
//! deleted key as a tombstone until compaction reaches it, so a scan from the start walks every
//! deadline deleted since — and a Fire's expiry (`fire.rs`) and the fire driver's look
//! (`Store::next_due`) scanned from the start, each time: with a consumer acking one timer at a
//! time, 41 % of the leader's CPU went to walking tombstones, and each run was slower than the
//! one before it. Both now seek to the floor.
//!
//! A cache, not state (DESIGN 8): it is 0 (scan from the start) when the state machine opens,
//! installs a snapshot or is made stale on purpose (`StateMachine::stale_caches` for the apply
//! fuzzer, `Store::stale_heads` for the simulator; the fuzzer also checks after every entry that
//! it holds); only apply moves it, after an entry is written: up to what that entry's own
//! expiry scan proved (the first deadline it found at or before its `now_ms`, or `now_ms + 1`
//! when it found none — every deadline then in the database is later), and down to every
//! deadline the entry wrote. A floor that holds (at or below every live deadline) makes a scan
//! from it see exactly what a scan from the start sees, so apply writes the same with any
//! floor. The fire driver reads it concurrently: a deadline written after its read lowers the
//! floor and wakes it (`FireSignal`), so it looks again.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct DeadlineFloor(AtomicU64);

impl DeadlineFloor {
    /// The time (ms) to start a scan of the deadlines at.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Forgets it: scans start at the beginning again.
    pub fn reset(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// After an entry is written: `proved`, what its expiry scan showed no deadline lives
    /// below (none if it ran none); `written`, the earliest deadline it wrote.
    pub fn after_entry(&self, proved: Option<u64>, written: Option<u64>) {
        let floor = proved.unwrap_or_else(|| self.get());
        let floor = written.map_or(floor, |w| floor.min(w));
        self.0.store(floor, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_raises_it_and_a_written_deadline_lowers_it() {
        let f = DeadlineFloor::default();
        assert_eq!(f.get(), 0);
        f.after_entry(Some(100), None);
        assert_eq!(f.get(), 100);
        f.after_entry(None, Some(50));
        assert_eq!(f.get(), 50, "a deadline written below it");
        f.after_entry(None, Some(70));
        assert_eq!(f.get(), 50, "one above it changes nothing");
        f.after_entry(Some(200), Some(150));
        assert_eq!(f.get(), 150, "the entry's own deadline counts");
        f.reset();
        assert_eq!(f.get(), 0);
    }
}
