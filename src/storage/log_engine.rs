//! The node's one log engine: every Raft group's log in one tikv `raft-engine`, one group-commit
//! syncer (docs/log-engine.md).
//!
//! A node hosts many Raft groups (issue 36). Each group's cores appending and fsyncing on their
//! own would multiply the fsyncs of a shared disk by the number of groups; here every group's
//! appends go into raft-engine's one append-only file queue, and one synced write per round
//! answers the appends of all groups queued before it. [`LogEngine::group`] hands out a
//! group's [`LogStore`] (openraft's `RaftLogStorage`), a cheap handle on the engine.
//!
//! Why raft-engine and not the state machine's RocksDB (as before): at 64 groups it took ×2.3
//! the appends and wrote each byte once where RocksDB wrote it to its WAL and again to L0
//! (log-engine.md has the figures). What that gives up, and how it is given back: the state
//! machine's writes no longer ride the log's fsync. They stay unsynced in their own WAL (a
//! crash loses at most what the log re-applies), except that a purge first syncs the state
//! database: a log is never purged past what the state machine holds on disk.
//!
//! Layout in raft-engine: `log_format.rs` (entries in one region per group, records in
//! another, so clearing a group's entries never touches its vote). Nothing here is in a
//! state-machine family, so no snapshot or backup carries it from one node to another.
//!
//! Invariants:
//! - An append's callback runs only after a synced write that started after the append's
//!   write (DESIGN 5). Callbacks run in the order their appends were queued: openraft needs
//!   append order within a group, and one FIFO for all groups keeps it for each.
//! - A failed fsync stops the process. raft-engine panics on one, on the thread that led the
//!   write group, *after* handing the group's other writers their `Ok`: a vote written in the
//!   same group would be granted without being on disk. So any panic raised in raft-engine's
//!   code aborts the process before it unwinds ([`abort_on_engine_panic`]): crash-stop, and the
//!   restart reads what the disk really holds.
//! - raft-engine also panics on an append that would leave a hole or overwrite purged entries;
//!   [`LogEngine::write`] refuses both with an error first, so a Raft bug stops the group
//!   with a message instead of aborting the node.
//! - A node's log and its state database belong together: each records the same random id
//!   ([`NODE_LOG_ID`]), and a state database whose log lacks it (the log directory lost,
//!   emptied or replaced) is refused at start: the node would have no vote and could vote
//!   twice in one term.
//! - Writes of one group never touch another group's regions.
//! - A purge syncs the state database's WAL before it records the purge (see above).
//! - Directories of earlier builds (the log in RocksDB) are moved here before openraft starts
//!   (`log_migrate.rs`); a build before this one cannot open a moved directory.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};

use protobuf::well_known_types::BytesValue;
use raft_engine::{Command, Config, Engine, LogBatch, MessageExt, ReadableSize};
use rocksdb::DB;

use super::log_cache::LogCache;
use super::log_format::{raw_entry, Raw, RECORDS, SYNC_REGION};
pub use super::log_format::{GroupId, COMMITTED, GROUP0, LAST_PURGED, LOG_DIR, NODE_LOG_ID, VOTE};
use crate::raft_types::LogId;

/// What the syncer calls once an append is durable (or the sync failed).
pub type Flushed = Box<dyn FnOnce(io::Result<()>) + Send>;

/// See the module documentation. Dropped with the last handle on it (every group's store): it
/// closes the syncer's queue and joins its thread, then closes raft-engine.
pub struct LogEngine {
    pub(super) log: Arc<Engine>,
    /// The state machine's database: synced before a purge, read for the applied index.
    pub(super) db: Arc<DB>,
    queue: Option<mpsc::Sender<Flushed>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Extra ms every sync takes first: a slow disk, for tests (0: none).
    fsync_delay_ms: Arc<AtomicU64>,
    /// Each open group's shared state, so two handles on one group share one cache.
    pub(super) groups: Mutex<HashMap<GroupId, Weak<GroupState>>>,
    /// Synced writes done by the syncer since the engine started (tests count rounds).
    fsyncs: Arc<AtomicU64>,
}

