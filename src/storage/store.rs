//! The read side of the state machine, for the API and the leader's workers.
//!
//! Every question is answered from one RocksDB snapshot ([`Reader`]), because a timer's state
//! is derived from several keys (its row, the fire cursor, its namespace's delivery cursor, the
//! lease and the fire record covering it) that must come from one applied state. The heads
//! (each namespace's first row after the cursor) are shared with the state machine, which
//! keeps them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rocksdb::DB;

use super::gc::{self, IndexGc};
use super::heads::Heads;
use super::meta::{self, NsMeta};
use super::read::Reader;
use super::row::{derive, Lease, Lookup, Row};
use super::{cf, decode, prefix_end, CF_INDEX, CF_META, CF_NAMESPACES, CF_NSMETA, CF_WHEEL};
use crate::keys::{self, Space};
use crate::namespace::{Config, Namespace, Policy};
use crate::timer::{Timer, TimerKey, TimerState};
use crate::wheel::{Slot, Wheel};
use crate::{Error, Result};

/// What List filters on.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<TimerState>,
    /// Inclusive lower bound on `fire_at_ms`; `None`: unbounded.
    pub fire_from_ms: Option<i64>,
    /// Exclusive upper bound on `fire_at_ms`; `None`: unbounded.
    pub fire_to_ms: Option<i64>,
}

impl ListFilter {
    fn matches(&self, t: &Timer) -> bool {
        self.state.is_none_or(|s| s == t.state)
            && self.fire_from_ms.is_none_or(|f| t.fire_at_ms >= f)
            && self.fire_to_ms.is_none_or(|to| t.fire_at_ms < to)
    }
}

/// A List request, validated: which namespace, what filter, where to resume, how many.
#[derive(Debug, Clone)]
pub struct ListQuery {
    pub namespace: String,
    pub filter: ListFilter,
    /// Resume after this id (from the previous page's `next_after`).
    pub after: Option<String>,
    pub limit: usize,
}

/// One page of a List.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub timers: Vec<Timer>,
    /// The id to continue after; `None` on the last page.
    pub next_after: Option<String>,
}

/// Most timers one List call examines, so a sparse filter over a huge namespace answers with a
/// short page and a token instead of scanning for ever.
const LIST_SCAN_BUDGET: usize = 100_000;

/// A namespace's timers counted by state ([`Store::count_states`]).
#[derive(Debug, Clone, Default)]
pub struct StateCounts {
    /// Each state seen, with how many timers are in it.
    pub counts: Vec<(crate::timer::TimerState, u64)>,
    /// The count stopped at its budget: these are the first timers (by id) only.
    pub partial: bool,
    /// Timers read.
    pub read: usize,
}

/// Read access to the state machine.
#[derive(Clone)]
pub struct Store {
    pub(super) db: Arc<DB>,
    /// The group whose state this is: every key it reads is under its prefix.
    pub(super) space: Space,
    /// Whether the node's cluster has data groups (`settle_groups`; node-wide, shared by every
    /// group's store): then every group's fire_index names its group, group 0's too.
    pub(super) sharded: Arc<std::sync::atomic::AtomicBool>,
    /// The cluster's bucket width in ms, recorded in the state machine (`meta/bucket_ms`);
    /// 0 while a joining node has not learned it yet (`adopt_width`).
    width: Arc<AtomicU64>,
    /// Keys the state machine has written through this store since it was opened.
    pub(super) keys_written: Arc<AtomicU64>,
    /// FIRED → ACKED transitions the state machine applied since it was opened.
    pub(super) acked: Arc<AtomicU64>,
    /// Timers fired since it was opened, and their lateness.
    pub(super) fire_stats: Arc<crate::metrics::FireStats>,
    /// Each namespace's first row after the fire cursor (kept by the state machine).
    pub(super) heads: Arc<Mutex<Heads>>,
    /// At or below every open lease's deadline (kept by the state machine, `floor.rs`).
    pub(super) deadline_floor: Arc<super::floor::DeadlineFloor>,
    /// Which index entries compaction may drop; pinned while a digest reads.
    pub(super) gc: Arc<IndexGc>,
    /// The applied access state (keys, auth on/off), read on every call (`access.rs`).
    pub(super) access: Arc<std::sync::RwLock<Arc<crate::auth::AccessState>>>,
    /// Woken each time the access state changes.
    pub(super) access_changed: Arc<tokio::sync::Notify>,
    /// The committed feature level (`level.rs`).
    pub(super) level: Arc<std::sync::atomic::AtomicU32>,
    /// Counts the applied entries that changed a namespace's configuration (policy, push
    /// target, pause): its readers (the pusher, the streams' pacing) compare it with the one
    /// they read at, and read again when it moved — so an acknowledged change reaches every
    /// request that starts after the acknowledgement (DESIGN: replicated state reaches its
    /// readers when it is applied, not on a poll; issue 33 finding 10).
    pub(super) namespaces_changed: Arc<tokio::sync::watch::Sender<u64>>,
    /// A gate every batch of committed entries passes before it is applied: open, except
    /// while a test holds a replica behind its log (a new leader that has not yet applied its
    /// predecessor's acknowledged entries). Passing an open gate costs a borrow.
    pub apply_hold: crate::storage::Hold,
}

