//! Applying the delivery commands: what a due wheel entry does, and Deliver, Ack, Nack, Redrive.
//!
//! Same contract as `apply`: deterministic, no clock (every time comes from the entry), a
//! command that no longer applies is `Rejected` or skipped, never half-written.
//!
//! The delivery cycle of a FIRED timer, all of it in committed entries:
//! - Fire makes it READY (a ready-queue key, no wheel entry; no attempt is spent while it waits).
//! - Deliver makes it IN_FLIGHT: `attempts + 1`, a wheel entry at the ack deadline.
//! - Ack of the latest attempt makes it ACKED, finished, with a purge entry after retention.
//! - A passed ack deadline (a Fire entry) or a Nack expires the attempt: DEAD when the
//!   namespace's `max_attempts` deliveries were made since the last redrive, else BACKOFF with a
//!   wheel entry at the redelivery time; that entry coming due makes it READY again.
//!
//! A retried Ack of an ACKED timer, or a Nack of an attempt that already expired, answers with
//! the timer unchanged; acking an attempt other than the latest is refused, and changes nothing.

use std::collections::HashSet;

use super::apply::Applier;
use crate::timer::{Phase, Rejection, Response, Timer, TimerKey, TimerState};
use crate::{Error, Result};

impl Applier<'_> {
    /// A wheel entry of `timer` came due at `now_ms` (the caller checked it is due).
    pub(super) fn wake_up(&mut self, mut timer: Timer, now_ms: i64) -> Result<()> {
        self.unwake(&timer);
        match (timer.state, timer.phase) {
            (TimerState::Pending, _) => {
                self.count_pending(&timer.key.namespace, -1);
                self.events.fired(now_ms - timer.fire_at_ms);
                timer.state = TimerState::Fired;
                timer.fired_at_ms = now_ms;
                timer.fire_index = self.index;
                self.make_ready(&mut timer);
            }
            (TimerState::Fired, Phase::InFlight) => {
                timer.timeouts += 1;
                self.expire(&mut timer, now_ms)?;
            }
            (TimerState::Fired, Phase::Backoff) => self.make_ready(&mut timer),
            (TimerState::Fired, Phase::Ready) => {
                return Err(Error::Storage(format!(
                    "ready timer {} has a wheel entry",
                    timer.key
                )))
            }
            // Finished and its retention is over: gone, and its id is free again.
            (TimerState::Acked | TimerState::Cancelled | TimerState::Dead, _) => {
                self.delete(&timer.key);
                return Ok(());
            }
        }
        self.put(&timer);
        Ok(())
    }

    /// The latest delivery of an IN_FLIGHT timer failed (deadline or nack): DEAD at the
    /// attempt limit, else back off. The caller has removed its wheel entry and saves it.
    fn expire(&mut self, timer: &mut Timer, now_ms: i64) -> Result<()> {
        let policy = self.policy(&timer.key.namespace)?;
        if timer.attempts - timer.attempt_base >= policy.max_attempts {
            return self.finish(timer, TimerState::Dead, now_ms);
        }
        timer.phase = Phase::Backoff;
        let delay = policy.backoff_ms(timer.attempts - timer.attempt_base, timer.fire_index);
        self.wake(timer, now_ms.saturating_add(delay as i64));
        Ok(())
    }

    pub(super) fn deliver(&mut self, now_ms: i64, keys: Vec<TimerKey>) -> Result<Response> {
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let ready = match self.load(&key)? {
                Some(t) if t.state == TimerState::Fired && t.phase == Phase::Ready => Some(t),
                _ => None,
            };
            // A key twice in one entry: the first takes it (loads do not see this batch).
            let delivered = match ready {
                Some(mut timer) if seen.insert(key) => {
                    self.unwake(&timer);
                    let ack_timeout = self.policy(&timer.key.namespace)?.ack_timeout_ms;
                    self.events.delivered(timer.attempts > timer.attempt_base);
                    timer.attempts += 1;
                    timer.last_delivered_at_ms = now_ms;
                    timer.phase = Phase::InFlight;
                    self.wake(&mut timer, now_ms.saturating_add(ack_timeout as i64));
                    self.put(&timer);
                    Some(timer)
                }
                _ => None,
            };
            out.push(delivered);
        }
        Ok(Response::Delivered(out))
    }

    pub(super) fn ack(&mut self, now_ms: i64, key: TimerKey, attempt: u32) -> Result<Response> {
        let Some(mut timer) = self.load(&key)? else {
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        if timer.state == TimerState::Acked {
            // A retried ack (or a second consumer's): already done, nothing changes.
            return Ok(unchanged(timer));
        }
        if let Some(why) = refuse_attempt(&timer, attempt, "ack") {
            return Ok(Response::Rejected(Rejection::Refused { key, why }));
        }
        // The latest attempt, in flight, backing off or ready again: the work is done.
        self.unwake(&timer);
        self.finish(&mut timer, TimerState::Acked, now_ms)?;
        self.events.acked();
        self.put(&timer);
        Ok(unchanged(timer))
    }

    pub(super) fn nack(&mut self, now_ms: i64, key: TimerKey, attempt: u32) -> Result<Response> {
        let Some(mut timer) = self.load(&key)? else {
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        if let Some(why) = refuse_attempt(&timer, attempt, "nack") {
            return Ok(Response::Rejected(Rejection::Refused { key, why }));
        }
        if timer.phase != Phase::InFlight {
            // This attempt already expired (its deadline passed, or a retried nack).
            return Ok(unchanged(timer));
        }
        self.unwake(&timer);
        timer.nacks += 1;
        self.expire(&mut timer, now_ms)?;
        self.put(&timer);
        Ok(unchanged(timer))
    }

    pub(super) fn redrive(&mut self, now_ms: i64, keys: Vec<TimerKey>) -> Result<Response> {
        let mut seen = HashSet::new();
        let (mut timers, mut skipped) = (Vec::new(), Vec::new());
        for key in keys {
            if seen.contains(&key) {
                // Named twice: the first redrove it (loads do not see this batch).
                skipped.push((key, Some(TimerState::Pending)));
                continue;
            }
            seen.insert(key.clone());
            let mut timer = match self.load(&key)? {
                Some(t) if t.state == TimerState::Dead => t,
                other => {
                    skipped.push((key, other.map(|t| t.state)));
                    continue;
                }
            };
            self.unwake(&timer);
            timer.state = TimerState::Pending;
            timer.phase = Phase::Ready;
            timer.attempt_base = timer.attempts;
            timer.redrives += 1;
            (timer.fired_at_ms, timer.fire_index, timer.finished_at_ms) = (0, 0, 0);
            self.count_pending(&key.namespace, 1);
            // Due now: it fires with the next Fire entry.
            self.wake(&mut timer, now_ms);
            self.put(&timer);
            timers.push(timer);
        }
        Ok(Response::Redriven { timers, skipped })
    }
}

fn unchanged(timer: Timer) -> Response {
    Response::Timer {
        timer,
        created: false,
    }
}

/// Why `attempt` cannot be acked or nacked (`verb`) on `timer`, which is not ACKED; `None` if
/// it is the latest delivery of a FIRED timer.
fn refuse_attempt(timer: &Timer, attempt: u32, verb: &str) -> Option<String> {
    let latest = timer.attempts;
    match timer.state {
        TimerState::Fired if latest == 0 => Some(format!(
            "has fired but was not delivered yet: there is no attempt to {verb}"
        )),
        TimerState::Fired if attempt == latest => None,
        TimerState::Fired if attempt < latest && attempt > 0 => Some(format!(
            "attempt {attempt} is stale: attempt {latest} was delivered since; {verb} that one"
        )),
        TimerState::Fired => Some(format!(
            "was never delivered as attempt {attempt}; its latest attempt is {latest}"
        )),
        TimerState::Pending => Some(format!("is PENDING: it has not fired, nothing to {verb}")),
        TimerState::Cancelled => Some("is CANCELLED: it never fired".into()),
        TimerState::Dead => Some(format!(
            "is DEAD after {latest} attempts; Redrive it to deliver it again"
        )),
        TimerState::Acked => Some("is already ACKED".into()),
    }
}
