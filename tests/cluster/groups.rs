//! Groups (docs/sharding.md §12 step 4): a cluster started with `--groups` runs each data
//! group as its own Raft group over every node's one log engine and one state database. Each
//! elects its own leader, replicates, fires its own timers, and survives a restart, without
//! touching another group's state.

use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb::command::Options;
use timerdb::node::Leader;
use timerdb::server::RunningNode;
use timerdb::timer::{TimerKey, TimerSpec, TimerState, When};

use crate::harness::*;

const GROUPS: u16 = 3;

/// Group `g`'s replica on `node` (0: group 0's, the node's own door).
pub(crate) fn replica(
    node: &RunningNode,
    g: u16,
) -> (
    &std::sync::Arc<timerdb::node::Node>,
    &timerdb::storage::Store,
) {
    match g {
        0 => (&node.node, &node.store),
        g => {
            let r = &node.groups[usize::from(g) - 1];
            (&r.node, &r.store)
        }
    }
}

/// The node leading group `g`, once one does.
pub(crate) async fn group_leader(c: &TestCluster, g: u16) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leaders: Vec<u64> = (c.running().into_iter())
            .filter(|id| replica(c.node(*id), g).0.leader() == Leader::Me)
            .collect();
        if let [one] = leaders[..] {
            return one;
        }
        assert!(
            Instant::now() < deadline,
            "group {g} has no leader: {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every running replica of group `g` has one digest at one index.
pub(crate) async fn group_converged(c: &TestCluster, g: u16) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let digests: Vec<(u64, u64)> = (c.running().iter())
            .map(|id| replica(c.node(*id), g).1.digest().unwrap())
            .collect();
        if digests.windows(2).all(|w| w[0] == w[1]) {
            return digests[0];
        }
        assert!(
            Instant::now() < deadline,
            "group {g} did not converge: {digests:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn spec(id: &str, at_ms: i64) -> TimerSpec {
    TimerSpec {
        key: TimerKey::new(NS, id),
        when: When::At(at_ms),
        payload: id.as_bytes().to_vec(),
        content_type: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_group_elects_replicates_and_fires_on_its_own() {
    let mut c = TestCluster::start_with(3, |n| n.groups = GROUPS).await;
    for id in c.running() {
        assert_eq!(c.node(id).groups.len(), usize::from(GROUPS));
    }
    // Each data group: a timer due soon and one due later, proposed to its own leader.
    let soon = now_ms() + 1_500;
    for g in 1..=GROUPS {
        let leader = group_leader(&c, g).await;
        let node = replica(c.node(leader), g).0;
        assert_eq!(node.group(), g);
        let (timer, created) = node
            .schedule(spec(&format!("soon-{g}"), soon), Options::default())
            .await
            .unwrap();
        assert!(created && timer.state == TimerState::Pending, "{timer:?}");
        node.schedule(
            spec(&format!("later-{g}"), soon + 3_600_000),
            Options::default(),
        )
        .await
        .unwrap();
    }
    // Each group fires its own timer, on every replica, and only its own.
    let deadline = Instant::now() + Duration::from_secs(30);
    for g in 1..=GROUPS {
        for id in c.running() {
            let store = replica(c.node(id), g).1;
            loop {
                let t = store.get(&TimerKey::new(NS, format!("soon-{g}"))).unwrap();
                if let Some(t) = t.as_ref().filter(|t| t.state == TimerState::Fired) {
                    // Its fire_index names its group (docs/sharding.md §5): no two groups
                    // give one token.
                    assert_eq!(t.fire_index % 256, u64::from(g), "{t:?}");
                    break;
                }
                assert!(Instant::now() < deadline, "group {g} on node {id}: {t:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for other in (1..=GROUPS).filter(|o| *o != g) {
                let key = TimerKey::new(NS, format!("soon-{other}"));
                assert!(store.get(&key).unwrap().is_none(), "group {g} holds {key}");
            }
        }
    }
    // Group 0 holds none of them.
    for id in c.running() {
        assert!(c.local_timer(id, "soon-1").is_none());
    }
    let mut before = Vec::new();
    for g in 0..=GROUPS {
        before.push(group_converged(&c, g).await);
    }
    let distinct: std::collections::BTreeSet<u64> = before.iter().map(|d| d.1).collect();
    assert_eq!(
        distinct.len(),
        before.len(),
        "groups share a digest: {before:?}"
    );

    // A node restarts: every group's replica comes back with its state, and catches up.
    let follower = c.follower().await;
    c.stop(follower).await;
    let leader = group_leader(&c, 2).await;
    replica(c.node(leader), 2)
        .0
        .schedule(spec("while-down", soon + 7_200_000), Options::default())
        .await
        .unwrap();
    c.restart(follower).await;
    for g in 0..=GROUPS {
        group_converged(&c, g).await;
    }
    let mut admin = c.cluster(follower).await;
    // A backup is one group's snapshot, which a restore of such a cluster refuses: not taken.
    let refused = match admin.backup(pb::BackupRequest {}).await {
        Err(s) => s,
        Ok(stream) => (stream.into_inner().message().await)
            .expect_err("a backup of one group of many is refused"),
    };
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );

    let back = replica(c.node(follower), 2).1;
    assert!(back
        .get(&TimerKey::new(NS, "while-down"))
        .unwrap()
        .is_some());
    let later = replica(c.node(follower), 3).1;
    let t = later.get(&TimerKey::new(NS, "later-3")).unwrap().unwrap();
    assert_eq!(t.state, TimerState::Pending);
    c.shutdown().await;
}
