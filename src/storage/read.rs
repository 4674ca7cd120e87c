//! Reads of the state machine's column families, either of the database as it is (apply, which
//! is the only writer) or of one RocksDB snapshot (the read side: a timer's state is derived
//! from several keys, which must all come from one applied state).

use rocksdb::{DBRawIterator, ReadOptions, Snapshot, DB};

use super::row::Lease;
use super::{cf, codec, prefix_end, CF_FIRES, CF_LEASES, CF_WHEEL};
use crate::keys::{self, Home};
use crate::wheel::Slot;
use crate::{Error, Result};

pub struct Reader<'a> {
    pub db: &'a DB,
    snap: Option<Snapshot<'a>>,
}

impl<'a> Reader<'a> {
    /// Reads the database as it is.
    pub fn live(db: &'a DB) -> Self {
        Reader { db, snap: None }
    }

    /// Reads one snapshot of the database, taken now.
    pub fn snapshot(db: &'a DB) -> Self {
        Reader {
            db,
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
            keys::slot_key_after(namespace, after),
            Some(keys::slot_key_after(namespace, upto)),
        )
    }

    /// The slot of `namespace`'s first row after `after`.
    pub fn first_after(&self, namespace: &str, after: Slot) -> Result<Option<Slot>> {
        let upper = prefix_end(&keys::namespace_prefix(namespace));
        let iter = self.iter(
            CF_WHEEL,
            keys::slot_key_after(namespace, after),
            Some(upper),
        );
        iter.status()?;
        iter.key().map(slot_of_key).transpose()
    }

    /// The lease of `namespace` whose range holds `slot`: its end and the lease.
    pub fn lease_covering(&self, namespace: &str, slot: Slot) -> Result<Option<(Slot, Lease)>> {
        let upper = prefix_end(&keys::namespace_prefix(namespace));
        let iter = self.iter(CF_LEASES, keys::slot_key(namespace, slot), Some(upper));
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
