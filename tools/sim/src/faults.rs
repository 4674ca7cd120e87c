//! The faults a seed's plan draws (`Fault`), injected on the simulated cluster for a span and
//! healed: crashes, isolated nodes, slow or lossy links, a leader restarted with a skewed clock.

use std::time::Duration;

use timerdb::api::pb::{self, cluster_client::ClusterClient};
use timerdb::sim::Link;
use timerdb_harness::simulated::{SimCluster, NODES};

/// A fault of the plan.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fault {
    CrashLeader,
    CrashFollower,
    IsolateLeader,
    IsolateFollower,
    /// Every link slower by this many ms, and as much again at random (chunks of different
    /// connections overtake each other).
    SlowLinks(u64),
    /// Every link breaks this many connections of 1,000 chunks (lost segments).
    LossyLinks(u32),
    /// The leader restarted with its clock this far off.
    SkewLeader(i64),
}

/// Applies `fault` for `span` and heals it; the node it hit.
pub(crate) async fn inject(
    c: &mut SimCluster,
    fault: Fault,
    span: Duration,
) -> anyhow::Result<u64> {
    let leader = c.leader();
    let follower = NODES
        .iter()
        .copied()
        .find(|n| Some(*n) != leader && c.node(*n).is_some());
    let pick = |leader_first: bool| match leader_first {
        true => leader.or(follower),
        false => follower.or(leader),
    };
    match fault {
        Fault::CrashLeader | Fault::CrashFollower => {
            let Some(n) = pick(matches!(fault, Fault::CrashLeader)) else {
                return Ok(0);
            };
            c.crash(n).await;
            tokio::time::sleep(span).await;
            c.start_node(n).await?;
            Ok(n)
        }
        Fault::IsolateLeader | Fault::IsolateFollower => {
            let Some(n) = pick(matches!(fault, Fault::IsolateLeader)) else {
                return Ok(0);
            };
            c.isolate(n, true);
            tokio::time::sleep(span).await;
            c.isolate(n, false);
            Ok(n)
        }
        Fault::SlowLinks(ms) => {
            c.set_all(Link {
                delay_ms: ms,
                jitter_ms: ms,
                ..Link::default()
            });
            tokio::time::sleep(span).await;
            c.set_all(Link::default());
            Ok(0)
        }
        Fault::LossyLinks(per_mille) => {
            c.set_all(Link {
                loss_per_mille: per_mille,
                ..Link::default()
            });
            tokio::time::sleep(span).await;
            c.set_all(Link::default());
            Ok(0)
        }
        Fault::SkewLeader(ms) => {
            let Some(n) = leader else { return Ok(0) };
            c.skew_ms.insert(n, ms);
            c.restart(n).await?;
            // And it leads again (a clock behind the cursor must not move it back).
            let mut cluster = ClusterClient::new(c.conn(n));
            let _ = cluster
                .transfer_leader(pb::TransferLeaderRequest {
                    node_id: n,
                    group: 0,
                })
                .await;
            tokio::time::sleep(span).await;
            c.skew_ms.insert(n, 0);
            c.restart(n).await?;
            Ok(n)
        }
    }
}

/// Every node running, every link healthy, every clock right.
pub(crate) async fn heal(c: &mut SimCluster) -> anyhow::Result<()> {
    c.set_all(Link::default());
    for n in NODES {
        c.isolate(n, false);
        if c.skew_ms[&n] != 0 {
            c.skew_ms.insert(n, 0);
            c.restart(n).await?;
        }
        if c.node(n).is_none() {
            c.start_node(n).await?;
        }
    }
    Ok(())
}
