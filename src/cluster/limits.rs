//! The leader's rate limits: token buckets per namespace, for dispatches (push and Subscribe
//! alike) and for schedules.
//!
//! Limits live in the leader's memory, not in the log: a bucket's level changes with every
//! delivery, and replicating it would cost an entry per grant. What must hold across a leader
//! change is that the receiver never sees more than the limit allows, so a new leader's bucket
//! does not start full: it holds what it would have earned since this node became leader (in
//! the first term it planned in), as if the previous leader's bucket had emptied at that moment.
//! Any one-second window therefore sees at most `burst + rate`, with or without a failover.
//!
//! Levels are integers in thousandths of a token (no floating point), refilled from the
//! caller's `now_ms`: this module never reads the clock.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::namespace::Policy;
use crate::Error;

/// A token bucket: `rate` tokens a second, at most `burst` held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    milli: u64,
    last_ms: i64,
    rate: u32,
    burst: u32,
}

impl Bucket {
    /// A bucket that was empty at `since_ms`, refilled to `now_ms`.
    pub fn empty_since(rate: u32, burst: u32, since_ms: i64, now_ms: i64) -> Bucket {
        let mut b = Bucket {
            milli: 0,
            last_ms: since_ms,
            rate,
            burst,
        };
        b.refill(now_ms);
        b
    }

    /// Adds what `rate` earned since the last refill (a clock that went back earns nothing);
    /// takes a changed `rate` and `burst` (from a new policy) from now on.
    pub fn refill_with(&mut self, rate: u32, burst: u32, now_ms: i64) {
        self.refill(now_ms);
        (self.rate, self.burst) = (rate, burst);
        self.milli = self.milli.min(self.cap());
    }

    fn cap(&self) -> u64 {
        self.burst as u64 * 1000
    }

    fn refill(&mut self, now_ms: i64) {
        if now_ms > self.last_ms {
            let earned = (now_ms - self.last_ms) as u64 * self.rate as u64;
            self.milli = self.milli.saturating_add(earned).min(self.cap());
            self.last_ms = now_ms;
        }
    }

    /// Whole tokens available.
    pub fn available(&self) -> u32 {
        (self.milli / 1000).min(u32::MAX as u64) as u32
    }

    /// Takes up to `n` tokens; returns how many it took.
    pub fn take_up_to(&mut self, n: u32) -> u32 {
        let n = n.min(self.available());
        self.milli -= n as u64 * 1000;
        n
    }

    /// Takes exactly `n` tokens, or none: `Err(ms)` says how long until `n` are there (`None`
    /// if they never will be: more than the burst).
    pub fn take_all(&mut self, n: u32) -> Result<(), Option<u64>> {
        if n > self.burst {
            return Err(None);
        }
        let want = n as u64 * 1000;
        if self.milli >= want {
            self.milli -= want;
            return Ok(());
        }
        let missing = want - self.milli;
        Err(Some(missing.div_ceil(self.rate.max(1) as u64)))
    }

    /// Gives back tokens taken but not used.
    pub fn refund(&mut self, n: u32) {
        self.milli = self.milli.saturating_add(n as u64 * 1000).min(self.cap());
    }
}

/// Buckets per namespace, reset when this node starts a new term as leader.
#[derive(Debug, Default)]
pub struct Buckets {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    term: u64,
    since_ms: i64,
    buckets: HashMap<String, Bucket>,
}

impl Buckets {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on `namespace`'s bucket for `rate`/`burst`, as this leader of `term` has it at
    /// `now_ms` (a new term empties every bucket; they fill from `since_ms`, when this node
    /// began to lead, at the latest now).
    pub fn with<T>(
        &self,
        (term, since_ms): (u64, i64),
        now_ms: i64,
        namespace: &str,
        (rate, burst): (u32, u32),
        f: impl FnOnce(&mut Bucket) -> T,
    ) -> T {
        let mut inner = self.lock();
        if term < inner.term {
            // A caller that read an older term (it raced a re-election): it gets nothing,
            // and the newer term's buckets stay as they are. Resetting them to the older
            // term, and back at the newer one's next call, would let that term's buckets
            // fill again from its start and forget what it spent.
            return f(&mut Bucket::empty_since(rate, burst, now_ms, now_ms));
        }
        if inner.term != term {
            inner.term = term;
            inner.since_ms = since_ms.min(now_ms);
            inner.buckets.clear();
        }
        let since = inner.since_ms;
        let bucket = inner
            .buckets
            .entry(namespace.to_string())
            .and_modify(|b| b.refill_with(rate, burst, now_ms))
            .or_insert_with(|| Bucket::empty_since(rate, burst, since, now_ms));
        f(bucket)
    }

    /// Gives `n` tokens back to `namespace`'s bucket, if the buckets still belong to `term`,
    /// the term they were taken in. A refund that comes after a newer term began does
    /// nothing: through [`Buckets::with`] it would empty the newer term's buckets, which then
    /// fill again from that term's start and forget what it already spent.
    pub fn refund(&self, term: u64, namespace: &str, n: u32) {
        let mut inner = self.lock();
        if inner.term != term {
            return;
        }
        if let Some(bucket) = inner.buckets.get_mut(namespace) {
            bucket.refund(n);
        }
    }

    /// The latest term these buckets know this node led in, and since when.
    pub fn current(&self) -> (u64, i64) {
        let inner = self.lock();
        (inner.term, inner.since_ms)
    }

    /// When this node began to lead in `term`, as far as these buckets know.
    pub fn since(&self, term: u64) -> Option<i64> {
        let inner = self.lock();
        (inner.term == term).then_some(inner.since_ms)
    }

