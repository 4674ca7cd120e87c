//! Applying the delivery commands: grants (leases), acks, nacks and redrives.
//!
//! Same contract as `apply`: deterministic, no clock (every time comes from the entry), a
//! command that no longer applies is `Rejected` or skipped, never half-written.
//!
//! The delivery cycle of a fired timer, all of it in committed entries:
//! - A grant leases the next deliverable rows of a namespace (those between its delivery cursor
//!   and the fire cursor) to a subscriber: one lease record and one deadline for all of them;
//!   each is in flight as its `attempts + 1` until the lease's deadline.
//! - An ack of the latest attempt rewrites the timer's row as `Acked` (one write); a lease acked
//!   whole is settled as acked (one write for all its timers).
//! - A deadline that passes (see `fire.rs`) or a nack gives the timer back: a `Retry` row at the
//!   redelivery time, or `Dead` at the namespace's attempt limit.
//! - A redrive moves a `Dead` row back to `Pending`: it fires again, with a new fire index.
//!
//! A retried Ack of an ACKED timer, or a Nack of an attempt that already expired, answers with
//! the timer unchanged; acking an attempt other than the latest is refused, and changes nothing.

use std::collections::HashSet;

use super::apply::Applier;
use super::fire::record_attempt;
use super::read::slot_of_key;
use super::row::{header, latency_ms, materialize, Kind, Lease, Settled};
use super::{cf, CF_DEADLINES};
use crate::command::{Grant, Granted, LeaseRef, Rejection, Response};
use crate::timer::{AttemptRecord, Channel, Outcome, Phase, Timer, TimerKey, TimerState};
use crate::Result;

/// Most rows one grant's scan reads (finished rows it passes count too), so that a namespace
/// with a long run of cancelled timers cannot make one entry's apply long.
const GRANT_SCAN_BUDGET: u32 = 100_000;

