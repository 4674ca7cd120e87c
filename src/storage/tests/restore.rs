//! Backups restored offline: the restored node holds the same timers as the source, under a new
//! membership and a log id the new cluster can grow from; a damaged or misplaced restore is
//! refused before it writes anything.

use std::collections::BTreeMap;

use openraft::BasicNode;

use super::*;
use crate::storage::meta::{LAST_APPLIED, MEMBERSHIP};
use crate::storage::restore::{inspect, restore};

/// Every state-machine row but those that name the cluster (`last_applied`, membership).
fn content(db: &rocksdb::DB) -> Vec<(&'static str, Vec<u8>, Vec<u8>)> {
    let mut rows = Vec::new();
    for name in SM_CFS {
        for item in db.iterator_cf(cf(db, name), rocksdb::IteratorMode::Start) {
            let (k, v) = item.unwrap();
            let g0 = crate::keys::Space::of(0);
            let names_cluster = name == CF_META
                && (*k == *g0.meta_key(LAST_APPLIED) || *k == *g0.meta_key(MEMBERSHIP));
            if !names_cluster {
                rows.push((name, k.to_vec(), v.to_vec()));
            }
        }
    }
    rows
}

fn voters() -> BTreeMap<u64, BasicNode> {
    (1..=3)
        .map(|i| (i, BasicNode::new(format!("127.0.0.1:{}", 9000 + i))))
        .collect()
}

/// A backup file of the workload's state machine, and that state machine.
async fn backup_of_workload(dir: &TempDir) -> (std::path::PathBuf, StateMachine) {
    let (mut sm, _) = with_workload(dir).await;
    let snap = build_snapshot(&mut sm).await;
    let file = dir.path().join("backup.tdb");
    std::fs::copy(snap.snapshot.path(), &file).unwrap();
    (file, sm)
}

#[tokio::test]
async fn a_restored_node_holds_the_backup_under_a_new_membership() {
    let src_dir = TempDir::new().unwrap();
    let (file, src) = backup_of_workload(&src_dir).await;
    let source_applied = src.meta.last_applied.unwrap();

    let summary = inspect(&file).unwrap();
    assert_eq!(summary.index, source_applied.index);
    assert_eq!(summary.term, source_applied.leader_id.term);
    assert_eq!(summary.pending, src.meta.pending);
    assert_eq!(summary.cursor_ms, src.meta.cursor_ms);
    assert_eq!(summary.bucket_ms, Some(src.store.wheel().width_ms()));
    let timers = src
        .store
        .db()
        .iterator_cf(cf(src.store.db(), CF_WHEEL), rocksdb::IteratorMode::Start)
        .count() as u64;
    assert!(timers > 200, "the workload made {timers} timers");
    assert_eq!(summary.timers, timers);

    let dst = TempDir::new().unwrap();
    let data_dir = dst.path().join("node1");
    let width = src.store.wheel().width_ms();
    assert_eq!(
        restore(&file, &data_dir, voters(), Some(width)).unwrap(),
        summary
    );

    let (mut log, mut sm) = open_at(&data_dir);
    assert_eq!(content(sm.store.db()), content(src.store.db()));
    let restored = log_id(0, 0, source_applied.index);
    assert_eq!(sm.meta.last_applied, Some(restored));
    let members = sm.meta.membership.membership();
    assert_eq!(members.voter_ids().collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(sm.meta.membership.log_id(), &Some(restored));
    // Its log is empty (openraft purges up to last_applied on start), and a snapshot of the
    // restored state is ready for a node added later.
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, None);
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id, Some(restored));
    assert_eq!(
        current
            .meta
            .last_membership
            .membership()
            .voter_ids()
            .count(),
        3
    );
    let mut replica = Sm::new();
    replica
        .sm
        .install_snapshot(&current.meta, current.snapshot)
        .await
        .unwrap();
    assert_eq!(replica.store.digest().unwrap(), sm.store.digest().unwrap());
}

#[tokio::test]
async fn a_restore_refuses_a_used_data_dir_a_damaged_file_and_another_bucket_width() {
    let src_dir = TempDir::new().unwrap();
    let (file, src) = backup_of_workload(&src_dir).await;
    let width = src.store.wheel().width_ms();
    let dst = TempDir::new().unwrap();

    // A data dir in use is never touched.
    let used = dst.path().join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("keep"), b"x").unwrap();
    let e = restore(&file, &used, voters(), Some(width)).unwrap_err();
    assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
    assert_eq!(std::fs::read_dir(&used).unwrap().count(), 1);

    // One flipped bit: refused before anything is written.
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    let damaged = dst.path().join("damaged.tdb");
    std::fs::write(&damaged, &bytes).unwrap();
    let fresh = dst.path().join("fresh");
    let e = restore(&damaged, &fresh, voters(), Some(width)).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    assert!(!fresh.exists());
    assert!(!dst.path().join(".fresh.restoring").exists());

    let e = restore(&file, &fresh, voters(), Some(width * 2)).unwrap_err();
    assert!(e.to_string().contains("--bucket-ms"), "{e}");
    assert!(!fresh.exists());

    // And the good file into an empty directory that exists: fine.
    std::fs::create_dir_all(&fresh).unwrap();
    restore(&file, &fresh, voters(), None).unwrap();
    assert!(fresh.join("snapshot").exists());
}
