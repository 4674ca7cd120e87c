//! The state machine's metadata: typed keys in the `meta` column family, and each namespace's
//! own in `nsmeta`.
//!
//! `SmMeta` is cached in memory by the state machine and written into the same WriteBatch as
//! each entry's effects, so what is on disk is always a consistent (effects, last_applied) pair.
//! [`NsMeta`] rows are read and written by the entries that touch their namespace.

use crate::raft_types::{LogId, StoredMembership};
use rocksdb::{WriteBatch, DB};
use serde::{Deserialize, Serialize};

use super::{cf, codec, CF_META, CF_NSMETA};
use crate::keys::Space;
use crate::wheel::Slot;
use crate::Result;

// Keys (`crate::keys`): a group's records are `G name` (`Space::meta_key` of the names
// below); node-wide records are `0xFFFF name`, written out here.

/// Name of the last applied log id.
pub const LAST_APPLIED: &[u8] = b"last_applied";
/// Name of the last applied membership.
pub const MEMBERSHIP: &[u8] = b"membership";
/// Name of the replicated clock and counters ([`Progress`]).
pub const PROGRESS: &[u8] = b"progress";

/// Key of the storage format the database was created with (`storage::FORMAT`): node-wide.
pub const FORMAT: &[u8] = b"\xff\xffformat";

/// Name of the access state (`crate::auth::AccessState`: keys, auth on/off).
pub const ACCESS: &[u8] = b"access";

/// Key of the bucket width the wheel was created with; a node refuses to open it with another.
/// Node-wide (every group's wheel has the cluster's width).
pub const BUCKET_MS: &[u8] = b"\xff\xffbucket_ms";

/// Key of the number of data groups of the node's cluster (`--groups`, docs/sharding.md §2):
/// node-wide, recorded when the data dir is new; absent: a cluster of one group.
pub const GROUPS: &[u8] = b"\xff\xffgroups";

/// Name of the committed feature level (`level.rs`); absent: 0.
pub const LEVEL: &[u8] = b"level";

/// The replicated clock and counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The group's fire cursor: every `Pending` row of every hash slot at or behind it has
    /// fired, by the entry whose fire record (`fires`, `G H end`, one per hash slot it passed
    /// rows of) is its hash slot's first at or after the row. Only moves forward. One per
    /// group, as format 5 had one in all: per hash slot (docs/sharding.md §3) only once a
    /// committed level cuts over at one index on every replica (step 6 of §12, with moves).
    pub cursor: Slot,
    /// The replicated clock: the latest Fire entry's `now_ms`; only moves forward.
    pub cursor_ms: i64,
    /// PENDING timers.
    pub pending: u64,
    /// Timers stored, in any state (purges remove them).
    pub stored: u64,
}

/// One namespace's cursors and counts (`nsmeta` family, `crate::keys::nsmeta_key`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NsMeta {
    /// PENDING timers of the namespace.
    pub pending: u64,
    /// Timers of the namespace stored, in any state.
    pub stored: u64,
    /// The delivery cursor: every row up to it is in a lease. At or behind the fire cursor.
    pub delivered_to: Slot,
    /// Everything up to it was purged. At or behind `delivered_to`.
    pub purged_to: Slot,
}

impl NsMeta {
    pub fn load(db: &DB, space: Space, namespace: &str) -> Result<NsMeta> {
        match db.get_cf(cf(db, CF_NSMETA), space.nsmeta_key(namespace))? {
            Some(v) => codec::decode(&v),
            None => Ok(NsMeta::default()),
        }
    }
}

/// Everything the state machine keeps beside the timers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmMeta {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub progress: Progress,
}

impl std::ops::Deref for SmMeta {
    type Target = Progress;
    fn deref(&self) -> &Progress {
        &self.progress
    }
}

impl SmMeta {
    /// Reads the metadata; a fresh database gives the defaults.
    pub fn load(db: &DB, space: Space) -> Result<SmMeta> {
        let cf = cf(db, CF_META);
        let mut meta = SmMeta::default();
        if let Some(v) = db.get_cf(cf, space.meta_key(LAST_APPLIED))? {
            meta.last_applied = codec::decode(&v)?;
        }
        if let Some(v) = db.get_cf(cf, space.meta_key(MEMBERSHIP))? {
            meta.membership = codec::decode(&v)?;
        }
        if let Some(v) = db.get_cf(cf, space.meta_key(PROGRESS))? {
            meta.progress = codec::decode(&v)?;
        }
        Ok(meta)
    }

    /// Adds the applied id and progress (and membership when `with_membership`) to `batch`.
    pub fn stage(&self, db: &DB, space: Space, batch: &mut WriteBatch, with_membership: bool) {
        let cf = cf(db, CF_META);
        let last_applied = codec::encode(&self.last_applied);
        batch.put_cf(cf, space.meta_key(LAST_APPLIED), last_applied);
        batch.put_cf(cf, space.meta_key(PROGRESS), codec::encode(&self.progress));
        if with_membership {
            let membership = codec::encode(&self.membership);
            batch.put_cf(cf, space.meta_key(MEMBERSHIP), membership);
        }
    }
}
