//! timerdb: a Raft-replicated clustered timer database.
//!
//! A client schedules a timer (namespace, id, fire time, payload) on any node; at its fire time
//! it fires exactly once, even while leaders die. Each node keeps a RocksDB state machine whose
//! wheel orders timers by fire time, replicated with openraft. Only the leader reads the clock:
//! its fire driver commits `Fire { now_ms }` entries and every replica applies them alike.
//!
//! Modules, floor by floor from the bottom up (a module names only modules on lower floors;
//! `scripts/layers.py` checks it, docs/architecture.md draws it):
//! - [`error`], [`codec`]: the one error type; the bounded binary encoding of stored values
//!   and peer messages. (`alloc_count`, a test allocator, is compiled into tests only.)
//! - [`sim`]: the deterministic simulator's seams, inert outside a simulation.
//! - [`clock`]: the only reader of the wall clock.
//! - [`wheel`], [`recur`]: slots and order-preserving keys; recurrence arithmetic (pure).
//! - [`namespace`], [`auth`]: namespaces, their replicated policy and push targets (with the
//!   signing secrets); API keys, roles and the auth switch.
//! - [`timer`]: the domain: a timer, its key, spec and states.
//! - [`series`]: recurring timers: the stored series, occurrences, the plan apply follows.
//! - [`command`]: the log's vocabulary: `Command`, `Response`, the feature level.
//! - [`raft_types`]: openraft's types as timerdb spells them.
//! - [`metrics`], [`tls`]: Prometheus names and exporter; rustls configurations and dialling.
//! - [`listen`]: accepting connections and reading their certificates.
//! - [`config`]: a node's configuration and its sources.
//! - [`storage`]: RocksDB: the log engine, the state machine (apply), snapshots, reads.
//! - [`cluster`]: the Raft handle, the peer network, the proposer, the leader's workers.
//! - [`node`]: a node's operations in domain terms, the door every layer above uses.
//! - [`push`]: push delivery, the leader calling receivers back (HTTP webhooks, gRPC).
//! - [`api`]: the gRPC and HTTP/JSON surface: the stack of layers, the services, conversions.
//! - [`server`]: wires a node together and runs it.

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
pub mod keys;
pub mod listen;
pub mod metrics;
pub mod namespace;
pub mod node;
pub mod push;
pub mod raft_types;
pub mod recurring;
pub mod server;
pub mod sim;
pub mod storage;
pub mod timer;
pub mod tls;
pub mod wheel;

pub use error::{Error, Result};
