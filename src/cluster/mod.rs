//! The Raft cluster: openraft's type configuration, the peer network, and the leader's fire
//! driver.
//!
//! Every node runs one `openraft::Raft` whose log store and state machine live in `storage`.
//! Peers talk over the internal `timerdb.v1.Raft` gRPC service (served in `api::peer`, called
//! from [`network`]). The fire driver ([`driver`]) is the only writer of Fire entries and runs
//! only while this node is the leader; the state machine wakes it through a [`FireSignal`] when
//! an earlier timer is scheduled. The delivery dispatcher ([`dispatch`]) is the only writer of
//! Deliver entries, also leader-only, woken through the same signal when a timer becomes READY.
//!
//! Left out here, on purpose: membership changes (added in the operations issue; the cluster is
//! formed statically from `--peers`, like etcd's `--initial-cluster`).

pub mod dispatch;
pub mod driver;
pub mod hold;
pub mod network;
pub mod propose;

pub use dispatch::{Delivery, DispatchLoop, Dispatcher, Subscription};
pub use driver::{FireDriver, FireSignal};
pub use hold::Hold;
pub use network::Network;
use openraft::BasicNode;
pub use propose::Proposer;

use crate::timer::{Command, Response};

/// A node's id in the cluster (1, 2, 3 …).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// timerdb's openraft types: commands in, responses out, snapshots as files.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::storage::SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft handle of a timerdb node.
pub type Raft = openraft::Raft<TypeConfig>;
