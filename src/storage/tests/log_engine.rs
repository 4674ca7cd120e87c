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
    g1.purge(log_id(6)).await.unwrap();
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

/// A directory of the single-group layout (format 5: 8-byte log keys, bare `vote`,
/// `committed`, `last_purged`) opens as group 0's log, with nothing left in the old keys.
#[tokio::test]
async fn a_single_group_directory_migrates_to_group_0() {
    let dir = TempDir::new().unwrap();
    let vote = Vote::new_committed(4, 2);
    {
        let db = open_db(dir.path(), &IndexGc::new()).unwrap();
        let (log, raft, meta) = (cf(&db, CF_LOG), cf(&db, CF_RAFT), cf(&db, CF_META));
        for i in 3..=9u64 {
            db.put_cf(log, i.to_be_bytes(), encode(&nth(i))).unwrap();
        }
        db.put_cf(raft, b"vote", encode(&vote)).unwrap();
        db.put_cf(raft, b"committed", encode(&Some(log_id(8))))
            .unwrap();
        db.put_cf(raft, b"last_purged", encode(&log_id(2))).unwrap();
        db.put_cf(meta, meta::FORMAT, encode(&5u32)).unwrap();
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
    let format: u32 = decode(&db.get_cf(cf(db, CF_META), meta::FORMAT).unwrap().unwrap()).unwrap();
    assert_eq!(format, DIR_FORMAT);
    let keys: Vec<Box<[u8]>> = db
        .iterator_cf(cf(db, CF_LOG), rocksdb::IteratorMode::Start)
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
    assert_eq!(log_key(GROUP0, 9)[4..], 9u64.to_be_bytes());
}