/// What the handles on one group share.
#[derive(Default)]
pub struct GroupState {
    /// The latest commit index openraft told this store (0: none yet), for health checks.
    pub(super) committed: Arc<AtomicU64>,
    /// The newest entries, decoded.
    pub(super) cache: LogCache,
    /// A purge openraft asked for past the state machine's applied index (see log_store.rs).
    pub(super) deferred: std::sync::Mutex<Option<LogId>>,
}

impl Drop for LogEngine {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            // Finishes at most the sync in progress.
            let _ = thread.join();
        }
    }
}

/// raft-engine's settings for a node's log.
fn config(dir: &Path) -> Config {
    Config {
        dir: dir.to_string_lossy().into_owned(),
        // Entries are mostly small; the large ones (ScheduleBatch) are payloads clients chose.
        // RocksDB's WAL compressed nothing either, and compressing costs the append path.
        batch_compression_threshold: ReadableSize(0),
        // Files are 64 MiB. Once they hold more than 2 GiB, the reclaimer deletes those whose
        // entries every group has purged (and rewrites the live entries of old files into
        // raft-engine's rewrite queue): purged entries cost at most that much disk, where the
        // default (10 GB) kept up to 10 GB. Not lower: a log between snapshots (50,000
        // entries) can itself hold gigabytes of batches, and each reclaim above the threshold
        // makes raft-engine consider rewriting them.
        target_file_size: ReadableSize::mb(64),
        purge_threshold: ReadableSize::gb(2),
        ..Default::default()
    }
}

impl LogEngine {
    /// The engine of the node whose state database is `db` (opened by `storage::open_db`):
    /// raft-engine opened under the data directory beside it, earlier builds' logs moved in,
    /// the syncer thread started.
    pub fn open(db: Arc<DB>) -> crate::Result<Arc<Self>> {
        abort_on_engine_panic();
        let data_dir = db
            .path()
            .parent()
            .ok_or_else(|| crate::Error::Storage("the database has no data directory".into()))?
            .to_path_buf();
        let dir = data_dir.join(LOG_DIR);
        let log = Engine::open(config(&dir)).map_err(|e| {
            crate::Error::Storage(format!("opening the raft log in {}: {e}", dir.display()))
        })?;
        // raft-engine fsyncs its files, not the directories naming them: without this a power
        // loss could lose a new `raft-log/` whose files were durable.
        for d in [&dir, &data_dir] {
            std::fs::File::open(d)?.sync_all()?;
        }
        let log = Arc::new(log);
        super::log_migrate::into_raft_engine(&db, &log)?;
        pair_with_state(&db, &log, &data_dir)?;
        let (tx, rx) = mpsc::channel();
        let fsync_delay_ms = Arc::new(AtomicU64::new(0));
        let fsyncs = Arc::new(AtomicU64::new(0));
        let syncer = Syncer {
            log: log.clone(),
            delay_ms: fsync_delay_ms.clone(),
            fsyncs: fsyncs.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("timerdb-log-sync".into())
            .spawn(move || syncer.run(rx))
            .map_err(|e| crate::Error::Storage(format!("spawning the log syncer: {e}")))?;
        Ok(Arc::new(LogEngine {
            log,
            db,
            queue: Some(tx),
            thread: Some(thread),
            fsync_delay_ms,
            groups: Mutex::default(),
            fsyncs,
        }))
    }

    /// How many synced writes the syncer has done (each answers every append queued before it).
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }

    /// Makes every log sync take `ms` longer (0: as the disk is): a disk stalled by its
    /// neighbours' writeback, for tests of what a slow follower costs the cluster.
    pub fn fsync_delay_ms(&self) -> Arc<AtomicU64> {
        self.fsync_delay_ms.clone()
    }

