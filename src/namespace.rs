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
