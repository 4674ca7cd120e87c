//! The digest of a group's state (guarantee 8, `Cluster.Digest`): one hash of everything its
//! state machine holds, read from one RocksDB snapshot, so that equal applied indexes give equal
//! digests on every correct replica of the group, and the simulator's trails compare them.
//!
//! What is logically absent is left out, however it lies on disk: index entries of purged
//! timers (`gc.rs`: compaction drops them later), and fire records no row reads any more
//! (`read::needed_fire_records`: a replica rewritten from format 5 never had them).

use std::collections::HashMap;

use rocksdb::{Direction, IteratorMode, ReadOptions, DB};

use super::gc;
use super::meta::{self, NsMeta};
use super::{
    cf, codec, decode, prefix_end, Fnv64, Store, CF_FIRES, CF_INDEX, CF_META, CF_NSMETA, SM_CFS,
};
use crate::keys::Space;
use crate::wheel::Slot;
use crate::Result;

impl Store {
    /// A digest of the group's state machine (its prefix of every family) and the applied
    /// index it describes, read from one consistent RocksDB snapshot. Equal applied index ⇒
    /// equal digest on every correct replica of the group.
    pub fn digest(&self) -> Result<(u64, u64)> {
        let _pin = self.gc.pin();
        let snap = self.db.snapshot();
        let mut floors = floors_of(&self.db, self.space, &snap);
        let needed_fires = super::read::needed_fire_records(&self.db, self.space, &snap)?;
        let group = self.space.prefix();
        let mut h = Fnv64::new();
        for name in SM_CFS {
            h.write(name.as_bytes());
            let mut opts = ReadOptions::default();
            opts.set_snapshot(&snap);
            opts.set_iterate_upper_bound(prefix_end(&group));
            let start = IteratorMode::From(&group, Direction::Forward);
            let iter = self.db.iterator_cf_opt(cf(&self.db, name), opts, start);
            for item in iter {
                let (k, v) = item?;
                if name == CF_INDEX && !gc::live_row(&k, &v, &mut floors)? {
                    continue; // purged: logically gone, physically maybe not yet
                }
                if name == CF_FIRES && !needed_fires.contains(&*k) {
                    continue; // no row reads it (`needed_fire_records`)
                }
                h.write(&(k.len() as u64).to_be_bytes());
                h.write(&k);
                h.write(&(v.len() as u64).to_be_bytes());
                h.write(&v);
            }
        }
        let last_applied = self.space.meta_key(meta::LAST_APPLIED);
        let applied = match snap.get_cf(cf(&self.db, CF_META), last_applied)? {
            Some(v) => {
                codec::decode::<Option<crate::raft_types::LogId>>(&v)?.map_or(0, |l| l.index)
            }
            None => 0,
        };
        Ok((applied, h.finish()))
    }

    /// In a simulation, records this replica's digest after entry `index` when
    /// [`crate::sim::TRAIL_EVERY`] divides it: the simulator compares the replicas at every
    /// such index, so a divergence that a later entry heals is still seen.
    pub(super) fn trail(&self, index: u64) -> Result<()> {
        if !index.is_multiple_of(crate::sim::TRAIL_EVERY) || !crate::sim::active() {
            return Ok(());
        }
        let (applied, digest) = self.digest()?;
        debug_assert_eq!(applied, index);
        let dir = self.db.path().to_string_lossy();
        crate::sim::trail(&dir, self.space.group, index, digest);
        Ok(())
    }
}

/// Each namespace's purge floor as `snap` has it, read on demand.
pub(super) fn floors_of<'a>(
    db: &'a DB,
    space: Space,
    snap: &'a rocksdb::Snapshot<'a>,
) -> impl FnMut(&str) -> Result<Slot> + 'a {
    let mut cache: HashMap<String, Slot> = HashMap::new();
    move |ns: &str| {
        if let Some(f) = cache.get(ns) {
            return Ok(*f);
        }
        let floor = match snap.get_cf(cf(db, CF_NSMETA), space.nsmeta_key(ns))? {
            Some(v) => decode::<NsMeta>(&v)?.purged_to,
            None => Slot::ZERO,
        };
        cache.insert(ns.to_string(), floor);
        Ok(floor)
    }
}
