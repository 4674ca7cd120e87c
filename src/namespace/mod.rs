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
//!
//! Besides the policy, a namespace may have a [`PushTarget`]: the leader then delivers its fired
//! timers by calling that endpoint back (`push`) instead of handing them to Subscribe streams.
//! The dispatch limits (rate, burst, concurrency), the schedule rate limit and the paused flag
//! are in the policy; they are enforced by the leader in memory (`cluster::limits`), never by
//! apply, which only stores them. Design: docs/push.md.
//!
//! A push target's signing secrets are [`sign::Secret`]s; [`sign`] also signs a message the
//! Standard Webhooks way. Signing is pure, so it sits with the namespace that holds the keys;
//! the pusher (`push`) calls it.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

pub mod sign;

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
    /// Deliveries (push or Subscribe, first or retried) started per second; `None`: unlimited.
    pub max_dispatches_per_second: Option<u32>,
    /// Deliveries that may start at once after a quiet spell (the token bucket's size).
    /// Default: a tenth of the rate, at least 1.
    pub max_burst: u32,
    /// Deliveries unsettled at once, across every subscription; `None`: unlimited.
    pub max_concurrent_dispatches: Option<u32>,
    /// Timers scheduled per second (Schedule and ScheduleBatch); `None`: unlimited.
    pub max_schedules_per_second: Option<u32>,
    /// Timers that may be scheduled at once after a quiet spell. Default: the rate.
    pub max_schedule_burst: u32,
    /// Fired timers are not dispatched while paused (they still fire, and wait READY).
    pub paused: bool,
    /// What happens to a timer found too late when it fires (after an outage). Stored after
    /// the rest (`storage::config_bytes`), so a format-4 namespace reads with "off".
    #[serde(skip)]
    pub misfire: Misfire,
}

/// The misfire policy of one-shot timers: a timer that fires more than `max_lateness_ms`
/// after its fire time (an outage, a long failover) is handled by `action` instead of
/// firing. `max_lateness_ms` 0: off (every timer fires, however late).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Misfire {
    pub max_lateness_ms: u64,
    pub action: MisfireAction,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MisfireAction {
    /// Fire anyway (late).
    #[default]
    Fire,
    /// DEAD at once, never delivered (attempt log: misfired); Redrive fires it.
    Dead,
    /// EXPIRED (finished, never delivered; attempt log: misfired).
    Skip,
}

impl MisfireAction {
    pub fn name(self) -> &'static str {
        match self {
            MisfireAction::Fire => "fire",
            MisfireAction::Dead => "dead",
            MisfireAction::Skip => "skip",
        }
    }
}

impl Misfire {
    /// Whether a timer firing `late_ms` after its time is handled by the action.
    pub fn applies(&self, late_ms: i64) -> bool {
        self.action != MisfireAction::Fire
            && self.max_lateness_ms > 0
            && late_ms > self.max_lateness_ms as i64
    }
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
            max_dispatches_per_second: None,
            max_burst: MAX_RATE,
            max_concurrent_dispatches: None,
            max_schedules_per_second: None,
            max_schedule_burst: MAX_RATE,
            paused: false,
            misfire: Misfire::default(),
        }
    }
}

/// Most deliveries per second or timers scheduled per second a limit may name.
pub const MAX_RATE: u32 = 1_000_000;
/// Most concurrent dispatches a namespace may allow.
pub const MAX_CONCURRENCY: u32 = 100_000;

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
        )?;
        let rate = |field: &str, v: Option<u32>| match v {
            Some(r) if !(1..=MAX_RATE).contains(&r) => Err(Error::InvalidArgument(format!(
                "{field} {r} must be between 1 and {MAX_RATE} (leave it unset for no limit; \
                 to stop deliveries, pause the namespace)"
            ))),
            _ => Ok(()),
        };
        rate("max_dispatches_per_second", p.max_dispatches_per_second)?;
        rate("max_schedules_per_second", p.max_schedules_per_second)?;
        for (field, burst) in [
            ("max_burst", p.max_burst),
            ("max_schedule_burst", p.max_schedule_burst),
        ] {
            check((1..=MAX_RATE).contains(&burst), || {
                format!("{field} {burst} must be between 1 and {MAX_RATE}")
            })?;
        }
        match p.max_concurrent_dispatches {
            Some(c) if !(1..=MAX_CONCURRENCY).contains(&c) => Err(Error::InvalidArgument(format!(
                "max_concurrent_dispatches {c} must be between 1 and {MAX_CONCURRENCY} \
                     (leave it unset for no limit)"
            ))),
            _ => Ok(()),
        }
    }

    /// Fills the bursts left at 0 with their defaults: a tenth of the dispatch rate, the
    /// schedule rate (at least 1; with no rate, the burst is unused and set to the maximum).
    pub fn with_default_bursts(mut self) -> Policy {
        if self.max_burst == 0 {
            self.max_burst = self
                .max_dispatches_per_second
                .map_or(MAX_RATE, |r| (r / 10).max(1));
        }
        if self.max_schedule_burst == 0 {
            self.max_schedule_burst = self.max_schedules_per_second.unwrap_or(MAX_RATE);
        }
        self
    }
}

