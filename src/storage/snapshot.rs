//! Snapshots: the whole state machine (every column family in `SM_CFS`) as one file, built,
//! kept, sent and installed without ever holding it in memory.
//!
//! Files under `data_dir/snapshot/`:
//! - `snap-<id>.data`: a snapshot's rows ([`snapshot_file`](super::snapshot_file) format).
//! - `CURRENT`: the current snapshot's metadata and file name, replaced by write, fsync, rename.
//!   It is the one openraft sends to a follower that is missing purged log entries.
//! - `building-*.part`, `incoming-*.part`: files being written; removed at open.
//!
//! Invariants:
//! - A snapshot is built from one RocksDB snapshot, a consistent view: every applied entry is
//!   one WriteBatch, so the view holds whole entries and its `last_applied` says which.
//! - `CURRENT` only moves forward (by `last_log_id`): a slow build never replaces a newer
//!   snapshot installed meanwhile.
//! - Install is atomic across crashes. Before it touches the state machine it records the
//!   snapshot's id under `installing` in the `raft` family (fsynced) and makes that snapshot
//!   `CURRENT`; it then replaces the state-machine families in bounded batches, and clears the
//!   mark in the last, fsynced, batch. A node that opens with the mark set installs `CURRENT`
//!   again from the start before anything reads the state machine.
//! - Builds and installs exclude each other (one lock): a build never sees half an install.
//!   Readers do not take the lock; only a follower installs, and a follower serves no reads
//!   (reads go through the leader's read barrier), so nothing reads the half-installed state
//!   but local status and the digest, which tests take only once a node has caught up.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::RaftSnapshotBuilder;
use rocksdb::{IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};

