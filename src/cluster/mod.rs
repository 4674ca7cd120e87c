//! The Raft cluster: openraft's type configuration, the peer network, and the leader's
//! workers.
//!
//! Every node runs one `openraft::Raft` whose log store and state machine live in `storage`.
//! Peers talk over the internal `timerdb.v1.Raft` gRPC service (served in `api::peer`, called
//! from [`network`]). Client writes go through the [`Proposer`], which packs concurrent ones
//! into shared entries; acks that arrive on delivery streams are coalesced by the [`Acker`].
//! Three workers run only while this node is the leader: the fire driver ([`driver`]), the only
//! writer of Fire entries, woken through a [`FireSignal`] when something earlier comes due; the
//! delivery dispatcher ([`dispatch`]), which plans the grants Fire entries carry and proposes
//! Deliver entries of its own; and the [`purger`], which deletes finished timers by range once
//! their retention passed. On every node, [`elect`] lets Raft campaign only while a quorum of
//! voters is in reach (openraft 0.9 had no pre-vote; 0.10's is not switched on yet).

pub mod acks;
pub mod dispatch;
pub mod driver;
pub mod hold;
pub mod lanes;
pub mod level;
pub mod limits;
pub mod network;
pub mod propose;
pub mod purger;
pub mod queued;
pub mod runtime;

pub use acks::{AckItem, Acker};
pub use dispatch::{Delivery, DispatchLoop, Dispatcher, LeaseTag, Subscription};
pub use driver::{FireDriver, FireSignal};
pub use hold::Hold;
pub use level::Levels;
pub use network::Network;
use openraft::BasicNode;
pub use propose::Proposer;

use crate::timer::{Command, Response};

/// How long a leader may go without an answer from a quorum before it refuses writes and
/// reads, and fails those in flight: long enough that a loaded follower's slow answers (100 ms
/// heartbeats, AppendEntries timed out after one) do not trip it, short enough that an isolated
/// leader answers UNAVAILABLE within about a second. A partitioned leader's followers elect a
/// new one after 0.5–0.75 s of silence, so by then it is no longer the leader anyway.
pub const QUORUM_LOST_AFTER: std::time::Duration = std::time::Duration::from_millis(1000);

/// A node's id in the cluster (1, 2, 3 …).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// timerdb's openraft types: commands in, responses out, snapshots as files. A command is
    /// shared (`Arc`): openraft hands an entry to the log, to replication and to apply, and the
    /// log cache (`storage::log_cache`) gives them all the one decoded copy. The leader id is
    /// openraft's "advanced" one (several leaders may share a term, as under 0.9), and the
    /// runtime is tokio's (`AsyncRuntime`; the simulator swaps the random source only, see
    /// [`runtime`]).
    pub TypeConfig:
        D = std::sync::Arc<Command>,
        R = Response,
        NodeId = NodeId,
        Node = BasicNode,
        AsyncRuntime = runtime::Runtime,
);

/// The Raft handle of a timerdb node.
pub type Raft = openraft::Raft<TypeConfig, crate::storage::StateMachine>;

// openraft 0.10 spells its types through the type config; these aliases are the one place
// that does, so the rest of the code names them as plainly as under 0.9.

/// The id of a leader (term, node): also the committed leader id of a log id.
pub type LeaderId = openraft::vote::leader_id_adv::LeaderId<u64, NodeId>;
/// A log position: (leader id, index).
pub type LogId = openraft::LogId<LeaderId>;
/// A node's vote.
pub type Vote = openraft::Vote<LeaderId>;
/// An entry's payload: a command, a membership change or nothing (blank).
pub type EntryPayload = openraft::EntryPayload<std::sync::Arc<Command>, NodeId, BasicNode>;
/// A Raft log entry.
pub type Entry = openraft::Entry<LeaderId, EntryPayload>;
/// A membership with the log id that set it.
pub type StoredMembership = openraft::StoredMembership<LeaderId, NodeId, BasicNode>;
/// What a snapshot covers: its last log id and membership.
pub type SnapshotMeta = openraft::SnapshotMeta<LeaderId, NodeId, BasicNode>;
/// A snapshot: its meta and its file.
pub type Snapshot = openraft::Snapshot<LeaderId, NodeId, BasicNode, crate::storage::SnapshotFile>;
/// openraft's view of this node.
pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;
/// A receiver of [`RaftMetrics`].
pub type MetricsRx = openraft_rt_tokio::TokioWatchReceiver<RaftMetrics>;
/// The part of openraft's view that changes with the role, the leader and the membership only
/// (`Raft::server_metrics`). A task that waits for a role change watches this: the whole
/// [`RaftMetrics`] change several times per entry (log, commit, apply), and each change woke
/// every such task to test its condition again. Its sender goes with Raft's core: a receiver
/// sees the channel close when Raft stops, on a fatal error too.
pub type ServerMetricsRx =
    openraft_rt_tokio::TokioWatchReceiver<openraft::metrics::RaftServerMetrics<TypeConfig>>;
/// A storage failure as openraft carries it.
pub type StorageError = openraft::StorageError<TypeConfig>;

/// The log id of entry `index` written by the leader of `term` that is node `node`.
pub fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
    LogId::new(
        LeaderId {
            term,
            node_id: node,
        },
        index,
    )
}
