//! RocksDB storage: one database per node, one column family per keyspace.
//!
//! | CF | key | value | owner |
//! |---|---|---|---|
//! | `log`, `raft_log` | earlier builds' Raft logs: empty once moved into raft-engine | bincode `Entry` | migration (`log_migrate.rs`) |
//! | `log_moved` | nothing: its presence keeps builds before raft-engine out | — | migration |
//! | `raft` | `installing_snapshot`, `admitted` (earlier builds: the log's records) | bincode | [`Snapshots`]; admission |
//! | `g_wheel` | `keys::slot_key` (group, hash slot, namespace, slot) | a row: one timer as placed (`row.rs`) | [`StateMachine`] |
//! | `g_index` | `TimerKey::index_key` (group, hash slot, namespace, id) | the slot of the timer's row | [`StateMachine`] |
//! | `g_fires` | group, hash slot, the cursor a Fire entry left it at | (its log index, its `now_ms`) | [`StateMachine`] |
//! | `g_leases` | `keys::slot_key` (group, hash slot, namespace, end slot) | bincode lease (`row.rs`) | [`StateMachine`] |
//! | `g_deadlines` | `keys::deadline_key` (group, deadline, …) | empty: open leases by deadline | [`StateMachine`] |
//! | `g_meta` | typed keys in [`meta`] (group, name; node-wide `0xFFFF` name) | bincode | [`StateMachine`] |
//! | `g_nsmeta` | group, hash slot, namespace name | bincode [`meta::NsMeta`]: its cursors and counts | [`StateMachine`] |
//! | `g_namespaces` | group, namespace name | bincode [`Policy`](crate::namespace::Policy) | [`StateMachine`] |
//! | `g_series`, `g_series_due` | see `recurring.rs` | | [`StateMachine`] |
//! | `wheel`, `index`, … `series_due` | format 5's: empty, but `meta` holding `format` = 6 | | `migrate.rs` |
//!
//! Keys are laid out in [`crate::keys`] (storage format 6): every state key starts with its
//! group, then its hash slot, so a group's state is one prefix of each family and a hash slot
//! of a group one range (docs/sharding.md §3).
//!
//! The delivery data model (rows, slots, the fire cursor, leases, range purges) is described
//! in docs/delivery.md; `row.rs` derives a timer's state from it.
//!
//! The Raft log is not here: every group's entries, votes and purge points live in the node's
//! [`LogEngine`] (tikv's raft-engine, under `raft-log/` beside `db/`).
//!
//! Durability: log appends, votes, truncations and purges are fsynced before openraft hears they
//! are done (appends through the [`LogEngine`]'s syncer, which groups the appends of every group
//! into one fsync). State-machine writes are not synced: the log is the durable record and apply is
//! replayed from `last_applied`. The log is never purged past what is durable here: a purge
//! syncs this database's WAL first (`LogEngine::purge`). Node-local records written outside an
//! entry (the admitted term, the bucket width) are written synced.
//!
//! The state machine and the log store share the `Arc<DB>`; readers (the API, the leader's
//! workers) go through [`Store`], which only reads, from one snapshot per question, and so sees
//! each applied entry whole (every entry is one WriteBatch that also moves `last_applied`).

mod access;
mod admission;
mod apply;
mod change;
mod deliver;
mod digest;
mod fire;
mod floor;
mod gc;
mod heads;
pub mod hold;
mod leader_reads;
mod level;
mod log_cache;
pub mod log_engine;
mod log_format;
mod log_migrate;
pub mod log_store;
pub mod meta;
pub(crate) mod migrate;
mod misfire;
mod namespaces;
mod policies;
mod purge;
pub mod quiet;
mod read;
mod recurring;
pub mod restore;
mod row;
mod schedule;
mod signal;
mod snapshot;
mod snapshot_file;
mod state_machine;
mod store;
mod writes;

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};

// The codec is a floor below (`crate::codec`); storage's modules name it as their own.
use crate::codec;
pub use crate::codec::{decode, encode, MAX_DECODE_BYTES};
pub use deliver::ack_refusal;
pub use gc::IndexGc;
pub use hold::Hold;
pub use log_engine::{GroupId, LogEngine, GROUP0};
pub use log_store::LogStore;
pub use signal::FireSignal;
pub use snapshot::{Snapshot, SnapshotStats, Snapshots};
pub use snapshot_file::SnapshotFile;
pub use state_machine::StateMachine;
pub use store::{ListFilter, ListQuery, Page, Store};

use crate::Result;