impl Policy {
    /// The dispatch rate and burst that pace this namespace's deliveries, if it has a rate.
    pub fn dispatch_limit(&self) -> Option<(u32, u32)> {
        self.max_dispatches_per_second.map(|r| (r, self.max_burst))
    }

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
    /// Where the leader pushes fired timers; `None`: they go to Subscribe streams.
    pub push: Option<PushTarget>,
    /// False when the namespace was never configured and `policy` is the default.
    pub configured: bool,
}

/// What the state machine stores for a configured namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub policy: Policy,
    pub push: Option<PushTarget>,
}

/// How a push reaches the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    /// `POST` of the payload, signed as Standard Webhooks asks (`http://` or `https://`).
    Http,
    /// `timerdb.v1.Receiver/Receive` (`grpc://` or `grpcs://`).
    Grpc,
}

/// A namespace's push target: the leader calls `url` for every fired timer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushTarget {
    pub url: String,
    /// Signing secrets, `whsec_` + base64; one, or two while rotating (both sign).
    pub secrets: Vec<String>,
    /// How long one request may take before it counts as a failed attempt.
    pub timeout_ms: u64,
    /// A 4xx other than 408/429 (or the gRPC codes that mean the same) is DEAD at once instead
    /// of retried.
    pub dead_on_client_error: bool,
}

/// Longest push URL.
pub const MAX_URL_BYTES: usize = 2048;
/// Default push request timeout (capped below the ack timeout).
pub const DEFAULT_PUSH_TIMEOUT_MS: u64 = 10 * SECOND_MS;

impl PushTarget {
    /// The protocol its URL's scheme names (validated first).
    pub fn protocol(&self) -> Protocol {
        if self.url.starts_with("grpc") {
            Protocol::Grpc
        } else {
            Protocol::Http
        }
    }

    /// Checks the URL, the secrets and the timeout (which must end before `policy`'s ack
    /// timeout, so that a live leader settles every attempt before its lease expires).
    pub fn validate(&self, policy: &Policy) -> Result<()> {
        check(self.url.len() <= MAX_URL_BYTES, || {
            format!(
                "push url is {} bytes; at most {MAX_URL_BYTES}",
                self.url.len()
            )
        })?;
        let uri: http::Uri = self.url.parse().map_err(|e| {
            Error::InvalidArgument(format!("push url {:?} is not a URL: {e}", self.url))
        })?;
        let scheme = uri.scheme_str().unwrap_or("");
        check(
            matches!(scheme, "http" | "https" | "grpc" | "grpcs"),
            || {
                format!(
                    "push url {:?} must start with http://, https://, grpc:// or grpcs:// \
                     (got scheme {scheme:?})",
                    self.url
                )
            },
        )?;
        check(uri.host().is_some_and(|h| !h.is_empty()), || {
            format!("push url {:?} names no host", self.url)
        })?;
        check(
            uri.authority().is_some_and(|a| !a.as_str().contains('@')),
            || format!("push url {:?} must not carry credentials", self.url),
        )?;
        check(
            !(scheme.starts_with("grpc") && uri.path().len() > 1),
            || {
                format!(
                    "push url {:?}: a gRPC target is host:port only (the method is \
                     timerdb.v1.Receiver/Receive)",
                    self.url
                )
            },
        )?;
        check((1..=2).contains(&self.secrets.len()), || {
            format!(
                "a push target takes one or two secrets (two while rotating), not {}",
                self.secrets.len()
            )
        })?;
        for s in &self.secrets {
            sign::Secret::parse(s)?;
        }
        check(
            self.timeout_ms >= 100 && self.timeout_ms < policy.ack_timeout_ms,
            || {
                format!(
                    "push timeout_ms {} must be at least 100 and less than ack_timeout_ms {}",
                    self.timeout_ms, policy.ack_timeout_ms
                )
            },
        )
    }
}

#[cfg(test)]
mod tests;
