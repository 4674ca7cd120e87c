//! Each namespace's first row after the fire cursor, kept in memory: which namespaces a Fire
//! entry must look at, and when the fire driver must wake.
//!
//! Keyed by namespace: a pinned namespace lives in one hash slot (`crate::keys::Space::home`),
//! and the Fire entry merges the namespaces' rows in slot order, whatever their hash slots,
//! so that `max` rows per entry never starve a high-numbered one.
//!
//! A cache of the state, not state: rebuilt from the database when the state machine opens and
//! after a snapshot is installed, and never written to it. What it may be is *early*: a head
//! at a slot whose row was moved away since (a cancel, a reschedule) only makes the next Fire
//! look at a namespace and find nothing there, after which the head is exact again. It is never
//! late: every row placed after the cursor is noted, so a Fire entry that looks only at the
//! namespaces whose head it reaches misses no row, and every replica fires the same rows.

use std::collections::{BTreeSet, HashMap};

use rocksdb::DB;

use super::read::Reader;
use super::{cf, CF_NSMETA};
use crate::keys::{self, Space};
use crate::wheel::Slot;
use crate::{Error, Result};

#[derive(Debug, Default)]
pub struct Heads {
    by_ns: HashMap<String, Slot>,
    order: BTreeSet<(Slot, String)>,
}

impl Heads {
    /// A row of `namespace` was placed at `slot`, after the cursor.
    pub fn note(&mut self, namespace: &str, slot: Slot) {
        match self.by_ns.get(namespace) {
            Some(head) if *head <= slot => {}
            _ => self.set(namespace, Some(slot)),
        }
    }

    /// `namespace`'s first row after the cursor is at `head` (`None`: it has none).
    pub fn set(&mut self, namespace: &str, head: Option<Slot>) {
        if let Some(old) = self.by_ns.remove(namespace) {
            self.order.remove(&(old, namespace.to_string()));
        }
        if let Some(slot) = head {
            self.by_ns.insert(namespace.to_string(), slot);
            self.order.insert((slot, namespace.to_string()));
        }
    }

    /// The namespaces whose head is at or before `upto`, earliest head first.
    pub fn due(&self, upto: Slot) -> Vec<String> {
        self.order
            .iter()
            .take_while(|(slot, _)| *slot <= upto)
            .map(|(_, ns)| ns.clone())
            .collect()
    }

    /// The earliest head of all.
    pub fn first(&self) -> Option<Slot> {
        self.order.first().map(|(slot, _)| *slot)
    }

    /// Makes every head as early as the contract allows (just after the cursor): the state of
    /// a cache whose rows all moved away unseen. Apply must write the same with
    /// it as with exact heads; the apply fuzzer puts a replica in this state to check that.
    pub fn all_early(&mut self, cursor: Slot) {
        let names: Vec<String> = self.by_ns.keys().cloned().collect();
        let early = Slot {
            seq: cursor.seq.saturating_add(1),
            ..cursor
        };
        for ns in names {
            self.set(&ns, Some(early));
        }
    }

    /// Reads every namespace's head after `cursor` from the database.
    pub fn load(db: &DB, space: Space, cursor: Slot) -> Result<Heads> {
        let mut heads = Heads::default();
        let group = space.prefix();
        for item in db.prefix_iterator_cf(cf(db, CF_NSMETA), group) {
            let (name, _) = item?;
            if !name.starts_with(&group) {
                break;
            }
            let ns = keys::decode_nsmeta_key(&name)
                .ok_or_else(|| Error::Storage("corrupt namespace name".into()))?;
            heads.set(&ns, Reader::live(db, space).first_after(&ns, cursor)?);
        }
        Ok(heads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bucket: u64) -> Slot {
        Slot::new(bucket, 1)
    }

    #[test]
    fn heads_keep_the_earliest_and_list_in_order() {
        let mut h = Heads::default();
        h.note("b", s(20));
        h.note("a", s(30));
        h.note("b", s(25)); // later than b's head: no change
        h.note("a", s(10)); // earlier: a's head moves
        assert_eq!(h.first(), Some(s(10)));
        assert_eq!(h.due(s(20)), ["a", "b"]);
        assert_eq!(h.due(s(15)), ["a"]);
        h.set("a", None);
        assert_eq!(h.due(s(100)), ["b"]);
        h.set("b", Some(s(40)));
        assert_eq!(h.due(s(30)), Vec::<String>::new());
        assert_eq!(h.first(), Some(s(40)));
    }
}
