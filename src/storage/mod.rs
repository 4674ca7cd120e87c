//! RocksDB storage: one database per node, one column family per keyspace.
//!
//! | CF | key | value | owner |
//! |---|---|---|---|
//! | `log` | log index (u64 BE) | bincode `Entry` | [`LogStore`] |
//! | `raft` | `vote`, `committed`, `last_purged`; `installing_snapshot` | bincode | [`LogStore`]; [`Snapshots`] |
//! | `timers` | `wheel::timer_key` | bincode [`Timer`](crate::timer::Timer) | [`StateMachine`] |
//! | `wheel` | `wheel::wheel_key` | empty: every timer's next due time | [`StateMachine`] |
//! | `ready` | `wheel::ready_key` | empty: FIRED timers waiting for a consumer | [`StateMachine`] |
//! | `meta` | typed keys in [`meta`] | bincode | [`StateMachine`] |
//! | `namespaces` | namespace name | bincode [`Policy`](crate::namespace::Policy) | [`StateMachine`] |
//!
//! Durability: log appends, votes, truncations and purges are fsynced before openraft hears they
//! are done (appends through the [`log_store::Syncer`], which groups many appends into one
//! fsync). State-machine writes are not synced: the log is the durable record and apply is
//! replayed from `last_applied`. Because both share one write-ahead log, a synced log write also
//! makes every earlier state-machine write durable.
//!
//! The state machine and the log store share the `Arc<DB>`; readers (the API, the fire driver)
//! go through [`Store`], which only reads and sees each applied entry atomically (every entry is
//! one WriteBatch that also moves `last_applied`).

mod apply;
mod codec;
mod deliver;
pub mod log_store;
pub mod meta;
pub mod restore;
mod snapshot;
mod snapshot_file;
mod state_machine;

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions, DB};

pub use codec::{decode, encode};
pub use log_store::LogStore;
pub use snapshot::{SnapshotStats, Snapshots};
pub use snapshot_file::SnapshotFile;
pub use state_machine::StateMachine;

use crate::namespace::{Namespace, Policy};
use crate::timer::{Timer, TimerKey, TimerState};
use crate::wheel::{self, Wheel};
use crate::{Error, Result};

pub const CF_LOG: &str = "log";
pub const CF_RAFT: &str = "raft";
pub const CF_TIMERS: &str = "timers";
pub const CF_WHEEL: &str = "wheel";
pub const CF_META: &str = "meta";
pub const CF_NAMESPACES: &str = "namespaces";
pub const CF_READY: &str = "ready";
const ALL_CFS: [&str; 7] = [
    CF_LOG,
    CF_RAFT,
    CF_TIMERS,
    CF_WHEEL,
    CF_META,
    CF_NAMESPACES,
    CF_READY,
];
/// The column families that make up the state machine (snapshots and digests cover these).
pub(crate) const SM_CFS: [&str; 5] = [CF_TIMERS, CF_WHEEL, CF_META, CF_NAMESPACES, CF_READY];

/// Opens (or creates) a node's database under `dir`.
pub fn open_db(dir: &Path) -> Result<Arc<DB>> {
    std::fs::create_dir_all(dir)?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // No preallocation: RocksDB would otherwise reserve ~70 MB of WAL ahead and keep accepting
    // writes on a full disk until that runs out. Without it a full disk fails the very next
    // write, so the node stops at once (a storage error is fatal to Raft) instead of later.
    // (rust-rocksdb has no setter for it; the options-string parser has.)
    let mut opts = opts.get_options_from_string("allow_fallocate=false")?;
    // All memtables together stay under one budget, whatever the number of column families.
    opts.set_db_write_buffer_size(WRITE_BUFFERS_BYTES);
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    let cfs = ALL_CFS.map(|name| ColumnFamilyDescriptor::new(name, cf_options(name, &cache)));
    let db = DB::open_cf_descriptors(&opts, dir.join("db"), cfs)?;
    Ok(Arc::new(db))
}

/// Block cache shared by every column family: memory stays bounded however many timers rest
/// on disk (the 10,000,000-timer benchmark keeps each node's RSS in check with it).
const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// Memtables of all column families together.
const WRITE_BUFFERS_BYTES: usize = 128 << 20;