/// What every group's store of a node shares: the bucket width, and whether the cluster has
/// data groups.
type NodeWide = (Arc<AtomicU64>, Arc<std::sync::atomic::AtomicBool>);

/// The state machine seen through one snapshot, for deriving timers.
pub(super) struct Snap<'a> {
    pub(super) reader: Reader<'a>,
    pub(super) cursor: Slot,
    nsmeta: HashMap<String, NsMeta>,
    retention: HashMap<String, u64>,
}

impl<'a> Snap<'a> {
    pub(super) fn new(db: &'a DB, space: Space) -> Result<Snap<'a>> {
        let reader = Reader::snapshot(db, space);
        let progress: meta::Progress = match reader.get(CF_META, &space.meta_key(meta::PROGRESS))? {
            Some(v) => decode(&v)?,
            None => Default::default(),
        };
        Ok(Snap {
            reader,
            cursor: progress.cursor,
            nsmeta: HashMap::new(),
            retention: HashMap::new(),
        })
    }

    pub(super) fn ns(&mut self, namespace: &str) -> Result<NsMeta> {
        if let Some(m) = self.nsmeta.get(namespace) {
            return Ok(*m);
        }
        let m = match self
            .reader
            .get(CF_NSMETA, &self.reader.space.nsmeta_key(namespace))?
        {
            Some(v) => decode(&v)?,
            None => NsMeta::default(),
        };
        self.nsmeta.insert(namespace.to_string(), m);
        Ok(m)
    }

    fn row(&self, namespace: &str, slot: Slot) -> Result<Option<Row>> {
        let raw = self
            .reader
            .get(CF_WHEEL, &self.reader.space.slot_key(namespace, slot))?;
        raw.map(|v| Row::decode(&v)).transpose()
    }

    pub(super) fn timer(&mut self, key: &TimerKey) -> Result<Option<Timer>> {
        let Some(raw) = self
            .reader
            .get(CF_INDEX, &key.index_key(self.reader.space))?
        else {
            return Ok(None);
        };
        let slot =
            Slot::decode(&raw).ok_or_else(|| Error::Storage(format!("corrupt index of {key}")))?;
        if !gc::live(slot, self.ns(&key.namespace)?.purged_to) {
            return Ok(None); // purged
        }
        let row = self.row(&key.namespace, slot)?.ok_or_else(|| {
            Error::Storage(format!("{key} is indexed at {slot} but no row is there"))
        })?;
        derive(&key.namespace, slot, &row, self).map(Some)
    }
}

impl Lookup for Snap<'_> {
    fn cursor(&mut self, _namespace: &str) -> Result<Slot> {
        Ok(self.cursor)
    }
    fn delivered_to(&mut self, namespace: &str) -> Result<Slot> {
        Ok(self.ns(namespace)?.delivered_to)
    }
    fn lease_at(&mut self, namespace: &str, slot: Slot) -> Result<Option<(Slot, Lease)>> {
        self.reader.lease_covering(namespace, slot)
    }
    fn fire_at(&mut self, namespace: &str, slot: Slot) -> Result<(u64, i64)> {
        self.reader
            .fire_record(self.reader.space.home(namespace), slot)
    }
    fn retention_ms(&mut self, namespace: &str) -> Result<u64> {
        if let Some(r) = self.retention.get(namespace) {
            return Ok(*r);
        }
        let key = self.reader.space.namespace_key(namespace);
        let policy: Policy = match self.reader.get(CF_NAMESPACES, &key)? {
            Some(v) => super::config_of(&v)?.policy,
            None => Policy::default(),
        };
        self.retention
            .insert(namespace.to_string(), policy.retention_ms);
        Ok(policy.retention_ms)
    }
}

