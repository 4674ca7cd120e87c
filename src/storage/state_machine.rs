//! The replicated state machine: openraft's `RaftStateMachine` over the state-machine column
//! families (see `storage`).
//!
//! Invariants:
//! - Each entry is applied as one WriteBatch holding its effects *and* the new `last_applied`
//!   (and membership), so restart resumes exactly after the last applied entry: no entry is
//!   applied twice and no timer fires twice across a crash.
//! - Apply never reads a clock (see `apply`); the in-memory `SmMeta` mirrors what is on disk,
//!   and the heads (`heads.rs`) are re-read from it after every entry that moved the cursor.
//! - The bucket width is the cluster's, fixed when it is created and recorded in the state
//!   machine: a node refuses to reopen its data with another, refuses a snapshot or (in the
//!   peer service) a peer with another, and a node joining with an empty data dir takes the
//!   cluster's, because replicas with different widths would write different keys.

use rustc_hash::FxHashMap as HashMap;
use std::path::Path;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use rocksdb::WriteBatch;

use super::apply::Applier;
use super::meta::{self, SmMeta};
use super::read::Reader;
use super::snapshot::{SnapshotBuilder, Snapshots};
use super::snapshot_file::SnapshotFile;
use super::{cf, codec, Store, CF_META};
use crate::command::Response;
use crate::raft_types::{Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::storage::{FireSignal, Snapshot};
use crate::wheel::Slot;
use crate::{Error, Result};

type StResult<T> = std::io::Result<T>;

/// The state machine openraft drives.
pub struct StateMachine {
    pub(super) store: Store,
    pub(super) meta: SmMeta,
    signal: Arc<FireSignal>,
    snapshots: Arc<Snapshots>,
    /// Plain Schedules applied as builds before the fold apply them (`Applier::plain_as_general`).
    plain_as_general: bool,
}

impl StateMachine {
    /// Opens the state machine of `store`'s group, keeping snapshots under
    /// `data_dir/snapshot` (group 0) or `data_dir/snapshot-<group>`.
    pub fn open(store: Store, data_dir: &Path, signal: Arc<FireSignal>) -> Result<Self> {
        check_bucket_width(&store)?;
        store.load_groups()?;
        let space = store.space();
        let dir = match space.group {
            crate::keys::GROUP_ZERO => data_dir.join("snapshot"),
            g => data_dir.join(format!("snapshot-{g}")),
        };
        // Before the metadata is read: this may finish an install a crash interrupted.
        let snapshots = Snapshots::open(store.db().clone(), store.gc.clone(), space, dir)?;
        let meta = SmMeta::load(store.db(), space)?;
        let mut sm = StateMachine {
            store,
            meta,
            signal,
            snapshots,
            plain_as_general: false,
        };
        sm.reload()?;
        Ok(sm)
    }

    /// Makes the node-local caches as stale as their contracts allow (every head early, the
    /// deadline floor at 0), as a long-running replica's may be. For the apply fuzzer: apply
    /// must not write otherwise.
    pub fn stale_caches(&self) {
        self.store.deadline_floor.reset();
        let mut heads = self.store.heads.lock().unwrap_or_else(|p| p.into_inner());
        heads.all_early(self.meta.cursor);
    }

    /// From now on a plain Schedule is applied through `schedule_with` with nothing set, as
    /// builds before the fold apply the entry a node proposes now; this build's own path is
    /// `schedule`. The change must be the same either way (DESIGN 8): the apply fuzzer's
    /// disturbed replica applies this way beside a steady one that does not, and compares.
    #[doc(hidden)]
    pub fn apply_plain_schedules_generally(&mut self) {
        self.plain_as_general = true;
    }

    /// Rebuilds every node-local structure apply and the readers keep beside the database (the
    /// metadata mirror, the heads, the index GC's floors, the access cache) from the database,
    /// as opening it does. A cache may make apply faster, never different (DESIGN 8): a replica
    /// that just did this writes what one that never did writes, which the apply fuzzer checks
    /// before every entry.
    pub fn reload(&mut self) -> Result<()> {
        self.meta = SmMeta::load(self.store.db(), self.store.space())?;
        self.store.gc.load(self.store.db())?;
        self.store.reload_heads(self.meta.cursor)?;
        self.store.reload_access()?;
        self.store.reload_level()?;
        self.store.namespaces_changed();
        Ok(())
    }

    /// The read side of this state machine.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The snapshot directory, for its counters.
    pub fn snapshots(&self) -> Arc<Snapshots> {
        self.snapshots.clone()
    }

    fn apply_entry(&mut self, entry: Entry) -> Result<Response> {
        if self.store.width_ms() == 0 {
            // A joining node learns the width from the first peer message, before any entry.
            return Err(Error::Storage(
                "no bucket width: this node has not learned the cluster's".into(),
            ));
        }
        let db = self.store.db().clone();
        let mut batch = WriteBatch::default();
        let mut progress = self.meta.progress;
        let mut membership_changed = false;
        let mut after = AfterWrite::default();
        let response = match entry.payload {
            EntryPayload::Blank => Response::None,
            EntryPayload::Membership(m) => {
                self.meta.membership = StoredMembership::new(Some(entry.log_id), m);
                membership_changed = true;
                Response::None
            }
            EntryPayload::Normal(cmd) => {
                let mut applier = Applier::new(
                    &db,
                    (self.store.space(), self.store.sharded()),
                    self.store.wheel(),
                    &mut batch,
                    &mut progress,
                    entry.log_id.index,
                    self.store.heads.clone(),
                );
                applier.deadline_floor = self.store.deadline_floor.get();
                applier.plain_as_general = self.plain_as_general;
                let response = applier.apply(cmd)?;
                applier.finish();
                after = AfterWrite {
                    earliest_new_due: applier.earliest_new_due,
                    made_ready: applier.made_ready,
                    deadlines: (applier.deadlines_proved, applier.deadlines_written),
                    placed: std::mem::take(&mut applier.placed),
                    visited: std::mem::take(&mut applier.visited),
                    purged: std::mem::take(&mut applier.purged),
                    events: std::mem::take(&mut applier.events),
                    access: applier
                        .access_changed
                        .then(|| applier.access_staged.take())
                        .flatten(),
                    namespaces_changed: applier.namespaces_changed,
                    level: applier.level_staged,
                };
                response
            }
        };
        let mut next = self.meta.clone();
        next.progress = progress;
        next.last_applied = Some(entry.log_id);
        next.stage(&db, self.store.space(), &mut batch, membership_changed);
        let keys = batch.len() as u64;
        db.write(batch)?;
        self.meta = next;
        self.store
            .keys_written
            .fetch_add(keys, std::sync::atomic::Ordering::Relaxed);
        after.events.keys_written(keys);
        self.store.acked.fetch_add(
            after.events.acked_count(),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.store.fire_stats.add(after.events.fired_lateness());
        after.events.record();
        if let Some(state) = after.access {
            self.store.set_access(state);
        }
        if after.namespaces_changed {
            self.store.namespaces_changed();
        }
        if let Some(level) = after.level {
            self.store.set_level(level);
        }
        for (ns, floor) in &after.purged {
            self.store.gc.advance(self.store.space().group, ns, *floor);
        }
        {
            // The heads follow the written state: namespaces the cursor passed are read again,
            // rows placed after it are noted.
            let mut heads = self.store.heads.lock().unwrap_or_else(|p| p.into_inner());
            for ns in &after.visited {
                heads.set(
                    ns,
                    Reader::live(&db, self.store.space()).first_after(ns, progress.cursor)?,
                );
            }
            for (ns, slot) in &after.placed {
                if *slot > progress.cursor {
                    heads.note(ns, *slot);
                }
            }
            // Under the same lock, before the signal (`Store::next_due` reads both under it).
            let (proved, written) = after.deadlines;
            self.store.deadline_floor.after_entry(proved, written);
        }
        if let Some(due) = after.earliest_new_due {
            self.signal.scheduled(due);
        }
        if after.made_ready {
            self.signal.made_ready();
        }
        Ok(response)
    }
}

/// What an applied entry leaves to do once its batch is written.
#[derive(Default)]
struct AfterWrite {
    earliest_new_due: Option<i64>,
    made_ready: bool,
    /// For the deadline floor: (proved, written), `floor.rs`.
    deadlines: (Option<u64>, Option<u64>),
    placed: HashMap<String, Slot>,
    visited: Vec<String>,
    purged: Vec<(String, Slot)>,
    events: crate::metrics::Events,
    access: Option<crate::auth::AccessState>,
    namespaces_changed: bool,
    level: Option<u32>,
}

/// The bucket width is the cluster's, recorded in the state machine (`meta/bucket_ms`, carried
/// by snapshots). A new node records the width it was started with; a node started without one
/// takes what its data dir records, or (empty, joining) what its first peer says
/// (`Store::adopt_width`); one started with a width its data dir contradicts is refused.
pub(super) fn check_bucket_width(store: &Store) -> Result<()> {
    let db = store.db();
    let width = store.width_ms();
    match (recorded_width(store)?, width) {
        (Some(stored), 0) => store.set_width(stored),
        (Some(stored), w) if stored != w => {
            return Err(Error::InvalidArgument(format!(
                "data dir was created with bucket width {stored} ms, not {w} ms: a cluster's \
                 width is fixed when it is created (start without --bucket-ms, or with \
                 --bucket-ms {stored})"
            )));
        }
        (Some(_), _) | (None, 0) => {}
        // Synced: the log does not share this database's WAL (storage/mod.rs).
        (None, w) => db.put_cf_opt(
            cf(db, CF_META),
            meta::BUCKET_MS,
            codec::encode(&w),
            &super::synced(),
        )?,
    }
    Ok(())
}

fn recorded_width(store: &Store) -> Result<Option<u64>> {
    let db = store.db();
    match db.get_cf(cf(db, CF_META), meta::BUCKET_MS)? {
        Some(v) => Ok(Some(codec::decode(&v)?)),
        None => Ok(None),
    }
}

impl StateMachine {
    /// Applies committed entries in order, each as one write (see the invariants), and returns
    /// their answers. What openraft's `apply` does, without the responders.
    pub async fn apply_entries(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> StResult<Vec<Response>> {
        self.store.apply_hold.pass().await;
        off_the_runtime(|| {
            let mut responses = Vec::new();
            for entry in entries {
                let log_id = entry.log_id;
                let response = self.apply_entry(entry).map_err(|e| {
                    tracing::error!(%log_id, error = %e, "apply failed; the node must stop");
                    std::io::Error::other(format!("applying the entry at {log_id}: {e}"))
                })?;
                self.store.trail(log_id.index).map_err(sm_err)?;
                responses.push(response);
            }
            Ok(responses)
        })
    }
}

fn sm_err(e: Error) -> std::io::Error {
    std::io::Error::other(format!("state machine: {e}"))
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StResult<(Option<LogId>, StoredMembership)> {
        Ok((self.meta.last_applied, self.meta.membership.clone()))
    }

    /// Applies a run of committed entries. Each entry's answer goes to the client waiting for
    /// it (the leader's own writes) once the whole run is applied, as under openraft 0.9: code
    /// that sees a write answered may rely on the run's `last_applied` being on disk.
    async fn apply<Strm>(&mut self, entries: Strm) -> StResult<()>
    where
        Strm: Stream<Item = StResult<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        let run: Vec<EntryResponder<TypeConfig>> = entries.try_collect().await?;
        let (entries, responders): (Vec<_>, Vec<_>) = run.into_iter().unzip();
        let responses = self.apply_entries(entries).await?;
        for (responder, response) in responders.into_iter().zip(responses) {
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder::new(self.snapshots.clone())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotFile,
    ) -> StResult<()> {
        let path = snapshot.finish().await.map_err(|e| sm_err(e.into()))?;
        // The snapshot records the cluster's width; peers checked it, and so does this, before
        // the state is replaced. Reading the file whole also checks its row count and checksum
        // before anything is deleted (an install reads it once more; it is rare).
        let theirs = off_the_runtime(|| super::restore::inspect(&path))
            .map_err(sm_err)?
            .bucket_ms;
        let mine = self.store.width_ms();
        if let Some(theirs) = theirs.filter(|t| mine != 0 && *t != mine) {
            let why = super::store::width_mismatch(mine, theirs, "an installed snapshot");
            return Err(sm_err(Error::Storage(why)));
        }
        let snapshots = self.snapshots.clone();
        let rows = off_the_runtime(|| snapshots.install(meta, &path)).map_err(sm_err)?;
        if let Some(theirs) = theirs {
            self.store.set_width(theirs);
        }
        if crate::sim::planted("install-keeps-caches") {
            self.meta = SmMeta::load(self.store.db(), self.store.space()).map_err(sm_err)?;
        } else {
            self.reload().map_err(sm_err)?;
        }
        tracing::info!(last = ?meta.last_log_id, rows, "installed snapshot");
        // The wheel may hold earlier timers now: let a sleeping driver look again.
        self.signal.scheduled(i64::MIN);
        self.signal.made_ready();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StResult<Option<Snapshot>> {
        self.snapshots.current().await.map_err(sm_err)
    }
}

/// Where a snapshot sent in chunks (openraft's 0.9 wire, kept by `openraft-legacy`) is
/// received: a new file beside the others, installed by `install_snapshot` when complete.
impl openraft_legacy::network_v1::SnapshotReceiverFactory<TypeConfig> for StateMachine {
    type SnapshotReceiver = SnapshotFile;

    async fn begin_receiving_snapshot(&mut self) -> StResult<SnapshotFile> {
        let path = self.snapshots.incoming_path();
        SnapshotFile::create(path)
            .await
            .map_err(|e| sm_err(e.into()))
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
