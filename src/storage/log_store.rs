//! One Raft group's log and vote: openraft's `RaftLogStorage` over the node's [`LogEngine`],
//! which keys the group's entries and records by its id (`log_engine.rs`).
//!
//! Invariants:
//! - openraft hears an append is done (the `LogFlushed` callback) only after the entries are
//!   fsynced; votes, truncations and purges are fsynced before their call returns (DESIGN 5).
//! - Appended entries are readable as soon as `append` returns (written to the log engine
//!   unsynced, then synced in the background), as openraft's contract asks.
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
//! decoded entries when it holds them; the log engine answers the rest.
//!
//! Group commit: the engine's syncer thread takes every callback queued since its last fsync
//! (of every group) and answers them all after one synced write, so many concurrent appends
//! cost one fsync. Callbacks are answered in append order, which openraft requires.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::log_engine::{
    read_err, write_err, GroupId, GroupState, LogEngine, COMMITTED, LAST_PURGED, VOTE,
};
use super::meta::LAST_APPLIED;
use super::{cf, codec, CF_META};
use crate::raft_types::{Entry, LogId, TypeConfig, Vote};

type StResult<T> = io::Result<T>;

/// How long an append waits for a snapshot install to finish before it fails.
const INSTALL_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One group's log store: a handle on the node's [`LogEngine`]; cheap to clone (clones, and
/// every handle the engine gives out on the same group, share the group's state).
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<LogEngine>,
    group: GroupId,
    state: Arc<GroupState>,
}

impl LogEngine {
    /// `group`'s log store. Handles on one group share its state (its cache of decoded
    /// entries, its deferred purge), however many are taken.
    pub fn group(self: &Arc<Self>, group: GroupId) -> LogStore {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.retain(|_, g| g.strong_count() > 0);
        let state = match groups.get(&group).and_then(std::sync::Weak::upgrade) {
            Some(state) => state,
            None => {
                let state = Arc::new(GroupState::default());
                groups.insert(group, Arc::downgrade(&state));
                state
            }
        };
        LogStore {
            engine: self.clone(),
            group,
            state,
        }
    }
}

impl LogStore {
    /// The log store of group 0 over a new engine on `db`, for tests (a node makes one engine
    /// and takes its groups from it: two engines on one database would each cache group 0).
    #[cfg(test)]
    pub fn new(db: Arc<rocksdb::DB>) -> Self {
        LogEngine::open(db)
            .expect("open the log engine")
            .group(super::GROUP0)
    }

    /// Writes `entries` as `append` writes them, without the callback only openraft can make
    /// (tests write logs directly).
    #[cfg(test)]
    pub(crate) fn write_stored(&self, entries: &[Entry]) {
        let encoded: Vec<(u64, Vec<u8>)> = entries
            .iter()
            .map(|e| (e.log_id.index, codec::encode(e)))
            .collect();
        self.engine
            .write(self.group, encoded.iter().map(|(i, b)| (*i, b.as_slice())))
            .expect("write the log");
    }

    /// The indexes the log holds on disk (a deferred purge's entries included).
    #[cfg(test)]
    pub(crate) fn stored_indexes(&self) -> Vec<u64> {
        self.engine
            .read(self.group, 0, u64::MAX, None)
            .expect("read the log")
            .into_iter()
            .map(|(i, _)| i)
            .collect()
    }

    /// The engine this store is a handle on.
    #[cfg(test)]
    pub(crate) fn engine(&self) -> &Arc<LogEngine> {
        &self.engine
    }

    /// Makes every log fsync of this store's engine take `ms` longer (0: as the disk is): a
    /// disk stalled by its neighbours' writeback, for tests of what a slow follower costs.
    pub fn fsync_delay_ms(&self) -> Arc<AtomicU64> {
        self.engine.fsync_delay_ms()
    }

    /// Bytes of log files on disk, every group's (the engine's files are shared).
    pub fn used_bytes(&self) -> u64 {
        self.engine.used_bytes()
    }

    fn db(&self) -> &rocksdb::DB {
        &self.engine.db
    }

