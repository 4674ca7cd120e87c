//! The client side of the peer network: openraft's `RaftNetwork` over the internal
//! `timerdb.v1.Raft` gRPC service: openraft 0.10's `RaftNetworkV2`, speaking the wire openraft
//! 0.9 spoke (its messages; snapshots in chunks, as `openraft-legacy` keeps them).
//!
//! Snapshots are sent here, not by `openraft-legacy`'s sender: that one tries a failed chunk
//! again after 1 ms, without end, whatever failed (an unreachable peer made the leader read
//! and encode 4 MiB chunks in a loop), and stops at an answer with any other vote. Here a
//! failed chunk is tried again after a pause (500 ms for an unreachable peer, 10–200 ms for a
//! slow one), at most five times in a row before the transfer fails (openraft starts another
//! later), and only a *higher* vote ends it.
//!
//! Each message is openraft's own request type, bincode-encoded in a `RaftMessage`; the reply is
//! the bincode of `Result<response, RaftError>`, so a remote Raft error comes back typed.
//!
//! Transport failures are told apart, because openraft treats them differently. A peer that
//! cannot be reached (connection refused or reset, peer down) is `Unreachable`: openraft backs
//! off for 500 ms ([`PeerClient::backoff`]) instead of hammering it. A peer that is reachable
//! but did not answer in time (the deadline passed) is a `Network` error, retried at once:
//! backing off for 500 ms each time stalled commits altogether (found by `timerdb-bench`:
//! writes timed out after 5 s at 20,000 fires/s and while loading 10,000,000 timers). An
//! AppendEntries is given the quorum window plus its bytes' time over a slow link
//! ([`append_ttl`]), not openraft's one heartbeat: a follower answers once the entries are
//! durable, and an answer abandoned before it comes never counts. Channels connect lazily and
//! reconnect by themselves, so a restarted peer is picked up without any bookkeeping here.

// openraft's trait signatures fix these (large) error types; helpers return them as they are.
#![allow(clippy::result_large_err)]
use std::time::Duration;

use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use openraft_legacy::network_v1::{
    InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotMeta as ChunkMeta,
};
use serde::{de::DeserializeOwned, Serialize};
use tonic::transport::Channel;

use super::MAX_PEER_MESSAGE_BYTES;
use crate::raft_types::{NodeId, TypeConfig, Vote};
use crate::storage::Snapshot;
use crate::storage::{decode, encode};
use timerdb_proto::pb::{groups_client::GroupsClient, raft_client::RaftClient, RaftMessage};

mod calls;
pub use calls::{handover, hello, member, read_index, timeout_now};

/// The header every peer call carries: the sender's bucket width in ms (see `raft.proto`).
pub const BUCKET_MS_HEADER: &str = "x-timerdb-bucket-ms";

/// The header of a `Hello`: the calling leader's term (`storage/admission.rs`).
pub const TERM_HEADER: &str = "x-timerdb-term";

/// The header naming the Raft group a peer call is for (docs/sharding.md §2); absent: group
/// 0, as every call of a build before groups is.
pub const GROUP_HEADER: &str = "x-timerdb-group";

/// Makes a [`PeerClient`] per target node, dialling the configured override if there is one.
/// One per group: its calls name the group.
#[derive(Clone)]
pub struct Network {
    pub config: std::sync::Arc<crate::config::NodeConfig>,
    /// The group's state machine on this node: the group and the bucket width go with every
    /// call.
    pub store: crate::storage::Store,
    /// The feature level each peer's answers advertise (`level.rs`).
    pub levels: std::sync::Arc<super::Levels>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let addr = self.config.dial_addr(target, &node.addr);
        let levels = (self.levels.clone(), self.config.clone());
        PeerClient::new(target, &addr, self.store.clone(), levels)
    }
}

/// A request to a peer for `store`'s group, with this node's bucket width, feature level and
/// tzdb version.
pub(super) fn peer_request<T>(
    msg: T,
    store: &crate::storage::Store,
    config: &crate::config::NodeConfig,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(msg);
    let width = tonic::metadata::MetadataValue::from(store.width_ms());
    request.metadata_mut().insert(BUCKET_MS_HEADER, width);
    name_group(&mut request, store.space().group);
    super::level::advertise_node(request.metadata_mut(), config);
    request
}

/// Names `group` in a peer call (group 0 is named by no header, as before groups).
pub(super) fn name_group<T>(request: &mut tonic::Request<T>, group: crate::keys::Group) {
    if group != crate::keys::GROUP_ZERO {
        let group = tonic::metadata::MetadataValue::from(group);
        request.metadata_mut().insert(GROUP_HEADER, group);
    }
}

