//! The Raft log and vote: openraft's `RaftLogStorage` on the `log` and `raft` column families.
//!
//! Invariants:
//! - openraft hears an append is done (the `LogFlushed` callback) only after the entries are
//!   fsynced; votes, truncations and purges are fsynced before their call returns (DESIGN 5).
//! - Appended entries are readable as soon as `append` returns (written to RocksDB unsynced,
//!   then synced in the background), as openraft's contract asks.
//! - The log has no holes: truncate deletes a suffix, purge a prefix and records the last
//!   purged id in the same synced batch.
//! - The log is never purged past what the state machine holds. openraft 0.9 purges up to a
//!   received snapshot right after handing it to the state machine, which makes it durable
//!   only later: a crash in between left a node whose log started after its state machine,
//!   which could not start again (openraft re-applies committed entries from the log). Such a
//!   purge is *deferred* (in memory) until the state machine has applied that far, and done
//!   on the next append or purge; and at start the committed index is read as at most what
//!   the log or the state machine holds, so a node that crashed in that window starts from
//!   what it has and takes the snapshot again.
//! - No hole is appended behind a deferred purge: an append that would leave one (a new
//!   leader's entries, or a resent snapshot's, which openraft appends right after the
//!   snapshot's index, while the state machine still installs it) waits until the state
//!   machine has the snapshot, so the log on disk never holds the entries after the snapshot
//!   without those before it. A crash with such a hole left a node whose log openraft could
//!   not read back (issue 33 review). An append that continues the log on disk goes on.
//! - openraft 0.10 purges only once a snapshot's install is done, so a purge past the state
//!   machine no longer comes from it; the deferral stays as a guard, and logs when it acts.
//!
//! Reads of the newest entries (apply, replication) are answered from the [`LogCache`] of
//! decoded entries when it holds them; RocksDB answers the rest.
//!
//! Group commit: the [`Syncer`] thread takes every callback queued since its last fsync and
//! answers them all after one `SyncWAL`, so many concurrent appends cost one fsync. Callbacks
//! are answered in append order, which openraft requires.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions, DB};

use super::log_cache::LogCache;
use super::meta::LAST_APPLIED;
use super::{cf, codec, CF_LOG, CF_META, CF_RAFT};
use crate::cluster::{Entry, LogId, TypeConfig, Vote};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

type StResult<T> = io::Result<T>;

fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn read_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("reading the raft log: {e}"))
}

fn write_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("writing the raft log: {e}"))
}

/// How long an append waits for a snapshot install to finish before it fails.
const INSTALL_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The log store; cheap to clone (clones share the database and the syncer).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    syncer: Arc<Syncer>,
    /// The latest commit index openraft told this store (0: none yet), for health checks.
    committed: Arc<AtomicU64>,
    /// The newest entries, decoded.
    cache: Arc<LogCache>,
    /// A purge openraft asked for past the state machine's applied index (see the invariants).
    deferred: Arc<std::sync::Mutex<Option<LogId>>>,
    /// Extra ms every fsync takes first: a slow disk, for tests (0: none).
    fsync_delay_ms: Arc<AtomicU64>,
}

/// The group-commit thread and the queue to it. Dropped with the last `LogStore` clone: it
/// closes the queue and joins the thread, so no detached thread outlives the store holding the
/// database (a process exiting while a thread still closes RocksDB aborts in its destructors).
struct Syncer {
    queue: Option<mpsc::Sender<IOFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Syncer {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            // Finishes at most the fsync in progress.
            let _ = thread.join();
        }
    }
}

impl LogStore {
    /// A log store over `db`, starting its syncer thread.
    pub fn new(db: Arc<DB>) -> Self {
        let (tx, rx) = mpsc::channel();
        let sync_db = db.clone();
        let fsync_delay_ms = Arc::new(AtomicU64::new(0));
        let delay = fsync_delay_ms.clone();
        let thread = std::thread::Builder::new()
            .name("timerdb-log-sync".into())
            .spawn(move || run_syncer(sync_db, rx, delay))
            .expect("spawn log syncer thread");
        let syncer = Syncer {
            queue: Some(tx),
            thread: Some(thread),
        };
        LogStore {
            db,
            syncer: Arc::new(syncer),
            committed: Arc::default(),
            cache: Arc::default(),
            deferred: Arc::default(),
            fsync_delay_ms,
        }
    }

    /// Makes every log fsync of this store take `ms` longer (0: as the disk is): a disk stalled
    /// by its neighbours' writeback, for tests of what a slow follower costs the cluster.
    pub fn fsync_delay_ms(&self) -> Arc<AtomicU64> {
        self.fsync_delay_ms.clone()
    }

    /// The index the state machine has applied (it shares the database).
    fn applied_index(&self) -> StResult<u64> {
        let raw = (self.db)
            .get_cf(cf(&self.db, CF_META), LAST_APPLIED)
            .map_err(read_err)?;
        let applied: Option<LogId> = match raw {
            Some(v) => codec::decode(&v).map_err(read_err)?,
            None => None,
        };
        Ok(applied.map_or(0, |l| l.index))
    }