impl Store {
    /// Group 0's store of `db`, which was opened with `gc` (see [`super::open_db`]), for a
    /// wheel of `wheel`'s width.
    pub fn new(db: Arc<DB>, wheel: Wheel, gc: Arc<IndexGc>) -> Self {
        Self::with_width(db, Some(wheel.width_ms()), gc)
    }

    /// Group 0's store of `db` whose bucket width is `width_ms`, or, with `None`, whatever its
    /// database records or the cluster tells it (a node joining with an empty data dir).
    pub fn with_width(db: Arc<DB>, width_ms: Option<u64>, gc: Arc<IndexGc>) -> Self {
        let width = Arc::new(AtomicU64::new(width_ms.unwrap_or(0)));
        let zero = Space::of(keys::GROUP_ZERO);
        Self::of(db, zero, (width, Arc::default()), gc)
    }

    /// The store of group `group` on this store's database: the same database, bucket width
    /// and index GC (node-wide), its own caches and counters.
    pub fn group(&self, group: keys::Group) -> Store {
        Self::of(
            self.db.clone(),
            Space::of(group),
            (self.width.clone(), self.sharded.clone()),
            self.gc.clone(),
        )
    }

    /// A store of `space` sharing the node-wide `(width, sharded)`.
    fn of(db: Arc<DB>, space: Space, node: NodeWide, gc: Arc<IndexGc>) -> Self {
        let (width, sharded) = node;
        Store {
            db,
            space,
            sharded,
            width,
            keys_written: Arc::default(),
            fire_stats: Arc::default(),
            acked: Arc::default(),
            heads: Arc::default(),
            deadline_floor: Arc::default(),
            gc,
            access: Arc::default(),
            access_changed: Arc::default(),
            level: Arc::default(),
            namespaces_changed: Arc::new(tokio::sync::watch::Sender::new(0)),
            apply_hold: Default::default(),
        }
    }

    /// Keys (puts, deletes, range deletes) the state machine has written since the node
    /// started: the cost of every timer in storage writes, which the benchmarks divide by the
    /// timers that went through.
    pub fn keys_written(&self) -> u64 {
        self.keys_written.load(Ordering::Relaxed)
    }

