//! The client side of the peer network: openraft's `RaftNetwork` over the internal
//! `timerdb.v1.Raft` gRPC service. openraft 0.10 calls a `RaftNetworkV2`; ours is still the v1
//! trait (chunked snapshots, `openraft-legacy`), wrapped in its `Adapter`, so the wire is the
//! one openraft 0.9 spoke.
//!
//! Each message is openraft's own request type, bincode-encoded in a `RaftMessage`; the reply is
//! the bincode of `Result<response, RaftError>`, so a remote Raft error comes back typed.
//!
//! Transport failures are told apart, because openraft treats them differently. A peer that
//! cannot be reached (connection refused or reset, peer down) is `Unreachable`: openraft backs
//! off for 500 ms ([`PeerClient::backoff`]) instead of hammering it. A peer that is reachable but did not answer in time
//! (the deadline passed) is a `Network` error, retried at once: openraft gives every
//! AppendEntries one heartbeat (100 ms), a follower busy appending a large batch under load
//! overruns it, and backing off for 500 ms each time stalled commits altogether (found by
//! `timerdb-bench`: writes timed out after 5 s at 20,000 fires/s and while loading 10,000,000
//! timers). Channels connect lazily and reconnect by themselves, so a restarted peer is picked
//! up without any bookkeeping here.

// openraft's trait signatures fix these (large) error types; helpers return them as they are.
#![allow(clippy::result_large_err)]
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::BasicNode;
use openraft_legacy::network_v1::{
    Adapter, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork,
};
use serde::{de::DeserializeOwned, Serialize};
use tonic::transport::Channel;

use super::{NodeId, TypeConfig};
use crate::api::pb::{raft_client::RaftClient, RaftMessage};
use crate::storage::{decode, encode};

/// Largest peer message accepted or sent: entries batch many timers with their payloads.
pub const MAX_PEER_MESSAGE_BYTES: usize = crate::storage::MAX_DECODE_BYTES;

/// The header every peer call carries: the sender's bucket width in ms (see `raft.proto`).
pub const BUCKET_MS_HEADER: &str = "x-timerdb-bucket-ms";

/// The header of a `Hello`: the calling leader's term (`storage/admission.rs`).
pub const TERM_HEADER: &str = "x-timerdb-term";

/// Makes a [`PeerClient`] per target node, dialling the configured override if there is one.
#[derive(Clone)]
pub struct Network {
    pub config: std::sync::Arc<crate::config::NodeConfig>,
    /// This node's state machine: its bucket width goes with every call.
    pub store: crate::storage::Store,
    /// The feature level each peer's answers advertise (`level.rs`).
    pub levels: std::sync::Arc<super::Levels>,
}

/// What openraft calls: our v1 client, adapted (snapshots go in chunks).
pub type PeerNetwork = Adapter<TypeConfig, PeerClient, crate::storage::SnapshotFile>;

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerNetwork {
        let addr = self.config.dial_addr(target, &node.addr);
        let levels = (self.levels.clone(), self.config.clone());
        Adapter::new(PeerClient::new(target, &addr, self.store.clone(), levels))
    }
}

/// A request to a peer, with this node's bucket width, feature level and tzdb version.
fn peer_request<T>(
    msg: T,
    store: &crate::storage::Store,
    config: &crate::config::NodeConfig,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(msg);
    let width = tonic::metadata::MetadataValue::from(store.width_ms());
    request.metadata_mut().insert(BUCKET_MS_HEADER, width);
    super::level::advertise(request.metadata_mut(), config.level, &config.tzdb);
    request
}

/// Asks the node at `addr` whether it can join this cluster (its bucket width agrees, or it
/// takes this one): before it is added, so a node that cannot is refused with the reason.
pub async fn hello(
    config: &crate::config::NodeConfig,
    (id, addr): (NodeId, &str),
    store: &crate::storage::Store,
    (term, levels): (u64, &super::Levels),
) -> crate::Result<u32> {
    let tls = &config.tls;
    // Before anything is proposed: "not yet", so a forwarder may send the AddNode again.
    let unreachable = |e: String| crate::Error::NotYet(format!("node at {addr}: {e}"));
    let channel = tls
        .channel(addr, |e| e.connect_timeout(Duration::from_secs(1)))
        .map_err(|e| unreachable(e.to_string()))?;
    let mut request = peer_request(RaftMessage { data: Vec::new() }, store, config);
    let term = tonic::metadata::MetadataValue::from(term);
    request.metadata_mut().insert(TERM_HEADER, term);
    request.set_timeout(Duration::from_secs(5));
    match RaftClient::new(channel).hello(request).await {
        Ok(answer) => {
            levels.heard(id, answer.metadata());
            Ok(super::level::of(answer.metadata()))
        }
        Err(s) if s.code() == tonic::Code::FailedPrecondition => {
            Err(crate::Error::FailedPrecondition(format!(
                "node at {addr} cannot join: {}",
                s.message()
            )))
        }
        Err(s) => Err(unreachable(s.message().to_string())),
    }
}

/// Asks the node at `addr` to stand for election now, if it follows the leader of `term`
/// (leadership transfer, see `membership`). Whether it did.
pub async fn timeout_now(tls: &crate::tls::Tls, addr: &str, term: u64) -> crate::Result<bool> {
    // Before anything is proposed: "not yet", so a forwarder may send the AddNode again.
    let unreachable = |e: String| crate::Error::NotYet(format!("node at {addr}: {e}"));
    let channel = tls
        .channel(addr, |e| e.connect_timeout(Duration::from_secs(1)))
        .map_err(|e| unreachable(e.to_string()))?;
    let mut request = tonic::Request::new(RaftMessage {
        data: encode(&term),
    });
    request.set_timeout(Duration::from_secs(1));
    let reply = RaftClient::new(channel)
        .timeout_now(request)
        .await
        .map_err(|s| unreachable(s.message().to_string()))?;
    decode(&reply.into_inner().data).map_err(|e| unreachable(e.to_string()))
}

