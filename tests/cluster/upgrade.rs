//! Rolling upgrades (docs/operations.md): a leader of a newer build proposes only the entry
//! forms every member's build reads, so a cluster half upgraded keeps writing, and the newer
//! forms start once the last member advertises them (issue 33 review F1).
//!
//! An older build is played by a node whose feature level is lowered (`NodeConfig::level`):
//! it advertises that level and refuses entries of a newer form, as an older build that cannot
//! decode them does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb::command::Command;
use timerdb::command::LEVEL;
use timerdb::namespace::Policy;

use crate::harness::*;

/// Makes node 1 the leader.
async fn lead_with_1(c: &TestCluster) {
    let leader = c.leader().await;
    if leader != 1 {
        c.cluster(leader)
            .await
            .transfer_leader(pb::TransferLeaderRequest {
                node_id: 1,
                group: 0,
            })
            .await
            .unwrap();
    }
    assert_eq!(c.leader().await, 1);
}

/// `node` proposes a PutNamespace as `ConfigureNamespace` (level 1), and it commits.
async fn puts_a_namespace_in_the_newer_form(node: &timerdb::node::Node) {
    let entry = node
        .namespace_entry("upgrading".into(), Policy::default(), None)
        .unwrap();
    assert!(
        matches!(entry, Command::ConfigureNamespace { .. }),
        "{entry:?}"
    );
    node.put_namespace("upgrading".into(), Policy::default(), None)
        .await
        .unwrap();
}

fn series(id: &str) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: "upgrading".into(),
        id: id.into(),
        recurrence: Some(pb::Recurrence {
            every_ms: 60_000,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgraded_leader_writes_what_older_members_read_until_all_are_upgraded() {
    let older = Arc::new(AtomicBool::new(true));
    let still_older = older.clone();
    let mut c = TestCluster::start_with(3, move |n| {
        if n.id != 1 && still_older.load(Ordering::SeqCst) {
            n.level = 0;
        }
    })
    .await;
    lead_with_1(&c).await;
    let node = c.node(1).node.clone();
    tokio::time::sleep(Duration::from_millis(300)).await; // heartbeats answered
    assert_eq!(node.cluster_level(), 0);

    // Nodes 2 and 3 would refuse a ConfigureNamespace or a ZoneRules entry, and they are the
    // majority: each write below would time out if node 1 proposed one.
    node.put_namespace("upgrading".into(), Policy::default(), None)
        .await
        .expect("PutNamespace with two older members");
    let mut client = c.client(1).await;
    client
        .schedule(series("before"))
        .await
        .expect("a series with two older members");
    c.converged().await;

    // Upgrade nodes 2 and 3, one at a time.
    older.store(false, Ordering::SeqCst);
    for id in [2, 3] {
        c.stop(id).await;
        c.restart(id).await;
    }
    lead_with_1(&c).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.cluster_level() < LEVEL {
        assert!(
            Instant::now() < deadline,
            "node 1 never heard the new level"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    puts_a_namespace_in_the_newer_form(&node).await;
    let mut client = c.client(1).await;
    client.schedule(series("after")).await.unwrap();
    c.converged().await;
    c.shutdown().await;
}

/// While a member advertises another tzdb version (mid-upgrade), a series in a time zone is
/// refused, with the reason: its replica could have other rules for the zone and would stop
/// at the entry (review of issue 33's change, F6). An interval series, which no zone rules
/// touch, is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recurring_timer_in_a_time_zone_waits_until_every_member_runs_one_tzdb() {
    let c = TestCluster::start_with(3, |n| {
        if n.id == 3 {
            n.tzdb = "2000a".into();
        }
    })
    .await;
    let leader = c.leader().await;
    tokio::time::sleep(Duration::from_millis(300)).await; // heartbeats answered
    let mut client = c.client(leader).await;
    let mut zoned = series("berlin");
    zoned.recurrence = Some(pb::Recurrence {
        cron: "30 2 * * *".into(),
        time_zone: "Europe/Berlin".into(),
        ..Default::default()
    });
    let e = client.schedule(zoned).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("2000a"), "{e:?}");
    client
        .schedule(series("interval"))
        .await
        .expect("an interval series names no zone");
    c.converged().await;
    c.shutdown().await;
}

/// Waits until every running node applied the committed level `level`.
async fn committed(c: &TestCluster, level: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .running()
        .iter()
        .any(|id| c.node(*id).store.committed_level() < level)
    {
        assert!(Instant::now() < deadline, "level {level} never committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Once every member advertised a level, the leader commits it, and a later leader proposes
/// its forms though it never heard a member that is down (issue 33 review 33c, MED 3: what a
/// leader heard was all it went by, so a restarted leader went back to the older forms and
/// PutNamespace's read-before-write came back). A node of an older build is refused as a
/// new member once the level is committed: it could not read the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_committed_level_holds_for_a_leader_that_never_heard_a_member() {
    let mut c = TestCluster::start(3).await;
    committed(&c, LEVEL).await;

    // Node 3 goes down; nodes 1 and 2 restart, so neither has heard it since.
    c.stop(3).await;
    for id in [1, 2] {
        c.stop(id).await;
        c.restart(id).await;
    }
    let leader = c.leader().await;
    let node = c.node(leader).node.clone();
    let levels = c.node(leader).levels.clone();
    tokio::time::sleep(Duration::from_millis(300)).await; // heartbeats answered
    assert_eq!(levels.lowest(LEVEL, leader, [1, 2, 3]), 0, "3 unheard");
    assert_eq!(node.cluster_level(), LEVEL);
    puts_a_namespace_in_the_newer_form(&node).await;

    // A node of an older build is not added.
    let addr = c.join_with(4, |n| n.level = 0).await;
    let mut admin = c.cluster(leader).await;
    let add = pb::AddNodeRequest {
        node_id: 4,
        addr,
        learner: true,
    };
    let e = admin.add_node(add).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("feature level 0"), "{e:?}");
    assert!(!node.members().iter().any(|m| m.0 == 4), "never a member");
    c.stop(4).await;
    c.restart(3).await;
    committed(&c, LEVEL).await;
    c.converged().await;
    c.shutdown().await;
}
