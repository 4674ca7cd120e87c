//! The node's one log engine: every Raft group's log in one RocksDB family, one WAL, one
//! group-commit syncer (docs/log-engine.md).
//!
//! A node will host many Raft groups (issue 36). Each group's cores appending and fsyncing on
//! their own would multiply the fsyncs of a shared disk by the number of groups; here every
//! group's appends go into the one WAL, and one `SyncWAL` per round answers the appends of all
//! groups queued before it. [`LogEngine::group`] hands out a group's [`LogStore`] (openraft's
//! `RaftLogStorage`), a cheap handle on the engine.
//!
//! Keys: the `raft_log` family's key is `group (u32 BE) ‖ index (u64 BE)`, so a group's entries
//! are one contiguous range and groups sort by id; the `raft` family's per-group keys are
//! `vote/`, `committed/`, `last_purged/` followed by the group (u32 BE). Nothing here is in a
//! state-machine family, so no snapshot or backup carries it from one node to another.
//!
//! Invariants:
//! - An append's callback runs only after a `SyncWAL` that started after the append's write
//!   (DESIGN 5). Callbacks run in the order their appends were queued: openraft needs append
//!   order within a group, and one FIFO for all groups keeps it for each.
//! - Writes of one group never touch another group's keys: every range a group deletes is
//!   bounded by its own prefix.
//! - A data directory of the single-group layout (the `log` family's 8-byte index keys, bare
//!   `vote`, `committed`, `last_purged`) is rewritten into group 0's keys before openraft
//!   starts ([`migrate_to_groups`]). Whether to migrate is read from the keys themselves, not
//!   from a marker, and every step can be done again: a crash part-way leaves the old layout
//!   whole, and the next start migrates again. A build before the `raft_log` family cannot
//!   open a migrated directory at all (RocksDB opens a database only with every family it
//!   has), so it can never misread the log or start without its vote.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};

use rocksdb::{IteratorMode, ReadOptions, WriteBatch, DB};

use super::log_cache::LogCache;
use super::{cf, CF_LOG, CF_RAFT, CF_RAFT_LOG};
use crate::raft_types::LogId;

/// A Raft group's id on a node. Group 0 is the single-group cluster's one group.
pub type GroupId = u32;

/// The group of a single-group cluster (all of them before issue 36).
pub const GROUP0: GroupId = 0;

/// Bytes of a log key: the group, then the index.
pub const LOG_KEY_BYTES: usize = 12;

/// The `log` family's key of `group`'s entry `index`.
pub fn log_key(group: GroupId, index: u64) -> [u8; LOG_KEY_BYTES] {
    let mut key = [0u8; LOG_KEY_BYTES];
    key[..4].copy_from_slice(&group.to_be_bytes());
    key[4..].copy_from_slice(&index.to_be_bytes());
    key
}

/// The index of a log key of `group`; `None` for another group's key or one of another shape.
pub fn index_of(group: GroupId, key: &[u8]) -> Option<u64> {
    if key.len() != LOG_KEY_BYTES || key[..4] != group.to_be_bytes() {
        return None;
    }
    Some(u64::from_be_bytes(key[4..].try_into().ok()?))
}

/// The `raft` family's key of a per-group record (`vote`, `committed`, `last_purged`).
pub fn group_key(name: &[u8], group: GroupId) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.len() + 5);
    key.extend_from_slice(name);
    key.push(b'/');
    key.extend_from_slice(&group.to_be_bytes());
    key
}

/// The per-group records of the `raft` family.
pub const VOTE: &[u8] = b"vote";
pub const COMMITTED: &[u8] = b"committed";
pub const LAST_PURGED: &[u8] = b"last_purged";

/// What the syncer calls once an append is durable (or the fsync failed).
pub type Flushed = Box<dyn FnOnce(io::Result<()>) + Send>;

/// See the module documentation. Dropped with the last handle on it (every group's store): it
/// closes the syncer's queue and joins its thread, so no detached thread outlives the database
/// (a process exiting while a thread still closes RocksDB aborts in its destructors).
pub struct LogEngine {
    pub(super) db: Arc<DB>,
    queue: Option<mpsc::Sender<Flushed>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Extra ms every fsync takes first: a slow disk, for tests (0: none).
    fsync_delay_ms: Arc<AtomicU64>,
    /// Each open group's shared state, so two handles on one group share one cache.
    pub(super) groups: Mutex<HashMap<GroupId, Weak<GroupState>>>,
    /// `SyncWAL`s done since the engine started (benchmarks and tests count rounds).
    fsyncs: Arc<AtomicU64>,
}

/// What the handles on one group share.
#[derive(Default)]
pub struct GroupState {
    /// The latest commit index openraft told this store (0: none yet), for health checks.
    pub(super) committed: Arc<AtomicU64>,
    /// The newest entries, decoded.
    pub(super) cache: LogCache,
    /// A purge openraft asked for past the state machine's applied index (see the invariants).
    pub(super) deferred: std::sync::Mutex<Option<LogId>>,
}

