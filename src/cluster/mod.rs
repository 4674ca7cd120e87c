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
//! voters is in reach (openraft 0.9 has no pre-vote).

pub mod acks;
pub mod dispatch;
pub mod driver;
pub mod elect;
pub mod hold;
pub mod lanes;
pub mod level;
pub mod limits;
pub mod network;
pub mod propose;
pub mod purger;

pub use acks::{AckItem, Acker};
pub use dispatch::{Delivery, DispatchLoop, Dispatcher, LeaseTag, Subscription};
pub use driver::{FireDriver, FireSignal};
pub use hold::Hold;
pub use level::Levels;
pub use network::Network;
use openraft::BasicNode;
pub use propose::Proposer;

use crate::timer::{Command, Response};

/// A node's id in the cluster (1, 2, 3 …).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// timerdb's openraft types: commands in, responses out, snapshots as files. A command is
    /// shared (`Arc`): openraft hands an entry to the log, to replication and to apply, and the
    /// log cache (`storage::log_cache`) gives them all the one decoded copy.
    pub TypeConfig:
        D = std::sync::Arc<Command>,
        R = Response,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::storage::SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft handle of a timerdb node.
pub type Raft = openraft::Raft<TypeConfig>;
