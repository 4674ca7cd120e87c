//! The services: one handler per RPC, each validating its request (`api/convert`) and calling
//! one `Node` verb. The client services ([`timers`] with [`subscribe`], [`namespaces`],
//! [`cluster`] with [`backup`], [`access`]), `grpc.health.v1` ([`health`]), the internal peer
//! service ([`peer`], kept apart from the client ones), and the client side of the receiver
//! service the pusher calls ([`receiver`]).

pub mod access;
pub mod backup;
pub mod cluster;
pub mod health;
pub mod namespaces;
pub mod peer;
pub mod receiver;
pub mod subscribe;
pub mod timers;
