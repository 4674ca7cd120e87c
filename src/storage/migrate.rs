//! Moving a format-5 state (one fire cursor, keys without group or hash slot) into format 6's
//! layout (`crate::keys`: group 0 owning every hash slot, one fire cursor per hash slot).
//!
//! Format 6 lives in new column families (`g_wheel`, `g_index`, …): RocksDB cannot rename a
//! family, and old and new keys could not be told apart in one (a deadline or a bucket starts
//! with two zero bytes, as group 0 does). The format-5 families stay, empty: the source of
//! this rewrite when a data directory is opened ([`upgrade`]), and its staging area when a
//! format-5 snapshot or backup is installed (`snapshot.rs`, `restore.rs`): its rows are loaded
//! into them as they were written, then rewritten here ([`rewrite`]).
//!
//! What the rewrite does, family by family:
//! - keys gain `G H` (group 0, the namespace's hash slot), slots gain era 0 (18 bytes);
//!   deadlines become `G deadline H ns to`; `series_due` keys `G slot H`;
//! - values are copied as they are: a slot in a value (a lease's `from`, a namespace's
//!   cursors, a series' next slot) is bincode whose era-0 bytes are format 5's (`wheel::Slot`),
//!   and an index entry's 16-byte slot becomes 18 bytes;
//! - the fire cursor stays one, group 0's (in `progress`, whose bytes do not change: per hash
//!   slot only at a committed cut-over, docs/sharding.md §12 step 6), so a replica rewritten at
//!   any index goes on exactly as format 5 would have (each replica rewrites at its own);
//! - a fire record (`end` → its index and time) is copied to every hash slot with a row at or
//!   behind the cursor that it fired (the first record at or after the row): what `derive`
//!   reads for that row; a hash slot with none needs no record;
//! - `format` and `bucket_ms` become node-wide (`0xFFFF name`).
//!
//! Batches of at most [`BATCH_BYTES`], unsynced; the last one, synced, writes format 6 (in the
//! new `meta` and, alone, in the old: a build before format 6 then refuses the directory with
//! its format named) and clears the old families. A crash before it leaves format 5 in place,
//! and the next start clears the new families and rewrites again from the start.

use std::collections::BTreeSet;

use rocksdb::{DBRawIterator, IteratorMode, WriteBatch, DB};

use super::meta::{self, Progress};
use super::read::FiredBy;
use super::{cf, codec, CF_META};
use crate::keys::{self, HSlot, Space, GROUP_ZERO};

/// The group a format-5 state becomes: group 0, owning every hash slot.
const G0: Space = Space::of(GROUP_ZERO);
use crate::wheel::Slot;
use crate::{Error, Result};

/// The format-5 families, in format 5's snapshot order (a format-5 file names a family by its
/// place here).
pub const V5_CFS: [&str; 10] = [
    "wheel",
    "index",
    "fires",
    "leases",
    "deadlines",
    "meta",
    "nsmeta",
    "namespaces",
    "series",
    "series_due",
];
const V5_WHEEL: &str = V5_CFS[0];
const V5_INDEX: &str = V5_CFS[1];
const V5_FIRES: &str = V5_CFS[2];
const V5_LEASES: &str = V5_CFS[3];
const V5_DEADLINES: &str = V5_CFS[4];
/// The format-5 `meta` family; after the rewrite it holds `format` = 6 alone.
pub const V5_META: &str = V5_CFS[5];
const V5_NSMETA: &str = V5_CFS[6];
const V5_NAMESPACES: &str = V5_CFS[7];
const V5_SERIES: &str = V5_CFS[8];
const V5_SERIES_DUE: &str = V5_CFS[9];

/// Format 5's `meta` key of its format.
pub const V5_FORMAT: &[u8] = b"format";

/// Most bytes of one unsynced batch.
const BATCH_BYTES: usize = 4 << 20;

/// A key above every key of every family, old or new.
const TOP: [u8; 32] = [0xff; 32];

/// Rewrites the format-5 state of a data directory (`storage::check_format` found format 4
/// or 5 in the old `meta`) into format 6, in place.
pub(super) fn upgrade(db: &DB) -> Result<()> {
    tracing::info!("rewriting the state into storage format 6 (groups and hash slots)");
    let mut clear = WriteBatch::default();
    for name in super::SM_CFS {
        clear.delete_range_cf(cf(db, name), [].as_slice(), TOP.as_slice());
    }
    db.write(clear)?;
    let rows = rewrite(db, |_| {})?;
    tracing::info!(rows, "storage format 6");
    Ok(())
}

