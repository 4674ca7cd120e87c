//! Routing a client call to the leader: one tower layer around every service.
//!
//! Each RPC's route is in [`crate::api::stack::methods`]. A `Local` call goes straight to its
//! service. A `Leader` call runs on the leader of its group (the grouping layer found it:
//! [`crate::api::stack::group`]; group 0 for every call of a cluster of one group): on this
//! node if it leads that group; elsewhere the unchanged request (method,
//! headers, the message bytes) is sent to the leader's client port, marked with the
//! `x-timerdb-forwarded` header, and the leader's answer (a message, or a stream of them) comes
//! back as it is. A node receiving a marked request that is not (or no longer) the leader
//! answers UNAVAILABLE at once rather than forwarding again, so a request makes at most one hop
//! and the follower retries with the leader it learns next. While no leader is known the call
//! waits, up to the node's `leader_wait`, then fails UNAVAILABLE.
//!
//! Only what is the same applied twice is ever sent twice (DESIGN invariant 9). The request's
//! message is kept (it is one message: no `Leader` RPC streams its requests) and sent again to
//! the next leader when it certainly did nothing — the connection to the leader could not be
//! made, or the answer says it was not proposed ([`NOT_APPLIED_HEADER`]: not the leader, no
//! quorum) — and, when its outcome is unknown (the leader went away mid-call, answered
//! UNAVAILABLE, or, on the leader itself, the handler found leadership gone: [`RETRY_HEADER`]),
//! only if `timerdb_client::idempotent::retry_safe` says the call is safe to repeat (a
//! create-only Schedule is found again and answered `created = false`). Any other call with an
//! unknown outcome is answered UNAVAILABLE saying so ([`OUTCOME_UNKNOWN_HEADER`]), never sent
//! again: a conditional cancel repeated after it applied would be refused for a change that
//! happened, a relative shift would apply twice. A stream's answer is not retried once it
//! began.
//!
//! The handlers hold only their own logic: they run where this layer sends them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::api::pb::timers_client::TimersClient;
use crate::api::stack::auth::{cert_user, JudgedAt, AUTHORIZATION, PRINCIPAL_HEADER};
use crate::api::stack::headers::{
    not_applied_status, EPOCH_HEADER, FORWARDED_HEADER, NOT_APPLIED_HEADER, OUTCOME_UNKNOWN_HEADER,
    RETRY_HEADER, SERVED_BY_HEADER,
};
use crate::api::stack::layer::{Answer, Around, Inner};
use crate::api::stack::methods::{self, Route};
use crate::api::MAX_CLIENT_MESSAGE_BYTES;
use crate::keys::GROUP_ZERO;
use crate::node::{Leader, Node, Nodes};

/// Pause between attempts while the leader is unknown or changing.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// Whether `req` was forwarded by another node.
pub fn is_forwarded<T>(req: &tonic::Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED_HEADER)
}

/// Wraps a Subscribe for the leader: marked forwarded, with the client's credential, and
/// without a deadline (it is a stream).
pub fn stream_request<T>(
    msg: T,
    credential: Option<crate::api::stack::auth::Credential>,
) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    if let Some((header, value)) = credential {
        r.metadata_mut().insert(header, value);
    }
    r
}

/// A Timers client for relaying streams over `ch`, with the client message limits.
pub fn timers(ch: Channel) -> TimersClient<Channel> {
    TimersClient::new(ch)
        .max_decoding_message_size(MAX_CLIENT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_CLIENT_MESSAGE_BYTES)
}

