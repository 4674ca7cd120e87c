//! The access state (API keys, auth on/off) in the state machine: one value under the `meta`
//! key [`ACCESS`], changed by `Command::Access` and cached in memory for the auth layer, which
//! reads it on every call.
//!
//! The cache follows the written state: it is replaced after the entry that changed it is
//! written, and reloaded when the state machine opens or installs a snapshot (snapshots carry
//! the `meta` family, so a node that catches up by snapshot learns every key too).

use std::sync::Arc;

use super::apply::Applier;
use super::meta::ACCESS;
use super::store::Store;
use super::{cf, codec, CF_META};
use crate::auth::{AccessChange, AccessState};
use crate::command::{Rejection, Response};
use crate::Result;

impl Store {
    /// The applied access state.
    pub fn access(&self) -> Arc<AccessState> {
        self.access
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `state` the one callers see (after the entry that changed it was written).
    pub(super) fn set_access(&self, state: AccessState) {
        *self.access.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(state);
        self.access_changed.notify_waiters();
    }

    /// What wakes a waiter when the access state changes next (see `api::stack::auth`).
    pub fn access_changes(&self) -> Arc<tokio::sync::Notify> {
        self.access_changed.clone()
    }

    /// Reads the access state from the database (on open, after a snapshot install).
    pub(super) fn reload_access(&self) -> Result<()> {
        let state = load(self.db(), self.space)?;
        self.set_access(state);
        Ok(())
    }
}

fn load(db: &rocksdb::DB, space: crate::keys::Space) -> Result<AccessState> {
    match db.get_cf(cf(db, CF_META), space.meta_key(ACCESS))? {
        Some(v) => codec::decode(&v),
        None => Ok(AccessState::default()),
    }
}

impl Applier<'_> {
    /// Applies an access change; a change that does not apply is rejected and writes nothing.
    pub(super) fn access(&mut self, change: AccessChange) -> Result<Response> {
        let current = match self.access_staged.take() {
            Some(s) => s,
            None => load(self.db, self.space)?,
        };
        let mut next = current.clone();
        if let Err(e) = next.change(&change) {
            self.access_staged = Some(current);
            return Ok(Response::Rejected(Rejection::Access(e)));
        }
        let key = match &change {
            AccessChange::PutKey(k) => Some(k.clone()),
            AccessChange::RevokeKey(id) => current.keys.get(id).cloned(),
            AccessChange::Enable(_) => None,
        };
        self.batch.put_cf(
            cf(self.db, CF_META),
            self.space.meta_key(ACCESS),
            codec::encode(&next),
        );
        let enabled = next.enabled;
        self.access_staged = Some(next);
        self.access_changed = true;
        Ok(Response::Access { enabled, key })
    }
}
