//! Recurring timers on real clusters (docs/recurrence.md): an every-second series through two
//! SIGKILLed leaders (every occurrence of the minute fired exactly once, none early, none
//! missing), one catch-up after a whole-cluster outage, overlap `skip` against a consumer that
//! never acks, bad input named by field, and the operations (next, pause, resume, list,
//! delete) through the API.

use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{self, timers_client::TimersClient};
use timerdb::recurring::parse_occurrence;
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::*;
use crate::process::{self, leader, same_digests, spawn, start_three};

fn every(period_ms: i64) -> pb::Recurrence {
    pb::Recurrence {
        every_ms: period_ms,
        ..Default::default()
    }
}

fn recurring_req(id: &str, r: pb::Recurrence) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: NS.into(),
        id: id.into(),
        payload: id.as_bytes().to_vec(),
        recurrence: Some(r),
        ..Default::default()
    }
}

/// The occurrences of series `id` (every state), by nominal time.
async fn occurrences(c: &mut TimersClient<Channel>, id: &str) -> Vec<(i64, pb::Timer)> {
    let mut out: Vec<(i64, pb::Timer)> = list_all(c, pb::TimerState::Unspecified)
        .await
        .into_iter()
        .filter_map(|t| {
            let (series, nominal) = parse_occurrence(&t.id)?;
            (series == id).then_some((nominal, t))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

async fn recurring_of(c: &mut TimersClient<Channel>, id: &str) -> pb::Series {
    get(c, id).await.unwrap().series.expect("a recurring timer")
}

/// A client of some running node (the killed one's clients would fail).
async fn any_client(procs: &[process::Proc]) -> TimersClient<Channel> {
    for p in procs.iter().filter(|p| p.child.is_some()) {
        if let Some(ch) = process::channel(&p.addr).await {
            return TimersClient::new(ch);
        }
    }
    panic!("no node answers");
}

/// Watches the series' occurrences for `span`, checking none is observed FIRED before its
/// fire time (the observer's clock, as `wait_fired` does).
async fn observe(procs: &[process::Proc], id: &str, span: Duration) {
    let until = Instant::now() + span;
    while Instant::now() < until {
        let mut c = any_client(procs).await;
        let fired: Vec<pb::Timer> = occurrences(&mut c, id)
            .await
            .into_iter()
            .map(|(_, t)| t)
            .filter(|t| t.state == pb::TimerState::Fired as i32)
            .collect();
        assert_not_early(&fired, now_ms());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_second_for_a_minute_through_two_leader_kills() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (mut procs, peers) = start_three(&tmp);
    let l = leader(&procs).await;

    // Phase 1: every second for one minute, from the next whole second + 2 s; FIRE_ALL so an
    // occurrence a failover made late still fires.
    let start = (now_ms() / 1000 + 3) * 1000;
    let r = pb::Recurrence {
        anchor_ms: start,
        start_ms: start,
        end_ms: start + 59_000,
        misfire: pb::Misfire::FireAll as i32,
        ..every(1000)
    };
    let mut c = TimersClient::new(process::channel(&procs[(l + 1) % 3].addr).await.unwrap());
    let created = c
        .schedule(recurring_req("tick", r))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);

    // Phase 2: SIGKILL the leader just before an occurrence at ~15 s and again at ~35 s, each
    // restarted 5 s later. A failover here is often shorter than the period, so the second
    // time a follower is killed with it: for 4 s no quorum fires anything, the occurrences of
    // those seconds come late, and FIRE_ALL must still fire each of them once.
    let wait_until =
        |t: i64| tokio::time::sleep(Duration::from_millis((t - now_ms()).max(0) as u64));
    let mut killed = Vec::new();
    for (at, outage) in [(15_000 - 150, false), (35_000 - 150, true)] {
        observe(
            &procs,
            "tick",
            Duration::from_millis((start + at - now_ms()).max(0) as u64),
        )
        .await;
        let l = leader(&procs).await;
        procs[l].child.take().unwrap().kill().unwrap();
        killed.push(l + 1);
        if outage {
            let f = (l + 1) % 3;
            procs[f].child.take().unwrap().kill().unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
            procs[f].child = Some(spawn(f as u64 + 1, &procs[f], &peers));
        }
        let l2 = leader(&procs).await;
        assert_ne!(l2, l);
        observe(&procs, "tick", Duration::from_secs(5)).await;
        procs[l].child = Some(spawn(l as u64 + 1, &procs[l], &peers));
    }
    observe(
        &procs,
        "tick",
        Duration::from_millis((start + 60_000 - now_ms()).max(0) as u64),
    )
    .await;
    wait_until(start + 62_000).await;

    // Phase 3: every second of the minute fired exactly once, on time or after, none missing.
    let mut c = any_client(&procs).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let occs = loop {
        let occs = occurrences(&mut c, "tick").await;
        let all_fired = occs.len() == 60
            && occs
                .iter()
                .all(|(_, t)| t.state == pb::TimerState::Fired as i32);
        if all_fired || Instant::now() > deadline {
            break occs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let nominal: Vec<i64> = occs.iter().map(|(n, _)| *n).collect();
    let want: Vec<i64> = (0..60).map(|k| start + k * 1000).collect();
    assert_eq!(nominal, want, "each second of the minute, once");
    let mut indexes = std::collections::HashSet::new();
    for (n, t) in &occs {
        assert_eq!(t.state, pb::TimerState::Fired as i32, "{}", t.id);
        assert!(
            t.fire_index > 0 && indexes.insert(t.fire_index),
            "{}: {t:?}",
            t.id
        );
        assert!(t.fired_at_ms >= *n, "{} fired early", t.id);
    }
    let s = recurring_of(&mut c, "tick").await;
    assert_eq!(
        (s.fired, s.missed, s.skipped, s.status.as_str()),
        (60, 0, 0, "ended")
    );
    let late: Vec<i64> = occs.iter().map(|(n, t)| t.fired_at_ms - n).collect();
    println!(
        "recurring through leader kills (nodes {killed:?}, the second with 4 s without \
         quorum): 60/60 occurrences fired once; lateness max {} ms, median {} ms",
        late.iter().max().unwrap(),
        {
            let mut l = late.clone();
            l.sort();
            l[30]
        }
    );
    same_digests(&procs, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_once_after_a_10_second_outage_fires_one_catch_up() {
    let mut cluster = TestCluster::start(3).await;
    let mut c = cluster.client(cluster.leader().await).await;
    c.schedule(recurring_req("t", every(1000))).await.unwrap();
    let first = occurrences(&mut c, "t").await[0].1.id.clone();
    wait_state(
        &mut c,
        &first,
        pb::TimerState::Fired,
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Phase 1: the whole cluster is down for 10 s.
    let before = occurrences(&mut c, "t").await.len();
    let stopped_at = now_ms();
    for id in [1, 2, 3] {
        cluster.stop(id).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    for id in [1, 2, 3] {
        cluster.restart(id).await;
    }
    let back_at = now_ms();
    let mut c = cluster.client(cluster.leader().await).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Phase 2: of the ~10 occurrences due while it was down, one fired (late); the rest are
    // counted as missed; then the series goes on from now.
    let occs = occurrences(&mut c, "t").await;
    let in_outage: Vec<&(i64, pb::Timer)> = occs
        .iter()
        .filter(|(n, _)| *n > stopped_at && *n < back_at)
        .collect();
    assert_eq!(in_outage.len(), 1, "one catch-up: {in_outage:?}");
    let catch_up = &in_outage[0].1;
    assert_eq!(catch_up.state, pb::TimerState::Fired as i32);
    assert!(
        catch_up.fired_at_ms >= back_at - 1000,
        "it fired after the outage: {catch_up:?}"
    );
    let s = recurring_of(&mut c, "t").await;
    assert!(s.missed >= 8, "missed {} (~9 expected)", s.missed);
    assert!(occs.len() >= before + 3, "it went on after: {}", occs.len());
    cluster.converged().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_waits_for_the_previous_occurrence_to_be_acked() {
    let cluster = TestCluster::start(3).await;
    let l = cluster.leader().await;
    crate::delivery::put_policy(
        &cluster,
        l,
        NS,
        pb::NamespacePolicy {
            ack_timeout_ms: 60_000,
            ..Default::default()
        },
    )
    .await;
    let mut c = cluster.client(l).await;
    // A consumer that takes deliveries and never acks them.
    let mut stream = c
        .subscribe(pb::SubscribeRequest {
            namespace: NS.into(),
            consumer: "never-acks".into(),
            max_in_flight: 100,
        })
        .await
        .unwrap()
        .into_inner();
    let r = pb::Recurrence {
        overlap: pb::Overlap::Skip as i32,
        ..every(1000)
    };
    c.schedule(recurring_req("o", r)).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the first occurrence is delivered")
        .unwrap()
        .unwrap();
    let first_timer = first.timer.unwrap();

    // Phase 1: 5 s with the first in flight: no second occurrence fires.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let occs = occurrences(&mut c, "o").await;
    let fired: Vec<&str> = occs
        .iter()
        .filter(|(_, t)| t.fire_index > 0)
        .map(|(_, t)| t.id.as_str())
        .collect();
    assert_eq!(fired, vec![first_timer.id.as_str()], "only the first fired");
    let s = recurring_of(&mut c, "o").await;
    assert!(s.skipped >= 3, "skipped {}", s.skipped);
    assert!(
        s.recent.iter().any(|o| o.fate == "skipped_overlap"),
        "{:?}",
        s.recent
    );

    // Phase 2: acked, the next occurrence fires (and is delivered).
    c.ack(pb::AckRequest {
        namespace: NS.into(),
        id: first_timer.id.clone(),
        attempt: first.attempt,
        ..Default::default()
    })
    .await
    .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the next occurrence is delivered after the ack")
        .unwrap()
        .unwrap()
        .timer
        .unwrap();
    assert_ne!(second.id, first_timer.id);
    assert!(second.fire_at_ms > first_timer.fire_at_ms);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_recurrences_are_refused_naming_the_field() {
    let cluster = TestCluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;
    let cron = |expr: &str, zone: &str| pb::Recurrence {
        cron: expr.into(),
        time_zone: zone.into(),
        ..Default::default()
    };
    let cases: Vec<(&str, pb::ScheduleRequest, &str)> = vec![
        (
            "an invalid cron",
            recurring_req("b", cron("0 25 * * *", "UTC")),
            "recurrence.cron",
        ),
        (
            "a 3-field cron",
            recurring_req("b", cron("* * *", "UTC")),
            "recurrence.cron",
        ),
        (
            "a cron that never matches",
            recurring_req("b", cron("0 0 30 2 *", "UTC")),
            "never matches",
        ),
        (
            "an unknown zone",
            recurring_req("b", cron("0 9 * * *", "Mars/Olympus")),
            "recurrence.time_zone",
        ),
        (
            "a cron without a zone",
            recurring_req("b", cron("0 9 * * *", "")),
            "recurrence.time_zone",
        ),
        (
            "an interval of 0",
            recurring_req("b", every(0)),
            "recurrence.every_ms",
        ),
        (
            "a negative interval",
            recurring_req("b", every(-5)),
            "recurrence.every",
        ),
        (
            "an interval under 1 s",
            recurring_req("b", every(10)),
            "recurrence.every_ms",
        ),
        (
            "an end before the start",
            recurring_req(
                "b",
                pb::Recurrence {
                    start_ms: 1_900_000_000_000,
                    end_ms: 1_890_000_000_000,
                    ..every(1000)
                },
            ),
            "recurrence.end_ms",
        ),
        (
            "cron and every together",
            recurring_req(
                "b",
                pb::Recurrence {
                    every_ms: 1000,
                    ..cron("0 9 * * *", "UTC")
                },
            ),
            "not both",
        ),
        (
            "a fire time as well",
            pb::ScheduleRequest {
                when: at(now_ms() + 1000),
                ..recurring_req("b", every(1000))
            },
            "fire_at_ms",
        ),
        (
            "an unknown misfire",
            recurring_req(
                "b",
                pb::Recurrence {
                    misfire: 9,
                    ..every(1000)
                },
            ),
            "recurrence.misfire",
        ),
        (
            "an id of an occurrence",
            schedule_req("x@2026-11-26T09:00:00.000Z", now_ms() + 1000),
            "occurrences",
        ),
        (
            "a batch with a recurrence",
            pb::ScheduleRequest {
                when: at(now_ms() + 1000),
                ..recurring_req("b", every(1000))
            },
            "one at a time",
        ),
    ];
    for (what, req, field) in cases {
        let got = if what.starts_with("a batch") {
            c.schedule_batch(pb::ScheduleBatchRequest { timers: vec![req] })
                .await
                .map(|_| ())
        } else {
            c.schedule(req).await.map(|_| ())
        };
        let s = got.expect_err(what);
        tried(what, &status_text(&s));
        assert_eq!(s.code(), Code::InvalidArgument, "{what}: {s:?}");
        assert!(
            s.message().contains(field),
            "{what}: {:?} should name {field}",
            s.message()
        );
    }
    // Nothing was created.
    assert!(get(&mut c, "b").await.unwrap_err().code() == Code::NotFound);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_pause_resume_list_and_delete_through_the_api() {
    let cluster = TestCluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;
    let weekday = pb::Recurrence {
        cron: "0 9 * * MON-FRI".into(),
        time_zone: "Europe/Berlin".into(),
        ..Default::default()
    };
    let r = c
        .schedule(recurring_req("standup", weekday.clone()))
        .await
        .unwrap()
        .into_inner();
    assert!(r.created);
    let again = c
        .schedule(recurring_req("standup", weekday))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created, "a repeat answers the existing series");
    let t = c
        .get(pb::GetRequest {
            namespace: NS.into(),
            id: "standup".into(),
            next_count: 12,
        })
        .await
        .unwrap()
        .into_inner()
        .timer
        .unwrap();
    let s = t.series.unwrap();
    assert_eq!(s.next_ms.len(), 12);
    assert_eq!(t.fire_at_ms, s.next_ms[0]);
    for n in &s.next_ms {
        // 09:00 in Berlin is 08:00 or 07:00 UTC, Monday to Friday.
        let ts = jiff::Timestamp::from_millisecond(*n).unwrap();
        let berlin = ts.to_zoned(
            jiff::tz::TimeZoneDatabase::bundled()
                .get("Europe/Berlin")
                .unwrap(),
        );
        assert_eq!((berlin.hour(), berlin.minute()), (9, 0), "{berlin}");
        assert!(berlin.weekday().to_monday_one_offset() <= 5, "{berlin}");
    }
    assert_eq!(
        s.next_id,
        format!("standup@{}", timerdb::recurring::rfc3339_ms(s.next_ms[0]))
    );
    // Pause removes the pending occurrence; resume makes it again.
    let p = c
        .pause(pb::PauseRequest {
            namespace: NS.into(),
            id: "standup".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        p.into_inner().timer.unwrap().series.unwrap().status,
        "paused"
    );
    assert_eq!(
        get(&mut c, &s.next_id).await.unwrap_err().code(),
        Code::NotFound
    );
    c.resume(pb::PauseRequest {
        namespace: NS.into(),
        id: "standup".into(),
    })
    .await
    .unwrap();
    assert_eq!(
        get(&mut c, &s.next_id).await.unwrap().state,
        pb::TimerState::Pending as i32
    );
    // A one-shot timer cannot be paused; List filters the recurring ones.
    c.schedule(schedule_req("once", now_ms() + 600_000))
        .await
        .unwrap();
    let e = c
        .pause(pb::PauseRequest {
            namespace: NS.into(),
            id: "once".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let page = c
        .list(pb::ListRequest {
            namespace: NS.into(),
            recurring: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = page.timers.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec!["standup"]);
    // Cancel deletes the series and its occurrence; a retry answers the same.
    for _ in 0..2 {
        let t = c
            .cancel(pb::CancelRequest {
                namespace: NS.into(),
                id: "standup".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .timer
            .unwrap();
        assert_eq!(t.state, pb::TimerState::Cancelled as i32);
    }
    assert_eq!(
        get(&mut c, &s.next_id).await.unwrap_err().code(),
        Code::NotFound
    );
    cluster.converged().await;
    cluster.shutdown().await;
}
