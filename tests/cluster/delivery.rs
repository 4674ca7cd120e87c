//! Delivery on real clusters: Subscribe through followers, competing consumers, acks,
//! redelivery with backoff, dead letters and Redrive, failover during delivery, retention.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use timerdb::api::pb;
use tonic::Code;

use crate::consumer::{Acks, Consumer, Seen};
use crate::harness::*;

pub(crate) async fn put_policy(
    c: &TestCluster,
    via: u64,
    namespace: &str,
    policy: pb::NamespacePolicy,
) {
    c.namespaces(via)
        .await
        .put_namespace(pb::PutNamespaceRequest {
            name: namespace.into(),
            policy: Some(policy),
        })
        .await
        .unwrap();
}

/// Schedules `names` in [`NS`] due now through `via` and subscribes a consumer there that never
/// acks; returns it once it holds every one of them (attempt 1).
pub(crate) async fn delivered_unacked(c: &TestCluster, via: u64, names: &[String]) -> Consumer {
    schedule_many(c, via, NS, names, now_ms(), 0).await;
    let lazy = Consumer::start(c, via, NS, 10, false).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while lazy.seen().len() < names.len() {
        assert!(
            Instant::now() < deadline,
            "not delivered: {:?}",
            lazy.seen()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lazy
}

/// Schedules `ids` in `namespace`, the i-th due at `base + i * step_ms`, in batches.
pub(crate) async fn schedule_many(
    c: &TestCluster,
    via: u64,
    namespace: &str,
    ids: &[String],
    base: i64,
    step_ms: i64,
) {
    let mut client = c.client(via).await;
    for (n, chunk) in ids.chunks(500).enumerate() {
        let timers = chunk
            .iter()
            .enumerate()
            .map(|(i, id)| pb::ScheduleRequest {
                namespace: namespace.into(),
                id: id.clone(),
                when: at(base + ((n * 500 + i) as i64) * step_ms),
                payload: id.as_bytes().to_vec(),
                ..Default::default()
            })
            .collect();
        client
            .schedule_batch(pb::ScheduleBatchRequest { timers })
            .await
            .unwrap();
    }
}

/// Waits until `n` timers of `namespace` are in `state`; returns them.
pub(crate) async fn wait_count(
    c: &TestCluster,
    via: u64,
    namespace: &str,
    state: pb::TimerState,
    n: usize,
    within: Duration,
) -> Vec<pb::Timer> {
    let mut client = c.client(via).await;
    let deadline = Instant::now() + within;
    loop {
        let found = list_in(&mut client, namespace, state).await;
        if found.len() >= n {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} timers of {namespace} reached {state:?} within {within:?}",
            found.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The checks every acking test shares: no ack failed, each timer was ACKED by exactly one
/// transition (every Ack answer names the same finished_at, which is the stored one), every
/// timer was delivered at least once and never before its fire time.
fn check_acked_once(acked: &[pb::Timer], seen: &[Seen], acks: &Acks) {
    assert!(acks.errors.is_empty(), "ack errors: {:?}", acks.errors);
    let delivered: HashSet<&str> = seen.iter().map(|s| s.id.as_str()).collect();
    for t in acked {
        assert!(
            delivered.contains(t.id.as_str()),
            "{} ACKED but never delivered",
            t.id
        );
        assert!(t.attempts >= 1, "{t:?}");
        let answers = acks
            .finished
            .get(&t.id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        assert!(
            !answers.is_empty(),
            "{} ACKED but no ack of ours succeeded",
            t.id
        );
        assert!(
            answers.iter().all(|f| *f == t.finished_at_ms),
            "{} was acked by more than one transition: {answers:?} vs {}",
            t.id,
            t.finished_at_ms
        );
    }
    let index: HashMap<&str, u64> = acked
        .iter()
        .map(|t| (t.id.as_str(), t.fire_index))
        .collect();
    for s in seen {
        assert!(s.attempt >= 1);
        if let Some(i) = index.get(s.id.as_str()) {
            assert_eq!(
                s.fire_index, *i,
                "{}: the dedup token changed between deliveries",
                s.id
            );
        }
        assert!(
            s.received_ms >= s.fire_at_ms,
            "{} delivered {} ms before its fire time",
            s.id,
            s.fire_at_ms - s.received_ms
        );
    }
}

/// Waits until the consumers hold answers to acks of `n` distinct timers: an ack commits (and
/// List shows it) a moment before its answer reaches the consumer.
async fn settle(consumers: &[&Consumer], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answered: HashSet<String> = consumers
            .iter()
            .flat_map(|c| c.acks().finished.into_keys())
            .collect();
        if answered.len() >= n || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:04}")).collect()
}

/// Fired, delivered and acked per second: `n` timers all due at `due_ms`, until the last
/// of them was finished.
fn rate(n: usize, due_ms: i64, acked: &[pb::Timer]) -> f64 {
    let last = acked.iter().map(|t| t.finished_at_ms).max().unwrap();
    n as f64 / ((last - due_ms).max(1) as f64 / 1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribers_on_followers_get_every_timer_and_ack_it_once() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let followers: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
    let long_ack = pb::NamespacePolicy {
        ack_timeout_ms: 20_000,
        ..Default::default()
    };
    put_policy(&c, followers[0], "solo", long_ack.clone()).await;
    put_policy(&c, followers[0], "pair", long_ack).await;

    // Phase 1: one consumer on a follower; 1,000 timers come due in the same millisecond.
    let n = 1_000;
    let solo = Consumer::start(&c, followers[0], "solo", 200, true).await;
    let due = now_ms() + 500;
    schedule_many(&c, followers[1], "solo", &ids("s", n), due, 0).await;
    let acked = wait_count(
        &c,
        followers[1],
        "solo",
        pb::TimerState::Acked,
        n,
        Duration::from_secs(60),
    )
    .await;
    settle(&[&solo], n).await;
    check_acked_once(&acked, &solo.seen(), &solo.acks());
    let one = rate(n, due, &acked);
    solo.stop();

    // Phase 2: two competing consumers, one per follower, share another namespace.
    let a = Consumer::start(&c, followers[0], "pair", 100, true).await;
    let b = Consumer::start(&c, followers[1], "pair", 100, true).await;
    let due = now_ms() + 500;
    schedule_many(&c, leader, "pair", &ids("p", n), due, 0).await;
    let acked = wait_count(
        &c,
        leader,
        "pair",
        pb::TimerState::Acked,
        n,
        Duration::from_secs(60),
    )
    .await;
    settle(&[&a, &b], n).await;
    let (sa, sb) = (a.seen(), b.seen());
    let mut both_acks = a.acks();
    let b_acks = b.acks();
    both_acks.errors.extend(b_acks.errors);
    both_acks.finished.extend(b_acks.finished);
    check_acked_once(&acked, &[sa.clone(), sb.clone()].concat(), &both_acks);
    assert!(
        sa.len() >= n / 10 && sb.len() >= n / 10,
        "the consumers did not share the load: {} and {}",
        sa.len(),
        sb.len()
    );
    let two = rate(n, due, &acked);
    eprintln!(
        "delivery rate (fired+delivered+acked per second, {n} due at once): one consumer {one:.0}/s, two consumers {two:.0}/s (split {}/{})",
        sa.len(),
        sb.len()
    );
    c.converged().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unacked_timers_back_off_go_dead_and_redrive_brings_them_back() {
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 300,
        max_attempts: 3,
        backoff_min_ms: 200,
        backoff_max_ms: 5_000,
        backoff_multiplier_permille: 2000,
        backoff_jitter_percent: Some(0),
        ..Default::default()
    };
    put_policy(&c, follower, NS, policy).await;
    let mut client = c.client(follower).await;

    // Phase 1: three timers fire with nobody subscribed: no attempt is spent while they wait.
    let names = ["x".to_string(), "y".into(), "z".into()];
    schedule_many(&c, follower, NS, &names, now_ms() + 100, 0).await;
    wait_fired(&mut client, 3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for id in &names {
        let t = get(&mut client, id).await.unwrap();
        assert_eq!(
            (t.attempts, t.phase),
            (0, pb::DeliveryPhase::Ready as i32),
            "{t:?}"
        );
    }

    // Phase 2: a consumer that never acks: attempts 1, 2, 3, spaced by the ack timeout plus a
    // growing backoff (300 + 200, then 300 + 400 ms), then DEAD.
    let lazy = Consumer::start(&c, follower, NS, 10, false).await;
    wait_count(
        &c,
        follower,
        NS,
        pb::TimerState::Dead,
        3,
        Duration::from_secs(20),
    )
    .await;
    let seen: Vec<Seen> = lazy.seen().into_iter().filter(|s| s.id == "x").collect();
    let attempts: Vec<u32> = seen.iter().map(|s| s.attempt).collect();
    assert_eq!(attempts, [1, 2, 3], "{seen:?}");
    let gaps: Vec<u128> = seen
        .windows(2)
        .map(|w| (w[1].at - w[0].at).as_millis())
        .collect();
    assert!(
        gaps[0] >= 450 && gaps[1] >= 650,
        "redelivered too soon: gaps {gaps:?} ms"
    );
    assert!(gaps[1] > gaps[0], "backoff did not grow: {gaps:?}");
    let dead = list_in(&mut client, NS, pb::TimerState::Dead).await;
    for t in &dead {
        assert_eq!((t.attempts, t.timeouts, t.nacks), (3, 3, 0), "{t:?}");
        assert!(
            t.last_delivered_at_ms > 0 && t.wake_at_ms > t.finished_at_ms,
            "{t:?}"
        );
    }
    let e = ack(&mut client, "x", 3).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("DEAD"), "{}", e.message());

    // Phase 3: Redrive one, then the rest: each is delivered again (attempt 4) and, acked,
    // ends ACKED. The subscription is still open; attempts were counted from the redrive.
    let r = client
        .redrive(redrive("x", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.redriven, 1);
    assert_eq!(r.timers[0].state, pb::TimerState::Pending as i32);
    let r = client
        .redrive(redrive("", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.redriven, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while lazy.seen().iter().filter(|s| s.attempt == 4).count() < 3 {
        assert!(
            Instant::now() < deadline,
            "not redelivered: {:?}",
            lazy.seen()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = ack(&mut client, "x", 3).await.unwrap_err();
    assert!(e.message().contains("stale"), "{}", e.message());
    let mut first = HashMap::new();
    for id in &names {
        let t = ack(&mut client, id, 4).await.unwrap();
        assert_eq!((t.state, t.redrives), (pb::TimerState::Acked as i32, 1));
        first.insert(id.clone(), t.finished_at_ms);
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let again = ack(&mut client, "x", 4).await.unwrap();
    assert_eq!(
        (again.state, again.finished_at_ms),
        (pb::TimerState::Acked as i32, first["x"]),
        "a retried ack must change nothing"
    );

    // Phase 4: bad input is refused with a clear status.
    assert_eq!(
        ack(&mut client, "x", 0).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        ack(&mut client, "nope", 1).await.unwrap_err().code(),
        Code::NotFound
    );
    let nack = pb::NackRequest {
        namespace: NS.into(),
        id: "x".into(),
        attempt: 4,
    };
    assert_eq!(
        client.nack(nack).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    let both = client.redrive(redrive("x", true)).await.unwrap_err();
    assert_eq!(both.code(), Code::InvalidArgument);
    let e = client.redrive(redrive("x", false)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("ACKED"), "{}", e.message());
    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}

fn redrive(id: &str, all: bool) -> pb::RedriveRequest {
    pb::RedriveRequest {
        namespace: NS.into(),
        id: id.into(),
        all,
    }
}

async fn ack(
    client: &mut timerdb::api::pb::timers_client::TimersClient<tonic::transport::Channel>,
    id: &str,
    attempt: u32,
) -> Result<pb::Timer, tonic::Status> {
    let req = pb::AckRequest {
        namespace: NS.into(),
        id: id.into(),
        attempt,
        wait_for_commit: true,
    };
    Ok(client.ack(req).await?.into_inner().timer.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_during_delivery_every_timer_is_still_acked_once() {
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

    // Phase 1: a consumer on a follower acks everything; 1,500 timers come due over 3 s.
    let n = 1_500;
    let consumer = Consumer::start(&c, follower, NS, 100, true).await;
    schedule_many(&c, follower, NS, &ids("k", n), now_ms() + 300, 2).await;

    // Phase 2: kill the leader in the middle of it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = consumer.seen().len();
    let killed_at = Instant::now();
    c.stop(leader).await;
    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);
    assert!(
        before > 0 && before < n,
        "the kill was not during delivery: {before} delivered"
    );

    // Phase 3: every timer is still delivered and ACKED by one transition; none is lost.
    let acked = wait_count(
        &c,
        follower,
        NS,
        pb::TimerState::Acked,
        n,
        Duration::from_secs(60),
    )
    .await;
    settle(&[&consumer], n).await;
    let seen = consumer.seen();
    check_acked_once(&acked, &seen, &consumer.acks());
    let after: Vec<&Seen> = seen.iter().filter(|s| s.at > killed_at).collect();
    let first_after = after.iter().map(|s| s.at - killed_at).min().unwrap();
    let redelivered: Vec<&&Seen> = after.iter().filter(|s| s.attempt > 1).collect();
    let last_redelivery = redelivered.iter().map(|s| s.at - killed_at).max();
    let by_id: HashMap<&str, usize> = seen.iter().fold(HashMap::new(), |mut m, s| {
        *m.entry(s.id.as_str()).or_default() += 1;
        m
    });
    eprintln!(
        "leader kill during delivery: {before} delivered before; first delivery {first_after:?} after the kill; {} redeliveries, the last {last_redelivery:?} after the kill; {} timers seen more than once",
        redelivered.len(),
        by_id.values().filter(|n| **n > 1).count()
    );

    // Phase 4: the old leader rejoins; every replica holds the same state.
    c.restart(leader).await;
    c.converged().await;
    consumer.stop();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_purges_finished_timers_and_never_pending_ones() {
    // The retention alone decides (below the floor that keeps rows for retries).
    let c = TestCluster::start_with(3, |n| n.purge_floor = Duration::ZERO).await;
    let follower = c.follower().await;
    let retention = 1_500;
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 300,
        max_attempts: 1,
        retention_ms: retention,
        ..Default::default()
    };
    put_policy(&c, follower, NS, policy).await;
    let mut client = c.client(follower).await;

    // Phase 1: one timer of each fate: ACKED, CANCELLED, DEAD, and one still PENDING.
    let soon = now_ms() + 100;
    let far = now_ms() + 3_600_000;
    for (id, t) in [
        ("acked", soon),
        ("dead", soon),
        ("cancelled", far),
        ("pending", far),
    ] {
        client.schedule(schedule_req(id, t)).await.unwrap();
    }
    let cancel = pb::CancelRequest {
        namespace: NS.into(),
        id: "cancelled".into(),
        ..Default::default()
    };
    client.cancel(cancel).await.unwrap();
    let lazy = Consumer::start(&c, follower, NS, 10, false).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lazy.seen().iter().any(|s| s.id == "acked") {
        assert!(Instant::now() < deadline, "never delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ack(&mut client, "acked", 1).await.unwrap();
    let dead = wait_state(
        &mut client,
        "dead",
        pb::TimerState::Dead,
        Duration::from_secs(10),
    )
    .await;
    lazy.stop();

    // Phase 2: each finished timer is gone after its retention, not before; PENDING stays.
    let mut finished: HashMap<&str, i64> = HashMap::new();
    finished.insert("dead", dead.finished_at_ms);
    for id in ["acked", "cancelled"] {
        finished.insert(id, get(&mut client, id).await.unwrap().finished_at_ms);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while !finished.is_empty() {
        for (id, at) in finished.clone() {
            match get(&mut client, id).await {
                Ok(t) => assert!(t.finished_at_ms == at, "{t:?}"),
                Err(e) => {
                    assert_eq!(e.code(), Code::NotFound);
                    let gone_seen = now_ms();
                    assert!(
                        gone_seen >= at + retention as i64,
                        "{id} purged {} ms early",
                        at + retention as i64 - gone_seen
                    );
                    finished.remove(id);
                }
            }
        }
        assert!(Instant::now() < deadline, "not purged: {finished:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pending = get(&mut client, "pending").await.unwrap();
    assert_eq!(pending.state, pb::TimerState::Pending as i32);

    // Phase 3: a purged id may be scheduled again.
    let again = client
        .schedule(schedule_req("acked", far))
        .await
        .unwrap()
        .into_inner();
    assert!(again.created);
    c.converged().await;
    c.shutdown().await;
}

/// AckBatch judges each ack alone, exactly as Ack would, answers in order, and refuses a
/// malformed batch whole (nothing of it applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ack_batch_answers_each_ack_alone_and_refuses_a_bad_batch_whole() {
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let mut client = c.client(follower).await;
    let names = ["a".to_string(), "b".into(), "c".into()];
    let lazy = delivered_unacked(&c, follower, &names).await;
    let acks = |list: &[(&str, u32)]| pb::AckBatchRequest {
        acks: list
            .iter()
            .map(|(id, attempt)| pb::AckRequest {
                namespace: NS.into(),
                id: id.to_string(),
                attempt: *attempt,
                ..Default::default()
            })
            .collect(),
    };

    // One good ack, a stale one, an unknown timer, and the good one retried.
    let batch = acks(&[("a", 1), ("b", 2), ("nope", 1), ("a", 1)]);
    let r = client.ack_batch(batch).await.unwrap().into_inner().results;
    let codes: Vec<i32> = r.iter().map(|r| r.code).collect();
    let want = [Code::Ok, Code::FailedPrecondition, Code::NotFound, Code::Ok];
    assert_eq!(codes, want.map(|c| c as i32), "{r:?}");
    let acked = r[0].timer.clone().unwrap();
    assert_eq!(acked.state, pb::TimerState::Acked as i32);
    assert_eq!(
        r[3].timer.as_ref().unwrap().finished_at_ms,
        acked.finished_at_ms
    );
    assert!(
        r[1].timer.is_none() && r[1].message.contains("b"),
        "{:?}",
        r[1]
    );
    let b = get(&mut client, "b").await.unwrap();
    assert_eq!((b.state, b.attempts), (pb::TimerState::Fired as i32, 1));

    // A malformed ack refuses the whole batch: "c" stays unacked.
    let e = client
        .ack_batch(acks(&[("c", 1), ("b", 0)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("ack 1"), "{}", e.message());
    let e = client.ack_batch(acks(&[])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let many: Vec<(&str, u32)> = vec![("c", 1); 10_001];
    let e = client.ack_batch(acks(&many)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    let still = get(&mut client, "c").await.unwrap();
    assert_eq!(still.state, pb::TimerState::Fired as i32);

    // And the rest through the batch: everything ends ACKED once.
    let r = client
        .ack_batch(acks(&[("b", 1), ("c", 1)]))
        .await
        .unwrap()
        .into_inner()
        .results;
    assert!(r.iter().all(|r| r.code == 0), "{r:?}");
    for id in &names {
        let t = get(&mut client, id).await.unwrap();
        assert_eq!(t.state, pb::TimerState::Acked as i32, "{t:?}");
    }
    lazy.stop();
    c.converged().await;
    c.shutdown().await;
}
