//! Recurrence arithmetic: when a recurring timer's next occurrence is (docs/recurrence.md).
//!
//! A pure function of the rule and an instant, so that apply can call it and every replica
//! gets the same answer from the same log: no clock is read here, no host file either. A
//! cron rule's time zone comes from the IANA database compiled into the binary
//! (`TimeZoneDatabase::bundled`, looked up explicitly: jiff's default lookup would prefer the
//! host's `/usr/share/zoneinfo`, and two hosts with different files would then disagree). An
//! interval rule is integer arithmetic on milliseconds from its anchor.
//!
//! DST follows croner (the Open Cron Pattern Specification, Vixie cron): a fixed-time rule
//! (`30 2 * * *`) whose wall time falls in a spring-forward gap runs once, at the first valid
//! time after the gap; interval and wildcard rules (`*/30 * * * *`) skip the occurrences inside
//! the gap; at fall-back a fixed-time rule runs once (the first pass) and an interval rule runs
//! at each matching wall time of both passes. Occurrences only move forward in real time.
//!
//! Not yet wired into the state machine: issue 17 builds the series on top of this.

use jiff::tz::{TimeZone, TimeZoneDatabase};
use jiff::Timestamp;

use crate::{Error, Result};

/// Longest cron expression or zone name accepted (both are user input kept in the log).
const MAX_TEXT: usize = 256;

/// When a recurring timer fires.
#[derive(Debug, Clone)]
pub enum Rule {
    /// A cron expression (5 fields, or 6 with seconds first) read in a time zone.
    Cron {
        cron: Box<croner::Cron>,
        zone: TimeZone,
        expr: String,
        zone_name: String,
    },
    /// Every `period_ms`, at `anchor_ms + k × period_ms`.
    Every { period_ms: i64, anchor_ms: i64 },
}

impl Rule {
    /// A cron rule; the errors name the request field at fault.
    pub fn cron(expr: &str, zone_name: &str) -> Result<Rule> {
        let bad = |field: &str, why: String| Error::InvalidArgument(format!("{field}: {why}"));
        if expr.len() > MAX_TEXT || zone_name.len() > MAX_TEXT {
            return Err(bad(
                "recurrence",
                format!("the cron expression and the time zone are at most {MAX_TEXT} bytes"),
            ));
        }
        let fields = expr.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(bad(
                "recurrence.cron",
                format!(
                    "{expr:?} has {fields} fields; give 5 (minute hour day month weekday) or 6 \
                     (seconds first)"
                ),
            ));
        }
        let cron: croner::Cron = expr.parse().map_err(|e| {
            bad(
                "recurrence.cron",
                format!("{expr:?} is not a cron expression: {e}"),
            )
        })?;
        if zone_name.is_empty() {
            return Err(bad(
                "recurrence.time_zone",
                "a cron rule needs an IANA time zone, e.g. Europe/Berlin or UTC".into(),
            ));
        }
        let zone = TimeZoneDatabase::bundled().get(zone_name).map_err(|_| {
            bad(
                "recurrence.time_zone",
                format!("unknown time zone {zone_name:?} (an IANA name, e.g. America/New_York)"),
            )
        })?;
        Ok(Rule::Cron {
            cron: Box::new(cron),
            zone,
            expr: expr.to_string(),
            zone_name: zone_name.to_string(),
        })
    }

    /// An interval rule; `anchor_ms` is an instant the series passes through.
    pub fn every(period_ms: i64, anchor_ms: i64) -> Result<Rule> {
        if period_ms <= 0 {
            return Err(Error::InvalidArgument(format!(
                "recurrence.every: the interval must be positive, got {period_ms} ms"
            )));
        }
        Ok(Rule::Every {
            period_ms,
            anchor_ms,
        })
    }

    /// The first occurrence strictly after `after_ms` (Unix milliseconds), or `None` if there is
    /// none the arithmetic can represent (a cron rule that never matches again).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        match self {
            Rule::Every {
                period_ms,
                anchor_ms,
            } => {
                if after_ms < *anchor_ms {
                    return Some(*anchor_ms);
                }
                // The number of whole periods from the anchor to after_ms, plus one.
                let k = (after_ms - anchor_ms) / period_ms + 1;
                anchor_ms.checked_add(k.checked_mul(*period_ms)?)
            }
            Rule::Cron { cron, zone, .. } => {
                let start = Timestamp::from_millisecond(after_ms)
                    .ok()?
                    .to_zoned(zone.clone());
                let next = cron.find_next_occurrence(&start, false).ok()?;
                Some(next.timestamp().as_millisecond())
            }
        }
    }

    /// The next `n` occurrences after `after_ms` (what `timerctl next` shows).
    pub fn upcoming(&self, after_ms: i64, n: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(n);
        let mut at = after_ms;
        while out.len() < n {
            match self.next_after(at) {
                Some(t) => {
                    out.push(t);
                    at = t;
                }
                None => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
