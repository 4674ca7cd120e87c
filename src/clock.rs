//! The only code in timerdb that reads the wall clock.
//!
//! The leader reads it to stamp Fire entries and to resolve relative delays; nothing else does.
//! The state machine never calls it: time enters replicated state only through log entries
//! (DESIGN invariant 1). A `Clock` may carry a fixed offset so that tests and the chaos harness
//! can skew one node's clock without touching the system clock. In a simulation (`crate::sim`)
//! it reads the simulated clock instead of the system's.
//!
//! **Tests drive it** three ways, by what they test: the state machine never reads it (an
//! entry's `now_ms` is its time, so a goldenscript in `src/storage/testscripts/` sets every
//! instant by hand); pure leader rules take `now_ms` as an argument (`cluster::limits`); and a
//! leader-side wait is tested in paused time — `sim::install` makes this clock read tokio's
//! time, and `#[tokio::test(start_paused = true)]` makes that time jump to the next timer
//! (`cluster/dispatch/tests.rs`: a second of pacing in no real time, exact to the ms).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of Unix-epoch milliseconds, optionally skewed by a fixed offset.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    offset_ms: i64,
}

impl Clock {
    /// The system clock, unskewed.
    pub fn system() -> Self {
        Clock { offset_ms: 0 }
    }

    /// The system clock shifted by `offset_ms` (positive: this node runs ahead).
    pub fn with_offset(offset_ms: i64) -> Self {
        Clock { offset_ms }
    }

    /// Milliseconds since the Unix epoch, as this node sees them (in a simulation, the
    /// simulated clock: `crate::sim`).
    pub fn now_ms(&self) -> i64 {
        if let Some(ms) = crate::sim::now_ms() {
            return ms + self.offset_ms;
        }
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        since.as_millis() as i64 + self.offset_ms
    }

    /// How long to sleep until `at_ms` on this clock; zero if it has passed.
    pub fn until(&self, at_ms: i64) -> Duration {
        let delta = at_ms.saturating_sub(self.now_ms());
        Duration::from_millis(delta.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_shifts_time() {
        let a = Clock::system().now_ms();
        let b = Clock::with_offset(60_000).now_ms();
        assert!(b - a >= 59_000 && b - a <= 61_000, "a={a} b={b}");
    }

    #[test]
    fn until_is_zero_for_the_past() {
        let c = Clock::system();
        assert_eq!(c.until(c.now_ms() - 1000), Duration::ZERO);
        assert!(c.until(c.now_ms() + 10_000) > Duration::from_secs(9));
    }
}
