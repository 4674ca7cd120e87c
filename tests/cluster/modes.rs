//! Create modes and conditional updates on a real cluster, through followers and the leader
//! at once: 16 concurrent debouncers end with the latest time, of two racing conditional
//! updates exactly one wins, create-only takes back the time it returned, and upsert changes a
//! recurring timer's rule.

use std::time::Duration;

use timerdb::api::pb::{self, timers_client::TimersClient};
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::*;

fn req(id: &str, mode: pb::CreateMode, delay_ms: i64) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: NS.into(),
        id: id.into(),
        when: Some(pb::schedule_request::When::DelayMs(delay_ms)),
        payload: b"p".to_vec(),
        mode: mode as i32,
        ..Default::default()
    }
}

async fn clients(c: &TestCluster) -> Vec<TimersClient<Channel>> {
    let mut out = Vec::new();
    for id in c.running() {
        out.push(c.client(id).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_debouncers_end_with_the_latest_time() {
    let cluster = TestCluster::start(3).await;
    let nodes = clients(&cluster).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mut c = nodes[i % nodes.len()].clone();
        tasks.push(tokio::spawn(async move {
            c.schedule(req("burst", pb::CreateMode::Debounce, 30_000))
                .await
                .map(|r| r.into_inner().timer.unwrap())
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().expect("every debounce call succeeds"));
    }
    let mut c = nodes[0].clone();
    let t = get(&mut c, "burst").await.unwrap();
    let latest = answers.iter().map(|a| a.fire_at_ms).max().unwrap();
    assert_eq!(t.fire_at_ms, latest, "the last applied call's time");
    assert_eq!(
        t.revision, 16,
        "created once, moved by each of the other 15"
    );
    let created = answers.iter().filter(|a| a.revision == 1).count();
    assert_eq!(created, 1, "one call created it");
    let mut revisions: Vec<u64> = answers.iter().map(|a| a.revision).collect();
    revisions.sort_unstable();
    assert_eq!(
        revisions,
        (1..=16).collect::<Vec<_>>(),
        "each call one change, in order"
    );
    cluster.converged().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_racing_conditional_updates_exactly_one_wins() {
    let cluster = TestCluster::start(3).await;
    let nodes = clients(&cluster).await;
    let mut c = nodes[0].clone();
    for round in 0..20 {
        let id = format!("race-{round}");
        c.schedule(req(&id, pb::CreateMode::CreateOnly, 600_000))
            .await
            .unwrap();
        // Two clients, through different nodes, both move it if it is at revision 1.
        let mut tasks = Vec::new();
        for (k, shift) in [(0usize, 1_000i64), (1, 2_000)] {
            let mut c = nodes[(round + k) % nodes.len()].clone();
            let r = pb::RescheduleRequest {
                namespace: NS.into(),
                id: id.clone(),
                when: Some(pb::reschedule_request::When::ExtendByMs(shift)),
                if_revision: 1,
                ..Default::default()
            };
            tasks.push(tokio::spawn(async move { c.reschedule(r).await }));
        }
        let mut won = Vec::new();
        let mut lost = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(r) => won.push(r.into_inner().timer.unwrap()),
                Err(s) => lost.push(s),
            }
        }
        assert_eq!((won.len(), lost.len()), (1, 1), "round {round}: {lost:?}");
        assert_eq!(lost[0].code(), Code::FailedPrecondition);
        assert!(
            lost[0]
                .message()
                .contains("is at revision 2 (PENDING), not 1"),
            "{}",
            lost[0].message()
        );
        if round == 0 {
            tried(
                "two conditional reschedules at revision 1",
                &status_text(&lost[0]),
            );
        }
        let t = get(&mut c, &id).await.unwrap();
        assert_eq!((t.revision, t.fire_at_ms), (2, won[0].fire_at_ms));
    }
    cluster.converged().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_only_upsert_and_a_recurring_timer_rule_changed_by_upsert() {
    let cluster = TestCluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;
    // A relative Schedule, then the absolute time it returned: the same timer.
    let first = c
        .schedule(req("t", pb::CreateMode::Unspecified, 60_000))
        .await
        .unwrap();
    let t = first.into_inner().timer.unwrap();
    let again = pb::ScheduleRequest {
        when: at(t.fire_at_ms),
        ..req("t", pb::CreateMode::Unspecified, 0)
    };
    let r = c.schedule(again.clone()).await.unwrap().into_inner();
    assert!(!r.created && r.timer.unwrap().fire_at_ms == t.fire_at_ms);
    // Upsert moves it; create-only with the old time is now another timer: ALREADY_EXISTS.
    let up = c
        .schedule(req("t", pb::CreateMode::Upsert, 90_000))
        .await
        .unwrap();
    assert_eq!(up.into_inner().timer.unwrap().revision, 2);
    let e = c.schedule(again).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    // Bad combinations are refused naming the field.
    let bad = pb::ScheduleRequest {
        if_revision: 3,
        ..req("t", pb::CreateMode::CreateOnly, 0)
    };
    let e = c.schedule(bad).await.unwrap_err();
    assert!(
        e.code() == Code::InvalidArgument && e.message().contains("if_revision"),
        "{e:?}"
    );
    let bad = pb::ScheduleRequest {
        max_wait_ms: 5,
        ..req("t", pb::CreateMode::Upsert, 0)
    };
    let e = c.schedule(bad).await.unwrap_err();
    assert!(
        e.code() == Code::InvalidArgument && e.message().contains("max_wait_ms"),
        "{e:?}"
    );

    // A recurring timer's rule, changed by upsert: the next occurrences follow the new rule.
    let every = |ms: i64| pb::ScheduleRequest {
        namespace: NS.into(),
        id: "job".into(),
        recurrence: Some(pb::Recurrence {
            every_ms: ms,
            ..Default::default()
        }),
        mode: pb::CreateMode::Upsert as i32,
        ..Default::default()
    };
    c.schedule(every(3_600_000)).await.unwrap();
    let s = get(&mut c, "job").await.unwrap();
    let old_next = s.series.unwrap().next_id;
    let r = c.schedule(every(7_200_000)).await.unwrap().into_inner();
    let s = r.timer.unwrap();
    assert_eq!(s.revision, 2);
    let series = s.series.unwrap();
    let next = &series.next_ms;
    assert_eq!(next[1] - next[0], 7_200_000, "{next:?}");
    assert_eq!(
        get(&mut c, &old_next).await.unwrap_err().code(),
        Code::NotFound
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.converged().await;
    cluster.shutdown().await;
}

/// Misfire: the whole cluster stopped for 5 s with `max_lateness` 1 s: timers due during the
/// stop end DEAD (never delivered) under `dead`, EXPIRED under `skip`, and fire (late) under
/// `fire`; timers due after the restart fire; none is ever seen fired early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misfire_after_a_5_second_stop() {
    let mut cluster = TestCluster::start(3).await;
    let l = cluster.leader().await;
    for (ns, action) in [
        ("m-fire", pb::MisfireAction::Fire),
        ("m-dead", pb::MisfireAction::Dead),
        ("m-skip", pb::MisfireAction::Skip),
    ] {
        crate::delivery::put_policy(
            &cluster,
            l,
            ns,
            pb::NamespacePolicy {
                max_lateness_ms: 1000,
                misfire: action as i32,
                ..Default::default()
            },
        )
        .await;
    }
    let mut c = cluster.client(l).await;
    let stop_at = now_ms() + 1000;
    for ns in ["m-fire", "m-dead", "m-skip"] {
        // Due 1.5 … 3.5 s into the stop (more than 1 s late once it is over), and due 10 s
        // after the restart.
        let mut timers: Vec<pb::ScheduleRequest> = (0..5)
            .map(|i| pb::ScheduleRequest {
                namespace: ns.into(),
                id: format!("during-{i}"),
                when: at(stop_at + 1500 + i * 500),
                ..Default::default()
            })
            .collect();
        timers.push(pb::ScheduleRequest {
            namespace: ns.into(),
            id: "after".into(),
            when: at(stop_at + 15_000),
            ..Default::default()
        });
        c.schedule_batch(pb::ScheduleBatchRequest { timers })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis((stop_at - now_ms()).max(0) as u64)).await;
    for id in [1, 2, 3] {
        cluster.stop(id).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for id in [1, 2, 3] {
        cluster.restart(id).await;
    }
    let mut c = cluster.client(cluster.leader().await).await;
    let want = [
        ("m-fire", pb::TimerState::Fired),
        ("m-dead", pb::TimerState::Dead),
        ("m-skip", pb::TimerState::Expired),
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut done = true;
        for (ns, state) in want {
            for t in list_in(&mut c, ns, pb::TimerState::Unspecified).await {
                if t.fire_index > 0 {
                    assert_not_early(std::slice::from_ref(&t), now_ms());
                }
                let expected = if t.id == "after" {
                    pb::TimerState::Fired
                } else {
                    state
                };
                done &= t.state == expected as i32;
            }
        }
        if done {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (ns, state) in want {
        let timers = list_in(&mut c, ns, pb::TimerState::Unspecified).await;
        assert_eq!(timers.len(), 6, "{ns}");
        for t in timers.iter().filter(|t| t.id != "after") {
            assert_eq!(t.state, state as i32, "{ns}/{}", t.id);
            if state != pb::TimerState::Fired {
                assert_eq!(
                    (t.fire_index, t.attempts),
                    (0, 0),
                    "{ns}/{}: never fired",
                    t.id
                );
                let last = t.attempt_log.last().unwrap();
                assert_eq!(last.outcome, "misfired", "{ns}/{}", t.id);
            } else {
                assert!(t.fired_at_ms - t.fire_at_ms > 1000, "fired late: {t:?}");
            }
        }
    }
    println!("misfire after a 5 s stop: fire -> FIRED late, dead -> DEAD, skip -> EXPIRED");
    cluster.converged().await;
    cluster.shutdown().await;
}
