//! Applying a Purge: a namespace's finished timers deleted by range once their retention passed.
//!
//! What may go: the rows of a namespace between its purge floor and a lease's end `through`,
//! once every lease in that range has settled (its timers are acked, or were moved away as
//! retries and dead letters, or were finished before it passed them) at least the namespace's
//! retention before the entry's time. The leader's purger proposes the range; apply checks the
//! rule again, so a stale proposal deletes nothing.
//!
//! What it writes: one `DeleteRange` for the rows, one for the leases, the namespace's new
//! purge floor (which kills the purged timers' index entries: see `gc.rs`), and one
//! `DeleteRange` for the fire records no namespace needs any more (those before every
//! namespace's first stored row). Nothing per timer.

use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::apply::Applier;
use super::row::Lease;
use super::{cf, codec, prefix_end, CF_FIRES, CF_LEASES, CF_NSMETA, CF_WHEEL};
use crate::command::Response;
use crate::keys::{self, Space};
use crate::wheel::Slot;
use crate::{Error, Result};

impl Applier<'_> {
    pub(super) fn purge(
        &mut self,
        now_ms: i64,
        namespace: &str,
        through: Slot,
    ) -> Result<Response> {
        let meta = *self.ns(namespace)?;
        let from = meta.purged_to;
        if through <= from
            || through > meta.delivered_to
            || !self.purgeable(now_ms, namespace, from, through)?
        {
            return Ok(Response::Purged(0));
        }
        // Counted, not read: their index entries die with the floor (see `gc.rs`).
        let mut count = 0u64;
        let reader = self.reader();
        let mut iter = reader.rows_between(namespace, from, through);
        while iter.valid() {
            count += 1;
            iter.next();
        }
        iter.status()?;
        drop(iter);
        drop(reader);
        let (lo, hi) = (
            self.space.slot_key_after(namespace, from),
            self.space.slot_key_after(namespace, through),
        );
        self.batch.delete_range_cf(cf(self.db, CF_WHEEL), &lo, &hi);
        self.batch.delete_range_cf(cf(self.db, CF_LEASES), &lo, &hi);
        self.count_stored(namespace, -(count as i64))?;
        self.ns(namespace)?.purged_to = through;
        self.purged.push((namespace.to_string(), through));
        self.forget_fires(namespace)?;
        Ok(Response::Purged(count))
    }

    /// Whether the leases of `(from, through]` tile it, every one settled at least the
    /// namespace's retention before `now_ms`.
    fn purgeable(
        &mut self,
        now_ms: i64,
        namespace: &str,
        from: Slot,
        through: Slot,
    ) -> Result<bool> {
        let retention = self.policy(namespace)?.retention_ms as i64;
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(self.space.slot_key_after(namespace, through));
        let start = self.space.slot_key_after(namespace, from);
        let iter = self.db.iterator_cf_opt(
            cf(self.db, CF_LEASES),
            opts,
            IteratorMode::From(&start, Direction::Forward),
        );
        let mut next_from = from;
        for item in iter {
            let (k, v) = item?;
            let (_, to) = keys::decode_slot_key(&k)
                .ok_or_else(|| Error::Storage("corrupt lease key".into()))?;
            let lease: Lease = codec::decode(&v)?;
            let old_enough = lease
                .settled
                .is_some_and(|s| s.at_ms.saturating_add(retention) <= now_ms);
            if lease.from != next_from || !old_enough {
                return Ok(false);
            }
            next_from = to;
        }
        Ok(next_from == through)
    }

    /// Deletes the fire records of `namespace`'s hash slot before the first stored row of its
    /// namespaces: a record is read only for a fired `Pending` row of its hash slot at or before
    /// its end, and none can be before all of them. Only this hash slot's can change with a
    /// purge of `namespace`; its namespaces are read from `nsmeta` (replicated), as this entry
    /// left them.
    fn forget_fires(&mut self, namespace: &str) -> Result<()> {
        let home = self.space.home(namespace);
        let prefix = home.prefix();
        let mut names = Vec::new();
        for item in self.db.prefix_iterator_cf(cf(self.db, CF_NSMETA), prefix) {
            let (k, _) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            let ns = keys::decode_nsmeta_key(&k)
                .ok_or_else(|| Error::Storage("corrupt namespace name".into()))?;
            names.push(ns);
        }
        if !names.iter().any(|n| n == namespace) {
            names.push(namespace.to_string()); // not in the database's `nsmeta` (yet)
        }
        let mut first: Option<Slot> = None;
        for ns in names {
            let floor = self.ns(&ns)?.purged_to;
            if let Some(slot) = self.reader().first_after(&ns, floor)? {
                first = Some(first.map_or(slot, |f: Slot| f.min(slot)));
            }
        }
        // Nothing stored in it: every record may go but the newest, whose end is at most the
        // cursor.
        let keep_from = first.unwrap_or(self.progress.cursor);
        self.batch.delete_range_cf(
            cf(self.db, CF_FIRES),
            keys::hslot_slot_key(home, Slot::ZERO),
            keys::hslot_slot_key(home, keep_from),
        );
        Ok(())
    }
}

/// The ranges of `namespace` a purge may delete at `now_ms`: the end of the longest run of
/// leases from its purge floor that all settled a retention ago, and the rows that holds.
/// Read by the leader's purger; apply checks it again.
pub fn purgeable_through(
    db: &rocksdb::DB,
    space: Space,
    namespace: &str,
    from: Slot,
    retention_ms: u64,
    now_ms: i64,
    max_rows: u64,
) -> Result<Option<(Slot, u64)>> {
    let mut opts = ReadOptions::default();
    opts.set_iterate_upper_bound(prefix_end(&space.namespace_prefix(namespace)));
    let start = space.slot_key_after(namespace, from);
    let iter = db.iterator_cf_opt(
        cf(db, CF_LEASES),
        opts,
        IteratorMode::From(&start, Direction::Forward),
    );
    let (mut through, mut rows) = (None, 0u64);
    for item in iter {
        let (k, v) = item?;
        let (_, to) =
            keys::decode_slot_key(&k).ok_or_else(|| Error::Storage("corrupt lease key".into()))?;
        let lease: Lease = codec::decode(&v)?;
        let old_enough = lease
            .settled
            .is_some_and(|s| s.at_ms.saturating_add(retention_ms as i64) <= now_ms);
        if !old_enough || (rows > 0 && rows + lease.rows as u64 > max_rows) {
            break;
        }
        rows += lease.rows as u64;
        through = Some(to);
    }
    Ok(through.map(|t| (t, rows)))
}
