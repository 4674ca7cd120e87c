//! The state machine's metadata: typed keys in the `meta` column family.
//!
//! `SmMeta` is cached in memory by the state machine and written into the same WriteBatch as
//! each entry's effects, so what is on disk is always a consistent (effects, last_applied) pair.

use openraft::{BasicNode, LogId, StoredMembership};
use rocksdb::{WriteBatch, DB};
use serde::{Deserialize, Serialize};

use super::{cf, codec, CF_META};
use crate::Result;

/// Key of the last applied log id.
pub const LAST_APPLIED: &[u8] = b"last_applied";
/// Key of the last applied membership.
pub const MEMBERSHIP: &[u8] = b"membership";
/// Key of the replicated clock and counters ([`Progress`]).
pub const PROGRESS: &[u8] = b"progress";
/// Prefix of the PENDING count of one namespace: `pending/<namespace>` → bincode u64.
pub const PENDING_PREFIX: &[u8] = b"pending/";

/// The key of `namespace`'s PENDING count.
pub fn pending_key(namespace: &str) -> Vec<u8> {
    [PENDING_PREFIX, namespace.as_bytes()].concat()
}

/// Key of the bucket width the wheel was created with; a node refuses to open it with another.
pub const BUCKET_MS: &[u8] = b"bucket_ms";

/// The replicated clock and counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The replicated time cursor: the latest Fire entry's `now_ms`; only moves forward.
    pub cursor_ms: i64,
    /// Every wheel key's bucket is at or after this; only moves forward.
    pub floor: u64,
    /// PENDING timers.
    pub pending: u64,
}

/// Everything the state machine keeps beside the timers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmMeta {
    pub last_applied: Option<LogId<u64>>,
    pub membership: StoredMembership<u64, BasicNode>,
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
    pub fn load(db: &DB) -> Result<SmMeta> {
        let cf = cf(db, CF_META);
        let mut meta = SmMeta::default();
        if let Some(v) = db.get_cf(cf, LAST_APPLIED)? {
            meta.last_applied = codec::decode(&v)?;
        }
        if let Some(v) = db.get_cf(cf, MEMBERSHIP)? {
            meta.membership = codec::decode(&v)?;
        }
        if let Some(v) = db.get_cf(cf, PROGRESS)? {
            meta.progress = codec::decode(&v)?;
        }
        Ok(meta)
    }

    /// Adds the applied id and progress (and membership when `with_membership`) to `batch`.
    pub fn stage(&self, db: &DB, batch: &mut WriteBatch, with_membership: bool) {
        let cf = cf(db, CF_META);
        batch.put_cf(cf, LAST_APPLIED, codec::encode(&self.last_applied));
        batch.put_cf(cf, PROGRESS, codec::encode(&self.progress));
        if with_membership {
            batch.put_cf(cf, MEMBERSHIP, codec::encode(&self.membership));
        }
    }
}
