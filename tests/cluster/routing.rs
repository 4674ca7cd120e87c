//! Routing client calls to the group of their namespace (docs/sharding.md §4, §12 step 4c):
//! in a cluster of data groups any node takes any call and runs it on the leader of the group
//! holding the namespace's timers; a batch across groups is refused; streams follow their
//! group's leader; and a data group's leader that does not lead group 0 judges a caller only
//! once its replica of group 0 has caught up with group 0's leader, so a revoked key is
//! never honoured late there.

use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb::keys::SlotMap;
use timerdb::node::Leader;
use timerdb::timer::{TimerKey, TimerState};
use tonic::Code;

use crate::auth::{access, create_key, enable, timers};
use crate::harness::*;

/// A namespace whose timers group `g` holds, in a cluster of `groups` data groups.
pub(crate) fn namespace_in(groups: u16, g: u16) -> String {
    let map = SlotMap::new(groups);
    (0..)
        .map(|i| format!("ns-{i}"))
        .find(|ns| map.group_of(ns) == g)
        .unwrap()
}

/// The node leading group `g` (0: group 0), once one does.
async fn leader_of(c: &TestCluster, g: u16) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leads = |id: &u64| {
            let n = c.node(*id);
            let node = match g {
                0 => &n.node,
                g => &n.groups[usize::from(g) - 1].node,
            };
            node.leader() == Leader::Me
        };
        let leaders: Vec<u64> = c.running().into_iter().filter(leads).collect();
        if let [one] = leaders[..] {
            return one;
        }
        assert!(Instant::now() < deadline, "group {g} has no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Group `g`'s replica of timer `id` in `ns` on node `node`.
fn held(c: &TestCluster, node: u64, g: u16, ns: &str, id: &str) -> Option<timerdb::timer::Timer> {
    let n = c.node(node);
    let store = match g {
        0 => &n.store,
        g => &n.groups[usize::from(g) - 1].store,
    };
    store.get(&TimerKey::new(ns, id)).unwrap()
}

fn req(ns: &str, id: &str, at_ms: i64) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: ns.into(),
        ..schedule_req(id, at_ms)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_node_runs_a_call_in_the_group_of_its_namespace() {
    const GROUPS: u16 = 3;
    let c = TestCluster::start_with(3, |n| n.groups = GROUPS).await;
    let soon = now_ms() + 1_500;
    let spaces: Vec<String> = (1..=GROUPS).map(|g| namespace_in(GROUPS, g)).collect();
    // Each namespace's timers, scheduled through every node, land in its group only.
    for (g, ns) in (1..=GROUPS).zip(&spaces) {
        for through in c.running() {
            let mut client = c.client(through).await;
            let id = format!("later-{through}");
            client
                .schedule(req(ns, &id, soon + 3_600_000))
                .await
                .unwrap();
        }
        let mut client = c.client(u64::from(g) % 3 + 1).await;
        client.schedule(req(ns, "soon", soon)).await.unwrap();
    }
    c.converged().await;
    for (g, ns) in (1..=GROUPS).zip(&spaces) {
        for node in c.running() {
            for other in 0..=GROUPS {
                let there = held(&c, node, other, ns, "later-1");
                assert_eq!(
                    there.is_some(),
                    other == g,
                    "{ns} in group {other}, node {node}"
                );
            }
        }
        // Reads and changes through any node reach the same group.
        for through in c.running() {
            let mut client = c.client(through).await;
            let get = pb::GetRequest {
                namespace: ns.clone(),
                id: format!("later-{through}"),
                ..Default::default()
            };
            let t = client.get(get).await.unwrap().into_inner().timer.unwrap();
            assert_eq!(t.namespace, *ns);
            let list = pb::ListRequest {
                namespace: ns.clone(),
                ..Default::default()
            };
            let page = client.list(list).await.unwrap().into_inner();
            assert_eq!(page.timers.len(), 4, "{ns} through node {through}");
        }
        let mut client = c.client(1).await;
        let cancel = pb::CancelRequest {
            namespace: ns.clone(),
            id: "later-2".into(),
            ..Default::default()
        };
        let t = client
            .cancel(cancel)
            .await
            .unwrap()
            .into_inner()
            .timer
            .unwrap();
        assert_eq!(t.state, pb::TimerState::Cancelled as i32);
    }

    // A batch is applied in one group: across two it is refused, naming both, and nothing of
    // it is written; within one it is taken.
    let mut client = c.client(2).await;
    let across = pb::ScheduleBatchRequest {
        timers: vec![req(&spaces[0], "x", soon), req(&spaces[1], "y", soon)],
    };
    let refused = client.schedule_batch(across).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    for ns in &spaces[..2] {
        assert!(refused.message().contains(ns.as_str()), "{refused:?}");
    }
    tried("a batch across groups", &status_text(&refused));
    let within = pb::ScheduleBatchRequest {
        timers: vec![req(&spaces[2], "x", soon), req(&spaces[2], "y", soon)],
    };
    client.schedule_batch(within).await.unwrap();
    c.converged().await;
    for node in c.running() {
        assert!(held(&c, node, 1, &spaces[0], "x").is_none());
        assert!(held(&c, node, 3, &spaces[2], "y").is_some());
    }

    // A stream follows its namespace's group leader, from a node that does not lead it: the
    // delivery is the group's (its fire_index names it), and its ack applies there.
    for (g, ns) in (1..=GROUPS).zip(&spaces) {
        let leader = leader_of(&c, g).await;
        let through = c.running().into_iter().find(|id| *id != leader).unwrap();
        let mut client = c.client(through).await;
        let sub = pb::SubscribeRequest {
            namespace: ns.clone(),
            consumer: "c".into(),
            max_in_flight: 10,
        };
        let mut stream = client.subscribe(sub).await.unwrap().into_inner();
        let delivery = loop {
            let d = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await
                .expect("a delivery within 30 s")
                .unwrap()
                .expect("the stream is open");
            if d.timer.as_ref().unwrap().id == "soon" {
                break d;
            }
        };
        let timer = delivery.timer.unwrap();
        assert_eq!(timer.fire_index % 256, u64::from(g), "{timer:?}");
        let ack = pb::AckRequest {
            namespace: ns.clone(),
            id: "soon".into(),
            attempt: delivery.attempt,
            wait_for_commit: true,
        };
        c.client(leader).await.ack(ack).await.unwrap();
        for node in c.running() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while held(&c, node, g, ns, "soon").unwrap().state != TimerState::Acked {
                assert!(Instant::now() < deadline, "{ns}'s ack on node {node}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    c.shutdown().await;
}

/// Group 0's leader moves off `node`, if it is there.
async fn not_leading_group_0(c: &TestCluster, node: u64, admin: &str) {
    while leader_of(c, 0).await == node {
        let other = c.running().into_iter().find(|id| *id != node).unwrap();
        let channel = crate::auth::ch(c, other, Some(admin)).await;
        let mut cluster = pb::cluster_client::ClusterClient::new(channel);
        let to = pb::TransferLeaderRequest {
            node_id: other,
            group: 0,
        };
        let _ = cluster.transfer_leader(to).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_group_leader_behind_on_group_0_honours_no_revoked_key_and_knows_a_new_one() {
    let c = TestCluster::start_with(3, |n| n.groups = 1).await;
    let ns = namespace_in(1, 1);
    let admin = enable(&c, c.leader().await).await;
    let roles = ["schedule:*", "consume:*"];
    let (key, token) = create_key(&c, c.leader().await, Some(&admin), "k", &roles).await;
    let runs = leader_of(&c, 1).await;
    not_leading_group_0(&c, runs, &admin).await;
    c.converged().await;
    let mut on_runs = timers(&c, runs, Some(&token)).await;
    on_runs
        .schedule(req(&ns, "before", now_ms() + 3_600_000))
        .await
        .unwrap();
    on_runs
        .schedule(req(&ns, "due", now_ms() + 500))
        .await
        .unwrap();

    // The data group's leader stops applying group 0: it has not seen the revocation that
    // group 0 then acknowledges.
    let held_back = c.node(runs).store.apply_hold.close();
    let meta = leader_of(&c, 0).await;
    access(&c, meta, Some(&admin))
        .await
        .revoke_key(pb::RevokeKeyRequest { id: key })
        .await
        .unwrap();
    let other = c
        .running()
        .into_iter()
        .find(|id| ![runs, meta].contains(id))
        .unwrap();
    for through in [runs, other] {
        let mut client = timers(&c, through, Some(&token)).await;
        let id = format!("after-{through}");
        let r = client.schedule(req(&ns, &id, now_ms() + 3_600_000)).await;
        let s = r.expect_err("a revoked key is refused, or the call not run");
        assert!(
            matches!(s.code(), Code::Unauthenticated | Code::Unavailable),
            "through node {through}: {s:?}"
        );
        tried(
            &format!("a revoked key, group 0 behind, through {through}"),
            &status_text(&s),
        );
        assert!(held(&c, runs, 1, &ns, &id).is_none());
    }
    // A stream opened with the revoked key at the group's leader (whose stale replica still
    // knows the key) delivers nothing, and ends once it has caught up with group 0.
    let sub = pb::SubscribeRequest {
        namespace: ns.clone(),
        consumer: "late".into(),
        max_in_flight: 10,
    };
    let mut stream = on_runs.subscribe(sub).await.unwrap().into_inner();
    let quiet = tokio::time::timeout(Duration::from_millis(1_500), stream.message()).await;
    assert!(
        quiet.is_err(),
        "a stream of a revoked key delivered: {quiet:?}"
    );
    drop(held_back);
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    let Ok(Err(s)) = ended else {
        panic!("the stream of a revoked key is still open: {ended:?}");
    };
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    let r = on_runs
        .schedule(req(&ns, "after", now_ms() + 3_600_000))
        .await;
    assert_eq!(r.unwrap_err().code(), Code::Unauthenticated);

    // A key created while the data group's leader is behind works there at once: it waits
    // for group 0, rather than refuse a key whose creation was acknowledged.
    let held_back = c.node(runs).store.apply_hold.close();
    let (_, fresh) = create_key(&c, meta, Some(&admin), "fresh", &["schedule:*"]).await;
    let mut client = timers(&c, runs, Some(&fresh)).await;
    let call = tokio::spawn(async move {
        client
            .schedule(req(&ns, "fresh", now_ms() + 3_600_000))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(held_back);
    let created = call.await.unwrap().expect("a new key works at once");
    assert!(created.into_inner().created);
    c.shutdown().await;
}

/// Review of 4c (MED 1): a cut of the one link between group 0's leader and a data group's
/// leader left that data group refusing every call (its leader cannot take group 0's read
/// index to judge them) until the link healed. Its leader now hands it over to a member that
/// reaches group 0's leader (`node::hand_over_when_cut_off`), and calls go through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_group_whose_leader_is_cut_off_from_group_0s_leader_moves_to_one_that_is_not() {
    cut_off_from_group_0s_leader(true).await;
}

/// The same, with the link cut one way only: the data group's leader cannot call group 0's
/// leader, which still reaches it (its heartbeats arrive and are answered). Review of the
/// hand-over (MED 2): it was triggered by hearing nothing from group 0's leader, so this cut
/// left the group refusing every call, as before; it is triggered by failing to catch up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_group_whose_leader_cannot_call_group_0s_leader_moves_to_one_that_can() {
    cut_off_from_group_0s_leader(false).await;
}

/// Each peer link of a [`proxied`] cluster, `(from, to)`: its proxy, to cut and heal.
pub(crate) type Links = std::sync::Arc<
    std::sync::Mutex<std::collections::BTreeMap<(u64, u64), timerdb_harness::proxy::Link>>,
>;

/// A 3-node cluster whose every peer link goes through a proxy, made when a node's
/// configuration is (and kept across restarts); `tune` sets the rest of each configuration.
pub(crate) async fn proxied(
    tune: impl Fn(&mut timerdb::config::NodeConfig) + Send + Sync + 'static,
) -> (TestCluster, Links) {
    use timerdb_harness::proxy::Link;
    let links: Links = Links::default();
    let made = links.clone();
    let c = TestCluster::start_with(3, move |n| {
        tune(n);
        let mut links = made.lock().unwrap();
        for (to, addr) in n.peers.clone().into_iter().filter(|(to, _)| *to != n.id) {
            let link = links.entry((n.id, to)).or_insert_with(|| {
                let start = Link::start(addr);
                let handle = tokio::runtime::Handle::current();
                tokio::task::block_in_place(|| handle.block_on(start)).unwrap()
            });
            n.dial.insert(to, link.addr.clone());
        }
    })
    .await;
    (c, links)
}

async fn cut_off_from_group_0s_leader(both_ways: bool) {
    use timerdb_harness::proxy::Mode;
    let (c, links) = proxied(|n| {
        n.groups = 1;
        // Only the cut-off hand-over moves the group (balancing would move it back).
        n.balance_every = Duration::ZERO;
    })
    .await;
    let ns = namespace_in(1, 1);
    let admin = enable(&c, c.leader().await).await;
    let (_, token) = create_key(&c, c.leader().await, Some(&admin), "k", &["schedule:*"]).await;
    let runs = leader_of(&c, 1).await;
    not_leading_group_0(&c, runs, &admin).await;
    let meta = leader_of(&c, 0).await;
    assert_eq!(leader_of(&c, 1).await, runs);
    let third = (c.running().into_iter())
        .find(|id| ![runs, meta].contains(id))
        .unwrap();
    c.converged().await;

    // The link between the two leaders is cut (both ways, or from the data group's leader
    // only); every other link works.
    let cut_links = match both_ways {
        true => vec![(runs, meta), (meta, runs)],
        false => vec![(runs, meta)],
    };
    for link in &cut_links {
        links.lock().unwrap()[link].set(Mode::Blackhole);
    }
    let cut = Instant::now();
    let mut client = timers(&c, third, Some(&token)).await;
    let deadline = cut + Duration::from_secs(30);
    for attempt in 0.. {
        let id = format!("across-{attempt}");
        match client.schedule(req(&ns, &id, now_ms() + 3_600_000)).await {
            Ok(_) => break,
            Err(s) => assert!(
                Instant::now() < deadline,
                "group 1's calls still fail {:?} after the cut: {}",
                cut.elapsed(),
                status_text(&s)
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("group 1 took calls again {:?} after the cut", cut.elapsed());
    assert_eq!(
        leader_of(&c, 1).await,
        third,
        "group 1 moved to the member not cut off"
    );
    assert_eq!(leader_of(&c, 0).await, meta, "group 0 kept its leader");
    for link in &cut_links {
        links.lock().unwrap()[link].set(Mode::Pass);
    }
    c.converged().await;
    c.shutdown().await;
}

/// The group-0 replica of namespace `ns`'s configuration and group `g`'s copy on `node`.
fn policy_on(c: &TestCluster, node: u64, g: u16, ns: &str) -> (u32, bool) {
    let store = &c.node(node).groups[usize::from(g) - 1].store;
    let p = store.namespace(ns).unwrap().policy;
    (p.max_attempts, p.paused)
}

/// Policies in the data groups' logs (docs/sharding.md §2, step 4d): a namespace's
/// configuration commits in group 0 and is acknowledged once the group holding its timers
/// has it, so a data group's timers follow it: here, paused, a fired timer is not delivered
/// until its namespace is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_policy_reaches_its_group_before_it_is_acknowledged() {
    const GROUPS: u16 = 2;
    let c = TestCluster::start_with(3, |n| n.groups = GROUPS).await;
    let ns = namespace_in(GROUPS, 2);
    let meta = leader_of(&c, 0).await;
    let through = c.running().into_iter().find(|id| *id != meta).unwrap();
    let mut admin = c.namespaces(through).await;
    let policy = pb::NamespacePolicy {
        max_attempts: 7,
        ..Default::default()
    };
    let put = pb::PutNamespaceRequest {
        name: ns.clone(),
        policy: Some(policy),
    };
    admin.put_namespace(put).await.unwrap();
    // Acknowledged by group 0's leader once its replica of group 2 had the copy.
    assert_eq!(policy_on(&c, meta, 2, &ns), (7, false));
    let pause = pb::PauseNamespaceRequest { name: ns.clone() };
    admin.pause_namespace(pause).await.unwrap();
    assert_eq!(policy_on(&c, meta, 2, &ns), (7, true));
    c.converged().await;
    for node in c.running() {
        assert_eq!(policy_on(&c, node, 2, &ns), (7, true), "node {node}");
        // Group 1 holds none of the namespace's timers, and no copy.
        let other = &c.node(node).groups[0].store;
        assert!(!other.namespace(&ns).unwrap().configured);
    }

    // Paused in its group: the timer fires there and is not delivered.
    let mut client = c.client(through).await;
    client
        .schedule(req(&ns, "p", now_ms() + 200))
        .await
        .unwrap();
    let sub = pb::SubscribeRequest {
        namespace: ns.clone(),
        consumer: "c".into(),
        max_in_flight: 10,
    };
    let mut stream = client.subscribe(sub).await.unwrap().into_inner();
    let quiet = tokio::time::timeout(Duration::from_millis(1_500), stream.message()).await;
    assert!(quiet.is_err(), "delivered while paused: {quiet:?}");
    let fired = held(&c, meta, 2, &ns, "p").unwrap();
    assert_eq!(fired.state, TimerState::Fired);
    let resume = pb::PauseNamespaceRequest { name: ns.clone() };
    admin.resume_namespace(resume).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("delivered once resumed")
        .unwrap()
        .unwrap();
    assert_eq!(d.timer.unwrap().id, "p");
    c.shutdown().await;
}

/// The grouping layer reads a call's message only once the auth layer let its caller on: a
/// caller without a key is refused at once, never held while its message (which may never
/// come) is awaited, nor buffered (review of 4c, HIGH 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_without_a_key_is_refused_before_its_message_is_read() {
    let c = TestCluster::start_with(3, |n| n.groups = 2).await;
    enable(&c, c.leader().await).await;
    c.converged().await; // every node has applied auth on (off, anyone may call)
    for node in c.running() {
        let mut client = c.client(node).await;
        // A Consume whose first message never comes.
        let never = futures::stream::pending::<pb::ConsumeRequest>();
        let r = tokio::time::timeout(Duration::from_secs(2), client.consume(never)).await;
        let Ok(Err(s)) = r else {
            panic!(
                "node {node} held a keyless call: {:?}",
                r.map(|r| r.map(|_| ()))
            );
        };
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    }
    c.shutdown().await;
}

/// A member that cannot read a data group's copy of a namespace (a build before it: feature
/// level 1) keeps the copy from being proposed; a namespace change is then answered with an
/// unknown outcome that says why, not acknowledged (review of 4d, MED 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_change_a_member_cannot_copy_is_not_acknowledged_and_says_why() {
    let c = TestCluster::start_with(3, |n| {
        n.groups = 1;
        if n.id == 3 {
            n.level = 1;
        }
    })
    .await;
    let ns = namespace_in(1, 1);
    let mut admin = c.namespaces(c.leader().await).await;
    let put = pb::PutNamespaceRequest {
        name: ns.clone(),
        policy: Some(pb::NamespacePolicy::default()),
    };
    let s = admin.put_namespace(put).await.unwrap_err();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert!(s.message().contains("feature level 2"), "{s:?}");
    tried("a namespace change a member cannot copy", &status_text(&s));
    for node in c.running() {
        assert!(
            !c.node(node).groups[0]
                .store
                .namespace(&ns)
                .unwrap()
                .configured
        );
    }
    c.shutdown().await;
}