/// How often an idle peer connection is checked with an HTTP/2 ping.
const IDLE_PING: Duration = Duration::from_secs(10);
/// How long that ping may go unanswered before the connection is dropped.
const IDLE_PING_TIMEOUT: Duration = Duration::from_secs(3);

/// A connection to one peer, for one group.
pub struct PeerClient {
    target: NodeId,
    client: Option<Client>,
    addr: String,
    store: crate::storage::Store,
    /// Where the target's advertised level goes, and this node's own.
    levels: (
        std::sync::Arc<super::Levels>,
        std::sync::Arc<crate::config::NodeConfig>,
    ),
}

/// The peer service a group's calls go to: `Raft` for group 0's, `Groups` for a data group's
/// (which a build before groups does not have: it answers UNIMPLEMENTED).
enum Client {
    Raft(RaftClient<Channel>),
    Groups(GroupsClient<Channel>),
}

enum Rpc {
    Append,
    Vote,
    PreVote,
    TransferLeader,
    Snapshot,
}

impl PeerClient {
    pub(crate) fn new(
        target: NodeId,
        addr: &str,
        store: crate::storage::Store,
        levels: (
            std::sync::Arc<super::Levels>,
            std::sync::Arc<crate::config::NodeConfig>,
        ),
    ) -> Self {
        let group = store.space().group;
        // A resting group's connections carry nothing for as long as it rests (`rest.rs`):
        // HTTP/2 pings find one a middlebox dropped, so its next call dials afresh instead of
        // waiting on a dead connection.
        let client = levels
            .1
            .tls
            .channel(addr, |e| {
                e.connect_timeout(Duration::from_secs(1))
                    .http2_keep_alive_interval(IDLE_PING)
                    .keep_alive_timeout(IDLE_PING_TIMEOUT)
                    .keep_alive_while_idle(true)
            })
            .ok()
            .map(|channel| match group {
                crate::keys::GROUP_ZERO => Client::Raft(
                    RaftClient::new(channel)
                        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES),
                ),
                _ => Client::Groups(
                    GroupsClient::new(channel)
                        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES),
                ),
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
        decoded(self.send(rpc, req, ttl).await)
    }