use super::meta::{LAST_APPLIED, MEMBERSHIP};
use super::snapshot_file::{id_of, RowReader, RowWriter, SnapshotFile};
use super::{cf, codec, CF_META, CF_RAFT, SM_CFS};
use crate::keys::Space;
use crate::raft_types::{LogId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::{Error, Result};

/// A snapshot: its meta and its file (openraft's snapshot, with our file as its data).
pub type Snapshot = openraft::Snapshot<
    crate::raft_types::LeaderId,
    crate::raft_types::NodeId,
    openraft::BasicNode,
    SnapshotFile,
>;

/// Key in the `raft` family: the id of a snapshot whose install has begun and not finished
/// (group 0's; another group's has its number after a `/`: [`installing_key`]).
pub(super) const INSTALLING: &[u8] = b"installing_snapshot";
const CURRENT: &str = "CURRENT";
/// Bytes of rows written per (unsynced) WriteBatch while installing.
const INSTALL_BATCH_BYTES: usize = 8 << 20;

/// What `CURRENT` holds.
#[derive(Serialize, Deserialize)]
struct Current {
    meta: SnapshotMeta,
    file: String,
}

/// Counters for the metrics endpoint.
#[derive(Default)]
pub struct SnapshotStats {
    pub built: AtomicU64,
    pub installed: AtomicU64,
    /// Size of the latest snapshot built or installed.
    pub last_bytes: AtomicU64,
}

/// A node's snapshot directory and the lock that keeps builds and installs apart.
pub struct Snapshots {
    db: Arc<DB>,
    /// The group whose state these snapshots hold.
    space: Space,
    /// Pinned while a build reads (see `gc.rs`).
    gc: Arc<super::IndexGc>,
    dir: PathBuf,
    lock: Mutex<()>,
    pub stats: SnapshotStats,
}

impl Snapshots {
    /// Opens group `space`'s snapshots in `dir`, finishing an install a crash interrupted and
    /// removing partial files.
    pub fn open(
        db: Arc<DB>,
        gc: Arc<super::IndexGc>,
        space: Space,
        dir: PathBuf,
    ) -> Result<Arc<Snapshots>> {
        std::fs::create_dir_all(&dir)?;
        let snaps = Snapshots {
            db,
            space,
            gc,
            dir,
            lock: Mutex::new(()),
            stats: SnapshotStats::default(),
        };
        snaps.recover()?;
        let keep = snaps.read_current()?.map(|c| c.file);
        snaps.remove_files_except(keep.as_deref(), true)?;
        Ok(Arc::new(snaps))
    }

    /// A fresh path to receive a snapshot into.
    pub fn incoming_path(&self) -> PathBuf {
        self.dir
            .join(format!("incoming-{:016x}.part", rand::random::<u64>()))
    }

    /// The current snapshot, opened for reading.
    pub async fn current(&self) -> Result<Option<Snapshot>> {
        // Under the lock, so a build finishing meanwhile cannot remove the file between
        // reading its name and opening it.
        let (current, file) = {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            let Some(current) = self.read_current()? else {
                return Ok(None);
            };
            let path = self.dir.join(&current.file);
            let file = std::fs::File::open(&path)?;
            (current, SnapshotFile::from_std(file, path))
        };
        Ok(Some(Snapshot {
            meta: current.meta,
            snapshot: file,
        }))
    }

    /// Builds a snapshot of the state machine as it is now; blocking. It becomes `CURRENT`
    /// unless a newer one got there first.
    pub(super) fn build(&self) -> Result<SnapshotMeta> {
        let part = self
            .dir
            .join(format!("building-{:016x}.part", rand::random::<u64>()));
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let _pin = self.gc.pin();
        let snap = self.db.snapshot();
        drop(guard);
        let mut floors = super::digest::floors_of(&self.db, self.space, &snap);
        let mut writer = RowWriter::create(&part)?;
        for (i, name) in SM_CFS.iter().enumerate() {
            for (lower, upper) in self.ranges(name) {
                let from = IteratorMode::From(&lower, rocksdb::Direction::Forward);
                for item in snap.iterator_cf(cf(&self.db, name), from) {
                    let (k, v) = item?;
                    if *k >= *upper {
                        break;
                    }
                    // Index entries of purged timers are not part of the state (see `gc.rs`).
                    if *name == super::CF_INDEX && !super::gc::live_row(&k, &v, &mut floors)? {
                        continue;
                    }
                    writer.row(i as u8, &k, &v)?;
                }
            }
        }
        let (rows, bytes) = writer.finish()?;
        let meta_cf = cf(&self.db, CF_META);
        let last_log_id = snap.get_cf(meta_cf, self.space.meta_key(LAST_APPLIED))?;
        let last_log_id: Option<LogId> = match last_log_id {
            Some(v) => codec::decode(&v)?,
            None => None,
        };
        let last_membership = snap.get_cf(meta_cf, self.space.meta_key(MEMBERSHIP))?;
        let last_membership: StoredMembership = match last_membership {
            Some(v) => codec::decode(&v)?,
            None => StoredMembership::default(),
        };
        let index = last_log_id.map_or(0, |l| l.index);
        let meta = SnapshotMeta {
            last_log_id,
            last_membership,
        };
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self
            .read_current()?
            .is_some_and(|c| c.meta.last_log_id > meta.last_log_id)
        {
            std::fs::remove_file(&part)?;
            tracing::info!(
                index,
                "built snapshot is older than the current one; dropped"
            );
            return Ok(meta);
        }
        let file = data_file_name(&new_id(index));
        std::fs::rename(&part, self.dir.join(&file))?;
        self.write_current(&meta, &file)?;
        self.stats.built.fetch_add(1, Ordering::Relaxed);
        self.stats.last_bytes.store(bytes, Ordering::Relaxed);
        tracing::info!(index, rows, bytes, "built snapshot");
        Ok(meta)
    }

    /// Installs the received snapshot file at `received` (already fsynced); blocking. The file
    /// is read through once first: one that is damaged or would write outside the group is
    /// refused before anything (the install mark, `CURRENT`, the state) is touched.
    pub fn install(&self, meta: &SnapshotMeta, received: &Path) -> Result<u64> {
        self.check_file(received)?;
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let raft = cf(&self.db, CF_RAFT);
        // openraft 0.10 installs the current snapshot itself at start when the state machine
        // is behind it (its writes are not synced): that file stays as it is, under its id.
        // Renamed, a crash before CURRENT named the new file would lose the only copy.
        let own = self
            .read_current()?
            .filter(|c| self.dir.join(&c.file) == received)
            .map(|c| c.file);
        let id = match &own {
            Some(file) => id_of(file).to_string(),
            None => new_id(meta.last_log_id.map_or(0, |l| l.index)),
        };
        self.db.put_cf_opt(
            raft,
            self.installing(),
            codec::encode(&id),
            &super::synced(),
        )?;
        let file = data_file_name(&id);
        if own.is_none() {
            std::fs::rename(received, self.dir.join(&file))?;
            self.write_current(meta, &file)?;
        }
        let rows = self.load_rows(&self.dir.join(&file))?;
        let bytes = std::fs::metadata(self.dir.join(&file))?.len();
        self.stats.installed.fetch_add(1, Ordering::Relaxed);
        self.stats.last_bytes.store(bytes, Ordering::Relaxed);
        Ok(rows)
    }

    /// Replaces the state-machine families with the rows of `path`, clearing the install mark
    /// in the last batch. Batches before it are not synced: until the mark is cleared a crash
    /// means installing again, so only the last one needs to be durable (and, sharing one WAL,
    /// its sync makes the earlier ones durable too).
    ///
    /// A file of an earlier format (an older leader's snapshot, an older backup) is loaded
    /// into the format-5 families as it was written, then rewritten into this format's
    /// (`migrate.rs`), whose last batch clears the mark.
    pub(super) fn load_rows(&self, path: &Path) -> Result<u64> {
        let db = &self.db;
        let mut reader = RowReader::open(path)?;
        let old = reader.format() < super::FORMAT;
        let families: &[&str] = match old {
            true => &super::migrate::V5_CFS,
            false => &SM_CFS,
        };
        self.check_format(reader.format())?;
        let mut batch = WriteBatch::default();
        // The group's state: its prefix in every family. The node-wide records (`0xFFFF`: the
        // format, the bucket width) stay, so that a crash part-way leaves a directory this
        // build opens (and finishes the install in, `recover`); the file's own are put over
        // them.
        let group = self.space.prefix();
        for name in SM_CFS {
            batch.delete_range_cf(
                cf(db, name),
                group.as_slice(),
                super::prefix_end(&group).as_slice(),
            );
        }
        // The format-5 families, the staging area of an older file (`migrate.rs`, group 0's
        // alone: another group's install never touches them): emptied, but for the format a
        // build before format 6 reads (and refuses).
        if old {
            for name in super::migrate::V5_CFS {
                batch.delete_range_cf(cf(db, name), [0u8].as_slice(), [0xffu8; 32].as_slice());
            }
            batch.put_cf(
                cf(db, super::migrate::V5_META),
                super::migrate::V5_FORMAT,
                codec::encode(&super::FORMAT),
            );
        }
        let mut rows = 0u64;
        while let Some((i, k, v)) = reader.next_row()? {
            let name = families.get(i as usize).ok_or_else(|| {
                Error::Storage(format!("snapshot names unknown column family {i}"))
            })?;
            // An older file's format stays out of the old `meta`, whose format 6 keeps a build
            // before it out should this node go back to one with the install unfinished.
            if *name == super::migrate::V5_META && k == super::migrate::V5_FORMAT {
                continue;
            }
            if !old {
                self.check_key(name, &k)?; // checked before the install began, and again
            }
            batch.put_cf(cf(db, name), k, v);
            rows += 1;
            if batch.size_in_bytes() >= INSTALL_BATCH_BYTES {
                db.write(std::mem::take(&mut batch))?;
            }
        }
        let raft = cf(db, CF_RAFT);
        let installing = self.installing();
        if old {
            db.write(batch)?;
            super::migrate::rewrite(db, |last| last.delete_cf(raft, &installing))?;
            return Ok(rows);
        }
        batch.delete_cf(raft, installing);
        db.write_opt(batch, &super::synced())?;
        Ok(rows)
    }

    /// Finishes an install that a crash interrupted (see the module invariants).
    fn recover(&self) -> Result<()> {
        let raft = cf(&self.db, CF_RAFT);
        let Some(v) = self.db.get_cf(raft, self.installing())? else {
            return Ok(());
        };
        let id: String = codec::decode(&v)?;
        match self.read_current()? {
            // The file is named after the id (as it was when openraft 0.9 chose the id).
            Some(c) if c.file == data_file_name(&id) => {
                tracing::warn!(id, "an interrupted snapshot install: installing it again");
                let rows = self.load_rows(&self.dir.join(&c.file))?;
                tracing::info!(id, rows, "snapshot install finished");
            }
            // The crash came before the snapshot was kept, so before the state machine was
            // touched: nothing to finish.
            _ => self
                .db
                .delete_cf_opt(raft, self.installing(), &super::synced())?,
        }
        Ok(())
    }

    /// Reads the file at `path` through: its rows, checksum and keys must be the group's.
    fn check_file(&self, path: &Path) -> Result<()> {
        let mut reader = RowReader::open(path)?;
        self.check_format(reader.format())?;
        let old = reader.format() < super::FORMAT;
        while let Some((i, k, _)) = reader.next_row()? {
            let families: &[&str] = if old {
                &super::migrate::V5_CFS
            } else {
                &SM_CFS
            };
            let name = families.get(i as usize).ok_or_else(|| {
                Error::Storage(format!("snapshot names unknown column family {i}"))
            })?;
            if !old {
                self.check_key(name, &k)?;
            }
        }
        Ok(())
    }

    /// A file of a format before groups holds a single-group state: group 0's only.
    fn check_format(&self, format: u32) -> Result<()> {
        if format < super::FORMAT && self.space.group != crate::keys::GROUP_ZERO {
            return Err(Error::Storage(format!(
                "a snapshot of format {format} holds a single-group state, not group {}'s",
                self.space.group
            )));
        }
        Ok(())
    }

    /// Every key of a snapshot is the group's (or, for group 0, node-wide): a file that would
    /// write into another group's state is refused, whoever sent it.
    fn check_key(&self, family: &str, key: &[u8]) -> Result<()> {
        let ranges = self.ranges(family);
        if ranges
            .iter()
            .any(|(lo, hi)| lo.as_slice() <= key && key < hi.as_slice())
        {
            return Ok(());
        }
        Err(Error::Storage(format!(
            "the snapshot holds a {family} key outside group {}'s state",
            self.space.group
        )))
    }

    /// This group's install mark ([`INSTALLING`]).
    fn installing(&self) -> Vec<u8> {
        installing_key(self.space)
    }

    /// The key ranges `[lower, upper)` of `family` a snapshot of the group holds: its prefix,
    /// and for group 0 the node-wide records of `meta` (the format and the bucket width, which
    /// a restore reads from a backup).
    fn ranges(&self, family: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        let group = self.space.prefix();
        let mut out = vec![(group.to_vec(), super::prefix_end(&group))];
        if family == CF_META && self.space.group == crate::keys::GROUP_ZERO {
            let node = crate::keys::group_prefix(crate::keys::NODE_WIDE);
            out.push((node.to_vec(), super::prefix_end(&node)));
        }
        out
    }

    fn read_current(&self) -> Result<Option<Current>> {
        match std::fs::read(self.dir.join(CURRENT)) {
            Ok(bytes) => Ok(Some(codec::decode(&bytes)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes `file` the current snapshot (write, fsync, rename, fsync the directory), then
    /// removes older snapshot files. Callers hold the lock.
    fn write_current(&self, meta: &SnapshotMeta, file: &str) -> Result<()> {
        let tmp = self.dir.join("CURRENT.tmp");
        let current = Current {
            meta: meta.clone(),
            file: file.to_string(),
        };
        std::fs::write(&tmp, codec::encode(&current))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(CURRENT))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        // A sender still reading an old file keeps its open handle; unlinking is safe.
        self.remove_files_except(Some(file), false)
    }

    /// Removes snapshot files other than `keep` and `CURRENT`; partial files too if `partial`
    /// (only at open: later, a build or a receive may be writing one).
    fn remove_files_except(&self, keep: Option<&str>, partial: bool) -> Result<()> {
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let stale = (name.ends_with(".data") && Some(name.as_str()) != keep)
                || (partial && name.ends_with(".part"))
                // The format before streamed snapshots: one blob, no longer read.
                || name == "current";
            if stale {
                std::fs::remove_file(self.dir.join(&name))?;
            }
        }
        Ok(())
    }
}

/// Group `space`'s install mark in the `raft` family.
pub(super) fn installing_key(space: Space) -> Vec<u8> {
    match space.group {
        crate::keys::GROUP_ZERO => INSTALLING.to_vec(),
        g => format!("installing_snapshot/{g}").into_bytes(),
    }
}

/// A snapshot file's id: its last index and a random part, so two snapshots of one index (a
/// build and an install) never share a file.
fn new_id(index: u64) -> String {
    format!("{index}-{:08x}", rand::random::<u32>())
}

fn data_file_name(id: &str) -> String {
    format!("snap-{id}.data")
}

/// Builds snapshots for openraft, on a blocking thread.
pub struct SnapshotBuilder {
    snapshots: Arc<Snapshots>,
}

impl SnapshotBuilder {
    pub fn new(snapshots: Arc<Snapshots>) -> Self {
        SnapshotBuilder { snapshots }
    }

    async fn build(&self) -> Result<Snapshot> {
        let snaps = self.snapshots.clone();
        let meta = crate::sim::blocking(move || snaps.build())
            .await
            .map_err(|e| Error::Storage(format!("snapshot build task: {e}")))??;
        // Usually the one just built; a newer one if an install overtook it.
        match self.snapshots.current().await? {
            Some(s) => Ok(s),
            None => Err(Error::Storage(format!(
                "the snapshot at {:?} vanished after it was built",
                meta.last_log_id
            ))),
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        self.build()
            .await
            .map_err(|e| std::io::Error::other(format!("building a snapshot: {e}")))
    }
}
