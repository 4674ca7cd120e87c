//! The client `Cluster` service: this node's view of itself and its cluster, and the digest of
//! its state machine (what the chaos checker compares across replicas).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::pb::{self, cluster_server};
use crate::node::Node;

/// Serves Cluster.Status and Cluster.Digest.
pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    pub fn new(node: Arc<Node>) -> Self {
        ClusterService { node }
    }
}

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
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
            members: s
                .members
                .into_iter()
                .map(|(node_id, addr, voter)| pb::Member {
                    node_id,
                    addr,
                    voter,
                })
                .collect(),
            pending_timers: s.pending_timers,
            time_cursor_ms: s.time_cursor_ms,
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
}
