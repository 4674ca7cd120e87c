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
//! with `last_applied`, so a crash re-applies an entry wholly or not at all. Point reads of
//! rows, index entries, leases and namespace meta go through the entry's staged writes first,
//! so its commands see each other's effects before the batch is written. Range scans read the
//! database only; the model keeps them apart from what the same entry writes (a scan reads
//! behind a cursor, new rows go after it: see `fire.rs` and `deliver.rs`).
//!
//! This file holds the machinery; `schedule.rs` holds Schedule and ScheduleBatch,
//! `namespaces.rs` the namespace commands, `change.rs` Cancel, Reschedule and the Schedule
//! modes, `fire.rs`, `deliver.rs`, `purge.rs` and `recurring.rs` the rest.

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap as HashMap;

use rocksdb::{WriteBatch, DB};

use super::heads::Heads;
use super::meta::{NsMeta, Progress};
use super::read::Reader;
use super::row::{derive, Lease, Lookup, Row};
use super::{cf, codec, CF_INDEX, CF_LEASES, CF_NAMESPACES, CF_NSMETA, CF_WHEEL};
use crate::command::{Command, Cond, Response, Shift};
use crate::keys::Space;
use crate::namespace::{Config, Policy, PushTarget};
use crate::timer::{KeyRef, Timer, TimerKey};
use crate::wheel::{Slot, Wheel};
use crate::{Error, Result};

/// Applies commands for one log entry into `batch`.
pub(super) struct Applier<'a> {
    pub db: &'a DB,
    /// The group whose log this entry is of: every key it reads or writes is under its prefix.
    pub space: Space,
    /// Whether the cluster has data groups (`fire_token`).
    pub sharded: bool,
    pub wheel: Wheel,
    pub batch: &'a mut WriteBatch,
    pub progress: &'a mut Progress,
    /// The entry's log index: seqs of the rows it places, and the fire index of what it fires.
    pub index: u64,
    pub heads: Arc<Mutex<Heads>>,
    /// Rows placed so far by this entry (the next seq's position).
    pub(super) next_pos: u32,
    /// The earliest due time this entry put on the wheel (rows or deadlines), to wake the
    /// fire driver.
    pub earliest_new_due: Option<i64>,
    /// Whether this entry made timers deliverable, to wake the delivery dispatcher.
    pub made_ready: bool,
    /// Where scans of the deadlines start (`floor.rs`): at or below every live one.
    pub(super) deadline_floor: u64,
    /// What this entry's expiry scan proved about the deadlines in the database: none is
    /// below this (`floor.rs`).
    pub deadlines_proved: Option<u64>,
    /// The earliest deadline this entry wrote.
    pub deadlines_written: Option<u64>,
    /// Per namespace, the earliest row this entry placed after the cursor, for the heads once
    /// the batch is written.
    pub placed: HashMap<String, Slot>,
    /// Whether writes are staged for the entry's later reads (see `command`).
    pub(super) stage: bool,
    /// Namespaces whose head must be read again once the batch is written: those the heads
    /// cache sent the Fire to look at. Node-local (a head may be early): it decides what the
    /// cache is told, never what the entry writes.
    pub visited: Vec<String>,
    /// Namespaces the Fire's cursor passed rows of, by name: a function of the replicated
    /// state, so it may decide writes (the pass leases, `fire.rs`).
    pub(super) passed: Vec<String>,
    /// Purge floors this entry moved, for the index's compaction filter.
    pub purged: Vec<(String, Slot)>,
    /// Events for the metrics, recorded once the entry is written.
    pub events: crate::metrics::Events,
    /// The range this entry's Fire moved the cursor over, and its time.
    pub(super) fired: Option<(Slot, Slot, i64)>,
    pub(super) policies: HashMap<String, Policy>,
    /// Push targets of the namespaces in `policies` (read or written by this entry).
    pub(super) pushes: HashMap<String, Option<PushTarget>>,
    /// Namespaces' configuration versions this entry wrote (`namespaces.rs`).
    pub(super) policy_versions: HashMap<String, u64>,
    pub(super) nsmeta: HashMap<String, NsMeta>,
    /// Rows written by this entry, by slot (slots are unique across namespaces).
    pub(super) rows: HashMap<Slot, Option<Row>>,
    /// Index entries written by this entry, by their encoded key.
    pub(super) index_staged: HashMap<Vec<u8>, Option<Slot>>,
    /// Index entries read from the database for this entry's commands in one batched read
    /// before they ran (see `prefetch_index`), by encoded key. The database does not change
    /// while an entry applies, so they stay true; staged writes are consulted first.
    pub(super) index_read: HashMap<Vec<u8>, Option<Slot>>,
    pub(super) leases: HashMap<(String, Slot), Lease>,
    /// The access state as this entry changed it (`access.rs`).
    pub(super) access_staged: Option<crate::auth::AccessState>,
    /// Whether this entry changed the access state (published once the batch is written).
    pub access_changed: bool,
    /// Whether this entry changed a namespace's configuration (told its readers once the batch
    /// is written: `Store::namespaces_version`).
    pub namespaces_changed: bool,
    /// Series rows written by this entry, by key (`recurring.rs`).
    pub(super) recurring_staged: HashMap<Vec<u8>, Option<crate::recurring::RecurringTimer>>,
    /// Namespaces where this entry rewrote a row its Fire had just passed (a series
    /// occurrence dropped or held back): no grant for them in this entry (`recurring.rs`).
    pub(super) rewrote_fired: Vec<String>,
    /// Rows the Fire passed too late for their misfire policy: (index into `visited`, slot,
    /// policy) (`misfire.rs`).
    pub(super) late: Vec<(usize, Slot, crate::namespace::Misfire)>,
    /// The tzdb version the entry names (`ZoneRules`, `FireWithZones`: the proposer's), for
    /// the series rows it writes and the rules it may compute them with (`rule_of`).
    pub(super) zone_tzdb: Option<String>,
    /// The committed level as this entry raised it (`level.rs`).
    pub level_staged: Option<u32>,
    /// A plain Schedule goes through `schedule_with` (nothing set), the path builds before the
    /// fold apply it by, not the fast path, `schedule`, this build takes. The two must make
    /// exactly the same change (DESIGN 8: in a rolling upgrade both kinds of replica apply the
    /// same entry); the apply fuzzer's disturbed replica and `storage/tests/folded.rs` take
    /// this path to compare them ([`StateMachine::apply_plain_schedules_generally`]).
    pub plain_as_general: bool,
}