/// Per column family: compressed (each family has its own options; the database's do not
/// reach them), the shared block cache, and a bloom filter where lookups are by key: every
/// apply reads the timers it changes, and most are not in the SST files it would otherwise
/// search one by one.
fn cf_options(name: &str, cache: &rocksdb::Cache) -> Options {
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_cache(cache);
    if name == CF_TIMERS {
        table.set_bloom_filter(10.0, false);
    }
    let mut opts = Options::default();
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    opts.set_block_based_table_factory(&table);
    opts
}

/// Column-family handle; the families are created at open, so absence is a bug.
pub(crate) fn cf<'a>(db: &'a DB, name: &str) -> &'a rocksdb::ColumnFamily {
    db.cf_handle(name)
        .unwrap_or_else(|| panic!("column family {name} missing"))
}

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

/// Most keys one List call examines, so a sparse filter over a huge namespace answers with a
/// short page and a token instead of scanning for ever.
const LIST_SCAN_BUDGET: usize = 100_000;

/// Read access to the state machine, for the API and the fire driver.
#[derive(Clone)]
pub struct Store {
    db: Arc<DB>,
    wheel: Wheel,
    /// Keys the state machine has written through this store since it was opened.
    keys_written: Arc<std::sync::atomic::AtomicU64>,
}

impl Store {
    pub fn new(db: Arc<DB>, wheel: Wheel) -> Self {
        Store {
            db,
            wheel,
            keys_written: Arc::default(),
        }
    }

    /// Keys (puts, deletes, range deletes) the state machine has written since the node
    /// started: the cost of every timer in storage writes, which the benchmarks divide by the
    /// timers that went through.
    pub fn keys_written(&self) -> u64 {
        self.keys_written.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn db(&self) -> &Arc<DB> {
        &self.db
    }

    pub fn wheel(&self) -> Wheel {
        self.wheel
    }

    /// The timer at `key`, if any.
    pub fn get(&self, key: &TimerKey) -> Result<Option<Timer>> {
        let raw = self
            .db
            .get_cf(cf(&self.db, CF_TIMERS), wheel::timer_key(key))?;
        raw.map(|v| decode(&v)).transpose()
    }

    /// One page of `q.namespace`'s timers matching its filter, in id order.
    pub fn list(&self, q: &ListQuery) -> Result<Page> {
        let (namespace, filter, limit) = (q.namespace.as_str(), &q.filter, q.limit);
        let prefix = wheel::namespace_prefix(namespace);
        let start = match q.after.as_deref() {
            // The smallest key strictly after `after`: append a zero byte.
            Some(id) => {
                let mut k = wheel::timer_key(&TimerKey::new(namespace, id));
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(prefix_end(&prefix));
        let iter = self.db.iterator_cf_opt(
            cf(&self.db, CF_TIMERS),
            opts,
            IteratorMode::From(&start, Direction::Forward),
        );
        let mut page = Page::default();
        let mut last_id = None;
        for (scanned, item) in iter.enumerate() {
            let (_, v) = item?;
            let timer: Timer = decode(&v)?;
            if scanned >= LIST_SCAN_BUDGET || page.timers.len() >= limit {
                page.next_after = last_id;
                return Ok(page);
            }
            last_id = Some(timer.key.id.clone());
            if filter.matches(&timer) {
                page.timers.push(timer);
            }
        }
        Ok(page)
    }

    /// The earliest wheel bucket at or after the floor, i.e. the next PENDING timers.
    pub fn next_bucket(&self) -> Result<Option<u64>> {
        let floor = self.meta()?.floor;
        let start = wheel::bucket_start_key(floor);
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(start.clone());
        let mut iter = self.db.iterator_cf_opt(
            cf(&self.db, CF_WHEEL),
            opts,
            IteratorMode::From(&start, Direction::Forward),
        );
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (k, _) = item?;
                let (bucket, _) = wheel::decode_wheel_key(&k)
                    .ok_or_else(|| Error::Storage("corrupt wheel key".into()))?;
                Ok(Some(bucket))
            }
        }
    }

    /// Up to `limit` READY timers of `namespace`, in fire order, skipping `skip` (keys the
    /// caller has already claimed but whose Deliver has not applied yet).
    pub fn ready(
        &self,
        namespace: &str,
        limit: usize,
        skip: &std::collections::HashSet<TimerKey>,
    ) -> Result<Vec<TimerKey>> {
        let prefix = wheel::namespace_prefix(namespace);
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(prefix_end(&prefix));
        let iter = self.db.iterator_cf_opt(
            cf(&self.db, CF_READY),
            opts,
            IteratorMode::From(&prefix, Direction::Forward),
        );
        let mut out = Vec::new();
        for item in iter {
            if out.len() >= limit {
                break;
            }
            let (k, _) = item?;
            let (_, key) = wheel::decode_ready_key(&k)
                .ok_or_else(|| Error::Storage("corrupt ready key".into()))?;
            if !skip.contains(&key) {
                out.push(key);
            }
        }
        Ok(out)
    }

    /// A namespace's policy: its own if configured, the default otherwise.
    pub fn namespace(&self, name: &str) -> Result<Namespace> {
        let raw = self
            .db
            .get_cf(cf(&self.db, CF_NAMESPACES), name.as_bytes())?;
        Ok(match raw {
            Some(v) => Namespace {
                name: name.into(),
                policy: decode(&v)?,
                configured: true,
            },
            None => Namespace {
                name: name.into(),
                policy: Policy::default(),
                configured: false,
            },
        })
    }

    /// Up to `limit` configured namespaces in name order, after `after`.
    pub fn namespaces(&self, after: Option<&str>, limit: usize) -> Result<Vec<Namespace>> {
        let start = after.map_or_else(Vec::new, |a| [a.as_bytes(), &[0]].concat());
        let iter = self.db.iterator_cf(
            cf(&self.db, CF_NAMESPACES),
            IteratorMode::From(&start, Direction::Forward),
        );
        let mut out = Vec::new();
        for item in iter.take(limit) {
            let (k, v) = item?;
            let name = String::from_utf8(k.to_vec())
                .map_err(|_| Error::Storage("corrupt namespace name".into()))?;
            out.push(Namespace {
                name,
                policy: decode(&v)?,
                configured: true,
            });
        }
        Ok(out)
    }

    /// The replicated counters and cursors as last applied.
    pub fn meta(&self) -> Result<meta::SmMeta> {
        meta::SmMeta::load(&self.db)
    }

    /// PENDING timers per namespace (every namespace that ever had one).
    pub fn pending_by_namespace(&self) -> Result<Vec<(String, u64)>> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(prefix_end(meta::PENDING_PREFIX));
        let iter = self.db.iterator_cf_opt(
            cf(&self.db, CF_META),
            opts,
            IteratorMode::From(meta::PENDING_PREFIX, Direction::Forward),
        );
        let mut out = Vec::new();
        for item in iter {
            let (k, v) = item?;
            let ns = String::from_utf8_lossy(&k[meta::PENDING_PREFIX.len()..]).into_owned();
            out.push((ns, decode(&v)?));
        }
        Ok(out)
    }

