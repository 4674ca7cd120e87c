//! Push delivery on real clusters: the leader calls real HTTP and gRPC receivers on loopback.
//! Every timer is pushed at least once and ACKED by one transition through a leader kill;
//! failing receivers back off to DEAD with an attempt log; a hanging receiver times out without
//! holding up another namespace; rate, burst and concurrency limits hold across a leader kill;
//! the schedule rate limit refuses with a wait; pause and resume; signatures with two secrets;
//! bad policies are refused. (docs/push.md)

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use timerdb::api::pb;
use timerdb::namespace::sign::Secret;
use tonic::Code;

use crate::delivery::{ids, schedule_many, wait_count};
use crate::harness::*;
use crate::receiver::{self, Answer, Got};

pub(crate) const SECRET_A: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SECRET_B: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A push policy: ack timeout 2 s, quick backoff without jitter, request timeout 1 s.
pub(crate) fn push_policy(url: &str, max_attempts: u32) -> pb::NamespacePolicy {
    pb::NamespacePolicy {
        ack_timeout_ms: 2_000,
        max_attempts,
        backoff_min_ms: 200,
        backoff_max_ms: 1_000,
        backoff_jitter_percent: Some(0),
        push: Some(pb::PushTarget {
            url: url.into(),
            secrets: vec![SECRET_A.into()],
            timeout_ms: 1_000,
            dead_on_client_error: false,
        }),
        ..Default::default()
    }
}

pub(crate) async fn put(
    c: &TestCluster,
    via: u64,
    ns: &str,
    policy: pb::NamespacePolicy,
) -> pb::Namespace {
    c.namespaces(via)
        .await
        .put_namespace(pb::PutNamespaceRequest {
            name: ns.into(),
            policy: Some(policy),
        })
        .await
        .unwrap()
        .into_inner()
        .namespace
        .unwrap()
}

/// Checks what `got` holds for timers `acked`: each received at least once, never before its
/// fire time, with a valid signature by `secrets`, one stable webhook-id per timer, and the
/// payload as scheduled.
pub(crate) fn check_received(acked: &[pb::Timer], got: &[Got], secrets: &[&str]) {
    let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::parse(s).unwrap()).collect();
    let mut by_id: HashMap<String, Vec<&Got>> = HashMap::new();
    for g in got {
        by_id.entry(g.id()).or_default().push(g);
    }
    for t in acked {
        let seen = by_id
            .get(&t.id)
            .unwrap_or_else(|| panic!("{} ACKED but never received", t.id));
        let webhook_ids: HashSet<&str> = seen.iter().map(|g| g.header("webhook-id")).collect();
        assert_eq!(
            webhook_ids.len(),
            1,
            "{}: webhook-id changed: {webhook_ids:?}",
            t.id
        );
        for g in seen {
            assert!(
                g.at_ms >= t.fire_at_ms,
                "{} received at {}, {} ms before its fire time",
                t.id,
                g.at_ms,
                t.fire_at_ms - g.at_ms
            );
            assert_eq!(g.body, t.payload, "{}: body is not the payload", t.id);
            assert_eq!(g.header("timerdb-fire-index"), t.fire_index.to_string());
            let ts: i64 = g.header("webhook-timestamp").parse().unwrap();
            assert!(
                (ts * 1000 - g.at_ms).abs() < 5_000,
                "timestamp {ts} is not now"
            );
            for s in &secrets {
                assert!(
                    s.verify(
                        g.header("webhook-signature"),
                        g.header("webhook-id"),
                        ts,
                        &g.body
                    ),
                    "{}: signature does not verify: {:?}",
                    t.id,
                    g.headers
                );
            }
        }
    }
}

