//! Resting groups (docs/sharding.md §7, `cluster/rest.rs`): an idle data group stops its
//! heartbeats and its followers their election timers while its leader's node pings them; a
//! write wakes it, and a leader that dies while its group rests is replaced.

use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver as _;
use openraft::Instant as _;
use timerdb::command::Options;
use timerdb::server::RunningNode;
use timerdb::timer::{TimerKey, TimerSpec, TimerState, When};

use crate::harness::*;

const GROUPS: u16 = 2;

fn raft(node: &RunningNode, g: u16) -> &timerdb::cluster::Raft {
    &node.groups[usize::from(g) - 1].raft
}

/// The node leading data group `g`, once one does (`groups::group_leader`), and its term.
async fn leader_of(c: &TestCluster, g: u16) -> (u64, u64) {
    let leader = crate::groups::group_leader(c, g).await;
    let term = raft(c.node(leader), g)
        .metrics()
        .borrow_watched()
        .current_term;
    (leader, term)
}

/// Waits until data group `g` rests: its leader's ticker parked, every other node holding it.
async fn rests(c: &TestCluster, g: u16) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (leader, term) = leader_of(c, g).await;
        let others = c.running().into_iter().filter(|id| *id != leader);
        if c.node(leader).rest.resting(g) && others.into_iter().all(|id| c.node(id).rest.held(g)) {
            return (leader, term);
        }
        assert!(Instant::now() < deadline, "group {g} does not rest");
        tokio::time::sleep(Duration::from_millis(20)).await;
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

/// Waits until `id` fired in group `g` on node `on`; the timer.
async fn fired(c: &TestCluster, on: u64, g: u16, id: &str) -> timerdb::timer::Timer {
    let store = &c.node(on).groups[usize::from(g) - 1].store;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = store.get(&TimerKey::new(NS, id)).unwrap();
        if let Some(t) = t.filter(|t| t.state == TimerState::Fired) {
            return t;
        }
        assert!(Instant::now() < deadline, "{id} did not fire in group {g}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_group_rests_wakes_for_a_write_and_elects_when_its_leader_dies() {
    let mut c = TestCluster::start_with(3, |n| {
        n.groups = GROUPS;
        n.rest_after = Duration::from_millis(300);
        // Leaders stay where they were elected: the test follows one group's leader and term.
        n.balance_every = Duration::ZERO;
    })
    .await;

    // Every data group rests, and stays resting without an election: its leader hears from
    // no quorum for a second (it sends no heartbeats), and the term does not move.
    let mut resting = Vec::new();
    for g in 1..=GROUPS {
        resting.push(rests(&c, g).await);
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for (g, (leader, term)) in (1..=GROUPS).zip(&resting) {
        let m = raft(c.node(*leader), g).metrics();
        let m = m.borrow_watched();
        assert_eq!(
            (m.state, m.current_term),
            (openraft::ServerState::Leader, *term),
            "group {g} changed leader or term while it rested"
        );
        // (`millis_since_quorum_ack` is as of the last report: the instant says more.)
        let silent = (m.last_quorum_acked.as_ref()).map_or(Duration::MAX, |t| t.elapsed());
        assert!(
            silent >= Duration::from_secs(1),
            "group {g}'s leader heard a quorum {silent:?} ago: it heartbeats"
        );
        assert!(c.node(*leader).rest.resting(g), "group {g} woke by itself");
    }
    // Group 0 never rests.
    let zero = c.leader().await;
    let m = c.node(zero).raft.metrics();
    let acked = (m.borrow_watched().last_quorum_acked.as_ref()).map(|t| t.elapsed());
    assert!(
        acked.is_some_and(|t| t < Duration::from_millis(500)),
        "{acked:?}"
    );

    // A write to a resting group goes through at once, and its timer fires on time.
    let (leader, _) = resting[0];
    let due = now_ms() + 1_000;
    let started = Instant::now();
    let node = &c.node(leader).groups[0].node;
    node.schedule(spec("woken", due), Options::default())
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "a write to a resting group took {took:?}"
    );
    let t = fired(&c, leader, 1, "woken").await;
    assert!(t.fired_at_ms >= due, "fired early: {t:?}");
    assert!(
        t.fired_at_ms < due + 1_000,
        "fired {} ms late",
        t.fired_at_ms - due
    );
    // It rests again once idle.
    rests(&c, 1).await;

    // Its leader's node dies while the group rests: the others let go and elect.
    let (dead, term) = rests(&c, 2).await;
    let stopped = Instant::now();
    c.stop(dead).await;
    let (next, new_term) = leader_of(&c, 2).await;
    let failover = stopped.elapsed();
    assert!(
        next != dead && new_term > term,
        "group 2: {next} in term {new_term}"
    );
    assert!(
        failover < Duration::from_secs(3),
        "group 2 elected after {failover:?}"
    );
    // The new leader takes writes and fires.
    let due = now_ms() + 500;
    let node = &c.node(next).groups[1].node;
    node.schedule(spec("after-death", due), Options::default())
        .await
        .unwrap();
    let t = fired(&c, next, 2, "after-death").await;
    assert!(t.fired_at_ms >= due, "fired early: {t:?}");
    // The dead node comes back, and the group rests again with it among its members, under
    // the same leader in the same term: the returning member deposes nobody.
    c.restart(dead).await;
    assert_eq!(rests(&c, 2).await, (next, new_term));
    c.shutdown().await;
}

/// Review of leader balancing (H2): openraft's transfer stops a leader's heartbeats and writes
/// for the rest of its leadership. If the successor never takes over (its TransferLeader
/// lost), a resting group's members, held, would never elect: the group would take no write
/// again. A leadership a hand-over began in is not named in pings, so the holds lapse and an
/// election follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resting_group_whose_hand_over_is_lost_elects_a_leader() {
    let c = TestCluster::start_with(3, |n| {
        n.groups = GROUPS;
        n.rest_after = Duration::from_millis(300);
        n.balance_every = Duration::ZERO;
        // Every TransferLeader is lost: no transfer completes.
        n.faults.drop_transfer_leader = true;
    })
    .await;
    let (leader, term) = rests(&c, 1).await;
    let to = c.running().into_iter().find(|id| *id != leader).unwrap();
    let door = &c.node(leader).groups[0].node;
    // The target never takes over. The hand-over answers the leader the members then elect
    // (it waits three election timeouts for one), or that none came.
    let handed = door.transfer_leader(Some(to)).await;
    tracing::info!(?handed, "the hand-over to node {to}");

    // A leader of a later term is elected, and takes a write.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (now_leader, now_term) = leader_of(&c, 1).await;
        if now_term > term {
            let node = &c.node(now_leader).groups[0].node;
            let written = node.schedule(spec("after", now_ms() + 60_000), Options::default());
            if written.await.is_ok() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "group 1 is stuck in term {now_term} under node {now_leader} (was {term})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
