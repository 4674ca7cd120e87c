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

    // Group 1 answers and reads as group 1 alone on a database of its own.
    let (_single_dir, _base, mut single) = {
        let d = TempDir::new().unwrap();
        let (_, base) = open(&d);
        let sm = open_group(&base, d.path(), 1);
        (d, base, sm)
    };
    assert_eq!(answers, apply_all(&mut single, workload()).await);
    let g1_reads = observe(&g1.store, NOW);
    same_text(&g1_reads, &observe(&single.store, NOW));
    // And as group 0 would, but for the fire_index: group 1's tokens are `index × 256 + 1`.
    let (_zero_dir, mut zero_alone) = {
        let d = TempDir::new().unwrap();
        let (_, sm) = open(&d);
        (d, sm)
    };
    assert_eq!(
        answers.len(),
        apply_all(&mut zero_alone, workload()).await.len()
    );
    let mut fired = 0;
    for (ns, _, _) in g1.store.counts_by_namespace().unwrap() {
        let query = |store: &crate::storage::Store| {
            let q = crate::storage::ListQuery {
                namespace: ns.clone(),
                filter: Default::default(),
                limit: 10_000,
                after: None,
            };
            store.list(&q).unwrap().timers
        };
        for (one, zero) in query(&g1.store).iter().zip(query(&zero_alone.store)) {
            assert_eq!(one.key, zero.key);
            match zero.fire_index {
                0 => assert_eq!(one.fire_index, 0),
                i => {
                    assert_eq!(one.fire_index, i * 256 + 1, "{}", one.key);
                    fired += 1;
                }
            }
        }
    }
    assert!(fired > 100, "{fired} fired timers compared");
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

/// The number of data groups is the cluster's, fixed when the data dir is new: another one at
/// a restart is refused, and so is a single-group state asked to become sharded by a flag.
#[tokio::test]
async fn a_data_dir_keeps_its_number_of_groups() {
    let dir = TempDir::new().unwrap();
    let (_, sm) = open(&dir);
    sm.store.settle_groups(4).unwrap();
    sm.store.settle_groups(4).unwrap();
    let refused = sm.store.settle_groups(2).unwrap_err();
    assert!(
        refused.to_string().contains("cluster of 4 data groups"),
        "{refused}"
    );
    assert!(sm.store.settle_groups(0).is_err());
    // A build before groups refuses the directory: it records format 7, which this build
    // opens.
    let format = sm
        .store
        .db()
        .get_cf(cf(sm.store.db(), CF_META), meta::FORMAT);
    let format: u32 = decode(&format.unwrap().unwrap()).unwrap();
    assert_eq!(format, crate::storage::SHARDED_FORMAT);
    drop(sm);
    let (_, sm) = open(&dir);
    sm.store.settle_groups(4).unwrap();

    // A single-group state (entries applied, no record: a build before groups wrote it).
    let old = TempDir::new().unwrap();
    let (_, mut sm) = open(&old);
    apply_all(&mut sm, own_commands()).await;
    sm.store.settle_groups(0).unwrap();
    let refused = sm.store.settle_groups(3).unwrap_err();
    assert!(
        refused.to_string().contains("cluster of 0 data groups"),
        "{refused}"
    );
}

/// In a cluster with data groups every group's fire_index names its group, group 0's too: a
/// raw group-0 token (index 1281) could otherwise equal group 1's (index 5: 5 × 256 + 1), and
/// a receiver deduplicating by it would drop a timer.
#[tokio::test]
async fn in_a_sharded_cluster_group_0s_tokens_name_it_too() {
    let dir = TempDir::new().unwrap();
    let (_, mut g0) = open(&dir);
    g0.store.settle_groups(2).unwrap();
    let mut g1 = open_group(&g0, dir.path(), 1);
    for sm in [&mut g0, &mut g1] {
        apply_all(sm, vec![schedule("k", T0 + 5), fire(T0 + 10, 100)]).await;
    }
    let token = |sm: &StateMachine| {
        let t = sm.store.get(&TimerKey::new("ns", "k")).unwrap().unwrap();
        assert_eq!(t.state, crate::timer::TimerState::Fired);
        t.fire_index
    };
    // Both fired by their entry 2.
    assert_eq!((token(&g0), token(&g1)), (2 * 256, 2 * 256 + 1));

    // Reopened mid-stream (by whatever opens the data dir, `settle_groups` or not), group 0
    // goes on composing its tokens: the record decides, not the caller.
    drop((g0, g1));
    let (_, mut g0) = open(&dir);
    let more = vec![schedule("k2", T0 + 20), fire(T0 + 30, 100)];
    let entries: Vec<_> = (more.into_iter().enumerate())
        .map(|(i, c)| entry(3 + i as u64, c))
        .collect();
    g0.apply_entries(entries).await.unwrap();
    let t = g0.store.get(&TimerKey::new("ns", "k2")).unwrap().unwrap();
    assert_eq!(t.fire_index, 4 * 256, "{t:?}");
}