impl Drop for LogEngine {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            // Finishes at most the fsync in progress.
            let _ = thread.join();
        }
    }
}

impl LogEngine {
    /// The engine over `db` (opened by `storage::open_db`, which migrated its layout), with
    /// its syncer thread started.
    pub fn new(db: Arc<DB>) -> Arc<Self> {
        let (tx, rx) = mpsc::channel();
        let sync_db = db.clone();
        let fsync_delay_ms = Arc::new(AtomicU64::new(0));
        let delay = fsync_delay_ms.clone();
        let fsyncs = Arc::new(AtomicU64::new(0));
        let counted = fsyncs.clone();
        let thread = std::thread::Builder::new()
            .name("timerdb-log-sync".into())
            .spawn(move || run_syncer(sync_db, rx, delay, counted))
            .expect("spawn log syncer thread");
        Arc::new(LogEngine {
            db,
            queue: Some(tx),
            thread: Some(thread),
            fsync_delay_ms,
            groups: Mutex::default(),
            fsyncs,
        })
    }

    /// How many `SyncWAL`s the syncer has done (each answers every append queued before it).
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }

    /// Makes every log fsync take `ms` longer (0: as the disk is): a disk stalled by its
    /// neighbours' writeback, for tests of what a slow follower costs the cluster.
    pub fn fsync_delay_ms(&self) -> Arc<AtomicU64> {
        self.fsync_delay_ms.clone()
    }

    /// Writes `group`'s encoded entries `(index, bytes)` unsynced: readable when this returns,
    /// durable once a [`when_durable`](Self::when_durable) queued after it is called back. The
    /// one write path of every group's appends (and of the log-engine benchmark).
    pub fn write<'a>(
        &self,
        group: GroupId,
        entries: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> io::Result<()> {
        let log = cf(&self.db, CF_RAFT_LOG);
        let mut batch = WriteBatch::default();
        for (index, bytes) in entries {
            batch.put_cf(log, log_key(group, index), bytes);
        }
        self.db.write(batch).map_err(write_err)
    }

    /// Calls `done` once every write made before this call is durable: after the syncer's next
    /// `SyncWAL`, which covers the writes of every group queued with it.
    pub fn when_durable(&self, done: Flushed) -> io::Result<()> {
        if crate::sim::inline() {
            // A simulation: synced and answered here, not at a wall-clock moment on a thread.
            done(self.db.flush_wal(true).map_err(write_err));
            return Ok(());
        }
        self.queue
            .as_ref()
            .expect("the queue lives as long as the engine")
            .send(done)
            .map_err(|_| write_err("log syncer stopped"))
    }

    /// Deletes `group`'s entries up to `upto` inclusive and records `last_purged` (encoded),
    /// in one synced batch.
    pub fn purge(&self, group: GroupId, upto: u64, last_purged: &[u8]) -> io::Result<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(
            cf(&self.db, CF_RAFT),
            group_key(LAST_PURGED, group),
            last_purged,
        );
        let log = cf(&self.db, CF_RAFT_LOG);
        batch.delete_range_cf(
            log,
            log_key(group, 0),
            log_key(group, upto.saturating_add(1)),
        );
        if upto == u64::MAX {
            // The range's end is exclusive.
            batch.delete_cf(log, log_key(group, u64::MAX));
        }
        self.write_synced(batch)
    }

    /// Deletes `group`'s entries from `from` on, in one synced batch.
    pub fn truncate(&self, group: GroupId, from: u64) -> io::Result<()> {
        let mut batch = WriteBatch::default();
        let log = cf(&self.db, CF_RAFT_LOG);
        batch.delete_range_cf(log, log_key(group, from), log_key(group, u64::MAX));
        batch.delete_cf(log, log_key(group, u64::MAX));
        self.write_synced(batch)
    }

    pub(super) fn write_synced(&self, batch: WriteBatch) -> io::Result<()> {
        let mut opts = rocksdb::WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts).map_err(write_err)
    }

    /// `group`'s stored entries from `from` on, in order, as `(index, bytes)`, until `keep`
    /// says stop (it sees each entry before it is taken).
    pub fn scan(
        &self,
        group: GroupId,
        from: u64,
        mut keep: impl FnMut(u64, &[u8]) -> bool,
    ) -> io::Result<()> {
        let iter = self.db.iterator_cf_opt(
            cf(&self.db, CF_RAFT_LOG),
            group_bounds(group),
            IteratorMode::From(&log_key(group, from), rocksdb::Direction::Forward),
        );
        for item in iter {
            let (k, v) = item.map_err(read_err)?;
            let index = index_of(group, &k).ok_or_else(|| read_err("corrupt log key"))?;
            if !keep(index, &v) {
                break;
            }
        }
        Ok(())
    }

    /// `group`'s newest stored entry's bytes.
    pub fn last(&self, group: GroupId) -> io::Result<Option<Box<[u8]>>> {
        let mut iter = self.db.iterator_cf_opt(
            cf(&self.db, CF_RAFT_LOG),
            group_bounds(group),
            IteratorMode::End,
        );
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (k, v) = item.map_err(read_err)?;
                index_of(group, &k).ok_or_else(|| read_err("corrupt log key"))?;
                Ok(Some(v))
            }
        }
    }
}

