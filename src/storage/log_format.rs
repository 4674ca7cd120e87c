//! How the node's Raft log is laid out in raft-engine: the words `log_engine.rs` (which reads
//! and writes it) and `log_migrate.rs` (which moves earlier logs into it) share.
//!
//! - Group `g`'s entries are in region `g`; each entry is a protobuf `BytesValue` (raft-engine
//!   stores protobuf messages) holding the index (8 bytes LE) and then the bincode `Entry`.
//! - Its records (`vote`, `committed`, `last_purged`) are key-values of region `RECORDS | g`,
//!   apart from the entries, so clearing a group's entries never touches its vote.
//! - Region `SYNC_REGION` holds the node's own keys: the syncer's (a synced write must carry
//!   something) and the id the log shares with its state database.

use protobuf::well_known_types::BytesValue;
use raft_engine::MessageExt;

/// A Raft group's id on a node. Group 0 is the single-group cluster's one group.
pub type GroupId = u32;

/// The group of a single-group cluster (all of them before issue 36).
pub const GROUP0: GroupId = 0;

/// The per-group records.
pub const VOTE: &[u8] = b"vote";
pub const COMMITTED: &[u8] = b"committed";
pub const LAST_PURGED: &[u8] = b"last_purged";

/// The region of group `g`'s records is `RECORDS | g`; its entries' region is `g`.
pub(super) const RECORDS: u64 = 1 << 32;
/// The region of the syncer's key (a synced write must carry something: raft-engine skips an
/// empty batch, fsync and all).
pub(super) const SYNC_REGION: u64 = u64::MAX;

/// The directory of the log under a node's data directory.
pub const LOG_DIR: &str = "raft-log";

/// The key of the id the log and the state database share: a record of region
/// [`SYNC_REGION`] in raft-engine, a key of the `raft` family in RocksDB (`log_engine.rs`).
pub const NODE_LOG_ID: &[u8] = b"node_log_id";

/// raft-engine's entries are protobuf messages: ours ride in a `BytesValue`, the index first.
pub(super) struct Raw;

impl MessageExt for Raw {
    type Entry = BytesValue;
    fn index(e: &BytesValue) -> u64 {
        // Every entry is written by `raw_entry`, and raft-engine checksums what it reads: a
        // short one cannot come back. If it did, index 0 fails raft-engine's own check of the
        // index it asked for (a panic, so the process stops: see the invariants).
        e.value
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

/// Bytes already encoded, as an entry of log index `index`.
pub(super) fn raw_entry(index: u64, bytes: &[u8]) -> BytesValue {
    let mut value = Vec::with_capacity(8 + bytes.len());
    value.extend_from_slice(&index.to_le_bytes());
    value.extend_from_slice(bytes);
    let mut e = BytesValue::new();
    e.value = value;
    e
}
