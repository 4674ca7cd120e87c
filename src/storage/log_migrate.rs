//! Moving the Raft log of earlier builds' data directories into today's log engine.
//!
//! Two layouts came before raft-engine, both in the state machine's RocksDB:
//! 1. the single-group log (issue 34 and before): the `log` family keyed by index (8 bytes BE),
//!    bare `vote`, `committed` and `last_purged` in the `raft` family;
//! 2. the group-keyed log (issue 34, part 2): the `raft_log` family keyed by group (u32 BE) ‖
//!    index (u64 BE), and `vote/`, `committed/`, `last_purged/` followed by the group in `raft`.
//!
//! [`migrate_to_groups`] rewrites 1 into 2 when the database opens; [`into_raft_engine`] moves 2
//! into raft-engine when the log engine opens, before openraft starts. Whether to migrate is
//! read from the keys themselves, never from a marker, and each step can be done again: the
//! old layout is deleted only by a synced batch after the copy is durable, so a crash part-way
//! leaves it whole, and the next start copies the same entries again over the partial copy
//! (which the first batch of each group clears). A build of layout 2 cannot open a directory
//! of this one: the database holds the `log_moved` family, which that build does not list, so
//! RocksDB refuses to open it (it would otherwise start with an empty log and no vote).

use std::sync::Arc;

use raft_engine::{Command, Engine, LogBatch};
use rocksdb::{IteratorMode, WriteBatch, DB};

use super::log_format::{
    raw_entry, GroupId, Raw, COMMITTED, GROUP0, LAST_PURGED, RECORDS, SYNC_REGION, VOTE,
};
use super::{cf, CF_LOG, CF_RAFT, CF_RAFT_LOG};

/// Bytes of a log key of layout 2: the group, then the index.
pub const LOG_KEY_BYTES: usize = 12;

/// Layout 2's key of `group`'s entry `index`.
pub fn log_key(group: GroupId, index: u64) -> [u8; LOG_KEY_BYTES] {
    let mut key = [0u8; LOG_KEY_BYTES];
    key[..4].copy_from_slice(&group.to_be_bytes());
    key[4..].copy_from_slice(&index.to_be_bytes());
    key
}

/// Layout 2's `raft`-family key of a per-group record (`vote`, `committed`, `last_purged`).
pub fn group_key(name: &[u8], group: GroupId) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.len() + 5);
    key.extend_from_slice(name);
    key.push(b'/');
    key.extend_from_slice(&group.to_be_bytes());
    key
}

/// Most bytes of entries one unsynced batch of a migration copies. Small for raft-engine: it
/// reads and checks a whole batch's block to return one of its entries.
const CHUNK_BYTES: usize = 4 << 20;

/// Moves layout 2 (every group's entries and records) into `log`; `true` if there was any.
pub(super) fn into_raft_engine(db: &DB, log: &Arc<Engine>) -> crate::Result<bool> {
    let (entries, raft) = (cf(db, CF_RAFT_LOG), cf(db, CF_RAFT));
    let err = |e: raft_engine::Error| crate::Error::Storage(format!("moving the raft log: {e}"));
    let mut records = Vec::new();
    for item in db.iterator_cf(raft, IteratorMode::Start) {
        let (k, v) = item?;
        for name in [VOTE, COMMITTED, LAST_PURGED] {
            if k.len() == name.len() + 5 && k.starts_with(name) && k[name.len()] == b'/' {
                let group = GroupId::from_be_bytes(k[name.len() + 1..].try_into().expect("4"));
                records.push((k.clone(), name, group, v.to_vec()));
            }
        }
    }
    let mut moved = 0usize;
    let (mut batch, mut bytes) = (LogBatch::default(), 0usize);
    let mut run: Vec<protobuf::well_known_types::BytesValue> = Vec::new();
    let mut current: Option<(GroupId, u64)> = None;
    for item in db.iterator_cf(entries, IteratorMode::Start) {
        let (k, v) = item?;
        if k.len() != LOG_KEY_BYTES {
            return Err(crate::Error::Storage(format!(
                "the raft_log family holds a key of {} bytes, not {LOG_KEY_BYTES}: not moved",
                k.len()
            )));
        }
        let group = GroupId::from_be_bytes(k[..4].try_into().expect("4"));
        let index = u64::from_be_bytes(k[4..].try_into().expect("8"));
        let continues = current.is_some_and(|(g, last)| g == group && last + 1 == index);
        if !continues {
            // A new group, or a hole (which a log never has: refused below).
            if let Some((g, _)) = current {
                batch
                    .add_entries::<Raw>(u64::from(g), &std::mem::take(&mut run))
                    .map_err(err)?;
            }
            if current.is_none_or(|(g, _)| g != group) {
                // A partial copy of an interrupted migration is replaced, not continued.
                batch.add_command(u64::from(group), Command::Clean);
            } else {
                return Err(crate::Error::Storage(format!(
                    "group {group}'s log in RocksDB has a hole before {index}: not moved"
                )));
            }
        }
        run.push(raw_entry(index, &v));
        current = Some((group, index));
        (moved, bytes) = (moved + 1, bytes + v.len());
        if bytes >= CHUNK_BYTES {
            batch
                .add_entries::<Raw>(u64::from(group), &std::mem::take(&mut run))
                .map_err(err)?;
            log.write(&mut batch, false).map_err(err)?;
            bytes = 0;
        }
    }
    if records.is_empty() && current.is_none() {
        return Ok(false);
    }
    if let Some((g, _)) = current {
        batch.add_entries::<Raw>(u64::from(g), &run).map_err(err)?;
    }
    for (_, name, group, value) in &records {
        batch
            .put(RECORDS | u64::from(*group), name.to_vec(), value.clone())
            .map_err(err)?;
    }
    if batch.is_empty() {
        // Entries only, all written in chunks: a record-free batch still makes them durable.
        batch
            .put(SYNC_REGION, b"sync".to_vec(), Vec::new())
            .map_err(err)?;
    }
    log.write(&mut batch, true).map_err(err)?;
    // Durable in raft-engine: now the old layout goes, in one synced batch.
    let mut old = WriteBatch::default();
    old.delete_range_cf(entries, [0u8; LOG_KEY_BYTES], [0xffu8; LOG_KEY_BYTES]);
    old.delete_cf(entries, [0xffu8; LOG_KEY_BYTES]);
    for (key, ..) in &records {
        old.delete_cf(raft, key);
    }
    db.write_opt(old, &super::synced())?;
    tracing::info!(
        log_entries = moved,
        records = records.len(),
        "moved the Raft log from RocksDB into raft-engine"
    );
    Ok(true)
}

/// Rewrites layout 1 into group 0 of layout 2; does nothing for a directory without it. The
/// entries are copied in unsynced batches of at most 64 MiB (a log can hold gigabytes of
/// ScheduleBatch entries), then one synced batch deletes the old log and moves the records:
/// until that batch the old layout is whole, and a start after a crash copies the same entries
/// again.
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
        if bytes >= 64 << 20 {
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
    db.write_opt(batch, &super::synced())?;
    tracing::info!(
        log_entries = moved,
        "moved the single-group Raft log into group 0 of the log engine"
    );
    Ok(())
}
