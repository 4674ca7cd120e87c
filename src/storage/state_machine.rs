//! The replicated state machine: openraft's `RaftStateMachine` over the `timers`, `wheel` and
//! `meta` column families.
//!
//! Invariants:
//! - Entries are written in WriteBatches holding their effects *and* the new `last_applied`
//!   (and membership), so restart resumes exactly after the last applied entry: no entry is
//!   applied twice and no timer fires twice across a crash. One batch holds as many
//!   consecutive entries of an apply call as it can (see `Group`); a Fire entry has its own.
//! - Apply never reads a clock (see `apply`); the in-memory `SmMeta` mirrors what is on disk.
//! - The bucket width is fixed when the database is created: a node refuses to reopen it with
//!   a different one, because replicas with different widths would write different keys.

use std::collections::HashMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use rocksdb::WriteBatch;

use super::apply::Applier;
use super::meta::{self, SmMeta};
use super::snapshot::{self, SnapshotBuilder};
use super::{cf, codec, Store, CF_META};
use crate::cluster::{FireSignal, TypeConfig};
use crate::namespace::Policy;
use crate::timer::{Command, Response, Timer, TimerKey};
use crate::{Error, Result};

type StResult<T> = std::result::Result<T, StorageError<u64>>;

/// The state machine openraft drives.
pub struct StateMachine {
    pub(super) store: Store,
    pub(super) meta: SmMeta,
    signal: Arc<FireSignal>,
    snapshot_dir: PathBuf,
}

impl StateMachine {
    /// Opens the state machine on `store`, keeping snapshots under `data_dir/snapshot`.
    pub fn open(store: Store, data_dir: &Path, signal: Arc<FireSignal>) -> Result<Self> {
        check_bucket_width(&store)?;
        let meta = SmMeta::load(store.db())?;
        let snapshot_dir = data_dir.join("snapshot");
        std::fs::create_dir_all(&snapshot_dir)?;
        Ok(StateMachine {
            store,
            meta,
            signal,
            snapshot_dir,
        })
    }

    /// Applies one entry's effects into `group`, advancing `next` (the metadata as of the
    /// group's last entry). Nothing is written yet: see `flush`.
    fn apply_entry(
        &self,
        entry: Entry<TypeConfig>,
        group: &mut Group,
        next: &mut SmMeta,
    ) -> Result<Response> {
        group.entries += 1;
        next.last_applied = Some(entry.log_id);
        let cmd = match entry.payload {
            EntryPayload::Blank => return Ok(Response::None),
            EntryPayload::Membership(m) => {
                next.membership = StoredMembership::new(Some(entry.log_id), m);
                group.membership_changed = true;
                return Ok(Response::None);
            }
            EntryPayload::Normal(cmd) => cmd,
        };
        let staged = (!writes_alone(&cmd)).then_some(&mut group.staged);
        let mut applier = Applier {
            db: self.store.db(),
            wheel: self.store.wheel(),
            batch: &mut group.batch,
            progress: &mut next.progress,
            index: entry.log_id.index,
            earliest_new_due: None,
            made_ready: false,
            policies: &mut group.policies,
            staged,
        };
        let response = applier.command(cmd)?;
        let (due, ready) = (applier.earliest_new_due, applier.made_ready);
        group.earliest_new_due = match (group.earliest_new_due, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        group.made_ready |= ready;
        Ok(response)
    }

    /// Writes the group's effects and `next` (its last entry's applied id and progress) in one
    /// WriteBatch, then wakes the fire driver and dispatcher if the group gave them work.
    fn flush(&mut self, group: &mut Group, next: &SmMeta) -> Result<()> {
        if group.entries == 0 {
            return Ok(());
        }
        let Group {
            mut batch,
            membership_changed,
            earliest_new_due,
            made_ready,
            ..
        } = std::mem::take(group);
        next.stage(self.store.db(), &mut batch, membership_changed);
        self.store.db().write(batch)?;
        self.meta = next.clone();
        if let Some(due) = earliest_new_due {
            self.signal.scheduled(due);
        }
        if made_ready {
            self.signal.made_ready();
        }
        Ok(())
    }
}

/// Consecutive entries' effects, gathered for one WriteBatch: one write per apply call instead
/// of one per entry when openraft hands over many small entries at once.
#[derive(Default)]
struct Group {
    batch: WriteBatch,
    /// Timers written by the group so far (`None`: deleted), read before the database.
    staged: HashMap<TimerKey, Option<Timer>>,
    policies: HashMap<String, Policy>,
    entries: usize,
    membership_changed: bool,
    earliest_new_due: Option<i64>,
    made_ready: bool,
}

impl Group {
    /// Bounds the memory a group holds: a burst of 10,000-timer batches is written in parts.
    fn is_full(&self) -> bool {
        self.batch.size_in_bytes() >= GROUP_MAX_BYTES || self.staged.len() >= GROUP_MAX_TIMERS
    }
}

const GROUP_MAX_BYTES: usize = 32 << 20;
const GROUP_MAX_TIMERS: usize = 100_000;

/// A Fire entry scans the wheel, which sees only written batches, so it starts a batch of its
/// own; and as it writes up to 10,000 timers it is written at once, without staging copies.
fn writes_alone(cmd: &Command) -> bool {
    matches!(cmd, Command::Fire { .. })
}

/// Records the bucket width on first open; refuses a different one later.
fn check_bucket_width(store: &Store) -> Result<()> {
    let db = store.db();
    let width = store.wheel().width_ms();
    match db.get_cf(cf(db, CF_META), meta::BUCKET_MS)? {
        Some(v) => {
            let stored: u64 = codec::decode(&v)?;
            if stored != width {
                return Err(Error::InvalidArgument(format!(
                    "data dir was created with bucket width {stored} ms, not {width} ms"
                )));
            }
        }
        None => db.put_cf(cf(db, CF_META), meta::BUCKET_MS, codec::encode(&width))?,
    }
    Ok(())
}

fn sm_err(e: Error) -> StorageError<u64> {
    StorageIOError::<u64>::write_state_machine(&e).into()
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StResult<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>)> {
        Ok((self.meta.last_applied, self.meta.membership.clone()))
    }

