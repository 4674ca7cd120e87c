//! Snapshots: the whole state machine (every column family in `SM_CFS`) as one blob.
//!
//! Deliberately simple for now: a snapshot is built from a consistent RocksDB snapshot but held
//! in memory and sent whole (in openraft's chunks). That is fine for millions of small timers
//! on a 24 GiB machine, not for unbounded data; the operations issue streams it from a
//! checkpoint instead. The current snapshot is kept on disk (`snapshot/current`, written to a
//! temporary file, fsynced, renamed) so a restarted node can still serve it.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::{
    BasicNode, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use rocksdb::{IteratorMode, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};

use super::meta::{LAST_APPLIED, MEMBERSHIP};
use super::{cf, codec, CF_META, SM_CFS};
use crate::cluster::TypeConfig;
use crate::{Error, Result};

/// Distinguishes snapshots built at the same log id.
static SNAPSHOT_SEQ: AtomicU64 = AtomicU64::new(0);

/// A snapshot's content: every key and value of the state-machine column families.
#[derive(Serialize, Deserialize)]
struct Dump {
    /// (column family index in `SM_CFS`, key, value)
    rows: Vec<(u8, Vec<u8>, Vec<u8>)>,
}

/// Builds snapshots from a consistent view of the database.
pub struct SnapshotBuilder {
    db: Arc<DB>,
    dir: PathBuf,
}

impl SnapshotBuilder {
    pub fn new(db: Arc<DB>, dir: PathBuf) -> Self {
        SnapshotBuilder { db, dir }
    }

    fn build(&self) -> Result<Snapshot<TypeConfig>> {
        let snap = self.db.snapshot();
        let mut dump = Dump { rows: Vec::new() };
        for (i, name) in SM_CFS.iter().enumerate() {
            for item in snap.iterator_cf(cf(&self.db, name), IteratorMode::Start) {
                let (k, v) = item?;
                dump.rows.push((i as u8, k.to_vec(), v.to_vec()));
            }
        }
        let meta_cf = cf(&self.db, CF_META);
        let last_log_id: Option<LogId<u64>> = match snap.get_cf(meta_cf, LAST_APPLIED)? {
            Some(v) => codec::decode(&v)?,
            None => None,
        };
        let last_membership: StoredMembership<u64, BasicNode> =
            match snap.get_cf(meta_cf, MEMBERSHIP)? {
                Some(v) => codec::decode(&v)?,
                None => StoredMembership::default(),
            };
        let seq = SNAPSHOT_SEQ.fetch_add(1, Ordering::Relaxed);
        let index = last_log_id.map_or(0, |l| l.index);
        let meta = SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id: format!("{index}-{seq}"),
        };
        let data = codec::encode(&dump);
        save(&self.dir, &meta, &data)?;
        tracing::info!(
            index,
            rows = dump.rows.len(),
            bytes = data.len(),
            "built snapshot"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(
        &mut self,
    ) -> std::result::Result<Snapshot<TypeConfig>, StorageError<u64>> {
        self.build()
            .map_err(|e| StorageIOError::<u64>::write_snapshot(None, &e).into())
    }
}

/// Replaces the state machine's column families with the snapshot's content, atomically.
pub fn install(db: &DB, data: &[u8]) -> Result<()> {
    let dump: Dump = codec::decode(data)?;
    let mut batch = WriteBatch::default();
    for name in SM_CFS {
        // No state-machine key is empty or starts with 0xff (length prefixes, bucket times,
        // ASCII meta names), so this range covers the whole family.
        batch.delete_range_cf(cf(db, name), [0u8].as_slice(), [0xffu8; 16].as_slice());
    }
    for (i, k, v) in dump.rows {
        let name = SM_CFS
            .get(i as usize)
            .ok_or_else(|| Error::Storage(format!("snapshot names unknown column family {i}")))?;
        batch.put_cf(cf(db, name), k, v);
    }
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    db.write_opt(batch, &opts)?;
    Ok(())
}

/// Stores the current snapshot durably.
pub fn save(dir: &Path, meta: &SnapshotMeta<u64, BasicNode>, data: &[u8]) -> Result<()> {
    let tmp = dir.join("current.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&codec::encode(&(meta, data)))?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join("current"))?;
    Ok(())
}

/// Loads the current snapshot, if one was saved.
pub fn load(dir: &Path) -> Result<Option<Snapshot<TypeConfig>>> {
    let bytes = match std::fs::read(dir.join("current")) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let (meta, data): (SnapshotMeta<u64, BasicNode>, Vec<u8>) = codec::decode(&bytes)?;
    Ok(Some(Snapshot {
        meta,
        snapshot: Box::new(Cursor::new(data)),
    }))
}
