//! Reads of the state machine's column families, either of the database as it is (apply, which
//! is the only writer) or of one RocksDB snapshot (the read side: a timer's state is derived
//! from several keys, which must all come from one applied state).

use std::collections::BTreeSet;

use rocksdb::{DBRawIterator, IteratorMode, ReadOptions, Snapshot, DB};

use super::meta::{self, Progress};
use super::row::Lease;
use super::{cf, codec, prefix_end, CF_FIRES, CF_LEASES, CF_META, CF_WHEEL};
use crate::keys::{self, Home, Space};
use crate::wheel::Slot;
use crate::{Error, Result};

pub struct Reader<'a> {
    pub db: &'a DB,
    /// The group read: the keys of every question are its.
    pub space: Space,
    snap: Option<Snapshot<'a>>,
}

impl<'a> Reader<'a> {
    /// Reads group `space`'s state in the database as it is.
    pub fn live(db: &'a DB, space: Space) -> Self {
        Reader {
            db,
            space,
            snap: None,
        }
    }

    /// Reads group `space`'s state in one snapshot of the database, taken now.
    pub fn snapshot(db: &'a DB, space: Space) -> Self {
        Reader {
            db,
            space,
            snap: Some(db.snapshot()),
        }
    }

    fn opts(&self) -> ReadOptions {
        let mut opts = ReadOptions::default();
        if let Some(s) = &self.snap {
            opts.set_snapshot(s);
        }
        opts
    }

    pub fn get(&self, family: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get_cf_opt(cf(self.db, family), key, &self.opts())?)
    }

    /// A raw iterator over `family`'s keys in `[lower, upper)`, positioned on the first.
    pub fn iter(&self, family: &str, lower: Vec<u8>, upper: Option<Vec<u8>>) -> DBRawIterator<'_> {
        let mut opts = self.opts();
        opts.set_iterate_lower_bound(lower);
        if let Some(u) = upper {
            opts.set_iterate_upper_bound(u);
        }
        let mut iter = self.db.raw_iterator_cf_opt(cf(self.db, family), opts);
        iter.seek_to_first();
        iter
    }

    /// `namespace`'s rows in `(after, upto]`.
    pub fn rows_between(&self, namespace: &str, after: Slot, upto: Slot) -> DBRawIterator<'_> {
        self.iter(
            CF_WHEEL,
            self.space.slot_key_after(namespace, after),
            Some(self.space.slot_key_after(namespace, upto)),
        )
    }

    /// The slot of `namespace`'s first row after `after`.
    pub fn first_after(&self, namespace: &str, after: Slot) -> Result<Option<Slot>> {
        let upper = prefix_end(&self.space.namespace_prefix(namespace));
        let iter = self.iter(
            CF_WHEEL,
            self.space.slot_key_after(namespace, after),
            Some(upper),
        );
        iter.status()?;
        iter.key().map(slot_of_key).transpose()
    }

    /// The lease of `namespace` whose range holds `slot`: its end and the lease.
    pub fn lease_covering(&self, namespace: &str, slot: Slot) -> Result<Option<(Slot, Lease)>> {
        let upper = prefix_end(&self.space.namespace_prefix(namespace));
        let iter = self.iter(CF_LEASES, self.space.slot_key(namespace, slot), Some(upper));
        iter.status()?;
        let (Some(k), Some(v)) = (iter.key(), iter.value()) else {
            return Ok(None);
        };
        let to = slot_of_key(k)?;
        let lease: Lease = codec::decode(v)?;
        Ok((lease.from < slot).then_some((to, lease)))
    }

    /// The (fire index, fired_at) of the Fire entry whose move of hash slot `home`'s cursor
    /// passed `slot`: its first record at or after `slot` (never another hash slot's).
    pub fn fire_record(&self, home: Home, slot: Slot) -> Result<(u64, i64)> {
        let upper = prefix_end(&home.prefix());
        let iter = self.iter(CF_FIRES, keys::hslot_slot_key(home, slot), Some(upper));
        iter.status()?;
        match iter.value() {
            Some(v) => codec::decode(v),
            None => Err(Error::Storage(format!("no fire record covers {slot}"))),
        }
    }
}

