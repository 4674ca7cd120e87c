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

/// Review of issue 33: a create-only Schedule and an unconditional Cancel are sent again
/// (by the forwarder, by the clients for 30 s) because a repeat meets the first call's row —
/// but with a retention of 1 s that row was purged a second after it finished, so a repeat
/// could meet a new timer that reused the id (and cancel it: an acknowledged schedule lost).
/// A finished row is now kept at least the purge floor (60 s), whatever the retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finished_row_outlives_every_retry_whatever_the_retention() {
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let policy = pb::NamespacePolicy {
        retention_ms: 1_000,
        ..Default::default()
    };
    crate::delivery::put_policy(&c, follower, NS, policy).await;
    let mut client = c.client(follower).await;
    client
        .schedule(schedule_req("kept", now_ms() + 3_600_000))
        .await
        .unwrap();
    let cancel = pb::CancelRequest {
        namespace: NS.into(),
        id: "kept".into(),
        ..Default::default()
    };
    client.cancel(cancel.clone()).await.unwrap();
    // Three purger rounds past the retention.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let t = get(&mut client, "kept")
        .await
        .expect("a finished row purged within the retry window");
    assert_eq!(t.state, pb::TimerState::Cancelled as i32);
    // The retries meet it: the Cancel is a no-op, the create-only Schedule finds it.
    client.cancel(cancel).await.unwrap();
    let again = client
        .schedule(schedule_req("kept", now_ms() + 3_600_000))
        .await;
    assert!(
        !matches!(&again, Ok(r) if r.get_ref().created),
        "a repeat created a second timer: {again:?}"
    );
    c.converged().await;
    c.shutdown().await;
}
