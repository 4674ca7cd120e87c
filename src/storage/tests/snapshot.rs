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
        // The id the install gave the snapshot it kept.
        let kept = sm.get_current_snapshot().await.unwrap().unwrap();
        // Rewind to the middle of that install: the mark set, rows half written.
        let db = sm.store.db();
        db.put_cf(
            cf(db, CF_RAFT),
            super::super::snapshot::INSTALLING,
            encode(&kept.snapshot.id()),
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

pub(super) fn log_id(index: u64) -> LogId {
    crate::raft_types::log_id(1, 1, index)
}

/// Entry `i` of the logs below: a blank first entry (openraft's log starts at 0), then
/// schedules.
pub(super) fn nth(i: u64) -> Entry {
    match i {
        0 => Entry {
            log_id: log_id(0),
            payload: EntryPayload::Blank,
        },
        i => entry(i, schedule(&format!("t{i}"), T0 + i as i64)),
    }
}

/// Entries `0..=last` written to `log` as `append` writes them (its flush callback cannot be
/// made outside openraft), those up to `applied` applied.
async fn log_and_state(dir: &TempDir, last: u64, applied: u64) {
    let (mut log, mut sm) = open(dir);
    log.write_stored(&(0..=last).map(nth).collect::<Vec<_>>());
    sm.apply_entries((0..=applied).map(nth)).await.unwrap();
    log.save_committed(Some(log_id(applied))).await.unwrap();
}

/// Finding 6 of issue 33: openraft 0.9 purges the log up to a received snapshot right after
/// handing it to the state machine, which makes it durable later. A crash in between left the
/// log purged past the state machine, and the node could not start again (openraft re-applies
/// committed entries from the log at start). The purge now waits for the state machine.
#[tokio::test]
async fn a_crash_between_the_snapshot_purge_and_its_install_leaves_a_node_that_starts() {
    let dir = TempDir::new().unwrap();
    log_and_state(&dir, 5, 3).await;
    {
        // What openraft does on receiving a snapshot of index 10 (install_full_snapshot): the
        // committed index moves, the install goes to the state-machine worker, the log is
        // purged. The process dies before the install is durable.
        let (mut log, _sm) = open(&dir);
        log.save_committed(Some(log_id(10))).await.unwrap();
        log.purge(log_id(10)).await.unwrap();
    }
    let (mut log, mut sm) = open(&dir);
    let state = openraft::storage::StorageHelper::new(&mut log, &mut sm)
        .with_id(1)
        .get_initial_state()
        .await;
    let state = state.expect("the node starts");
    assert_eq!(
        (
            state.local_committed().map(|l| l.index),
            sm.meta.last_applied.map(|l| l.index)
        ),
        (Some(5), Some(5)),
        "what its log holds is applied; the rest comes from the leader again"
    );
    assert_eq!(sm.store.meta().unwrap().pending, 5);
}

/// The purge a snapshot install asked for happens once the state machine has it.
#[tokio::test]
async fn a_deferred_purge_happens_once_the_state_machine_reaches_it() {
    let dir = TempDir::new().unwrap();
    log_and_state(&dir, 8, 3).await;
    let (mut log, mut sm) = open(&dir);
    log.purge(log_id(6)).await.unwrap();
    let first = |log: &LogStore| log.stored_indexes().first().copied();
    assert_eq!(first(&log), Some(0), "entries the state machine lacks stay");
    sm.apply_entries((4..=6).map(nth)).await.unwrap();
    log.purge(log_id(6)).await.unwrap();
    assert_eq!(first(&log), Some(7));
    let st = log.get_log_state().await.unwrap();
    assert_eq!(st.last_purged_log_id, Some(log_id(6)));
}

/// Finding 4 of issue 33: a snapshot install overwrote the recorded bucket width without
/// comparing it with the wheel the node runs; such a node then placed timers on other keys. It
/// is refused now, with the reason.
#[tokio::test]
async fn a_snapshot_of_another_bucket_width_is_refused() {
    let src_dir = TempDir::new().unwrap();
    let (mut src, _) = with_workload(&src_dir).await;
    let snap = build_snapshot(&mut src).await;
    assert_eq!(src.store.width_ms(), 1);
    let dir = TempDir::new().unwrap();
    let gc = IndexGc::new();
    let db = open_db(dir.path(), &gc).unwrap();
    let store = Store::new(db, Wheel::new(5), gc);
    let mut sm = StateMachine::open(store, dir.path(), Arc::new(FireSignal::default())).unwrap();
    let mine = Command::LegacySchedule {
        now_ms: T0,
        spec: spec("mine", T0 + 60_000, "kept"),
    };
    sm.apply_entries([entry(1, mine)]).await.unwrap();
    let before = sm.store().digest().unwrap();
    let e = sm
        .install_snapshot(&snap.meta, snap.snapshot)
        .await
        .expect_err("a snapshot of 1 ms buckets on a 5 ms wheel");
    assert!(e.to_string().contains("bucket width"), "{e}");
    // Refused before it replaced anything (the review of issue 33: it was compared after).
    assert_eq!(
        sm.store().digest().unwrap(),
        before,
        "the state was replaced"
    );
    assert_eq!(sm.store().width_ms(), 5);
}

/// The review of issue 33's fix for finding 6: openraft appends the entries after a received
/// snapshot (a new leader's, or after a resent snapshot) while the state machine is still
/// installing it; written then, they left the log on disk with the entries after the snapshot
/// and a hole before them, which a crash turned into a node openraft could not start. An append
/// now first waits until the deferred purge is done, that is until the install is.
#[tokio::test]
async fn an_append_behind_a_pending_install_waits_for_it() {
    let dir = TempDir::new().unwrap();
    log_and_state(&dir, 5, 3).await;
    let (mut log, mut sm) = open(&dir);
    // openraft on receiving a snapshot of index 8: the purge is deferred (applied is 3).
    log.purge(log_id(8)).await.unwrap();
    let gate = log.clone();
    let waiting = tokio::spawn(async move { gate.settle_before_append().await });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "an append must not write while the install is pending"
    );
    // The install finishes (the state machine reaches the snapshot's index).
    sm.apply_entries((4..=8).map(nth)).await.unwrap();
    waiting.await.unwrap().expect("the append goes on");
    let st = log.get_log_state().await.unwrap();
    assert_eq!(
        st.last_purged_log_id,
        Some(log_id(8)),
        "and the purge is done first"
    );
}

/// Review 34b: openraft 0.10 installs the current snapshot itself at start when the state
/// machine is behind it. That file is kept under its own id (renamed, a crash before `CURRENT`
/// named the new name lost the only copy).
#[tokio::test]
async fn installing_the_current_snapshot_keeps_its_file() {
    let dir = TempDir::new().unwrap();
    let (mut sm, want) = with_workload(&dir).await;
    build_snapshot(&mut sm).await;
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    let (id, path) = (current.snapshot.id(), current.snapshot.path().to_path_buf());
    let meta = current.meta.clone();
    sm.install_snapshot(&meta, current.snapshot).await.unwrap();
    assert_eq!(sm.store.digest().unwrap(), want);
    let after = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(after.snapshot.id(), id, "the current snapshot was renamed");
    assert!(path.exists());
}
