//! The committed feature level in the state machine: one `u32` under the `meta` key
//! [`LEVEL`], raised by `Command::RaiseLevel` and never lowered, cached in memory for the
//! leader's choice of entry forms (`cluster/level.rs`).
//!
//! Why replicated: what a leader heard from its peers is node-local, and a leader that never
//! heard a member (one down since the leader's restart) would count it as the oldest and go
//! back to the older forms, with their known limits (issue 33 review, MED 3). Once a level is
//! committed, every later leader proposes its forms, heard or not. The cache only chooses what
//! a leader proposes; apply reads the database (or this entry's staged value), never the cache
//! (DESIGN 8). Snapshots carry the `meta` family, so a node that catches up by snapshot learns
//! the level too; the cache is reloaded on open and after an install, as the access cache is.

use std::sync::atomic::Ordering;

use super::apply::Applier;
use super::meta::LEVEL;
use super::store::Store;
use super::{cf, codec, CF_META};
use crate::command::Response;
use crate::Result;

impl Store {
    /// The committed feature level (0 until a `RaiseLevel` applied).
    pub fn committed_level(&self) -> u32 {
        self.level.load(Ordering::Acquire)
    }

    /// Makes `level` the one callers see (after the entry that raised it was written).
    pub(super) fn set_level(&self, level: u32) {
        self.level.store(level, Ordering::Release);
    }

    /// Reads the committed level from the database (on open, after a snapshot install).
    pub(super) fn reload_level(&self) -> Result<()> {
        self.set_level(load(self.db(), self.space)?);
        Ok(())
    }
}

fn load(db: &rocksdb::DB, space: crate::keys::Space) -> Result<u32> {
    match db.get_cf(cf(db, CF_META), space.meta_key(LEVEL))? {
        Some(v) => codec::decode(&v),
        None => Ok(0),
    }
}

impl Applier<'_> {
    /// Raises the committed level to `level`; a lower or equal one changes nothing.
    pub(super) fn raise_level(&mut self, level: u32) -> Result<Response> {
        let current = match self.level_staged {
            Some(l) => l,
            None => load(self.db, self.space)?,
        };
        if level > current {
            self.batch.put_cf(
                cf(self.db, CF_META),
                self.space.meta_key(LEVEL),
                codec::encode(&level),
            );
            self.level_staged = Some(level);
        }
        Ok(Response::None)
    }
}