impl<'a> Applier<'a> {
    pub fn new(
        db: &'a DB,
        (space, sharded): (Space, bool),
        wheel: Wheel,
        batch: &'a mut WriteBatch,
        progress: &'a mut Progress,
        index: u64,
        heads: Arc<Mutex<Heads>>,
    ) -> Self {
        Applier {
            db,
            space,
            sharded,
            wheel,
            batch,
            progress,
            index,
            heads,
            next_pos: 0,
            earliest_new_due: None,
            made_ready: false,
            deadline_floor: 0,
            deadlines_proved: None,
            deadlines_written: None,
            placed: HashMap::default(),
            stage: true,
            visited: Vec::new(),
            passed: Vec::new(),
            purged: Vec::new(),
            events: Default::default(),
            fired: None,
            policies: HashMap::default(),
            pushes: HashMap::default(),
            policy_versions: HashMap::default(),
            nsmeta: HashMap::default(),
            rows: HashMap::default(),
            index_staged: HashMap::default(),
            index_read: HashMap::default(),
            leases: HashMap::default(),
            access_staged: None,
            access_changed: false,
            namespaces_changed: false,
            recurring_staged: HashMap::default(),
            rewrote_fired: Vec::new(),
            late: Vec::new(),
            zone_tzdb: None,
            level_staged: None,
            plain_as_general: false,
        }
    }

    /// Applies the entry's command. A ScheduleBatch alone in its entry reads nothing it
    /// writes (an id twice in it is handled by the batch itself), so its thousands of rows are
    /// not also copied into the staging maps. Schedule and ScheduleBatch read their specs where
    /// they lie in the shared command (see `log_cache`); other commands are small and applied
    /// from a copy.
    pub fn apply(&mut self, cmd: Arc<Command>) -> Result<Response> {
        self.stage = !matches!(*cmd, Command::ScheduleBatch { .. });
        let Command::Multi(cmds) = &*cmd else {
            return self.shared(&cmd, &cmd, None);
        };
        self.prefetch_index(cmds.iter().filter_map(Command::timer_key))?;
        let mut out = Vec::with_capacity(cmds.len());
        for (at, sub) in cmds.iter().enumerate() {
            if matches!(
                sub,
                Command::Multi(_)
                    | Command::Fire { .. }
                    | Command::FireWithZones { .. }
                    | Command::Deliver { .. }
                    | Command::Purge { .. }
            ) {
                return Err(Error::Internal(format!(
                    "{} inside a Multi entry",
                    sub.name()
                )));
            }
            out.push(self.shared(sub, &cmd, Some(at))?);
        }
        Ok(Response::Multi(out))
    }

