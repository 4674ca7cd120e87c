//! Every RPC a node serves, and what the layers around the services do with each: where it runs
//! ([`Route`]) and who may call it ([`Access`]).
//!
//! One table, so a concern that applies to many RPCs is decided once per RPC, here, instead of
//! in each handler. The forwarding layer (`forward`) reads the route; the auth layer reads the
//! access. An RPC the table does not name is refused (default deny): a unit test checks the
//! table against the descriptors of every service the server registers, so a new RPC cannot
//! be forgotten.

use std::time::Duration;

/// Where an RPC runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// On the node that received it (node-local answers, and the streams that follow the
    /// leader by themselves: Subscribe, Consume).
    Local,
    /// On the leader: a follower forwards it (`timeout` for the forwarded call when the client
    /// set none; `None`: the node's write timeout).
    Leader { timeout: Option<Duration> },
}

pub use crate::auth::Permission;

/// Where in a request message the namespaces it touches are (the auth layer decodes only
/// these fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// Field 1 is the namespace (or, in the Namespaces service, its name).
    Field1,
    /// Field 1 is a repeated message whose field 1 is a namespace (ScheduleBatch, AckBatch).
    EachOf1,
    /// Field 1 is a message whose field 1 is the namespace (Consume's first message).
    InnerOf1,
    /// Every namespace (ListNamespaces lists them all).
    All,
}

/// Who may call an RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (health checks, reflection).
    Open,
    /// Only another member of the cluster (the peer `Raft` service).
    Peer,
    /// Any valid credential.
    Authenticated,
    /// An admin.
    Admin,
    /// A credential holding this permission on every namespace the request names (found
    /// where [`Names`] says).
    Namespace(Permission, Names),
}

/// One RPC's rule.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The gRPC path, `/package.Service/Method`.
    pub path: &'static str,
    pub route: Route,
    pub access: Access,
}

const LEADER: Route = Route::Leader { timeout: None };
const fn leader_within(secs: u64) -> Route {
    Route::Leader {
        timeout: Some(Duration::from_secs(secs)),
    }
}

/// How long a forwarded AddNode may take: the new node catches up first (up to a minute), in
/// group 0 and then in each data group (`node/members.rs`).
const ADD_NODE_SECS: u64 = 600;
/// How long a forwarded RemoveNode may take: in a cluster of data groups, a hand-over and a
/// membership change in each group.
const REMOVE_NODE_SECS: u64 = 120;
/// A forwarded Backup streams a whole snapshot: bounded by the client, not by the node.
const BACKUP_SECS: u64 = 24 * 3600;

/// Every RPC of every service the client and peer ports serve.
pub const RULES: &[Rule] = &[
    // timerdb.v1.Timers
    rule(
        "/timerdb.v1.Timers/Schedule",
        LEADER,
        ns(Permission::Schedule),
    ),
    rule(
        "/timerdb.v1.Timers/ScheduleBatch",
        LEADER,
        ns_in(Permission::Schedule, Names::EachOf1),
    ),
    rule(
        "/timerdb.v1.Timers/Cancel",
        LEADER,
        ns(Permission::Schedule),
    ),
    rule(
        "/timerdb.v1.Timers/Reschedule",
        LEADER,
        ns(Permission::Schedule),
    ),
    rule("/timerdb.v1.Timers/Get", LEADER, ns(Permission::Read)),
    rule("/timerdb.v1.Timers/List", LEADER, ns(Permission::Read)),
    rule(
        "/timerdb.v1.Timers/Subscribe",
        Route::Local,
        ns(Permission::Consume),
    ),
    rule(
        "/timerdb.v1.Timers/Consume",
        Route::Local,
        ns_in(Permission::Consume, Names::InnerOf1),
    ),
    rule("/timerdb.v1.Timers/Ack", LEADER, ns(Permission::Consume)),
    rule(
        "/timerdb.v1.Timers/AckBatch",
        LEADER,
        ns_in(Permission::Consume, Names::EachOf1),
    ),
    rule("/timerdb.v1.Timers/Nack", LEADER, ns(Permission::Consume)),
    rule("/timerdb.v1.Timers/Redrive", LEADER, ns(Permission::Manage)),
    rule("/timerdb.v1.Timers/Pause", LEADER, ns(Permission::Schedule)),
    rule(
        "/timerdb.v1.Timers/Resume",
        LEADER,
        ns(Permission::Schedule),
    ),
    // timerdb.v1.Namespaces
    rule(
        "/timerdb.v1.Namespaces/PutNamespace",
        LEADER,
        ns(Permission::Manage),
    ),
    rule(
        "/timerdb.v1.Namespaces/GetNamespace",
        LEADER,
        ns(Permission::Read),
    ),
    rule(
        "/timerdb.v1.Namespaces/ListNamespaces",
        LEADER,
        ns_in(Permission::Read, Names::All),
    ),
    rule(
        "/timerdb.v1.Namespaces/PauseNamespace",
        LEADER,
        ns(Permission::Manage),
    ),
    rule(
        "/timerdb.v1.Namespaces/ResumeNamespace",
        LEADER,
        ns(Permission::Manage),
    ),
    // timerdb.v1.Cluster
    rule(
        "/timerdb.v1.Cluster/Status",
        Route::Local,
        Access::Authenticated,
    ),
    rule(
        "/timerdb.v1.Cluster/Overview",
        LEADER,
        ns_in(Permission::Read, Names::All),
    ),
    rule(
        "/timerdb.v1.Cluster/Digest",
        Route::Local,
        Access::Authenticated,
    ),
    rule(
        "/timerdb.v1.Cluster/Slots",
        Route::Local,
        Access::Authenticated,
    ),
    rule(
        "/timerdb.v1.Cluster/AddNode",
        leader_within(ADD_NODE_SECS),
        Access::Admin,
    ),
    rule(
        "/timerdb.v1.Cluster/RemoveNode",
        leader_within(REMOVE_NODE_SECS),
        Access::Admin,
    ),
    rule("/timerdb.v1.Cluster/TransferLeader", LEADER, Access::Admin),
    rule(
        "/timerdb.v1.Cluster/Backup",
        leader_within(BACKUP_SECS),
        Access::Admin,
    ),
    // timerdb.v1.Access
    rule("/timerdb.v1.Access/CreateKey", LEADER, Access::Admin),
    rule("/timerdb.v1.Access/RevokeKey", LEADER, Access::Admin),
    rule("/timerdb.v1.Access/ListKeys", LEADER, Access::Admin),
    rule("/timerdb.v1.Access/SetAuth", LEADER, Access::Admin),
    rule(
        "/timerdb.v1.Access/WhoAmI",
        Route::Local,
        Access::Authenticated,
    ),
    // timerdb.v1.Raft (peers only)
    rule("/timerdb.v1.Raft/AppendEntries", Route::Local, Access::Peer),
    rule("/timerdb.v1.Raft/Vote", Route::Local, Access::Peer),
    rule("/timerdb.v1.Raft/PreVote", Route::Local, Access::Peer),
    rule(
        "/timerdb.v1.Raft/InstallSnapshot",
        Route::Local,
        Access::Peer,
    ),
    rule(
        "/timerdb.v1.Raft/TransferLeader",
        Route::Local,
        Access::Peer,
    ),
    rule("/timerdb.v1.Raft/TimeoutNow", Route::Local, Access::Peer),
    rule("/timerdb.v1.Raft/Hello", Route::Local, Access::Peer),
    rule("/timerdb.v1.Raft/ReadIndex", Route::Local, Access::Peer),
    // timerdb.v1.Groups (peers only: the data groups' Raft)
    rule(
        "/timerdb.v1.Groups/AppendEntries",
        Route::Local,
        Access::Peer,
    ),
    rule("/timerdb.v1.Groups/Vote", Route::Local, Access::Peer),
    rule("/timerdb.v1.Groups/PreVote", Route::Local, Access::Peer),
    rule(
        "/timerdb.v1.Groups/InstallSnapshot",
        Route::Local,
        Access::Peer,
    ),
    rule(
        "/timerdb.v1.Groups/TransferLeader",
        Route::Local,
        Access::Peer,
    ),
    rule("/timerdb.v1.Groups/TimeoutNow", Route::Local, Access::Peer),
    rule("/timerdb.v1.Groups/Ping", Route::Local, Access::Peer),
    rule("/timerdb.v1.Groups/Handover", Route::Local, Access::Peer),
    rule("/timerdb.v1.Groups/Hello", Route::Local, Access::Peer),
    rule("/timerdb.v1.Groups/Member", Route::Local, Access::Peer),
    // grpc.health.v1 and server reflection
    rule("/grpc.health.v1.Health/Check", Route::Local, Access::Open),
    rule("/grpc.health.v1.Health/Watch", Route::Local, Access::Open),
    rule(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        Route::Local,
        Access::Open,
    ),
];