    /// Purges up to `log_id` now if the state machine has applied that far, else defers it.
    fn purge_or_defer(&self, log_id: LogId) -> StResult<()> {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if self.applied_index()? < log_id.index {
            if deferred.is_none_or(|d| d < log_id) {
                tracing::info!(upto = %log_id, "log purge deferred until the state machine has it");
                *deferred = Some(log_id);
            }
            return Ok(());
        }
        let upto = deferred.take().map_or(log_id, |d| d.max(log_id));
        drop(deferred);
        self.purge_now(upto)
    }

    /// The first index openraft may read: a deferred purge's entries are purged to it (they
    /// stay on disk only for a restart that finds its state machine behind them).
    fn first_readable(&self) -> u64 {
        let deferred = *self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        deferred.map_or(0, |d| d.index + 1)
    }

    /// Waits until no purge is deferred any more: the state machine has installed the snapshot
    /// the purge was asked for, and the purge is done (see the invariants). Gives up with an
    /// error after [`INSTALL_WAIT`] (an install that failed stops Raft, and this lets the core
    /// see it).
    pub(crate) async fn settle_before_append(&self) -> StResult<()> {
        let started = tokio::time::Instant::now();
        loop {
            self.settle_deferred()?;
            let Some(upto) = *self.deferred.lock().unwrap_or_else(|p| p.into_inner()) else {
                return Ok(());
            };
            if started.elapsed() >= INSTALL_WAIT {
                return Err(write_err(io::Error::other(format!(
                    "an append waited {INSTALL_WAIT:?} for the install of the snapshot at \
                     {upto}, which has not finished"
                ))));
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// Does a deferred purge once the state machine has reached it.
    fn settle_deferred(&self) -> StResult<()> {
        let pending = *self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        match pending {
            Some(upto) => self.purge_or_defer(upto),
            None => Ok(()),
        }
    }

    fn purge_now(&self, log_id: LogId) -> StResult<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(cf(&self.db, CF_RAFT), LAST_PURGED, codec::encode(&log_id));
        batch.delete_range_cf(cf(&self.db, CF_LOG), log_key(0), log_key(log_id.index + 1));
        self.write_synced(batch)?;
        self.cache.purge(log_id.index);
        Ok(())
    }

    /// The commit index as this node knows it, updated as openraft saves it: a follower has
    /// caught up when its state machine has applied this far.
    pub fn committed(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StResult<Option<T>> {
        let raw = self
            .db
            .get_cf(cf(&self.db, CF_RAFT), key)
            .map_err(read_err)?;
        match raw {
            Some(v) => codec::decode(&v).map(Some).map_err(read_err),
            None => Ok(None),
        }
    }

    fn write_synced(&self, batch: WriteBatch) -> StResult<()> {
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts).map_err(write_err)
    }

    fn last_log_id(&self) -> StResult<Option<LogId>> {
        let mut iter = self.db.iterator_cf(cf(&self.db, CF_LOG), IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (_, v) = item.map_err(read_err)?;
                let entry: Entry = codec::decode(&v).map_err(read_err)?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

/// A log fsync slower than this is logged.
const SLOW_FSYNC: std::time::Duration = std::time::Duration::from_millis(100);

/// The group-commit loop: one `SyncWAL` for every burst of appends, callbacks in order.
/// Runs until every `LogStore` clone is dropped.
fn run_syncer(db: Arc<DB>, rx: mpsc::Receiver<IOFlushed<TypeConfig>>, delay_ms: Arc<AtomicU64>) {
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        let started = std::time::Instant::now();
        let delay = delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_millis(delay));
        }
        let result = db.flush_wal(true);
        let took = started.elapsed();
        // A follower answers an AppendEntries (heartbeats included) only once the fsync of the
        // appends before it is done: one that takes this long shows as a late follower, and
        // on a leader as late commits.
        if took > SLOW_FSYNC {
            tracing::warn!(
                ms = took.as_millis() as u64,
                appends = waiting.len(),
                "slow log fsync"
            );
        }
        for callback in waiting {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::other(e.to_string())),
            };
            callback.io_completed(r);
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StResult<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        let start = start.max(self.first_readable());
        if let Some(entries) = self.cache.get(start, end, usize::MAX) {
            return Ok(entries);
        }
        let key = log_key(start);
        let iter = self.db.iterator_cf(
            cf(&self.db, CF_LOG),
            IteratorMode::From(&key, Direction::Forward),
        );
        let mut entries = Vec::new();
        for item in iter {
            let (k, v) = item.map_err(read_err)?;
            let index = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| read_err("corrupt log key"))?,
            );
            if !range.contains(&index) {
                break;
            }
            entries.push(codec::decode(&v).map_err(read_err)?);
        }
        Ok(entries)
    }

    /// The vote, as the log store saved it (the reader shares the database).
    async fn read_vote(&mut self) -> StResult<Option<Vote>> {
        self.get_meta(VOTE)
    }

    /// What replication sends in one AppendEntries: the entries of `[start, end)` up to
    /// [`MAX_APPEND_BYTES`] encoded (at least one, whatever its size). openraft 0.9 answers
    /// every AppendEntries within one heartbeat or sends it again; a byte bound keeps a loaded
    /// follower able to take each one in time however large the entries (a ScheduleBatch entry
    /// can hold megabytes), where a count bound alone did not.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> StResult<Vec<Entry>> {
        let start = start.max(self.first_readable());
        if let Some(entries) = self.cache.get(start, end, MAX_APPEND_BYTES) {
            return Ok(entries);
        }
        let key = log_key(start);
        let iter = self.db.iterator_cf(
            cf(&self.db, CF_LOG),
            IteratorMode::From(&key, Direction::Forward),
        );
        let (mut entries, mut bytes) = (Vec::new(), 0usize);
        for item in iter {
            let (k, v) = item.map_err(read_err)?;
            let index = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| read_err("corrupt log key"))?,
            );
            if index >= end || (!entries.is_empty() && bytes + v.len() > MAX_APPEND_BYTES) {
                break;
            }
            bytes += v.len();
            entries.push(codec::decode(&v).map_err(read_err)?);
        }
        Ok(entries)
    }
}