    /// `cmd`, which is `entry` or its command at `at` (a Multi's).
    fn shared(
        &mut self,
        cmd: &Command,
        entry: &Arc<Command>,
        at: Option<usize>,
    ) -> Result<Response> {
        match cmd {
            // A plain Schedule, in either form: the shared path (no copy of the spec).
            Command::LegacySchedule { now_ms, spec } => self.schedule(*now_ms, spec),
            Command::Schedule { now_ms, spec, with }
                if with.is_plain() && !self.plain_as_general =>
            {
                self.schedule(*now_ms, spec)
            }
            Command::ScheduleBatch { now_ms, specs } => {
                self.schedule_batch(*now_ms, specs, entry, at)
            }
            other => self.command(other.clone()),
        }
    }

    pub(super) fn command(&mut self, cmd: Command) -> Result<Response> {
        match cmd {
            Command::LegacySchedule { now_ms, spec } => self.schedule(now_ms, &spec),
            Command::ScheduleBatch { .. } | Command::Multi(_) => Err(Error::Internal(format!(
                "{} applied from a copy",
                cmd.name()
            ))),
            Command::LegacyCancel { now_ms, key } => self.cancel(now_ms, key, Cond::default()),
            Command::LegacyReschedule { now_ms, key, when } => {
                self.reschedule(now_ms, key, Shift::To(when), Cond::default())
            }
            Command::Cancel { now_ms, key, cond } => self.cancel(now_ms, key, cond),
            Command::Reschedule {
                now_ms,
                key,
                shift,
                cond,
            } => self.reschedule(now_ms, key, shift, cond),
            Command::Schedule { now_ms, spec, with }
                if with.is_plain() && !self.plain_as_general =>
            {
                self.schedule(now_ms, &spec)
            }
            Command::Schedule { now_ms, spec, with } => self.schedule_with(now_ms, &spec, with),
            Command::SetNamespace {
                name,
                mut policy,
                push,
                misfire,
            } => {
                policy.misfire = misfire;
                Ok(self.change_namespace(name, Config { policy, push }))
            }
            Command::ConfigureNamespace {
                name,
                policy,
                push,
                misfire,
                keep_secrets,
            } => self.configure_namespace(name, policy, push, misfire, keep_secrets),
            Command::UpsertRecurring { now_ms, spec, cond } => {
                self.upsert_recurring(now_ms, &spec, cond)
            }
            Command::ZoneRules {
                tzdb,
                zone_fp,
                change,
            } => self.with_zone_rules(tzdb, zone_fp, change),
            Command::Fire {
                now_ms,
                max,
                grants,
            } => self.fire(now_ms, max, grants),
            Command::FireWithZones {
                tzdb,
                now_ms,
                max,
                grants,
            } => {
                self.zone_tzdb = Some(tzdb);
                let fired = self.fire(now_ms, max, grants);
                self.zone_tzdb = None;
                fired
            }
            Command::PutNamespace {
                name,
                mut policy,
                push,
            } => {
                // Its encoding carries no misfire policy (SetNamespace does): applied from the
                // proposer's own copy it must write what a follower decodes.
                policy.misfire = Default::default();
                Ok(self.change_namespace(name, Config { policy, push }))
            }
            Command::PauseNamespace { name, paused } => self.pause_namespace(name, paused),
            Command::Deliver { now_ms, grants } => self.deliver(now_ms, grants),
            Command::Ack {
                now_ms,
                key,
                attempt,
            } => self.ack(now_ms, key, attempt),
            Command::Acks {
                now_ms,
                leases,
                acks,
            } => self.acks(now_ms, leases, acks),
            Command::Nack {
                now_ms,
                key,
                attempt,
            } => self.nack(now_ms, key, attempt),
            Command::Pushed {
                now_ms,
                key,
                attempt,
                ok,
                dead,
                retry_after_ms,
                record,
            } => self.pushed(now_ms, key, attempt, (ok, dead, retry_after_ms), record),
            Command::Redrive { now_ms, keys } => self.redrive(now_ms, keys),
            Command::Purge {
                now_ms,
                namespace,
                through,
            } => self.purge(now_ms, &namespace, through),
            Command::Access(change) => self.access(change),
            Command::RaiseLevel { level } => self.raise_level(level),
            Command::Policy {
                name,
                version,
                policy,
                push,
                misfire,
            } => self.copy_policy(name, version, Config { policy, push }, misfire),
            Command::ScheduleRecurring { now_ms, spec } => self.schedule_recurring(now_ms, &spec),
            Command::PauseRecurring {
                now_ms,
                key,
                paused,
            } => self.pause_recurring(now_ms, key, paused),
        }
    }