    /// Sends one RPC; the reply's bytes, or the status it failed with.
    async fn send<Req: Serialize>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        ttl: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        let addr = &self.addr;
        let client = (self.client.as_mut())
            .ok_or_else(|| tonic::Status::unavailable(format!("bad peer address {addr}")))?;
        let own = &self.levels.1;
        let data = encode(req);
        let ttl = match rpc {
            Rpc::Append => append_ttl(ttl, data.len()),
            _ => ttl,
        };
        let mut request = peer_request(RaftMessage { data }, &self.store, own);
        request.set_timeout(ttl);
        let reply = match (client, rpc) {
            (Client::Raft(c), Rpc::Append) => c.append_entries(request).await,
            (Client::Raft(c), Rpc::Vote) => c.vote(request).await,
            (Client::Raft(c), Rpc::PreVote) => c.pre_vote(request).await,
            (Client::Raft(c), Rpc::TransferLeader) => c.transfer_leader(request).await,
            (Client::Raft(c), Rpc::Snapshot) => c.install_snapshot(request).await,
            (Client::Groups(c), Rpc::Append) => c.append_entries(request).await,
            (Client::Groups(c), Rpc::Vote) => c.vote(request).await,
            (Client::Groups(c), Rpc::PreVote) => c.pre_vote(request).await,
            (Client::Groups(c), Rpc::TransferLeader) => c.transfer_leader(request).await,
            (Client::Groups(c), Rpc::Snapshot) => c.install_snapshot(request).await,
        }
        .inspect_err(|s| {
            // What the peer's build advertises is group 0's to hear (its answers carry it); a
            // data group's failed call says nothing of it (a peer may host no replica yet).
            if self.store.space().group == crate::keys::GROUP_ZERO {
                self.levels.0.forget(self.target);
            }
            if s.code() == tonic::Code::FailedPrecondition {
                // It will not take part until someone fixes it: say why, loudly.
                tracing::error!(target = self.target, addr = %self.addr, "peer refuses: {}", s.message());
            }
        })?;
        let node = format!("node {}", self.target);
        super::level::check_groups(reply.metadata(), own.groups, &node)?;
        self.levels.0.heard(self.target, reply.metadata());
        Ok(reply.into_inner().data)
    }

    /// A call's outcome as openraft 0.10 takes it: a remote Raft that stopped (its only error
    /// on these calls) is a peer that cannot take part, as if unreachable.
    fn lift<Resp>(
        &self,
        outcome: Result<Result<Resp, RaftError<TypeConfig>>, Transport>,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        match outcome {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(RPCError::Unreachable(Unreachable::from_string(format!(
                "node {}: {e}",
                self.target
            )))),
            Err(Transport::Unreachable(u)) => Err(RPCError::Unreachable(u)),
            Err(Transport::Network(n)) => Err(RPCError::Network(n)),
        }
    }

    /// Sends `snapshot` chunk by chunk (see the module essay).
    async fn send_snapshot(
        &mut self,
        vote: Vote,
        mut snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        use std::io::SeekFrom;
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        // A build before storage format 6 cannot read this build's snapshots (a rolling
        // upgrade): it stays behind until it is upgraded, rather than fail the install.
        let rpcs = self.levels.0.peer_rpcs(self.target);
        if rpcs < super::level::SNAPSHOT_FORMAT_RPCS {
            return Err(StreamingError::from(Unreachable::from_string(format!(
                "node {} runs a build that cannot read a snapshot of storage format {} \
                 (it advertises peer RPCs {rpcs}): upgrade it to catch up",
                self.target,
                crate::storage::FORMAT
            ))));
        }
        let read_err = |e: std::io::Error| {
            StreamingError::from(Unreachable::from_string(format!(
                "reading the snapshot: {e}"
            )))
        };
        let file = &mut snapshot.snapshot;
        let end = file.seek(SeekFrom::End(0)).await.map_err(read_err)?;
        // A transfer's own id: a snapshot sent again is never taken for the rest of an
        // earlier, abandoned transfer of it.
        let meta = ChunkMeta::<TypeConfig> {
            last_log_id: snapshot.meta.last_log_id,
            last_membership: snapshot.meta.last_membership.clone(),
            snapshot_id: format!("{}-{:08x}", file.id(), rand::random::<u32>()),
        };
        let chunk = option.snapshot_chunk_size().unwrap_or(4 << 20).max(1);
        let (mut offset, mut failures) = (0u64, 0u32);
        let mut cancel = std::pin::pin!(cancel);
        loop {
            file.seek(SeekFrom::Start(offset)).await.map_err(read_err)?;
            let mut data = Vec::with_capacity(chunk);
            while data.len() < chunk {
                if file.read_buf(&mut data).await.map_err(read_err)? == 0 {
                    break;
                }
            }
            let sent = data.len() as u64;
            let req = InstallSnapshotRequest {
                vote,
                meta: meta.clone(),
                offset,
                data,
                done: offset + sent == end,
            };
            let outcome: Result<
                Result<InstallSnapshotResponse<TypeConfig>, SnapshotError>,
                Transport,
            > = tokio::select! {
                closed = cancel.as_mut() => return Err(closed.into()),
                o = self.call(Rpc::Snapshot, &req, option.hard_ttl()) => o,
            };
            let failure = match outcome {
                Ok(Ok(InstallSnapshotResponse { vote: theirs })) => {
                    failures = 0;
                    if theirs > vote || req.done {
                        return Ok(SnapshotResponse::new(theirs));
                    }
                    offset += sent;
                    continue;
                }
                Ok(Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m)))) => {
                    tracing::warn!(target = self.target, %m, "snapshot chunk mismatch: from the start");
                    offset = 0;
                    Transport::Network(NetworkError::from_string(m.to_string()))
                }
                Ok(Err(RaftError::Fatal(f))) => {
                    let why = format!("node {}: {f}", self.target);
                    return Err(Unreachable::from_string(why).into());
                }
                Err(t) => t,
            };
            failures += 1;
            let pause = match &failure {
                Transport::Unreachable(_) => Duration::from_millis(500),
                Transport::Network(_) => {
                    Duration::from_millis(10 << failures.min(5)).min(Duration::from_millis(200))
                }
            };
            if failures >= SNAPSHOT_TRIES {
                return Err(match failure {
                    Transport::Unreachable(u) => u.into(),
                    Transport::Network(n) => n.into(),
                });
            }
            tokio::select! {
                closed = cancel.as_mut() => return Err(closed.into()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// A remote answer to a snapshot chunk that is not a response.
type SnapshotError = RaftError<TypeConfig, InstallSnapshotError>;

/// Failed snapshot chunks in a row after which a transfer gives up (openraft starts another).
pub(crate) const SNAPSHOT_TRIES: u32 = 5;

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

/// A reply's bytes as the remote Raft's answer (the outer error is the transport's).
fn decoded<Resp, E>(sent: Result<Vec<u8>, tonic::Status>) -> Result<Result<Resp, E>, Transport>
where
    Resp: DeserializeOwned,
    E: DeserializeOwned,
{
    let reply = sent.map_err(Transport::from_status)?;
    decode(&reply)
        .map_err(|e| Transport::Network(NetworkError::new(&std::io::Error::other(e.to_string()))))
}

/// The slowest peer link a large AppendEntries is given time to cross, in bytes per second
/// (80 Mbit/s): a 3.3 MB batch entry gets 0.33 s more, a payload at the peer message bound
/// ([`MAX_PEER_MESSAGE_BYTES`]) 27 s.
const SLOWEST_LINK_BYTES_PER_SEC: u64 = 10_000_000;

/// How long an AppendEntries of `bytes` may take: the quorum window, plus the time its bytes
/// take over the slowest link we serve. openraft asks for one heartbeat (`hard_ttl`, 100 ms),
/// but a follower answers only once the entries are durable, and a call abandoned before its
/// answer can never count: a follower whose fsync took longer, or a 3.3 MB batch entry on a
/// 16 MB/s link, was sent the same entries again without end while the leader, hearing from
/// no quorum for a second, refused every write (`slow_link::large_batches_cross_slow_peer_links`).
/// A dead peer is not found by this timeout (its connection fails, or the leader's quorum
/// check trips first), so waiting longer for a live one costs nothing.
fn append_ttl(hard_ttl: Duration, bytes: usize) -> Duration {
    let crossing = Duration::from_millis(bytes as u64 * 1000 / SLOWEST_LINK_BYTES_PER_SEC);
    hard_ttl.max(super::QUORUM_LOST_AFTER) + crossing
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

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = crate::storage::SnapshotFile;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let outcome = self.call(Rpc::Append, &rpc, option.hard_ttl()).await;
        self.lift(outcome)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let outcome = self.call(Rpc::Vote, &rpc, option.hard_ttl()).await;
        self.lift(outcome)
    }

    /// A peer that cannot be reached (or answers with an error) grants nothing: a node cut off
    /// from a quorum never raises its term. Only a build without PreVote (UNIMPLEMENTED) counts
    /// as a grant, as openraft counts a network without it: liveness during an upgrade. That
    /// holds even for a peer that advertised PreVote before: it was restarted as an older
    /// build, and its answer proves it reachable, so the grant cannot help a cut-off node; not
    /// counting it left a cluster of two live nodes without a leader (review of 5428ec3).
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let zero = self.store.space().group == crate::keys::GROUP_ZERO;
        match self.send(Rpc::PreVote, &rpc, option.hard_ttl()).await {
            // Only group 0's: a build without `Groups` has no data group to vote in.
            Err(s) if zero && s.code() == tonic::Code::Unimplemented => {
                Ok(VoteResponse::new(rpc.vote, None, true))
            }
            sent => self.lift(decoded(sent)),
        }
    }

    /// openraft sends it to every voter when this leader hands over (`membership`). A build
    /// without the RPC answers UNIMPLEMENTED: unreachable, as openraft's default; the hand-over
    /// then falls back to `TimeoutNow`.
    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let outcome = self
            .call(Rpc::TransferLeader, &req, option.hard_ttl())
            .await;
        self.lift(outcome)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.send_snapshot(vote, snapshot, cancel, option).await
    }

    /// 500 ms between tries once openraft backs off (an unreachable peer at once, a slow one
    /// after many timeouts in a row), as openraft 0.9 did.
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(std::iter::repeat(Duration::from_millis(500))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_append_has_the_quorum_window_and_its_bytes_time_on_a_slow_link() {
        let heartbeat = Duration::from_millis(100);
        assert_eq!(append_ttl(heartbeat, 0), crate::cluster::QUORUM_LOST_AFTER);
        let batch = append_ttl(heartbeat, 3_300_000);
        assert_eq!(
            batch,
            crate::cluster::QUORUM_LOST_AFTER + Duration::from_millis(330)
        );
        let long = Duration::from_secs(3);
        assert_eq!(append_ttl(long, 10_000_000), long + Duration::from_secs(1));
    }

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
