//! A unary Ack answered once queued (`AckRequest.wait_applied` unset): what it answers, that
//! it applies, and that every ack it cannot vouch for still gets the applied answer.

use std::time::{Duration, Instant};

use timerdb::api::pb;
use tonic::Code;

use crate::consumer::Consumer;
use crate::delivery::schedule_many;
use crate::harness::*;

fn ack(id: &str, attempt: u32, wait_applied: bool) -> pb::AckRequest {
    pb::AckRequest {
        namespace: NS.into(),
        id: id.into(),
        attempt,
        wait_applied,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ack_answered_once_queued_applies_and_any_other_ack_is_answered_as_applied() {
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let mut client = c.client(follower).await;
    let names = ["a".to_string(), "b".into()];
    schedule_many(&c, follower, NS, &names, now_ms(), 0).await;
    let lazy = Consumer::start(&c, follower, NS, 10, false).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while lazy.seen().len() < names.len() {
        assert!(
            Instant::now() < deadline,
            "not delivered: {:?}",
            lazy.seen()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The latest delivery of a FIRED timer: answered ACKED at once, applied soon after.
    let before = now_ms();
    let answered = client.ack(ack("a", 1, false)).await.unwrap().into_inner();
    let answered = answered.timer.unwrap();
    assert_eq!(answered.state, pb::TimerState::Acked as i32, "{answered:?}");
    assert!(answered.finished_at_ms >= before - 1_000, "{answered:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let applied = loop {
        let t = get(&mut client, "a").await.unwrap();
        if t.state == pb::TimerState::Acked as i32 {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the queued ack never applied: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // A retry of it finds the timer ACKED: answered as applied, with the applied finished_at.
    let again = client.ack(ack("a", 1, false)).await.unwrap().into_inner();
    assert_eq!(again.timer.unwrap().finished_at_ms, applied.finished_at_ms);

    // Acks the leader cannot vouch for get the state machine's own answer.
    let stale = client.ack(ack("b", 2, false)).await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    let missing = client.ack(ack("nope", 1, false)).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    let b = get(&mut client, "b").await.unwrap();
    assert_eq!((b.state, b.attempts), (pb::TimerState::Fired as i32, 1));

    // Waiting for the apply: a Get right after the answer sees what it said.
    let waited = client.ack(ack("b", 1, true)).await.unwrap().into_inner();
    let waited = waited.timer.unwrap();
    let b = get(&mut client, "b").await.unwrap();
    assert_eq!(b.state, pb::TimerState::Acked as i32, "{b:?}");
    assert_eq!(b.finished_at_ms, waited.finished_at_ms);
    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}
