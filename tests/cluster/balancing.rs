//! Leader balancing (docs/sharding.md §2, `node/balance.rs`): group 0's leader spreads the
//! data groups' leaders over the nodes, and moves a group only to a node that can serve it:
//! one that catches up with group 0 (a node group 0's leader hears but that cannot call it is
//! given nothing), one that is not stopping (a SIGTERM's hand-off is not undone), and one that
//! has the group's log (a lagging target is refused before any write waits for it).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use timerdb::api::pb;
use timerdb::node::Leader;

use crate::groups::group_leader;
use crate::harness::*;
use crate::routing::{namespace_in, proxied};

const GROUPS: u16 = 3;

/// How many groups each running node leads (group 0 included).
async fn leading(c: &TestCluster) -> BTreeMap<u64, usize> {
    let mut counts: BTreeMap<u64, usize> = c.running().into_iter().map(|id| (id, 0)).collect();
    for g in 0..=GROUPS {
        *counts.entry(group_leader(c, g).await).or_default() += 1;
    }
    counts
}

fn balanced(counts: &BTreeMap<u64, usize>) -> bool {
    let (min, max) = (counts.values().min(), counts.values().max());
    max.unwrap() - min.unwrap() <= 1
}

/// Waits (30 s at most) until every node leads its share.
async fn until_balanced(c: &TestCluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !balanced(&leading(c).await) {
        assert!(Instant::now() < deadline, "{:?}", leading(c).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The data groups node `id` leads, by its own replicas.
fn data_groups_led_by(c: &TestCluster, id: u64) -> Vec<u16> {
    (c.node(id).groups.iter())
        .filter(|g| g.node.leader() == Leader::Me)
        .map(|g| g.node.group())
        .collect()
}

/// Watches node `id` for `how_long`: it never leads a data group.
async fn leads_no_data_group_for(c: &TestCluster, id: u64, how_long: Duration, why: &str) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        let led = data_groups_led_by(c, id);
        assert!(led.is_empty(), "node {id} ({why}) was given groups {led:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_0s_leader_spreads_the_groups_leaders_over_the_nodes() {
    let mut c = TestCluster::start_with(3, |n| {
        n.groups = GROUPS;
        n.balance_every = timerdb::config::BALANCE_EVERY;
    })
    .await;
    until_balanced(&c).await;
    // The node leading the most goes down (its groups go to the others) and comes back
    // leading nothing: balancing gives it its share again.
    let counts = leading(&c).await;
    let busiest = *counts.iter().max_by_key(|(_, n)| **n).unwrap().0;
    c.stop(busiest).await;
    for g in 0..=GROUPS {
        group_leader(&c, g).await;
    }
    c.restart(busiest).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counts = leading(&c).await;
        if balanced(&counts) && counts[&busiest] >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {busiest} came back: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.shutdown().await;
}

/// Review H1: group 0's leader hears a node whose calls to it are cut (its heartbeats are
/// answered on its own connection). That node cannot judge a data group's calls, so its
/// groups leave it (`hand_over_when_cut_off`); balancing, seeing it lead nothing, must not
/// give them back: the target shows it catches up with group 0 before it takes a group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_cannot_call_group_0s_leader_is_given_no_group() {
    use timerdb_harness::proxy::Mode;
    let (c, links) = proxied(|n| {
        n.groups = GROUPS;
        n.balance_every = timerdb::config::BALANCE_EVERY;
    })
    .await;
    until_balanced(&c).await;
    let meta = group_leader(&c, 0).await;
    let cut = (c.running().into_iter())
        .filter(|id| *id != meta)
        .max_by_key(|id| data_groups_led_by(&c, *id).len())
        .unwrap();
    links.lock().unwrap()[&(cut, meta)].set(Mode::Blackhole);
    let at = Instant::now();
    // Its groups leave it: it cannot catch up with group 0 (3 s), having led them 6 s.
    let deadline = at + Duration::from_secs(30);
    while !data_groups_led_by(&c, cut).is_empty() {
        assert!(
            Instant::now() < deadline,
            "node {cut} kept {:?}",
            data_groups_led_by(&c, cut)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("node {cut} led nothing {:?} after the cut", at.elapsed());
    // Every data group to the third node, which the cut-off node can call: a move from there
    // would go through if the cut-off node took it (from group 0's leader it could not).
    let third = (c.running().into_iter())
        .find(|id| ![cut, meta].contains(id))
        .unwrap();
    for g in 1..=GROUPS {
        let leader = group_leader(&c, g).await;
        if leader != third {
            let node = &c.node(leader).groups[usize::from(g) - 1].node;
            node.transfer_leader(Some(third)).await.unwrap();
        }
    }
    // Balancing (every 2 s) sees it leading nothing, and the third node leading 3 groups.
    leads_no_data_group_for(&c, cut, Duration::from_secs(12), "cut off from group 0").await;
    // Every group still takes calls, through a node that is not cut off.
    let through = c.running().into_iter().find(|id| *id != cut).unwrap();
    let mut client = c.client(through).await;
    for g in 1..=GROUPS {
        let ns = namespace_in(GROUPS, g);
        let req = pb::ScheduleRequest {
            namespace: ns,
            ..schedule_req(&format!("after-cut-{g}"), now_ms() + 3_600_000)
        };
        // A move under way (balancing between the two others) refuses briefly: retried.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(s) = client.schedule(req.clone()).await {
            assert!(Instant::now() < deadline, "group {g}: {}", status_text(&s));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    links.lock().unwrap()[&(cut, meta)].set(Mode::Pass);
    c.converged().await;
    c.shutdown().await;
}

/// Review M1: a node stopping (SIGTERM) hands every group it leads away and is given none
/// back before it exits, though group 0's leader still hears it and sees it lead nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_node_hands_its_groups_off_and_is_given_none_back() {
    let c = TestCluster::start_with(3, |n| {
        n.groups = GROUPS;
        n.balance_every = timerdb::config::BALANCE_EVERY;
    })
    .await;
    until_balanced(&c).await;
    let meta = group_leader(&c, 0).await;
    let stopping = (c.running().into_iter())
        .filter(|id| *id != meta)
        .max_by_key(|id| data_groups_led_by(&c, *id).len())
        .unwrap();
    assert!(!data_groups_led_by(&c, stopping).is_empty());
    c.node(stopping).hand_off().await;
    assert_eq!(data_groups_led_by(&c, stopping), Vec::<u16>::new());
    leads_no_data_group_for(&c, stopping, Duration::from_secs(8), "stopping").await;
    c.shutdown().await;
}

/// Review M2: an operator's transfer to a target that lags far (a disk taking 5 s a write) is
/// refused within about 3 s, and the group's writes go on meanwhile: the leader waits for the
/// target before it closes its writes, not after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_over_to_a_lagging_target_is_refused_while_writes_go_on() {
    lagging_target(5_000, Duration::from_secs(1), |c, leader, slow| {
        Box::pin(async move {
            let req = pb::TransferLeaderRequest {
                node_id: slow,
                group: 1,
            };
            let refused = c
                .cluster(leader)
                .await
                .transfer_leader(req)
                .await
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
            refused.message().to_string()
        })
    })
    .await;
}

/// The review of the fixes, MED 2: a target whose lag is steady (a disk a second slow)
/// catches up with the log as it was when asked, but would then hold the writes closed about
/// a second; a balancing move checks again just before closing them, and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_balancing_move_to_a_target_that_keeps_up_slowly_is_refused_while_writes_go_on() {
    lagging_target(1_000, Duration::from_millis(800), |c, leader, slow| {
        Box::pin(async move {
            let node = &c.node(leader).groups[0].node;
            node.balance_to(slow).await.unwrap_err().to_string()
        })
    })
    .await;
}

/// Slows one follower's disk by `fsync_ms` (neither group 0's nor group 1's leader), writes to
/// group 1 one after another, and tries `hand_over` to it meanwhile: refused (its message
/// says so), in under 5 s, leadership stays, and no write took `slowest` or more.
async fn lagging_target(
    fsync_ms: u64,
    slowest: Duration,
    hand_over: impl for<'a> FnOnce(
        &'a TestCluster,
        u64,
        u64,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + 'a>>,
) {
    let c = TestCluster::start_with(3, |n| n.groups = 1).await;
    let leader = group_leader(&c, 1).await;
    let meta = group_leader(&c, 0).await;
    let slow = (c.running().into_iter())
        .filter(|id| *id != leader)
        .max_by_key(|id| *id != meta)
        .unwrap();
    let ns = namespace_in(1, 1);
    c.node(slow)
        .fsync_delay_ms
        .store(fsync_ms, Ordering::Relaxed);
    // Writes flow to the group's leader, one after another; the slowest is noted.
    let writer = {
        let mut client = c.client(leader).await;
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let until = Instant::now() + Duration::from_secs(7);
            for i in 0.. {
                if Instant::now() >= until {
                    break;
                }
                let req = pb::ScheduleRequest {
                    namespace: ns.clone(),
                    ..schedule_req(&format!("w-{i}"), now_ms() + 3_600_000)
                };
                let began = Instant::now();
                client.schedule(req).await.unwrap();
                slowest = slowest.max(began.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            slowest
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let began = Instant::now();
    let refused = hand_over(&c, leader, slow).await;
    let took = began.elapsed();
    assert!(
        refused.contains("not caught up") && refused.contains("went on"),
        "{refused}"
    );
    assert!(took < Duration::from_secs(5), "refused after {took:?}");
    let waited = writer.await.unwrap();
    assert!(
        waited < slowest,
        "a write waited {waited:?} while the hand-over was tried"
    );
    assert_eq!(group_leader(&c, 1).await, leader, "leadership stayed");
    c.node(slow).fsync_delay_ms.store(0, Ordering::Relaxed);
    c.shutdown().await;
}
