//! Applying changes to a timer that exists: Cancel and Reschedule (with their conditions), and
//! the Schedule modes other than create-only (upsert, debounce, keep-earliest, keep-latest).
//!
//! Each change is decided here, in apply, against the timer as the log has made it, so
//! concurrent callers are ordered by the log: of two conditional updates naming one revision,
//! the first applied wins and the second finds the revision moved (FAILED_PRECONDITION naming
//! state and revision); sixteen debouncers end with whichever was applied last. A change
//! writes the timer's row anew with its revision one higher; a change that changes nothing
//! (keep-earliest with a later time) writes nothing and answers the timer as it is.

use super::apply::Applier;
use super::row::{Kind, Row};
use crate::command::{Cond, Mode, Options, Rejection, Response, Shift};
use crate::timer::{Timer, TimerKey, TimerSpec, TimerState};
use crate::Result;

fn answer(timer: Timer, created: bool) -> Response {
    Response::Timer { timer, created }
}

impl Applier<'_> {
    /// `key`'s row, slot and view, if the timer exists.
    fn found(&mut self, key: &TimerKey) -> Result<Option<(crate::wheel::Slot, Row, Timer)>> {
        match self.find(key)? {
            Some((slot, row)) => {
                let t = self.view(&key.namespace, slot, &row)?;
                Ok(Some((slot, row, t)))
            }
            None => Ok(None),
        }
    }

    /// Moves the PENDING timer `t` (row `row` at `slot`) to `fire_at_ms`, with `with`'s payload
    /// if given; one revision up. Returns the timer as it now is.
    fn rewrite_pending(
        &mut self,
        (slot, row, t): (crate::wheel::Slot, Row, Timer),
        fire_at_ms: i64,
        with: Option<&TimerSpec>,
    ) -> Result<Timer> {
        let mut moved = row;
        moved.fire_at_ms = fire_at_ms;
        moved.body.ext.revision = t.revision + 1;
        if let Some(spec) = with {
            moved.body.payload = spec.payload.clone();
            moved.body.content_type = spec.content_type.clone();
            moved.body.scheduled_when = spec.when;
        }
        let ns = t.key.namespace.clone();
        let new_slot = self.move_row(&ns, slot, moved.clone(), fire_at_ms)?;
        self.view(&ns, new_slot, &moved)
    }

    pub(super) fn cancel(&mut self, now_ms: i64, key: TimerKey, cond: Cond) -> Result<Response> {
        let Some((slot, row, timer)) = self.found(&key)? else {
            if let Some(deleted) = self.cancel_recurring(now_ms, &key, cond)? {
                return Ok(deleted);
            }
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        if let Some(why) = cond.refuses(timer.state, timer.revision) {
            return Ok(Response::Rejected(Rejection::Condition { key, why }));
        }
        match timer.state {
            TimerState::Pending => {
                self.count_pending(&key.namespace, -1)?;
                let mut cancelled = row;
                cancelled.kind = Kind::Cancelled;
                cancelled.body.finished_at_ms = now_ms;
                cancelled.body.ext.revision = timer.revision + 1;
                let new_slot = self.move_row(&key.namespace, slot, cancelled.clone(), now_ms)?;
                let timer = self.view(&key.namespace, new_slot, &cancelled)?;
                Ok(answer(timer, false))
            }
            // A retried cancel: the timer is already what the client asked for.
            TimerState::Cancelled => Ok(answer(timer, false)),
            state => Ok(Response::Rejected(Rejection::WrongState { key, state })),
        }
    }

    pub(super) fn reschedule(
        &mut self,
        now_ms: i64,
        key: TimerKey,
        shift: Shift,
        cond: Cond,
    ) -> Result<Response> {
        if let Some(refused) = self.reschedule_refused(&key)? {
            return Ok(Response::Rejected(refused));
        }
        let Some(found) = self.found(&key)? else {
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        let t = &found.2;
        if let Some(why) = cond.refuses(t.state, t.revision) {
            return Ok(Response::Rejected(Rejection::Condition { key, why }));
        }
        if t.state != TimerState::Pending {
            let state = t.state;
            return Ok(Response::Rejected(Rejection::WrongState { key, state }));
        }
        let at = match shift {
            Shift::To(when) => when.resolve(now_ms),
            Shift::ExtendBy(ms) => t.fire_at_ms.saturating_add(ms),
            Shift::PullIn(ms) => t.fire_at_ms.saturating_sub(ms),
        };
        let timer = self.rewrite_pending(found, at, None)?;
        Ok(answer(timer, false))
    }

    /// A Schedule in `mode` (see [`Mode`]): absent, the timer is created as by create-only;
    /// PENDING, it is changed as the mode says; in any other state the call is refused.
    pub(super) fn schedule_with(
        &mut self,
        now_ms: i64,
        spec: &TimerSpec,
        with: Options,
    ) -> Result<Response> {
        let Options {
            mode,
            cond,
            misfire,
        } = with;
        let key = spec.key.clone();
        if self.recurring_row(&key)?.is_some() {
            return Ok(Response::Rejected(Rejection::AlreadyExists(key)));
        }
        let Some(found) = self.found(&key)? else {
            if cond.is_set() {
                return Ok(Response::Rejected(Rejection::NotFound(key)));
            }
            let mut first = spec.clone();
            if let Some(Mode::Debounce { max_wait_ms }) = mode {
                first.when = crate::timer::When::At(debounced(spec, now_ms, now_ms, max_wait_ms));
            }
            self.create_with(now_ms, &first, misfire)?;
            return Ok(answer(Timer::pending(first, now_ms), true));
        };
        let Some(mode) = mode else {
            // Create-only: the same timer again is answered, another is refused.
            let (_, _, t) = found;
            if t.same_request(spec) {
                return Ok(answer(t, false));
            }
            return Ok(Response::Rejected(Rejection::AlreadyExists(key)));
        };
        let t = &found.2;
        if let Some(why) = cond.refuses(t.state, t.revision) {
            return Ok(Response::Rejected(Rejection::Condition { key, why }));
        }
        if t.state != TimerState::Pending {
            let why = format!(
                "is {} (revision {}): {} changes only PENDING timers",
                t.state.name(),
                t.revision,
                mode.name()
            );
            return Ok(Response::Rejected(Rejection::Refused { key, why }));
        }
        let asked = spec.when.resolve(now_ms);
        let to = match mode {
            Mode::Upsert => Some(asked),
            Mode::Debounce { max_wait_ms } => {
                Some(debounced(spec, now_ms, t.created_at_ms, max_wait_ms))
            }
            Mode::KeepEarliest => (asked < t.fire_at_ms).then_some(asked),
            Mode::KeepLatest => (asked > t.fire_at_ms).then_some(asked),
        };
        let Some(to) = to else {
            let (_, _, t) = found;
            return Ok(answer(t, false)); // the stored time is kept: nothing changes
        };
        let timer = self.rewrite_pending(found, to, Some(spec))?;
        Ok(answer(timer, false))
    }
}

/// A debounced fire time: the asked one, but no later than `max_wait_ms` after the timer was
/// first scheduled (`first_ms`; 0: no cap).
fn debounced(spec: &TimerSpec, now_ms: i64, first_ms: i64, max_wait_ms: u64) -> i64 {
    let asked = spec.when.resolve(now_ms);
    match max_wait_ms {
        0 => asked,
        cap => asked.min(first_ms.saturating_add(cap as i64)),
    }
}
