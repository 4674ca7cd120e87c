//! The slot map and the groups as operators and routers see them (docs/sharding.md §4):
//! `Cluster.Slots` through any node names every group, the hash slots it owns and its leader;
//! Status and Overview count the timers where they are (the data groups); TransferLeader moves
//! one group's leader from any node; and `timerctl slots` and `timerctl group list|transfer`
//! say the same.

use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb::keys::SlotMap;
use tonic::Code;

use crate::ctl::ctl_json as timerctl;
use crate::groups::group_leader;
use crate::harness::*;
use crate::routing::namespace_in;

const GROUPS: u16 = 3;

/// Sharded, with leaders left where they are put (no balancing): the test moves them.
fn unbalanced(n: &mut timerdb::config::NodeConfig) {
    n.groups = GROUPS;
    n.balance_every = Duration::ZERO;
}

/// Node `via`'s slot map, once it knows every group's leader.
async fn slots(c: &TestCluster, via: u64) -> pb::SlotsResponse {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let map = c.cluster(via).await.slots(pb::SlotsRequest {}).await;
        let map = map.unwrap().into_inner();
        if map.groups.iter().all(|g| g.leader_id != 0) {
            return map;
        }
        assert!(Instant::now() < deadline, "node {via}: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_names_each_groups_hash_slots_and_leader_and_counts_timers_where_they_are() {
    let c = TestCluster::start_with(3, |n| n.groups = GROUPS).await;
    let map = SlotMap::new(GROUPS);
    for via in c.running() {
        let m = slots(&c, via).await;
        assert_eq!((m.node_id, m.epoch, m.hash_slots), (via, 1, 1024));
        let groups: Vec<u32> = m.groups.iter().map(|g| g.group).collect();
        assert_eq!(groups, [0, 1, 2, 3]);
        assert!(
            m.groups[0].hash_slots.is_empty(),
            "group 0 owns no hash slot"
        );
        // The ranges cover every hash slot once, each in the group the router uses.
        let mut owner = vec![None; 1024];
        for g in &m.groups {
            for r in &g.hash_slots {
                for h in r.start..r.end {
                    assert_eq!(owner[h as usize].replace(g.group), None, "{h} twice");
                    assert_eq!(u32::from(map.owner(h as u16)), g.group, "hash slot {h}");
                }
            }
            assert_eq!(g.members.len(), 3, "{g:?}");
        }
        assert!(owner.iter().all(Option::is_some));
        for g in &m.groups {
            let leader = group_leader(&c, g.group as u16).await;
            assert_eq!(g.leader_id, leader, "node {via}, group {}", g.group);
            assert_eq!(g.leader_addr, c.peers[&leader], "group {}", g.group);
        }
    }

    // Timers counted in the group that holds them: by Status (summed), Slots and Overview.
    let ns = namespace_in(GROUPS, 2);
    let mut client = c.client(1).await;
    for i in 0..5 {
        let at = now_ms() + 3_600_000;
        let req = pb::ScheduleRequest {
            namespace: ns.clone(),
            ..schedule_req(&format!("t{i}"), at)
        };
        client.schedule(req).await.unwrap();
    }
    c.converged().await;
    for via in c.running() {
        let status = c.cluster(via).await.status(pb::StatusRequest {}).await;
        assert_eq!(status.unwrap().into_inner().pending_timers, 5, "node {via}");
        let m = c.cluster(via).await.slots(pb::SlotsRequest {}).await;
        let pending: Vec<u64> = (m.unwrap().into_inner().groups.iter())
            .map(|g| g.pending_timers)
            .collect();
        assert_eq!(pending, [0, 0, 5, 0], "node {via}");
    }
    let req = pb::OverviewRequest { by_state: true };
    let o = c.cluster(3).await.overview(req).await.unwrap().into_inner();
    let counts = o.namespaces.iter().find(|n| n.name == ns).expect("listed");
    assert_eq!((counts.group, counts.pending, counts.stored), (2, 5, 5));
    let pending = pb::TimerState::Pending as i32;
    assert_eq!(
        counts.by_state,
        [pb::StateCount {
            state: pending,
            count: 5
        }]
    );

    // timerctl says the same.
    let addr = c.peers[&1].clone();
    let doc = timerctl(&addr, &["slots"]);
    assert_eq!(doc["epoch"], 1);
    assert_eq!(doc["groups"].as_array().unwrap().len(), 4);
    let doc = timerctl(&addr, &["slots", "--namespace", &ns]);
    assert_eq!(doc["group"], 2);
    assert_eq!(doc["leader"], group_leader(&c, 2).await);
    let doc = timerctl(&addr, &["group", "list"]);
    assert_eq!(doc["groups"][2]["pending"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_moves_one_groups_leader_from_any_node() {
    let c = TestCluster::start_with(3, unbalanced).await;
    let g = 2;
    let from = group_leader(&c, g).await;
    let meta = group_leader(&c, 0).await;
    let to = (1..=3).find(|id| *id != from).unwrap();
    // Through a node that leads neither the group nor (if it can be) group 0.
    let via = (1..=3).find(|id| *id != from && *id != to).unwrap();
    let req = pb::TransferLeaderRequest {
        node_id: to,
        group: u32::from(g),
    };
    let r = c.cluster(via).await.transfer_leader(req).await.unwrap();
    assert_eq!(r.into_inner().leader_id, to);
    assert_eq!(group_leader(&c, g).await, to);
    assert_eq!(group_leader(&c, 0).await, meta, "group 0 kept its leader");

    // By timerctl, back again.
    let doc = timerctl(
        &c.peers[&to],
        &["group", "transfer", "2", "--to", &from.to_string()],
    );
    assert_eq!(
        (doc["group"].as_u64(), doc["leader"].as_u64()),
        (Some(2), Some(from))
    );
    assert_eq!(group_leader(&c, g).await, from);

    // A group the cluster does not have is refused, saying which it has.
    let req = pb::TransferLeaderRequest {
        node_id: 0,
        group: 9,
    };
    let err = c.cluster(1).await.transfer_leader(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("groups 0 to 3"), "{}", err.message());

    // With auth on, only an admin moves a group's leader: a key that may schedule is refused
    // before its message says which group (whether it exists or not), through any node.
    let admin = crate::auth::enable(&c, group_leader(&c, 0).await).await;
    let (_, user) = crate::auth::create_key(&c, 1, Some(&admin), "u", &["schedule:*"]).await;
    for (via, group) in [(1, 2), (2, 2), (3, 9)] {
        let req = pb::TransferLeaderRequest { node_id: 0, group };
        let ch = crate::auth::ch(&c, via, Some(&user)).await;
        let err = pb::cluster_client::ClusterClient::new(ch)
            .transfer_leader(req)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "node {via}: {err:?}");
    }
    assert_eq!(group_leader(&c, g).await, from, "nothing moved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_data_groups_group_0_owns_every_hash_slot_and_is_the_only_one() {
    let c = TestCluster::start(3).await;
    let m = slots(&c, 2).await;
    assert_eq!(m.groups.len(), 1);
    let r = &m.groups[0].hash_slots;
    assert_eq!((r.len(), r[0].start, r[0].end), (1, 0, 1024));
    assert_eq!(m.groups[0].leader_id, c.leader().await);
    let req = pb::TransferLeaderRequest {
        node_id: 0,
        group: 1,
    };
    let err = c.cluster(1).await.transfer_leader(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("no data groups"),
        "{}",
        err.message()
    );
}

/// Calls every node forwarded to another node's leader, summed.
async fn forwarded(c: &TestCluster) -> u64 {
    let mut sum = 0;
    for id in c.running() {
        let s = c.cluster(id).await.status(pb::StatusRequest {}).await;
        sum += s.unwrap().into_inner().calls_forwarded;
    }
    sum
}

/// Moves group `g`'s leader to `to` and waits until every node knows it.
async fn move_leader(c: &TestCluster, g: u16, to: u64) {
    let req = pb::TransferLeaderRequest {
        node_id: to,
        group: u32::from(g),
    };
    c.cluster(to).await.transfer_leader(req).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    for via in c.running() {
        while slots(c, via).await.groups[usize::from(g)].leader_id != to {
            assert!(Instant::now() < deadline, "node {via} never learned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_client_sends_each_call_to_its_groups_leader_and_follows_it() {
    use timerdb_client::{Client, Connector};
    let c = TestCluster::start_with(3, unbalanced).await;
    let ns = namespace_in(GROUPS, 2);
    // The group's leader is not group 0's: a call sent to group 0's leader is forwarded.
    let meta = group_leader(&c, 0).await;
    let lead = (1..=3).find(|id| *id != meta).unwrap();
    move_leader(&c, 2, lead).await;
    let addrs: Vec<String> = c.peers.values().cloned().collect();
    let client = Client::connect(Connector::new(), &addrs).await.unwrap();
    assert_eq!(client.map_epoch(), Some(1));
    assert_eq!(client.current_for(&ns), c.peers[&lead]);
    assert_eq!(
        client.current(),
        c.peers[&meta],
        "other calls go to group 0's leader"
    );

    let at = now_ms() + 3_600_000;
    let schedule = |id: String| pb::ScheduleRequest {
        namespace: ns.clone(),
        ..schedule_req(&id, at)
    };
    let before = forwarded(&c).await;
    for i in 0..10 {
        client.schedule(schedule(format!("a{i}"))).await.unwrap();
        let get = pb::GetRequest {
            namespace: ns.clone(),
            id: format!("a{i}"),
            ..Default::default()
        };
        client.get(get).await.unwrap();
    }
    let batch = pb::ScheduleBatchRequest {
        timers: (0..5).map(|i| schedule(format!("b{i}"))).collect(),
    };
    client.schedule_batch(batch).await.unwrap();
    let cancel = pb::CancelRequest {
        namespace: ns.clone(),
        id: "a0".into(),
        ..Default::default()
    };
    client.cancel(cancel).await.unwrap();
    assert_eq!(
        forwarded(&c).await - before,
        0,
        "every call went to its leader"
    );

    // The group's leader moves: the next call is forwarded once, and its answer says by whom.
    let next = (1..=3).find(|id| *id != lead).unwrap();
    move_leader(&c, 2, next).await;
    let before = forwarded(&c).await;
    client.schedule(schedule("c0".into())).await.unwrap();
    assert_eq!(forwarded(&c).await - before, 1);
    assert_eq!(client.current_for(&ns), c.peers[&next]);
    for i in 1..10 {
        client.schedule(schedule(format!("c{i}"))).await.unwrap();
    }
    assert_eq!(
        forwarded(&c).await - before,
        1,
        "then straight to the new leader"
    );
}