/// Rewrites the rows in the format-5 families into the format-6 ones (which hold nothing of
/// group 0), and ends with one synced batch to which `last` adds; returns the rows read.
pub(super) fn rewrite(db: &DB, last: impl FnOnce(&mut WriteBatch)) -> Result<u64> {
    let mut w = Writer {
        db,
        batch: WriteBatch::default(),
        rows: 0,
    };
    let mut progress: Option<Progress> = db
        .get_cf(cf(db, V5_META), b"progress")?
        .map(|v| codec::decode(&v))
        .transpose()?;
    if let Some(p) = &mut progress {
        p.cursor = v5_end(p.cursor);
    }
    let cursor = progress.as_ref().map_or(Slot::ZERO, |p| p.cursor);
    w.wheel(cursor)?;
    w.copy(V5_INDEX, super::CF_INDEX, |k, v| {
        let (ns, id) = keys::decode_timer_name(k)?;
        let slot = v5_slot(v)?;
        Some((G0.timer_key(&ns, &id), slot.encode().to_vec()))
    })?;
    w.copy(V5_LEASES, super::CF_LEASES, |k, v| {
        let (ns, to) = v5_slot_key(k)?;
        Some((G0.slot_key(&ns, to), v.to_vec()))
    })?;
    w.copy(V5_DEADLINES, super::CF_DEADLINES, |k, v| {
        let (at, rest) = k.split_first_chunk::<8>()?;
        let (ns, to) = v5_slot_key(rest)?;
        Some((
            G0.deadline_key(u64::from_be_bytes(*at) as i64, &ns, to),
            v.to_vec(),
        ))
    })?;
    w.copy(V5_NSMETA, super::CF_NSMETA, |k, v| {
        let ns = std::str::from_utf8(k).ok()?;
        Some((G0.nsmeta_key(ns), v.to_vec()))
    })?;
    w.copy(V5_NAMESPACES, super::CF_NAMESPACES, |k, v| {
        let ns = std::str::from_utf8(k).ok()?;
        Some((G0.namespace_key(ns), v.to_vec()))
    })?;
    w.copy(V5_SERIES, super::CF_RECURRING, |k, v| {
        let (ns, id) = keys::decode_timer_name(k)?;
        Some((G0.timer_key(&ns, &id), v.to_vec()))
    })?;
    w.copy(V5_SERIES_DUE, super::CF_RECURRING_DUE, |k, v| {
        let slot = v5_slot(k)?;
        let (ns, _) = keys::decode_timer_name(v)?;
        Some((keys::series_due_key(G0.home(&ns), slot), v.to_vec()))
    })?;
    w.meta(progress)?;
    let Writer {
        mut batch, rows, ..
    } = w;
    // A sharded node's format (7) stays: only a build that knows groups may open it again.
    let sharded =
        db.get_cf(cf(db, CF_META), meta::FORMAT)? == Some(codec::encode(&super::SHARDED_FORMAT));
    if !sharded {
        batch.put_cf(cf(db, CF_META), meta::FORMAT, codec::encode(&super::FORMAT));
    }
    for name in V5_CFS {
        batch.delete_range_cf(cf(db, name), [].as_slice(), TOP.as_slice());
    }
    batch.put_cf(cf(db, V5_META), V5_FORMAT, codec::encode(&super::FORMAT));
    last(&mut batch);
    db.write_opt(batch, &super::synced())?;
    Ok(rows)
}

/// Format 6's key of format 5's `meta` record `name`; `None` if format 5 had none of it.
pub fn v5_meta_key(name: &[u8]) -> Option<Vec<u8>> {
    let group = [
        meta::LAST_APPLIED,
        meta::MEMBERSHIP,
        meta::PROGRESS,
        meta::ACCESS,
        meta::LEVEL,
    ];
    Some(match name {
        _ if group.contains(&name) => G0.meta_key(name),
        b"bucket_ms" => meta::BUCKET_MS.to_vec(),
        b"format" => meta::FORMAT.to_vec(),
        _ => return None,
    })
}

/// A format-5 slot: bucket, seq (16 bytes).
fn v5_slot(bytes: &[u8]) -> Option<Slot> {
    let (bucket, seq) = bytes.split_first_chunk::<8>()?;
    let seq: [u8; 8] = seq.try_into().ok()?;
    Some(v5_end(Slot::new(
        u64::from_be_bytes(*bucket),
        u64::from_be_bytes(seq),
    )))
}

/// Format 5's end of a bucket (seq `u64::MAX`, the cursor after a whole bucket) is format 6's
/// `Slot::end_of`, which is after every era's rows too.
fn v5_end(slot: Slot) -> Slot {
    match slot.seq {
        u64::MAX => Slot::end_of(slot.bucket),
        _ => slot,
    }
}