    /// Bytes the Raft log takes on disk and in memtables (RocksDB's estimate).
    pub fn log_bytes(&self) -> u64 {
        let log = cf(&self.db, CF_LOG);
        [
            "rocksdb.total-sst-files-size",
            "rocksdb.size-all-mem-tables",
        ]
        .iter()
        .filter_map(|p| self.db.property_int_value_cf(log, *p).ok().flatten())
        .sum()
    }

    /// A digest of the whole state machine (timers, wheel, meta) and the applied index it
    /// describes, read from one consistent RocksDB snapshot. Equal applied index ⇒ equal digest
    /// on every correct replica.
    pub fn digest(&self) -> Result<(u64, u64)> {
        let snap = self.db.snapshot();
        let mut h = Fnv64::new();
        for name in SM_CFS {
            h.write(name.as_bytes());
            for item in snap.iterator_cf(cf(&self.db, name), IteratorMode::Start) {
                let (k, v) = item?;
                h.write(&(k.len() as u64).to_be_bytes());
                h.write(&k);
                h.write(&(v.len() as u64).to_be_bytes());
                h.write(&v);
            }
        }
        let applied = match snap.get_cf(cf(&self.db, CF_META), meta::LAST_APPLIED)? {
            Some(v) => decode::<Option<openraft::LogId<u64>>>(&v)?.map_or(0, |l| l.index),
            None => 0,
        };
        Ok((applied, h.finish()))
    }
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; 16]
}

/// FNV-1a, 64 bit: stable across builds and platforms, which the digest needs and std's hasher
/// does not promise.
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests;
