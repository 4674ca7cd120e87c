//! Routing a client call to the leader.
//!
//! On the leader the call runs locally. On a follower the unchanged request is sent to the
//! leader's own client service, marked with the `x-timerdb-forwarded` header; a node receiving a
//! marked request that is not (or no longer) the leader answers UNAVAILABLE at once rather than
//! forwarding again, so a request makes at most one hop and the follower retries with the
//! leader it learns next. While no leader is known the call waits, up to the node's
//! `leader_wait`, then fails UNAVAILABLE.
//!
//! Retrying is safe because every command is idempotent (DESIGN "unknown outcomes"): a Schedule
//! that committed before its reply was lost is found again and answered `created = false`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::pb::namespaces_client::NamespacesClient;
use super::pb::timers_client::TimersClient;
use super::MAX_CLIENT_MESSAGE_BYTES;
use crate::node::{Leader, Node};

/// Marks a request forwarded by a follower.
pub const FORWARDED_HEADER: &str = "x-timerdb-forwarded";

/// Pause between attempts while the leader is unknown or changing.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// Whether `req` was forwarded by another node.
pub fn is_forwarded<T>(req: &tonic::Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED_HEADER)
}

/// Wraps `msg` for forwarding to the leader.
pub fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    r.set_timeout(timeout);
    r
}

/// Wraps a Subscribe for the leader: marked forwarded, and without a deadline (it is a stream).
pub fn stream_request<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    r
}

/// A Timers client for forwarding over `ch`, with the client message limits.
pub fn timers(ch: Channel) -> TimersClient<Channel> {
    TimersClient::new(ch)
        .max_decoding_message_size(MAX_CLIENT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_CLIENT_MESSAGE_BYTES)
}

/// A Namespaces client for forwarding over `ch`.
pub fn namespaces(ch: Channel) -> NamespacesClient<Channel> {
    NamespacesClient::new(ch)
}

/// Routes calls to the leader; caches one channel per leader address.
pub struct Router {
    node: Arc<Node>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Router {
    pub fn new(node: Arc<Node>) -> Self {
        Router {
            node,
            channels: Mutex::new(HashMap::new()),
        }
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// How long a forwarded call may take at the leader.
    pub fn forward_timeout(&self) -> Duration {
        self.node.config.write_timeout + Duration::from_secs(1)
    }

    pub(crate) fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Status::internal(format!("bad leader address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// Runs `local` if this node leads, else `remote` against the leader, retrying retryable
    /// failures until the leader wait runs out.
    pub async fn route<T, L, LF, R, RF>(
        &self,
        forwarded: bool,
        mut local: L,
        mut remote: R,
    ) -> Result<T, Status>
    where
        L: FnMut() -> LF,
        LF: Future<Output = crate::Result<T>>,
        R: FnMut(Channel) -> RF,
        RF: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.node.config.leader_wait;
        let mut last = String::from("no leader is known");
        loop {
            match self.node.leader() {
                Leader::Me => match local().await {
                    // Cut off from its quorum, this node will not learn of a new leader by
                    // waiting: the caller hears it at once and tries another node.
                    Err(e @ crate::Error::NoQuorum(_)) => return Err(e.into()),
                    Err(e) if e.is_retryable() => last = e.to_string(),
                    other => return other.map_err(Status::from),
                },
                Leader::Other { id, .. } if forwarded => {
                    return Err(Status::unavailable(format!(
                        "node {} is not the leader (node {id} is)",
                        self.node.id
                    )))
                }
                Leader::Other { id, addr } => match remote(self.channel(&addr)?).await {
                    Ok(reply) => return Ok(reply.into_inner()),
                    // The outcome is unknown, and retrying the idempotent request is safe.
                    Err(s) if unknown_outcome(&s) => {
                        last = format!("leader {id} at {addr}: {}", s.message())
                    }
                    Err(s) => return Err(s),
                },
                Leader::Unknown if forwarded => {
                    return Err(Status::unavailable(format!(
                        "node {} knows no leader",
                        self.node.id
                    )))
                }
                Leader::Unknown => {}
            }
            if Instant::now() >= deadline {
                return Err(Status::unavailable(format!(
                    "no leader could serve the request within {:?}: {last}",
                    self.node.config.leader_wait
                )));
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// Whether a forwarded call failed without an answer from the leader: UNAVAILABLE (it refused
/// or could not be reached), CANCELLED (it went away mid-call), or the connection broke under
/// the call (tonic reports a reset HTTP/2 connection as INTERNAL "h2 protocol error"; seen when
/// a leader is stopped while answering). No timerd handler answers with that message.
fn unknown_outcome(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::Cancelled => true,
        Code::Internal => s.message().starts_with("h2 protocol error"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_an_unknown_outcome_and_an_answer_is_not() {
        assert!(unknown_outcome(&Status::unavailable("no leader")));
        assert!(unknown_outcome(&Status::cancelled("went away")));
        assert!(unknown_outcome(&Status::internal(
            "h2 protocol error: http2 error"
        )));
        assert!(!unknown_outcome(&Status::internal("unexpected response")));
        assert!(!unknown_outcome(&Status::failed_precondition("stale")));
        assert!(!unknown_outcome(&Status::not_found("no such timer")));
    }
}
