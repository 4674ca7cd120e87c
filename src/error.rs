//! The one error type of timerdb.
//!
//! Variants are named by what they mean to a caller, not by where they came from, so the gRPC
//! layer maps each to exactly one status code (that mapping lives in `api::convert`, the only
//! place that knows about `tonic::Status`). Storage I/O failures are `Storage`: inside the state
//! machine they are fatal to the node (apply must be deterministic), outside it they are reported.

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in timerdb, by meaning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Error {
    /// The request is malformed or out of range; retrying it unchanged cannot succeed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The named timer does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A different timer already holds this (namespace, id).
    #[error("{0}")]
    AlreadyExists(String),
    /// The timer is in a state that does not allow the operation (e.g. cancel after fire).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The request is too large for the configured limits.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A rate limit refused the request; the same request may succeed after `retry_after_ms`.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after_ms: u64,
    },
    /// This node is not the leader; the caller should retry against the leader.
    #[error("this node is not the leader")]
    NotLeader,
    /// The cluster cannot serve right now (no leader, shutting down); retry later.
    #[error("{0}")]
    Unavailable(String),
    /// This node leads but has heard from no quorum for a while (it is probably cut off): retry
    /// through another node. Unlike `Unavailable`, waiting here for a new leader is pointless.
    /// Nothing was proposed.
    #[error("{0}")]
    NoQuorum(String),
    /// The write was proposed and its outcome is unknown (it was not committed in time, the
    /// leader lost its quorum or stopped meanwhile): it may yet apply, or never. Only a call
    /// that is the same applied twice may be sent again (DESIGN 9); the caller of another
    /// finds out with a read.
    #[error("{0}")]
    OutcomeUnknown(String),
    /// Local storage failed.
    #[error("storage error: {0}")]
    Storage(String),
    /// A bug or an unexpected condition.
    #[error("internal error: {0}")]
    Internal(String),
    /// Something the call needs first is not there yet (the node being added does not answer
    /// yet, say). Nothing was done: the same call may succeed in a moment, safe to repeat or not.
    #[error("{0}")]
    NotYet(String),
}

impl Error {
    /// Whether the same request may succeed if retried (possibly on another node).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::NotLeader
                | Error::Unavailable(_)
                | Error::NoQuorum(_)
                | Error::OutcomeUnknown(_)
                | Error::NotYet(_)
        )
    }
}

/// An error and its sources, as one line ("transport error: connection refused"): a
/// transport error's own text says little.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Self {
        Error::Storage(e.to_string())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Storage(e.to_string())
    }
}
