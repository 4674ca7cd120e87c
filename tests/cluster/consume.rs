//! Consume on real clusters: acks on the delivery stream, through a follower, across a leader
//! kill; and bad stream messages refused with a clear status.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::HashSet;
use std::time::Duration;

use timerdb::api::pb;
use tonic::Code;

use crate::consumer::Consumer;
use crate::delivery::{ids, put_policy, schedule_many, wait_count};
use crate::harness::*;

const NS: &str = "consume";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_acks_through_a_follower_ack_every_timer_across_a_leader_kill() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let follower = c.follower().await;
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 2_000,
        max_attempts: 20,
        backoff_min_ms: 100,
        backoff_jitter_percent: Some(0),
        ..Default::default()
    };
    put_policy(&c, follower, NS, policy).await;

    // Phase 1: one consumer on a follower acks on its stream; 2,000 timers fall due over 3 s.
    let n = 2_000;
    let consumer = Consumer::start_consume(&c, follower, NS, 100).await;
    schedule_many(&c, follower, NS, &ids("s", n), now_ms() + 300, 1).await;

    // Phase 2: the leader is killed while deliveries and acks flow.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let before = consumer.seen().len();
    c.stop(leader).await;
    assert!(
        before > 0 && before < n,
        "the kill was not during delivery: {before} delivered"
    );

    // Phase 3: every timer ends ACKED, each delivered at least once, none early, each firing
    // with one fire index whatever stream or attempt it came on.
    let acked = wait_count(
        &c,
        follower,
        NS,
        pb::TimerState::Acked,
        n,
        Duration::from_secs(60),
    )
    .await;
    let seen = consumer.seen();
    let delivered: HashSet<&str> = seen.iter().map(|s| s.id.as_str()).collect();
    for t in &acked {
        assert!(
            delivered.contains(t.id.as_str()),
            "{} ACKED, never delivered",
            t.id
        );
        assert!(t.attempts >= 1);
        for s in seen.iter().filter(|s| s.id == t.id) {
            assert_eq!(s.fire_index, t.fire_index, "{} fired twice", t.id);
            assert!(s.received_ms >= t.fire_at_ms, "{} delivered early", t.id);
        }
    }
    let again = seen.len() - delivered.len();
    eprintln!("stream acks across a leader kill: {before} delivered before the kill, {again} deliveries again after it");

    // Phase 4: the old leader rejoins; every replica holds the same state.
    c.restart(leader).await;
    c.converged().await;
    consumer.stop();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_consume_messages_are_refused_with_a_clear_status() {
    let c = TestCluster::start(1).await;
    let mut client = c.client(1).await;
    let open = |msgs: Vec<pb::ConsumeRequest>| {
        let mut client = client.clone();
        async move { client.consume(tokio_stream::iter(msgs)).await }
    };
    let sub = || pb::SubscribeRequest {
        namespace: NS.into(),
        consumer: "bad".into(),
        max_in_flight: 0,
    };
    let acks = |id: &str, attempt| pb::ConsumeRequest {
        subscribe: None,
        acks: vec![pb::DeliveryAck {
            id: id.into(),
            attempt,
            nack: false,
        }],
    };

    // No subscribe in the first message (or no message at all): refused before streaming.
    let err = open(vec![acks("a", 1)]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("first Consume message"), "{err}");
    let err = open(Vec::new()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // A bad ack later ends the stream with INVALID_ARGUMENT naming it; so does a second
    // subscribe.
    for (bad, words) in [
        (acks("a", 0), "attempt must be at least 1"),
        (acks("", 1), "id"),
        (
            pb::ConsumeRequest {
                subscribe: Some(sub()),
                acks: Vec::new(),
            },
            "only the first",
        ),
    ] {
        let first = pb::ConsumeRequest {
            subscribe: Some(sub()),
            acks: Vec::new(),
        };
        let mut stream = open(vec![first, bad]).await.unwrap().into_inner();
        let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("the stream was not ended");
        let status = end.expect_err("a bad message must end the stream");
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(status.message().contains(words), "{status}");
    }
    // An ack of a delivery that does not exist is harmless: the stream goes on.
    let first = pb::ConsumeRequest {
        subscribe: Some(sub()),
        acks: vec![pb::DeliveryAck {
            id: "never-delivered".into(),
            attempt: 3,
            nack: false,
        }],
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(first).unwrap();
    let mut stream = client
        .consume(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    schedule_many(&c, 1, NS, &ids("ok", 1), now_ms(), 1).await;
    let d = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("no delivery")
        .unwrap()
        .unwrap();
    assert_eq!(d.timer.unwrap().id, "ok0000");
    c.shutdown().await;
}

/// A consumer that ends its side of the stream, and reads on until the server ends it, finds
/// every ack it sent applied: through a follower (which passes the half-close on) and on the
/// leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ending_the_stream_applies_every_ack_before_it_ends() {
    let c = TestCluster::start(3).await;
    let (leader, follower) = (c.leader().await, c.follower().await);
    for (round, via) in [follower, leader].into_iter().enumerate() {
        let ns = format!("drain-{round}");
        let n = 300;
        let mut client = c.client(via).await;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(pb::ConsumeRequest {
            subscribe: Some(pb::SubscribeRequest {
                namespace: ns.clone(),
                consumer: "drain".into(),
                max_in_flight: 50,
            }),
            acks: Vec::new(),
        })
        .unwrap();
        let outbound = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut stream = client.consume(outbound).await.unwrap().into_inner();
        schedule_many(&c, via, &ns, &ids("d", n), now_ms(), 0).await;
        let mut got = HashSet::new();
        while got.len() < n {
            let d = tokio::time::timeout(Duration::from_secs(20), stream.message())
                .await
                .expect("deliveries stopped")
                .unwrap()
                .unwrap();
            let t = d.timer.unwrap();
            got.insert(t.id.clone());
            let ack = pb::DeliveryAck {
                id: t.id,
                attempt: d.attempt,
                nack: false,
            };
            tx.send(pb::ConsumeRequest {
                subscribe: None,
                acks: vec![ack],
            })
            .unwrap();
        }
        drop(tx); // the consumer is done
        let end = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the server did not end the stream");
        assert!(matches!(end, Ok(None)), "ended with {end:?}, not OK");
        // No waiting: every ack took effect before the stream ended.
        let acked = list_in(&mut client, &ns, pb::TimerState::Acked).await;
        assert_eq!(
            acked.len(),
            n,
            "via node {via}: acks missing after a clean end"
        );
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatch_rate_limit_holds_for_streams_across_a_leader_kill() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let followers: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
    put_policy(
        &c,
        followers[0],
        "rated",
        pb::NamespacePolicy {
            ack_timeout_ms: 5_000,
            max_dispatches_per_second: Some(200),
            max_burst: 50,
            ..Default::default()
        },
    )
    .await;
    // Two Consume streams through the followers share the namespace's 200/s, burst 50.
    let a = Consumer::start_consume(&c, followers[0], "rated", 1_000).await;
    let b = Consumer::start_consume(&c, followers[1], "rated", 1_000).await;
    let n = 4_000;
    schedule_many(&c, followers[0], "rated", &ids("r", n), now_ms() + 300, 0).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    c.stop(leader).await;
    let new_leader = c.leader().await;
    let via = *followers
        .iter()
        .find(|f| **f != new_leader)
        .unwrap_or(&new_leader);
    wait_count(
        &c,
        new_leader,
        "rated",
        pb::TimerState::Acked,
        n,
        Duration::from_secs(90),
    )
    .await;
    let mut seen = a.seen();
    seen.extend(b.seen());
    let ids: HashSet<&str> = seen.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), n, "every timer received");
    let worst = crate::push::worst_window(seen.iter().map(|s| s.received_ms).collect());
    eprintln!(
        "streams at 200/s burst 50: {} deliveries, worst 1 s window {worst} (via {via})",
        seen.len()
    );
    assert!(
        worst <= 250,
        "{worst} deliveries in one second (limit 200/s + burst 50)"
    );
}

/// Findings 5 and 12 of issue 33: a Consume stream could hand the leader any number of acks,
/// of any ids: each became part of a log entry every replica applies, through unbounded queues
/// (1.5 GiB of RSS in 15 s on a release build). Now at most `max_batch` acks ride in one
/// message, acks of deliveries the stream never handed its client are dropped where the
/// client is, and a relayed stream (one that says it is forwarded) passes a small budget of
/// them: an idle cluster's log does not grow under the flood, through a follower or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_made_up_acks_makes_no_log_entries() {
    let c = TestCluster::start(3).await;
    let (leader, follower) = (c.leader().await, c.follower().await);
    let last_index = |c: &TestCluster| {
        c.node(leader)
            .raft
            .metrics()
            .borrow_watched()
            .last_log_index
    };
    let made_up = |round: usize, n: usize| pb::ConsumeRequest {
        subscribe: None,
        acks: (0..n)
            .map(|i| pb::DeliveryAck {
                id: format!("made-up-{round}-{i}"),
                attempt: 1 + (i % 3) as u32,
                nack: i % 2 == 0,
            })
            .collect(),
    };
    for (via, forwarded) in [(leader, false), (follower, false), (leader, true)] {
        let before = last_index(&c).unwrap_or(0);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let first = pb::ConsumeRequest {
            subscribe: Some(pb::SubscribeRequest {
                namespace: NS.into(),
                consumer: "flood".into(),
                max_in_flight: 10,
            }),
            acks: Vec::new(),
        };
        tx.send(first).await.unwrap();
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        if forwarded {
            req.metadata_mut()
                .insert("x-timerdb-forwarded", "1".parse().unwrap());
        }
        let mut stream = c.client(via).await.consume(req).await.unwrap().into_inner();
        // 100,000 made-up acks and nacks, 2,000 a message.
        for round in 0..50 {
            tx.send(made_up(round, 2_000)).await.unwrap();
        }
        // More than max_batch in one message ends the stream, naming the limit.
        tx.send(made_up(99, 10_001)).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the stream was not ended");
        let status = end.expect_err("a message of too many acks must end the stream");
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(
            status.message().contains("acks in one Consume message"),
            "{status}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let grew = last_index(&c).unwrap_or(0) - before;
        let most = if forwarded { 3 } else { 0 };
        assert!(
            grew <= most,
            "via node {via} (forwarded: {forwarded}): 100,000 made-up acks made {grew} log entries"
        );
    }
    c.converged().await;
    c.shutdown().await;
}
