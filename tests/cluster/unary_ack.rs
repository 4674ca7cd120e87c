//! The unary Ack on a real cluster: answered once queued on the leader by default (then it
//! applies a moment later), once applied with `wait_for_commit`; every refusal is the log's.

use std::time::{Duration, Instant};

use timerdb::api::pb;
use tonic::Code;

use crate::delivery::{delivered_unacked, put_policy, schedule_many};
use crate::harness::*;

fn ack(id: &str, attempt: u32, wait_for_commit: bool) -> pb::AckRequest {
    pb::AckRequest {
        namespace: NS.into(),
        id: id.into(),
        attempt,
        wait_for_commit,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unary_ack_is_answered_once_queued_and_applies_a_moment_later() {
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let mut client = c.client(follower).await;
    let names = ["a".to_string(), "b".into(), "c".into()];
    let lazy = delivered_unacked(&c, follower, &names).await;

    // Phase 1: the default answer comes once the leader queued it: the timer as it was.
    let r = client.ack(ack("a", 1, false)).await.unwrap().into_inner();
    let held = r.timer.unwrap();
    assert!(!r.committed, "answered as queued");
    assert_eq!(
        (held.state, held.attempts),
        (pb::TimerState::Fired as i32, 1)
    );
    let a = wait_state(
        &mut client,
        "a",
        pb::TimerState::Acked,
        Duration::from_secs(5),
    )
    .await;
    assert!(a.finished_at_ms > 0, "{a:?}");

    // Phase 2: a retry finds it ACKED: that answer is the log's (waited for), the same one.
    let r = client.ack(ack("a", 1, false)).await.unwrap().into_inner();
    let again = r.timer.unwrap();
    assert!(
        r.committed,
        "an ack of an ACKED timer is answered by the log"
    );
    assert_eq!(
        (again.state, again.finished_at_ms),
        (pb::TimerState::Acked as i32, a.finished_at_ms)
    );

    // Phase 3: what the leader cannot plainly allow waits for the log and is refused by it.
    let e = client.ack(ack("b", 2, false)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("attempt 2"), "{}", e.message());
    let e = client.ack(ack("nope", 1, false)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let b = get(&mut client, "b").await.unwrap();
    assert_eq!((b.state, b.attempts), (pb::TimerState::Fired as i32, 1));

    // Phase 4: `wait_for_commit` answers once applied, with the ACKED timer.
    let r = client.ack(ack("c", 1, true)).await.unwrap().into_inner();
    let t = r.timer.unwrap();
    assert!(r.committed);
    assert_eq!(t.state, pb::TimerState::Acked as i32, "{t:?}");
    assert!(t.finished_at_ms > 0);

    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}

/// A consumer that may hold one delivery and acks each (queued) before it reads the next: the
/// queued ack frees its room at once, so the next comes without waiting for a commit or for an
/// ack timeout, and every timer ends ACKED exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_at_a_time_consumer_with_queued_acks_gets_every_timer() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let names: Vec<String> = (0..40).map(|i| format!("t{i:02}")).collect();
    schedule_many(&c, leader, NS, &names, now_ms(), 1).await;
    let sub = pb::SubscribeRequest {
        namespace: NS.into(),
        consumer: "one-at-a-time".into(),
        max_in_flight: 1,
    };
    let mut stream = client.subscribe(sub).await.unwrap().into_inner();
    let started = Instant::now();
    let mut got = Vec::new();
    while got.len() < names.len() {
        let d = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("the next delivery comes after the ack, not after an ack timeout")
            .unwrap()
            .unwrap();
        let t = d.timer.unwrap();
        let r = client.ack(ack(&t.id, d.attempt, false)).await.unwrap();
        assert!(!r.into_inner().committed);
        got.push((t.id, d.attempt));
    }
    // The namespace's default ack timeout is 30 s: all 40 came well within one.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(got.iter().all(|(_, a)| *a == 1), "redelivered: {got:?}");
    drop(stream);
    for id in &names {
        wait_state(
            &mut client,
            id,
            pb::TimerState::Acked,
            Duration::from_secs(5),
        )
        .await;
    }
    c.converged().await;
    c.shutdown().await;
}

/// While the leader hands over (its hold closed), a default Ack is not queued: a queued ack
/// would meet the transfer and be lost. It waits at the hold like any write and is answered by
/// the log once the gate opens (review of the queued Ack, MED 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unary_ack_during_a_hand_over_waits_for_the_log() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let lazy = delivered_unacked(&c, leader, &["h".to_string()]).await;
    let closed = c.node(leader).hold.close();
    let call = tokio::spawn(async move { client.ack(ack("h", 1, false)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "answered while the hold was closed");
    drop(closed);
    let r = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the Ack still waited after the hold opened")
        .unwrap()
        .unwrap()
        .into_inner();
    assert!(r.committed, "{r:?}");
    assert_eq!(r.timer.unwrap().state, pb::TimerState::Acked as i32);
    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}

/// The last attempt the namespace allows is not queued: lost with a failing leader, its ack
/// would not bring the delivery again but leave the timer DEAD, the consumer told it acked
/// (review of issue 34, HIGH 1). It waits for the log and is answered with the ACKED timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ack_of_the_last_allowed_attempt_waits_for_the_log() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 30_000,
        max_attempts: 1,
        ..Default::default()
    };
    put_policy(&c, leader, NS, policy).await;
    let mut client = c.client(leader).await;
    let lazy = delivered_unacked(&c, leader, &["last".to_string()]).await;
    let r = client
        .ack(ack("last", 1, false))
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.committed,
        "the last attempt's ack was answered as queued: {r:?}"
    );
    assert_eq!(r.timer.unwrap().state, pb::TimerState::Acked as i32);
    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}

