//! Recurring timers in the state machine: the `series` rows, their materialised occurrence,
//! and what a Fire entry does when its cursor passes one (docs/recurrence.md).
//!
//! A series' next occurrence is an ordinary PENDING row on the wheel, placed by apply; its slot
//! is also a key of `series_due` naming the series. A Fire entry moves the cursor first (which
//! fires the occurrence like any row), then reads `series_due` over the range it passed and,
//! per occurrence, asks [`recurring::plan`] what became of it and what comes next: the next
//! occurrence is placed in the same write batch, so it is committed state as soon as the
//! previous one fired. An occurrence the policies drop (overlap `skip`, misfire `skip`) is
//! deleted, one that `buffer_one` holds back is moved after the cursor: both rewrite a row the
//! cursor just passed, so that namespace gets no grant in this entry (grants read the database
//! as it was before the entry; the next Fire or Deliver sees the rewrite).
//!
//! Every step reads only the entry and the database, so every replica computes the same
//! occurrences; the zone rules come from the binary and a series checks they are the ones it
//! was computed with (`Series::rule`), a storage error (fatal to the node) otherwise.

use super::apply::Applier;
use super::read::Reader;
use super::row::{self, Kind};
use super::store::{Snap, Store};
use super::{cf, codec, prefix_end, CF_RECURRING, CF_RECURRING_DUE};
use crate::command::{Cond, Rejection, Response};
use crate::keys;
use crate::recurring::{
    self, Decision, Next, RecurringSpec, RecurringTimer, RecurringView, Status,
};
use crate::timer::{KeyRef, Specs, TimerKey, TimerSpec, TimerState, When};
use crate::wheel::Slot;
use crate::{Error, Result};

/// Upcoming occurrence times an answer of apply carries (Get may ask for more).
const UPCOMING_IN_ANSWERS: usize = 5;

