//! The node's one log engine: many groups in one family and one WAL, each group's log its own;
//! one fsync answers the appends of every group; a single-group directory migrates to group 0.

use std::sync::atomic::Ordering;

use openraft::RaftLogReader;

use super::snapshot::{log_id, nth};
use super::*;
use crate::storage::log_engine::{group_key, LOG_KEY_BYTES};

/// Writes `indexes` of `group` as `append` does and waits until the engine says they are
/// durable (`append` itself needs a callback only openraft can make).
async fn write_durably(
    engine: &Arc<LogEngine>,
    group: GroupId,
    indexes: std::ops::RangeInclusive<u64>,
) {
    let encoded: Vec<(u64, Vec<u8>)> = indexes.map(|i| (i, encode(&nth(i)))).collect();
    engine
        .write(group, encoded.iter().map(|(i, b)| (*i, b.as_slice())))
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    engine
        .when_durable(Box::new(move |r| {
            let _ = tx.send(r);
        }))
        .unwrap();
    rx.await.unwrap().unwrap();
}

fn indexes(entries: Vec<Entry>) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

#[tokio::test]
async fn groups_in_one_engine_never_touch_each_others_logs() {
    let dir = TempDir::new().unwrap();
    let db = open_db(dir.path(), &IndexGc::new()).unwrap();
    let engine = LogEngine::new(db);
    // Group 1 sorts between 0 and 2: a range of 1 that leaked would reach a neighbour.
    for g in [0, 1, 2, u32::MAX] {
        write_durably(&engine, g, 1..=10).await;
    }
    let (mut g1, mut g2) = (engine.group(1), engine.group(2));
    g1.save_vote(&Vote::new(3, 1)).await.unwrap();
    g2.save_vote(&Vote::new(5, 2)).await.unwrap();
    // Group 1 has no state machine in this build: its log store refuses a purge it cannot
    // check against one, and the engine's purge is what issue 36's groups will call.
    let refused = g1
        .purge(log_id(6))
        .await
        .expect_err("a purge of a group without state");
    assert!(
        refused.to_string().contains("no state machine"),
        "{refused}"
    );
    engine.purge(1, 6, &encode(&log_id(6))).unwrap();
    g2.truncate_after(Some(log_id(3))).await.unwrap();

    let st1 = g1.get_log_state().await.unwrap();
    assert_eq!(
        (st1.last_purged_log_id, st1.last_log_id),
        (Some(log_id(6)), Some(log_id(10)))
    );
    let st2 = g2.get_log_state().await.unwrap();
    assert_eq!(
        (st2.last_purged_log_id, st2.last_log_id),
        (None, Some(log_id(3)))
    );
    assert_eq!(
        indexes(g1.try_get_log_entries(0..100).await.unwrap()),
        (7..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        indexes(g2.try_get_log_entries(0..100).await.unwrap()),
        [1, 2, 3]
    );
    assert_eq!(g1.read_vote().await.unwrap(), Some(Vote::new(3, 1)));
    assert_eq!(g2.read_vote().await.unwrap(), Some(Vote::new(5, 2)));
    for g in [0, u32::MAX] {
        let mut other = engine.group(g);
        let st = other.get_log_state().await.unwrap();
        assert_eq!(
            (st.last_purged_log_id, st.last_log_id),
            (None, Some(log_id(10))),
            "group {g}"
        );
        assert_eq!(
            indexes(other.try_get_log_entries(..).await.unwrap()),
            (1..=10).collect::<Vec<_>>()
        );
        assert_eq!(other.read_vote().await.unwrap(), None, "group {g}");
    }
    // Two handles on one group share its state (the cache of decoded entries, the committed
    // index): a second handle sees what the first was told.
    g1.save_committed(Some(log_id(9))).await.unwrap();
    assert_eq!(engine.group(1).committed().load(Ordering::Relaxed), 9);
}

/// The point of one engine: appends of many groups queued while an fsync runs are all answered
/// by the next one, not by one fsync each.
#[tokio::test]
async fn one_fsync_answers_the_appends_of_every_group() {
    let dir = TempDir::new().unwrap();
    let db = open_db(dir.path(), &IndexGc::new()).unwrap();
    let engine = LogEngine::new(db);
    engine.fsync_delay_ms().store(300, Ordering::Relaxed);
    // The first round starts (and sleeps its 300 ms) with group 0's append alone.
    let first = tokio::spawn({
        let engine = engine.clone();
        async move { write_durably(&engine, 0, 1..=1).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let before = engine.fsyncs();
    let rest: Vec<_> = (1..=64)
        .map(|g| {
            let engine = engine.clone();
            tokio::spawn(async move { write_durably(&engine, g, 1..=3).await })
        })
        .collect();
    first.await.unwrap();
    for r in rest {
        r.await.unwrap();
    }
    assert!(
        engine.fsyncs() - before <= 2,
        "64 groups' appends took {} fsyncs",
        engine.fsyncs() - before
    );
}

/// Writes what a build before the log engine left: the `log` family's 8-byte keys for
/// `entries`, bare `vote`, `committed` and `last_purged`.
fn single_group_layout(dir: &TempDir, entries: std::ops::RangeInclusive<u64>, vote: &Vote) {
    let db = open_db(dir.path(), &IndexGc::new()).unwrap();
    let (log, raft) = (cf(&db, CF_LOG), cf(&db, CF_RAFT));
    for i in entries {
        db.put_cf(log, i.to_be_bytes(), encode(&nth(i))).unwrap();
    }
    db.put_cf(raft, b"vote", encode(vote)).unwrap();
    db.put_cf(raft, b"committed", encode(&Some(log_id(8))))
        .unwrap();
    db.put_cf(raft, b"last_purged", encode(&log_id(2))).unwrap();
}

/// A directory of the single-group layout (a build before the log engine: the `log` family's
/// 8-byte keys, bare `vote`, `committed`, `last_purged`) opens as group 0's log, with nothing
/// left in the old keys; and again after a crash part-way through the migration.
#[tokio::test]
async fn a_single_group_directory_migrates_to_group_0() {
    let vote = Vote::new_committed(4, 2);
    for crashed_part_way in [false, true] {
        let dir = TempDir::new().unwrap();
        single_group_layout(&dir, 3..=9, &vote);
        if crashed_part_way {
            // What a crash after some of the unsynced copies leaves: part of the new log beside
            // the whole old layout (the migration ran when the layout was written above, so
            // the old layout is written again over a migrated directory).
            let db = open_db(dir.path(), &IndexGc::new()).unwrap();
            db.delete_range_cf(
                cf(&db, CF_RAFT_LOG),
                log_key(GROUP0, 6),
                log_key(GROUP0, 10),
            )
            .unwrap();
            for name in [&b"vote"[..], b"committed", b"last_purged"] {
                db.delete_cf(cf(&db, CF_RAFT), group_key(name, GROUP0))
                    .unwrap();
            }
            drop(db);
            single_group_layout(&dir, 3..=9, &vote);
        }
        let (mut log, sm) = open(&dir);
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        let st = log.get_log_state().await.unwrap();
        assert_eq!(
            (st.last_purged_log_id, st.last_log_id),
            (Some(log_id(2)), Some(log_id(9)))
        );
        assert_eq!(
            indexes(log.try_get_log_entries(..).await.unwrap()),
            (3..=9).collect::<Vec<_>>()
        );
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(8)));

        let db = sm.store.db();
        let old: Vec<_> = db
            .iterator_cf(cf(db, CF_LOG), rocksdb::IteratorMode::Start)
            .collect();
        assert!(old.is_empty(), "entries left in the old log");
        let keys: Vec<Box<[u8]>> = db
            .iterator_cf(cf(db, CF_RAFT_LOG), rocksdb::IteratorMode::Start)
            .map(|kv| kv.unwrap().0)
            .collect();
        assert!(keys
            .iter()
            .all(|k| k.len() == LOG_KEY_BYTES && index_of(GROUP0, k).is_some()));
        assert_eq!(keys.len(), 7);
        let raft = cf(db, CF_RAFT);
        for name in [&b"vote"[..], b"committed", b"last_purged"] {
            assert!(
                db.get_cf(raft, name).unwrap().is_none(),
                "{name:?} left in the old key"
            );
            assert!(db.get_cf(raft, group_key(name, GROUP0)).unwrap().is_some());
        }
        // The storage format is the state machine's and the snapshots' (it travels with
        // them): the log's layout does not change it.
        let format: u32 =
            decode(&db.get_cf(cf(db, CF_META), meta::FORMAT).unwrap().unwrap()).unwrap();
        assert_eq!(format, FORMAT);
    }
}

/// A build before the log engine opens its database with the families it knows: RocksDB
/// refuses a migrated directory (its `raft_log` family unopened) instead of letting that build
/// read a log it does not understand, or start without the vote it moved.
#[test]
fn a_build_before_the_log_engine_cannot_open_a_migrated_directory() {
    let dir = TempDir::new().unwrap();
    drop(open_db(dir.path(), &IndexGc::new()).unwrap());
    let families = [CF_LOG, CF_RAFT].into_iter().chain(SM_CFS);
    let Err(err) = DB::open_cf(
        &rocksdb::Options::default(),
        dir.path().join("db"),
        families,
    ) else {
        panic!("opened without the raft_log family")
    };
    assert!(err.to_string().contains("raft_log"), "{err}");
}

/// Review of the first log engine (HIGH): it marked a migrated directory in the `meta` family,
/// which snapshots carry between nodes, so installing a snapshot of an unmigrated node over a
/// migrated one undid the mark and the node could not start again. Nothing of the log's
/// layout is in a snapshot now: a migrated node that installs one still opens with its log
/// and vote.
#[tokio::test]
async fn a_snapshot_install_leaves_the_log_and_the_vote_alone() {
    let src_dir = TempDir::new().unwrap();
    let (mut src, want) = with_workload(&src_dir).await;
    // The storage format a build before the log engine recorded (the one this build keeps).
    let db = src.store.db().clone();
    db.put_cf(cf(&db, CF_META), meta::FORMAT, encode(&5u32))
        .unwrap();
    let snap = build_snapshot(&mut src).await;

    let dir = TempDir::new().unwrap();
    let vote = Vote::new_committed(4, 2);
    single_group_layout(&dir, 3..=9, &vote);
    {
        let (_, mut sm) = open(&dir);
        sm.install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(sm.store.digest().unwrap(), want);
    }
    let (mut log, sm) = open(&dir);
    assert_eq!(sm.store.digest().unwrap(), want);
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    assert_eq!(
        indexes(log.try_get_log_entries(..).await.unwrap()),
        (3..=9).collect::<Vec<_>>()
    );
}
