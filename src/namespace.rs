//! Namespaces and their replicated policy.
//!
//! A namespace needs no creation: timers in a namespace that was never configured use
//! [`Policy::default`]. `PutNamespace` replicates a policy (a log entry, like every change);
//! from then on the namespace's timers follow it. The delivery settings (ack timeout, attempts,
//! backoff) and retention are consumed by delivery and retention; the payload limit applies to
//! every Schedule.
//!
//! Backoff is described in integers (a multiplier in per mille, jitter in percent) so that
//! every replica computes the same deadlines: floating point stays out of replicated state.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

const SECOND_MS: u64 = 1000;
const DAY_MS: u64 = 24 * 3600 * SECOND_MS;

/// A namespace's policy. Every field has a documented default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// How long a delivery may stay unacknowledged before it is delivered again. Default 30 s.
    pub ack_timeout_ms: u64,
    /// Deliveries before a timer becomes DEAD. Default 5.
    pub max_attempts: u32,
    /// First redelivery backoff. Default 1 s.
    pub backoff_min_ms: u64,
    /// Largest redelivery backoff. Default 5 min.
    pub backoff_max_ms: u64,
    /// Backoff growth per attempt, per mille (2000 = ×2). Default 2000.
    pub backoff_multiplier_permille: u32,
    /// Random spread of each backoff, ± percent. Default 20.
    pub backoff_jitter_percent: u32,
    /// How long ACKED, CANCELLED and DEAD timers are kept. Default 7 days.
    pub retention_ms: u64,
    /// Largest payload a timer of this namespace may carry. Default 64 KiB.
    pub max_payload_bytes: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            ack_timeout_ms: 30 * SECOND_MS,
            max_attempts: 5,
            backoff_min_ms: SECOND_MS,
            backoff_max_ms: 300 * SECOND_MS,
            backoff_multiplier_permille: 2000,
            backoff_jitter_percent: 20,
            retention_ms: 7 * DAY_MS,
            max_payload_bytes: 64 * 1024,
        }
    }
}

fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(msg()))
    }
}

impl Policy {
    /// Checks every field against its range; `max_payload_cap` is the node's global limit.
    pub fn validate(&self, max_payload_cap: usize) -> Result<()> {
        let p = self;
        check((100..=DAY_MS).contains(&p.ack_timeout_ms), || {
            format!(
                "ack_timeout_ms {} must be between 100 ms and 1 day",
                p.ack_timeout_ms
            )
        })?;
        check((1..=1000).contains(&p.max_attempts), || {
            format!("max_attempts {} must be between 1 and 1000", p.max_attempts)
        })?;
        check(
            p.backoff_min_ms >= 1 && p.backoff_min_ms <= p.backoff_max_ms,
            || {
                format!(
                    "backoff_min_ms {} must be at least 1 and at most backoff_max_ms {}",
                    p.backoff_min_ms, p.backoff_max_ms
                )
            },
        )?;
        check(p.backoff_max_ms <= DAY_MS, || {
            format!("backoff_max_ms {} must be at most 1 day", p.backoff_max_ms)
        })?;
        check(
            (1000..=10_000).contains(&p.backoff_multiplier_permille),
            || {
                format!(
                    "backoff_multiplier_permille {} must be between 1000 (×1) and 10000 (×10)",
                    p.backoff_multiplier_permille
                )
            },
        )?;
        check(p.backoff_jitter_percent <= 100, || {
            format!(
                "backoff_jitter_percent {} must be at most 100",
                p.backoff_jitter_percent
            )
        })?;
        check(
            (SECOND_MS..=3650 * DAY_MS).contains(&p.retention_ms),
            || {
                format!(
                    "retention_ms {} must be between 1 s and 10 years",
                    p.retention_ms
                )
            },
        )?;
        check(
            p.max_payload_bytes >= 1 && p.max_payload_bytes as usize <= max_payload_cap,
            || {
                format!(
                "max_payload_bytes {} must be between 1 and the server's limit {max_payload_cap}",
                p.max_payload_bytes
            )
            },
        )
    }
}

impl Policy {
    /// How long to wait before redelivering a timer whose attempt `attempt` (1-based) went
    /// unacknowledged: `backoff_min_ms × multiplier^(attempt-1)`, capped at `backoff_max_ms`,
    /// spread by ± `backoff_jitter_percent`.
    ///
    /// The jitter is not random: it is derived from `(fire_index, attempt)`, so every replica
    /// computes the same deadline for the same timer (replicated state stays deterministic),
    /// while timers that fired together still spread out instead of retrying in a herd.
    pub fn backoff_ms(&self, attempt: u32, fire_index: u64) -> u64 {
        let max = self.backoff_max_ms;
        let mut base = self.backoff_min_ms.min(max);
        for _ in 1..attempt.max(1) {
            if base >= max {
                break;
            }
            let grown = (base as u128 * self.backoff_multiplier_permille as u128) / 1000;
            base = grown.min(max as u128) as u64;
        }
        if self.backoff_jitter_percent == 0 {
            return base;
        }
        // A point in [1000 - 10·jitter, 1000 + 10·jitter] per mille, chosen by the hash: per
        // mille, not percent, so ±20 % offers 401 distinct delays rather than 41 clumps.
        let span = self.backoff_jitter_percent as u64 * 10;
        let permille = 1000 - span + mix(fire_index, attempt) % (2 * span + 1);
        let spread = (base as u128 * permille as u128 / 1000) as u64;
        spread.clamp(1, max)
    }
}

