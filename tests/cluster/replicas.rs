//! Replicas of a real cluster stay identical through a restart that rebuilds a follower's
//! node-local caches (DESIGN invariant 8), end to end: issue 33 finding 9 reproduced findings
//! 1's divergence on a live cluster and followed it to a lost acknowledged schedule.

use std::time::Duration;

use timerdb::api::pb;

use crate::delivery::put_policy;
use crate::harness::*;

/// A late unary Ack of a READY retry leaves an ACKED row right after the delivery cursor; a
/// Reschedule to later leaves the namespace's cached head early on the long-running nodes; a
/// follower restarts (its heads exact); the leader's driver wakes at the early head and fires.
/// On cde6148 that Fire wrote a pass lease on two nodes and not on the restarted one: digests
/// differed, the purge then removed the row on two nodes only, and a reused id was created on
/// two nodes but found as the old ACKED timer on the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_follower_fires_purges_and_reuses_ids_like_the_others() {
    let mut c = TestCluster::start(3).await;
    let (leader, follower) = (c.leader().await, c.follower().await);
    let ns = "replicas";
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 500,
        max_attempts: 10,
        backoff_min_ms: 100,
        backoff_jitter_percent: Some(0),
        retention_ms: 1_000,
        ..Default::default()
    };
    put_policy(&c, leader, ns, policy).await;
    let mut client = c.client(leader).await;
    let req = |id: &str, t: i64| pb::ScheduleRequest {
        namespace: ns.into(),
        id: id.into(),
        when: at(t),
        ..Default::default()
    };
    client.schedule(req("a", now_ms())).await.unwrap();
    // Delivered once, never acked on the stream: its deadline passes, it backs off, and is
    // READY again once the cursor passes its retry (nobody subscribes then).
    let sub = pb::SubscribeRequest {
        namespace: ns.into(),
        consumer: "once".into(),
        max_in_flight: 1,
    };
    let mut stream = client.subscribe(sub).await.unwrap().into_inner();
    let d = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a delivery")
        .unwrap()
        .unwrap();
    assert_eq!(d.attempt, 1);
    drop(stream);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // The late ack of attempt 1: ACKED in place, after the delivery cursor.
    let ack = pb::AckRequest {
        namespace: ns.into(),
        id: "a".into(),
        attempt: 1,
    };
    client.ack(ack).await.unwrap();
    // An early head: b due soon, moved an hour on.
    client.schedule(req("b", now_ms() + 1_500)).await.unwrap();
    let later = pb::RescheduleRequest {
        namespace: ns.into(),
        id: "b".into(),
        when: Some(pb::reschedule_request::When::FireAtMs(now_ms() + 3_600_000)),
        ..Default::default()
    };
    client.reschedule(later).await.unwrap();
    // The follower restarts: its caches are rebuilt from its database.
    c.stop(follower).await;
    c.restart(follower).await;
    // The leader's driver wakes at b's old time; then the purger passes the finished rows.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    c.converged().await;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    c.converged().await;
    // The id is reused: a new timer on every node.
    let r = client
        .schedule(req("a", now_ms() + 3_600_000))
        .await
        .unwrap();
    assert!(r.into_inner().created);
    c.converged().await;
    for id in c.running() {
        let key = timerdb::timer::TimerKey::new(ns, "a");
        let t = c
            .node(id)
            .node
            .store
            .get(&key)
            .unwrap()
            .expect("the new timer");
        assert_eq!(
            t.state,
            timerdb::timer::TimerState::Pending,
            "node {id} holds the old timer"
        );
    }
    c.shutdown().await;
}