    /// Writes what the entry changed in the namespaces' meta; call once, after the commands.
    pub fn finish(&mut self) {
        let cf = cf(self.db, CF_NSMETA);
        let mut names: Vec<&String> = self.nsmeta.keys().collect();
        names.sort(); // the batch's order, so the same on every replica
        for ns in names {
            self.batch.put_cf(
                cf,
                self.space.nsmeta_key(ns),
                codec::encode(&self.nsmeta[ns]),
            );
        }
    }

    // --- reads through the entry's own writes ---

    /// The policy of `namespace` as replicated (the default if never configured).
    pub(super) fn policy(&mut self, namespace: &str) -> Result<Policy> {
        if let Some(p) = self.policies.get(namespace) {
            return Ok(*p);
        }
        Ok(self.config(namespace)?.0.policy)
    }

    /// `namespace`'s stored configuration as this entry has it, and whether it was configured.
    pub(super) fn config(&mut self, namespace: &str) -> Result<(Config, bool)> {
        if let (Some(policy), Some(push)) =
            (self.policies.get(namespace), self.pushes.get(namespace))
        {
            let config = Config {
                policy: *policy,
                push: push.clone(),
            };
            return Ok((config, true));
        }
        let raw = self.db.get_cf(
            cf(self.db, CF_NAMESPACES),
            self.space.namespace_key(namespace),
        )?;
        let (config, configured) = match raw {
            Some(v) => (super::config_of(&v)?, true),
            None => (
                Config {
                    policy: Policy::default(),
                    push: None,
                },
                false,
            ),
        };
        self.policies.insert(namespace.to_string(), config.policy);
        if configured {
            self.pushes
                .insert(namespace.to_string(), config.push.clone());
        }
        Ok((config, configured))
    }

    /// `namespace`'s meta as this entry has it (written by `finish`).
    pub(super) fn ns(&mut self, namespace: &str) -> Result<&mut NsMeta> {
        if !self.nsmeta.contains_key(namespace) {
            let meta = NsMeta::load(self.db, self.space, namespace)?;
            self.nsmeta.insert(namespace.to_string(), meta);
        }
        Ok(self.nsmeta.get_mut(namespace).expect("just loaded"))
    }

    /// The slot of `key`'s row, if it has one (an index entry of a purged timer is dead:
    /// see `gc.rs`).
    fn slot_of(&mut self, key: KeyRef<'_>) -> Result<Option<Slot>> {
        let k = key.index_key(self.space);
        let slot = match self
            .index_staged
            .get(&k)
            .or_else(|| self.index_read.get(&k))
        {
            Some(known) => *known,
            None => {
                let raw = self.db.get_cf(cf(self.db, CF_INDEX), &k)?;
                let decode = |v: Vec<u8>| {
                    Slot::decode(&v)
                        .ok_or_else(|| Error::Storage(format!("corrupt index of {key}")))
                };
                raw.map(decode).transpose()?
            }
        };
        let floor = self.ns(key.namespace)?.purged_to;
        Ok(slot.filter(|s| super::gc::live(*s, floor)))
    }

    /// Reads the index entries of `keys` the entry has not written, all in one batched
    /// MultiGet: RocksDB then walks the memtables and probes each SST file's filter once per
    /// sorted batch instead of once per key, which is most of what a ScheduleBatch's "is this
    /// id taken?" costs. A single key is left to `slot_of`'s point read.
    pub(super) fn prefetch_index<'k, K: Into<KeyRef<'k>>>(
        &mut self,
        keys: impl Iterator<Item = K>,
    ) -> Result<()> {
        let mut encoded: Vec<Vec<u8>> = keys
            .map(|k| k.into().index_key(self.space))
            .filter(|k| !self.index_staged.contains_key(k) && !self.index_read.contains_key(k))
            .collect();
        if encoded.len() < 2 {
            return Ok(());
        }
        encoded.sort_unstable();
        encoded.dedup();
        let values = self
            .db
            .batched_multi_get_cf(cf(self.db, CF_INDEX), &encoded, true);
        for (k, value) in encoded.into_iter().zip(values) {
            let slot = match value? {
                Some(raw) => Some(Slot::decode(&raw).ok_or_else(|| {
                    let key = TimerKey::from_index_key(&k).map(|key| key.to_string());
                    Error::Storage(format!("corrupt index of {}", key.unwrap_or_default()))
                })?),
                None => None,
            };
            self.index_read.insert(k, slot);
        }
        Ok(())
    }

