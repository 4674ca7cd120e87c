//! A series as a client sees it: the stored series with its next occurrence times and the fate
//! of its latest occurrences ([`RecurringView`]), the timer shown for it, and [`TimerOrRecurring`],
//! what a key names when it may be either. Read-side only: nothing here is replicated.

use serde::{Deserialize, Serialize};

use super::{Fate, RecurringTimer};
use crate::timer::{Phase, Timer, TimerState, When};

/// A series as a client sees it: the stored series, the next occurrence times and what
/// became of the latest occurrences (their current state, where they still exist).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecurringView {
    pub recurring: RecurringTimer,
    pub upcoming_ms: Vec<i64>,
    /// Latest occurrences, oldest first: (id, fate, state now if it still exists).
    pub recent: Vec<(String, Fate, Option<TimerState>)>,
}

impl RecurringView {
    /// The timer a client sees for the series (a recurring timer's Get, Cancel and List show
    /// it beside the series' own state): its key, payload and next fire time, PENDING while
    /// occurrences are to come (active or paused), ACKED once it ended, CANCELLED once deleted.
    pub fn timer(&self) -> Timer {
        let s = &self.recurring;
        let next = s.next.map_or(0, |n| n.fire_at_ms);
        Timer {
            key: s.spec.key.clone(),
            fire_at_ms: next,
            payload: s.spec.payload.clone(),
            state: s.status.timer_state(),
            attempts: 0,
            created_at_ms: s.created_at_ms,
            fired_at_ms: 0,
            fire_index: 0,
            finished_at_ms: s.finished_at_ms,
            scheduled_when: When::At(next),
            phase: Phase::Ready,
            wake_at_ms: next,
            attempt_base: 0,
            last_delivered_at_ms: 0,
            nacks: 0,
            timeouts: 0,
            redrives: 0,
            content_type: s.spec.content_type.clone(),
            attempt_log: Vec::new(),
            revision: s.revision,
        }
    }
}

/// What a key names, as a client sees it: a timer, or a recurring timer (its series). A Get
/// or a Cancel may meet either; the series is its own type, not a field of every timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerOrRecurring {
    Timer(Timer),
    Recurring(RecurringView),
}

/// The next `n` occurrence times of `series` (nominal, as the occurrence ids name them), from
/// its materialised next occurrence on, within its end time and max count.
pub fn upcoming(recurring: &RecurringTimer, n: usize) -> Vec<i64> {
    let Some(next) = recurring.next else {
        return Vec::new();
    };
    let Ok(rule) = recurring.spec.recurrence.rule(recurring.created_at_ms) else {
        return vec![next.nominal_ms];
    };
    let r = &recurring.spec.recurrence;
    let mut left = match r.max_count {
        0 => n,
        max => n.min(max.saturating_sub(recurring.fired) as usize),
    };
    let mut out = Vec::with_capacity(left);
    let mut at = Some(next.nominal_ms);
    while let Some(t) = at {
        if left == 0 || (r.end_ms != 0 && t > r.end_ms) {
            break;
        }
        out.push(t);
        left -= 1;
        at = rule.next_after(t);
    }
    out
}
