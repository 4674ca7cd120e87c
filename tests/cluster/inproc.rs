//! In-process 3-node clusters: timing, cancel/reschedule, forwarding, failover, restart, races.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use timerdb::api::pb;
use tonic::Code;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fires_on_time_never_early() {
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let mut client = c.client(follower).await;

    // Phase 1: schedule 50 timers 300..800 ms ahead through a follower.
    let base = now_ms() + 300;
    for i in 0..50 {
        client
            .schedule(schedule_req(&format!("t{i}"), base + i * 10))
            .await
            .unwrap();
    }
    // Phase 2: each fires, never early (checked against this client's clock by wait_fired),
    // once, with a fire_index. How late is for the benchmarks to measure, not a test.
    let fired = wait_fired(&mut client, 50, Duration::from_secs(30)).await;
    for t in &fired {
        assert!(t.fire_index > 0);
    }
    // Phase 3: an idle cluster writes nothing (no empty ticks).
    let leader = c.leader().await;
    let before = c.node(leader).node.status().unwrap().last_log_index;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = c.node(leader).node.status().unwrap().last_log_index;
    assert_eq!(before, after, "idle cluster appended log entries");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_and_reschedule() {
    let c = TestCluster::start(3).await;
    let mut client = c.client(c.follower().await).await;
    let t = now_ms();

    // Phase 1: cancel before fire: acknowledged, never fires.
    client
        .schedule(schedule_req("cancel-me", t + 3_000))
        .await
        .unwrap();
    let r = client
        .cancel(pb::CancelRequest {
            namespace: NS.into(),
            id: "cancel-me".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        r.into_inner().timer.unwrap().state,
        pb::TimerState::Cancelled as i32
    );

    // Phase 2: reschedule one earlier and one later. Margins are seconds, so a slow machine
    // still reschedules both before their original times.
    client
        .schedule(schedule_req("earlier", t + 10_000))
        .await
        .unwrap();
    client
        .schedule(schedule_req("later", t + 3_000))
        .await
        .unwrap();
    let resched = |id: &str, at: i64| pb::RescheduleRequest {
        namespace: NS.into(),
        id: id.into(),
        when: Some(pb::reschedule_request::When::FireAtMs(at)),
        ..Default::default()
    };
    client
        .reschedule(resched("earlier", t + 500))
        .await
        .unwrap();
    client
        .reschedule(resched("later", t + 5_000))
        .await
        .unwrap();

    // Phase 3: each fires at its new time: the earlier one long before its old time, the
    // later one never at its old time.
    let earlier = wait_state(
        &mut client,
        "earlier",
        pb::TimerState::Fired,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(earlier.fire_at_ms, t + 500);
    let later = wait_state(
        &mut client,
        "later",
        pb::TimerState::Fired,
        Duration::from_secs(20),
    )
    .await;
    assert!(
        later.fired_at_ms >= t + 5_000,
        "fired at its old time: {later:?}"
    );
    let cancelled = get(&mut client, "cancel-me").await.unwrap();
    assert_eq!(
        (cancelled.state, cancelled.fire_index),
        (pb::TimerState::Cancelled as i32, 0)
    );

    // Phase 4: cancel or reschedule after fire is FAILED_PRECONDITION naming the state.
    let e = client
        .cancel(pb::CancelRequest {
            namespace: NS.into(),
            id: "later".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("FIRED"), "{}", e.message());
    let e = client
        .reschedule(resched("later", t + 10_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_node_serves_every_call_and_bad_input_is_refused() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let far = now_ms() + 3_600_000;
    for id in c.running() {
        // Phase 1: schedule and read through every node, leader and followers.
        let mut client = c.client(id).await;
        let tid = format!("via-{id}");
        let r = client
            .schedule(schedule_req(&tid, far))
            .await
            .unwrap()
            .into_inner();
        assert!(r.created);
        let again = client
            .schedule(schedule_req(&tid, far))
            .await
            .unwrap()
            .into_inner();
        assert!(!again.created, "identical schedule must be idempotent");
        assert_eq!(
            get(&mut client, &tid).await.unwrap().payload,
            tid.as_bytes()
        );
    }
    // Phase 2: a write on one follower is visible to a linearizable read on another.
    let followers: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
    let (mut a, mut b) = (c.client(followers[0]).await, c.client(followers[1]).await);
    a.schedule(schedule_req("rw", far)).await.unwrap();
    assert_eq!(get(&mut b, "rw").await.unwrap().id, "rw");
    let pending = list_all(&mut b, pb::TimerState::Pending).await;
    assert_eq!(pending.len(), 4);

    // Phase 3: bad input gets the right status, and the node lives on.
    let mut bad = schedule_req("", far);
    assert_eq!(
        a.schedule(bad.clone()).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    bad.id = "x".into();
    bad.when = None;
    assert_eq!(
        a.schedule(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut other = schedule_req("rw", far + 1);
    let e = a.schedule(other.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    other.payload = vec![0; 64 * 1024 + 1];
    assert_eq!(
        a.schedule(other).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    let e = get(&mut a, "nope").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("test/nope"), "{}", e.message());
    let e = a
        .cancel(pb::CancelRequest {
            namespace: NS.into(),
            id: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let huge = pb::ScheduleBatchRequest {
        timers: (0..10_001)
            .map(|i| schedule_req(&format!("b{i}"), far))
            .collect(),
    };
    assert_eq!(
        a.schedule_batch(huge).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    let e = a
        .subscribe(pb::SubscribeRequest::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Phase 4: a 10,000-timer batch is accepted whole, and paging walks it all.
    let full = pb::ScheduleBatchRequest {
        timers: (0..10_000)
            .map(|i| schedule_req(&format!("b{i:05}"), far))
            .collect(),
    };
    let r = a.schedule_batch(full).await.unwrap().into_inner();
    assert_eq!(r.results.len(), 10_000);
    assert!(r.results.iter().all(|r| r.created));
    assert_eq!(
        list_all(&mut b, pb::TimerState::Pending).await.len(),
        10_004
    );
    assert_eq!(list_all(&mut b, pb::TimerState::Fired).await.len(), 0);
    c.converged().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_while_timers_are_due_every_timer_fires_once() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let follower = c.follower().await;
    let mut client = c.client(follower).await;

    // Phase 1: 1,500 timers due over the next ~3 seconds, in batches.
    let base = now_ms() + 500;
    let n = 1_500;
    for chunk in (0..n).collect::<Vec<i64>>().chunks(500) {
        let timers = chunk
            .iter()
            .map(|i| schedule_req(&format!("k{i:04}"), base + i * 2))
            .collect();
        client
            .schedule_batch(pb::ScheduleBatchRequest { timers })
            .await
            .unwrap();
    }
    // Phase 2: kill the leader while they are coming due.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    c.stop(leader).await;
    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);

    // Phase 3: every timer fires, never early.
    let fired = wait_fired(&mut client, n as usize, Duration::from_secs(20)).await;
    assert_eq!(fired.len(), n as usize);
    for t in &fired {
        assert!(t.fired_at_ms >= t.fire_at_ms, "early: {t:?}");
    }

    // Phase 4: the old leader comes back and catches up; replicas end identical, and each
    // timer has one fire transition with the same fire_index everywhere.
    c.restart(leader).await;
    c.converged().await;
    let by_id: HashMap<String, u64> = fired.iter().map(|t| (t.id.clone(), t.fire_index)).collect();
    for id in c.running() {
        for (tid, index) in &by_id {
            let t = c.local_timer(id, tid).unwrap();
            assert_eq!(t.fire_index, *index, "node {id} disagrees on {tid}");
        }
        assert_eq!(c.node(id).store.meta().unwrap().pending, 0);
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarted_node_catches_up_from_its_data_dir() {
    let mut c = TestCluster::start(3).await;
    let follower = c.follower().await;
    c.stop(follower).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let base = now_ms() + 200;
    let timers = (0..300)
        .map(|i| schedule_req(&format!("r{i}"), base + i))
        .collect();
    client
        .schedule_batch(pb::ScheduleBatchRequest { timers })
        .await
        .unwrap();
    wait_fired(&mut client, 300, Duration::from_secs(10)).await;

    c.restart(follower).await;
    let (applied, _) = c.converged().await;
    assert!(applied >= c.node(leader).node.status().unwrap().applied_index);
    assert_eq!(
        c.local_timer(follower, "r299").unwrap().state,
        timerdb::timer::TimerState::Fired
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_behind_a_purged_log_catches_up_by_snapshot() {
    // Snapshot every 20 entries and keep no log behind it: a stopped follower must come back
    // through InstallSnapshot, not the log.
    let mut c = TestCluster::start_with(3, |cfg| {
        cfg.snapshot_every_entries = 20;
        cfg.keep_log_entries = 0;
    })
    .await;
    let follower = c.follower().await;
    c.stop(follower).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let base = now_ms() + 100;
    // Phase 1: 100 entries of mixed work while the follower is away; some timers fire.
    for i in 0..100 {
        let due = if i % 2 == 0 {
            base + i
        } else {
            base + 3_600_000
        };
        client
            .schedule(schedule_req(&format!("s{i}"), due))
            .await
            .unwrap();
    }
    wait_fired(&mut client, 50, Duration::from_secs(10)).await;
    // Snapshots and purges run in the background: wait (bounded) for the purge.
    let purged = c
        .node(leader)
        .raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index > 50),
            "log purged past 50",
        )
        .await;
    assert!(
        purged.is_ok(),
        "the leader did not purge its log: {purged:?}"
    );

    // Phase 2: the follower returns, installs a snapshot, and ends identical.
    c.restart(follower).await;
    c.converged().await;
    let snap = c.node(follower).raft.metrics().borrow_watched().snapshot;
    assert!(snap.is_some(), "the follower caught up without a snapshot");
    assert_eq!(
        c.local_timer(follower, "s98").unwrap().state,
        timerdb::timer::TimerState::Fired
    );
    assert_eq!(
        c.local_timer(follower, "s99").unwrap().state,
        timerdb::timer::TimerState::Pending
    );
    assert_eq!(c.node(follower).store.meta().unwrap().pending, 50);

    // Phase 3: it keeps working as a replica afterwards.
    client
        .schedule(schedule_req("after", now_ms() + 50))
        .await
        .unwrap();
    wait_fired(&mut client, 51, Duration::from_secs(10)).await;
    c.converged().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_racing_fire_gets_exactly_one_outcome() {
    let c = TestCluster::start(3).await;
    let client = c.client(c.follower().await).await;
    // Timer i is due at base + 3i ms (a 900 ms sweep upwards); the cancel of timer i is sent at
    // base + 3(n-1-i) ms (the same sweep downwards, paced by the clock rather than by how fast
    // cancels commit), so the two fronts cross mid-way and both outcomes happen on a fast build
    // and on a slow machine alike.
    let n: usize = 300;
    let base = now_ms() + 300;
    let timers = (0..n)
        .map(|i| schedule_req(&format!("race{i}"), base + 3 * i as i64))
        .collect();
    client
        .clone()
        .schedule_batch(pb::ScheduleBatchRequest { timers })
        .await
        .unwrap();

    // Phase 1: cancel every timer, highest first, from 8 concurrent clients, each on its cue.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let mut cl = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = BTreeMap::new();
            for i in (0..n).rev().skip(w).step_by(8) {
                let send_at = base + 3 * (n - 1 - i) as i64;
                let wait = send_at - now_ms();
                if wait > 0 {
                    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
                }
                let id = format!("race{i}");
                let r = cl
                    .cancel(pb::CancelRequest {
                        namespace: NS.into(),
                        id: id.clone(),
                        ..Default::default()
                    })
                    .await;
                outcomes.insert(id, r.map(|_| ()).map_err(|e| e.code()));
            }
            outcomes
        }));
    }
    let mut outcomes = BTreeMap::new();
    for t in tasks {
        outcomes.extend(t.await.unwrap());
    }
    // Phase 2: OK ⇒ cancelled and never fired; FAILED_PRECONDITION ⇒ fired. Nothing else.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut client = client;
    let (mut cancelled, mut lost) = (0, 0);
    for (id, outcome) in outcomes {
        let t = get(&mut client, &id).await.unwrap();
        match outcome {
            Ok(()) => {
                assert_eq!(
                    (t.state, t.fire_index),
                    (pb::TimerState::Cancelled as i32, 0),
                    "{id} fired after an OK cancel"
                );
                cancelled += 1;
            }
            Err(Code::FailedPrecondition) => {
                assert_eq!(t.state, pb::TimerState::Fired as i32, "{id}");
                lost += 1;
            }
            Err(code) => panic!("{id}: unexpected {code:?}"),
        }
    }
    eprintln!("cancel race: {cancelled} cancelled, {lost} already fired");
    assert_eq!(cancelled + lost, n);
    assert!(
        cancelled > 0 && lost > 0,
        "the race was not exercised: {cancelled} cancelled, {lost} fired"
    );
    c.converged().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_quorum_calls_fail_unavailable_in_bounded_time() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let others: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
    let survivor = others[0];
    c.stop(leader).await;
    c.stop(others[1]).await;
    let mut client = c.client(survivor).await;
    let started = Instant::now();
    let e = client
        .schedule(schedule_req("lonely", now_ms() + 1000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("no leader"), "{}", e.message());
    // Bounded: the node's leader wait (10 s in tests) plus at most one attempt in flight.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited {:?}",
        started.elapsed()
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_policies_are_replicated_and_enforced() {
    use timerdb::api::pb::namespaces_client::NamespacesClient;
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let followers: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
    let ns_client = |id: u64| {
        let addr = format!("http://{}", c.peers[&id]);
        async move {
            NamespacesClient::new(
                tonic::transport::Endpoint::from_shared(addr)
                    .unwrap()
                    .connect()
                    .await
                    .unwrap(),
            )
        }
    };
    let (mut a, mut b) = (ns_client(followers[0]).await, ns_client(followers[1]).await);

    // Phase 1: an unconfigured namespace reports the defaults.
    let get = pb::GetNamespaceRequest { name: NS.into() };
    let ns = b
        .get_namespace(get.clone())
        .await
        .unwrap()
        .into_inner()
        .namespace
        .unwrap();
    assert!(!ns.configured);
    assert_eq!(ns.policy.unwrap().max_attempts, 5);

    // Phase 2: put through one follower (zero fields default), read through the other.
    let policy = pb::NamespacePolicy {
        max_attempts: 3,
        max_payload_bytes: 16,
        backoff_jitter_percent: Some(0),
        ..Default::default()
    };
    a.put_namespace(pb::PutNamespaceRequest {
        name: NS.into(),
        policy: Some(policy),
    })
    .await
    .unwrap();
    let ns = b
        .get_namespace(get)
        .await
        .unwrap()
        .into_inner()
        .namespace
        .unwrap();
    let p = ns.policy.unwrap();
    assert!(ns.configured);
    assert_eq!(
        (
            p.max_attempts,
            p.max_payload_bytes,
            p.backoff_jitter_percent
        ),
        (3, 16, Some(0))
    );
    assert_eq!(p.ack_timeout_ms, 30_000, "zero must take the default");
    let listed = b
        .list_namespaces(pb::ListNamespacesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.namespaces.len(), 1);

    // Phase 3: the namespace's payload limit applies to Schedule and ScheduleBatch.
    let mut timers = c.client(followers[1]).await;
    let mut big = schedule_req("big", now_ms() + 60_000);
    big.payload = vec![1; 17];
    let e = timers.schedule(big.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("allows 16"), "{}", e.message());
    let e = timers
        .schedule_batch(pb::ScheduleBatchRequest { timers: vec![big] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    let mut small = schedule_req("small", now_ms() + 60_000);
    small.payload = vec![1; 16];
    timers.schedule(small).await.unwrap();

    // Phase 4: bad policies and names are refused.
    let bad = pb::NamespacePolicy {
        backoff_min_ms: 10_000,
        backoff_max_ms: 1_000,
        ..Default::default()
    };
    let e = a
        .put_namespace(pb::PutNamespaceRequest {
            name: NS.into(),
            policy: Some(bad),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("backoff_min_ms"), "{}", e.message());
    let e = a
        .put_namespace(pb::PutNamespaceRequest {
            name: String::new(),
            policy: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    c.converged().await;
    c.shutdown().await;
}