    /// Notes that this node leads in `term` from `now_ms` on (if it did not know yet; an
    /// older term than the buckets know changes nothing).
    pub fn lead(&self, term: u64, now_ms: i64) {
        let mut inner = self.lock();
        if term > inner.term {
            inner.term = term;
            inner.since_ms = now_ms;
            inner.buckets.clear();
        }
    }
}

/// Every namespace's schedule rate limit on this leader: a token per timer scheduled.
#[derive(Debug, Default)]
pub struct ScheduleLimits {
    buckets: Buckets,
}

impl ScheduleLimits {
    /// Takes `n` tokens of `namespace` (whose policy is `policy`) as the leader of `term` that
    /// began to lead at `since_ms`, or refuses: RESOURCE_EXHAUSTED with the wait
    /// (`RateLimited`), or without one when `n` exceeds the burst and can never fit.
    pub fn take(
        &self,
        namespace: &str,
        n: usize,
        policy: &Policy,
        term_since: (u64, i64),
        now_ms: i64,
    ) -> crate::Result<()> {
        let Some(rate) = policy.max_schedules_per_second else {
            return Ok(());
        };
        let burst = policy.max_schedule_burst;
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let taken = self
            .buckets
            .with(term_since, now_ms, namespace, (rate, burst), |b| {
                b.take_all(n)
            });
        match taken {
            Ok(()) => Ok(()),
            Err(Some(ms)) => Err(Error::RateLimited {
                message: format!(
                    "namespace {namespace} takes at most {rate} timers a second (burst \
                     {burst}); retry after {ms} ms"
                ),
                retry_after_ms: ms,
            }),
            Err(None) => Err(Error::ResourceExhausted(format!(
                "{n} timers at once exceed namespace {namespace}'s schedule burst of {burst}; \
                 send smaller batches"
            ))),
        }
    }

    /// Gives back `n` tokens [`ScheduleLimits::take`] took.
    pub fn refund(&self, namespace: &str, n: usize, policy: &Policy, term: u64) {
        if policy.max_schedules_per_second.is_some() {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            self.buckets.refund(term, namespace, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let mut b = Bucket::empty_since(200, 50, 0, 0);
        assert_eq!(b.available(), 0, "a new leader's bucket starts empty");
        b.refill(100);
        assert_eq!(b.available(), 20);
        b.refill(10_000);
        assert_eq!(b.available(), 50, "capped at the burst");
        assert_eq!(b.take_up_to(70), 50);
        assert_eq!(b.take_up_to(1), 0);
        b.refill(10_005);
        assert_eq!(b.available(), 1, "5 ms at 200/s is one token");
        b.refund(100);
        assert_eq!(b.available(), 50, "refunds are capped too");
        b.refill(9_000);
        assert_eq!(b.available(), 50, "a clock going back earns nothing");
    }

    #[test]
    fn take_all_is_all_or_nothing_with_a_wait() {
        let mut b = Bucket::empty_since(10, 20, 0, 1_000); // 10 tokens after 1 s
        assert_eq!(b.take_all(15), Err(Some(500)), "5 more tokens at 10/s");
        assert_eq!(b.available(), 10, "nothing taken");
        assert_eq!(b.take_all(21), Err(None), "more than the burst never fits");
        assert_eq!(b.take_all(10), Ok(()));
        assert_eq!(b.available(), 0);
    }

    /// Over any one-second window a bucket lets through at most burst + rate, whatever the
    /// demand: the bound the dispatch-rate test checks end to end.
    #[test]
    fn no_window_exceeds_burst_plus_rate() {
        let (rate, burst) = (200u32, 50u32);
        let mut b = Bucket::empty_since(rate, burst, 0, 0);
        b.refill(5_000); // full
        let mut taken = vec![0u32; 10_000];
        for (t, slot) in taken.iter_mut().enumerate().skip(5_000) {
            b.refill(t as i64);
            *slot = b.take_up_to(u32::MAX);
        }
        let worst = (5_000..9_000)
            .map(|s| taken[s..s + 1000].iter().sum::<u32>())
            .max()
            .unwrap();
        assert!(
            worst <= rate + burst && worst + 1 >= rate + burst,
            "worst window {worst}"
        );
    }

    #[test]
    fn a_new_term_empties_the_buckets() {
        let buckets = Buckets::default();
        let lim = (100, 100);
        buckets.lead(1, 0);
        let got = buckets.with((1, 0), 10_000, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(got, 100, "full after 10 s of leading");
        assert_eq!(buckets.since(1), Some(0));
        let got = buckets.with((2, 20_000), 20_000, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(got, 0, "a new term starts from nothing");
        assert_eq!(buckets.since(1), None);
        let got = buckets.with((2, 0), 20_500, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(got, 50, "and earns from the term's start");
        // A refund of term 1's tokens arriving now neither gives term 2 tokens nor resets it.
        buckets.refund(1, "ns", 100);
        let got = buckets.with((2, 0), 20_500, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(
            got, 0,
            "term 2 spent its 50; term 1's refund is not its to keep"
        );
        assert_eq!(buckets.since(2), Some(20_000), "and term 2's start stands");
        // Nor does a take by a caller that read term 1 before the new term began.
        let got = buckets.with((1, 0), 20_500, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(got, 0, "an older term gets nothing");
        buckets.lead(1, 20_500);
        let got = buckets.with((2, 0), 20_500, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(got, 0, "and leaves term 2's buckets as they were");
        assert_eq!(buckets.since(2), Some(20_000));
        buckets.refund(2, "ns", 20);
        let got = buckets.with((2, 0), 20_500, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(got, 20, "a refund in its own term is given back");
        let other = Buckets::default();
        let got = other.with((3, 19_000), 20_000, "ns", lim, |b| b.take_up_to(1000));
        assert_eq!(
            got, 100,
            "first used a second into the term: a second's worth"
        );
    }
}
