//! Adding and removing a node in a cluster of data groups (docs/sharding.md §6, `node/members.rs`):
//! a node added joins group 0 and every data group (each holds the group's timers, and can
//! lead it), a node removed leaves them all (a group it leads is handed over first), and both
//! calls are safe to send again.

use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb::node::Leader;
use timerdb::timer::TimerKey;

use crate::groups::{group_converged, group_leader, replica};
use crate::harness::*;
use crate::routing::namespace_in;

const GROUPS: u16 = 2;

/// Whether node `on`'s replica of group `g` has node `id` as a voter (`Some(true)`), a learner
/// (`Some(false)`) or no member (`None`).
fn member_of(c: &TestCluster, on: u64, g: u16, id: u64) -> Option<bool> {
    let members = replica(c.node(on), g).0.members();
    members.iter().find(|m| m.0 == id).map(|m| m.2)
}

/// Waits (20 s at most) until every running node's replica of every group says `want` of `id`.
async fn every_group_says(c: &TestCluster, id: u64, want: Option<bool>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for on in c.running() {
        for g in 0..=GROUPS {
            while member_of(c, on, g, id) != want {
                assert!(
                    Instant::now() < deadline,
                    "node {on}'s group {g}: node {id} is {:?}, not {want:?}",
                    member_of(c, on, g, id)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Schedules `id` in group `g`'s namespace through node `via`, retrying briefly (a hand-over
/// under way refuses for a moment).
async fn schedule_in(c: &TestCluster, via: u64, g: u16, id: &str) {
    let mut client = c.client(via).await;
    let req = pb::ScheduleRequest {
        namespace: namespace_in(GROUPS, g),
        ..schedule_req(id, now_ms() + 3_600_000)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(s) = client.schedule(req.clone()).await {
        assert!(Instant::now() < deadline, "{id}: {}", status_text(&s));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_added_joins_every_group_and_a_node_removed_leaves_them_all() {
    let mut c = TestCluster::start_with(3, |n| n.groups = GROUPS).await;
    for g in 1..=GROUPS {
        schedule_in(&c, 1, g, &format!("before-{g}")).await;
    }

    // Added through a node that does not lead group 0: it joins every group as a voter.
    let addr = c.join(4).await;
    let meta = group_leader(&c, 0).await;
    let via = c.running().into_iter().find(|id| *id != meta).unwrap();
    let mut admin = c.cluster(via).await;
    let add = pb::AddNodeRequest {
        node_id: 4,
        addr: addr.clone(),
        learner: false,
    };
    let r = admin.add_node(add.clone()).await.unwrap().into_inner();
    assert!(
        r.members.iter().any(|m| m.node_id == 4 && m.voter),
        "{:?}",
        r.members
    );
    every_group_says(&c, 4, Some(true)).await;
    // Sent again: nothing changes.
    admin.add_node(add).await.unwrap();
    // It holds every group's timers, those from before it came too.
    for g in 0..=GROUPS {
        group_converged(&c, g).await;
    }
    for g in 1..=GROUPS {
        let store = replica(c.node(4), g).1;
        let key = TimerKey::new(namespace_in(GROUPS, g), format!("before-{g}"));
        assert!(store.get(&key).unwrap().is_some(), "group {g} on node 4");
    }

    // It can lead a data group: the group's calls, through any node, run there.
    let to_4 = pb::TransferLeaderRequest {
        node_id: 4,
        group: 1,
    };
    admin.transfer_leader(to_4).await.unwrap();
    assert_eq!(replica(c.node(4), 1).0.leader(), Leader::Me);
    schedule_in(&c, 1, 1, "led-by-4").await;

    // Removed, leading group 1: the group is handed over first, then it leaves every group.
    let remove = pb::RemoveNodeRequest { node_id: 4 };
    let r = admin.remove_node(remove).await.unwrap().into_inner();
    assert!(!r.members.iter().any(|m| m.node_id == 4), "{:?}", r.members);
    c.stop(4).await;
    every_group_says(&c, 4, None).await;
    // Sent again: not a member (as for a single group).
    let again = admin.remove_node(remove).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::NotFound, "{again:?}");
    // Every group takes calls on the three left, and lost nothing.
    for g in 1..=GROUPS {
        schedule_in(&c, via, g, &format!("after-{g}")).await;
        let leader = group_leader(&c, g).await;
        let store = replica(c.node(leader), g).1;
        let key = TimerKey::new(namespace_in(GROUPS, g), "led-by-4".to_string());
        assert_eq!(store.get(&key).unwrap().is_some(), g == 1, "group {g}");
    }
    for g in 0..=GROUPS {
        group_converged(&c, g).await;
    }
    c.shutdown().await;
}

/// A Hello as a leader of `term`, of a cluster of bucket width `width` and `GROUPS` data
/// groups, for group `g` (0: `Raft.Hello`, else `Groups.Hello` naming it).
async fn hello(addr: &str, g: u16, width: u64, term: u64) -> Result<(), tonic::Status> {
    use timerdb::api::pb::{groups_client::GroupsClient, raft_client::RaftClient};
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut msg = tonic::Request::new(pb::RaftMessage { data: vec![] });
    let headers = msg.metadata_mut();
    headers.insert("x-timerdb-bucket-ms", width.into());
    headers.insert("x-timerdb-term", term.into());
    headers.insert("x-timerdb-groups", GROUPS.into());
    if g == 0 {
        return RaftClient::new(ch).hello(msg).await.map(|_| ());
    }
    msg.metadata_mut().insert("x-timerdb-group", g.into());
    GroupsClient::new(ch).hello(msg).await.map(|_| ())
}

/// The review of the above, HIGH: the bucket width is the node's, every group's. A data
/// group's Hello (which a stranger may send for a group still empty) never sets or changes
/// it: only group 0's gives it, and the data groups' must agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_groups_hello_never_sets_or_changes_the_nodes_bucket_width() {
    let mut c = TestCluster::start_with(3, |n| n.groups = GROUPS).await;
    let width = c.node(1).store.width_ms();
    let addr = c.join(4).await;
    let early = hello(&addr, 1, width + 5, 1).await.unwrap_err();
    assert_eq!(early.code(), tonic::Code::FailedPrecondition, "{early:?}");
    assert_eq!(
        c.node(4).store.width_ms(),
        0,
        "taken from a data group's Hello"
    );
    hello(&addr, 0, width, 1).await.unwrap();
    let other = hello(&addr, 1, width + 5, 2).await.unwrap_err();
    assert_eq!(other.code(), tonic::Code::FailedPrecondition, "{other:?}");
    assert_eq!(c.node(4).store.width_ms(), width);
    hello(&addr, 1, width, 2).await.unwrap();
    assert_eq!(c.node(4).store.width_ms(), width);
    c.shutdown().await;
}

/// The review of the above, MED 3: removing a node that leaves some voter's majority down
/// would stall every group in its joint change; it is refused before any group changes. The
/// voter that is down can itself be removed (the others answer), from every group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_that_leaves_no_majority_is_refused_and_a_down_voter_is_removed() {
    let mut c = TestCluster::start_with(3, |n| n.groups = GROUPS).await;
    let meta = group_leader(&c, 0).await;
    let others: Vec<u64> = c.running().into_iter().filter(|id| *id != meta).collect();
    let (down, kept) = (others[0], others[1]);
    c.stop(down).await;
    for g in 0..=GROUPS {
        group_leader(&c, g).await;
    }
    // Down for a second: group 0's leader no longer hears it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut admin = c.cluster(meta).await;
    let refused = (admin
        .remove_node(pb::RemoveNodeRequest { node_id: kept })
        .await)
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("majority"), "{refused:?}");
    every_group_says(&c, kept, Some(true)).await;
    let r = admin
        .remove_node(pb::RemoveNodeRequest { node_id: down })
        .await;
    let r = r.unwrap().into_inner();
    assert!(
        !r.members.iter().any(|m| m.node_id == down),
        "{:?}",
        r.members
    );
    every_group_says(&c, down, None).await;
    for g in 1..=GROUPS {
        schedule_in(&c, kept, g, &format!("two-left-{g}")).await;
    }
    c.shutdown().await;
}
