//! Which Raft group a call is for (docs/sharding.md §4): one tower layer, after the auth layer
//! (so a message is read only once its caller was let on, within the auth layer's bounds) and
//! before the forwarding layer (which sends the call to that group's leader, where the call is
//! judged again against group 0's state caught up: `forward.rs`, `judged_here`).
//!
//! A `Timers` call is for the group holding its namespace's timers: the namespaces are read
//! from the first request message ([`names`]) and looked up in the slot map. A ScheduleBatch or AckBatch whose namespaces lie in two groups is refused
//! INVALID_ARGUMENT, naming both, before anything is proposed (DESIGN 10): a batch is atomic
//! within one group's log, and across groups nothing makes it so. Every other call is group
//! 0's (namespaces, keys, members), but TransferLeader, which names the group whose leader
//! hands over (one the cluster lacks: INVALID_ARGUMENT). The streams (Subscribe, Consume) are served by their
//! group's leader, which they find themselves (`api/services/subscribe.rs`). In a cluster of
//! one group nothing is read: every call is group 0's.
//!
//! A forwarded call carries the sender's slot map epoch ([`EPOCH_HEADER`]); a node whose map
//! has another epoch refuses it not applied (so the sender may send it again), rather than run
//! it in a group the sender did not mean. (Only a member may mark a call forwarded: the auth
//! layer checks; a client's epoch header is ignored.)

use std::sync::Arc;

use prost::Message as _;
use tonic::body::Body;
use tonic::Status;

use crate::api::stack::headers::{not_applied_status, EPOCH_HEADER, FORWARDED_HEADER};
use crate::api::stack::layer::{Answer, Around, Inner};
use crate::api::stack::methods::{self, Access};
use crate::api::stack::names;
use crate::keys::{Group, GROUP_ZERO};
use crate::node::Nodes;

/// The group a call is for, in its extensions (absent: group 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallGroup(pub Group);

/// The group of the call in `extensions`.
pub fn of(extensions: &http::Extensions) -> Group {
    extensions.get::<CallGroup>().map_or(GROUP_ZERO, |g| g.0)
}

/// The group of `request` (a handler's view of [`of`]).
pub fn of_request<T>(request: &tonic::Request<T>) -> Group {
    request
        .extensions()
        .get::<CallGroup>()
        .map_or(GROUP_ZERO, |g| g.0)
}

/// The grouping layer (`LayerOf(Grouping)`).
#[derive(Clone)]
pub struct Grouping(pub Arc<Nodes>);

impl Around for Grouping {
    fn around<S: Inner>(&self, inner: S, req: http::Request<Body>) -> Answer {
        let nodes = self.0.clone();
        Box::pin(async move {
            match group(&nodes, req).await {
                Ok(req) => Ok(crate::api::stack::layer::call(inner, req).await),
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// `req` with its group in its extensions, or why it is refused.
async fn group(nodes: &Nodes, req: http::Request<Body>) -> Result<http::Request<Body>, Status> {
    if !nodes.sharded() {
        return Ok(req);
    }
    let forwarded = req.headers().contains_key(FORWARDED_HEADER);
    if let Some(sent) = req.headers().get(EPOCH_HEADER).filter(|_| forwarded) {
        let epoch = nodes.map().epoch();
        if sent.to_str().ok().and_then(|s| s.parse::<u64>().ok()) != Some(epoch) {
            return Err(not_applied_status(format!(
                "the call was routed by slot map epoch {sent:?}, and this node's is {epoch}: \
                 send it again"
            )));
        }
    }
    let path = req.uri().path();
    if path == TRANSFER_LEADER {
        return by_group_field(nodes, req).await;
    }
    let Some(rule) = methods::rule_of(path) else {
        return Ok(req); // refused by the auth layer
    };
    let Some(names) = grouped_by(rule.path, rule.access) else {
        return Ok(req);
    };
    let limit = methods::message_limit(path);
    let (parts, body) = req.into_parts();
    let first = crate::api::stack::first::first_message(body, limit).await?;
    let namespaces = names::namespaces(names, &first.message)?.unwrap_or_default();
    let group = one_group(nodes, &namespaces)?;
    let mut req = http::Request::from_parts(parts, first.hand_on());
    req.extensions_mut().insert(CallGroup(group));
    Ok(req)
}

/// The one call that names its group: an operator moves a group's leader.
const TRANSFER_LEADER: &str = "/timerdb.v1.Cluster/TransferLeader";

/// `req` (a TransferLeader) routed to the group its message names, or INVALID_ARGUMENT for a
/// group the cluster does not have.
async fn by_group_field(
    nodes: &Nodes,
    req: http::Request<Body>,
) -> Result<http::Request<Body>, Status> {
    let limit = methods::message_limit(TRANSFER_LEADER);
    let (parts, body) = req.into_parts();
    let first = crate::api::stack::first::first_message(body, limit).await?;
    let message = crate::api::pb::TransferLeaderRequest::decode(first.message.as_ref())
        .map_err(|e| Status::invalid_argument(format!("the request does not decode: {e}")))?;
    let groups = nodes.map().groups();
    let group = Group::try_from(message.group)
        .ok()
        .filter(|g| *g <= groups)
        .ok_or_else(|| no_such_group(message.group, groups))?;
    let mut req = http::Request::from_parts(parts, first.hand_on());
    req.extensions_mut().insert(CallGroup(group));
    Ok(req)
}

/// INVALID_ARGUMENT for a call naming `group`, which a cluster of `groups` data groups lacks.
pub fn no_such_group(group: u32, groups: Group) -> Status {
    Status::invalid_argument(match groups {
        0 => format!("this cluster has no data groups: group {group} does not exist (0 is)"),
        n => format!("this cluster has groups 0 to {n}: group {group} does not exist"),
    })
}

/// Where the namespaces that decide the group of an RPC are: a Timers call's (every Timers
/// RPC names its namespaces: a unit test checks), none for every other service's.
fn grouped_by(path: &str, access: Access) -> Option<methods::Names> {
    match access {
        Access::Namespace(_, names) if path.starts_with("/timerdb.v1.Timers/") => Some(names),
        _ => None,
    }
}

/// The one group holding every namespace of `namespaces` (none: the group of the empty
/// namespace, which the handler refuses), or INVALID_ARGUMENT naming two in different groups.
fn one_group(nodes: &Nodes, namespaces: &[String]) -> Result<Group, Status> {
    let first = namespaces.first().map_or("", String::as_str);
    let group = nodes.group_of(first);
    match namespaces.iter().find(|ns| nodes.group_of(ns) != group) {
        None => Ok(group),
        Some(other) => Err(Status::invalid_argument(format!(
            "a batch is applied in one Raft group, and its namespaces {first:?} (group {group}) \
             and {other:?} (group {}) are in two: send one batch per group",
            nodes.group_of(other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Timers RPC without the namespaces it names would run in group 0, whatever its
    /// namespace's group: every one must say where they are.
    #[test]
    fn every_timers_rpc_is_grouped_by_its_namespaces() {
        let timers = methods::RULES
            .iter()
            .filter(|r| r.path.starts_with("/timerdb.v1.Timers/"));
        for rule in timers {
            let names = grouped_by(rule.path, rule.access);
            assert!(
                names.is_some_and(|n| n != methods::Names::All),
                "{} names no namespace the grouping layer can read",
                rule.path
            );
        }
    }
}