    /// The index the group's state machine has applied (it shares the database: the group's
    /// `last_applied` in `meta`).
    fn applied_index(&self) -> StResult<u64> {
        let space = crate::keys::Group::try_from(self.group)
            .map(crate::keys::Space::of)
            .map_err(|_| read_err(format!("group {} has no state keys", self.group)))?;
        let raw = self
            .db()
            .get_cf(cf(self.db(), CF_META), space.meta_key(LAST_APPLIED))
            .map_err(read_err)?;
        let applied: Option<LogId> = match raw {
            Some(v) => codec::decode(&v).map_err(read_err)?,
            None => None,
        };
        Ok(applied.map_or(0, |l| l.index))
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, Option<LogId>> {
        self.state
            .deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Purges up to `log_id` now if the state machine has applied that far, else defers it.
    fn purge_or_defer(&self, log_id: LogId) -> StResult<()> {
        let mut deferred = self.deferred();
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
        self.deferred().map_or(0, |d| d.index + 1)
    }

    /// Waits until no purge is deferred any more: the state machine has installed the snapshot
    /// the purge was asked for, and the purge is done (see the invariants). Gives up with an
    /// error after [`INSTALL_WAIT`] (an install that failed stops Raft, and this lets the core
    /// see it).
    pub(crate) async fn settle_before_append(&self) -> StResult<()> {
        let started = tokio::time::Instant::now();
        loop {
            self.settle_deferred()?;
            let Some(upto) = *self.deferred() else {
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
        let pending = *self.deferred();
        match pending {
            Some(upto) => self.purge_or_defer(upto),
            None => Ok(()),
        }
    }

    fn purge_now(&self, log_id: LogId) -> StResult<()> {
        self.engine
            .purge(self.group, log_id.index, &codec::encode(&log_id))?;
        self.state.cache.purge(log_id.index);
        Ok(())
    }

    /// The commit index as this node knows it, updated as openraft saves it: a follower has
    /// caught up when its state machine has applied this far.
    pub fn committed(&self) -> Arc<AtomicU64> {
        self.state.committed.clone()
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, name: &[u8]) -> StResult<Option<T>> {
        match self.engine.record(self.group, name) {
            Some(v) => codec::decode(&v).map(Some).map_err(read_err),
            None => Ok(None),
        }
    }

    fn last_log_id(&self) -> StResult<Option<LogId>> {
        match self.engine.last(self.group)? {
            None => Ok(None),
            Some(v) => {
                let entry: Entry = codec::decode(&v).map_err(read_err)?;
                Ok(Some(entry.log_id))
            }
        }
    }

    /// Stored entries of `[start, end)`, up to `max_bytes` encoded (at least one).
    fn read_stored(&self, start: u64, end: u64, max_bytes: Option<usize>) -> StResult<Vec<Entry>> {
        self.engine
            .read(self.group, start, end, max_bytes)?
            .iter()
            .map(|(_, bytes)| codec::decode(bytes).map_err(read_err))
            .collect()
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
        if let Some(entries) = self.state.cache.get(start, end, usize::MAX) {
            return Ok(entries);
        }
        self.read_stored(start, end, None)
    }

    /// The vote, as the log store saved it (the reader shares the database).
    async fn read_vote(&mut self) -> StResult<Option<Vote>> {
        self.get_meta(VOTE)
    }

    /// What replication sends in one AppendEntries: the entries of `[start, end)` up to
    /// [`MAX_APPEND_BYTES`] encoded (at least one, whatever its size). openraft sends an
    /// AppendEntries again when it is not answered in time (`cluster::network::append_ttl`);
    /// a byte bound keeps a loaded follower able to take each one in time however large the
    /// entries (a ScheduleBatch entry can hold megabytes), where a count bound alone did not.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> StResult<Vec<Entry>> {
        let start = start.max(self.first_readable());
        if let Some(entries) = self.state.cache.get(start, end, MAX_APPEND_BYTES) {
            return Ok(entries);
        }
        self.read_stored(start, end, Some(MAX_APPEND_BYTES))
    }
}

/// `(index, bytes)` pairs as [`LogEngine::write`] takes them.
fn pairs(encoded: &[(u64, Vec<u8>)]) -> impl Iterator<Item = (u64, &[u8])> {
    encoded.iter().map(|(i, b)| (*i, b.as_slice()))
}

/// Most encoded entry bytes one AppendEntries carries (beyond its first entry).
pub const MAX_APPEND_BYTES: usize = 2 << 20;

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StResult<LogState<TypeConfig>> {
        let stored: Option<LogId> = self.get_meta(LAST_PURGED)?;
        let deferred = *self.deferred();
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
        self.engine
            .put_record(self.group, VOTE, codec::encode(vote), true)
            .map_err(|e| io::Error::other(format!("writing the vote: {e}")))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StResult<()> {
        let index = committed.map_or(0, |c| c.index);
        self.state.committed.fetch_max(index, Ordering::Relaxed);
        // Not synced: losing it on a crash only delays apply until the leader says it again.
        self.engine
            .put_record(self.group, COMMITTED, codec::encode(&committed), false)
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
        if self.deferred().is_some() {
            let next = self.last_log_id()?.map_or(0, |l| l.index + 1);
            if entries.first().is_some_and(|e| e.log_id.index > next) {
                self.settle_before_append().await?;
            }
        }
        let encoded: Vec<(u64, Vec<u8>)> = entries
            .iter()
            .map(|e| (e.log_id.index, codec::encode(e)))
            .collect();
        // On the calling worker, though it may wait behind a sync in progress (raft-engine's
        // write group): handed to the blocking pool instead, Schedule x200 lost 11 % (4 runs
        // side by side, 10,039 against 11,218/s; inline 11,178 against 11,510).
        self.engine.write(self.group, pairs(&encoded))?;
        let encoded: Vec<Vec<u8>> = encoded.into_iter().map(|(_, b)| b).collect();
        // Readable now (from the cache too, before openraft can hear the append is durable);
        // durable when the syncer calls back.
        self.state
            .cache
            .appended(encoded.iter().map(Vec::len).zip(entries));
        self.engine
            .when_durable(Box::new(move |r| callback.io_completed(r)))
    }

    /// Deletes every entry after `last_log_id` (all of them when `None`).
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> StResult<()> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        self.state.cache.truncate(from);
        self.engine.truncate(self.group, from).inspect_err(|_| {
            // The log may still hold what the cache dropped: a cache that is not a suffix of
            // the log must not answer.
            self.state.cache.truncate(0);
        })
    }

    async fn purge(&mut self, log_id: LogId) -> StResult<()> {
        self.purge_or_defer(log_id)
    }
}
