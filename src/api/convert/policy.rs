//! Namespace policies over the wire: validation of PutNamespace (the policy, the limits and the
//! push target) and the policy as GetNamespace reports it.
//!
//! A zero field takes the documented default; the limits are `optional` so that unset means
//! "no limit" and an explicit 0 is refused (a rate of 0 would stop deliveries for good: pausing
//! is the way to do that). A push target's secrets may be left out: the leader keeps the
//! namespace's current ones or generates one (`Node::put_namespace`), so they are checked
//! again there.

use crate::api::pb;
use crate::config::Limits;
use crate::namespace::sign::Secret;
use crate::namespace::{
    Misfire, MisfireAction, Namespace, Policy, PushTarget, DEFAULT_PUSH_TIMEOUT_MS,
};
use crate::Error;

/// Validates a PutNamespace: the name, every policy field and the push target.
pub fn namespace_put(
    req: &pb::PutNamespaceRequest,
    limits: &Limits,
) -> Result<(String, Policy, Option<PushTarget>), Error> {
    crate::api::convert::check_name("namespace", &req.name, limits.max_namespace_bytes)?;
    let p = req.policy.clone().unwrap_or_default();
    let d = Policy::default();
    let or = |v: u64, default: u64| if v == 0 { default } else { v };
    let or32 = |v: u32, default: u32| if v == 0 { default } else { v };
    let policy = Policy {
        ack_timeout_ms: or(p.ack_timeout_ms, d.ack_timeout_ms),
        max_attempts: or32(p.max_attempts, d.max_attempts),
        backoff_min_ms: or(p.backoff_min_ms, d.backoff_min_ms),
        backoff_max_ms: or(p.backoff_max_ms, d.backoff_max_ms),
        backoff_multiplier_permille: or32(
            p.backoff_multiplier_permille,
            d.backoff_multiplier_permille,
        ),
        backoff_jitter_percent: p.backoff_jitter_percent.unwrap_or(d.backoff_jitter_percent),
        retention_ms: or(p.retention_ms, d.retention_ms),
        max_payload_bytes: or32(p.max_payload_bytes, d.max_payload_bytes),
        max_dispatches_per_second: p.max_dispatches_per_second,
        max_burst: p.max_burst,
        max_concurrent_dispatches: p.max_concurrent_dispatches,
        max_schedules_per_second: p.max_schedules_per_second,
        max_schedule_burst: p.max_schedule_burst,
        // Pause and resume have their own calls; a policy write keeps the flag (see
        // `Node::put_namespace`).
        paused: false,
        misfire: misfire(p.max_lateness_ms as i64, p.misfire, "policy.")?.unwrap_or_default(),
    }
    .with_default_bursts();
    policy.validate(limits.max_payload_bytes)?;
    let push = match p.push {
        None => None,
        Some(t) => {
            let target = PushTarget {
                url: t.url.trim().to_string(),
                secrets: t.secrets,
                timeout_ms: match t.timeout_ms {
                    0 => DEFAULT_PUSH_TIMEOUT_MS.min(policy.ack_timeout_ms / 2),
                    n => n,
                },
                dead_on_client_error: t.dead_on_client_error,
            };
            // Checked here for a clear answer before forwarding; secrets left out are filled
            // on the leader, and checked again there.
            let mut check = target.clone();
            if check.secrets.is_empty() {
                check.secrets = vec![Secret::generate()];
            }
            check.validate(&policy)?;
            Some(target)
        }
    };
    Ok((req.name.clone(), policy, push))
}

/// A misfire policy from `max_lateness_ms` and `misfire` (fields named after `prefix`);
/// `None` when both are unset.
pub fn misfire(max_lateness_ms: i64, action: i32, prefix: &str) -> Result<Option<Misfire>, Error> {
    let bad = |m: String| Error::InvalidArgument(m);
    let action = match pb::MisfireAction::try_from(action) {
        Ok(pb::MisfireAction::Unspecified) if max_lateness_ms == 0 => return Ok(None),
        Ok(pb::MisfireAction::Unspecified | pb::MisfireAction::Fire) => MisfireAction::Fire,
        Ok(pb::MisfireAction::Dead) => MisfireAction::Dead,
        Ok(pb::MisfireAction::Skip) => MisfireAction::Skip,
        Err(_) => return Err(bad(format!("{prefix}misfire {action} is unknown"))),
    };
    if max_lateness_ms < 0 {
        return Err(bad(format!(
            "{prefix}max_lateness_ms {max_lateness_ms} is negative"
        )));
    }
    if action != MisfireAction::Fire && max_lateness_ms == 0 {
        return Err(bad(format!(
            "{prefix}misfire {} needs {prefix}max_lateness_ms (how late is too late)",
            action.name().to_uppercase()
        )));
    }
    Ok(Some(Misfire {
        max_lateness_ms: max_lateness_ms as u64,
        action,
    }))
}

pub fn misfire_to_pb(a: MisfireAction) -> pb::MisfireAction {
    match a {
        MisfireAction::Fire => pb::MisfireAction::Fire,
        MisfireAction::Dead => pb::MisfireAction::Dead,
        MisfireAction::Skip => pb::MisfireAction::Skip,
    }
}

impl From<Namespace> for pb::Namespace {
    fn from(ns: Namespace) -> pb::Namespace {
        let p = ns.policy;
        pb::Namespace {
            name: ns.name,
            configured: ns.configured,
            policy: Some(pb::NamespacePolicy {
                ack_timeout_ms: p.ack_timeout_ms,
                max_attempts: p.max_attempts,
                backoff_min_ms: p.backoff_min_ms,
                backoff_max_ms: p.backoff_max_ms,
                backoff_multiplier_permille: p.backoff_multiplier_permille,
                backoff_jitter_percent: Some(p.backoff_jitter_percent),
                retention_ms: p.retention_ms,
                max_payload_bytes: p.max_payload_bytes,
                push: ns.push.map(|t| pb::PushTarget {
                    url: t.url,
                    secrets: t.secrets,
                    timeout_ms: t.timeout_ms,
                    dead_on_client_error: t.dead_on_client_error,
                }),
                max_dispatches_per_second: p.max_dispatches_per_second,
                max_burst: p.max_dispatches_per_second.map_or(0, |_| p.max_burst),
                max_concurrent_dispatches: p.max_concurrent_dispatches,
                max_schedules_per_second: p.max_schedules_per_second,
                max_schedule_burst: p
                    .max_schedules_per_second
                    .map_or(0, |_| p.max_schedule_burst),
                paused: p.paused,
                max_lateness_ms: p.misfire.max_lateness_ms,
                misfire: misfire_to_pb(p.misfire.action) as i32,
            }),
        }
    }
}
