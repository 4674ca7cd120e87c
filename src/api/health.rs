//! `grpc.health.v1` for load balancers, supervisors and generic tools (grpc_health_probe,
//! grpcurl, Kubernetes' gRPC probes).
//!
//! A node answers SERVING only when a request sent to it can be served soon and correctly:
//! - it knows a leader (itself or another node), so writes and reads have somewhere to go; and
//! - its state machine has applied everything it knows to be committed, so what it reads
//!   locally is not behind (a follower catching up after a restart, or installing a snapshot,
//!   is NOT_SERVING until it is done).
//!
//! The status is the same for the whole server (service name "") and for each timerdb service.
//! It is recomputed whenever openraft's metrics change, and at least every `RECHECK`, because
//! the commit index can move without a metrics change.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::node::Node;

/// The services whose status is reported besides the whole server's ("").
pub const SERVICES: [&str; 3] = [
    "timerdb.v1.Timers",
    "timerdb.v1.Namespaces",
    "timerdb.v1.Cluster",
];

/// Longest time between two checks when nothing in the metrics changes.
const RECHECK: Duration = Duration::from_millis(250);

/// Whether `node` should report SERVING now.
pub fn serving(node: &Node) -> bool {
    let metrics = node.raft.metrics();
    let m = metrics.borrow();
    let has_leader = m.current_leader.is_some()
        && matches!(
            m.state,
            ServerState::Leader | ServerState::Follower | ServerState::Learner
        );
    let applied = m.last_applied.map_or(0, |l| l.index);
    has_leader && applied >= node.committed.load(Ordering::Relaxed)
}

/// Keeps `reporter` up to date with [`serving`] until the node shuts down.
pub async fn report(node: Arc<Node>, reporter: HealthReporter) {
    let mut metrics = node.raft.metrics();
    let mut shutdown = node.shutdown.clone();
    let mut last = None;
    loop {
        let now = serving(&node);
        if last != Some(now) {
            set_all(&reporter, now).await;
            tracing::info!(serving = now, "health");
            last = Some(now);
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(RECHECK) => {}
            _ = stopping(&mut shutdown) => break,
        }
    }
    set_all(&reporter, false).await;
}

async fn set_all(reporter: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    for service in SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
