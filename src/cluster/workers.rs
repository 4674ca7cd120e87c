//! The leader's workers: how each (the fire driver, the dispatcher, the purger, the level
//! raiser, the pusher) runs only while its node leads.
//!
//! [`while_leader`] watches openraft's role metrics, starts the worker once the node leads and
//! has applied every entry of earlier terms (so it reads the whole committed state), drops it
//! the moment leadership is lost or the term changes, and ends when Raft stops or the node
//! shuts down. Invariant: at most one run of a worker per leadership, and none on a node that
//! does not lead (a worker's awaits are cancel-safe, so dropping it mid-way is harmless).

use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use openraft::ServerState;
use tokio::sync::watch;

use super::Raft;
use crate::raft_types::NodeId;

/// Pause after a failed read barrier before the worker tries again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Runs `lead()` whenever node `id` leads and has applied everything committed before, dropping
/// it as soon as leadership is lost and calling it again if it returns; returns when `shutdown`
/// turns true. `what` names the worker in logs.
pub async fn while_leader<F: std::future::Future<Output = ()>>(
    id: NodeId,
    raft: &Raft,
    what: &str,
    mut shutdown: watch::Receiver<bool>,
    mut lead: impl FnMut() -> F,
) {
    // The role only: see `ServerMetricsRx`. Raft stopping closes it (`Err`).
    let mut metrics = raft.server_metrics();
    loop {
        // (Server metrics never say `Shutdown`: their channel closing is the stop.)
        let leads =
            |m: &ServerMetrics| m.state == ServerState::Leader && m.current_leader == Some(id);
        let ended = |closed: bool| closed || stopped(&raft.metrics().borrow_watched());
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            r = metrics.wait_until(leads) => if ended(r.is_err()) { break },
        }
        tracing::info!(id, "became leader: {what} starts");
        // A new term ends this leadership even if this node leads again in it before the
        // watcher looks (Leader, Follower, Leader would otherwise read as "still Leader").
        // The leader id, not the whole vote: the metrics can show a new leader's vote before
        // and after it is marked committed, and that is one leadership, not two.
        let term = *metrics.borrow_watched().vote.leader_id();
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            r = metrics.wait_until(|m| m.state != ServerState::Leader || *m.vote.leader_id() != term) => {
                if ended(r.is_err()) { break }
            }
            _ = caught_up_then(raft, what, &mut lead) => {}
        }
        tracing::info!(id, "{what} stops leading");
    }
    // Raft stopped on a fatal error (e.g. the disk is full): nothing to lead any more.
    tracing::error!(id, "{what} stops: Raft has stopped");
}

type RaftMetrics = crate::raft_types::RaftMetrics;
type ServerMetrics = openraft::metrics::RaftServerMetrics<crate::raft_types::TypeConfig>;

/// Whether Raft has stopped for good (a fatal error, or shut down).
pub fn stopped(m: &RaftMetrics) -> bool {
    m.running_state.is_err() || m.state == ServerState::Shutdown
}

/// Runs `lead()` once every entry of earlier terms is applied (`ensure_linearizable`), so the
/// worker reads the whole committed state; after a failure, pauses and returns.
async fn caught_up_then<F: std::future::Future<Output = ()>>(
    raft: &Raft,
    what: &str,
    lead: &mut impl FnMut() -> F,
) {
    match raft
        .ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)
        .await
    {
        Ok(_) => lead().await,
        Err(e) => {
            tracing::warn!(error = %e, "{what}: not yet able to read; retrying");
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}
