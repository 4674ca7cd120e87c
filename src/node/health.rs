//! Whether this node can serve a request soon and correctly: the judgement behind
//! `grpc.health.v1` (`api/services/health.rs` reports it; its essay says what SERVING promises).
//!
//! Serving means: it knows a leader (itself, or another it heard from within
//! [`LEADER_SILENT`]) and it has applied everything it knew to be committed one check ago.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::ServerState;

use super::Node;

/// How long a follower may go without an AppendEntries (a heartbeat is every 100 ms) before it
/// counts as knowing no leader: as long as a leader goes without its quorum before it refuses.
pub const LEADER_SILENT: Duration = super::QUORUM_LOST_AFTER;

impl Node {
    /// Whether this node should report SERVING, given the commit index it knew one check ago
    /// (a busy leader's commit index is always a few entries ahead of apply: compared with the
    /// current one, the answer would flap under load).
    pub fn serving(&self, committed_before: u64) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let has_leader = match (m.state, m.current_leader) {
            (ServerState::Leader, Some(_)) => true,
            (ServerState::Follower | ServerState::Learner, Some(leader)) => {
                self.levels.heard_within(leader, LEADER_SILENT)
            }
            _ => false,
        };
        let applied = m.last_applied.map_or(0, |l| l.index);
        has_leader && applied >= committed_before
    }

    /// The commit index as this node knows it.
    pub fn commit_index(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }
}