/// A planned hand-over is no failure: the acks it answered as queued apply before it goes
/// (review of issue 34, MED 2: they were proposed on a node that no longer led, and lost).
/// Both followers' fsyncs are slowed so that acks wait in the coalescer, the leader answers
/// ten acks as queued and hands over at once; every timer ends ACKED at its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_over_lets_the_acks_it_queued_apply_first() {
    hand_over_after_queued_acks(300).await;
}

/// The same with fsyncs slower than the drain's old bound (0.9 s): it handed over anyway and
/// the acks still in the coalescer's lane were lost (review of the fixes, MED 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_over_waits_for_its_queued_acks_on_a_slow_disk() {
    hand_over_after_queued_acks(1200).await;
}

async fn hand_over_after_queued_acks(follower_fsync_ms: u64) {
    use std::sync::atomic::Ordering;
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let names: Vec<String> = (0..10).map(|i| format!("q{i}")).collect();
    let lazy = delivered_unacked(&c, leader, &names).await;
    for id in c.running().into_iter().filter(|id| *id != leader) {
        let delay = &c.node(id).fsync_delay_ms;
        delay.store(follower_fsync_ms, Ordering::Relaxed);
    }
    for id in &names {
        let r = client.ack(ack(id, 1, false)).await.unwrap().into_inner();
        assert!(!r.committed, "{id}: answered by the log, not queued");
    }
    let new = c.node(leader).node.transfer_leader(None).await.unwrap();
    assert_ne!(new, leader);
    for id in c.running() {
        c.node(id).fsync_delay_ms.store(0, Ordering::Relaxed);
    }
    // Until the new leader has applied an entry of its term it answers reads "send it again"
    // (a slow fsync may still be under way): wait for that, as a client would retry.
    let settled = c
        .node(new)
        .node
        .until_applied_own_term(Duration::from_secs(10));
    assert!(
        settled.await,
        "node {new} never applied an entry of its own term"
    );
    let mut client = c.client(new).await;
    acked_at_first_attempt(&mut client, &names).await;
    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}

/// Once a hand-over has asked openraft to transfer, openraft refuses writes for the rest of
/// that leadership, even if the caller gave up on the hand-over. An ack then must not be
/// answered as queued: it could never apply (review of the fixes, LOW 2: a cancelled transfer
/// turned queuing back on at once). The target has just stopped, with the whole log: the
/// transfer is triggered, nobody takes over, and the caller gives up; then an ack comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_ack_is_answered_as_queued_after_a_transfer_given_up_on() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let names = vec!["g".to_string()];
    let lazy = delivered_unacked(&c, leader, &names).await;
    let target = c.running().into_iter().find(|id| *id != leader).unwrap();
    c.stop(target).await;
    // The transfer gets past its catch-up check only if the target has the whole log.
    let raft = c.node(leader).raft.clone();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !has_whole_log(&raft, target) {
        assert!(
            Instant::now() < deadline,
            "node {target} never had the whole log"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let transfer = c.node(leader).node.transfer_leader(Some(target));
    let given_up = tokio::time::timeout(Duration::from_millis(50), transfer).await;
    assert!(given_up.is_err(), "the transfer ended: {given_up:?}");
    // Answered (queued by whoever leads by then, or applied), it must apply: the timer never
    // comes again. (Queued on this leader, it was proposed to an openraft that refuses it.)
    match client.ack(ack("g", 1, false)).await {
        Ok(r) => {
            let r = r.into_inner();
            let via = c.leader().await;
            let t = wait_state(
                &mut c.client(via).await,
                "g",
                pb::TimerState::Acked,
                Duration::from_secs(10),
            )
            .await;
            assert_eq!(
                t.attempts, 1,
                "acked (committed={}) yet delivered again",
                r.committed
            );
        }
        Err(e) => println!("the ack was refused meanwhile (allowed): {e:?}"),
    }
    c.restart(target).await;
    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}

/// Waits until each of `names` is ACKED, and checks it was never delivered again.
async fn acked_at_first_attempt(
    client: &mut timerdb::api::pb::timers_client::TimersClient<tonic::transport::Channel>,
    names: &[String],
) {
    for id in names {
        let t = wait_state(client, id, pb::TimerState::Acked, Duration::from_secs(10)).await;
        assert_eq!(t.attempts, 1, "{id} was delivered again: {t:?}");
    }
}

/// Whether the leader `raft` saw `node` acknowledge its last entry.
fn has_whole_log(raft: &timerdb::cluster::Raft, node: u64) -> bool {
    use openraft::async_runtime::WatchReceiver as _;
    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    let matched = m
        .replication
        .as_ref()
        .and_then(|r| r.get(&node).cloned().flatten());
    matched.map(|l| l.index) == m.last_log_index
}

/// A stop is no failure either, with no one to hand over to: a single node stopped right
/// after answering acks as queued applies them first (review of the fixes, LOW 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_lets_the_acks_it_queued_apply_first() {
    use std::sync::atomic::Ordering;
    let mut c = TestCluster::start(1).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let names: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let lazy = delivered_unacked(&c, leader, &names).await;
    c.node(leader).fsync_delay_ms.store(300, Ordering::Relaxed);
    for id in &names {
        let r = client.ack(ack(id, 1, false)).await.unwrap().into_inner();
        assert!(!r.committed, "{id}: answered by the log, not queued");
    }
    lazy.stop();
    c.stop(leader).await;
    c.restart(leader).await;
    let mut client = c.client(leader).await;
    acked_at_first_attempt(&mut client, &names).await;
    c.shutdown().await;
}
