//! The gRPC surface: the only module that knows about protobuf and tonic.
//!
//! - [`methods`]: every RPC served, with where it runs and who may call it; the layers around
//!   the services read it. [`forward`] is the layer that runs leader calls on the leader: here
//!   if this node leads, else the unchanged request is forwarded (waiting a bounded time while
//!   there is no leader), so any node serves every call and the handlers hold only their logic.
//! - [`timers`]: the client `Timers` service (the public contract in
//!   `proto/timerdb/v1/timerdb.proto`).
//! - [`subscribe`]: the Subscribe stream, served from the leader's dispatcher and relayed by
//!   followers, following the leader across changes.
//! - [`namespaces`]: the client `Namespaces` service (replicated namespace policies), with
//!   [`policy`] validating them.
//! - [`receiver`]: the client side of `timerdb.v1.Receiver`, which the leader's pusher calls
//!   for namespaces pushed over gRPC.
//! - [`cluster`]: the client `Cluster` service (Status, membership, leadership, Backup), with
//!   [`backup`] streaming a backup file.
//! - [`health`]: `grpc.health.v1`, serving while the node has a leader and has applied what
//!   was committed; server reflection is wired in `server`.
//! - [`peer`]: the internal `Raft` service peers call; kept apart from the client services.
//! - [`http`]: the HTTP/JSON API, the outermost layer of the client port: a non-gRPC request
//!   is transcoded into the gRPC call it names and sent down the same stack (docs/http.md).
//! - [`convert`]: validation of requests, protobuf ⇄ domain conversions, and the one place where
//!   [`crate::Error`] becomes a `tonic::Status`.

pub mod access;
pub mod auth;
pub mod backup;
pub mod cluster;
pub mod convert;
pub mod first;
pub mod forward;
pub mod headers;
pub mod health;
pub mod http;
pub mod layer;
pub mod limit;
pub mod methods;
pub mod modes;
pub mod namespaces;
pub mod observe;
pub mod peer;
pub mod policy;
pub mod receiver;
pub mod recurring;
pub mod revocable;
pub mod subscribe;
pub mod timers;

/// Generated protobuf and gRPC code for `timerdb.v1` (the `timerdb-proto` crate's, which the
/// client library and the tools share).
pub use timerdb_proto::pb;

/// The encoded descriptors of every timerdb service, for server reflection.
pub use timerdb_proto::FILE_DESCRIPTOR_SET;

/// Largest client message: a ScheduleBatch of `max_batch` timers with payloads.
pub const MAX_CLIENT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Largest request of the other client services (Namespaces, Cluster, Access): tonic's
/// default, set explicitly so the layers that buffer a request stop at the same size.
pub const MAX_SMALL_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