/// Routes calls to their group's leader; caches one channel per leader address.
pub struct Router {
    nodes: Arc<Nodes>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Router {
    pub fn new(nodes: Arc<Nodes>) -> Self {
        Router {
            nodes,
            channels: Mutex::new(HashMap::new()),
        }
    }

    /// Every group's door.
    pub fn nodes(&self) -> &Arc<Nodes> {
        &self.nodes
    }

    /// Group 0's door.
    pub fn node(&self) -> &Arc<Node> {
        self.nodes.meta()
    }

    /// Group `g`'s door.
    pub fn group(&self, g: crate::keys::Group) -> Result<&Arc<Node>, Status> {
        (self.nodes.group(g))
            .ok_or_else(|| Status::internal(format!("this node hosts no replica of group {g}")))
    }

    /// The door of the group holding `namespace`'s timers.
    pub fn node_of(&self, namespace: &str) -> Result<&Arc<Node>, Status> {
        Ok(self.nodes.of(namespace)?)
    }

    pub(crate) fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let channel = (self.node().config().tls)
            .channel(addr, |e| e.connect_timeout(Duration::from_secs(1)))
            .map_err(|e| Status::internal(format!("leader address {addr}: {e}")))?;
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}

/// The forwarding layer (`LayerOf(Arc<Router>)`): each call runs where its route says.
impl Around for Arc<Router> {
    fn around<S: Inner>(&self, inner: S, req: http::Request<Body>) -> Answer {
        match methods::rule_of(req.uri().path()).map(|r| r.route) {
            Some(Route::Leader { timeout }) => {
                let router = self.clone();
                Box::pin(async move { Ok(on_leader(&router, inner, req, timeout).await) })
            }
            // Local, or unknown (the auth layer refuses it; tonic answers UNIMPLEMENTED).
            _ => {
                let mut inner = inner;
                Box::pin(inner.call(req))
            }
        }
    }
}

/// Runs `req` on the leader: here through `inner`, or forwarded.
async fn on_leader<S: Inner>(
    router: &Router,
    inner: S,
    req: http::Request<Body>,
    timeout: Option<Duration>,
) -> http::Response<Body> {
    let group = crate::api::stack::group::of(req.extensions());
    let Some(node) = router.nodes.group(group) else {
        let msg = format!("this node hosts no replica of group {group}");
        return Status::internal(msg).into_http();
    };
    // Whose leader, in messages: with data groups, the call's group.
    let of = match group {
        GROUP_ZERO => String::new(),
        g => format!(" of group {g}"),
    };
    let forwarded = req.headers().contains_key(FORWARDED_HEADER);
    let deferred = req
        .extensions()
        .get::<crate::api::stack::auth::LeaderDecides>()
        .is_some();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let limit = match deferred {
        true => crate::api::stack::auth::DEFERRED_MESSAGE_BYTES.min(methods::message_limit(path)),
        false => methods::message_limit(path),
    };
    let message = match read_message(body, limit).await {
        Ok(m) => m,
        Err(status) if deferred && status.code() == Code::ResourceExhausted => {
            let msg = format!(
                "this node does not know the call's API key yet, and holds at most {limit} \
                 bytes of a call it cannot authorize: send it again"
            );
            return not_applied_status(msg).into_http();
        }
        Err(status) => return status.into_http(),
    };
    // Decoded only when an answer asks whether the call may be sent again: most calls are
    // answered at the first attempt, and the handler decodes the message anyway.
    let safe = || retry_safe(path, &message) || crate::sim::planted("retry-unsafe");
    let timeout = timeout.unwrap_or(node.config().write_timeout + Duration::from_secs(1));
    let deadline = Instant::now() + node.config().leader_wait;
    let mut last = String::from("no leader is known");
    loop {
        match node.leader() {
            Leader::Me if deferred => {
                // This node's gate, a follower's then, left the key to the leader: now this
                // node leads, and it runs nothing it has not authorized.
                let msg = "this node became the leader while the call's key was being checked";
                return not_applied_status(msg.into()).into_http();
            }
            Leader::Me => {
                if let Err(s) = judged_here(&router.nodes, node, &parts).await {
                    return s.into_http();
                }
                let mut req = rebuild(&parts, message.clone(), false, timeout);
                // The handler runs in the group the call was routed to.
                req.extensions_mut()
                    .insert(crate::api::stack::group::CallGroup(group));
                let resp = crate::api::stack::layer::call(inner.clone(), req).await;
                // Leadership moved under the call: the next leader may take it, if it did
                // nothing here or may be repeated.
                match retry_status(&resp) {
                    Some(s) if !forwarded && (not_applied(&resp) || safe()) => {
                        last = s.message().to_string()
                    }
                    _ => return resp,
                }
            }
            Leader::Other { id, .. } if forwarded => {
                let msg = format!("node {} is not the leader{of} (node {id} is)", node.id());
                return not_applied_status(msg).into_http();
            }
            Leader::Other { id, addr } => {
                let channel = match router.channel(&addr) {
                    Ok(c) => c,
                    Err(s) => return s.into_http(),
                };
                let epoch = router.nodes.sharded().then(|| router.nodes.map().epoch());
                let mut req = rebuild(&parts, message.clone(), true, timeout);
                if let Some(v) =
                    epoch.and_then(|e| http::HeaderValue::from_str(&e.to_string()).ok())
                {
                    req.headers_mut().insert(EPOCH_HEADER, v);
                }
                let mut channel = channel;
                // A channel is a buffer in front of the connection: it takes a call only once
                // ready. Not ready (no connection): nothing was sent.
                let ready = std::future::poll_fn(|cx| {
                    tower::Service::<http::Request<Body>>::poll_ready(&mut channel, cx)
                });
                match ready.await {
                    Err(e) => last = format!("leader {id} at {addr}: {}", crate::error::chain(&e)),
                    Ok(()) => match router
                        .nodes
                        .forward(tower::Service::call(&mut channel, req))
                        .await
                    {
                        Ok(resp) => match unknown_outcome(&resp) {
                            Some(s) if not_applied(&resp) || safe() => {
                                last = format!("leader {id} at {addr}: {}", s.message())
                            }
                            Some(s) => {
                                let why = format!("leader {id} at {addr}: {}", s.message());
                                return outcome_unknown(&why).into_http();
                            }
                            None => return served_by(resp, id),
                        },
                        // The connection broke under the call: the outcome is unknown.
                        Err(e) => {
                            let why = format!("leader {id} at {addr}: {}", crate::error::chain(&e));
                            if !safe() {
                                return outcome_unknown(&why).into_http();
                            }
                            last = why;
                        }
                    },
                }
            }
            Leader::Unknown if forwarded => {
                let msg = format!("node {} knows no leader{of}", node.id());
                return not_applied_status(msg).into_http();
            }
            Leader::Unknown => {}
        }
        if Instant::now() >= deadline {
            let msg = format!(
                "no leader{of} could serve the request within {:?}: {last}",
                node.config().leader_wait
            );
            return Status::unavailable(msg).into_http();
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// A call this node's gate judged when it was not this term's caught-up leader of group 0 (a
/// follower, elected while the call waited for a leader) runs here only once this node has
/// applied its predecessors' entries and the call's principal still holds against them
/// (`auth::still_holds`): an acknowledged SetAuth(on) or revocation is not bypassed. A data
/// group's call always is (its group's leader need not lead group 0, and a stale leader of
/// group 0 may not know it was deposed): this node first applies group 0's read index
/// (`Nodes::meta_caught_up`).
async fn judged_here(
    nodes: &Nodes,
    node: &Node,
    parts: &http::request::Parts,
) -> Result<(), Status> {
    let Some(JudgedAt(judged)) = parts.extensions.get().copied() else {
        return Ok(()); // not judged by the gate: an open method
    };
    let meta = nodes.meta();
    if node.group() != GROUP_ZERO {
        nodes.meta_caught_up(Duration::from_secs(1)).await?;
        return crate::api::stack::auth::still_holds(parts.extensions.get(), &meta.access());
    }
    let view = node.leader_view();
    if view.caught_up && judged == Some(view.term) {
        return Ok(());
    }
    if !node.until_applied_own_term(Duration::from_secs(1)).await {
        return Err(not_applied_status(
            "this node was just elected leader and is still applying its predecessor's \
             entries: send the call again"
                .into(),
        ));
    }
    crate::api::stack::auth::still_holds(parts.extensions.get(), &node.access())
}

/// Whether the call in `message` (one gRPC frame) may be sent twice (DESIGN 9). A compressed
/// or malformed frame is not looked into: not safe.
fn retry_safe(path: &str, message: &[u8]) -> bool {
    match message.split_first() {
        Some((0, rest)) if rest.len() >= crate::api::stack::first::FRAME_HEADER_BYTES - 1 => {
            timerdb_client::idempotent::retry_safe(
                path,
                &rest[crate::api::stack::first::FRAME_HEADER_BYTES - 1..],
            )
        }
        _ => false,
    }
}

/// `resp`, forwarded to and answered by node `id`, saying so ([`SERVED_BY_HEADER`]) when it
/// is an answer, not a refusal (a refusal comes trailers-only, its status in its headers): an
/// unauthenticated caller learns nothing of the cluster from it.
fn served_by(mut resp: http::Response<Body>, id: u64) -> http::Response<Body> {
    if !resp.headers().contains_key("grpc-status") {
        resp.headers_mut()
            .insert(SERVED_BY_HEADER, http::HeaderValue::from(id));
    }
    resp
}

/// Whether an answer says the call did nothing.
fn not_applied(resp: &http::Response<Body>) -> bool {
    resp.headers().contains_key(NOT_APPLIED_HEADER)
}

/// UNAVAILABLE for a forwarded call whose outcome is unknown and that is not sent again.
fn outcome_unknown(why: &str) -> Status {
    let mut s = Status::unavailable(format!(
        "the call's outcome is unknown ({why}); it was not sent again, because applying it twice \
         is not the same as once (a condition, a relative shift, a key creation, a one-timer \
         redrive): read the timer to see whether it happened"
    ));
    let one = tonic::metadata::MetadataValue::from_static("1");
    s.metadata_mut().insert(OUTCOME_UNKNOWN_HEADER, one);
    s
}

/// The request's bytes (one gRPC message of at most `max` bytes).
async fn read_message(body: Body, max: usize) -> Result<Bytes, Status> {
    let limit = max + crate::api::stack::first::FRAME_HEADER_BYTES;
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => {
            let too_big = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            Err(if too_big {
                Status::resource_exhausted(format!("request larger than {max} bytes"))
            } else {
                Status::cancelled(format!("reading the request: {e}"))
            })
        }
    }
}

/// The request again, from its parts and message; marked forwarded when it leaves, with a
/// deadline for the leader if the client gave none.
fn rebuild(
    parts: &http::request::Parts,
    message: Bytes,
    forward: bool,
    timeout: Duration,
) -> http::Request<Body> {
    let mut req = http::Request::new(Body::new(Full::new(message)));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    if forward {
        let h = req.headers_mut();
        h.insert(FORWARDED_HEADER, http::HeaderValue::from_static("1"));
        // The leader believes this header from a peer: only this node may set it, to the
        // certificate user the auth layer found here.
        h.remove(PRINCIPAL_HEADER);
        if !h.contains_key(AUTHORIZATION) {
            let user = cert_user(&parts.extensions);
            if let Some(v) = user.and_then(|n| http::HeaderValue::from_str(n).ok()) {
                h.insert(PRINCIPAL_HEADER, v);
            }
        }
        if !h.contains_key("grpc-timeout") {
            let ms = timeout.as_millis().min(99_999_999);
            if let Ok(v) = http::HeaderValue::from_str(&format!("{ms}m")) {
                h.insert("grpc-timeout", v);
            }
        }
    }
    req
}

/// The status of an answer that says "try the next leader": UNAVAILABLE marked
/// [`RETRY_HEADER`] by a handler that found leadership gone.
fn retry_status(resp: &http::Response<Body>) -> Option<Status> {
    let status = Status::from_header_map(resp.headers())?;
    (status.code() == Code::Unavailable && resp.headers().contains_key(RETRY_HEADER))
        .then_some(status)
}

/// The status of a forwarded call's answer that leaves its outcome unknown: UNAVAILABLE (the
/// leader refused or could not serve it) or CANCELLED (it went away mid-call).
fn unknown_outcome(resp: &http::Response<Body>) -> Option<Status> {
    let status = Status::from_header_map(resp.headers())?;
    matches!(status.code(), Code::Unavailable | Code::Cancelled).then_some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: Status) -> http::Response<Body> {
        status.into_http()
    }

    #[test]
    fn a_refusal_or_a_cancel_is_an_unknown_outcome_and_an_answer_is_not() {
        assert!(unknown_outcome(&answer(Status::unavailable("no leader"))).is_some());
        assert!(unknown_outcome(&answer(Status::cancelled("went away"))).is_some());
        assert!(unknown_outcome(&answer(Status::failed_precondition("stale"))).is_none());
        assert!(unknown_outcome(&answer(Status::not_found("no such timer"))).is_none());
        let ok = http::Response::new(Body::empty());
        assert!(unknown_outcome(&ok).is_none(), "an answer without a status");
    }

    #[test]
    fn only_a_marked_unavailable_sends_a_local_call_to_the_next_leader() {
        let mut moved = Status::unavailable("this node is not the leader");
        moved.metadata_mut().insert(
            RETRY_HEADER,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        assert!(retry_status(&answer(moved)).is_some());
        let cut_off = Status::unavailable("no quorum for 2 s");
        assert!(
            retry_status(&answer(cut_off)).is_none(),
            "NoQuorum: go elsewhere now"
        );
    }
}