/// The Raft log of the single-group layout (index keys of 8 bytes): empty once a directory
/// is migrated, still opened because RocksDB opens a database only with all its families.
pub const CF_LOG: &str = "log";
/// Every group's Raft log, keyed by (group, index), before raft-engine: empty once moved
/// (`log_migrate.rs`).
pub const CF_RAFT_LOG: &str = "raft_log";
/// Empty. A build before raft-engine does not know it, so RocksDB refuses to open a directory
/// whose log was moved out (that build would start with an empty log and no vote).
pub const CF_LOG_MOVED: &str = "log_moved";
pub const CF_RAFT: &str = "raft";
// The state machine's families of format 6 (`crate::keys`); format 5's, without the `g_`,
// are `migrate.rs`'s.
pub const CF_WHEEL: &str = "g_wheel";
pub const CF_INDEX: &str = "g_index";
pub const CF_FIRES: &str = "g_fires";
pub const CF_LEASES: &str = "g_leases";
pub const CF_DEADLINES: &str = "g_deadlines";
pub const CF_META: &str = "g_meta";
pub const CF_NSMETA: &str = "g_nsmeta";
pub const CF_NAMESPACES: &str = "g_namespaces";
/// Recurring timers: (group, hash slot, namespace, id) -> `recurring::RecurringTimer`.
pub const CF_RECURRING: &str = "g_series";
/// A series' materialised occurrence, by its group, hash slot and slot -> the series' name
/// bytes: what a Fire entry reads to learn which rows it passed are occurrences (see
/// `storage/recurring.rs`).
pub const CF_RECURRING_DUE: &str = "g_series_due";
/// The column families that make up the state machine (snapshots and digests cover these, in
/// this order; a snapshot file names a family by its place here, so new ones go last).
pub(crate) const SM_CFS: [&str; 10] = [
    CF_WHEEL,
    CF_INDEX,
    CF_FIRES,
    CF_LEASES,
    CF_DEADLINES,
    CF_META,
    CF_NSMETA,
    CF_NAMESPACES,
    CF_RECURRING,
    CF_RECURRING_DUE,
];
/// Every column family: the log store's, the state machine's, then format 5's (`migrate.rs`).
fn all_cfs() -> impl Iterator<Item = &'static str> {
    [CF_LOG, CF_RAFT_LOG, CF_RAFT, CF_LOG_MOVED]
        .into_iter()
        .chain(SM_CFS)
        .chain(migrate::V5_CFS)
}

/// Opens (or creates) a node's database under `dir`; `gc` judges which index entries the
/// compaction of the `index` family may drop (see `gc.rs`).
pub fn open_db(dir: &Path, gc: &Arc<IndexGc>) -> Result<Arc<DB>> {
    std::fs::create_dir_all(dir)?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // No preallocation: RocksDB would otherwise reserve ~70 MB of WAL ahead and keep accepting
    // writes on a full disk until that runs out. Without it a full disk fails the very next
    // write, so the node stops at once (a storage error is fatal to Raft) instead of later.
    //
    // A restart replays the WAL into memtables and, by default, then flushes every replayed
    // memtable to L0 before the database opens: up to the whole memtable budget written (and
    // fsynced) on each node before it can take part again. Kept in the memtables instead, the
    // WAL files stay until a normal flush (or the quiet flusher) writes them out.
    //
    // (rust-rocksdb has a setter for neither; the options-string parser has both.)
    let mut opts =
        opts.get_options_from_string("allow_fallocate=false;avoid_flush_during_recovery=true")?;
    // One memory budget for RocksDB (`MEMORY_BYTES`): the block cache, which also holds the
    // index and filter blocks (`cf_options`) and is charged for the memtables, whose own limit
    // (all column families together) stays `WRITE_BUFFERS_BYTES`. Memtables filling up under a
    // load evict cached blocks instead of adding to them.
    let cache = rocksdb::Cache::new_lru_cache(MEMORY_BYTES);
    let buffers = rocksdb::WriteBufferManager::new_write_buffer_manager_with_cache(
        WRITE_BUFFERS_BYTES,
        false,
        cache.clone(),
    );
    opts.set_write_buffer_manager(&buffers);
    // A restart replays the WAL from the oldest memtable not yet flushed. By default RocksDB
    // lets the WAL grow to 4x the memtable budget before it flushes the column families that
    // pin its oldest file (the quiet ones: raft state, metadata), so a SIGKILLed node could
    // replay 512 MiB. Capped at the memtable budget, it replays at most about that.
    opts.set_max_total_wal_size(WRITE_BUFFERS_BYTES as u64);
    // Flushes and compactions write tens of megabytes per file; left to the kernel, that data
    // sits dirty until the file's fsync, and the log's next fdatasync (an append's durability,
    // which openraft 0.9's core waits for) can wait behind its writeback: on this machine one
    // fdatasync of 4 KiB took 1.17 s while 3 GB were written beside it. Written back a
    // megabyte at a time as they go, the files leave less to wait for (40 s of ScheduleBatch,
    // 2 runs each: AppendEntries timed out 27 and 57 times without, 19 and 30 with; the
    // slowest log fsync 128/132 ms against 116/110 ms; throughput within 3 %).
    opts.set_bytes_per_sync(SYNC_EVERY_BYTES);
    opts.set_wal_bytes_per_sync(SYNC_EVERY_BYTES);
    let cfs = all_cfs().map(|name| {
        let mut opts = cf_options(name, &cache);
        if name == CF_INDEX {
            opts.set_compaction_filter("timerdb-dead-index-entries", gc.filter());
        }
        ColumnFamilyDescriptor::new(name, opts)
    });
    let db = DB::open_cf_descriptors(&opts, dir.join("db"), cfs)?;
    check_format(&db, dir)?;
    log_migrate::migrate_to_groups(&db)?;
    Ok(Arc::new(db))
}

