//! The once-a-second gauge sampler: Raft term, leader and log positions from openraft's
//! metrics, snapshot counters, PENDING timers and the paused flag per namespace from the store.
//! Apart from `metrics` (which names and exports every metric) because it reads a whole
//! `Node`, which sits above `metrics` in the layering.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge};

use super::Node;

/// Sets the gauges from `node` every second until `shutdown`.
pub async fn sample_loop(node: Arc<Node>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => sample(&node),
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

fn sample(node: &Node) {
    let m = node.raft.metrics().borrow_watched().clone();
    let applied = m.last_applied.map_or(0, |l| l.index);
    let commit = node.committed.load(Ordering::Relaxed).max(applied);
    let last = m.last_log_index.unwrap_or(0);
    let purged = m.purged.map_or(0, |l| l.index);
    gauge!("timerdb_raft_term").set(m.current_term as f64);
    gauge!("timerdb_raft_leader_id").set(m.current_leader.unwrap_or(0) as f64);
    let leading = m.current_leader == Some(node.id) && m.state.is_leader();
    gauge!("timerdb_raft_is_leader").set(if leading { 1.0 } else { 0.0 });
    gauge!("timerdb_raft_last_log_index").set(last as f64);
    gauge!("timerdb_raft_commit_index").set(commit as f64);
    gauge!("timerdb_raft_applied_index").set(applied as f64);
    gauge!("timerdb_raft_apply_lag_entries").set(commit.saturating_sub(applied) as f64);
    gauge!("timerdb_raft_log_entries").set(last.saturating_sub(purged) as f64);
    gauge!("timerdb_raft_log_bytes").set(node.log.used_bytes() as f64);
    let stats = &node.snapshots.stats;
    counter!("timerdb_snapshots_built_total").absolute(stats.built.load(Ordering::Relaxed));
    counter!("timerdb_snapshots_installed_total").absolute(stats.installed.load(Ordering::Relaxed));
    gauge!("timerdb_snapshot_last_index").set(m.snapshot.map_or(0, |l| l.index) as f64);
    gauge!("timerdb_snapshot_bytes").set(stats.last_bytes.load(Ordering::Relaxed) as f64);
    match node.store.pending_by_namespace() {
        Ok(counts) => {
            for (ns, n) in counts {
                gauge!("timerdb_pending_timers", "namespace" => ns).set(n as f64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read pending counts for metrics"),
    }
    match node.store.namespaces(None, 10_000) {
        Ok(list) => {
            for ns in list {
                let paused = if ns.policy.paused { 1.0 } else { 0.0 };
                gauge!("timerdb_namespace_paused", "namespace" => ns.name).set(paused);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read namespaces for metrics"),
    }
}