    /// Bytes of log files on disk (every group's entries, live or not yet reclaimed).
    pub fn used_bytes(&self) -> u64 {
        self.log.get_used_size() as u64
    }

    /// Writes `group`'s encoded entries `(index, bytes)` unsynced: readable when this returns,
    /// durable once a [`when_durable`](Self::when_durable) queued after it is called back. The
    /// entries must be consecutive and continue the log (or overwrite its suffix): a hole, or
    /// an entry at or below the purge point, is refused (raft-engine would panic).
    pub fn write<'a>(
        &self,
        group: GroupId,
        entries: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> io::Result<()> {
        let raw = entries
            .into_iter()
            .map(|(index, bytes)| raw_entry(index, bytes))
            .collect();
        self.write_raw(group, raw)
    }

    /// [`write`](Self::write) of entries already in raft-engine's form (`log_format::
    /// entry_value`): the append path, which encodes each entry once, straight into it.
    pub fn write_raw(&self, group: GroupId, raw: Vec<BytesValue>) -> io::Result<()> {
        let Some(first) = raw.first().map(Raw::index) else {
            return Ok(());
        };
        if raw
            .iter()
            .map(Raw::index)
            .ne(first..first + raw.len() as u64)
        {
            return Err(write_err("the entries of one append are not consecutive"));
        }
        let region = u64::from(group);
        if let (Some(oldest), Some(last)) =
            (self.log.first_index(region), self.log.last_index(region))
        {
            if first < oldest || first > last + 1 {
                return Err(write_err(format!(
                    "group {group}: an append at {first} would leave a hole or overwrite \
                     purged entries (the log holds {oldest}..={last})"
                )));
            }
        }
        let mut batch = LogBatch::with_capacity(1);
        batch.add_entries::<Raw>(region, &raw).map_err(write_err)?;
        self.log.write(&mut batch, false).map_err(write_err)?;
        Ok(())
    }

    /// Calls `done` once every write made before this call is durable: after the syncer's next
    /// synced write, which covers the writes of every group queued with it.
    pub fn when_durable(&self, done: Flushed) -> io::Result<()> {
        if crate::sim::inline() {
            // A simulation: synced and answered here, not at a wall-clock moment on a thread.
            done(sync(&self.log));
            return Ok(());
        }
        self.queue
            .as_ref()
            .expect("the queue lives as long as the engine")
            .send(done)
            .map_err(|_| write_err("log syncer stopped"))
    }

    /// Deletes `group`'s entries up to `upto` inclusive and records `last_purged` (encoded),
    /// in one synced write, after syncing the state database (a log is never purged past
    /// what the state machine holds on disk). The files are reclaimed later, by the syncer
    /// thread between rounds ([`RECLAIM_EVERY`]).
    pub fn purge(&self, group: GroupId, upto: u64, last_purged: &[u8]) -> io::Result<()> {
        self.db
            .flush_wal(true)
            .map_err(|e| write_err(format!("syncing the state before a purge: {e}")))?;
        let mut batch = LogBatch::default();
        batch.add_command(
            u64::from(group),
            Command::Compact {
                index: upto.saturating_add(1),
            },
        );
        batch
            .put(
                RECORDS | u64::from(group),
                LAST_PURGED.to_vec(),
                last_purged.to_vec(),
            )
            .map_err(write_err)?;
        self.log.write(&mut batch, true).map_err(write_err)?;
        Ok(())
    }

    /// Deletes `group`'s entries from `from` on, in one synced write. raft-engine has no
    /// truncation of its own: the entry before `from` is written again (an append overwrites
    /// the suffix after it), or the group's entries are cleared when none is kept.
    pub fn truncate(&self, group: GroupId, from: u64) -> io::Result<()> {
        let region = u64::from(group);
        let (Some(oldest), Some(last)) =
            (self.log.first_index(region), self.log.last_index(region))
        else {
            return Ok(());
        };
        if from > last {
            return Ok(());
        }
        let mut batch = LogBatch::default();
        if from > oldest {
            let kept = self
                .log
                .get_entry::<Raw>(region, from - 1)
                .map_err(read_err)?
                .ok_or_else(|| read_err(format!("group {group}: entry {} missing", from - 1)))?;
            batch
                .add_entries::<Raw>(region, &[kept])
                .map_err(write_err)?;
        } else {
            batch.add_command(region, Command::Clean);
        }
        self.log.write(&mut batch, true).map_err(write_err)?;
        Ok(())
    }

