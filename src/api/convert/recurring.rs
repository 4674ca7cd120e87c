//! Validation and conversion of recurring timers (`Recurrence`, `Series`) between protobuf and
//! [`crate::series`]. A bad rule is refused here, naming the field, before anything is
//! proposed; apply builds the rule again from what was validated (docs/recurrence.md).

use crate::api::convert::{self, MAX_FIRE_AT_MS};
use crate::api::pb;
use crate::config::{Limits, MIN_FIRE_AT_MS};
use crate::recurring::{
    self, Misfire, Overlap, Recurrence, RecurringSpec, RecurringView, RuleSpec, TimerOrRecurring,
    DEFAULT_CATCH_UP_WINDOW_MS, DEFAULT_MAX_LATENESS_MS, OCCURRENCE_SUFFIX_BYTES,
};
use crate::Error;

/// Most next occurrence times a Get shows.
pub const MAX_NEXT_COUNT: u32 = 1000;

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// Validates a Schedule that carries a recurrence.
pub fn recurring_spec(req: &pb::ScheduleRequest, limits: &Limits) -> Result<RecurringSpec, Error> {
    let key = convert::key(&req.namespace, &req.id, limits)?;
    if key.id.len() + OCCURRENCE_SUFFIX_BYTES > limits.max_id_bytes {
        return Err(invalid(format!(
            "id of a recurring timer is at most {} bytes (its occurrences add \
             {OCCURRENCE_SUFFIX_BYTES}: @2026-11-26T09:00:00.000Z); {:?} is {}",
            limits.max_id_bytes - OCCURRENCE_SUFFIX_BYTES,
            key.id,
            key.id.len()
        )));
    }
    if req.max_lateness_ms != 0 || req.misfire != 0 {
        return Err(invalid(
            "max_lateness_ms and misfire are for one-shot timers; a recurring timer has \
             recurrence.misfire and recurrence.max_lateness_ms"
                .into(),
        ));
    }
    if req.when.is_some() {
        return Err(invalid(
            "a recurring timer's fire times come from its recurrence: set neither fire_at_ms \
             nor delay_ms (recurrence.start_ms delays the first occurrence)"
                .into(),
        ));
    }
    let one_shot = convert::spec(
        &pb::ScheduleRequest {
            when: Some(pb::schedule_request::When::DelayMs(0)),
            recurrence: None,
            ..req.clone()
        },
        limits,
    )?;
    let r = req.recurrence.as_ref().expect("the caller checked");
    let recurrence = recurrence(r)?;
    Ok(RecurringSpec {
        key,
        recurrence,
        payload: one_shot.payload,
        content_type: one_shot.content_type,
    })
}

fn instant(field: &str, ms: i64) -> Result<i64, Error> {
    if ms != 0 && !(MIN_FIRE_AT_MS..=MAX_FIRE_AT_MS).contains(&ms) {
        return Err(invalid(format!(
            "recurrence.{field} {ms} is not Unix milliseconds between the years 2000 and 9999"
        )));
    }
    Ok(ms)
}

fn window(field: &str, ms: i64, default: u64) -> Result<u64, Error> {
    match ms {
        0 => Ok(default),
        ms if ms < 0 => Err(invalid(format!("recurrence.{field} {ms} is negative"))),
        ms => Ok(ms as u64),
    }
}

