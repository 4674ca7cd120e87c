//! Process level: three real `timerd` binaries; SIGKILL the leader under due timers, restart
//! it on its data dir, and check every timer fired and every node converged.

use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{self, timers_client::TimersClient};

use crate::harness::*;
pub(crate) use timerdb_harness::process::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_the_leader_process_and_restart_it() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (mut procs, peers) = start_three(&tmp);

    // Phase 1: 1,000 timers due over the next ~2 s, scheduled through a follower.
    let l = leader(&procs).await;
    let f = (l + 1) % 3;
    let mut client = TimersClient::new(channel(&procs[f].addr).await.unwrap());
    let base = now_ms() + 800;
    let timers = (0..1000)
        .map(|i| schedule_req(&format!("p{i}"), base + i * 2))
        .collect();
    client
        .schedule_batch(pb::ScheduleBatchRequest { timers })
        .await
        .unwrap();

    // Phase 2: SIGKILL the leader while they come due.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    procs[l].child.take().unwrap().kill().unwrap();
    let l2 = leader(&procs).await;
    assert_ne!(l2, l);

    // Phase 3: all fire.
    let fired = wait_fired(&mut client, 1000, Duration::from_secs(20)).await;
    assert!(
        fired.iter().all(|t| t.fired_at_ms >= t.fire_at_ms),
        "a timer fired early"
    );

    // Phase 4: restart the killed node; every node converges with nothing pending.
    let restarted = spawn(l as u64 + 1, &procs[l], &peers);
    procs[l].child = Some(restarted);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut st = Vec::new();
        for p in &procs {
            st.push(status(&p.addr).await);
        }
        let done = st
            .iter()
            .all(|s| s.as_ref().is_some_and(|s| s.pending_timers == 0))
            && st.windows(2).all(|w| {
                w[0].as_ref().map(|s| s.applied_index) == w[1].as_ref().map(|s| s.applied_index)
            });
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "nodes did not converge: {st:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, p) in procs.iter_mut().enumerate() {
        let mut child = p.child.take().unwrap();
        // SIGTERM: a clean shutdown, exit status 0.
        send_sigterm(&child);
        let outcome = wait_exit(&mut child, Duration::from_secs(15));
        let log = std::fs::read_to_string(p.dir.join(format!("timerd-{}.log", i + 1)))
            .unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        assert!(
            matches!(outcome, Some(s) if s.success()),
            "timerd {} on SIGTERM: {outcome:?} (None: still running after 15 s); log tail, newest first:\n{}",
            i + 1,
            tail.join("\n")
        );
    }
}

/// Schedules batches of 50 timers (due ~1 s ahead) until `stop`, each through the next node
/// that answers; a failed batch is retried with the same ids (idempotent) until acknowledged.
/// Returns the acknowledged ids.
async fn rolling_load(
    addrs: Vec<String>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<String> {
    let mut acked = Vec::new();
    let mut turn = 0usize;
    let mut batch = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let ids: Vec<String> = (0..50).map(|i| format!("r{batch}-{i}")).collect();
        let base = now_ms() + 1_000;
        loop {
            turn += 1;
            let Some(ch) = channel(&addrs[turn % addrs.len()]).await else {
                continue;
            };
            let timers = ids
                .iter()
                .enumerate()
                .map(|(i, id)| schedule_req(id, base + i as i64 * 10))
                .collect();
            let req = pb::ScheduleBatchRequest { timers };
            if TimersClient::new(ch).schedule_batch(req).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        acked.extend(ids);
        batch += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_loses_nothing_and_fires_nothing_twice() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (mut procs, peers) = start_three(&tmp);
    leader(&procs).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addrs = procs.iter().map(|p| p.addr.clone()).collect();
    let loader = tokio::spawn(rolling_load(addrs, stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Phase 1: restart each node in turn with SIGTERM, the leader included, under load.
    let mut handed_over = 0;
    for i in 0..3 {
        let was_leader = status(&procs[i].addr)
            .await
            .is_some_and(|s| s.role == "leader");
        let mut child = procs[i].child.take().unwrap();
        send_sigterm(&child);
        let outcome = wait_exit(&mut child, Duration::from_secs(15));
        assert!(
            matches!(outcome, Some(s) if s.success()),
            "node {}: {outcome:?}",
            i + 1
        );
        let log = std::fs::read_to_string(procs[i].dir.join(format!("timerd-{}.log", i + 1)))
            .unwrap_or_default();
        if was_leader {
            assert!(
                log.contains("leadership handed over"),
                "leader {} stopped without handing over; log:\n{log}",
                i + 1
            );
            handed_over += 1;
        }
        leader(&procs).await;
        procs[i].child = Some(spawn(i as u64 + 1, &procs[i], &peers));
        // Caught up: it applied at least what the leader had when it came back.
        let l = leader(&procs).await;
        let target = status(&procs[l].addr).await.unwrap().applied_index;
        let deadline = Instant::now() + Duration::from_secs(30);
        while status(&procs[i].addr)
            .await
            .is_none_or(|s| s.applied_index < target)
        {
            assert!(Instant::now() < deadline, "node {} did not catch up", i + 1);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(handed_over >= 1, "the leader was never among the restarted");

    // Phase 2: every acknowledged timer fired, once, never early, and the replicas agree.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = loader.await.unwrap();
    assert!(acked.len() >= 1_000, "load barely ran: {}", acked.len());
    let l = leader(&procs).await;
    let mut client = TimersClient::new(channel(&procs[l].addr).await.unwrap());
    let fired = wait_fired(&mut client, acked.len(), Duration::from_secs(60)).await;
    let mut by_id = std::collections::HashMap::new();
    for t in &fired {
        assert!(t.fire_index > 0, "{} has no fire index", t.id);
        assert!(
            by_id.insert(t.id.clone(), t.fire_index).is_none(),
            "{} listed twice",
            t.id
        );
    }
    for id in &acked {
        assert!(
            by_id.contains_key(id),
            "acknowledged timer {id} did not fire"
        );
    }
    assert_eq!(
        fired.len(),
        acked.len(),
        "timers fired that were never acknowledged"
    );
    same_digests(&procs, Duration::from_secs(30)).await;
}
