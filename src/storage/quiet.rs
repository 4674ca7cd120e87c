//! Flushing the memtables of a node that has gone quiet.
//!
//! RocksDB flushes a memtable when it fills (or when the WAL cap forces it), never because
//! writes stopped. After a burst a node therefore holds up to the whole memtable budget
//! (`WRITE_BUFFERS_BYTES`, 128 MiB) for as long as it stays quiet, and a restart replays all of
//! it from the WAL before Raft can start: with 10,000,000 timers loaded, ~1.1 s of a cluster
//! restart's 2 s and ~100 MiB of each node's resident memory. A timer database is quiet most of
//! its life (timers wait for their day), so this task flushes when it is: once no write has
//! reached the database for [`QUIET`] and the memtables hold at least [`MIN_BYTES`], every
//! column family is flushed, and the freed memory is handed back to the operating system. The
//! WAL behind the flushed memtables becomes obsolete, so a restart then replays almost nothing.
//!
//! Quiet is judged by RocksDB's own sequence number, which every write moves, so the write path
//! counts nothing. Under load the task never flushes (the budget flushes as before); a flush
//! is an ordinary RocksDB flush, safe at any time, and costs one small L0 file per family with
//! data, which compaction merges as usual.

use std::sync::Arc;
use std::time::Duration;

use rocksdb::{FlushOptions, DB};
use tokio::sync::watch;

use super::{all_cfs, cf};
use crate::Result;

/// How long no write may reach the database before its memtables are flushed.
pub const QUIET: Duration = Duration::from_secs(3);
/// Memtables smaller than this are left alone: a flush would buy nothing worth a file.
pub const MIN_BYTES: u64 = 8 << 20;

/// Bytes held by every column family's memtables (active and immutable).
pub fn memtable_bytes(db: &DB) -> u64 {
    all_cfs()
        .filter_map(|name| {
            db.property_int_value_cf(cf(db, name), "rocksdb.cur-size-all-mem-tables")
                .ok()
                .flatten()
        })
        .sum()
}

/// Flushes every column family's memtables to SST files, waiting for the flush, then returns
/// the freed memory to the operating system.
pub fn flush_all(db: &DB) -> Result<()> {
    let mut opts = FlushOptions::default();
    opts.set_wait(true);
    let cfs: Vec<_> = all_cfs().map(|name| cf(db, name)).collect();
    db.flush_cfs_opt(&cfs, &opts)?;
    release_free_memory();
    Ok(())
}

/// glibc keeps freed memory in its arenas for reuse; a flushed memtable's arena blocks are
/// freed in one go and would otherwise stay resident. `malloc_trim` gives free pages back.
/// `timerd` runs on jemalloc instead (src/bin/timerd.rs), whose background thread returns
/// freed pages within a second; there this finds glibc's heap empty. It stays for processes
/// on glibc's malloc: the tests and the simulator, and any program embedding the library.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the OS; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs until `shutdown` turns true: flushes `db` whenever it has been quiet for [`QUIET`].
pub async fn run(db: Arc<DB>, shutdown: watch::Receiver<bool>) {
    watch_quiet(db, QUIET, shutdown).await
}

/// [`run`] with the quiet period as a parameter (tests shorten it); looks three times a period.
async fn watch_quiet(db: Arc<DB>, quiet: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(quiet / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = db.latest_sequence_number();
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let seq = db.latest_sequence_number();
        if seq != seen {
            (seen, since) = (seq, tokio::time::Instant::now());
            continue;
        }
        if since.elapsed() < quiet || memtable_bytes(&db) < MIN_BYTES {
            continue;
        }
        let bytes = memtable_bytes(&db);
        let flushing = db.clone();
        // Awaited here, so shutdown never finds a flush still holding the database.
        match crate::sim::blocking(move || flush_all(&flushing)).await {
            Ok(Ok(())) => tracing::info!(bytes, "quiet: memtables flushed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "quiet: flush failed"),
            Err(e) => tracing::warn!(error = %e, "quiet: flush task failed"),
        }
        since = tokio::time::Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{open_db, IndexGc, CF_WHEEL};

    /// Writes `mib` MiB of 1 KiB values to the wheel family.
    fn write(db: &DB, mib: usize, tag: u8) {
        let value = vec![tag; 1024];
        for i in 0..mib * 1024 {
            let key = [&[tag][..], &(i as u64).to_be_bytes()].concat();
            db.put_cf(cf(db, CF_WHEEL), key, &value).unwrap();
        }
    }

    /// A quiet node's memtables are flushed; one that keeps writing keeps them.
    #[tokio::test]
    async fn flushes_only_once_quiet() {
        let quiet = Duration::from_millis(600);
        let dir = tempfile::TempDir::new().unwrap();
        let db = open_db(dir.path(), &IndexGc::new()).unwrap();
        write(&db, 12, 1);
        assert!(memtable_bytes(&db) >= MIN_BYTES);
        let (stop, shutdown) = watch::channel(false);
        let task = tokio::spawn(watch_quiet(db.clone(), quiet, shutdown));
        // Busy: a write every half period, for three periods.
        for i in 0..6u64 {
            db.put_cf(cf(&db, CF_WHEEL), i.to_be_bytes(), b"busy")
                .unwrap();
            tokio::time::sleep(quiet / 2).await;
        }
        assert!(
            memtable_bytes(&db) >= MIN_BYTES,
            "flushed while writes kept coming"
        );
        // Quiet: flushed within a few ticks after the quiet period.
        let real = std::time::Instant::now();
        while memtable_bytes(&db) >= MIN_BYTES {
            assert!(real.elapsed() < quiet * 10, "never flushed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Nothing was lost: the data is in SST files now.
        let key = [&[1u8][..], &5u64.to_be_bytes()].concat();
        assert_eq!(
            db.get_cf(cf(&db, CF_WHEEL), key).unwrap(),
            Some(vec![1; 1024])
        );
        stop.send(true).unwrap();
        task.await.unwrap();
    }
}