/// A format-5 row or lease key: `ns_len ns slot`.
fn v5_slot_key(bytes: &[u8]) -> Option<(String, Slot)> {
    let (len, rest) = bytes.split_first_chunk::<2>()?;
    let len = u16::from_be_bytes(*len) as usize;
    if rest.len() != len + 16 {
        return None;
    }
    let (ns, slot) = rest.split_at(len);
    Some((String::from_utf8(ns.to_vec()).ok()?, v5_slot(slot)?))
}

struct Writer<'a> {
    db: &'a DB,
    batch: WriteBatch,
    rows: u64,
}

impl Writer<'_> {
    fn put(&mut self, family: &str, k: &[u8], v: &[u8]) -> Result<()> {
        self.batch.put_cf(cf(self.db, family), k, v);
        if self.batch.size_in_bytes() >= BATCH_BYTES {
            self.db.write(std::mem::take(&mut self.batch))?;
        }
        Ok(())
    }

    /// Copies every row of `from` into `to`, rewritten by `f`.
    fn copy(
        &mut self,
        from: &str,
        to: &str,
        f: impl Fn(&[u8], &[u8]) -> Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<()> {
        for item in self.db.iterator_cf(cf(self.db, from), IteratorMode::Start) {
            let (k, v) = item?;
            let (k2, v2) = f(&k, &v).ok_or_else(|| corrupt(from, &k))?;
            self.put(to, &k2, &v2)?;
            self.rows += 1;
        }
        Ok(())
    }

    /// The rows, and the fire records of the rows at or behind `cursor`.
    fn wheel(&mut self, cursor: Slot) -> Result<()> {
        let mut fires = self.db.raw_iterator_cf(cf(self.db, V5_FIRES));
        let mut copied: BTreeSet<(HSlot, Slot)> = BTreeSet::new();
        let mut fired = FiredBy::new(cursor);
        for item in self
            .db
            .iterator_cf(cf(self.db, V5_WHEEL), IteratorMode::Start)
        {
            let (k, v) = item?;
            let (ns, slot) = v5_slot_key(&k).ok_or_else(|| corrupt(V5_WHEEL, &k))?;
            self.put(super::CF_WHEEL, &G0.slot_key(&ns, slot), &v)?;
            self.rows += 1;
            // A row the cursor passed with no record: format 5 could not read it either
            // (`fire_record`); carried over as it was.
            let Some((end, Some(record))) =
                fired.record(&ns, slot, || record_at(&mut fires, slot))?
            else {
                continue;
            };
            let home = G0.home(&ns);
            if copied.insert((home.hslot, end)) {
                self.put(super::CF_FIRES, &keys::hslot_slot_key(home, end), &record)?;
            }
        }
        fires.status()?;
        Ok(())
    }

    /// `meta`: group 0's records (the progress with its cursor as format 6 writes an end of
    /// bucket), the node-wide records.
    fn meta(&mut self, progress: Option<Progress>) -> Result<()> {
        let mut had_progress = false;
        for item in self
            .db
            .iterator_cf(cf(self.db, V5_META), IteratorMode::Start)
        {
            let (k, v) = item?;
            let Some(key) = v5_meta_key(&k) else {
                return Err(corrupt(V5_META, &k));
            };
            if key == meta::FORMAT {
                continue; // written at the end, as 6
            }
            if key == G0.meta_key(meta::PROGRESS) {
                had_progress = true;
                continue;
            }
            self.put(CF_META, &key, &v)?;
            self.rows += 1;
        }
        if let Some(p) = progress.filter(|_| had_progress) {
            self.put(CF_META, &G0.meta_key(meta::PROGRESS), &codec::encode(&p))?;
        }
        Ok(())
    }
}

/// The first format-5 fire record at or after `slot`: its end and its value.
fn record_at(fires: &mut DBRawIterator<'_>, slot: Slot) -> Result<Option<(Slot, Vec<u8>)>> {
    let mut key = slot.bucket.to_be_bytes().to_vec();
    key.extend_from_slice(&slot.seq.to_be_bytes());
    fires.seek(&key);
    fires.status()?;
    match (fires.key(), fires.value()) {
        (Some(k), Some(v)) => {
            let end = v5_slot(k).ok_or_else(|| corrupt(V5_FIRES, k))?;
            Ok(Some((end, v.to_vec())))
        }
        _ => Ok(None),
    }
}

fn corrupt(family: &str, key: &[u8]) -> Error {
    Error::Storage(format!(
        "format-5 {family} record {} cannot be read",
        String::from_utf8_lossy(key)
    ))
}
