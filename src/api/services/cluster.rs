//! The client `Cluster` service: this node's view of itself and its cluster, the digest of its
//! state machine (what the chaos checker compares across replicas), and membership and
//! leadership changes, which run on the leader (forwarded like writes, see [`crate::api::stack::forward`]),
//! and backups, streamed from the leader ([`crate::api::services::backup`]; a follower relays the stream).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::api::pb::{self, cluster_server};
use crate::api::services::backup;
use crate::node::Member;
use crate::node::Node;

/// Serves the Cluster service on one node.
pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    pub fn new(node: Arc<Node>) -> Self {
        ClusterService { node }
    }
}

fn members_pb(members: Vec<Member>) -> Vec<pb::Member> {
    members
        .into_iter()
        .map(|(node_id, addr, voter)| pb::Member {
            node_id,
            addr,
            voter,
        })
        .collect()
}

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
    type BackupStream = backup::BackupStream;

    async fn backup(
        &self,
        _request: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let snapshot = self.node.backup().await?;
        Ok(Response::new(backup::stream(self.node.id(), snapshot)))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let s = self.node.status()?;
        Ok(Response::new(pb::StatusResponse {
            node_id: s.id,
            role: s.role.to_string(),
            leader_id: s.leader_id.unwrap_or(0),
            term: s.term,
            last_log_index: s.last_log_index,
            applied_index: s.applied_index,
            members: members_pb(s.members),
            pending_timers: s.pending_timers,
            time_cursor_ms: s.time_cursor_ms,
            commit_index: s.commit_index,
            snapshot_index: s.snapshot_index,
            purged_index: s.purged_index,
            snapshots_built: s.snapshots_built,
            snapshots_installed: s.snapshots_installed,
            state_machine_keys_written: s.state_machine_keys_written,
            timers_acked: s.timers_acked,
            timers_fired: s.fired.0,
            fire_lateness_sum_ms: s.fired.1,
            fire_lateness_le: s.fired.2,
        }))
    }

    async fn overview(
        &self,
        req: Request<pb::OverviewRequest>,
    ) -> Result<Response<pb::OverviewResponse>, Status> {
        let o = self.node.overview(req.into_inner().by_state)?;
        let members = o.members.into_iter().map(|m| pb::MemberProgress {
            node_id: m.id,
            addr: m.addr,
            voter: m.voter,
            leader: m.leader,
            matched_index: m.matched_index,
            lag: m.lag,
        });
        let namespaces = o.namespaces.into_iter().map(|n| pb::NamespaceCounts {
            name: n.name,
            pending: n.pending,
            stored: n.stored,
            configured: n.configured,
            paused: n.paused,
            by_state: n
                .by_state
                .unwrap_or_default()
                .into_iter()
                .map(|(state, count)| pb::StateCount {
                    state: crate::api::convert::state_to_pb(state) as i32,
                    count,
                })
                .collect(),
            by_state_partial: n.by_state_partial,
        });
        Ok(Response::new(pb::OverviewResponse {
            leader_id: o.leader_id.unwrap_or(0),
            term: o.term,
            last_log_index: o.last_log_index,
            commit_index: o.commit_index,
            applied_index: o.applied_index,
            members: members.collect(),
            namespaces: namespaces.collect(),
        }))
    }

    async fn digest(
        &self,
        _req: Request<pb::DigestRequest>,
    ) -> Result<Response<pb::DigestResponse>, Status> {
        let (applied_index, digest) = self.node.digest()?;
        Ok(Response::new(pb::DigestResponse {
            node_id: self.node.id(),
            applied_index,
            digest,
        }))
    }

    async fn add_node(
        &self,
        request: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::AddNodeResponse>, Status> {
        let req = request.into_inner();
        let members = self
            .node
            .add_node(req.node_id, req.addr, !req.learner)
            .await?;
        Ok(Response::new(pb::AddNodeResponse {
            members: members_pb(members),
        }))
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let members = self.node.remove_node(request.get_ref().node_id).await?;
        Ok(Response::new(pb::RemoveNodeResponse {
            members: members_pb(members),
        }))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        let node_id = request.get_ref().node_id;
        let to = (node_id != 0).then_some(node_id);
        let leader_id = self.node.transfer_leader(to).await?;
        Ok(Response::new(pb::TransferLeaderResponse { leader_id }))
    }
}
