//! Calls whose outcome is unknown, sent through a follower: the forwarder sends a call to the
//! leader again only if applying it twice is the same as once (DESIGN invariant 9). The leader
//! runs with the `lose-reply` fault: every second committed write is answered UNAVAILABLE
//! (outcome unknown) instead of its result, as when a leader dies just after the commit.

use tonic::Code;

use timerdb::api::pb;

use crate::harness::*;

/// Finding 2 of issue 33: the follower's forwarder sent every call again after an unknown
/// outcome, so a conditional cancel that had happened was answered FAILED_PRECONDITION (a
/// refusal, which promises nothing happened) and a relative shift applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_calls_that_are_the_same_twice_are_forwarded_twice() {
    let c = TestCluster::start_with(3, |n| n.faults.lose_reply_every = 2).await;
    let follower = c.follower().await;
    let mut client = c.client(follower).await;
    let base = now_ms() + 3_600_000;

    // Write 1 answered; write 2 (b) loses its answer: a create-only Schedule is sent again
    // (write 3) and finds the timer it made.
    let a = client.schedule(schedule_req("a", base)).await.unwrap();
    assert!(a.into_inner().created);
    let b = client.schedule(schedule_req("b", base)).await.unwrap();
    assert!(
        !b.into_inner().created,
        "the repeat found the timer the lost write made"
    );

    // Write 4: a conditional cancel, which happens and loses its answer: not sent again.
    let cancel = pb::CancelRequest {
        namespace: NS.into(),
        id: "a".into(),
        if_revision: 1,
        ..Default::default()
    };
    let e = client.cancel(cancel).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("outcome is unknown"), "{e:?}");
    let a = get(&mut client, "a").await.unwrap();
    assert_eq!(
        (a.state, a.revision),
        (pb::TimerState::Cancelled as i32, 2),
        "cancelled once"
    );

    // Write 5 answered, write 6 loses its answer: each shift applied once.
    let extend = || pb::RescheduleRequest {
        namespace: NS.into(),
        id: "b".into(),
        when: Some(pb::reschedule_request::When::ExtendByMs(60_000)),
        ..Default::default()
    };
    client.reschedule(extend()).await.unwrap();
    let e = client.reschedule(extend()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    let b = get(&mut client, "b").await.unwrap();
    assert_eq!(
        b.fire_at_ms,
        base + 120_000,
        "two shifts, each applied once"
    );
    c.converged().await;
    c.shutdown().await;
}