impl Applier<'_> {
    /// The series at `key` as this entry has it.
    pub(super) fn recurring_row<'k>(
        &mut self,
        key: impl Into<KeyRef<'k>>,
    ) -> Result<Option<RecurringTimer>> {
        let k = key.into().index_key(self.space);
        if let Some(staged) = self.recurring_staged.get(&k) {
            return Ok(staged.clone());
        }
        let raw = self.db.get_cf(cf(self.db, CF_RECURRING), &k)?;
        raw.map(|v| codec::decode(&v)).transpose()
    }

    /// The first of `specs`' ids that names a recurring timer (a one-shot cannot take it).
    /// A namespace without series (one seek finds none) costs no read per timer.
    pub(super) fn recurring_among(&mut self, specs: &Specs) -> Result<Option<TimerKey>> {
        let mut namespaces: Vec<&str> = specs.iter().map(|s| s.key.namespace).collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let reader = Reader::live(self.db, self.space);
        for ns in namespaces {
            let prefix = self.space.namespace_prefix(ns);
            let staged = self.recurring_staged.keys().any(|k| k.starts_with(&prefix));
            let stored = {
                let iter = reader.iter(CF_RECURRING, prefix.clone(), Some(prefix_end(&prefix)));
                iter.status()?;
                iter.valid()
            };
            if !staged && !stored {
                continue;
            }
            for spec in specs.iter().filter(|s| s.key.namespace == ns) {
                if self.recurring_row(spec.key)?.is_some() {
                    return Ok(Some(spec.key.to_owned()));
                }
            }
        }
        Ok(None)
    }

    /// The rule of `s`, read with rules this replica may compute it with (docs/recurrence.md,
    /// "Replicas must agree on the time-zone database"), for a series in a time zone:
    /// - the entry names this build's tzdb version (its proposer runs it): this build's rules,
    ///   and the row is stamped with them — every replica of that version does the same, so a
    ///   cluster that finished an upgrade moves its rows to the new rules;
    /// - it names another version: only a row stamped with that version whose fingerprint for
    ///   the zone is this build's (the proposer's rules are then this build's);
    /// - it names none (an older leader's entry, a client's bare PauseRecurring): only a row whose
    ///   fingerprint is this build's.
    ///
    /// Otherwise an error: the replica stops rather than compute another next time than the
    /// others (an upgraded replica takes the entry up again where it stopped).
    fn rule_of(&self, s: &mut RecurringTimer) -> Result<crate::recurring::rule::Rule> {
        if matches!(s.spec.recurrence.rule, recurring::RuleSpec::Cron { .. }) {
            let own = recurring::tzdb_version();
            match self.zone_tzdb.as_deref() {
                Some(named) if named == own => {
                    s.tzdb = own.to_string();
                    s.zone_fp = s.spec.recurrence.zone_fingerprint();
                }
                Some(named) if s.tzdb != named => {
                    return Err(Error::Storage(format!(
                        "series {} was computed with tzdb {:?} and this entry's proposer runs tzdb \
                         {named}, this build {own}: upgrade this node to the proposer's build \
                         (docs/recurrence.md)",
                        s.spec.key, s.tzdb
                    )));
                }
                _ => {}
            }
        }
        s.rule()
    }

    /// A new series for `spec`, stamped with the tzdb version its command names (a
    /// `ZoneRules` command: the proposer's) or, for a bare command (an older build's, or one
    /// proposed while a member is older), this build's — as builds before `ZoneRules` did,
    /// so the older form keeps its effect on every build (replicas of two tzdb versions write
    /// different rows for it: docs/guarantees.md).
    fn new_recurring(&self, spec: &RecurringSpec, now_ms: i64) -> RecurringTimer {
        let mut s = RecurringTimer::new(spec.clone(), now_ms);
        if let Some(tzdb) = &self.zone_tzdb {
            s.tzdb = tzdb.clone();
        }
        s
    }

    fn put_recurring(&mut self, s: &RecurringTimer) {
        let k = s.spec.key.index_key(self.space);
        self.batch
            .put_cf(cf(self.db, CF_RECURRING), &k, codec::encode(s));
        self.recurring_staged.insert(k, Some(s.clone()));
    }

    fn answer(s: &RecurringTimer, created: bool) -> Response {
        let view = RecurringView {
            recurring: s.clone(),
            upcoming_ms: recurring::upcoming(s, UPCOMING_IN_ANSWERS),
            recent: Vec::new(),
        };
        Response::Recurring {
            recurring: Box::new(view),
            created,
        }
    }

    /// Places the occurrence at `nominal_ms` (PENDING, due at its jittered time) and records
    /// it as the series' next; an id already taken (by an occurrence kept from before a
    /// resume) moves on to the following occurrence. No occurrence left: the series ended.
    fn materialize(
        &mut self,
        s: &mut RecurringTimer,
        first: Option<i64>,
        now_ms: i64,
    ) -> Result<()> {
        let rule = self.rule_of(s)?;
        let mut at = first;
        while let Some(nominal_ms) = at {
            let key = s.occurrence_key(nominal_ms);
            if self.find(&key)?.is_some() {
                at = s.following(&rule, nominal_ms);
                continue;
            }
            let fire_at_ms = s.fire_time(nominal_ms);
            let spec = TimerSpec {
                key,
                when: When::At(fire_at_ms),
                payload: s.spec.payload.clone(),
                content_type: s.spec.content_type.clone(),
            };
            let ns = spec.key.namespace.clone();
            let slot = self.place(&ns, row::pending(spec.as_ref(), now_ms), fire_at_ms)?;
            self.count_pending(&ns, 1)?;
            self.count_stored(&ns, 1)?;
            self.events.scheduled();
            self.batch.put_cf(
                cf(self.db, CF_RECURRING_DUE),
                keys::series_due_key(self.space.home(&ns), slot),
                s.spec.key.name_bytes(),
            );
            s.next = Some(Next {
                nominal_ms,
                fire_at_ms,
                slot,
            });
            return Ok(());
        }
        s.next = None;
        s.status = Status::Ended;
        s.finished_at_ms = now_ms;
        Ok(())
    }

    /// Removes the series' pending occurrence (a pause or a delete), if it is still PENDING.
    fn unmaterialize(&mut self, s: &mut RecurringTimer) -> Result<()> {
        let Some(next) = s.next.take() else {
            return Ok(());
        };
        let home = self.space.home(&s.spec.key.namespace);
        self.batch.delete_cf(
            cf(self.db, CF_RECURRING_DUE),
            keys::series_due_key(home, next.slot),
        );
        let key = s.occurrence_key(next.nominal_ms);
        if let Some((slot, row)) = self.find(&key)? {
            if self.view(&key.namespace, slot, &row)?.state == TimerState::Pending {
                self.delete_row(&key.namespace, slot);
                self.set_index(key.index_key(self.space), None);
                self.count_pending(&key.namespace, -1)?;
                self.count_stored(&key.namespace, -1)?;
            }
        }
        Ok(())
    }

    pub(super) fn schedule_recurring(
        &mut self,
        now_ms: i64,
        spec: &RecurringSpec,
    ) -> Result<Response> {
        if self.find(&spec.key)?.is_some() {
            return Ok(Response::Rejected(Rejection::AlreadyExists(
                spec.key.clone(),
            )));
        }
        if let Some(existing) = self.recurring_row(&spec.key)? {
            // A cancelled series' tombstone answers retried cancels; its id is not reusable.
            if existing.status != Status::Cancelled && existing.same_request(spec) {
                return Ok(Self::answer(&existing, false));
            }
            return Ok(Response::Rejected(Rejection::AlreadyExists(
                spec.key.clone(),
            )));
        }
        let mut s = self.new_recurring(spec, now_ms);
        let rule = match s.rule() {
            Ok(rule) => rule,
            Err(e) => {
                return Ok(Response::Rejected(Rejection::Refused {
                    key: spec.key.clone(),
                    why: format!("has a recurrence this node cannot compute: {e}"),
                }))
            }
        };
        let first = s.following(&rule, now_ms);
        self.materialize(&mut s, first, now_ms)?;
        self.put_recurring(&s);
        Ok(Self::answer(&s, true))
    }

    pub(super) fn pause_recurring(
        &mut self,
        now_ms: i64,
        key: TimerKey,
        paused: bool,
    ) -> Result<Response> {
        let Some(mut s) = self.recurring_row(&key)? else {
            if self.find(&key)?.is_some() {
                let why = "is a one-shot timer: only recurring timers can be paused".to_string();
                return Ok(Response::Rejected(Rejection::Refused { key, why }));
            }
            return Ok(Response::Rejected(Rejection::NotFound(key)));
        };
        match (s.status, paused) {
            (Status::Active, true) => {
                self.unmaterialize(&mut s)?;
                s.status = Status::Paused;
                s.revision += 1;
            }
            (Status::Paused, false) => {
                s.status = Status::Active;
                s.revision += 1;
                let rule = self.rule_of(&mut s)?;
                let first = s.following(&rule, now_ms);
                self.materialize(&mut s, first, now_ms)?;
            }
            (Status::Active, false) | (Status::Paused, true) => {}
            (status, _) => {
                let why = format!("is a recurring timer that is {}", status.name());
                return Ok(Response::Rejected(Rejection::Refused { key, why }));
            }
        }
        self.put_recurring(&s);
        Ok(Self::answer(&s, false))
    }

    /// Cancel of a key that names no timer: deletes the series there, if one does (with its
    /// pending occurrence), if `cond` holds. `None`: there is none.
    pub(super) fn cancel_recurring(
        &mut self,
        now_ms: i64,
        key: &TimerKey,
        cond: Cond,
    ) -> Result<Option<Response>> {
        let Some(mut s) = self.recurring_row(key)? else {
            return Ok(None);
        };
        if let Some(why) = cond.refuses(s.status.timer_state(), s.revision) {
            let key = key.clone();
            return Ok(Some(Response::Rejected(Rejection::Condition { key, why })));
        }
        if s.status != Status::Cancelled {
            self.unmaterialize(&mut s)?;
            s.status = Status::Cancelled;
            s.finished_at_ms = now_ms;
            s.revision += 1;
            self.put_recurring(&s);
        }
        Ok(Some(Self::answer(&s, false)))
    }

    /// Schedule(upsert) with a recurrence: creates the series, or gives an existing one (not
    /// cancelled) its new rule, payload and policies, keeping its counters and history; its
    /// pending occurrence is replaced by the first of the new rule after `now_ms` (a paused
    /// series stays paused).
    pub(super) fn upsert_recurring(
        &mut self,
        now_ms: i64,
        spec: &RecurringSpec,
        cond: Cond,
    ) -> Result<Response> {
        let key = spec.key.clone();
        let existing = self.recurring_row(&key)?;
        let Some(mut s) = existing.filter(|s| s.status != Status::Cancelled) else {
            if cond.is_set() {
                return Ok(Response::Rejected(Rejection::NotFound(key)));
            }
            return self.schedule_recurring(now_ms, spec);
        };
        if let Some(why) = cond.refuses(s.status.timer_state(), s.revision) {
            return Ok(Response::Rejected(Rejection::Condition { key, why }));
        }
        if s.same_request(spec) {
            return Ok(Self::answer(&s, false));
        }
        let fresh = self.new_recurring(spec, now_ms);
        if let Err(e) = fresh.rule() {
            let why = format!("has a recurrence this node cannot compute: {e}");
            return Ok(Response::Rejected(Rejection::Refused { key, why }));
        }
        self.unmaterialize(&mut s)?;
        (s.spec, s.tzdb, s.zone_fp) = (fresh.spec, fresh.tzdb, fresh.zone_fp);
        s.created_at_ms = now_ms; // the new rule's default anchor
        s.revision += 1;
        if s.status == Status::Ended {
            s.status = Status::Active;
        }
        if s.status == Status::Active {
            let rule = self.rule_of(&mut s)?;
            let first = s.following(&rule, now_ms);
            self.materialize(&mut s, first, now_ms)?;
        }
        self.put_recurring(&s);
        Ok(Self::answer(&s, false))
    }

    /// Reschedule of an occurrence or of a series: refused, with what to do instead.
    pub(super) fn reschedule_refused(&mut self, key: &TimerKey) -> Result<Option<Rejection>> {
        let why = if self.recurring_row(key)?.is_some() {
            "is a recurring timer: its times come from its rule (pause it, or cancel and \
             schedule it again)"
        } else {
            match recurring::parse_occurrence(&key.id) {
                Some((id, _))
                    if self
                        .recurring_row(&TimerKey::new(key.namespace.clone(), id))?
                        .is_some() =>
                {
                    "is an occurrence of a recurring timer: cancel it to skip it, or pause the \
                     recurring"
                }
                _ => return Ok(None),
            }
        };
        Ok(Some(Rejection::Refused {
            key: key.clone(),
            why: why.into(),
        }))
    }

    /// The series occurrences this entry's cursor passed (see the module essay). Returns how
    /// many of the rows the cursor counted as fired did not fire after all.
    pub(super) fn fire_recurring(&mut self, now_ms: i64) -> Result<u32> {
        let Some((old, new, _)) = self.fired else {
            return Ok(0);
        };
        // Every hash slot's occurrences in (old, new], in slot order: one scan, as format 5's
        // (a cancelled occurrence leaves its entry where no row is; the cursor passing it
        // still moves the series on, whichever rows this entry passed).
        let lower = self.space.series_due_after(old);
        let upper = self.space.series_due_after(new);
        let reader = Reader::live(self.db, self.space);
        let mut iter = reader.iter(CF_RECURRING_DUE, lower, Some(upper));
        let mut due = Vec::new();
        while let (Some(k), Some(v)) = (iter.key(), iter.value()) {
            let (home, slot) = keys::decode_series_due_key(k)
                .ok_or_else(|| Error::Storage("corrupt series_due".into()))?;
            let key = TimerKey::from_name_bytes(v)
                .ok_or_else(|| Error::Storage("corrupt series_due value".into()))?;
            due.push((slot, home, key));
            iter.next();
        }
        iter.status()?;
        drop(iter);
        drop(reader);
        let mut unfired = 0;
        for (slot, home, key) in due {
            self.batch.delete_cf(
                cf(self.db, CF_RECURRING_DUE),
                keys::series_due_key(home, slot),
            );
            unfired += self.occurrence_due(now_ms, slot, &key)?;
        }
        Ok(unfired)
    }

    /// The cursor passed the occurrence of series `key` placed at `slot`.
    fn occurrence_due(&mut self, now_ms: i64, slot: Slot, key: &TimerKey) -> Result<u32> {
        let Some(mut s) = self.recurring_row(key)? else {
            return Ok(0);
        };
        let Some(due) = s
            .next
            .filter(|n| n.slot == slot && s.status == Status::Active)
        else {
            return Ok(0); // paused or deleted since (its occurrence went with it)
        };
        let ns = key.namespace.clone();
        let occ = s.occurrence_key(due.nominal_ms);
        let row = match self.find(&occ)? {
            Some((at, row)) if at == slot && row.kind == Kind::Pending => Some(row),
            _ => None, // cancelled by a client before it was due
        };
        let (previous, previous_wake) = match s.last_fired {
            Some(n) => match self.find(&s.occurrence_key(n))? {
                Some((at, r)) => {
                    let t = self.view(&ns, at, &r)?;
                    (Some(t.state), t.wake_at_ms)
                }
                None => (None, 0),
            },
            None => (None, 0),
        };
        let rule = self.rule_of(&mut s)?;
        let decision = recurring::plan(
            &mut s,
            &rule,
            due,
            now_ms,
            row.is_none(),
            previous,
            previous_wake,
        );
        let mut unfired = 0;
        let next = match decision {
            Decision::Hold { until_ms } => {
                let row = row.expect("only a fired occurrence is held");
                self.events.unfired(now_ms - row.fire_at_ms);
                let at = self.move_row(&ns, slot, row, until_ms)?;
                self.count_pending(&ns, 1)?;
                self.batch.put_cf(
                    cf(self.db, CF_RECURRING_DUE),
                    keys::series_due_key(self.space.home(&ns), at),
                    key.name_bytes(),
                );
                s.next = Some(Next { slot: at, ..due });
                self.rewrote_fired.push(ns);
                self.put_recurring(&s);
                return Ok(1);
            }
            Decision::Drop { next, .. } => {
                if let Some(row) = &row {
                    self.events.unfired(now_ms - row.fire_at_ms);
                    self.delete_row(&ns, slot);
                    self.set_index(occ.index_key(self.space), None);
                    self.count_stored(&ns, -1)?;
                    self.rewrote_fired.push(ns);
                    unfired = 1;
                }
                next
            }
            Decision::Done { next, .. } => next,
        };
        s.next = None;
        self.materialize(&mut s, next, now_ms)?;
        self.put_recurring(&s);
        Ok(unfired)
    }
}

