//! Applying a Fire entry: the fire cursor passes every row due, expired leases give their
//! unacked timers back, and subscribers with room get leases, all in one entry.
//!
//! Firing writes no timer. The cursor moves over the due rows of every namespace whose head
//! (first row after the cursor) it reaches, in slot order across namespaces and hash slots (a
//! merge of one iterator per namespace), at most `max` rows per entry; a `Pending` row it
//! passes has fired, with this entry's index as its fire index, recorded once per hash slot
//! whose rows it passed, in `fires` at the new cursor. Apply reads each passed row's header (kind and fire time) to count
//! PENDING per namespace and the lateness metric; that is all it reads.
//!
//! Order inside the entry, which keeps scans and writes apart: the cursor moves first; expired
//! leases then move their unacked rows *after the new cursor* (retry or dead); grants last
//! read rows between a namespace's delivery cursor and the fire cursor, which nothing in this
//! entry wrote.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use rocksdb::{DBRawIterator, ReadOptions};

use super::apply::Applier;
use super::read::slot_of_key;
use super::row::{header, latency_ms, materialize, own_misfire, Kind, Row, Settled};
use super::{cf, codec, CF_DEADLINES, CF_FIRES};
use crate::command::{Grant, Response};
use crate::keys::{self, HSlot, Home};
use crate::timer::{log_attempt, AttemptRecord, Channel, Outcome, Timer};
use crate::wheel::Slot;
use crate::{Error, Result};