    // openraft fixes the (large) error type the closure returns.
    #[allow(clippy::result_large_err)]
    async fn apply<I>(&mut self, entries: I) -> StResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        off_the_runtime(|| {
            let mut responses = Vec::new();
            let mut group = Group::default();
            let mut next = self.meta.clone();
            for entry in entries {
                let log_id = entry.log_id;
                let fatal = |e: Error| {
                    tracing::error!(%log_id, error = %e, "apply failed; the node must stop");
                    StorageError::from(StorageIOError::apply(log_id, &e))
                };
                let alone = matches!(&entry.payload, EntryPayload::Normal(c) if writes_alone(c));
                if alone {
                    self.flush(&mut group, &next).map_err(fatal)?;
                }
                let response = self.apply_entry(entry, &mut group, &mut next);
                responses.push(response.map_err(fatal)?);
                if alone || group.is_full() {
                    self.flush(&mut group, &next).map_err(fatal)?;
                }
            }
            self.flush(&mut group, &next).map_err(sm_err)?;
            Ok(responses)
        })
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder::new(self.store.db().clone(), self.snapshot_dir.clone())
    }

    async fn begin_receiving_snapshot(&mut self) -> StResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StResult<()> {
        let data = snapshot.into_inner();
        snapshot::install(self.store.db(), &data).map_err(sm_err)?;
        snapshot::save(&self.snapshot_dir, meta, &data).map_err(sm_err)?;
        self.meta = SmMeta::load(self.store.db()).map_err(sm_err)?;
        tracing::info!(last = ?meta.last_log_id, bytes = data.len(), "installed snapshot");
        // The wheel may hold earlier timers now: let a sleeping driver look again.
        self.signal.scheduled(i64::MIN);
        self.signal.made_ready();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StResult<Option<Snapshot<TypeConfig>>> {
        snapshot::load(&self.snapshot_dir).map_err(sm_err)
    }
}

/// Runs `f`, synchronous RocksDB work that can take milliseconds (a Fire entry of 10,000
/// timers), without holding up the tasks queued behind it on this worker thread: on a
/// multi-threaded runtime the worker first hands them to another thread. Without it, on a
/// loaded 2-core machine, a follower's apply delayed its answers to heartbeats past their
/// 100 ms timeout and leadership moved for no fault.
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
