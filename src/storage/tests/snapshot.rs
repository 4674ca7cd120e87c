//! Snapshot install across crashes: a node that stops half-way through an install finishes it
//! when it opens again, and one that stopped before touching the state machine keeps it.

use super::*;

#[tokio::test]
async fn an_interrupted_install_is_finished_on_open() {
    let src_dir = TempDir::new().unwrap();
    let (mut src, want) = with_workload(&src_dir).await;
    let snap = build_snapshot(&mut src).await;

    let dir = TempDir::new().unwrap();
    {
        let (_, mut sm) = open(&dir);
        sm.install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(sm.store.digest().unwrap(), want);
        // Rewind to the middle of that install: the mark set, rows half written.
        let db = sm.store.db();
        db.put_cf(
            cf(db, CF_RAFT),
            super::super::snapshot::INSTALLING,
            encode(&snap.meta.snapshot_id),
        )
        .unwrap();
        let victims: Vec<_> = db
            .iterator_cf(cf(db, CF_WHEEL), rocksdb::IteratorMode::Start)
            .step_by(2)
            .map(|kv| kv.unwrap().0)
            .collect();
        assert!(!victims.is_empty());
        for k in victims {
            db.delete_cf(cf(db, CF_WHEEL), k).unwrap();
        }
        assert_ne!(sm.store.digest().unwrap(), want);
    }
    let (_, sm) = open(&dir);
    assert_eq!(sm.store.digest().unwrap(), want, "install not finished");
    assert_eq!(sm.meta.last_applied, snap.meta.last_log_id);
    let db = sm.store.db();
    assert!(db
        .get_cf(cf(db, CF_RAFT), super::super::snapshot::INSTALLING)
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn an_install_stopped_before_it_began_leaves_the_state_alone() {
    let dir = TempDir::new().unwrap();
    let (sm, want) = with_workload(&dir).await;
    let db = sm.store.db().clone();
    // The mark names a snapshot that never became current: the crash came before the
    // received file was kept, so the state machine was never touched.
    db.put_cf(
        cf(&db, CF_RAFT),
        super::super::snapshot::INSTALLING,
        encode(&"7-deadbeef".to_string()),
    )
    .unwrap();
    drop((sm, db));
    let (_, sm) = open(&dir);
    assert_eq!(sm.store.digest().unwrap(), want);
    let db = sm.store.db();
    assert!(db
        .get_cf(cf(db, CF_RAFT), super::super::snapshot::INSTALLING)
        .unwrap()
        .is_none());
}
