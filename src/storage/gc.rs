//! Index entries of purged timers: dead at once, removed later by RocksDB's compaction.
//!
//! A purge deletes a namespace's rows and leases by range. Its timers' index entries (keyed by
//! id, so in no useful order) are not deleted one by one: an index entry whose slot is at or
//! behind its namespace's purge floor is **dead** — every reader treats it as absent ([`live`]),
//! apply included, so the logical state is the same on every replica whatever is on disk. A
//! compaction filter on the `index` family ([`IndexGc::filter`]) drops dead entries when
//! RocksDB compacts the files that hold them (RocksDB turns a dropped key into a tombstone, so
//! no older version of it can reappear).
//!
//! Snapshots and digests read one RocksDB snapshot of the index and must see every entry alive
//! in *that* state, but compaction filters ignore snapshots. So the floors the filter uses move
//! only while nothing is pinned: a snapshot build or digest holds a [`GcPin`] from before it
//! takes its RocksDB snapshot until it is done, and floors that advanced meanwhile take effect
//! when the last pin goes. The filter then never drops an entry that is alive in a state
//! someone is still reading.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rocksdb::compaction_filter::Decision;
use rocksdb::{IteratorMode, DB};

use super::meta::NsMeta;
use super::{cf, codec, CF_NSMETA};
use crate::keys::Group;
use crate::timer::TimerKey;
use crate::wheel::Slot;
use crate::Result;

/// Whether the index entry of a timer of a namespace, pointing at `slot`, is alive given the
/// namespace's purge floor.
pub fn live(slot: Slot, purged_to: Slot) -> bool {
    slot > purged_to
}

/// Whether an `index` row (`key`, `value`) read from some state is alive in it, given that
/// state's purge floors (`floor_of`, by namespace).
pub fn live_row(
    key: &[u8],
    value: &[u8],
    floor_of: &mut impl FnMut(&str) -> Result<Slot>,
) -> Result<bool> {
    let corrupt = || crate::Error::Storage("corrupt index row".into());
    let k = TimerKey::from_index_key(key).ok_or_else(corrupt)?;
    let slot = Slot::decode(value).ok_or_else(corrupt)?;
    Ok(live(slot, floor_of(&k.namespace)?))
}

/// The purge floors the compaction filter of one database uses.
#[derive(Debug, Default)]
pub struct IndexGc {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    pins: usize,
    /// By group and namespace: each group's replica of a namespace has its own floor.
    floors: HashMap<(Group, String), Slot>,
    /// Floors that advanced while pinned.
    deferred: HashMap<(Group, String), Slot>,
}

/// Holds the filter's floors still (see the module essay); released on drop.
pub struct GcPin(Arc<IndexGc>);

impl Drop for GcPin {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.pins -= 1;
        if s.pins == 0 {
            let deferred = std::mem::take(&mut s.deferred);
            for (at, floor) in deferred {
                raise(&mut s.floors, at, floor);
            }
        }
    }
}

fn raise(floors: &mut HashMap<(Group, String), Slot>, at: (Group, String), floor: Slot) {
    let f = floors.entry(at).or_default();
    *f = (*f).max(floor);
}

impl IndexGc {
    pub fn new() -> Arc<IndexGc> {
        Arc::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `namespace`'s purge floor in `group` is now `floor` (a purge was written).
    pub fn advance(&self, group: Group, namespace: &str, floor: Slot) {
        let mut s = self.lock();
        let at = (group, namespace.to_string());
        if s.pins == 0 {
            raise(&mut s.floors, at, floor);
        } else {
            raise(&mut s.deferred, at, floor);
        }
    }

    /// Holds the floors still until the pin is dropped.
    pub fn pin(self: &Arc<Self>) -> GcPin {
        self.lock().pins += 1;
        GcPin(self.clone())
    }

    /// Takes every namespace's purge floor, of every group, from the database (opened, or a
    /// snapshot installed).
    pub fn load(&self, db: &DB) -> Result<()> {
        for item in db.iterator_cf(cf(db, CF_NSMETA), IteratorMode::Start) {
            let (k, v) = item?;
            let meta: NsMeta = codec::decode(&v)?;
            let corrupt = || crate::Error::Storage("corrupt namespace name".into());
            let group = group_of(&k).ok_or_else(corrupt)?;
            let ns = crate::keys::decode_nsmeta_key(&k).ok_or_else(corrupt)?;
            self.advance(group, &ns, meta.purged_to);
        }
        Ok(())
    }

    /// The compaction filter of the `index` family: drops the dead entries.
    pub fn filter(self: &Arc<Self>) -> impl FnMut(u32, &[u8], &[u8]) -> Decision + Send + 'static {
        let gc = self.clone();
        move |_level, key, value| {
            let parsed = (
                group_of(key),
                TimerKey::from_index_key(key),
                Slot::decode(value),
            );
            let (Some(group), Some(k), Some(slot)) = parsed else {
                return Decision::Keep; // not ours to judge
            };
            let s = gc.lock();
            match s.floors.get(&(group, k.namespace)) {
                Some(floor) if !live(slot, *floor) => Decision::Remove,
                _ => Decision::Keep,
            }
        }
    }
}

/// The group a state key starts with.
fn group_of(key: &[u8]) -> Option<Group> {
    key.first_chunk::<2>().map(|g| Group::from_be_bytes(*g))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bucket: u64) -> Slot {
        Slot::new(bucket, 1)
    }

    #[test]
    fn the_filter_drops_only_dead_entries_and_waits_for_pins() {
        let gc = IndexGc::new();
        let mut f = gc.filter();
        let key = crate::timer::TimerKey::new("ns", "a").index_key(crate::keys::Space::of(3));
        // The same timer's entry in another group, whose namespace has no floor there.
        let other = crate::timer::TimerKey::new("ns", "a").index_key(crate::keys::Space::of(4));
        let mut removes = |slot: Slot| matches!(f(1, &key, &slot.encode()), Decision::Remove);
        assert!(!removes(s(5)), "no floor yet");
        gc.advance(3, "ns", s(5));
        assert!(removes(s(5)), "at the floor: dead");
        assert!(!removes(s(6)), "after it: alive");
        let pin = gc.pin();
        gc.advance(3, "ns", s(10));
        assert!(!removes(s(8)), "a pinned reader may still see it alive");
        drop(pin);
        assert!(removes(s(8)), "the floor moves when the last pin goes");
        assert!(!removes(s(11)));
        let mut f = gc.filter();
        assert!(matches!(f(1, b"junk", b"x"), Decision::Keep));
        assert!(
            matches!(f(1, &other, &s(1).encode()), Decision::Keep),
            "group 3's floor is not group 4's"
        );
    }
}