/// Most encoded entry bytes one AppendEntries carries (beyond its first entry).
pub const MAX_APPEND_BYTES: usize = 2 << 20;

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StResult<LogState<TypeConfig>> {
        let stored: Option<LogId> = self.get_meta(LAST_PURGED)?;
        let deferred = *self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        let last_purged_log_id = stored.max(deferred);
        // Entries a deferred purge still keeps are behind it.
        let last_log_id = self.last_log_id()?.max(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> StResult<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(cf(&self.db, CF_RAFT), VOTE, codec::encode(vote));
        self.write_synced(batch)
            .map_err(|e| io::Error::other(format!("writing the vote: {e}")))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StResult<()> {
        let index = committed.map_or(0, |c| c.index);
        self.committed.fetch_max(index, Ordering::Relaxed);
        // Not synced: losing it on a crash only delays apply until the leader says it again.
        self.db
            .put_cf(cf(&self.db, CF_RAFT), COMMITTED, codec::encode(&committed))
            .map_err(write_err)
    }

    /// At most what this node can apply: a committed index past both its log and its state
    /// machine is what a crash during a snapshot install leaves (see the invariants).
    async fn read_committed(&mut self) -> StResult<Option<LogId>> {
        let Some(saved) = self.get_meta::<Option<LogId>>(COMMITTED)?.flatten() else {
            return Ok(None);
        };
        let applied = self.applied_index()?;
        let last = self.last_log_id()?;
        if saved.index <= applied || last.is_some_and(|l| saved.index <= l.index) {
            return Ok(Some(saved));
        }
        // The newest id it holds (the last entry, or none: the state machine's own is read by
        // openraft).
        let held = last.filter(|l| l.index >= applied);
        tracing::warn!(
            committed = %saved,
            applied,
            last_log = ?last,
            "the committed index is past this node's log and state machine (a snapshot \
             install was interrupted): starting from what it holds; the leader sends the rest"
        );
        Ok(held)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> StResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if self
            .deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            let next = self.last_log_id()?.map_or(0, |l| l.index + 1);
            if entries.first().is_some_and(|e| e.log_id.index > next) {
                self.settle_before_append().await?;
            }
        }
        let log = cf(&self.db, CF_LOG);
        let mut batch = WriteBatch::default();
        let mut written = Vec::new();
        for entry in entries {
            let bytes = codec::encode(&entry);
            batch.put_cf(log, log_key(entry.log_id.index), &bytes);
            written.push((bytes.len(), entry));
        }
        // Readable now; durable when the syncer calls back.
        self.db.write(batch).map_err(write_err)?;
        self.cache.appended(written);
        if crate::sim::inline() {
            // A simulation: synced and answered here, not at a wall-clock moment on a thread.
            let synced = self
                .db
                .flush_wal(true)
                .map_err(|e| io::Error::other(e.to_string()));
            callback.io_completed(synced);
            return Ok(());
        }
        self.syncer
            .queue
            .as_ref()
            .expect("the queue lives as long as the syncer")
            .send(callback)
            .map_err(|_| write_err(io::Error::other("log syncer stopped")))
    }

    /// Deletes every entry after `last_log_id` (all of them when `None`).
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> StResult<()> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        self.cache.truncate(from);
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(cf(&self.db, CF_LOG), log_key(from), log_key(u64::MAX));
        batch.delete_cf(cf(&self.db, CF_LOG), log_key(u64::MAX));
        self.write_synced(batch).inspect_err(|_| {
            // The log may still hold what the cache dropped: a cache that is not a suffix of
            // the log must not answer.
            self.cache.truncate(0);
        })
    }

    async fn purge(&mut self, log_id: LogId) -> StResult<()> {
        self.purge_or_defer(log_id)
    }
}