const fn rule(path: &'static str, route: Route, access: Access) -> Rule {
    Rule {
        path,
        route,
        access,
    }
}

const fn ns(p: Permission) -> Access {
    Access::Namespace(p, Names::Field1)
}

const fn ns_in(p: Permission, names: Names) -> Access {
    Access::Namespace(p, names)
}

/// Largest request message the RPC at `path` accepts: what the layers that read a request
/// before its service (auth, forwarding) buffer at most.
pub fn message_limit(path: &str) -> usize {
    if path.starts_with("/timerdb.v1.Timers/") {
        crate::api::MAX_CLIENT_MESSAGE_BYTES
    } else if path.starts_with("/timerdb.v1.Raft/") || path.starts_with("/timerdb.v1.Groups/") {
        crate::cluster::MAX_PEER_MESSAGE_BYTES
    } else {
        crate::api::MAX_SMALL_MESSAGE_BYTES
    }
}

/// The rule of the RPC at `path`, if there is one.
pub fn rule_of(path: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.path == path)
}

/// Where `path`'s rule is in [`RULES`].
pub fn index_of(path: &str) -> Option<usize> {
    RULES.iter().position(|r| r.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use prost_types::FileDescriptorSet;

    /// Every method of the services in `set`, as gRPC paths.
    fn paths(set: &[u8]) -> Vec<String> {
        let set = FileDescriptorSet::decode(set).unwrap();
        let mut out = Vec::new();
        for file in set.file {
            let package = file.package.unwrap_or_default();
            for service in file.service {
                let name = service.name.unwrap_or_default();
                for m in service.method {
                    out.push(format!("/{package}.{name}/{}", m.name.unwrap_or_default()));
                }
            }
        }
        out
    }

    #[test]
    fn every_rpc_the_server_registers_has_a_rule_and_no_rule_is_stale() {
        let mut served = paths(crate::api::FILE_DESCRIPTOR_SET);
        served.extend(paths(tonic_health::pb::FILE_DESCRIPTOR_SET));
        served.push("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo".into());
        // The Receiver service is what push receivers implement; no node serves it.
        served.retain(|p| !p.starts_with("/timerdb.v1.Receiver/"));
        for path in &served {
            assert!(
                rule_of(path).is_some(),
                "no rule for {path}: add it to RULES"
            );
        }
        for r in RULES {
            assert!(
                served.iter().any(|p| p == r.path),
                "{} is not served",
                r.path
            );
        }
        let mut seen = std::collections::HashSet::new();
        assert!(RULES.iter().all(|r| seen.insert(r.path)), "a path twice");
    }
}