impl Applier<'_> {
    pub(super) fn deliver(&mut self, now_ms: i64, grants: Vec<Grant>) -> Result<Response> {
        let mut out = Vec::with_capacity(grants.len());
        for g in grants {
            out.push(self.grant(now_ms, &g.namespace, g.room, g.push)?);
        }
        Ok(Response::Delivered(out))
    }

    /// Leases `namespace`'s next `room` deliverable rows (and the finished rows among them);
    /// with `room` 0, only passes the finished rows before the first deliverable one.
    pub(super) fn grant(
        &mut self,
        now_ms: i64,
        namespace: &str,
        room: u32,
        push: bool,
    ) -> Result<Option<Granted>> {
        let from = self.ns(namespace)?.delivered_to;
        let cursor = self.progress.cursor;
        if from >= cursor {
            return Ok(None);
        }
        let (mut count, mut rows, mut to, mut redelivered) = (0u32, 0u32, from, 0u64);
        let reader = self.reader();
        let mut iter = reader.rows_between(namespace, from, cursor);
        while let (Some(k), Some(v)) = (iter.key(), iter.value()) {
            if rows >= GRANT_SCAN_BUDGET {
                break;
            }
            let kind = header(v)?.0;
            if kind.deliverable() {
                if count == room {
                    break;
                }
                count += 1;
                redelivered += u64::from(kind == Kind::Retry);
            }
            rows += 1;
            to = slot_of_key(k)?;
            iter.next();
        }
        iter.status()?;
        drop(iter);
        drop(reader);
        if rows == 0 {
            return Ok(None);
        }
        let ack_timeout = self.policy(namespace)?.ack_timeout_ms;
        let deadline_ms = now_ms.saturating_add(ack_timeout as i64);
        let lease = Lease {
            from,
            delivered_at_ms: now_ms,
            deadline_ms,
            count,
            rows,
            push,
            // Nothing was handed out: the finished rows it passed are settled at once.
            settled: (count == 0).then_some(Settled {
                at_ms: now_ms,
                acked: false,
            }),
        };
        self.put_lease(namespace, to, lease);
        if count > 0 {
            let key = self.space.deadline_key(deadline_ms, namespace, to);
            self.batch.put_cf(cf(self.db, CF_DEADLINES), key, []);
            let at = deadline_ms.max(0) as u64;
            self.deadlines_written = Some(self.deadlines_written.map_or(at, |w| w.min(at)));
            self.wakes_at(deadline_ms);
        }
        self.ns(namespace)?.delivered_to = to;
        self.events.delivered(count as u64, redelivered);
        Ok((count > 0).then(|| Granted {
            namespace: namespace.to_string(),
            from,
            to,
            count,
            deadline_ms,
        }))
    }

    pub(super) fn ack(&mut self, now_ms: i64, key: TimerKey, attempt: u32) -> Result<Response> {
        self.ack_with(now_ms, key, attempt, None)
    }

    /// An ack, recording the attempt as `record` (a push's answer), else as a consumer's ack.
    fn ack_with(
        &mut self,
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
        record: Option<AttemptRecord>,
    ) -> Result<Response> {
        let Some((slot, row)) = self.find(&key)? else {
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        let timer = self.view(&key.namespace, slot, &row)?;
        if timer.state == TimerState::Acked {
            // A retried ack (or a second consumer's): already done, nothing changes.
            return Ok(unchanged(timer));
        }
        if let Some(why) = refuse_attempt(&timer, attempt, "ack") {
            return Ok(Response::Rejected(Rejection::Refused { key, why }));
        }
        // The latest attempt, in flight, backing off or ready again: the work is done.
        let mut timer = timer;
        let record = record.unwrap_or_else(|| consumer_record(&timer, now_ms, Outcome::Acked));
        record_attempt(&mut timer, record);
        let mut acked = materialize(&timer, Kind::Acked);
        acked.body.finished_at_ms = now_ms;
        acked.body.wake_at_ms = row.body.wake_at_ms;
        self.put_row(&key.namespace, slot, acked.clone());
        self.events.acked(1);
        Ok(unchanged(self.view(&key.namespace, slot, &acked)?))
    }

    /// Leases acked whole first (so that an ack of one of their timers in the same command
    /// finds it ACKED), then the single acks.
    pub(super) fn acks(
        &mut self,
        now_ms: i64,
        leases: Vec<LeaseRef>,
        acks: Vec<(TimerKey, u32)>,
    ) -> Result<Response> {
        let mut whole = Vec::with_capacity(leases.len());
        for l in leases {
            whole.push(self.ack_lease(now_ms, &l)?);
        }
        self.prefetch_index(acks.iter().map(|(key, _)| key))?;
        let mut answers = Vec::with_capacity(acks.len());
        for (key, attempt) in acks {
            answers.push(self.ack(now_ms, key, attempt)?);
        }
        Ok(Response::Acked {
            leases: whole,
            acks: answers,
        })
    }

    /// Acks every delivery of an open lease at once; false if it is not open any more (its
    /// deadline passed, or it was acked already), in which case nothing changes and the caller
    /// acks its deliveries one by one.
    fn ack_lease(&mut self, now_ms: i64, l: &LeaseRef) -> Result<bool> {
        let Some(mut lease) = self.lease(&l.namespace, l.to)? else {
            return Ok(false);
        };
        if lease.settled.is_some() {
            return Ok(false);
        }
        // Count what it acks (timers acked or nacked alone meanwhile are not in flight).
        let mut in_flight = 0;
        let reader = self.reader();
        let mut iter = reader.rows_between(&l.namespace, lease.from, l.to);
        while let Some(v) = iter.value() {
            in_flight += u64::from(header(v)?.0.deliverable());
            iter.next();
        }
        iter.status()?;
        drop(iter);
        drop(reader);
        let deadline = self
            .space
            .deadline_key(lease.deadline_ms, &l.namespace, l.to);
        self.batch.delete_cf(cf(self.db, CF_DEADLINES), deadline);
        lease.settled = Some(Settled {
            at_ms: now_ms,
            acked: true,
        });
        self.put_lease(&l.namespace, l.to, lease);
        self.events.acked(in_flight);
        Ok(true)
    }

    pub(super) fn nack(&mut self, now_ms: i64, key: TimerKey, attempt: u32) -> Result<Response> {
        self.nack_with(now_ms, key, attempt, None, (false, 0))
    }

    /// The outcome of a push: an ack, or a nack (DEAD at once with `dead`; the next attempt
    /// not before `retry_after_ms`), recorded as `record`.
    pub(super) fn pushed(
        &mut self,
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
        (ok, dead, retry_after_ms): (bool, bool, u64),
        record: AttemptRecord,
    ) -> Result<Response> {
        if ok {
            self.ack_with(now_ms, key, attempt, Some(record))
        } else {
            self.nack_with(now_ms, key, attempt, Some(record), (dead, retry_after_ms))
        }
    }

    fn nack_with(
        &mut self,
        now_ms: i64,
        key: TimerKey,
        attempt: u32,
        record: Option<AttemptRecord>,
        (dead, retry_after_ms): (bool, u64),
    ) -> Result<Response> {
        let Some((slot, row)) = self.find(&key)? else {
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        let mut timer = self.view(&key.namespace, slot, &row)?;
        if let Some(why) = refuse_attempt(&timer, attempt, "nack") {
            return Ok(Response::Rejected(Rejection::Refused { key, why }));
        }
        if timer.phase != Phase::InFlight {
            // This attempt already expired (its deadline passed, or a retried nack).
            return Ok(unchanged(timer));
        }
        if record.is_none() {
            timer.nacks += 1;
        }
        let record = record.unwrap_or_else(|| consumer_record(&timer, now_ms, Outcome::Nacked));
        record_attempt(&mut timer, record);
        self.give_back(&key.namespace, slot, timer, now_ms, (dead, retry_after_ms))?;
        let (slot, row) = self.find(&key)?.expect("just placed");
        Ok(unchanged(self.view(&key.namespace, slot, &row)?))
    }

    pub(super) fn redrive(&mut self, now_ms: i64, keys: Vec<TimerKey>) -> Result<Response> {
        let mut seen = HashSet::new();
        let (mut timers, mut skipped) = (Vec::new(), Vec::new());
        for key in keys {
            if !seen.insert(key.clone()) {
                // Named twice: the first redrove it.
                skipped.push((key, Some(TimerState::Pending)));
                continue;
            }
            let found = self.find(&key)?;
            let (slot, row) = match found {
                Some((slot, row)) if row.kind == Kind::Dead => (slot, row),
                Some((slot, row)) => {
                    let state = self.view(&key.namespace, slot, &row)?.state;
                    skipped.push((key, Some(state)));
                    continue;
                }
                None => {
                    skipped.push((key, None));
                    continue;
                }
            };
            let mut again = row;
            again.kind = Kind::Pending;
            again.body.ext.revision = again.body.ext.revision.max(1) + 1; // DEAD -> PENDING
            let b = &mut again.body;
            b.attempt_base = b.attempts;
            b.redrives += 1;
            (b.fired_at_ms, b.fire_index, b.finished_at_ms) = (0, 0, 0);
            self.count_pending(&key.namespace, 1)?;
            // Due now: it fires with the next Fire entry.
            let new_slot = self.move_row(&key.namespace, slot, again.clone(), now_ms)?;
            timers.push(self.view(&key.namespace, new_slot, &again)?);
        }
        Ok(Response::Redriven { timers, skipped })
    }
}

/// The attempt record of an ack or nack of `t`'s latest delivery: a consumer's, or the
/// pusher's ack of a 2xx (the channel is the lease's, read off the derived in-flight line).
fn consumer_record(t: &Timer, now_ms: i64, outcome: Outcome) -> AttemptRecord {
    let channel = t
        .attempt_log
        .last()
        .filter(|r| r.outcome == Outcome::InFlight && r.attempt == t.attempts)
        .map_or(Channel::Subscribe, |r| r.channel);
    AttemptRecord {
        at_ms: now_ms,
        attempt: t.attempts,
        channel,
        outcome,
        latency_ms: latency_ms(t.last_delivered_at_ms, now_ms),
        detail: String::new(),
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
/// Why an ack of `timer`'s delivery `attempt` would not simply ack it, as apply judges it (an
/// ACKED timer included: apply answers that unchanged); `None`: it acks the latest attempt of a
/// FIRED timer. The leader's queued Ack asks this of its applied state (`Node::ack`) and takes
/// the log's answer instead wherever it is anything but plainly good.
pub fn ack_refusal(timer: &Timer, attempt: u32) -> Option<String> {
    refuse_attempt(timer, attempt, "ack")
}

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
        TimerState::Expired => Some("is EXPIRED: it was too late to fire, never delivered".into()),
    }
}