    /// `[start, end)` clipped to what `region` holds; `None` when nothing of it is held.
    fn held(&self, region: u64, start: u64, end: u64) -> Option<(u64, u64)> {
        let oldest = self.log.first_index(region)?;
        let last = self.log.last_index(region)?;
        let (start, end) = (start.max(oldest), end.min(last.saturating_add(1)));
        (start < end).then_some((start, end))
    }

    /// `group`'s stored entries in `[start, end)` (clipped to what the log holds), as `(index,
    /// bytes)`, up to `max_bytes` (at least one entry whatever its size).
    pub fn read(
        &self,
        group: GroupId,
        start: u64,
        end: u64,
        max_bytes: Option<usize>,
    ) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let region = u64::from(group);
        let Some((start, end)) = self.held(region, start, end) else {
            return Ok(Vec::new());
        };
        let mut raw = Vec::new();
        if let Err(e) = self
            .log
            .fetch_entries_to::<Raw>(region, start, end, max_bytes, &mut raw)
        {
            // A purge or truncation between the bounds read above and this read: once more,
            // with the bounds it left.
            tracing::debug!(error = %e, group, "log read raced a purge; reading again");
            raw.clear();
            if let Some((start, end)) = self.held(region, start, end) {
                self.log
                    .fetch_entries_to::<Raw>(region, start, end, max_bytes, &mut raw)
                    .map_err(read_err)?;
            }
        }
        raw.into_iter()
            .map(|mut e| {
                let index = Raw::index(&e);
                if e.value.len() < 8 {
                    return Err(read_err("an entry shorter than its index"));
                }
                let mut bytes = std::mem::take(&mut e.value);
                bytes.drain(..8);
                Ok((index, bytes))
            })
            .collect()
    }

    /// `group`'s newest stored entry's bytes.
    pub fn last(&self, group: GroupId) -> io::Result<Option<Vec<u8>>> {
        match self.log.last_index(u64::from(group)) {
            None => Ok(None),
            Some(last) => Ok(self
                .read(group, last, last + 1, None)?
                .pop()
                .map(|(_, bytes)| bytes)),
        }
    }

    /// `group`'s record `name`.
    pub fn record(&self, group: GroupId, name: &[u8]) -> Option<Vec<u8>> {
        self.log.get(RECORDS | u64::from(group), name)
    }

    /// Writes `group`'s record `name`; synced when `synced`, else durable with the next sync.
    pub fn put_record(
        &self,
        group: GroupId,
        name: &[u8],
        value: Vec<u8>,
        synced: bool,
    ) -> io::Result<()> {
        let mut batch = LogBatch::default();
        batch
            .put(RECORDS | u64::from(group), name.to_vec(), value)
            .map_err(write_err)?;
        self.log.write(&mut batch, synced).map_err(write_err)?;
        Ok(())
    }
}

/// One synced write: makes every earlier write of every group durable.
fn sync(log: &Engine) -> io::Result<()> {
    let mut batch = LogBatch::default();
    batch
        .put(SYNC_REGION, b"sync".to_vec(), Vec::new())
        .map_err(write_err)?;
    // A failed fsync panics in raft-engine and aborts the process (the invariants); an error
    // here is this write's own (its append failed), and the next round's sync covers the
    // earlier writes again.
    log.write(&mut batch, true).map_err(write_err)?;
    Ok(())
}