/// Read options bounding an iterator to `group`'s keys.
fn group_bounds(group: GroupId) -> ReadOptions {
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(log_key(group, 0).to_vec());
    match group.checked_add(1) {
        Some(next) => opts.set_iterate_upper_bound(log_key(next, 0).to_vec()),
        None => opts.set_iterate_upper_bound(vec![0xff; LOG_KEY_BYTES + 1]),
    }
    opts
}

pub(super) fn read_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("reading the raft log: {e}"))
}

pub(super) fn write_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("writing the raft log: {e}"))
}

/// A log fsync slower than this is logged.
const SLOW_FSYNC: std::time::Duration = std::time::Duration::from_millis(100);

/// The group-commit loop: one `SyncWAL` for every burst of appends (of every group), callbacks
/// in queue order. Runs until the engine is dropped.
fn run_syncer(
    db: Arc<DB>,
    rx: mpsc::Receiver<Flushed>,
    delay_ms: Arc<AtomicU64>,
    fsyncs: Arc<AtomicU64>,
) {
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        let started = std::time::Instant::now();
        let delay = delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_millis(delay));
        }
        let result = db.flush_wal(true);
        fsyncs.fetch_add(1, Ordering::Relaxed);
        let took = started.elapsed();
        // A follower answers an AppendEntries only once the fsync of the appends before it is
        // done: one that takes this long shows as a late follower, and on a leader as late
        // commits.
        if took > SLOW_FSYNC {
            tracing::warn!(
                ms = took.as_millis() as u64,
                appends = waiting.len(),
                "slow log fsync"
            );
        }
        for done in waiting {
            done(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::other(e.to_string())),
            });
        }
    }
}

/// Most bytes of entries one unsynced batch of the migration copies.
const MIGRATE_CHUNK_BYTES: usize = 64 << 20;

/// Rewrites a log of the single-group layout (the `log` family's 8-byte index keys; bare
/// `vote`, `committed`, `last_purged` in `raft`) into group 0's keys; does nothing for a
/// directory without one. The entries are copied in unsynced batches of at most
/// [`MIGRATE_CHUNK_BYTES`] (a log can hold gigabytes of ScheduleBatch entries), then one synced
/// batch deletes the old log and moves the records: until that batch the old layout is whole,
/// and a start after a crash copies the same entries again.
pub(super) fn migrate_to_groups(db: &DB) -> crate::Result<()> {
    let (old, new, raft) = (cf(db, CF_LOG), cf(db, CF_RAFT_LOG), cf(db, CF_RAFT));
    let mut records = Vec::new();
    for name in [VOTE, COMMITTED, LAST_PURGED] {
        if let Some(v) = db.get_cf(raft, name)? {
            records.push((name, v));
        }
    }
    let has_old_log = db.iterator_cf(old, IteratorMode::Start).next().is_some();
    if records.is_empty() && !has_old_log {
        return Ok(());
    }
    let (mut moved, mut batch, mut bytes) = (0usize, WriteBatch::default(), 0usize);
    for item in db.iterator_cf(old, IteratorMode::Start) {
        let (k, v) = item?;
        let Ok(index) = <[u8; 8]>::try_from(k.as_ref()) else {
            return Err(crate::Error::Storage(format!(
                "the single-group log holds a key of {} bytes, not 8: not migrated",
                k.len()
            )));
        };
        batch.put_cf(new, log_key(GROUP0, u64::from_be_bytes(index)), &v);
        (moved, bytes) = (moved + 1, bytes + v.len());
        if bytes >= MIGRATE_CHUNK_BYTES {
            db.write(std::mem::take(&mut batch))?;
            bytes = 0;
        }
    }
    batch.delete_range_cf(old, [0u8; 8], [0xffu8; 8]);
    batch.delete_cf(old, [0xffu8; 8]);
    for (name, v) in &records {
        batch.put_cf(raft, group_key(name, GROUP0), v);
        batch.delete_cf(raft, name);
    }
    let mut opts = rocksdb::WriteOptions::default();
    opts.set_sync(true);
    db.write_opt(batch, &opts)?;
    tracing::info!(
        log_entries = moved,
        "moved the single-group Raft log into group 0 of the log engine"
    );
    Ok(())
}
