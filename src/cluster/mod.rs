//! The Raft cluster: the Raft handle, the peer network, and the leader's workers. openraft's
//! types are `raft_types`'s, a floor below, so storage can speak them too.
//!
//! Every node runs one `openraft::Raft` whose log store and state machine live in `storage`.
//! Peers talk over the internal `timerdb.v1.Raft` gRPC service (served in `api::services::peer`, called
//! from [`network`]). Client writes go through the [`Proposer`], which packs concurrent ones
//! into shared entries; acks that arrive on delivery streams are coalesced by the [`Acker`].
//! Three workers run only while this node is the leader: the fire driver ([`driver`]), the only
//! writer of Fire entries, woken through storage's `FireSignal` when something earlier comes due;
//! the delivery dispatcher ([`dispatch`]), which plans the grants Fire entries carry and proposes
//! Deliver entries of its own; and the [`purger`], which deletes finished timers by range once
//! their retention passed. A data group with nothing to do rests ([`rest`]): no heartbeats, its
//! followers' election timers parked while the leader's node pings them. Elections use openraft's pre-vote (switched on in `config`): a node that
//! cannot reach a quorum never raises the term.

pub mod acks;
pub mod dispatch;
pub mod driver;
pub mod lanes;
pub mod level;
pub mod limits;
pub mod network;
pub mod propose;
pub mod purger;
pub mod queued;
pub mod rest;
pub mod workers;

pub use acks::{AckItem, Acker};
pub use dispatch::{Delivery, DispatchLoop, Dispatcher, LeaseTag, Subscription};
pub use driver::FireDriver;
pub use level::Levels;
pub use network::Network;
pub use propose::Proposer;

use crate::raft_types::TypeConfig;

/// How long a leader may go without an answer from a quorum before it refuses writes and
/// reads, and fails those in flight: long enough that a loaded follower's slow answers (100 ms
/// heartbeats; AppendEntries answered once durable, `network::append_ttl`) do not trip it,
/// short enough that an isolated leader answers UNAVAILABLE within about a second. A
/// partitioned leader's followers elect a new one after 0.5–0.75 s of silence, so by then it is
/// no longer the leader anyway.
pub const QUORUM_LOST_AFTER: std::time::Duration = std::time::Duration::from_millis(1000);

/// Largest peer message accepted or sent: entries batch many timers with their payloads. The
/// proposer keeps each entry to half of it, so an AppendEntries always carries at least one.
pub const MAX_PEER_MESSAGE_BYTES: usize = crate::codec::MAX_DECODE_BYTES;

/// The Raft handle of a timerdb node.
pub type Raft = openraft::Raft<TypeConfig, crate::storage::StateMachine>;
