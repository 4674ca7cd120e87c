//! timerdb: a Raft-replicated clustered timer database.
//!
//! A client schedules a timer (namespace, id, fire time, payload) on any node; at its fire time
//! it fires exactly once, even while leaders die. Each node keeps a RocksDB state machine whose
//! wheel orders timers by fire time, replicated with openraft. Only the leader reads the clock:
//! its fire driver commits `Fire { now_ms }` entries and every replica applies them alike.
//!
//! Modules, from the bottom up:
//! - [`sim`]: the deterministic simulator's seams (a virtual clock, an in-memory network),
//!   inactive outside a simulation.
//! - [`clock`]: the only reader of the wall clock.
//! - [`codec`]: the binary encoding of stored values and peer messages (bincode, bounded).
//! - [`timer`]: domain types and the replicated command vocabulary.
//! - [`namespace`]: namespaces and their replicated policy.
//! - [`recur`], [`series`]: recurrence arithmetic, and recurring timers' occurrences (pure).
//! - [`auth`]: API keys, roles and the replicated auth switch (who may do what).
//! - [`wheel`]: bucket arithmetic and order-preserving key encoding (pure).
//! - [`storage`]: RocksDB log store and state machine (apply, snapshots).
//! - [`cluster`]: openraft types, peer network, fire driver.
//! - [`node`]: a node's operations in domain terms.
//! - [`backup`]: online backups (the leader's snapshot of every acknowledged write).
//! - [`push`]: push delivery, the leader calling receivers back (HTTP webhooks, gRPC).
//! - [`api`]: gRPC services, validation, forwarding to the leader.
//! - [`sample`]: the once-a-second gauge sampler of a running node.
//! - [`server`]: wires a node together and runs it.
//! - [`tls`]: transport security of the client and peer ports (rustls), and dialling peers.
//! - [`config`], [`error`]: configuration and the one error type.

#[cfg(test)]
mod alloc_count;
pub mod api;
pub mod auth;
pub mod clock;
pub mod cluster;
pub mod codec;
pub mod command;
pub mod config;
pub mod error;
pub mod listen;
pub mod metrics;
pub mod namespace;
pub mod node;
pub mod push;
pub mod raft_types;
pub mod recur;
pub mod series;
pub mod server;
pub mod sim;
pub mod storage;
pub mod timer;
pub mod tls;
pub mod wheel;

pub use error::{Error, Result};
