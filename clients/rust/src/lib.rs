//! The Rust client of timerdb.
//!
//! - [`pb`]: the generated `timerdb.v1` messages and client stubs (`timerdb-proto`, which the
//!   server uses too).
//! - [`Connector`] ([`connect`]): how to reach a node — plain or TLS (a CA, a client
//!   certificate), an API key sent as `authorization: Bearer` — making [`Conn`]s, a channel with
//!   its credential, for code that talks to one node on purpose.
//! - [`Client`] ([`client`]): the client an application wants. It is given any nodes of the
//!   cluster, learns which one leads and sends calls there (a follower would forward them: one
//!   hop saved), and retries idempotent calls on UNAVAILABLE and the other "did it happen?"
//!   failures with exponential backoff and jitter, moving to another node, within a deadline.
//!   Calls that are not idempotent (conditions, a Reschedule, Nack, a one-timer Redrive: the
//!   rule is [`idempotent`], the one the server's forwarder follows too) are sent once: their
//!   failure is returned as it is, an unknown outcome the caller must judge.
//! - [`Subscription`] ([`consumer`]): a consumer of a namespace's fired timers that
//!   resubscribes by itself (through another node when one fails) and acks in batches
//!   (`AckBatch`, retried: acks are idempotent), with a way to wait until every ack is applied.
//!
//! - [`hash_slot`]: where a sharded cluster places a timer (its hash slot, from the namespace,
//!   the namespace's placement and the id), the rule the server and the Python client follow
//!   too.
//!
//! Retrying what is retried is safe because timerdb makes it so: create-only Schedule and
//! ScheduleBatch are idempotent on (namespace, id) for the same request (`created = false` on
//! the retry), an unconditional Cancel answers a cancelled timer as cancelled, acks of an acked
//! timer succeed again ([`idempotent`] has the whole rule).

pub mod client;
pub mod connect;
pub mod consumer;
pub mod hash_slot;
pub mod idempotent;
pub mod retry;

pub use client::Client;
pub use connect::{Conn, Connector};
pub use consumer::{AckOutcome, Subscription, SubscriptionOptions};
pub use retry::Retry;

/// The generated `timerdb.v1` messages and client stubs (the `timerdb-proto` crate's; with the
/// `receiver` feature, the server stub a gRPC push receiver implements too).
pub use timerdb_proto::pb;

/// What a call of this library fails with: the server's status (for a connection that failed,
/// UNAVAILABLE with the cause as its source).
pub type Result<T> = std::result::Result<T, tonic::Status>;