impl Applier<'_> {
    /// A series command as its proposer computed it: refused (the node stops, it does not
    /// diverge) if this build's rules for the zone are not the proposer's, else applied with
    /// the proposer's tzdb version on the rows it writes.
    pub(super) fn with_zone_rules(
        &mut self,
        tzdb: String,
        zone_fp: u64,
        change: crate::command::RecurringChange,
    ) -> Result<Response> {
        // A pause or resume names no spec: the stored row's stamp is checked where its rule
        // is read (`Applier::rule_of`).
        if let Some(spec) = change.spec() {
            if spec.recurrence.zone_fingerprint() != zone_fp {
                return Err(Error::Storage(format!(
                    "series {} was proposed with other rules for its zone (tzdb {tzdb}) than \
                     this build's (tzdb {}): upgrade every node to one build \
                     (docs/recurrence.md)",
                    spec.key,
                    crate::recurring::tzdb_version()
                )));
            }
        }
        self.zone_tzdb = Some(tzdb);
        let r = self.command(change.into_command());
        self.zone_tzdb = None;
        r
    }
}

impl Store {
    /// The series at `key` as a client sees it, with its next `upcoming` occurrence times and
    /// the current state of its latest occurrences.
    pub fn recurring(&self, key: &TimerKey, upcoming: usize) -> Result<Option<RecurringView>> {
        let mut snap = Snap::new(&self.db, self.space)?;
        recurring_in(&mut snap, key, upcoming)
    }

