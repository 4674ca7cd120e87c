//! timerdb's wire: the protobuf messages and gRPC stubs of `timerdb.v1`, generated once from
//! `timerdb/v1/*.proto` beside this crate, so the server, the tools and the client library share
//! one set of types.
//!
//! The client services (Timers, Namespaces, Cluster, Access, and the Receiver a push target
//! implements) are in `timerdb.proto`: their messages and client stubs always, their server
//! stubs with the `server` feature. The peer-only Raft service (`raft.proto`) is built only with
//! the `peer` feature: it is not part of the client contract, and a client crate never ships it.

/// Generated protobuf and gRPC code for `timerdb.v1`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("timerdb.v1");
    include!(concat!(env!("OUT_DIR"), "/timerdb.v1.serde.rs"));
}

/// The encoded descriptors of the `timerdb.v1` services this build compiled (server reflection,
/// schemas).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/timerdb_descriptor.bin"));