impl Applier<'_> {
    pub(super) fn fire(&mut self, now_ms: i64, max: u32, grants: Vec<Grant>) -> Result<Response> {
        let max = max.max(1) as usize;
        self.progress.cursor_ms = self.progress.cursor_ms.max(now_ms);
        let (count, more_rows) = self.advance_cursor(now_ms, max)?;
        // Timers it passed too late for their misfire policy are not fired (`misfire.rs`).
        let count = count - self.misfires(now_ms)?;
        // Recurring timers' occurrences it passed: the next ones are placed (`recurring.rs`).
        let count = count - self.fire_recurring(now_ms)?;
        let more_leases = self.expire_leases(now_ms, max)?;
        let rewrote = std::mem::take(&mut self.rewrote_fired);
        let mut leases = Vec::with_capacity(grants.len());
        for g in &grants {
            if rewrote.contains(&g.namespace) {
                leases.push(None); // see `recurring.rs`: the next entry grants
                continue;
            }
            leases.push(self.grant(now_ms, &g.namespace, g.room, g.push)?);
        }
        // Namespaces the cursor passed rows of and nobody was granted: let the delivery
        // cursor pass finished rows, so that they can be purged though nobody consumes the
        // namespace. Only those whose rows it passed: which namespaces the heads cache named
        // is node-local (a head may be early), and must not decide a write (DESIGN 8).
        let passed = match crate::sim::planted("heads-pass") {
            true => self.visited.clone(),
            false => std::mem::take(&mut self.passed),
        };
        for ns in passed {
            if !grants.iter().any(|g| g.namespace == ns) && !rewrote.contains(&ns) {
                self.grant(now_ms, &ns, 0, false)?;
            }
        }
        Ok(Response::Fired {
            count,
            more: more_rows || more_leases,
            leases,
        })
    }

    /// Moves the cursor over the rows due at `now_ms`, at most `max`; returns how many timers
    /// fired and whether due rows remain. Each hash slot whose rows it passed gets a fire
    /// record at the new cursor (`G H new`): what `derive` reads for a row of it behind the
    /// cursor, the first record of its hash slot at or after the row.
    fn advance_cursor(&mut self, now_ms: i64, max: usize) -> Result<(u32, bool)> {
        let old = self.progress.cursor;
        let Some(bucket) = self.wheel.last_due_bucket(now_ms) else {
            return Ok((0, false));
        };
        let end = Slot::end_of(bucket);
        if end <= old {
            // Nothing to pass (the cursor is at or past this time: a leader whose clock ran
            // ahead moved it). A head at or before the cursor is early (a head is the first row
            // after it): read those again after this entry, or the fire driver sees them due
            // and proposes empty Fire entries until its clock passes the cursor.
            self.visited = self
                .heads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .due(old);
            return Ok((0, false));
        }
        let namespaces = self
            .heads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .due(end);
        let reader = self.reader();
        let mut iters: Vec<DBRawIterator> = namespaces
            .iter()
            .map(|ns| reader.rows_between(ns, old, end))
            .collect();
        let mut heap = BinaryHeap::new();
        for (i, it) in iters.iter().enumerate() {
            if let Some(k) = it.key() {
                heap.push(Reverse((slot_of_key(k)?, i)));
            }
        }
        // Each namespace's misfire policy (a row may carry its own: its kind byte says so).
        let mut misfires = Vec::with_capacity(namespaces.len());
        for ns in &namespaces {
            misfires.push(self.policy(ns)?.misfire);
        }
        let (mut scanned, mut fired) = (0, 0u32);
        let mut pending_by_ns: BTreeMap<usize, i64> = BTreeMap::new();
        // The namespaces whose rows the cursor passed (indexes into `namespaces`).
        let mut passed = vec![false; namespaces.len()];
        let (mut last, mut more) = (old, false);
        while let Some(Reverse((slot, i))) = heap.pop() {
            if scanned == max {
                more = true;
                break;
            }
            let it = &mut iters[i];
            let value = it.value().expect("positioned");
            let (kind, fire_at_ms) = header(value)?;
            match kind {
                Kind::Pending => {
                    // Late from when its slot came due: a timer scheduled in the past ("fire
                    // now") or redriven is due when it was placed, not at its fire_at.
                    let late = now_ms - self.wheel.due_ms(slot.bucket);
                    let misfire = if own_misfire(value) {
                        Row::decode(value)?.body.ext.misfire.unwrap_or_default()
                    } else {
                        misfires[i]
                    };
                    if misfire.applies(late) {
                        self.late.push((i, slot, misfire));
                    }
                    fired += 1;
                    *pending_by_ns.entry(i).or_default() -= 1;
                    self.events.fired(now_ms - fire_at_ms);
                    self.made_ready = true;
                }
                Kind::Retry => self.made_ready = true,
                _ => {}
            }
            scanned += 1;
            passed[i] = true;
            last = slot;
            it.next();
            if let Some(k) = it.key() {
                heap.push(Reverse((slot_of_key(k)?, i)));
            }
        }
        for it in &iters {
            it.status()?;
        }
        drop(iters);
        drop(reader);
        let new = if more { last } else { end };
        for (i, delta) in pending_by_ns {
            self.count_pending(&namespaces[i], delta)?;
        }
        self.progress.cursor = new;
        // One record per hash slot it passed rows of (which rows it passed is replicated
        // state; which namespaces the cache named is not), in hash-slot order.
        let hslots: BTreeSet<HSlot> = (namespaces.iter().zip(&passed))
            .filter(|(_, p)| **p)
            .map(|(ns, _)| self.space.home(ns).hslot)
            .collect();
        for hslot in hslots {
            let home = Home {
                group: self.space.group,
                hslot,
            };
            self.batch.put_cf(
                cf(self.db, CF_FIRES),
                keys::hslot_slot_key(home, new),
                codec::encode(&(self.fire_token(), now_ms)),
            );
        }
        self.fired = Some((old, new, now_ms));
        // By name: the order of `namespaces` is the cache's (earliest head first).
        self.passed = (namespaces.iter().zip(&passed))
            .filter(|(_, p)| **p)
            .map(|(ns, _)| ns.clone())
            .collect();
        self.passed.sort();
        self.visited = namespaces;
        Ok((fired, more))
    }

    /// Expires leases whose deadline is at or before `now_ms`, whole leases until about `max`
    /// rows were moved; returns whether expired leases remain.
    fn expire_leases(&mut self, now_ms: i64, max: usize) -> Result<bool> {
        let mut opts = ReadOptions::default();
        let past = (now_ms.max(0) as u64).saturating_add(1);
        opts.set_iterate_upper_bound(self.space.deadline_bound(past));
        // From the floor, not the start: below it lie only tombstones (`floor.rs`).
        opts.set_iterate_lower_bound(self.space.deadline_bound(self.deadline_floor));
        let mut iter = self.db.raw_iterator_cf_opt(cf(self.db, CF_DEADLINES), opts);
        iter.seek_to_first();
        let mut due = Vec::new();
        while let Some(k) = iter.key() {
            let parsed = keys::decode_deadline_key(k)
                .ok_or_else(|| Error::Storage("corrupt deadline key".into()))?;
            due.push(parsed);
            iter.next();
        }
        iter.status()?;
        drop(iter);
        // In format 5's order: by deadline, then the lease's key without its hash slot (the
        // order of `crate::keys::timer_name`: the namespace's length, its bytes, the end).
        // Which leases `max` lets expire, and the slots their rows move to, follow it.
        due.sort_by(|(a_ms, a_ns, a_to), (b_ms, b_ns, b_to)| {
            (a_ms, a_ns.len(), a_ns.as_bytes(), a_to).cmp(&(
                b_ms,
                b_ns.len(),
                b_ns.as_bytes(),
                b_to,
            ))
        });
        let mut moved = 0;
        let mut expired = due.len();
        for (i, (_, ns, to)) in due.iter().enumerate() {
            if moved >= max {
                expired = i;
                break;
            }
            moved += self.expire_lease(now_ms, ns, *to)?;
        }
        // Once this entry is written, no deadline it did not write lies below the first one
        // left at or before `now_ms`, or, with none left, below `now_ms + 1` (`floor.rs`).
        // (Never below the floor it scanned from, which held too: a Fire whose `now_ms` lags
        // it would otherwise lower it for nothing.)
        let proved = due
            .get(expired)
            .map_or(past, |(at, _, _)| (*at).max(0) as u64);
        let proved = proved.max(self.deadline_floor);
        self.deadlines_proved = Some(self.deadlines_proved.map_or(proved, |p| p.min(proved)));
        Ok(expired < due.len())
    }

    /// The deadline of `namespace`'s lease ending at `to` passed: every row still in flight
    /// under it is given back (retry or dead), and the lease is settled. Returns the rows moved.
    fn expire_lease(&mut self, now_ms: i64, namespace: &str, to: Slot) -> Result<usize> {
        let Some(mut lease) = self.lease(namespace, to)? else {
            return Err(Error::Storage(format!(
                "deadline of a lease {namespace}/{to} that does not exist"
            )));
        };
        let deadline = self.space.deadline_key(lease.deadline_ms, namespace, to);
        self.batch.delete_cf(cf(self.db, CF_DEADLINES), deadline);
        if lease.settled.is_some() {
            return Ok(0);
        }
        let mut in_flight = Vec::new();
        let reader = self.reader();
        let mut iter = reader.rows_between(namespace, lease.from, to);
        while let (Some(k), Some(v)) = (iter.key(), iter.value()) {
            if header(v)?.0.deliverable() {
                in_flight.push((slot_of_key(k)?, Row::decode(v)?));
            }
            iter.next();
        }
        iter.status()?;
        drop(iter);
        drop(reader);
        let moved = in_flight.len();
        for (slot, row) in in_flight {
            let mut t = self.view(namespace, slot, &row)?;
            t.timeouts += 1;
            let record = AttemptRecord {
                at_ms: now_ms,
                attempt: t.attempts,
                channel: if lease.push {
                    Channel::Push
                } else {
                    Channel::Subscribe
                },
                outcome: Outcome::Expired,
                latency_ms: latency_ms(lease.delivered_at_ms, now_ms),
                detail: String::new(),
            };
            record_attempt(&mut t, record);
            self.give_back(namespace, slot, t, now_ms, (false, 0))?;
        }
        lease.settled = Some(Settled {
            at_ms: now_ms,
            acked: false,
        });
        self.put_lease(namespace, to, lease);
        Ok(moved)
    }

    /// The latest delivery of `t` (in flight at `slot`) failed, by its deadline or a nack: the
    /// timer is DEAD at the attempt limit (or at once with `dead`), else delivered again after
    /// the backoff (or after `retry_after_ms`, a receiver's Retry-After, if that is longer).
    pub(super) fn give_back(
        &mut self,
        namespace: &str,
        slot: Slot,
        t: Timer,
        now_ms: i64,
        (dead, retry_after_ms): (bool, u64),
    ) -> Result<()> {
        let policy = self.policy(namespace)?;
        let made = t.attempts - t.attempt_base;
        if dead || made >= policy.max_attempts {
            let mut row = materialize(&t, Kind::Dead);
            row.body.finished_at_ms = now_ms;
            self.move_row(namespace, slot, row, now_ms)?;
        } else {
            // The backoff, or the receiver's Retry-After if it asked for longer.
            let wait = policy
                .backoff_ms(made, t.fire_index)
                .max(retry_after_ms.min(crate::timer::MAX_RETRY_AFTER_MS));
            let now_ms = match crate::sim::planted("apply-reads-clock") {
                true => crate::clock::Clock::system().now_ms(),
                false => now_ms,
            };
            let at = now_ms.saturating_add(wait as i64);
            let mut row = materialize(&t, Kind::Retry);
            row.body.wake_at_ms = at;
            if crate::sim::planted("retry-refires") {
                row.body.fire_index = 0;
            }
            self.move_row(namespace, slot, row, at)?;
        }
        Ok(())
    }
}

/// Adds `record` to `t`'s attempt log in place of the derived in-flight line.
pub(super) fn record_attempt(t: &mut Timer, record: AttemptRecord) {
    t.attempt_log.retain(|r| r.outcome != Outcome::InFlight);
    log_attempt(&mut t.attempt_log, record);
}
