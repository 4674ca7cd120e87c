//! The replicated state machine: openraft's `RaftStateMachine` over the `timers`, `wheel` and
//! `meta` column families.
//!
//! Invariants:
//! - Each entry is applied as one WriteBatch holding its effects *and* the new `last_applied`
//!   (and membership), so restart resumes exactly after the last applied entry: no entry is
//!   applied twice and no timer fires twice across a crash.
//! - Apply never reads a clock (see `apply`); the in-memory `SmMeta` mirrors what is on disk.
//! - The bucket width is fixed when the database is created: a node refuses to reopen it with
//!   a different one, because replicas with different widths would write different keys.

use std::path::Path;
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use rocksdb::WriteBatch;

use super::apply::Applier;
use super::meta::{self, SmMeta};
use super::snapshot::{SnapshotBuilder, Snapshots};
use super::snapshot_file::SnapshotFile;
use super::{cf, codec, Store, CF_META};
use crate::cluster::{FireSignal, TypeConfig};
use crate::timer::Response;
use crate::{Error, Result};

type StResult<T> = std::result::Result<T, StorageError<u64>>;

/// The state machine openraft drives.
pub struct StateMachine {
    pub(super) store: Store,
    pub(super) meta: SmMeta,
    signal: Arc<FireSignal>,
    snapshots: Arc<Snapshots>,
}

impl StateMachine {
    /// Opens the state machine on `store`, keeping snapshots under `data_dir/snapshot`.
    pub fn open(store: Store, data_dir: &Path, signal: Arc<FireSignal>) -> Result<Self> {
        check_bucket_width(&store)?;
        // Before the metadata is read: this may finish an install a crash interrupted.
        let snapshots = Snapshots::open(store.db().clone(), data_dir.join("snapshot"))?;
        let meta = SmMeta::load(store.db())?;
        Ok(StateMachine {
            store,
            meta,
            signal,
            snapshots,
        })
    }

    /// The snapshot directory, for its counters.
    pub fn snapshots(&self) -> Arc<Snapshots> {
        self.snapshots.clone()
    }

    fn apply_entry(&mut self, entry: Entry<TypeConfig>) -> Result<Response> {
        let db = self.store.db().clone();
        let mut batch = WriteBatch::default();
        let mut progress = self.meta.progress;
        let mut membership_changed = false;
        let mut earliest_new_due = None;
        let mut made_ready = false;
        let mut events = crate::metrics::Events::default();
        let response = match entry.payload {
            EntryPayload::Blank => Response::None,
            EntryPayload::Membership(m) => {
                self.meta.membership = StoredMembership::new(Some(entry.log_id), m);
                membership_changed = true;
                Response::None
            }
            EntryPayload::Normal(cmd) => {
                let mut applier = Applier {
                    db: &db,
                    wheel: self.store.wheel(),
                    batch: &mut batch,
                    progress: &mut progress,
                    index: entry.log_id.index,
                    earliest_new_due: None,
                    made_ready: false,
                    policies: Default::default(),
                    staged: None,
                    pending_by_ns: Default::default(),
                    events: Default::default(),
                };
                let response = applier.command(cmd)?;
                applier.stage_pending()?;
                earliest_new_due = applier.earliest_new_due;
                made_ready = applier.made_ready;
                events = applier.events;
                response
            }
        };
        let mut next = self.meta.clone();
        next.progress = progress;
        next.last_applied = Some(entry.log_id);
        next.stage(&db, &mut batch, membership_changed);
        let keys = batch.len() as u64;
        db.write(batch)?;
        self.store
            .keys_written
            .fetch_add(keys, std::sync::atomic::Ordering::Relaxed);
        events.keys_written(keys);
        self.meta = next;
        events.record();
        if let Some(due) = earliest_new_due {
            self.signal.scheduled(due);
        }
        if made_ready {
            self.signal.made_ready();
        }
        Ok(response)
    }
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
            for entry in entries {
                let log_id = entry.log_id;
                let response = self.apply_entry(entry).map_err(|e| {
                    tracing::error!(%log_id, error = %e, "apply failed; the node must stop");
                    StorageError::from(StorageIOError::apply(log_id, &e))
                })?;
                responses.push(response);
            }
            Ok(responses)
        })
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder::new(self.snapshots.clone())
    }

    async fn begin_receiving_snapshot(&mut self) -> StResult<Box<SnapshotFile>> {
        let path = self.snapshots.incoming_path();
        let file = SnapshotFile::create(path.clone())
            .await
            .map_err(|e| sm_err(e.into()))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<SnapshotFile>,
    ) -> StResult<()> {
        let path = snapshot.finish().await.map_err(|e| sm_err(e.into()))?;
        let snapshots = self.snapshots.clone();
        let rows = off_the_runtime(|| snapshots.install(meta, &path)).map_err(sm_err)?;
        self.meta = SmMeta::load(self.store.db()).map_err(sm_err)?;
        tracing::info!(last = ?meta.last_log_id, rows, "installed snapshot");
        // The wheel may hold earlier timers now: let a sleeping driver look again.
        self.signal.scheduled(i64::MIN);
        self.signal.made_ready();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StResult<Option<Snapshot<TypeConfig>>> {
        self.snapshots.current().await.map_err(sm_err)
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