    /// FIRED → ACKED transitions applied since the node started.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    pub fn db(&self) -> &Arc<DB> {
        &self.db
    }

    /// The group whose state this is.
    pub fn space(&self) -> Space {
        self.space
    }

    /// Whether the node's cluster has data groups (known once `settle_groups` ran).
    pub fn sharded(&self) -> bool {
        self.sharded.load(Ordering::Acquire)
    }

    /// The wheel of the cluster's bucket width (of 1 ms while it is not known yet: nothing is
    /// stored then, and apply refuses to run, see `StateMachine`).
    pub fn wheel(&self) -> Wheel {
        Wheel::new(self.width_ms().max(1))
    }

    /// How many applied entries changed a namespace's configuration so far (see the field).
    pub fn namespaces_version(&self) -> u64 {
        *self.namespaces_changed.borrow()
    }

    /// Wakes a watcher each time an applied entry changes a namespace's configuration.
    pub fn namespace_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.namespaces_changed.subscribe()
    }

    /// An applied entry (or a snapshot install) changed namespaces' configuration.
    pub(super) fn namespaces_changed(&self) {
        self.namespaces_changed.send_modify(|v| *v += 1);
    }

    /// The cluster's bucket width in ms; 0 while this node has not learned it.
    pub fn width_ms(&self) -> u64 {
        self.width.load(Ordering::Acquire)
    }

    /// Sets the width this node runs with before anything is stored (at open).
    pub(super) fn set_width(&self, width_ms: u64) {
        self.width.store(width_ms, Ordering::Release);
    }

    /// A peer says the cluster's bucket width is `cluster_ms`: a node that does not know its
    /// width yet (it joins with an empty data dir) takes it and records it; one with another
    /// width refuses, since its replica would place and fire timers on other keys.
    pub fn adopt_width(&self, cluster_ms: u64, from: &str) -> Result<()> {
        if cluster_ms == 0 {
            return Ok(());
        }
        match self
            .width
            .compare_exchange(0, cluster_ms, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                // Synced: the log no longer shares this database's WAL (storage/mod.rs).
                self.db.put_cf_opt(
                    super::cf(&self.db, super::CF_META),
                    super::meta::BUCKET_MS,
                    super::codec::encode(&cluster_ms),
                    &super::synced(),
                )?;
                tracing::info!(
                    bucket_ms = cluster_ms,
                    from,
                    "took the cluster's bucket width"
                );
                Ok(())
            }
            Err(mine) if mine == cluster_ms => Ok(()),
            Err(mine) => Err(Error::FailedPrecondition(width_mismatch(
                mine, cluster_ms, from,
            ))),
        }
    }

    /// Makes every cached head as early as the cache's contract allows (`Heads::all_early`),
    /// and the deadline floor as low (`floor.rs`): what a long-running node's caches may be.
    /// For the simulator and the fuzzer only: apply must write the same with them.
    pub fn stale_heads(&self) -> Result<()> {
        self.deadline_floor.reset();
        let cursor = meta::SmMeta::load(&self.db, self.space)?.cursor;
        self.heads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .all_early(cursor);
        Ok(())
    }

    /// Reads every namespace's head again and forgets the deadline floor (the state machine
    /// opened or installed a snapshot).
    pub(super) fn reload_heads(&self, cursor: Slot) -> Result<()> {
        self.deadline_floor.reset();
        let heads = Heads::load(&self.db, self.space, cursor)?;
        *self.heads.lock().unwrap_or_else(|p| p.into_inner()) = heads;
        Ok(())
    }

    /// The timer at `key`, if any.
    pub fn get(&self, key: &TimerKey) -> Result<Option<Timer>> {
        Snap::new(&self.db, self.space)?.timer(key)
    }

    /// One page of `q.namespace`'s timers matching its filter, in id order.
    pub fn list(&self, q: &ListQuery) -> Result<Page> {
        let (namespace, filter, limit) = (q.namespace.as_str(), &q.filter, q.limit);
        let prefix = self.space.namespace_prefix(namespace);
        let start = match q.after.as_deref() {
            // The smallest key strictly after `after`: append a zero byte.
            Some(id) => {
                let mut k = TimerKey::new(namespace, id).index_key(self.space);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let mut snap = Snap::new(&self.db, self.space)?;
        // The ids first (one more than can be examined, to know whether a page follows),
        // then their timers: deriving a timer reads the same snapshot.
        let unfiltered =
            filter.state.is_none() && filter.fire_from_ms.is_none() && filter.fire_to_ms.is_none();
        let wanted = if unfiltered { limit } else { LIST_SCAN_BUDGET };
        let mut iter = snap.reader.iter(CF_INDEX, start, Some(prefix_end(&prefix)));
        let mut keys = Vec::new();
        while let Some(k) = iter.key() {
            if keys.len() > wanted {
                break;
            }
            keys.push(k.to_vec());
            iter.next();
        }
        iter.status()?;
        drop(iter);
        let mut page = Page::default();
        let mut last_id = None;
        for (scanned, k) in keys.into_iter().enumerate() {
            if scanned >= LIST_SCAN_BUDGET || page.timers.len() >= limit {
                page.next_after = last_id;
                return Ok(page);
            }
            let key = TimerKey::from_index_key(&k)
                .ok_or_else(|| Error::Storage("corrupt index key".into()))?;
            last_id = Some(key.id.clone());
            let Some(timer) = snap.timer(&key)? else {
                continue; // purged: its index entry waits for compaction
            };
            if filter.matches(&timer) {
                page.timers.push(timer);
            }
        }
        Ok(page)
    }

    /// Counts `namespace`'s timers by state, reading at most `budget` of them (in id order);
    /// also says whether it stopped there. One snapshot, so the counts are of one moment.
    pub fn count_states(&self, namespace: &str, budget: usize) -> Result<StateCounts> {
        let prefix = self.space.namespace_prefix(namespace);
        let mut snap = Snap::new(&self.db, self.space)?;
        let mut keys = Vec::new();
        let mut iter = snap
            .reader
            .iter(CF_INDEX, prefix.clone(), Some(prefix_end(&prefix)));
        while let Some(k) = iter.key() {
            if keys.len() >= budget {
                break;
            }
            keys.push(k.to_vec());
            iter.next();
        }
        let partial = keys.len() >= budget && iter.key().is_some();
        iter.status()?;
        drop(iter);
        let read = keys.len();
        let mut counts: Vec<(crate::timer::TimerState, u64)> = Vec::new();
        for k in keys {
            let key = TimerKey::from_index_key(&k)
                .ok_or_else(|| Error::Storage("corrupt index key".into()))?;
            let Some(timer) = snap.timer(&key)? else {
                continue; // purged: its index entry waits for compaction
            };
            match counts.iter_mut().find(|(s, _)| *s == timer.state) {
                Some((_, n)) => *n += 1,
                None => counts.push((timer.state, 1)),
            }
        }
        Ok(StateCounts {
            counts,
            partial,
            read,
        })
    }

    /// A namespace's policy: its own if configured, the default otherwise.
    pub fn namespace(&self, name: &str) -> Result<Namespace> {
        let raw = self
            .db
            .get_cf(cf(&self.db, CF_NAMESPACES), self.space.namespace_key(name))?;
        Ok(match raw {
            Some(v) => {
                let c: Config = super::config_of(&v)?;
                Namespace {
                    name: name.into(),
                    policy: c.policy,
                    push: c.push,
                    configured: true,
                }
            }
            None => Namespace {
                name: name.into(),
                policy: Policy::default(),
                push: None,
                configured: false,
            },
        })
    }

    /// Up to `limit` configured namespaces in name order, after `after` (read as
    /// `versioned_namespaces` reads them, `policies.rs`).
    pub fn namespaces(&self, after: Option<&str>, limit: usize) -> Result<Vec<Namespace>> {
        let page = self.versioned_namespaces(after, limit)?;
        Ok(page.into_iter().map(|(ns, _)| ns).collect())
    }

    /// The replicated counters and cursors as last applied.
    pub fn meta(&self) -> Result<meta::SmMeta> {
        meta::SmMeta::load(&self.db, self.space)
    }

    /// Timers fired since the store was opened, and their lateness.
    pub fn fire_stats(&self) -> &crate::metrics::FireStats {
        &self.fire_stats
    }

    /// Each namespace's (PENDING, stored) counts (every namespace that ever had a timer), in
    /// name order.
    pub fn counts_by_namespace(&self) -> Result<Vec<(String, u64, u64)>> {
        let mut out = Vec::new();
        for (ns, m) in self.namespace_metas()? {
            out.push((ns, m.pending, m.stored));
        }
        out.sort();
        Ok(out)
    }

    /// PENDING timers per namespace (every namespace that ever had one).
    pub fn pending_by_namespace(&self) -> Result<Vec<(String, u64)>> {
        let counts = self.counts_by_namespace()?;
        Ok(counts
            .into_iter()
            .map(|(ns, pending, _)| (ns, pending))
            .collect())
    }
}

/// Why a node whose bucket width is `mine` refuses a peer whose width is `theirs`.
pub fn width_mismatch(mine: u64, theirs: u64, peer: &str) -> String {
    format!(
        "bucket width mismatch: this node's wheel has {mine} ms buckets, {peer}'s {theirs} ms; \
         a cluster has one width, fixed when it was created: start this node on an empty data \
         dir without --bucket-ms (it takes the cluster's) or with --bucket-ms {theirs}"
    )
}