    /// One page of `namespace`'s recurring timers, in id order, after `after`.
    pub fn list_recurring(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<RecurringView>, Option<String>)> {
        let prefix = self.space.namespace_prefix(namespace);
        let start = match after {
            Some(id) => {
                let mut k = TimerKey::new(namespace, id).index_key(self.space);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let mut snap = Snap::new(&self.db, self.space)?;
        let mut keys = Vec::new();
        let mut iter = snap
            .reader
            .iter(CF_RECURRING, start, Some(prefix_end(&prefix)));
        while let Some(k) = iter.key() {
            if keys.len() > limit {
                break;
            }
            keys.push(k.to_vec());
            iter.next();
        }
        iter.status()?;
        drop(iter);
        let more = keys.len() > limit;
        keys.truncate(limit);
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            let key = TimerKey::from_index_key(&k)
                .ok_or_else(|| Error::Storage("corrupt series key".into()))?;
            if let Some(t) = recurring_in(&mut snap, &key, UPCOMING_IN_ANSWERS)? {
                out.push(t);
            }
        }
        let next = more
            .then(|| out.last().map(|v| v.recurring.spec.key.id.clone()))
            .flatten();
        Ok((out, next))
    }
}

fn recurring_in(
    snap: &mut Snap<'_>,
    key: &TimerKey,
    upcoming: usize,
) -> Result<Option<RecurringView>> {
    let Some(raw) = snap
        .reader
        .get(CF_RECURRING, &key.index_key(snap.reader.space))?
    else {
        return Ok(None);
    };
    let s: RecurringTimer = codec::decode(&raw)?;
    let mut recent = Vec::with_capacity(s.recent.len());
    for (nominal, fate) in &s.recent {
        let occ = s.occurrence_key(*nominal);
        let state = snap.timer(&occ)?.map(|t| t.state);
        recent.push((occ.id, *fate, state));
    }
    let view = RecurringView {
        upcoming_ms: recurring::upcoming(&s, upcoming),
        recurring: s,
        recent,
    };
    Ok(Some(view))
}
