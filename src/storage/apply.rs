//! Applying one command: the deterministic heart of timerdb.
//!
//! Contract (what breaks if violated): given the same state and the same entry, every replica
//! must produce byte-identical writes. So nothing here reads a clock, a random number, or any
//! state but the database and the entry; iteration is in key order; a command that no longer
//! applies (cancel of a fired timer) yields a `Rejected` response, never a panic and never a
//! partial write. A storage error is returned and is fatal to the node: skipping an entry would
//! fork this replica from the others.
//!
//! Each entry's effects accumulate in one `WriteBatch`, which the state machine writes together
//! with `last_applied`, so a crash re-applies an entry wholly or not at all. In a `Multi` entry
//! timer reads go through the entry's staged writes first, so its commands see each other's
//! effects before the batch is written. Other entries skip that copy: each of their commands
//! handles keys it names twice itself.

use std::collections::HashMap;

use rocksdb::{Direction, IteratorMode, ReadOptions, WriteBatch, DB};

use super::meta::{pending_key, Progress};
use super::{cf, codec, CF_META, CF_NAMESPACES, CF_READY, CF_TIMERS, CF_WHEEL};
use crate::namespace::{Namespace, Policy};
use crate::timer::{
    Command, Phase, Rejection, Response, Timer, TimerKey, TimerSpec, TimerState, When,
};
use crate::wheel::{self, Wheel};
use crate::{Error, Result};

/// Applies commands for one log entry into `batch`.
pub(super) struct Applier<'a> {
    pub db: &'a DB,
    pub wheel: Wheel,
    pub batch: &'a mut WriteBatch,
    pub progress: &'a mut Progress,
    /// The entry's log index: a fired timer's `fire_index`.
    pub index: u64,
    /// The earliest due time this entry put on the wheel, to wake the fire driver.
    pub earliest_new_due: Option<i64>,
    /// Whether this entry made a timer READY, to wake the delivery dispatcher.
    pub made_ready: bool,
    /// Namespace policies read or written by this entry.
    pub policies: HashMap<String, Policy>,
    /// In a Multi entry, the timers written so far (`None`: deleted). Reads go here first, so
    /// its commands see each other's effects, though the batch is not yet written. `None` for
    /// other entries, which then pay no copy per write (a Fire entry writes up to 10,000).
    pub staged: Option<HashMap<TimerKey, Option<Timer>>>,
    /// Change in PENDING timers per namespace, written by [`Applier::stage_pending`].
    pub pending_by_ns: HashMap<String, i64>,
    /// Events for the metrics, recorded once the entry is written.
    pub events: crate::metrics::Events,
}

