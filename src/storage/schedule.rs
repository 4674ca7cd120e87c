//! Applying Schedule and ScheduleBatch: a new timer's row placed after the fire cursor and
//! its index entry, idempotent on (namespace, id) and content — a retried create answers the
//! stored timer with `created = false`, never a second timer. A batch is answered per spec
//! (`BatchAnswer`) without copying the timers it created.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::apply::Applier;
use super::{cf, CF_WHEEL};
use crate::command::{BatchAnswer, Command, Rejection, Response, Scheduled};
use crate::timer::{KeyRef, SpecRef, Specs, Timer, TimerSpec};
use crate::Result;

impl Applier<'_> {
    /// Places a new PENDING timer for `spec`. Its row is encoded from the spec where it lies;
    /// only an entry whose later commands may read it (`stage`) also keeps a `Row`.
    pub(super) fn create<'s>(&mut self, now_ms: i64, spec: impl Into<SpecRef<'s>>) -> Result<()> {
        self.create_with(now_ms, spec, None)
    }

    /// [`Applier::create`], the timer with its own misfire policy if `misfire` is set.
    pub(super) fn create_with<'s>(
        &mut self,
        now_ms: i64,
        spec: impl Into<SpecRef<'s>>,
        misfire: Option<crate::namespace::Misfire>,
    ) -> Result<()> {
        let spec = spec.into();
        let ns = spec.key.namespace;
        self.progress.pending += 1;
        self.progress.stored += 1;
        let meta = self.ns(ns)?;
        meta.pending += 1;
        meta.stored += 1;
        self.events.scheduled();
        if self.stage || misfire.is_some() {
            let mut row = super::row::pending(spec, now_ms);
            row.body.ext.misfire = misfire;
            self.place(ns, row, spec.when.resolve(now_ms))?;
        } else {
            let slot = self.next_slot(spec.when.resolve(now_ms))?;
            self.batch.put_cf(
                cf(self.db, CF_WHEEL),
                self.space.slot_key(ns, slot),
                super::row::encode_pending(spec, now_ms),
            );
            self.set_index(self.space.timer_key(ns, spec.key.id), Some(slot));
            self.placed_at(ns, slot);
        }
        Ok(())
    }

    /// The existing timer at `spec`'s key, if any, as a client sees it.
    pub(super) fn existing<'k>(&mut self, key: impl Into<KeyRef<'k>>) -> Result<Option<Timer>> {
        let key = key.into();
        match self.find(key)? {
            Some((slot, row)) => Ok(Some(self.view(key.namespace, slot, &row)?)),
            None => Ok(None),
        }
    }

    pub(super) fn schedule(&mut self, now_ms: i64, spec: &TimerSpec) -> Result<Response> {
        // A recurring timer's id is taken (as a Schedule with a mode and ScheduleRecurring also say).
        if self.recurring_row(&spec.key)?.is_some() {
            let key = spec.key.clone();
            return Ok(Response::Rejected(Rejection::AlreadyExists(key)));
        }
        match self.existing(&spec.key)? {
            Some(existing) if existing.same_request(spec.as_ref()) => Ok(Response::Timer {
                timer: existing,
                created: false,
            }),
            Some(_) => Ok(Response::Rejected(Rejection::AlreadyExists(
                spec.key.clone(),
            ))),
            None => {
                self.create(now_ms, spec)?;
                Ok(Response::Timer {
                    timer: Timer::pending(spec.clone(), now_ms),
                    created: true,
                })
            }
        }
    }

    /// All or none: any conflicting key rejects the whole batch before anything is staged.
    /// The answer shares `entry` (the command the specs lie in, at `at` if a Multi's) rather
    /// than copying each new timer into it: see [`BatchAnswer`].
    pub(super) fn schedule_batch(
        &mut self,
        now_ms: i64,
        specs: &Specs,
        entry: &Arc<Command>,
        at: Option<usize>,
    ) -> Result<Response> {
        if let Some(key) = self.recurring_among(specs)? {
            return Ok(Response::Rejected(Rejection::AlreadyExists(key)));
        }
        self.prefetch_index(specs.iter().map(|s| s.key))?;
        let mut items: Vec<Scheduled> = Vec::with_capacity(specs.len());
        let mut first_in_batch: HashMap<KeyRef<'_>, usize> = HashMap::default();
        for (i, spec) in specs.iter().enumerate() {
            if let Some(&j) = first_in_batch.get(&spec.key) {
                if specs.get(j) != Some(spec) {
                    return Ok(Response::Rejected(Rejection::AlreadyExists(
                        spec.key.to_owned(),
                    )));
                }
                items.push(Scheduled::SameAs(j));
                continue;
            }
            first_in_batch.insert(spec.key, i);
            match self.existing(spec.key)? {
                Some(t) if !t.same_request(spec) => {
                    return Ok(Response::Rejected(Rejection::AlreadyExists(
                        spec.key.to_owned(),
                    )))
                }
                Some(t) => items.push(Scheduled::Existing(Box::new(t))),
                None => items.push(Scheduled::Created),
            }
        }
        for (spec, item) in specs.iter().zip(&items) {
            if matches!(item, Scheduled::Created) {
                self.create(now_ms, spec)?;
            }
        }
        Ok(Response::Batch(BatchAnswer {
            command: entry.clone(),
            at,
            items,
        }))
    }
}