/// A backup is group 0's state: one of a cluster with data groups holds none of their timers,
/// and is refused at restore rather than restored as an empty cluster.
#[tokio::test]
async fn a_backup_of_a_cluster_with_data_groups_is_not_restored() {
    let dir = TempDir::new().unwrap();
    let (_, mut sm) = open(&dir);
    sm.store.settle_groups(2).unwrap();
    apply_all(&mut sm, own_commands()).await;
    let snap = build_snapshot(&mut sm).await;
    let file = dir.path().join("backup.tdb");
    std::fs::copy(snap.snapshot.path(), &file).unwrap();
    assert_eq!(crate::storage::restore::inspect(&file).unwrap().groups, 2);
    let voters = [(1, openraft::BasicNode::new("127.0.0.1:1"))].into();
    let target = dir.path().join("restored");
    let refused = crate::storage::restore::restore(&file, &target, voters, None).unwrap_err();
    assert!(refused.to_string().contains("2 data groups"), "{refused}");
    assert!(!target.exists(), "nothing made");
}

/// Policies in the data groups' logs (docs/sharding.md §2, step 4d): group 0 of a cluster of
/// data groups versions each namespace change by its entry's index; a data group keeps the
/// newest copy it is given, so a repeat or an older copy (a second leader's, late) changes
/// nothing, within one entry too, and the copy survives a snapshot; a cluster of one group
/// writes no versions (its bytes are as before).
#[tokio::test]
async fn a_data_group_keeps_the_newest_copy_of_a_namespace_policy() {
    use crate::namespace::{Misfire, MisfireAction, Policy};
    let dir = TempDir::new().unwrap();
    let (_, mut g0) = open(&dir);
    g0.store.settle_groups(1).unwrap();
    let mut g1 = open_group(&g0, dir.path(), 1);
    let configure = |max_attempts| Command::ConfigureNamespace {
        name: "ns".into(),
        policy: Policy {
            max_attempts,
            ..Default::default()
        },
        push: None,
        misfire: Misfire::default(),
        keep_secrets: false,
    };
    let pause = Command::PauseNamespace {
        name: "ns".into(),
        paused: true,
    };
    apply_all(&mut g0, vec![configure(3), pause.clone()]).await;
    let (ns, version) = g0.store.versioned_namespaces(None, 10).unwrap().remove(0);
    assert_eq!(
        (ns.policy.max_attempts, ns.policy.paused, version),
        (3, true, 2)
    );

    let skip = Misfire {
        max_lateness_ms: 1_000,
        action: MisfireAction::Skip,
    };
    let copy = |version, max_attempts| Command::Policy {
        name: "ns".into(),
        version,
        policy: Policy {
            max_attempts,
            ..Default::default()
        },
        push: None,
        misfire: skip,
    };
    let seen = |sm: &StateMachine| {
        let ns = sm.store.namespace("ns").unwrap();
        (
            ns.policy.max_attempts,
            sm.store.policy_version("ns").unwrap(),
        )
    };
    apply_all(&mut g1, vec![copy(5, 4)]).await;
    assert_eq!(seen(&g1), (4, 5));
    assert_eq!(g1.store.namespace("ns").unwrap().policy.misfire, skip);
    let late = vec![
        copy(3, 9),
        copy(5, 9),
        Command::Multi(vec![copy(7, 7), copy(6, 6)]),
    ];
    let entries: Vec<_> = (late.into_iter().enumerate())
        .map(|(i, c)| entry(2 + i as u64, c))
        .collect();
    g1.apply_entries(entries).await.unwrap();
    assert_eq!(seen(&g1), (7, 7), "only a newer copy replaces the group's");
    // A replica from the group's snapshot holds the copy and its version.
    let snap = build_snapshot(&mut g1).await;
    let other = TempDir::new().unwrap();
    let (_, o0) = open(&other);
    let mut o1 = open_group(&o0, other.path(), 1);
    o1.install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    assert_eq!(seen(&o1), (7, 7));

    // Reopened mid-stream (without `settle_groups`), group 0 goes on versioning: whether it
    // does is the data dir's record, the same on every replica, not the opener's choice.
    drop((g0, g1, o1, o0));
    let (_, mut g0) = open(&dir);
    let resume = Command::PauseNamespace {
        name: "ns".into(),
        paused: false,
    };
    g0.apply_entries(vec![entry(3, resume)]).await.unwrap();
    assert_eq!(g0.store.policy_version("ns").unwrap(), 3);

    // One group: no versions.
    let single = TempDir::new().unwrap();
    let (_, mut alone) = open(&single);
    apply_all(&mut alone, vec![configure(3), pause]).await;
    assert_eq!(alone.store.policy_version("ns").unwrap(), 0);
}
