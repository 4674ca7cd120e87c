//! openraft's types as timerdb spells them: the type configuration, node and log ids, votes,
//! entries, memberships and metrics — the ground every layer that speaks Raft stands on.
//!
//! openraft 0.10 spells its types through the type configuration (`LogIdOf<C>`, …); the
//! aliases here are the one place that does, so the rest of the code names them as plainly as
//! under 0.9. The module sits just above the log's commands ([`crate::command::Command`] is an
//! entry's payload) and below everything that stores, replicates or serves them: storage (the
//! log and the state machine), the cluster (replication, the leader's workers) and the config
//! (a node's id). Two aliases that name an upper layer's type live with that layer: the
//! snapshot (`storage::Snapshot`, whose data is a `storage::SnapshotFile`) and the Raft handle
//! (`cluster::Raft`, whose state machine is `storage::StateMachine`).
//!
//! [`runtime`] is openraft's async runtime: tokio's, with the simulator's dice.

pub mod runtime;

use openraft::BasicNode;

use crate::command::{Command, Response};

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
