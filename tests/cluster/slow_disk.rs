//! A follower whose disk stalls: every log fsync of it takes 2 s longer, as this machine's
//! shared disk was measured to take while gigabytes of writeback went on beside it. openraft
//! 0.10 does not stop a node in an fsync (0.9's core awaited every one, missed heartbeats, and
//! its leader's quorum check tripped): the leader keeps its quorum with the other follower, no
//! client sees an error, the leader stays, and the slow follower catches up once its disk
//! does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use tokio::time::Instant;

use crate::harness::*;

/// How long the clients write while the disk is slow.
const LOAD: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_with_a_two_second_fsync_costs_the_clients_nothing() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let slow = c.follower().await;
    let fast = *c
        .running()
        .iter()
        .find(|id| ![leader, slow].contains(id))
        .unwrap();
    let term = c.node(leader).raft.metrics().borrow_watched().current_term;
    c.node(slow).fsync_delay_ms.store(2000, Ordering::Relaxed);

    // Eight writers for eight seconds, half through the leader, half forwarded by the fast
    // follower; every error counts.
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = Instant::now() + LOAD;
    let mut writers = Vec::new();
    for w in 0..8u64 {
        let mut client = c.client(if w % 2 == 0 { leader } else { fast }).await;
        let (ok, errors) = (ok.clone(), errors.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < until {
                let req = schedule_req(&format!("w{w}-{i}"), now_ms() + 3_600_000);
                match client.schedule(req).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("writer {w}: {}", status_text(&e));
                        errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
                i += 1;
            }
        }));
    }
    // The slow follower does fall behind (the fault is real): sampled during the load.
    let mut lag = 0u64;
    while Instant::now() < until {
        let applied = |id: u64| {
            let m = c.node(id).raft.metrics();
            let a = m.borrow_watched().last_applied.map_or(0, |l| l.index);
            a
        };
        lag = lag.max(applied(leader).saturating_sub(applied(slow)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in writers {
        w.await.unwrap();
    }
    let (ok, errors) = (ok.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    eprintln!("{ok} writes, {errors} errors, the slow follower up to {lag} entries behind");
    assert!(
        lag > 0,
        "the slow follower never fell behind: the fault did nothing"
    );
    assert!(ok > 100, "only {ok} writes in {LOAD:?}");
    assert_eq!(
        errors, 0,
        "clients saw errors while one follower's disk was slow"
    );
    let m = c.node(leader).raft.metrics().borrow_watched().clone();
    assert_eq!(
        (m.current_leader, m.current_term),
        (Some(leader), term),
        "the leader changed"
    );

    // The disk recovers; the follower catches up with the others.
    c.node(slow).fsync_delay_ms.store(0, Ordering::Relaxed);
    c.converged().await;
    c.shutdown().await;
}
