//! The client `Cluster` service: this node's view of itself and its cluster, the digest of its
//! state machine (what the chaos checker compares across replicas), and membership and
//! leadership changes, which run on the leader (forwarded like writes, see [`super::forward`]),
//! and backups, streamed from the leader ([`super::backup`]).

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::backup;
use super::forward::{self, Router};
use super::pb::{self, cluster_client::ClusterClient, cluster_server};
use crate::membership::Member;
use crate::node::Node;

/// How long a forwarded AddNode may take: the new node catches up first (up to a minute).
const ADD_NODE_TIMEOUT: Duration = Duration::from_secs(70);

/// Serves the Cluster service on one node.
pub struct ClusterService {
    node: Arc<Node>,
    router: Router,
}

impl ClusterService {
    pub fn new(node: Arc<Node>) -> Self {
        ClusterService {
            router: Router::new(node.clone()),
            node,
        }
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

fn client(ch: Channel) -> ClusterClient<Channel> {
    ClusterClient::new(ch)
}

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
    type BackupStream = backup::BackupStream;

    async fn backup(
        &self,
        request: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let node = self.node.as_ref();
        let stream = self
            .router
            .route(
                forwarded,
                move || async move { Ok(backup::stream(node.id, node.backup().await?)) },
                move |ch| async move {
                    let r = forward::stream_request(pb::BackupRequest {});
                    let reply = client(ch).backup(r).await?;
                    Ok(reply.map(|s| Box::pin(s) as backup::BackupStream))
                },
            )
            .await?;
        Ok(Response::new(stream))
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
        }))
    }

    async fn digest(
        &self,
        _req: Request<pb::DigestRequest>,
    ) -> Result<Response<pb::DigestResponse>, Status> {
        let (applied_index, digest) = self.node.store.digest()?;
        Ok(Response::new(pb::DigestResponse {
            node_id: self.node.id,
            applied_index,
            digest,
        }))
    }

    async fn add_node(
        &self,
        request: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::AddNodeResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let node = self.node.as_ref();
        let req = &req;
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let members = node
                        .add_node(req.node_id, req.addr.clone(), !req.learner)
                        .await?;
                    Ok(pb::AddNodeResponse {
                        members: members_pb(members),
                    })
                },
                move |ch| async move {
                    let r = forward::request(req.clone(), ADD_NODE_TIMEOUT);
                    client(ch).add_node(r).await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let node = self.node.as_ref();
        let (req, timeout) = (&req, self.router.forward_timeout());
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let members = node.remove_node(req.node_id).await?;
                    Ok(pb::RemoveNodeResponse {
                        members: members_pb(members),
                    })
                },
                move |ch| async move {
                    let r = forward::request(*req, timeout);
                    client(ch).remove_node(r).await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        let forwarded = forward::is_forwarded(&request);
        let req = request.into_inner();
        let node = self.node.as_ref();
        let (req, timeout) = (&req, self.router.forward_timeout());
        let to = (req.node_id != 0).then_some(req.node_id);
        let reply = self
            .router
            .route(
                forwarded,
                move || async move {
                    let leader_id = node.transfer_leader(to).await?;
                    Ok(pb::TransferLeaderResponse { leader_id })
                },
                move |ch| async move {
                    let r = forward::request(*req, timeout);
                    client(ch).transfer_leader(r).await
                },
            )
            .await?;
        Ok(Response::new(reply))
    }
}
