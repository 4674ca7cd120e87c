//! The client `Cluster` service: this node's view of itself and its cluster, the digest of its
//! state machine (what the chaos checker compares across replicas), and membership and
//! leadership changes, which run on the leader (forwarded like writes, see [`crate::api::stack::forward`]),
//! and backups, streamed from the leader ([`crate::api::services::backup`]; a follower relays the stream).
//! With data groups: Status sums the timer counts over every group the node hosts, Slots
//! describes each group and the hash slots it owns, and TransferLeader names its group.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::api::pb::{self, cluster_server};
use crate::api::services::backup;
use crate::api::stack::group;
use crate::node::Member;
use crate::node::{Node, Nodes};

/// Serves the Cluster service on one node.
pub struct ClusterService {
    nodes: Arc<Nodes>,
    /// Group 0's door: members, backups, digests.
    node: Arc<Node>,
}

impl ClusterService {
    pub fn new(nodes: Arc<Nodes>) -> Self {
        let node = nodes.meta().clone();
        ClusterService { nodes, node }
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
        let s = self.nodes.status()?;
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
            calls_forwarded: s.calls_forwarded,
        }))
    }

    async fn overview(
        &self,
        req: Request<pb::OverviewRequest>,
    ) -> Result<Response<pb::OverviewResponse>, Status> {
        let o = self.node.overview(req.into_inner().by_state, &self.nodes)?;
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
            group: u32::from(n.group),
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
        let members = (self.nodes)
            .add_member(req.node_id, req.addr, !req.learner)
            .await?;
        Ok(Response::new(pb::AddNodeResponse {
            members: members_pb(members),
        }))
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let members = self.nodes.remove_member(request.get_ref().node_id).await?;
        Ok(Response::new(pb::RemoveNodeResponse {
            members: members_pb(members),
        }))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        // The grouping layer routed the call to the leader of the group it names; without
        // data groups every call is group 0's, and a group that does not exist is refused.
        let routed = group::of_request(&request);
        let (node_id, asked) = (request.get_ref().node_id, request.get_ref().group);
        let node = match self.nodes.group(routed) {
            Some(node) if u32::from(routed) == asked => node,
            _ => return Err(group::no_such_group(asked, self.nodes.map().groups())),
        };
        let to = (node_id != 0).then_some(node_id);
        let leader_id = node.transfer_leader(to).await?;
        Ok(Response::new(pb::TransferLeaderResponse {
            leader_id,
            group: asked,
        }))
    }

    async fn slots(
        &self,
        _req: Request<pb::SlotsRequest>,
    ) -> Result<Response<pb::SlotsResponse>, Status> {
        let groups = self.nodes.slots()?.into_iter().map(|g| pb::GroupInfo {
            group: u32::from(g.group),
            hash_slots: match g.owned.is_empty() {
                true => vec![],
                false => vec![pb::HashSlotRange {
                    start: g.owned.start,
                    end: g.owned.end,
                }],
            },
            leader_id: g.status.leader_id.unwrap_or(0),
            leader_addr: g.status.leader_addr().unwrap_or_default().to_string(),
            term: g.status.term,
            role: g.status.role.to_string(),
            last_log_index: g.status.last_log_index,
            applied_index: g.status.applied_index,
            pending_timers: g.status.pending_timers,
            members: members_pb(g.status.members),
        });
        Ok(Response::new(pb::SlotsResponse {
            node_id: self.node.id(),
            epoch: self.nodes.map().epoch(),
            hash_slots: crate::keys::HASH_SLOTS,
            groups: groups.collect(),
        }))
    }
}