/// Makes any panic raised in raft-engine's code abort the process before it unwinds (see the
/// invariants: its fsync panic has already answered other writers `Ok`). Installed once;
/// other panics go to the hook that was there before.
fn abort_on_engine_panic() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_engine = info
                .location()
                .is_some_and(|l| l.file().contains("raft-engine-"));
            previous(info);
            if in_engine {
                eprintln!("timerd: the raft log failed (above); stopping the node at once");
                std::process::abort();
            }
        }));
    });
}

/// Checks that `log` is this state database's log, by the id both record ([`NODE_LOG_ID`]),
/// and records a new id in both when neither has one (a new node, or an earlier build's
/// directory). Refuses a state database whose id the log does not hold.
fn pair_with_state(db: &DB, log: &Engine, data_dir: &Path) -> crate::Result<()> {
    let raft = super::cf(db, super::CF_RAFT);
    let in_state = db.get_cf(raft, NODE_LOG_ID)?;
    let in_log = log.get(SYNC_REGION, NODE_LOG_ID);
    match (in_state, in_log) {
        (Some(state), Some(log)) if state == log => Ok(()),
        (Some(_), found) => Err(crate::Error::Storage(format!(
            "{}: the state database belongs to another Raft log than the one in {LOG_DIR}/              ({}): the node would start without its vote and could vote twice in one term.              Restore the directory whole, or remove the node and add it again with an empty              data directory",
            data_dir.display(),
            if found.is_some() { "a different log" } else { "the log is missing or empty" }
        ))),
        (None, found) => {
            // A log with an id and a state database without one: the first start of this
            // build stopped between the two writes below. Otherwise a new id, the log's first.
            let id = match found {
                Some(id) => id,
                None => {
                    let id = rand::random::<u64>().to_be_bytes().to_vec();
                    let mut batch = LogBatch::default();
                    batch
                        .put(SYNC_REGION, NODE_LOG_ID.to_vec(), id.clone())
                        .map_err(write_err)?;
                    log.write(&mut batch, true).map_err(write_err)?;
                    id
                }
            };
            db.put_cf_opt(raft, NODE_LOG_ID, id, &super::synced())?;
            Ok(())
        }
    }
}

pub(super) fn read_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("reading the raft log: {e}"))
}

pub(super) fn write_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("writing the raft log: {e}"))
}

/// A log sync slower than this is logged.
const SLOW_FSYNC: std::time::Duration = std::time::Duration::from_millis(100);

/// How often the syncer reclaims log files every group has purged (raft-engine deletes none by
/// itself). Off the append path: a reclaim may rewrite live entries of old files.
const RECLAIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The group-commit loop's state.
struct Syncer {
    log: Arc<Engine>,
    delay_ms: Arc<AtomicU64>,
    fsyncs: Arc<AtomicU64>,
}

impl Syncer {
    /// One synced write for every burst of appends (of every group), callbacks in queue order.
    /// Runs until the engine is dropped.
    fn run(self, rx: mpsc::Receiver<Flushed>) {
        let mut reclaimed = std::time::Instant::now();
        loop {
            if reclaimed.elapsed() >= RECLAIM_EVERY {
                if let Err(e) = self.log.purge_expired_files() {
                    tracing::warn!(error = %e, "reclaiming purged log files failed");
                }
                reclaimed = std::time::Instant::now();
            }
            let first = match rx.recv_timeout(RECLAIM_EVERY) {
                Ok(first) => first,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let mut waiting = vec![first];
            waiting.extend(rx.try_iter());
            let started = std::time::Instant::now();
            let delay = self.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                std::thread::sleep(std::time::Duration::from_millis(delay));
            }
            let result = sync(&self.log);
            if let Err(e) = &result {
                tracing::error!(error = %e, "the raft log could not be synced");
            }
            self.fsyncs.fetch_add(1, Ordering::Relaxed);
            let took = started.elapsed();
            // A follower answers an AppendEntries only once the sync of the appends before it
            // is done: one that takes this long shows as a late follower, and on a leader as
            // late commits.
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
}
