//! When and how often a call is sent again.
//!
//! Only a failure that leaves the outcome open or says "not now" is retried, and only for a
//! call whose repetition is harmless (idempotent): UNAVAILABLE (no leader yet, a node going
//! away, a connection that failed), DEADLINE_EXCEEDED, CANCELLED and UNKNOWN (a connection cut
//! mid-call). Every other status is an answer and is returned at once.

use std::future::Future;
use std::time::{Duration, Instant};

use tonic::Code;

/// A retry policy: exponential backoff with full jitter, bounded by a number of attempts and by
/// a deadline for the whole call.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all (1: never retried).
    pub attempts: u32,
    /// The first backoff; doubled per retry up to `max_backoff`.
    pub base: Duration,
    pub max_backoff: Duration,
    /// No retry starts after this much time since the first attempt.
    pub within: Duration,
}

impl Default for Retry {
    /// Long enough to ride out a leader election and a node restart (a few seconds).
    fn default() -> Self {
        Retry {
            attempts: 12,
            base: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            within: Duration::from_secs(30),
        }
    }
}

impl Retry {
    /// Never retry.
    pub fn never() -> Retry {
        Retry {
            attempts: 1,
            ..Retry::default()
        }
    }

    /// The pause before retry number `n` (1-based): uniformly random up to the capped
    /// exponential (so clients that failed together do not come back together).
    pub fn backoff(&self, n: u32) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << n.saturating_sub(1).min(16));
        let cap = exp.min(self.max_backoff);
        let ms = cap.as_millis() as u64;
        Duration::from_millis(rand::random_range(ms / 2..=ms.max(1)))
    }
}

/// Runs an idempotent `call` (on a connection the caller holds) until it succeeds, fails with
/// an answer, or `retry` gives up; also says how many times it was sent again. [`crate::Client`]
/// does the same and also moves to another node.
pub async fn retrying<T, F, Fut>(retry: &Retry, mut call: F) -> (crate::Result<T>, u32)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::Result<T>>,
{
    let started = Instant::now();
    let mut retries = 0;
    loop {
        match call().await {
            Err(s) if transient(s.code()) => {
                let pause = retry.backoff(retries + 1);
                if retries + 1 >= retry.attempts || started.elapsed() + pause > retry.within {
                    return (Err(s), retries);
                }
                retries += 1;
                tokio::time::sleep(pause).await;
            }
            other => return (other, retries),
        }
    }
}

/// Whether a failure may be retried for an idempotent call.
pub fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        let r = Retry::default();
        for n in 1..20 {
            let b = r.backoff(n);
            let exp = r
                .base
                .saturating_mul(1 << (n - 1).min(16))
                .min(r.max_backoff);
            assert!(b <= exp && b >= exp / 2, "retry {n}: {b:?} vs {exp:?}");
        }
        assert!(transient(Code::Unavailable));
        assert!(!transient(Code::FailedPrecondition));
        assert!(!transient(Code::AlreadyExists));
    }
}