/// The slot at the end of a row or lease key.
pub fn slot_of_key(key: &[u8]) -> Result<Slot> {
    key.len()
        .checked_sub(crate::wheel::SLOT_BYTES)
        .and_then(|at| Slot::decode(&key[at..]))
        .ok_or_else(|| Error::Storage("corrupt row key".into()))
}

/// Names the fire record that fired each row at or behind the fire cursor, for rows read in
/// key order (a namespace's rows together, in slot order): the first record at or after the
/// row in its hash slot (format 5: the first of all). A row not past the record found for the
/// last row of its namespace has the same one, so each record costs one seek.
pub struct FiredBy {
    cursor: Slot,
    last: Option<(String, Slot)>,
}

impl FiredBy {
    pub fn new(cursor: Slot) -> Self {
        FiredBy { cursor, last: None }
    }

    /// The end of the record that fired `namespace`'s row at `slot`, with what `seek` found
    /// when it had to look. `None` when the row is ahead of the cursor, or when `seek` finds
    /// no record (a row format 5 could not read either: `Reader::fire_record`).
    pub fn record<T>(
        &mut self,
        namespace: &str,
        slot: Slot,
        seek: impl FnOnce() -> Result<Option<(Slot, T)>>,
    ) -> Result<Option<(Slot, Option<T>)>> {
        if slot > self.cursor {
            return Ok(None);
        }
        if let Some((ns, end)) = &self.last {
            if ns == namespace && slot <= *end {
                return Ok(Some((*end, None)));
            }
        }
        let Some((end, found)) = seek()? else {
            return Ok(None);
        };
        self.last = Some((namespace.to_string(), end));
        Ok(Some((end, Some(found))))
    }
}

/// The keys of the fire records that some row of `snap` needs ([`FiredBy`]): the records a
/// digest hashes. A Fire writes a record in each hash slot whose rows it passed; when those
/// rows later move on (a nack, a cancel, a redrive) the record stays, read by nothing, and a
/// replica rewritten from format 5 at a later index never had it (`migrate.rs` copies the
/// records rows need), so hashing every record would tell two correct replicas apart.
pub fn needed_fire_records(
    db: &DB,
    space: Space,
    snap: &Snapshot<'_>,
) -> Result<BTreeSet<Vec<u8>>> {
    let progress = space.meta_key(meta::PROGRESS);
    let progress: Progress = match snap.get_cf(cf(db, CF_META), progress)? {
        Some(v) => codec::decode(&v)?,
        None => Progress::default(),
    };
    let opts = || {
        let mut opts = ReadOptions::default();
        opts.set_snapshot(snap);
        opts.set_iterate_upper_bound(prefix_end(&space.prefix()));
        opts
    };
    let mut fires = db.raw_iterator_cf_opt(cf(db, CF_FIRES), opts());
    let mut fired = FiredBy::new(progress.cursor);
    let mut needed = BTreeSet::new();
    let rows = IteratorMode::From(&space.prefix(), rocksdb::Direction::Forward);
    for item in db.iterator_cf_opt(cf(db, CF_WHEEL), opts(), rows) {
        let (k, _) = item?;
        let (ns, slot) =
            keys::decode_slot_key(&k).ok_or_else(|| Error::Storage("corrupt row key".into()))?;
        let home = space.home(&ns);
        let seek = || {
            fires.seek(keys::hslot_slot_key(home, slot));
            fires.status()?;
            Ok(fires
                .key()
                .and_then(keys::decode_hslot_slot_key)
                .filter(|(h, _)| *h == home)
                .map(|(_, end)| (end, ())))
        };
        if let Some((end, Some(()))) = fired.record(&ns, slot, seek)? {
            needed.insert(keys::hslot_slot_key(home, end));
        }
    }
    Ok(needed)
}