/// A connection to one peer.
pub struct PeerClient {
    target: NodeId,
    client: Option<RaftClient<Channel>>,
    addr: String,
    store: crate::storage::Store,
    /// Where the target's advertised level goes, and this node's own.
    levels: (
        std::sync::Arc<super::Levels>,
        std::sync::Arc<crate::config::NodeConfig>,
    ),
}

enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl PeerClient {
    fn new(
        target: NodeId,
        addr: &str,
        store: crate::storage::Store,
        levels: (
            std::sync::Arc<super::Levels>,
            std::sync::Arc<crate::config::NodeConfig>,
        ),
    ) -> Self {
        let client = levels
            .1
            .tls
            .channel(addr, |e| e.connect_timeout(Duration::from_secs(1)))
            .ok()
            .map(|channel| {
                RaftClient::new(channel)
                    .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
            });
        PeerClient {
            target,
            client,
            addr: addr.to_string(),
            store,
            levels,
        }
    }

    /// Sends one RPC; the outer error is the transport's, the inner the remote Raft's.
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        ttl: Duration,
    ) -> Result<Result<Resp, E>, Transport>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: DeserializeOwned,
    {
        let addr = &self.addr;
        let client = self.client.as_mut().ok_or_else(|| {
            Transport::Unreachable(Unreachable::new(&std::io::Error::other(format!(
                "bad peer address {addr}"
            ))))
        })?;
        let own = &self.levels.1;
        let mut request = peer_request(RaftMessage { data: encode(req) }, &self.store, own);
        request.set_timeout(ttl);
        let reply = match rpc {
            Rpc::Append => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::Snapshot => client.install_snapshot(request).await,
        }
        .map_err(|s| {
            self.levels.0.forget(self.target);
            if s.code() == tonic::Code::FailedPrecondition {
                // It will not take part until someone fixes it: say why, loudly.
                tracing::error!(target = self.target, addr = %self.addr, "peer refuses: {}", s.message());
            }
            Transport::from_status(s)
        })?;
        self.levels.0.heard(self.target, reply.metadata());
        decode(&reply.into_inner().data).map_err(|e| {
            Transport::Network(NetworkError::new(&std::io::Error::other(e.to_string())))
        })
    }

    fn lift<Resp, E: std::error::Error>(
        &self,
        outcome: Result<Result<Resp, RaftError<TypeConfig, E>>, Transport>,
    ) -> Result<Resp, RPCError<TypeConfig, RaftError<TypeConfig, E>>> {
        match outcome {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(Transport::Unreachable(u)) => Err(RPCError::Unreachable(u)),
            Err(Transport::Network(n)) => Err(RPCError::Network(n)),
        }
    }
}

/// A transport failure, classified for openraft (see the module essay).
enum Transport {
    /// The peer cannot be reached: openraft backs off.
    Unreachable(Unreachable<TypeConfig>),
    /// The peer was reached but the call failed (too slow, a bad reply): retried at once.
    Network(NetworkError<TypeConfig>),
}

impl Transport {
    fn from_status(s: tonic::Status) -> Transport {
        let e = std::io::Error::other(format!("{:?}: {}", s.code(), s.message()));
        if is_timeout(&s) {
            Transport::Network(NetworkError::new(&e))
        } else {
            Transport::Unreachable(Unreachable::new(&e))
        }
    }
}

/// Whether the call failed only because its deadline passed: tonic's client reports its own
/// timeout as CANCELLED "Timeout expired"; a server that saw the deadline pass answers
/// DEADLINE_EXCEEDED.
fn is_timeout(s: &tonic::Status) -> bool {
    match s.code() {
        tonic::Code::DeadlineExceeded => true,
        tonic::Code::Cancelled => s.message().contains("Timeout expired"),
        _ => false,
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig, RaftError<TypeConfig>>>
    {
        let outcome = self.call(Rpc::Append, &rpc, option.hard_ttl()).await;
        self.lift(outcome)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<TypeConfig>,
        RPCError<TypeConfig, RaftError<TypeConfig, InstallSnapshotError>>,
    > {
        let outcome = self.call(Rpc::Snapshot, &rpc, option.hard_ttl()).await;
        self.lift(outcome)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig, RaftError<TypeConfig>>> {
        let outcome = self.call(Rpc::Vote, &rpc, option.hard_ttl()).await;
        self.lift(outcome)
    }

    /// 500 ms between tries once openraft backs off (an unreachable peer at once, a slow one
    /// after many timeouts in a row), as openraft 0.9 did.
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(500)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_peers_are_retried_and_unreachable_ones_backed_off_from() {
        let slow = [
            tonic::Status::cancelled("Timeout expired"),
            tonic::Status::deadline_exceeded("deadline has elapsed"),
        ];
        for s in slow {
            assert!(matches!(Transport::from_status(s), Transport::Network(_)));
        }
        let gone = [
            tonic::Status::unavailable("tcp connect error: Connection refused"),
            tonic::Status::cancelled("operation was canceled"),
            tonic::Status::unknown("transport error"),
        ];
        for s in gone {
            assert!(matches!(
                Transport::from_status(s),
                Transport::Unreachable(_)
            ));
        }
    }
}
