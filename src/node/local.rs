//! What this node has applied, read locally: not linearizable, and meant to be so — the
//! access state every request is authorized against (the leader's, once its own term's first
//! entry applied: `leading`), the digest replicas are compared by, and the node's Status.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use openraft::ServerState;

use super::Node;
use crate::auth::AccessState;
use crate::raft_types::NodeId;
use crate::Result;

/// This node's view of itself and its cluster, for Status.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    pub id: NodeId,
    pub role: &'static str,
    pub leader_id: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// (id, address, voter)
    pub members: Vec<(NodeId, String, bool)>,
    pub pending_timers: u64,
    pub time_cursor_ms: i64,
    pub commit_index: u64,
    /// Last index the current snapshot covers (0: none).
    pub snapshot_index: u64,
    /// Log entries up to here are purged (0: none).
    pub purged_index: u64,
    pub snapshots_built: u64,
    pub snapshots_installed: u64,
    /// Keys the state machine wrote since this node started.
    pub state_machine_keys_written: u64,
    /// FIRED → ACKED transitions applied since this node started.
    pub timers_acked: u64,
    /// Timers fired since this node started: (count, lateness sum ms, cumulative counts at
    /// each bound of `metrics::FIRE_LATENESS_BOUNDS_MS`, then all).
    pub fired: (u64, u64, Vec<u64>),
    /// Calls this node forwarded to another node's leader since it started (node-wide: set
    /// by `Nodes::status`).
    pub calls_forwarded: u64,
}

impl NodeStatus {
    /// Adds `other`'s timer counts (pending, fired, acked, keys written) to these: a node's
    /// Status sums them over every group it hosts.
    pub fn add_counts(&mut self, other: &NodeStatus) {
        self.pending_timers += other.pending_timers;
        self.state_machine_keys_written += other.state_machine_keys_written;
        self.timers_acked += other.timers_acked;
        self.fired.0 += other.fired.0;
        self.fired.1 += other.fired.1;
        let le = &mut self.fired.2;
        le.resize(le.len().max(other.fired.2.len()), 0);
        for (sum, n) in le.iter_mut().zip(&other.fired.2) {
            *sum += n;
        }
    }

    /// The address the group's leader serves on, when this node knows it.
    pub fn leader_addr(&self) -> Option<&str> {
        let leader = self.leader_id?;
        let member = self.members.iter().find(|m| m.0 == leader)?;
        Some(&member.1)
    }
}

impl Node {
    /// The API keys, roles and bindings as this node applied them.
    pub fn access(&self) -> Arc<AccessState> {
        self.store.access()
    }

    /// Notified whenever an applied entry changes the access state.
    pub fn access_changes(&self) -> Arc<tokio::sync::Notify> {
        self.store.access_changes()
    }

    /// (applied index, digest of the state machine): equal on replicas that applied the same
    /// entries.
    pub fn digest(&self) -> Result<(u64, u64)> {
        self.store.digest()
    }

    /// This node's view of the cluster (local, not linearizable).
    pub fn status(&self) -> Result<NodeStatus> {
        let m = self.raft.metrics().borrow_watched().clone();
        let sm = self.store.meta()?;
        let members = self.members();
        Ok(NodeStatus {
            id: self.id,
            role: role_name(m.state),
            leader_id: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            members,
            pending_timers: sm.pending,
            time_cursor_ms: sm.cursor_ms,
            commit_index: self.committed.load(Ordering::Relaxed),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            snapshots_built: self.snapshots.stats.built.load(Ordering::Relaxed),
            snapshots_installed: self.snapshots.stats.installed.load(Ordering::Relaxed),
            state_machine_keys_written: self.store.keys_written(),
            timers_acked: self.store.acked(),
            fired: self.store.fire_stats().read(),
            calls_forwarded: 0,
        })
    }
}

fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Learner => "learner",
        ServerState::Candidate => "candidate",
        ServerState::Shutdown => "shutdown",
    }
}