/// FIRED → ACKED transitions node `id` applied since it started.
async fn acked_transitions(c: &TestCluster, id: u64) -> u64 {
    let mut cl = c.cluster(id).await;
    cl.status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .timers_acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pushed_timers_are_acked_once_through_a_leader_kill() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let follower = c.follower().await;
    let r = receiver::http().await;
    put(&c, follower, "hooks", push_policy(&r.url(), 20)).await;

    // Phase 1: 1,000 timers come due over 2 s, pushed to a receiver that answers 200.
    let n = 1_000;
    schedule_many(&c, follower, "hooks", &ids("p", n), now_ms() + 300, 2).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    // Phase 2: the leader is killed in the middle of it.
    let before = r.got().len();
    c.stop(leader).await;
    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);
    assert!(
        before > 0 && before < n,
        "the kill was not during push: {before}"
    );

    // Phase 3: every timer is ACKED, received at least once, never early, signed.
    let acked = wait_count(
        &c,
        follower,
        "hooks",
        pb::TimerState::Acked,
        n,
        Duration::from_secs(60),
    )
    .await;
    let got = r.got();
    check_received(&acked, &got, &[SECRET_A]);
    let survivor = c
        .running()
        .into_iter()
        .find(|id| *id != new_leader)
        .unwrap();
    // The survivor applied every transition since the cluster started: one ack per timer.
    assert_eq!(
        acked_transitions(&c, survivor).await,
        n as u64,
        "ACKED more than once"
    );
    let again = got.len() - got.iter().map(Got::id).collect::<HashSet<_>>().len();
    eprintln!(
        "push through a leader kill: {before} pushed before, {} requests, {again} repeated",
        got.len()
    );
    let t = get(&mut c.client(follower).await, "p0000").await;
    let t = t.unwrap_or_else(|_| acked[0].clone());
    let last = t.attempt_log.last().expect("an attempt log");
    // A success is acked like a stream's ack (a lease answered 2xx whole: one write for all).
    assert_eq!(
        (last.channel.as_str(), last.outcome.as_str()),
        ("push", "acked")
    );
    c.shutdown().await;
}

