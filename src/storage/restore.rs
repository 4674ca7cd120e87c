//! Backups, read offline: checking a backup file, and restoring one into a new node's data dir.
//!
//! A backup is a snapshot file (`snapshot_file` format: rows of every state-machine family, a
//! row count and a CRC-32), taken on the leader by `Cluster.Backup`. Its `meta` rows say which
//! log index it describes, the bucket width, and the replicated clock.
//!
//! Restoring makes a data dir that looks as if the node had installed that snapshot in a *new*
//! cluster:
//! - the rows are loaded as they are, except `last_applied`, which becomes log id
//!   (term 0, node 0, index N) for the backup's index N, and the membership, which becomes the
//!   new cluster's voters (the old cluster's nodes and addresses mean nothing to the new one);
//! - the Raft log (`raft-log/`) is empty and the vote is the default. On start openraft sees
//!   `last_applied` > the log's end and purges the log up to N, so the new cluster's first
//!   leader (term ≥ 1) appends at N + 1: log ids keep increasing, and so do fire indexes, the
//!   consumers' dedup tokens, which therefore never repeat an old cluster's;
//! - a snapshot of the restored state is built at once, so a node added later receives it
//!   rather than log entries that were never there.
//!
//! Invariants: a restore never touches an existing node's state (it refuses a non-empty data
//! dir), and never leaves half a data dir behind: it builds the node in a sibling directory
//! and renames it into place only once complete and closed. Every node restored from the same
//! file with the same `--peers` starts from the same state, which their digests show.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use openraft::{BasicNode, Membership};

use crate::raft_types::{log_id, LogId, StoredMembership};
use serde::Serialize;

use super::meta::{Progress, BUCKET_MS, LAST_APPLIED, MEMBERSHIP, PROGRESS};
use crate::keys::{Space, GROUP_ZERO};

/// A backup is group 0's state (a cluster of one group).
const G0: Space = Space::of(GROUP_ZERO);
use super::snapshot::Snapshots;
use super::snapshot_file::RowReader;
use super::{cf, codec, open_db, CF_META, SM_CFS};
use crate::{Error, Result};

/// What a backup file holds, found by reading it whole (which also checks it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BackupSummary {
    /// The log index the backup describes (its source's `last_applied`).
    pub index: u64,
    /// The term of that entry.
    pub term: u64,
    pub bytes: u64,
    pub rows: u64,
    /// Rows per state-machine column family.
    pub rows_by_family: BTreeMap<String, u64>,
    /// Timers in any state.
    pub timers: u64,
    pub pending: u64,
    pub namespaces: u64,
    /// The replicated clock when the backup was taken (epoch ms).
    pub cursor_ms: i64,
    /// The wheel's bucket width; a restored node must use the same.
    pub bucket_ms: Option<u64>,
    /// The data groups of the backed-up cluster (0: one group, what a backup restores).
    pub groups: u16,
}

/// Reads the backup at `path` to its end, checking magic, row count and checksum.
pub fn inspect(path: &Path) -> Result<BackupSummary> {
    let mut reader = RowReader::open(path)?;
    let mut s = BackupSummary {
        bytes: std::fs::metadata(path)?.len(),
        ..BackupSummary::default()
    };
    // A backup of an earlier format names format 5's families and keys (`migrate.rs`); its
    // counts are reported under this format's family names.
    let old = reader.format() < super::FORMAT;
    let meta_cf = family_index(CF_META);
    while let Some((i, key, value)) = reader.next_row()? {
        let family = SM_CFS.get(i as usize).ok_or_else(|| {
            Error::InvalidArgument(format!("backup names unknown column family {i}"))
        })?;
        *s.rows_by_family.entry(family.to_string()).or_default() += 1;
        s.rows += 1;
        if i != meta_cf {
            continue;
        }
        let key = match old {
            true => super::migrate::v5_meta_key(&key),
            false => Some(key),
        };
        match key {
            Some(k) if k == G0.meta_key(LAST_APPLIED) => {
                let id: Option<LogId> = codec::decode(&value)?;
                (s.index, s.term) = id.map_or((0, 0), |l| (l.index, l.leader_id.term));
            }
            Some(k) if k == G0.meta_key(PROGRESS) => {
                let p: Progress = codec::decode(&value)?;
                (s.pending, s.timers, s.cursor_ms) = (p.pending, p.stored, p.cursor_ms);
            }
            Some(k) if k == BUCKET_MS => s.bucket_ms = Some(codec::decode(&value)?),
            Some(k) if k == super::meta::GROUPS => s.groups = codec::decode(&value)?,
            _ => {}
        }
    }
    s.namespaces = s
        .rows_by_family
        .get(super::CF_NAMESPACES)
        .copied()
        .unwrap_or(0);
    Ok(s)
}

