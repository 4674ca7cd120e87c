//! The gRPC surface: the only module of the server that knows tonic and the protobuf types
//! (which never leave it; `cluster/network.rs` only wraps bincode in the peer service's
//! envelope). Three rooms and the HTTP/JSON door, each leaning only on the ones before it:
//!
//! - [`convert`]: validation of requests and protobuf ⇄ domain conversions (`modes`,
//!   `policy`, `recurring`), and the one place where [`crate::Error`] becomes a
//!   `tonic::Status`.
//! - [`stack`]: the layers around every service, one table (`stack::methods`: every RPC, where
//!   it runs, who may call it) driving them: the request bound, auth, forwarding to the
//!   leader (so any node serves every call and the handlers hold only their logic), metrics.
//! - [`services`]: the handlers, one `Node` verb each: the client services, health, the
//!   internal peer service, and the client side of the receiver service the pusher calls.
//! - [`http`]: the HTTP/JSON API, the outermost layer of the client port: a non-gRPC request
//!   is transcoded into the gRPC call it names and sent down the same stack (docs/http.md).

pub mod convert;
pub mod http;
pub mod services;
pub mod stack;

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