/// Validates a `Recurrence` message.
pub fn recurrence(r: &pb::Recurrence) -> Result<Recurrence, Error> {
    let rule = match (r.cron.is_empty(), r.every_ms) {
        (false, 0) => {
            if r.anchor_ms != 0 {
                return Err(invalid(
                    "recurrence.anchor_ms goes with every_ms, not with a cron rule".into(),
                ));
            }
            RuleSpec::Cron {
                expr: r.cron.trim().to_string(),
                zone: r.time_zone.clone(),
            }
        }
        (true, 0) => {
            return Err(invalid(
                "recurrence.every_ms is 0 and recurrence.cron is empty: set every_ms (at least \
                 1000 ms) or cron (with time_zone)"
                    .into(),
            ))
        }
        (true, every) => {
            if !r.time_zone.is_empty() {
                return Err(invalid(
                    "recurrence.time_zone goes with cron; an interval is in absolute time".into(),
                ));
            }
            RuleSpec::Every {
                period_ms: every,
                anchor_ms: instant("anchor_ms", r.anchor_ms)?,
            }
        }
        (false, _) => return Err(invalid("recurrence: set cron or every_ms, not both".into())),
    };
    let misfire = match pb::Misfire::try_from(r.misfire) {
        Ok(pb::Misfire::Unspecified | pb::Misfire::FireOnce) => Misfire::FireOnce,
        Ok(pb::Misfire::FireAll) => Misfire::FireAll,
        Ok(pb::Misfire::Skip) => Misfire::Skip,
        Err(_) => {
            return Err(invalid(format!(
                "recurrence.misfire {} is unknown",
                r.misfire
            )))
        }
    };
    let overlap = match pb::Overlap::try_from(r.overlap) {
        Ok(pb::Overlap::Unspecified | pb::Overlap::Allow) => Overlap::Allow,
        Ok(pb::Overlap::Skip) => Overlap::Skip,
        Ok(pb::Overlap::BufferOne) => Overlap::BufferOne,
        Err(_) => {
            return Err(invalid(format!(
                "recurrence.overlap {} is unknown",
                r.overlap
            )))
        }
    };
    let out = Recurrence {
        rule,
        start_ms: instant("start_ms", r.start_ms)?,
        end_ms: instant("end_ms", r.end_ms)?,
        max_count: r.max_count,
        misfire,
        catch_up_window_ms: window(
            "catch_up_window_ms",
            r.catch_up_window_ms,
            DEFAULT_CATCH_UP_WINDOW_MS,
        )?,
        max_lateness_ms: window(
            "max_lateness_ms",
            r.max_lateness_ms,
            DEFAULT_MAX_LATENESS_MS,
        )?,
        overlap,
        jitter_ms: window("jitter_ms", r.jitter_ms, 0)?,
    };
    out.validate()?;
    Ok(out)
}

/// Validates Get's `next_count`.
pub fn next_count(n: u32) -> Result<usize, Error> {
    match n {
        0 => Ok(5),
        n if n > MAX_NEXT_COUNT => Err(invalid(format!(
            "next_count {n} exceeds the limit of {MAX_NEXT_COUNT}"
        ))),
        n => Ok(n as usize),
    }
}

fn recurrence_to_pb(r: Recurrence) -> pb::Recurrence {
    let (cron, time_zone, every_ms, anchor_ms) = match r.rule {
        RuleSpec::Cron { expr, zone } => (expr, zone, 0, 0),
        RuleSpec::Every {
            period_ms,
            anchor_ms,
        } => (String::new(), String::new(), period_ms, anchor_ms),
    };
    pb::Recurrence {
        cron,
        time_zone,
        every_ms,
        anchor_ms,
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        max_count: r.max_count,
        misfire: match r.misfire {
            Misfire::FireOnce => pb::Misfire::FireOnce,
            Misfire::FireAll => pb::Misfire::FireAll,
            Misfire::Skip => pb::Misfire::Skip,
        } as i32,
        catch_up_window_ms: r.catch_up_window_ms as i64,
        max_lateness_ms: r.max_lateness_ms as i64,
        overlap: match r.overlap {
            Overlap::Allow => pb::Overlap::Allow,
            Overlap::Skip => pb::Overlap::Skip,
            Overlap::BufferOne => pb::Overlap::BufferOne,
        } as i32,
        jitter_ms: r.jitter_ms as i64,
    }
}

/// A recurring timer as the API shows it: the timer a client sees for it, with the series'
/// own state in `series`.
impl From<RecurringView> for pb::Timer {
    fn from(v: RecurringView) -> pb::Timer {
        let mut timer: pb::Timer = v.timer().into();
        timer.series = Some(recurring_to_pb(v));
        timer
    }
}

/// What a key names, as a Timer message.
impl From<TimerOrRecurring> for pb::Timer {
    fn from(found: TimerOrRecurring) -> pb::Timer {
        match found {
            TimerOrRecurring::Timer(t) => t.into(),
            TimerOrRecurring::Recurring(v) => v.into(),
        }
    }
}

/// A series' state for the `series` field of a Timer.
fn recurring_to_pb(v: RecurringView) -> pb::Series {
    let s = v.recurring;
    let next_id = s
        .next
        .map(|n| recurring::occurrence_id(&s.spec.key.id, n.nominal_ms))
        .unwrap_or_default();
    pb::Series {
        status: s.status.name().into(),
        next_ms: v.upcoming_ms,
        next_id,
        fired: s.fired,
        skipped: s.skipped,
        missed: s.missed,
        recent: v
            .recent
            .into_iter()
            .map(|(id, fate, state)| pb::Occurrence {
                id,
                fate: fate.name().into(),
                state: state.map_or(pb::TimerState::Unspecified, convert::state_to_pb) as i32,
            })
            .collect(),
        tzdb: s.tzdb,
        recurrence: Some(recurrence_to_pb(s.spec.recurrence)),
    }
}
