//! The load a seed runs beside the chaos workload's workers and consumers: a sparse namespace
//! under a misfire policy, a consumer slow to ack, and the namespaces' policies they need.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use timerdb::api::pb::{self, namespaces_client::NamespacesClient, timers_client::TimersClient};
use timerdb_client::Conn;
use timerdb_harness::simulated::SimCluster;
use timerdb_harness::workload::NAMESPACE;
use tokio::sync::watch;

/// A namespace of few timers nobody consumes, under a misfire policy: fired late (a fault),
/// a timer expires in place, behind the fire cursor; moved later soon after it was scheduled,
/// it leaves an early head in the long-running nodes' caches. What a node-local cache that
/// decides a write gets wrong after a restart (issue 33 finding 1) shows here, as digests
/// that differ. The chaos checker does not judge these timers (their namespace is not its).
const SPARSE: &str = "sparse";

pub(crate) async fn sparse(
    clients: Vec<(u64, TimersClient<Conn>)>,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_5a45e);
    let mut n = 0u64;
    while !*stop.borrow() {
        let (_, mut client) = clients[rng.random_range(0..clients.len())].clone();
        n += 1;
        let id = format!("s{n}");
        let at = timerdb_harness::workload::now_ms() + rng.random_range(200..2_000);
        let req = pb::ScheduleRequest {
            namespace: SPARSE.into(),
            id: id.clone(),
            when: Some(pb::schedule_request::When::FireAtMs(at)),
            ..Default::default()
        };
        let _ = client.schedule(req).await;
        if rng.random_range(0..3) == 0 {
            let later = pb::RescheduleRequest {
                namespace: SPARSE.into(),
                id,
                when: Some(pb::reschedule_request::When::FireAtMs(at + 30_000)),
                ..Default::default()
            };
            let _ = client.reschedule(later).await;
        }
        let pause = Duration::from_millis(rng.random_range(300..1_500));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
}

/// The sparse namespace's one consumer: room for one delivery, each acked after a while (so
/// that most Fire entries grant it nothing, and the fired rows behind the cursor are passed by
/// pass leases), through any node.
pub(crate) async fn slow_consumer(
    clients: Vec<(u64, TimersClient<Conn>)>,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x510_c0de);
    while !*stop.borrow() {
        let (_, mut client) = clients[rng.random_range(0..clients.len())].clone();
        let sub = pb::SubscribeRequest {
            namespace: SPARSE.into(),
            consumer: "slow".into(),
            max_in_flight: 1,
        };
        let opened = tokio::select! {
            r = client.subscribe(sub) => r,
            _ = stop.changed() => return,
        };
        if let Ok(stream) = opened {
            let mut stream = stream.into_inner();
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    _ = stop.changed() => return,
                };
                let Ok(Some(d)) = msg else { break };
                let Some(t) = d.timer else { continue };
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..1_500))).await;
                let (_, mut any) = clients[rng.random_range(0..clients.len())].clone();
                let ack = pb::AckRequest {
                    namespace: SPARSE.into(),
                    id: t.id,
                    attempt: d.attempt,
                    // Both paths: answered once applied, or once queued on the leader.
                    wait_for_commit: rng.random_bool(0.5),
                };
                let _ = any.ack(ack).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub(crate) async fn configure(c: &SimCluster) -> anyhow::Result<()> {
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 3_000,
        max_attempts: 1_000,
        backoff_min_ms: 200,
        backoff_max_ms: 2_000,
        retention_ms: 24 * 3600 * 1000,
        ..Default::default()
    };
    let sparse = pb::NamespacePolicy {
        max_lateness_ms: 300,
        misfire: pb::MisfireAction::Skip as i32,
        retention_ms: 2_000,
        ack_timeout_ms: 1_000,
        backoff_min_ms: 100,
        backoff_max_ms: 500,
        max_attempts: 1_000,
        ..Default::default()
    };
    let mut ns = NamespacesClient::new(c.conn(1));
    for (name, policy) in [(NAMESPACE, policy), (SPARSE, sparse)] {
        let req = pb::PutNamespaceRequest {
            name: name.into(),
            policy: Some(policy),
        };
        let mut done = false;
        for _ in 0..20 {
            if ns.put_namespace(req.clone()).await.is_ok() {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !done {
            anyhow::bail!("could not configure namespace {name}");
        }
    }
    Ok(())
}