fn family_index(name: &str) -> u8 {
    SM_CFS
        .iter()
        .position(|n| *n == name)
        .expect("a state-machine family") as u8
}

/// Restores the backup at `backup` into `data_dir`, which must be missing or empty, as a node
/// of a new cluster whose voters are `voters`. The restored cluster keeps the backup's bucket
/// width; `bucket_ms`, if given, must be it.
pub fn restore(
    backup: &Path,
    data_dir: &Path,
    voters: BTreeMap<u64, BasicNode>,
    bucket_ms: Option<u64>,
) -> Result<BackupSummary> {
    check_empty(data_dir)?;
    // One read to check it whole and learn its bucket width before anything is written (a
    // second pass loads it): a damaged or mismatched backup is refused with no directory made.
    let summary = inspect(backup)?;
    if let (Some(width), Some(asked)) = (summary.bucket_ms, bucket_ms) {
        if width != asked {
            return Err(Error::InvalidArgument(format!(
                "the backup's wheel has {width} ms buckets, not {asked}: restore without \
                 --bucket-ms (the restored cluster keeps the backup's width)"
            )));
        }
    }
    if summary.groups > 0 {
        return Err(Error::InvalidArgument(format!(
            "the backup is group 0 of a cluster of {} data groups: a backup of one group \
             cannot restore such a cluster",
            summary.groups
        )));
    }
    if voters.is_empty() {
        return Err(Error::InvalidArgument(
            "a restored cluster needs at least one voter".into(),
        ));
    }
    let building = sibling(data_dir, "restoring")?;
    if building.exists() {
        std::fs::remove_dir_all(&building)?;
    }
    load(backup, &building, summary.index, voters)?;
    if data_dir.exists() {
        std::fs::remove_dir(data_dir)?;
    }
    std::fs::rename(&building, data_dir)?;
    if let Some(parent) = data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(summary)
}

/// Loads the rows into a new database at `dir`, rewrites `last_applied` and the membership, and
/// builds the first snapshot; the database is closed when this returns.
fn load(backup: &Path, dir: &Path, index: u64, voters: BTreeMap<u64, BasicNode>) -> Result<()> {
    let gc = super::IndexGc::new();
    let db = open_db(dir, &gc)?;
    // The new node's log: empty, with the default vote (above). Made before any state is
    // written, so the directory has one (a state machine without its log is refused at start,
    // `LogEngine::open`).
    drop(super::LogEngine::open(db.clone())?);
    let snapshots = Snapshots::open(db.clone(), gc, G0, dir.join("snapshot"))?;
    let rows = snapshots.load_rows(backup)?;
    let applied = log_id(0, 0, index);
    let ids: BTreeSet<u64> = voters.keys().copied().collect();
    let membership = Membership::new(vec![ids], voters)
        .map_err(|e| Error::InvalidArgument(format!("the restored membership: {e}")))?;
    let membership = StoredMembership::new(Some(applied), membership);
    let meta = cf(&db, CF_META);
    let mut batch = rocksdb::WriteBatch::default();
    batch.put_cf(
        meta,
        G0.meta_key(LAST_APPLIED),
        codec::encode(&Some(applied)),
    );
    batch.put_cf(meta, G0.meta_key(MEMBERSHIP), codec::encode(&membership));
    db.write_opt(batch, &super::synced())?;
    snapshots.build()?;
    tracing::info!(rows, index, "restored backup");
    drop(snapshots);
    db.flush()?;
    // The last handle: RocksDB closes here, before the directory is renamed.
    drop(db);
    Ok(())
}

fn check_empty(data_dir: &Path) -> Result<()> {
    match std::fs::read_dir(data_dir).map(|mut entries| entries.next().is_none()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::FailedPrecondition(format!(
            "data dir {} is not empty: a restore only creates a new node; move the old \
             directory away or pick another --data-dir",
            data_dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `dir`'s sibling `.<name>.<what>`, where a restore is built before it is renamed into place.
fn sibling(dir: &Path, what: &str) -> Result<PathBuf> {
    let name = dir.file_name().ok_or_else(|| {
        Error::InvalidArgument(format!("--data-dir {} has no final name", dir.display()))
    })?;
    Ok(dir.with_file_name(format!(".{}.{what}", name.to_string_lossy())))
}