async fn get(
    c: &mut timerdb::api::pb::timers_client::TimersClient<tonic::transport::Channel>,
    id: &str,
) -> Result<pb::Timer, tonic::Status> {
    let r = c
        .get(pb::GetRequest {
            namespace: "hooks".into(),
            id: id.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().timer.unwrap())
}

fn outcomes(t: &pb::Timer) -> Vec<String> {
    t.attempt_log
        .iter()
        .map(|a| match a.outcome.as_str() {
            "http" => format!("{}", a.http_status),
            o => o.to_string(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_receivers_back_off_go_dead_and_redrive_delivers_again() {
    let c = TestCluster::start(3).await;
    let via = c.follower().await;
    // "flaky" answers 500 twice, then 200; "down" answers 503 until told otherwise.
    let flaky = receiver::http().await;
    flaky.set(|_, attempt| Answer::Status(if attempt <= 2 { 500 } else { 200 }));
    let down = receiver::http().await;
    down.set(|_, _| Answer::Status(503));
    put(&c, via, "flaky", push_policy(&flaky.url(), 5)).await;
    put(&c, via, "down", push_policy(&down.url(), 3)).await;
    let due = now_ms() + 200;
    schedule_many(&c, via, "flaky", &ids("f", 5), due, 0).await;
    schedule_many(&c, via, "down", &ids("d", 5), due, 0).await;

    // The flaky receiver's timers are ACKED on the third attempt, after the backoff each time.
    let acked = wait_count(
        &c,
        via,
        "flaky",
        pb::TimerState::Acked,
        5,
        Duration::from_secs(20),
    )
    .await;
    for t in &acked {
        assert_eq!(outcomes(t), ["500", "500", "acked"], "{}", t.id);
        assert!(t.attempt_log.iter().all(|a| a.channel == "push"), "{t:?}");
        assert_eq!(t.attempts, 3);
        let log = &t.attempt_log;
        // Backoff 200 ms then 400 ms (no jitter): the next attempt starts no sooner.
        assert!(log[1].at_ms - log[0].at_ms >= 200, "{log:?}");
        assert!(log[2].at_ms - log[1].at_ms >= 400, "{log:?}");
        assert!(
            log[0].detail.contains("receiver says 500"),
            "{:?}",
            log[0].detail
        );
    }
    let got = flaky.got();
    check_received(&acked, &got, &[SECRET_A]);

    // The receiver that is down: DEAD after 3 attempts, every status in the log.
    let dead = wait_count(
        &c,
        via,
        "down",
        pb::TimerState::Dead,
        5,
        Duration::from_secs(20),
    )
    .await;
    for t in &dead {
        assert_eq!(outcomes(t), ["503", "503", "503"], "{}", t.id);
    }
    // It comes back; a redrive delivers them again.
    down.set(|_, _| Answer::Status(200));
    let r = c
        .client(via)
        .await
        .redrive(pb::RedriveRequest {
            namespace: "down".into(),
            id: String::new(),
            all: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.redriven, 5);
    let acked = wait_count(
        &c,
        via,
        "down",
        pb::TimerState::Acked,
        5,
        Duration::from_secs(20),
    )
    .await;
    for t in &acked {
        assert_eq!(*outcomes(t).last().unwrap(), "acked");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_receiver_times_out_and_holds_up_no_other_namespace() {
    let c = TestCluster::start(3).await;
    let via = c.leader().await;
    let hang = receiver::http().await;
    hang.set(|_, _| Answer::Hang);
    let fine = receiver::grpc().await;
    let mut slow = push_policy(&hang.url(), 2);
    slow.push.as_mut().unwrap().timeout_ms = 300;
    put(&c, via, "hang", slow).await;
    let grpc_url = format!("grpc://{}", fine.addr);
    put(&c, via, "fine", push_policy(&grpc_url, 3)).await;
    let due = now_ms() + 200;
    schedule_many(&c, via, "hang", &ids("h", 50), due, 0).await;
    schedule_many(&c, via, "fine", &ids("g", 200), due, 1).await;

    // The gRPC namespace is pushed in full while the other one hangs.
    let acked = wait_count(
        &c,
        via,
        "fine",
        pb::TimerState::Acked,
        200,
        Duration::from_secs(15),
    )
    .await;
    check_received(&acked, &fine.got(), &[SECRET_A]);
    // The hanging one: each request times out, a failed attempt; DEAD after two.
    let dead = wait_count(
        &c,
        via,
        "hang",
        pb::TimerState::Dead,
        50,
        Duration::from_secs(20),
    )
    .await;
    for t in &dead {
        assert_eq!(outcomes(t), ["timeout", "timeout"], "{}", t.id);
        assert!(t.attempt_log[0].latency_ms >= 300, "{:?}", t.attempt_log);
    }
    c.shutdown().await;
}

/// The most requests `got` holds in any one-second window.
fn worst_second(got: &[Got]) -> usize {
    worst_window(got.iter().map(|g| g.at_ms).collect())
}

/// The most of `at` (times in ms) in any one-second window.
pub(crate) fn worst_window(mut at: Vec<i64>) -> usize {
    at.sort_unstable();
    let mut worst = 0;
    let mut lo = 0;
    for hi in 0..at.len() {
        while at[hi] - at[lo] >= 1000 {
            lo += 1;
        }
        worst = worst.max(hi - lo + 1);
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_burst_and_concurrency_limits_hold_across_a_leader_kill() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let via = c.follower().await;
    let r = receiver::http().await;
    let mut policy = push_policy(&r.url(), 20);
    policy.max_dispatches_per_second = Some(200);
    policy.max_burst = 50;
    put(&c, via, "rated", policy).await;
    let conc = receiver::http().await;
    conc.set(|_, _| Answer::Slow(Duration::from_millis(50)));
    let mut policy = push_policy(&conc.url(), 20);
    policy.max_concurrent_dispatches = Some(4);
    put(&c, via, "narrow", policy).await;

    // 5,000 due at once at 200/s, burst 50; 800 through a concurrency of 4 (50 ms each: 10 s).
    let due = now_ms() + 300;
    schedule_many(&c, via, "rated", &ids("r", 5_000), due, 0).await;
    schedule_many(&c, via, "narrow", &ids("n", 800), due, 0).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let before = r.got().len();
    let kill_ms = now_ms();
    c.stop(leader).await;
    c.leader().await;

    let acked = wait_count(
        &c,
        via,
        "rated",
        pb::TimerState::Acked,
        5_000,
        Duration::from_secs(90),
    )
    .await;
    let got = r.got();
    check_received(&acked, &got, &[SECRET_A]);
    let worst = worst_second(&got);
    let first = got.iter().map(|g| g.at_ms).min().unwrap();
    let last = got.iter().map(|g| g.at_ms).max().unwrap();
    eprintln!(
        "rate limit 200/s burst 50: {} requests ({before} before the kill) over {} ms, \
         worst 1 s window {worst}; concurrency limit 4: at most {} at once",
        got.len(),
        last - first,
        conc.max_concurrent
            .load(std::sync::atomic::Ordering::SeqCst)
    );
    let mut per: std::collections::BTreeMap<i64, usize> = Default::default();
    for g in &got {
        *per.entry((g.at_ms - kill_ms).div_euclid(250)).or_default() += 1;
    }
    eprintln!("per 250 ms from the kill: {per:?}");
    assert!(
        worst <= 250,
        "{worst} requests in one second (limit 200/s + burst 50)"
    );
    let narrow = wait_count(
        &c,
        via,
        "narrow",
        pb::TimerState::Acked,
        800,
        Duration::from_secs(60),
    )
    .await;
    let got = conc.got();
    check_received(&narrow, &got, &[SECRET_A]);
    assert!(
        got.iter().any(|g| g.at_ms < kill_ms) && got.iter().any(|g| g.at_ms > kill_ms),
        "the concurrency-limited pushes did not span the leader kill"
    );
    let most = conc
        .max_concurrent
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(most <= 4, "{most} requests at once with a limit of 4");
    assert!(most >= 2, "the concurrency was never used: {most}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedule_rate_limit_refuses_with_a_wait_and_lets_the_rest_through() {
    let c = TestCluster::start(3).await;
    let via = c.follower().await;
    put(
        &c,
        via,
        "limited",
        pb::NamespacePolicy {
            max_schedules_per_second: Some(50),
            max_schedule_burst: 50,
            ..Default::default()
        },
    )
    .await;
    // The bucket fills from when the leader was elected; wait until it is full.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut client = c.client(via).await;
    let req = |i: usize| pb::ScheduleRequest {
        namespace: "limited".into(),
        id: format!("s{i}"),
        when: Some(pb::schedule_request::When::DelayMs(60_000)),
        ..Default::default()
    };
    // Under the limit: 30 at 25/s all succeed.
    for i in 0..30 {
        client.schedule(req(i)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    // Over it: 200 at once; some are refused, each with a wait, and no more succeed than the
    // bucket allows: its burst plus what the rate earned while the calls were made.
    let started = std::time::Instant::now();
    let calls = (100..300).map(|i| {
        let mut client = client.clone();
        let r = req(i);
        async move { client.schedule(r).await }
    });
    let answers = futures::future::join_all(calls).await;
    let elapsed = started.elapsed().as_secs_f64();
    let (mut ok, mut refused) = (0, 0);
    for a in answers {
        match a {
            Ok(_) => ok += 1,
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert!(s.message().contains("retry after"), "{}", s.message());
                let wait: u64 = s
                    .metadata()
                    .get("retry-after-ms")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=1000).contains(&wait), "retry-after-ms {wait}");
                refused += 1;
            }
        }
    }
    let allowed = 50.0 + 50.0 * elapsed + 1.0;
    eprintln!(
        "schedule rate limit 50/s: {ok} of 200 accepted in {elapsed:.2} s (at most {allowed:.0}), \
         {refused} refused"
    );
    assert!(
        refused > 0 && ok as f64 <= allowed,
        "ok {ok}, refused {refused}"
    );
    // A batch larger than the burst can never fit: refused without a wait.
    let big = pb::ScheduleBatchRequest {
        timers: (1000..1060).map(req).collect(),
    };
    let e = client.schedule_batch(big).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("smaller batches"), "{}", e.message());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_holds_deliveries_and_resume_releases_them() {
    let c = TestCluster::start(3).await;
    let via = c.follower().await;
    let r = receiver::http().await;
    let mut policy = push_policy(&r.url(), 5);
    policy.push.as_mut().unwrap().secrets = vec![SECRET_A.into(), SECRET_B.into()];
    put(&c, via, "paused", policy).await;
    let mut ns = c.namespaces(via).await;
    let p = ns
        .pause_namespace(pb::PauseNamespaceRequest {
            name: "paused".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(p.namespace.unwrap().policy.unwrap().paused);
    schedule_many(&c, via, "paused", &ids("x", 20), now_ms() + 100, 0).await;
    // They fire (the transition is committed) but nothing is pushed.
    wait_count(
        &c,
        via,
        "paused",
        pb::TimerState::Fired,
        20,
        Duration::from_secs(10),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(r.got().is_empty(), "pushed while paused: {}", r.got().len());
    // A policy write keeps the namespace paused.
    let mut policy = push_policy(&r.url(), 5);
    policy.push.as_mut().unwrap().secrets = vec![SECRET_A.into(), SECRET_B.into()];
    assert!(put(&c, via, "paused", policy).await.policy.unwrap().paused);
    ns.resume_namespace(pb::PauseNamespaceRequest {
        name: "paused".into(),
    })
    .await
    .unwrap();
    let acked = wait_count(
        &c,
        via,
        "paused",
        pb::TimerState::Acked,
        20,
        Duration::from_secs(10),
    )
    .await;
    // Both secrets sign each request during the rotation.
    check_received(&acked, &r.got(), &[SECRET_A, SECRET_B]);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_push_policies_are_refused_and_push_namespaces_refuse_subscribers() {
    let c = TestCluster::start(3).await;
    let via = c.follower().await;
    let mut ns = c.namespaces(via).await;
    let bad = |url: &str| pb::PutNamespaceRequest {
        name: "bad".into(),
        policy: Some(push_policy(url, 5)),
    };
    for (url, says) in [
        ("not a url", "not a URL"),
        ("ftp://host/x", "must start with"),
        ("http://", "not a URL"),
    ] {
        let e = ns.put_namespace(bad(url)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{url}");
        assert!(e.message().contains(says), "{url}: {}", e.message());
    }
    let mut zero = bad("http://127.0.0.1:1/");
    zero.policy.as_mut().unwrap().max_dispatches_per_second = Some(0);
    let e = ns.put_namespace(zero).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("max_dispatches_per_second 0"),
        "{}",
        e.message()
    );
    let mut secret = bad("http://127.0.0.1:1/");
    secret
        .policy
        .as_mut()
        .unwrap()
        .push
        .as_mut()
        .unwrap()
        .secrets = vec!["hunter2".into()];
    let e = ns.put_namespace(secret).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Without a secret one is generated, and kept by a later write without one.
    let mut gen = push_policy("http://127.0.0.1:1/", 5);
    gen.push.as_mut().unwrap().secrets.clear();
    let first = put(&c, via, "gen", gen.clone())
        .await
        .policy
        .unwrap()
        .push
        .unwrap();
    assert_eq!(first.secrets.len(), 1);
    Secret::parse(&first.secrets[0]).unwrap();
    let second = put(&c, via, "gen", gen).await.policy.unwrap().push.unwrap();
    assert_eq!(second.secrets, first.secrets);

    // A push namespace cannot also be subscribed to.
    let e = c
        .client(via)
        .await
        .subscribe(pb::SubscribeRequest {
            namespace: "gen".into(),
            consumer: "t".into(),
            max_in_flight: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("delivered by push"), "{}", e.message());
    c.shutdown().await;
}

/// Finding 10 of issue 33: the pusher read the namespaces every 500 ms, so right after an
/// acknowledged rotation that set [A, B] (then [B]) most pushes still carried A's signature
/// alone, and a receiver that had switched to B refused them. Every request that starts after
/// the change is acknowledged now uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_secret_rotation_reaches_every_push_sent_after_it_is_acknowledged() {
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let r = receiver::http().await;
    let mut policy = push_policy(&r.url(), 20);
    put(&c, follower, "rotate", policy.clone()).await;
    // Pushing with A, so the pusher is at work when the rotation comes.
    schedule_many(&c, follower, "rotate", &ids("a", 20), now_ms(), 1).await;
    wait_count(
        &c,
        follower,
        "rotate",
        pb::TimerState::Acked,
        20,
        Duration::from_secs(20),
    )
    .await;
    let a = Secret::parse(SECRET_A).unwrap();
    let b = Secret::parse(SECRET_B).unwrap();
    let verifies = |g: &Got, s: &Secret| {
        let ts: i64 = g.header("webhook-timestamp").parse().unwrap();
        s.verify(
            g.header("webhook-signature"),
            g.header("webhook-id"),
            ts,
            &g.body,
        )
    };
    for (round, secrets) in [("both", vec![SECRET_A, SECRET_B]), ("b", vec![SECRET_B])] {
        policy.push.as_mut().unwrap().secrets = secrets.iter().map(|s| s.to_string()).collect();
        put(&c, follower, "rotate", policy.clone()).await;
        let acknowledged = now_ms();
        let prefix = format!("{round}-");
        schedule_many(&c, follower, "rotate", &ids(&prefix, 12), acknowledged, 1).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let got = loop {
            let got: Vec<Got> = r
                .got()
                .into_iter()
                .filter(|g| g.id().starts_with(&prefix))
                .collect();
            if got.len() >= 12 || std::time::Instant::now() > deadline {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(got.len() >= 12, "{round}: {} of 12 pushed", got.len());
        for g in &got {
            assert!(
                verifies(g, &b),
                "{round}: {} pushed without B's signature",
                g.id()
            );
            let with_a = verifies(g, &a);
            assert_eq!(
                with_a,
                round == "both",
                "{round}: {} and A's signature",
                g.id()
            );
        }
    }
    c.shutdown().await;
}
