//! `grpc.health.v1` for load balancers, supervisors and generic tools (grpc_health_probe,
//! grpcurl, Kubernetes' gRPC probes).
//!
//! The judgement is the node's (`Node::serving`); this module reports it. A node answers
//! SERVING only when a request sent to it can be served soon and correctly:
//! - it knows a leader (itself or another node) and, on a follower, heard from it within
//!   [`crate::node::LEADER_SILENT`], so writes and reads have somewhere to go (with Pre-Vote a node cut off
//!   from the others never campaigns, so openraft goes on naming the leader it lost); and
//! - its state machine has applied everything it knows to be committed, so what it reads
//!   locally is not behind (a follower catching up after a restart, or installing a snapshot,
//!   is NOT_SERVING until it is done).
//!
//! "Applied everything committed" is judged against the commit index of the previous check,
//! one `CHECK_EVERY` ago: on a busy leader the commit index is always a few entries ahead of
//! apply, and comparing with the current one would flap under load; a node that is really
//! behind (restarted, installing a snapshot) has not reached even that.
//!
//! The status is the same for the whole server (service name "") and for each timerdb service.
//! It is sampled every `CHECK_EVERY` rather than on every metrics change, which under load is
//! every apply.

use std::sync::Arc;
use std::time::Duration;

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::api::services::subscribe::stopping;
use crate::node::Node;

/// The services whose status is reported besides the whole server's ("").
pub const SERVICES: [&str; 3] = [
    "timerdb.v1.Timers",
    "timerdb.v1.Namespaces",
    "timerdb.v1.Cluster",
];

/// How often the status is checked.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// Keeps `reporter` up to date with [`serving`] until the node shuts down.
pub async fn report(node: Arc<Node>, reporter: HealthReporter) {
    let mut shutdown = node.shutdown_watch();
    let mut committed_before = node.commit_index();
    let mut last = None;
    loop {
        let now = node.serving(committed_before);
        if last != Some(now) {
            set_all(&reporter, now).await;
            tracing::info!(serving = now, "health");
            last = Some(now);
        }
        committed_before = node.commit_index();
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
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