impl Applier<'_> {
    pub fn command(&mut self, cmd: Command) -> Result<Response> {
        match cmd {
            Command::Schedule { now_ms, spec } => self.schedule(now_ms, spec),
            Command::ScheduleBatch { now_ms, specs } => self.schedule_batch(now_ms, specs),
            Command::Cancel { now_ms, key } => self.cancel(now_ms, key),
            Command::Reschedule { now_ms, key, when } => self.reschedule(now_ms, key, when),
            Command::Fire { now_ms, max } => self.fire(now_ms, max),
            Command::PutNamespace { name, policy } => Ok(self.put_namespace(name, policy)),
            Command::Deliver { now_ms, keys } => self.deliver(now_ms, keys),
            Command::Ack {
                now_ms,
                key,
                attempt,
            } => self.ack(now_ms, key, attempt),
            Command::Nack {
                now_ms,
                key,
                attempt,
            } => self.nack(now_ms, key, attempt),
            Command::Redrive { now_ms, keys } => self.redrive(now_ms, keys),
            Command::Multi(cmds) => {
                self.staged.get_or_insert_with(HashMap::new);
                let mut out = Vec::with_capacity(cmds.len());
                for cmd in cmds {
                    if matches!(
                        cmd,
                        Command::Multi(_) | Command::Fire { .. } | Command::Deliver { .. }
                    ) {
                        return Err(Error::Internal(format!(
                            "{} inside a Multi entry",
                            cmd.name()
                        )));
                    }
                    out.push(self.command(cmd)?);
                }
                Ok(Response::Multi(out))
            }
        }
    }

    /// The policy of `namespace` as replicated (the default if never configured).
    pub(super) fn policy(&mut self, namespace: &str) -> Result<Policy> {
        if let Some(p) = self.policies.get(namespace) {
            return Ok(*p);
        }
        let raw = self
            .db
            .get_cf(cf(self.db, CF_NAMESPACES), namespace.as_bytes())?;
        let policy = match raw {
            Some(v) => codec::decode(&v)?,
            None => Policy::default(),
        };
        self.policies.insert(namespace.to_string(), policy);
        Ok(policy)
    }

    fn put_namespace(&mut self, name: String, policy: Policy) -> Response {
        self.policies.insert(name.clone(), policy);
        let key = name.as_bytes().to_vec();
        self.batch
            .put_cf(cf(self.db, CF_NAMESPACES), key, codec::encode(&policy));
        Response::Namespace(Namespace {
            name,
            policy,
            configured: true,
        })
    }

    pub(super) fn load(&self, key: &TimerKey) -> Result<Option<Timer>> {
        if let Some(staged) = self.staged.as_ref().and_then(|s| s.get(key)) {
            return Ok(staged.clone());
        }
        let raw = self
            .db
            .get_cf(cf(self.db, CF_TIMERS), wheel::timer_key(key))?;
        raw.map(|v| codec::decode(&v)).transpose()
    }

    pub(super) fn put(&mut self, timer: &Timer) {
        let key = wheel::timer_key(&timer.key);
        self.batch
            .put_cf(cf(self.db, CF_TIMERS), key, codec::encode(timer));
        if let Some(staged) = &mut self.staged {
            staged.insert(timer.key.clone(), Some(timer.clone()));
        }
    }

    /// Deletes a timer record (its wheel or ready entry is removed by the caller).
    pub(super) fn delete(&mut self, key: &TimerKey) {
        self.batch
            .delete_cf(cf(self.db, CF_TIMERS), wheel::timer_key(key));
        if let Some(staged) = &mut self.staged {
            staged.insert(key.clone(), None);
        }
    }

    /// Gives the timer its wheel entry, due at `at_ms` (its placement may be later: the floor).
    /// The caller has removed any previous entry with `unwake`.
    pub(super) fn wake(&mut self, timer: &mut Timer, at_ms: i64) {
        timer.wake_at_ms = at_ms;
        timer.bucket = self.wheel.placement(at_ms, self.progress.floor);
        let key = wheel::wheel_key(timer.bucket, &timer.key);
        self.batch.put_cf(cf(self.db, CF_WHEEL), key, []);
        let due = self.wheel.due_ms(timer.bucket);
        self.earliest_new_due = Some(self.earliest_new_due.map_or(due, |d| d.min(due)));
    }

    /// Removes the timer's wheel entry, or its ready-queue entry if it is READY.
    pub(super) fn unwake(&mut self, timer: &Timer) {
        if timer.on_wheel() {
            let key = wheel::wheel_key(timer.bucket, &timer.key);
            self.batch.delete_cf(cf(self.db, CF_WHEEL), key);
        } else {
            let key = wheel::ready_key(timer.fire_index, &timer.key);
            self.batch.delete_cf(cf(self.db, CF_READY), key);
        }
    }

    /// Puts a FIRED timer in its namespace's ready queue (it has no wheel entry then).
    pub(super) fn make_ready(&mut self, timer: &mut Timer) {
        timer.phase = Phase::Ready;
        let key = wheel::ready_key(timer.fire_index, &timer.key);
        self.batch.put_cf(cf(self.db, CF_READY), key, []);
        self.made_ready = true;
    }

    /// Ends a timer's life in `state` at `now_ms`; it is purged after the namespace's retention.
    pub(super) fn finish(
        &mut self,
        timer: &mut Timer,
        state: TimerState,
        now_ms: i64,
    ) -> Result<()> {
        let retention = self.policy(&timer.key.namespace)?.retention_ms;
        timer.state = state;
        timer.finished_at_ms = now_ms;
        let purge_at = now_ms.saturating_add(retention.min(i64::MAX as u64) as i64);
        self.wake(timer, purge_at);
        Ok(())
    }

    /// Counts a timer entering (+1) or leaving (-1) PENDING, in total and per namespace.
    pub(super) fn count_pending(&mut self, namespace: &str, delta: i64) {
        self.progress.pending = self.progress.pending.saturating_add_signed(delta);
        *self.pending_by_ns.entry(namespace.to_string()).or_default() += delta;
    }

    /// Writes this entry's per-namespace PENDING counts (`meta`, `pending/<namespace>`).
    pub fn stage_pending(&mut self) -> Result<()> {
        let meta = cf(self.db, CF_META);
        for (ns, delta) in std::mem::take(&mut self.pending_by_ns) {
            let key = pending_key(&ns);
            let now: u64 = match self.db.get_cf(meta, &key)? {
                Some(v) => codec::decode(&v)?,
                None => 0,
            };
            self.batch
                .put_cf(meta, key, codec::encode(&now.saturating_add_signed(delta)));
        }
        Ok(())
    }

    fn new_timer(&mut self, now_ms: i64, spec: TimerSpec) -> Timer {
        let mut timer = Timer::pending(spec, now_ms);
        self.count_pending(&timer.key.namespace, 1);
        self.events.scheduled();
        let at = timer.fire_at_ms;
        self.wake(&mut timer, at);
        self.put(&timer);
        timer
    }

    fn schedule(&mut self, now_ms: i64, spec: TimerSpec) -> Result<Response> {
        match self.load(&spec.key)? {
            Some(existing) if existing.same_request(&spec) => Ok(Response::Timer {
                timer: existing,
                created: false,
            }),
            Some(_) => Ok(Response::Rejected(Rejection::AlreadyExists(spec.key))),
            None => Ok(Response::Timer {
                timer: self.new_timer(now_ms, spec),
                created: true,
            }),
        }
    }

    /// All or none: any conflicting key rejects the whole batch before anything is staged.
    fn schedule_batch(&mut self, now_ms: i64, specs: Vec<TimerSpec>) -> Result<Response> {
        let mut existing: Vec<Option<Timer>> = Vec::with_capacity(specs.len());
        let mut first_in_batch: HashMap<&TimerKey, usize> = HashMap::new();
        for (i, spec) in specs.iter().enumerate() {
            if let Some(&j) = first_in_batch.get(&spec.key) {
                if specs[j] != *spec {
                    return Ok(Response::Rejected(Rejection::AlreadyExists(
                        spec.key.clone(),
                    )));
                }
                existing.push(None);
                continue;
            }
            first_in_batch.insert(&spec.key, i);
            let found = self.load(&spec.key)?;
            if found.as_ref().is_some_and(|t| !t.same_request(spec)) {
                return Ok(Response::Rejected(Rejection::AlreadyExists(
                    spec.key.clone(),
                )));
            }
            existing.push(found);
        }
        let positions: Vec<usize> = specs.iter().map(|s| first_in_batch[&s.key]).collect();
        let mut results: Vec<(Timer, bool)> = Vec::with_capacity(specs.len());
        for ((i, spec), found) in specs.into_iter().enumerate().zip(existing) {
            let result = match found {
                Some(t) => (t, false),
                None if positions[i] < i => (results[positions[i]].0.clone(), false),
                None => (self.new_timer(now_ms, spec), true),
            };
            results.push(result);
        }
        Ok(Response::Batch(results))
    }

    fn cancel(&mut self, now_ms: i64, key: TimerKey) -> Result<Response> {
        let Some(mut timer) = self.load(&key)? else {
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        match timer.state {
            TimerState::Pending => {
                self.unwake(&timer);
                self.count_pending(&timer.key.namespace, -1);
                self.finish(&mut timer, TimerState::Cancelled, now_ms)?;
                self.put(&timer);
                Ok(Response::Timer {
                    timer,
                    created: false,
                })
            }
            // A retried cancel: the timer is already what the client asked for.
            TimerState::Cancelled => Ok(Response::Timer {
                timer,
                created: false,
            }),
            state => Ok(Response::Rejected(Rejection::WrongState { key, state })),
        }
    }

    fn reschedule(&mut self, now_ms: i64, key: TimerKey, when: When) -> Result<Response> {
        let Some(mut timer) = self.load(&key)? else {
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        if timer.state != TimerState::Pending {
            let state = timer.state;
            return Ok(Response::Rejected(Rejection::WrongState { key, state }));
        }
        self.unwake(&timer);
        timer.fire_at_ms = when.resolve(now_ms);
        let at = timer.fire_at_ms;
        self.wake(&mut timer, at);
        self.put(&timer);
        Ok(Response::Timer {
            timer,
            created: false,
        })
    }

    /// Processes due wheel entries in wheel order, at most `max` (see `wake_up`). Moves the
    /// cursor and floor forward only.
    fn fire(&mut self, now_ms: i64, max: u32) -> Result<Response> {
        let now_bucket = self.wheel.bucket_of(now_ms);
        let due = self.due_keys(now_ms, now_bucket, max as usize)?;
        let count = due.len() as u32;
        let more = count >= max;
        for (bucket, key) in &due {
            let timer = self
                .load(key)?
                .ok_or_else(|| Error::Storage(format!("wheel holds {key} with no timer")))?;
            if !timer.on_wheel() || timer.bucket != *bucket {
                return Err(Error::Storage(format!(
                    "wheel entry {bucket} of {key} disagrees with the timer ({timer:?})"
                )));
            }
            self.wake_up(timer, now_ms)?;
        }
        let p = &mut *self.progress;
        p.cursor_ms = p.cursor_ms.max(now_ms);
        // Stopped short at `max`: timers may remain in the last fired bucket, so the floor may
        // only advance to it; otherwise everything due has fired up to `now`'s bucket.
        let new_floor = match (more, due.last()) {
            (true, Some((bucket, _))) => *bucket,
            _ => now_bucket,
        };
        p.floor = p.floor.max(new_floor);
        Ok(Response::Fired { count, more })
    }

    /// Wheel keys from the floor to `now_bucket` whose timers are due at `now_ms`, in key order.
    fn due_keys(&self, now_ms: i64, now_bucket: u64, max: usize) -> Result<Vec<(u64, TimerKey)>> {
        let start = wheel::bucket_start_key(self.progress.floor);
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(start.clone());
        opts.set_iterate_upper_bound(wheel::bucket_start_key(now_bucket.saturating_add(1)));
        let iter = self.db.iterator_cf_opt(
            cf(self.db, CF_WHEEL),
            opts,
            IteratorMode::From(&start, Direction::Forward),
        );
        let mut due = Vec::new();
        for item in iter {
            if due.len() >= max {
                break;
            }
            let (k, _) = item?;
            let (bucket, key) = wheel::decode_wheel_key(&k)
                .ok_or_else(|| Error::Storage("corrupt wheel key".into()))?;
            // Earlier buckets are wholly due; in `now`'s own bucket (wider than 1 ms) a timer
            // may still be in the future: never fire early.
            if bucket == now_bucket && !self.fire_at_reached(&key, now_ms)? {
                continue;
            }
            due.push((bucket, key));
        }
        Ok(due)
    }

    fn fire_at_reached(&self, key: &TimerKey, now_ms: i64) -> Result<bool> {
        Ok(self.load(key)?.is_some_and(|t| t.wake_at_ms <= now_ms))
    }
}
