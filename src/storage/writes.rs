//! An entry's writes: each goes into the entry's one `WriteBatch` and, where a later command
//! of the same entry may read it, into the entry's staged copy (rows, index entries, leases,
//! namespace counts). New rows are placed after the fire cursor (`place`, `next_slot`), and a
//! placement earlier than the fire driver's sleep wakes it once the entry is applied.

use super::apply::Applier;
use super::row::{Lease, Row};
use super::{cf, codec, CF_INDEX, CF_LEASES, CF_WHEEL};
use crate::wheel::{Slot, MAX_ROWS_PER_ENTRY};
use crate::{Error, Result};

impl Applier<'_> {
    pub(super) fn put_row(&mut self, namespace: &str, slot: Slot, row: Row) {
        self.batch.put_cf(
            cf(self.db, CF_WHEEL),
            self.space.slot_key(namespace, slot),
            row.encode(),
        );
        if self.stage {
            self.rows.insert(slot, Some(row));
        }
    }

    pub(super) fn delete_row(&mut self, namespace: &str, slot: Slot) {
        self.batch
            .delete_cf(cf(self.db, CF_WHEEL), self.space.slot_key(namespace, slot));
        self.rows.insert(slot, None);
    }

    /// Points the index entry `k` (a `TimerKey::index_key`) at `slot`, or deletes it.
    pub(super) fn set_index(&mut self, k: Vec<u8>, slot: Option<Slot>) {
        match slot {
            Some(s) => self.batch.put_cf(cf(self.db, CF_INDEX), &k, s.encode()),
            None => self.batch.delete_cf(cf(self.db, CF_INDEX), &k),
        }
        if self.stage {
            self.index_staged.insert(k, slot);
        }
    }

    pub(super) fn put_lease(&mut self, namespace: &str, to: Slot, lease: Lease) {
        self.batch.put_cf(
            cf(self.db, CF_LEASES),
            self.space.slot_key(namespace, to),
            codec::encode(&lease),
        );
        self.leases.insert((namespace.to_string(), to), lease);
    }

    /// Puts `row` of `namespace` after the cursor, due at `due_ms`, and indexes it there.
    pub(super) fn place(&mut self, namespace: &str, row: Row, due_ms: i64) -> Result<Slot> {
        let slot = self.next_slot(due_ms)?;
        let key = self.space.timer_key(namespace, &row.body.id);
        self.put_row(namespace, slot, row);
        self.set_index(key, Some(slot));
        self.placed_at(namespace, slot);
        Ok(slot)
    }

    /// The slot for the entry's next row, due at `due_ms`.
    pub(super) fn next_slot(&mut self, due_ms: i64) -> Result<Slot> {
        if self.next_pos >= MAX_ROWS_PER_ENTRY {
            return Err(Error::Internal(format!(
                "entry {} places more than {MAX_ROWS_PER_ENTRY} rows",
                self.index
            )));
        }
        let seq = Slot::seq(self.index, self.next_pos);
        self.next_pos += 1;
        Ok(self.wheel.placement(due_ms, self.progress.cursor, seq))
    }

    /// Records a row placed at `slot`, for the heads and the fire driver's wake-up.
    pub(super) fn placed_at(&mut self, namespace: &str, slot: Slot) {
        match self.placed.get_mut(namespace) {
            Some(first) => *first = (*first).min(slot),
            None => {
                self.placed.insert(namespace.to_string(), slot);
            }
        }
        self.wakes_at(self.wheel.due_ms(slot.bucket));
    }

    /// Deletes the row at `slot` and places `row` anew, due at `due_ms`.
    pub(super) fn move_row(
        &mut self,
        namespace: &str,
        slot: Slot,
        row: Row,
        due_ms: i64,
    ) -> Result<Slot> {
        self.delete_row(namespace, slot);
        self.place(namespace, row, due_ms)
    }

    /// Something this entry wrote comes due at `due_ms`: the driver must not sleep past it.
    pub(super) fn wakes_at(&mut self, due_ms: i64) {
        self.earliest_new_due = Some(self.earliest_new_due.map_or(due_ms, |d| d.min(due_ms)));
    }

    /// Counts timers of `namespace` entering (+) or leaving (−) PENDING.
    pub(super) fn count_pending(&mut self, namespace: &str, delta: i64) -> Result<()> {
        self.progress.pending = self.progress.pending.saturating_add_signed(delta);
        let ns = self.ns(namespace)?;
        ns.pending = ns.pending.saturating_add_signed(delta);
        Ok(())
    }

    /// Counts timers of `namespace` created (+) or purged (−).
    pub(super) fn count_stored(&mut self, namespace: &str, delta: i64) -> Result<()> {
        self.progress.stored = self.progress.stored.saturating_add_signed(delta);
        let ns = self.ns(namespace)?;
        ns.stored = ns.stored.saturating_add_signed(delta);
        Ok(())
    }
}
