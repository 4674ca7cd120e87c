//! The server side of the peer network: the internal `timerdb.v1.Raft` service.
//!
//! Decodes openraft's request, hands it to the local Raft, and returns the bincode of the whole
//! `Result`, so the caller ([`crate::cluster::network`]) gets remote Raft errors typed. A body
//! that does not decode is INVALID_ARGUMENT: only another timerdb node of this build calls here.

use tonic::{Request, Response, Status};

use super::pb::{raft_server, RaftMessage};
use crate::cluster::Raft;
use crate::storage::{decode, encode};

/// Serves Raft RPCs from peers.
pub struct PeerService {
    raft: Raft,
}

impl PeerService {
    pub fn new(raft: Raft) -> Self {
        PeerService { raft }
    }
}

fn body<T: serde::de::DeserializeOwned>(req: Request<RaftMessage>) -> Result<T, Status> {
    decode(&req.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

fn reply<T: serde::Serialize>(value: &T) -> Result<Response<RaftMessage>, Status> {
    Ok(Response::new(RaftMessage {
        data: encode(value),
    }))
}

#[tonic::async_trait]
impl raft_server::Raft for PeerService {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = body(req)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc = body(req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn timeout_now(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let term: u64 = body(req)?;
        let current = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_term, m.state)
        };
        // Only a follower of the leader's term stands: a stale request changes nothing.
        let stand = current == (term, openraft::ServerState::Follower);
        if stand {
            tracing::info!(term, "TimeoutNow: standing for election");
            self.raft
                .trigger()
                .elect()
                .await
                .map_err(|e| Status::unavailable(format!("raft stopped: {e}")))?;
        }
        reply(&stand)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = body(req)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }
}
