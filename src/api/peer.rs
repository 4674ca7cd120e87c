//! The server side of the peer network: the internal `timerdb.v1.Raft` service.
//!
//! Decodes openraft's request, hands it to the local Raft, and returns the bincode of the whole
//! `Result`, so the caller ([`crate::cluster::network`]) gets remote Raft errors typed. A body
//! that does not decode is INVALID_ARGUMENT: only another timerdb node of this build calls here.
//! A call from a node of another bucket width is FAILED_PRECONDITION, before anything is
//! decoded or appended (`Store::adopt_width`).

use openraft::raft::AppendEntriesRequest;
use tonic::{Request, Response, Status};

use super::pb::{raft_server, RaftMessage};
use crate::cluster::network::BUCKET_MS_HEADER;
use crate::cluster::{Raft, TypeConfig};
use crate::storage::Store;
use crate::storage::{decode, encode};

/// Serves Raft RPCs from peers.
pub struct PeerService {
    raft: Raft,
    store: Store,
}

impl PeerService {
    pub fn new(raft: Raft, store: Store) -> Self {
        PeerService { raft, store }
    }

    /// The sender's bucket width must be this node's (or becomes it: see `Store::adopt_width`).
    /// A call without the header comes from a build before it, which checked nothing: taken
    /// by a node that knows its width, refused by one that does not (a joining node), which
    /// could apply none of its entries and would stop at the first.
    fn check_width<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let Some(value) = req.metadata().get(BUCKET_MS_HEADER) else {
            if self.store.width_ms() == 0 {
                return Err(Status::failed_precondition(format!(
                    "this node joins without a bucket width and the peer sent none (a build \
                     before {BUCKET_MS_HEADER}): start it with --bucket-ms set to the cluster's"
                )));
            }
            return Ok(());
        };
        let width: u64 = value
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Status::invalid_argument(format!("bad {BUCKET_MS_HEADER} header")))?;
        let from = req
            .remote_addr()
            .map_or_else(|| "the peer".to_string(), |a| format!("the peer at {a}"));
        self.store.adopt_width(width, &from).map_err(|e| {
            tracing::error!("refused a peer: {e}");
            Status::failed_precondition(e.to_string())
        })
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
        self.check_width(&req)?;
        let rpc: AppendEntriesRequest<TypeConfig> = body(req)?;
        // openraft asserts (a panic of its core) that the entries follow `prev_log_id` one by
        // one: bytes from the network are checked here instead.
        let first = rpc.prev_log_id.map_or(0, |p| p.index + 1);
        for (i, entry) in rpc.entries.iter().enumerate() {
            if entry.log_id.index != first + i as u64 {
                return Err(Status::invalid_argument(format!(
                    "AppendEntries entry {i} has index {}, not {} (after {:?})",
                    entry.log_id.index,
                    first + i as u64,
                    rpc.prev_log_id
                )));
            }
        }
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_width(&req)?;
        let rpc = body(req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn hello(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_width(&req)?;
        if !req.get_ref().data.is_empty() {
            return Err(Status::invalid_argument("a Hello carries no body"));
        }
        Ok(Response::new(RaftMessage { data: Vec::new() }))
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
        self.check_width(&req)?;
        let rpc = body(req)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }
}