    pub(super) fn row_at(&mut self, namespace: &str, slot: Slot) -> Result<Option<Row>> {
        if let Some(staged) = self.rows.get(&slot) {
            return Ok(staged.clone());
        }
        let raw = self
            .db
            .get_cf(cf(self.db, CF_WHEEL), self.space.slot_key(namespace, slot))?;
        raw.map(|v| Row::decode(&v)).transpose()
    }

    /// `key`'s row and its slot, if the timer exists.
    pub(super) fn find<'k>(&mut self, key: impl Into<KeyRef<'k>>) -> Result<Option<(Slot, Row)>> {
        let key = key.into();
        let Some(slot) = self.slot_of(key)? else {
            return Ok(None);
        };
        match self.row_at(key.namespace, slot)? {
            Some(row) => Ok(Some((slot, row))),
            None => Err(Error::Storage(format!(
                "{key} is indexed at {slot} but no row is there"
            ))),
        }
    }

    /// The timer as a client sees the row of `namespace` at `slot`.
    pub(super) fn view(&mut self, namespace: &str, slot: Slot, row: &Row) -> Result<Timer> {
        derive(namespace, slot, row, self)
    }

    pub(super) fn lease(&mut self, namespace: &str, to: Slot) -> Result<Option<Lease>> {
        if let Some(l) = self.leases.get(&(namespace.to_string(), to)) {
            return Ok(Some(*l));
        }
        let raw = self
            .db
            .get_cf(cf(self.db, CF_LEASES), self.space.slot_key(namespace, to))?;
        raw.map(|v| codec::decode(&v)).transpose()
    }

    /// The fire_index this entry's Fire gives the timers it fires (docs/sharding.md §5): in a
    /// cluster with data groups `index × 256 + group`, for group 0 too, so that no two groups
    /// give one token (the `webhook-id` and a receiver's dedup key are made of it); in a
    /// cluster of one group the log index, as ever. Whether the cluster has data groups is the
    /// data dir's from its first start, before any entry (`Store::settle_groups`), and the same
    /// on every member (peers of another number refuse each other), like the bucket width.
    /// Stored in the fire record, never recomputed from the group a row lives in later.
    pub(super) fn fire_token(&self) -> u64 {
        match (self.sharded, self.space.group) {
            (false, crate::keys::GROUP_ZERO) => self.index,
            (_, g) => self.index.wrapping_mul(256) | u64::from(g),
        }
    }

    /// Reads of the database as it is (not of this entry's writes).
    pub(super) fn reader(&self) -> Reader<'a> {
        Reader::live(self.db, self.space)
    }
}

impl Lookup for Applier<'_> {
    fn cursor(&mut self, _namespace: &str) -> Result<Slot> {
        Ok(self.progress.cursor)
    }

    fn delivered_to(&mut self, namespace: &str) -> Result<Slot> {
        Ok(self.ns(namespace)?.delivered_to)
    }

    fn lease_at(&mut self, namespace: &str, slot: Slot) -> Result<Option<(Slot, Lease)>> {
        // A lease this entry wrote (granted or settled) wins over the database's.
        let staged = self
            .leases
            .iter()
            .find(|((ns, to), l)| ns == namespace && l.from < slot && slot <= *to)
            .map(|((_, to), l)| (*to, *l));
        if staged.is_some() {
            return Ok(staged);
        }
        Reader::live(self.db, self.space).lease_covering(namespace, slot)
    }

    fn fire_at(&mut self, namespace: &str, slot: Slot) -> Result<(u64, i64)> {
        match self.fired {
            Some((from, to, now_ms)) if from < slot && slot <= to => {
                Ok((self.fire_token(), now_ms))
            }
            _ => {
                let home = self.space.home(namespace);
                Reader::live(self.db, self.space).fire_record(home, slot)
            }
        }
    }

    fn retention_ms(&mut self, namespace: &str) -> Result<u64> {
        Ok(self.policy(namespace)?.retention_ms)
    }
}
