//! Groups on one database (docs/sharding.md §3): each group's state machine keeps to its own
//! prefix of every family, so the groups a node hosts never read or write each other's state,
//! a group's snapshot holds its state only, and a snapshot cannot write into another group.

use super::format6::{observe, same_text};
use super::*;
use crate::keys::Group;

/// Group `group`'s state machine on the database `base` is on (its snapshots under `dir`).
fn open_group(base: &StateMachine, dir: &Path, group: Group) -> StateMachine {
    let store = base.store.group(group);
    StateMachine::open(store, dir, Arc::new(FireSignal::default())).unwrap()
}

async fn apply_all(sm: &mut StateMachine, cmds: Vec<Command>) -> Vec<Response> {
    let entries: Vec<_> = (cmds.into_iter().enumerate())
        .map(|(i, c)| entry(i as u64 + 1, c))
        .collect();
    sm.apply_entries(entries).await.unwrap()
}

fn own_commands() -> Vec<Command> {
    vec![
        schedule("zero", T0 + 5),
        fire(T0 + 10, 100),
        schedule("w1", T0 + 1_000_000),
    ]
}

const NOW: i64 = T0 + 100_000;

#[tokio::test]
async fn groups_on_one_database_keep_to_their_own_state() {
    let dir = TempDir::new().unwrap();
    let (_, mut g0) = open(&dir);
    let mut g1 = open_group(&g0, dir.path(), 1);
    let zero = apply_all(&mut g0, own_commands()).await;
    let g0_digest = g0.store.digest().unwrap();
    let g0_reads = observe(&g0.store, NOW);
    let answers = apply_all(&mut g1, workload()).await;

    // Group 1 answers and reads as a cluster of one group that applied the same log.
    let (_single_dir, mut single) = {
        let d = TempDir::new().unwrap();
        let (_, sm) = open(&d);
        (d, sm)
    };
    assert_eq!(answers, apply_all(&mut single, workload()).await);
    let g1_reads = observe(&g1.store, NOW);
    same_text(&g1_reads, &observe(&single.store, NOW));
    // Group 0 is as it was: its digest, its timers (its `w1` is not group 1's).
    assert_eq!(g0.store.digest().unwrap(), g0_digest);
    same_text(&observe(&g0.store, NOW), &g0_reads);
    let w1 = g0.store.get(&TimerKey::new("ns", "w1")).unwrap().unwrap();
    assert_eq!(w1.fire_at_ms, T0 + 1_000_000);
    assert_eq!(zero.len(), 3);
    assert_ne!(g0.store.digest().unwrap().1, g1.store.digest().unwrap().1);

    // Both reopen as they were.
    let g1_digest = g1.store.digest().unwrap();
    drop((g0, g1));
    let (_, g0) = open(&dir);
    let g1 = open_group(&g0, dir.path(), 1);
    assert_eq!(g0.store.digest().unwrap(), g0_digest);
    assert_eq!(g1.store.digest().unwrap(), g1_digest);
    same_text(&observe(&g1.store, NOW), &g1_reads);
}

#[tokio::test]
async fn a_group_snapshot_installs_into_that_group_only() {
    let dir = TempDir::new().unwrap();
    let (_, g0) = open(&dir);
    let mut g1 = open_group(&g0, dir.path(), 1);
    apply_all(&mut g1, workload()).await;
    let g1_reads = observe(&g1.store, NOW);
    let snap = build_snapshot(&mut g1).await;

    // Another node holding its own group 0 state and a stale group 1.
    let other = TempDir::new().unwrap();
    let (_, mut o0) = open(&other);
    apply_all(&mut o0, own_commands()).await;
    let o0_digest = o0.store.digest().unwrap();
    let mut o1 = open_group(&o0, other.path(), 1);
    apply_all(&mut o1, vec![schedule("stale", T0 + 7)]).await;
    o1.install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    same_text(&observe(&o1.store, NOW), &g1_reads);
    assert_eq!(o1.store.digest().unwrap(), g1.store.digest().unwrap());
    assert!(o1
        .store
        .get(&TimerKey::new("ns", "stale"))
        .unwrap()
        .is_none());
    assert_eq!(o0.store.digest().unwrap(), o0_digest, "group 0 untouched");

    // Offered to group 2, group 1's snapshot is refused (its keys are not group 2's), and
    // group 2 keeps what it had.
    let mut o2 = open_group(&o0, other.path(), 2);
    apply_all(&mut o2, vec![schedule("two", T0 + 9)]).await;
    let o2_digest = o2.store.digest().unwrap();
    let again = build_snapshot(&mut g1).await;
    let refused = o2.install_snapshot(&again.meta, again.snapshot).await;
    let refused = refused.expect_err("another group's snapshot");
    assert!(refused.to_string().contains("outside group 2"), "{refused}");
    assert_eq!(o2.store.digest().unwrap(), o2_digest);
    assert_eq!(o0.store.digest().unwrap(), o0_digest);
    // Refused before anything was touched: no install mark, no new current snapshot, and
    // group 2 opens again as it was.
    assert!(o2.get_current_snapshot().await.unwrap().is_none());
    drop(o2);
    let o2 = open_group(&o0, other.path(), 2);
    assert_eq!(o2.store.digest().unwrap(), o2_digest);
}
