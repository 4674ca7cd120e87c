//! Validation of the create modes and conditions (`mode`, `max_wait_ms`, `if_state`,
//! `if_revision`) and of Reschedule's relative shifts, into [`crate::timer`]'s `Mode`, `Cond`
//! and `Shift` (the semantics: `storage/change.rs`).

use crate::api::convert::{self, state_from_pb};
use crate::api::pb;
use crate::command::{Cond, Mode, Shift};
use crate::config::Limits;
use crate::Error;

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// A condition from `if_state` / `if_revision` (unset: none).
pub fn cond(if_state: i32, if_revision: u64) -> Result<Cond, Error> {
    let if_state = state_from_pb(if_state)
        .map_err(|_| invalid(format!("if_state {if_state} is not a timer state")))?;
    Ok(Cond {
        if_state,
        if_revision: (if_revision != 0).then_some(if_revision),
    })
}

/// A Schedule's mode (`None`: create-only) and condition.
pub fn mode(req: &pb::ScheduleRequest) -> Result<(Option<Mode>, Cond), Error> {
    let c = cond(req.if_state, req.if_revision)?;
    let m = pb::CreateMode::try_from(req.mode)
        .map_err(|_| invalid(format!("mode {} is not a create mode", req.mode)))?;
    if req.max_wait_ms < 0 {
        return Err(invalid(format!(
            "max_wait_ms {} is negative",
            req.max_wait_ms
        )));
    }
    if req.max_wait_ms != 0 && m != pb::CreateMode::Debounce {
        return Err(invalid("max_wait_ms goes with mode DEBOUNCE".into()));
    }
    let mode = match m {
        pb::CreateMode::Unspecified | pb::CreateMode::CreateOnly => {
            if c.is_set() {
                return Err(invalid(
                    "if_state and if_revision go with mode UPSERT, DEBOUNCE, KEEP_EARLIEST or \
                     KEEP_LATEST (a create-only Schedule has no timer to compare)"
                        .into(),
                ));
            }
            None
        }
        pb::CreateMode::Upsert => Some(Mode::Upsert),
        pb::CreateMode::Debounce => Some(Mode::Debounce {
            max_wait_ms: req.max_wait_ms as u64,
        }),
        pb::CreateMode::KeepEarliest => Some(Mode::KeepEarliest),
        pb::CreateMode::KeepLatest => Some(Mode::KeepLatest),
    };
    if req.recurrence.is_some() && !matches!(mode, None | Some(Mode::Upsert)) {
        return Err(invalid(format!(
            "a recurring timer takes mode CREATE_ONLY or UPSERT, not {}",
            m.as_str_name()
        )));
    }
    Ok((mode, c))
}

/// A Reschedule's target: a time, or a shift of the stored fire time.
pub fn shift(w: Option<pb::reschedule_request::When>, limits: &Limits) -> Result<Shift, Error> {
    use pb::reschedule_request::When as W;
    let by = |field: &str, ms: i64| {
        if ms < 0 || ms > limits.max_delay_ms {
            return Err(invalid(format!(
                "{field} {ms} must be 0 … {} ms",
                limits.max_delay_ms
            )));
        }
        Ok(ms)
    };
    match w {
        Some(W::ExtendByMs(ms)) => Ok(Shift::ExtendBy(by("extend_by_ms", ms)?)),
        Some(W::PullInMs(ms)) => Ok(Shift::PullIn(by("pull_in_ms", ms)?)),
        other => Ok(Shift::To(convert::reschedule_when(other, limits)?)),
    }
}