/// splitmix64 of (fire_index, attempt): a well-spread, stable hash for jitter.
fn mix(fire_index: u64, attempt: u32) -> u64 {
    let mut z = fire_index ^ ((attempt as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A namespace as reported to clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub name: String,
    pub policy: Policy,
    /// False when the namespace was never configured and `policy` is the default.
    pub configured: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_jitter() -> Policy {
        Policy {
            backoff_jitter_percent: 0,
            ..Policy::default()
        }
    }

    #[test]
    fn backoff_grows_geometrically_and_caps() {
        let p = no_jitter(); // 1 s, ×2, cap 5 min
        let got: Vec<u64> = (1..=10).map(|a| p.backoff_ms(a, 7)).collect();
        assert_eq!(
            got,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000]
        );
        assert_eq!(
            p.backoff_ms(1000, 7),
            300_000,
            "long retries stay at the cap"
        );
        assert_eq!(
            p.backoff_ms(0, 7),
            1_000,
            "attempt 0 is treated as the first"
        );
        let slow = Policy {
            backoff_multiplier_permille: 1500,
            ..no_jitter()
        };
        assert_eq!(
            (1..=4).map(|a| slow.backoff_ms(a, 0)).collect::<Vec<_>>(),
            [1_000, 1_500, 2_250, 3_375]
        );
        let flat = Policy {
            backoff_multiplier_permille: 1000,
            ..no_jitter()
        };
        assert_eq!(flat.backoff_ms(50, 0), 1_000, "×1 never grows");
        let huge = Policy {
            backoff_max_ms: DAY_MS,
            backoff_multiplier_permille: 10_000,
            ..no_jitter()
        };
        assert_eq!(
            huge.backoff_ms(1000, 0),
            DAY_MS,
            "no overflow on the way to the cap"
        );
    }

    #[test]
    fn jitter_is_bounded_deterministic_and_spread() {
        let p = Policy::default(); // ±20 %
        let mut seen = std::collections::BTreeSet::new();
        for fire_index in 0..2_000u64 {
            for attempt in 1..=3 {
                let base = no_jitter().backoff_ms(attempt, fire_index);
                let d = p.backoff_ms(attempt, fire_index);
                assert!(
                    d * 100 >= base * 80 && d * 100 <= base * 120,
                    "{d} outside ±20% of {base}"
                );
                assert_eq!(d, p.backoff_ms(attempt, fire_index), "not deterministic");
                if attempt == 1 {
                    seen.insert(d);
                }
            }
        }
        // 2,000 timers that failed together do not retry in a herd: the 401 possible
        // per-mille points of a 1 s base are nearly all used.
        assert!(seen.len() > 300, "only {} distinct delays", seen.len());
        let capped = Policy {
            backoff_min_ms: 300_000,
            ..Policy::default()
        };
        assert!(
            (0..500).all(|i| capped.backoff_ms(1, i) <= 300_000),
            "jitter must not exceed the cap"
        );
    }

    #[test]
    fn defaults_are_valid() {
        Policy::default().validate(64 * 1024).unwrap();
    }

    #[test]
    fn each_field_is_range_checked() {
        type Breaker = fn(&mut Policy);
        let cases: Vec<(Breaker, &str)> = vec![
            (|p| p.ack_timeout_ms = 99, "ack_timeout_ms"),
            (|p| p.ack_timeout_ms = DAY_MS + 1, "ack_timeout_ms"),
            (|p| p.max_attempts = 0, "max_attempts"),
            (|p| p.backoff_min_ms = 0, "backoff_min_ms"),
            (
                |p| p.backoff_min_ms = p.backoff_max_ms + 1,
                "backoff_min_ms",
            ),
            (|p| p.backoff_max_ms = DAY_MS + 1, "backoff_max_ms"),
            (|p| p.backoff_multiplier_permille = 999, "multiplier"),
            (|p| p.backoff_jitter_percent = 101, "jitter"),
            (|p| p.retention_ms = 999, "retention_ms"),
            (|p| p.max_payload_bytes = 64 * 1024 + 1, "max_payload_bytes"),
            (|p| p.max_payload_bytes = 0, "max_payload_bytes"),
        ];
        for (breaks, field) in cases {
            let mut p = Policy::default();
            breaks(&mut p);
            let e = p.validate(64 * 1024).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
            assert!(e.to_string().contains(field), "{e} lacks {field}");
        }
    }
}