/// The storage format this build reads and writes: the encodings of log entries, rows, leases,
/// namespace records and metadata, and of snapshot and backup files (whose magic carries it).
/// Raised whenever any of them changes; a data directory or backup of another format is
/// refused with a message, never misread.
///
/// 4: push delivery (namespace push targets, attempt logs, `Pushed` with a retry-after).
/// 5: recurring timers (the `series` and `series_due` families, the `ScheduleRecurring` and
/// `PauseRecurring` commands). Format 4 is a subset of it.
/// 6: groups and hash slots (`crate::keys`, docs/sharding.md §3): every state key starts with
/// its group and hash slot, a slot carries its era, one fire cursor per hash slot, in new
/// families (`g_*`). A format-4 or 5 directory is rewritten into it when it opens
/// (`migrate.rs`; an older build then refuses it); a format-4 or 5 snapshot or backup when it
/// is installed or restored.
/// Data directories of earlier builds carry no format key (their snapshots: `TDBSNAP3`).
pub const FORMAT: u32 = 6;
/// The format a data directory of a cluster with data groups records instead of [`FORMAT`]
/// (`Store::settle_groups`): format 6's encodings, and several groups' state in them, which a
/// build before groups would take for one group's (it refuses the directory, naming 7).
pub const SHARDED_FORMAT: u32 = 7;
/// Formats this build opens: its own, and those it upgrades.
pub const READS_FORMATS: [u32; 3] = [4, 5, 6];

/// Records [`FORMAT`] in a new database, or rewrites one of a format it upgrades
/// (`migrate.rs`); refuses one written in another format.
fn check_format(db: &DB, dir: &Path) -> Result<()> {
    if let Some(v) = db.get_cf(cf(db, CF_META), meta::FORMAT)? {
        let found: u32 = codec::decode(&v)?;
        if found == FORMAT || found == SHARDED_FORMAT {
            return Ok(());
        }
        return Err(format_error(dir, &format!("storage format {found}")));
    }
    // Format 5 and before kept the format in the old `meta` family.
    let old_meta = cf(db, migrate::V5_META);
    if let Some(v) = db.get_cf(old_meta, migrate::V5_FORMAT)? {
        let found: u32 = codec::decode(&v)?;
        if found < FORMAT && READS_FORMATS.contains(&found) {
            tracing::info!(found, to = FORMAT, "upgrading the storage format");
            return migrate::upgrade(db);
        }
        return Err(format_error(dir, &format!("storage format {found}")));
    }
    let written = [CF_LOG, CF_RAFT_LOG, CF_RAFT, migrate::V5_META, CF_META]
        .iter()
        .any(|name| {
            db.iterator_cf(cf(db, name), rocksdb::IteratorMode::Start)
                .next()
                .is_some()
        });
    if written {
        return Err(format_error(
            dir,
            "a storage format older than format versions",
        ));
    }
    // Also in the old `meta`, so that a build before format 6 names what it refuses.
    let mut batch = rocksdb::WriteBatch::default();
    batch.put_cf(cf(db, CF_META), meta::FORMAT, codec::encode(&FORMAT));
    batch.put_cf(old_meta, migrate::V5_FORMAT, codec::encode(&FORMAT));
    db.write_opt(batch, &synced())?;
    Ok(())
}

fn format_error(dir: &Path, found: &str) -> crate::Error {
    crate::Error::InvalidArgument(format!(
        "the data directory {} holds {found}; this build reads storage format {FORMAT}. \
         Start the node with that build and take a backup to move the data, or start from an \
         empty directory",
        dir.display()
    ))
}

