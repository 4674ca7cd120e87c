//! The calls a node makes to a peer of its own accord, beside openraft's: `Hello` before
//! AddNode, `TimeoutNow` for a leadership transfer, group 0's `ReadIndex` for a node that
//! judges credentials without leading group 0 (`node/groups.rs`), and `Handover`, by which
//! group 0's leader balances the data groups' leaders (`node/balance.rs`), and `Member`, by
//! which it adds a node to or removes one from each data group (`node/members.rs`). Each
//! carries what every peer call carries (`network::peer_request`), and names its group.

use std::time::Duration;

use timerdb_proto::pb::{groups_client::GroupsClient, raft_client::RaftClient, RaftMessage};

use crate::cluster::network::{name_group, peer_request, TERM_HEADER};
use crate::raft_types::NodeId;
use crate::storage::{decode, encode};

/// Asks the node at `addr` whether it can join this cluster (its bucket width agrees, or it
/// takes this one): before it is added, so a node that cannot is refused with the reason.
pub async fn hello(
    config: &crate::config::NodeConfig,
    (id, addr): (NodeId, &str),
    store: &crate::storage::Store,
    (term, levels): (u64, &crate::cluster::Levels),
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
    // A data group's Hello goes to `Groups`, naming it (`peer_request` did, from `store`).
    let answer = match store.space().group {
        crate::keys::GROUP_ZERO => RaftClient::new(channel).hello(request).await,
        _ => GroupsClient::new(channel).hello(request).await,
    };
    match answer {
        Ok(answer) => {
            crate::cluster::level::check_groups(
                answer.metadata(),
                config.groups,
                &format!("node at {addr}"),
            )
            .map_err(|s| crate::Error::FailedPrecondition(s.message().to_string()))?;
            levels.heard(id, answer.metadata());
            Ok(crate::cluster::level::of(answer.metadata()))
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

/// Group 0's read index, from its leader at `addr` over `channel` (peer `ReadIndex`,
/// `node/groups.rs`).
pub async fn read_index(
    config: &crate::config::NodeConfig,
    (addr, channel): (&str, tonic::transport::Channel),
    store: &crate::storage::Store,
) -> crate::Result<u64> {
    let unreachable =
        |e: String| crate::Error::Unavailable(format!("group 0's leader at {addr}: {e}"));
    let mut request = peer_request(RaftMessage { data: Vec::new() }, store, config);
    request.set_timeout(Duration::from_secs(1));
    let reply = RaftClient::new(channel)
        .read_index(request)
        .await
        .map_err(|s| unreachable(s.message().to_string()))?;
    decode(&reply.into_inner().data).map_err(|e| unreachable(e.to_string()))
}

/// Sends the node at `addr` a balancing move, `(group, to, group 0's term)` (peer `Handover`,
/// `node::balance`), answered within `timeout`: to the target, which checks it can serve the
/// group and passes it on, or to the group's leader, which hands over. The leader afterwards;
/// FailedPrecondition when the node refused the move itself.
pub async fn handover(
    config: &crate::config::NodeConfig,
    (addr, channel): (&str, tonic::transport::Channel),
    store: &crate::storage::Store,
    (request, timeout): ((crate::keys::Group, NodeId, u64), Duration),
) -> crate::Result<NodeId> {
    let failed = |e: String| crate::Error::Unavailable(format!("node at {addr}: {e}"));
    let mut request = peer_request(
        RaftMessage {
            data: encode(&request),
        },
        store,
        config,
    );
    request.set_timeout(timeout);
    let reply = GroupsClient::new(channel).handover(request).await;
    // The target's own refusal is told apart (balancing passes that target over).
    let reply = reply.map_err(|s| match s.code() {
        tonic::Code::FailedPrecondition => {
            crate::Error::FailedPrecondition(format!("node at {addr}: {}", s.message()))
        }
        _ => failed(s.message().to_string()),
    })?;
    decode(&reply.into_inner().data).map_err(|e| failed(e.to_string()))
}

/// Asks the node at `addr` to stand for election in `group` now, if it follows the group's
/// leader of `term` (leadership transfer, see `membership`). Whether it did.
pub async fn timeout_now(
    tls: &crate::tls::Tls,
    (addr, group): (&str, crate::keys::Group),
    term: u64,
) -> crate::Result<bool> {
    // Before anything is proposed: "not yet", so a forwarder may send the AddNode again.
    let unreachable = |e: String| crate::Error::NotYet(format!("node at {addr}: {e}"));
    let channel = tls
        .channel(addr, |e| e.connect_timeout(Duration::from_secs(1)))
        .map_err(|e| unreachable(e.to_string()))?;
    let mut request = tonic::Request::new(RaftMessage {
        data: encode(&term),
    });
    name_group(&mut request, group);
    request.set_timeout(Duration::from_secs(1));
    let reply = match group {
        crate::keys::GROUP_ZERO => RaftClient::new(channel).timeout_now(request).await,
        _ => GroupsClient::new(channel).timeout_now(request).await,
    };
    let reply = reply.map_err(|s| unreachable(s.message().to_string()))?;
    decode(&reply.into_inner().data).map_err(|e| unreachable(e.to_string()))
}

/// Sends a data group's leader at `addr` one step of adding or removing a node, `request`:
/// `(group, step, group 0's term)` (peer `Member`, `node/members.rs`, which says what the step
/// is and what the reply `R` holds: the step's own outcome, its error kind kept).
pub async fn member<R: serde::de::DeserializeOwned>(
    config: &crate::config::NodeConfig,
    (addr, channel): (&str, tonic::transport::Channel),
    store: &crate::storage::Store,
    request: &impl serde::Serialize,
) -> crate::Result<R> {
    let mut request = peer_request(
        RaftMessage {
            data: encode(request),
        },
        store,
        config,
    );
    // A learner's catch-up (60 s at most, `membership::CATCH_UP`), then its promotion.
    request.set_timeout(Duration::from_secs(75));
    let reply = GroupsClient::new(channel).member(request).await;
    let reply =
        reply.map_err(|s| crate::Error::Unavailable(format!("node at {addr}: {}", s.message())))?;
    decode(&reply.into_inner().data)
        .map_err(|e| crate::Error::Unavailable(format!("node at {addr}: {e}")))
}
