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
    // Purged a second after it finished (below the floor that keeps rows for retries).
    let mut c = TestCluster::start_with(3, |n| n.purge_floor = Duration::ZERO).await;
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
        wait_for_commit: true,
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
        let t = c.node(id).store.get(&key).unwrap().expect("the new timer");
        assert_eq!(
            t.state,
            timerdb::timer::TimerState::Pending,
            "node {id} holds the old timer"
        );
    }
    c.shutdown().await;
}

/// Review of issue 33: PutNamespace built its entry from the proposing node's applied state
/// (the paused flag, the push secrets kept when none are given), so a Pause or a secret
/// rotation that committed between building the entry and committing it was undone by it.
/// The entry is built here, then a Pause and a rotation commit, then the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_and_a_rotation_committed_meanwhile_survive_a_put_namespace() {
    use timerdb::namespace::{Policy, PushTarget};
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let node = c.node(leader).node.clone();
    let ns = "configured-meanwhile";
    let target = |url: &str, secrets: Vec<String>| PushTarget {
        url: url.into(),
        secrets,
        timeout_ms: 1_000,
        dead_on_client_error: false,
    };
    let first = target("http://127.0.0.1:9/first", vec![]);
    let put = node.put_namespace(ns.into(), Policy::default(), Some(first));
    let generated = put.await.unwrap().push.unwrap().secrets;
    assert_eq!(generated.len(), 1, "a target without secrets gets one");

    let moved = target("http://127.0.0.1:9/moved", vec![]);
    let entry = node
        .namespace_entry(ns.into(), Policy::default(), Some(moved))
        .unwrap();
    node.pause_namespace(ns.into(), true).await.unwrap();
    let rotated = vec![
        timerdb::namespace::sign::Secret::generate(),
        generated[0].clone(),
    ];
    let rotation = target("http://127.0.0.1:9/first", rotated.clone());
    node.put_namespace(ns.into(), Policy::default(), Some(rotation))
        .await
        .unwrap();
    node.write(entry).await.unwrap();

    let got = node.namespace(ns).await.unwrap();
    assert!(got.policy.paused, "the Pause committed before was undone");
    let push = got.push.unwrap();
    assert_eq!(push.url, "http://127.0.0.1:9/moved");
    assert_eq!(
        push.secrets, rotated,
        "the rotation committed before was undone"
    );
    c.converged().await;
    c.shutdown().await;
}