/// RocksDB's memory, every column family together: data blocks, index and filter blocks, and
/// the memtables (charged to it). Memory stays bounded however many timers rest on disk.
/// Index and filter blocks were once kept outside a 64 MiB cache: whole-file filters evicted
/// from it were read again by every batch of lookups, and loading 10,000,000 timers stalled
/// writes past the 5 s timeout. Partitioned (`cf_options`), a lookup reads one filter
/// partition, and the top-level index of each file stays pinned; outside the cache they grew
/// with the data. 10,000,000 pending, one run each against the build before (which had 128
/// MiB of memtables beside a 64 MiB cache, filters outside): RSS right after the load 316 ->
/// 270 MiB (274 in a second run; during the load 382 -> 319), at rest 177 -> 146 MiB, load
/// rate x0.91 and x1.03; at 160 MiB, 310 -> 257 MiB (during the load 308) but x0.85: the
/// memtables take most of the cache while loading, and filter partitions are read again.
const MEMORY_BYTES: usize = 176 << 20;
/// How much a flush, a compaction or the WAL writes before RocksDB asks the kernel to write it
/// back (`sync_file_range`), instead of leaving it all to the file's final fsync.
const SYNC_EVERY_BYTES: u64 = 1 << 20;
/// Memtables of all column families together. Also bounds what a restart replays from the WAL.
/// 64 MiB would take ~50 MiB off a loaded node's RSS (10,000,000 pending: 339 -> 290 MiB) but
/// flushes twice as often: ScheduleBatch of 10,000 lost 10 % (140,945 -> 127,552 timers/s, 3
/// side-by-side runs), so the budget stays at 128 MiB.
const WRITE_BUFFERS_BYTES: usize = 128 << 20;

/// Per column family: compressed (each family has its own options; the database's do not
/// reach them), the shared block cache, and a bloom filter where lookups are by key (a Schedule
/// asks the index whether its id is taken; most ids are not in the SST files it would otherwise
/// search one by one; an ack reads its row by slot).
fn cf_options(name: &str, cache: &rocksdb::Cache) -> Options {
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_cache(cache);
    // Index and filter blocks in the cache, in partitions: a lookup reads the partitions it
    // needs; each file's top level, and level 0's blocks (the newest, read most), stay pinned.
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_cache_index_and_filter_blocks(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    table.set_pin_top_level_index_and_filter(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    if name == CF_INDEX || name == CF_WHEEL {
        table.set_bloom_filter(10.0, false);
        table.set_partition_filters(true);
    }
    let mut opts = Options::default();
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    opts.set_block_based_table_factory(&table);
    // Most of a ScheduleBatch's "is this id taken?" lookups miss, and a miss in a memtable
    // walked its skiplist to the end of a search (8 % of a follower's CPU under ScheduleBatch
    // of 1,000, perf): a whole-key bloom filter in each memtable answers most misses at once.
    // 20 batches of 1,000 on one node (`scripts/instructions.sh`): x0.964 instructions.
    if name == CF_INDEX {
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(0.05);
    }
    opts
}

/// A namespace's stored bytes: its format-4 encoding, then the misfire policy (format 5).
pub(crate) fn config_bytes(c: &crate::namespace::Config) -> Vec<u8> {
    let mut out = codec::encode(c);
    codec::encode_into(&c.policy.misfire, &mut out);
    out
}

/// Reads what [`config_bytes`] wrote, or a format-4 record (no misfire policy: off).
pub(crate) fn config_of(bytes: &[u8]) -> Result<crate::namespace::Config> {
    let (mut c, read): (crate::namespace::Config, usize) = codec::decode_prefix(bytes)?;
    if read < bytes.len() {
        c.policy.misfire = codec::decode(&bytes[read..])?;
    }
    Ok(c)
}

/// A namespace configuration's version record (`namespaces.rs`): absent is 0.
pub(crate) fn decode_version(raw: Option<Vec<u8>>) -> Result<u64> {
    match raw {
        None => Ok(0),
        Some(v) => Ok(u64::from_be_bytes(v.as_slice().try_into().map_err(
            |_| crate::Error::Storage("corrupt namespace configuration version".into()),
        )?)),
    }
}

/// Write options of a write that is durable when it returns.
pub(crate) fn synced() -> rocksdb::WriteOptions {
    let mut opts = rocksdb::WriteOptions::default();
    opts.set_sync(true);
    opts
}

/// Column-family handle; the families are created at open, so absence is a bug.
pub(crate) fn cf<'a>(db: &'a DB, name: &str) -> &'a rocksdb::ColumnFamily {
    db.cf_handle(name)
        .unwrap_or_else(|| panic!("column family {name} missing"))
}

/// The first key after every key starting with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; 16]
}

/// FNV-1a, 64 bit: stable across builds and platforms, which the digest needs and std's hasher
/// does not promise.
pub(crate) struct Fnv64(u64);

impl Fnv64 {
    pub fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests;
