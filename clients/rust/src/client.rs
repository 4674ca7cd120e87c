//! [`Client`]: typed calls to a cluster, sent to the leader when it is known, retried when
//! that is safe.
//!
//! The client holds a lazy connection to every node it was given and learns, from their
//! `Cluster.Status`, each one's id and which one leads. Calls go to the leader (any node would
//! do: a follower forwards, but that is one more hop); when a call to a node fails with a
//! transient status the node is passed over, the next call goes to the next node, and the
//! leader is looked up again. Only nodes the caller named are used (a member's advertised
//! address may be its peer port, closed to clients).
//!
//! A sharded cluster (docs/sharding.md §4) has one leader per Raft group. The client also
//! learns the slot map (`Cluster.Slots`: each group's hash slots and leader) and sends a call
//! that names a namespace to the leader of the group holding the namespace's timers (its hash
//! slot: [`crate::hash_slot`]). Routing by the map only saves hops: any node takes any call
//! and forwards it to the right leader, whose id comes back on the answer
//! (`x-timerdb-served-by`), so the client follows a group's leader as it moves without asking.
//! The map is refreshed with the leaders, after a failure; what it says of each group is kept
//! unless the refresh knows a later term (a node that has not seen an election yet does not
//! bring back a leader the client saw fail, or forget one an answer named). Servers without
//! groups answer no map (UNIMPLEMENTED): every call then goes to the one leader, as before.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Status;

use crate::connect::{Conn, Connector};
use crate::pb::{self, access_client::AccessClient, cluster_client::ClusterClient};
use crate::pb::{namespaces_client::NamespacesClient, timers_client::TimersClient};
use crate::retry::{transient, Retry};
use crate::Result;

/// The metadata key a node sets on an UNAVAILABLE answer to a call it did not propose.
pub const NOT_APPLIED: &str = "x-timerdb-not-applied";
/// The metadata key a node sets on an answer it forwarded: the id of the leader that served it.
pub const SERVED_BY: &str = "x-timerdb-served-by";

/// A client of one cluster (cheap to clone: clones share connections and what was learned).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    retry: Retry,
    timeout: Duration,
    nodes: Vec<Node>,
    state: Mutex<State>,
}

struct Node {
    addr: String,
    conn: Conn,
}

#[derive(Default)]
struct State {
    /// Each node's id, once it answered a Status.
    ids: Vec<Option<u64>>,
    /// The node believed to lead (an index into `nodes`).
    leader: Option<usize>,
    /// Where the next call goes while no leader is known.
    next: usize,
    /// The slot map, in a cluster of data groups.
    map: Option<Map>,
}

/// The slot map as the client last learned it: which group holds a namespace, and who leads it.
#[derive(Debug, Clone, Default)]
struct Map {
    epoch: u64,
    /// `(first hash slot, one past the last, group)`.
    ranges: Vec<(u32, u32, u32)>,
    /// Each group's leader by node id (none: not known, or failed a call) and the term it
    /// was known in.
    leaders: std::collections::HashMap<u32, (Option<u64>, u64)>,
}

/// What a refresh learned of the slot map.
enum Learned {
    Map(Map),
    /// Every node that answered is a build before groups.
    NoGroups,
    /// No node answered the question.
    Nothing,
}

impl Map {
    fn from_pb(m: pb::SlotsResponse) -> Map {
        let mut map = Map {
            epoch: m.epoch,
            ..Map::default()
        };
        for g in m.groups {
            for r in &g.hash_slots {
                map.ranges.push((r.start, r.end, g.group));
            }
            let leader = (g.leader_id != 0).then_some(g.leader_id);
            map.leaders.insert(g.group, (leader, g.term));
        }
        map
    }

    /// `newer` (just asked of one node) merged into this map: the newer epoch's hash slots,
    /// and per group the entry of the later term; at one term, a leader this client saw fail
    /// stays unknown.
    fn merge(mut self, newer: Map) -> Map {
        if newer.epoch >= self.epoch {
            self.epoch = newer.epoch;
            self.ranges = newer.ranges;
        }
        for (g, (leader, term)) in newer.leaders {
            let keep = match self.leaders.get(&g) {
                Some((known, t)) => *t > term || (*t == term && known.is_none()),
                None => false,
            };
            if !keep {
                self.leaders.insert(g, (leader, term));
            }
        }
        self
    }

    /// The group holding `namespace`'s timers (every namespace is pinned today: one hash slot).
    fn group_of(&self, namespace: &str) -> Option<u32> {
        use crate::hash_slot::{hash_slot, Placement};
        let h = u32::from(hash_slot(namespace, Placement::Pinned, "").get());
        (self.ranges.iter())
            .find(|(start, end, _)| (*start..*end).contains(&h))
            .map(|r| r.2)
    }
}

impl Client {
    /// A client of the cluster whose client ports include `addrs` (`HOST:PORT`), with the
    /// default retry policy and a 10 s bound on each attempt. Fails only if no node answers.
    pub async fn connect(connector: Connector, addrs: &[impl AsRef<str>]) -> Result<Client> {
        Self::with(connector, addrs, Retry::default(), Duration::from_secs(10)).await
    }

    /// [`Client::connect`] with a retry policy and a bound on each attempt.
    pub async fn with(
        connector: Connector,
        addrs: &[impl AsRef<str>],
        retry: Retry,
        timeout: Duration,
    ) -> Result<Client> {
        if addrs.is_empty() {
            return Err(Status::invalid_argument("no node address given"));
        }
        let mut nodes = Vec::new();
        for a in addrs {
            let addr = a.as_ref().to_string();
            let conn = connector.lazy(&addr)?;
            nodes.push(Node { addr, conn });
        }
        let n = nodes.len();
        let client = Client {
            inner: Arc::new(Inner {
                connector,
                retry,
                timeout,
                nodes,
                state: Mutex::new(State {
                    ids: vec![None; n],
                    ..State::default()
                }),
            }),
        };
        if !client.refresh().await {
            let addrs: Vec<&str> = client.inner.nodes.iter().map(|n| n.addr.as_str()).collect();
            return Err(Status::unavailable(format!(
                "no node answered: {}",
                addrs.join(", ")
            )));
        }
        Ok(client)
    }

    /// The connector the client was made with (for calls to one node on purpose).
    pub fn connector(&self) -> &Connector {
        &self.inner.connector
    }

    /// The address the next call goes to.
    pub fn current(&self) -> &str {
        &self.inner.nodes[self.pick(None)].addr
    }

    /// The id of the node believed to lead, if known.
    pub fn leader_id(&self) -> Option<u64> {
        let s = self.inner.state.lock().unwrap();
        s.leader.and_then(|i| s.ids[i])
    }

    /// The address a call naming `namespace` goes to next: its group's leader when known.
    pub fn current_for(&self, namespace: &str) -> &str {
        &self.inner.nodes[self.pick(Some(namespace))].addr
    }

    /// The slot map's epoch as the client last learned it (none: no data groups, or a server
    /// without them).
    pub fn map_epoch(&self) -> Option<u64> {
        let s = self.inner.state.lock().unwrap();
        s.map.as_ref().map(|m| m.epoch)
    }

    /// Asks every node its Status (at once, briefly) and learns ids and the leader. True if
    /// any node answered.
    pub async fn refresh(&self) -> bool {
        let asks = self.inner.nodes.iter().map(|node| {
            let mut c = ClusterClient::new(node.conn.clone());
            async move {
                let mut req = tonic::Request::new(pb::StatusRequest {});
                req.set_timeout(Duration::from_secs(1));
                let call = c.status(req);
                match tokio::time::timeout(Duration::from_millis(1500), call).await {
                    Ok(Ok(r)) => Some(r.into_inner()),
                    _ => None,
                }
            }
        });
        let answers = futures::future::join_all(asks).await;
        let learned = self.slots(&answers).await;
        let mut s = self.inner.state.lock().unwrap();
        s.map = match (s.map.take(), learned) {
            (Some(known), Learned::Map(newer)) => Some(known.merge(newer)),
            (None, Learned::Map(newer)) => Some(newer),
            (_, Learned::NoGroups) => None,
            (known, Learned::Nothing) => known,
        };
        let mut leader_id = None;
        for (i, a) in answers.iter().enumerate() {
            if let Some(a) = a {
                s.ids[i] = Some(a.node_id);
                if a.role == "leader" {
                    leader_id = Some(a.node_id);
                } else if a.leader_id != 0 && leader_id.is_none() {
                    leader_id = Some(a.leader_id);
                }
            }
        }
        s.leader = leader_id.and_then(|id| s.ids.iter().position(|x| *x == Some(id)));
        answers.iter().any(Option::is_some)
    }

    /// The slot map from the first node, of those that answered a Status, that gives one.
    async fn slots(&self, answered: &[Option<pb::StatusResponse>]) -> Learned {
        let nodes = (self.inner.nodes.iter().zip(answered)).filter(|(_, a)| a.is_some());
        let mut learned = Learned::Nothing;
        for (node, _) in nodes {
            let mut req = tonic::Request::new(pb::SlotsRequest {});
            req.set_timeout(Duration::from_secs(1));
            let mut cluster = ClusterClient::new(node.conn.clone());
            match tokio::time::timeout(Duration::from_millis(1500), cluster.slots(req)).await {
                Ok(Ok(r)) => return Learned::Map(Map::from_pb(r.into_inner())),
                // A build before groups (every call to the one leader), unless another says
                // otherwise: in an upgrade, nodes of both builds answer.
                Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => learned = Learned::NoGroups,
                _ => continue,
            }
        }
        learned
    }

    /// The node a call goes to: the leader of the group holding `namespace`'s timers if
    /// known, else the leader, else the next node.
    fn pick(&self, namespace: Option<&str>) -> usize {
        let s = self.inner.state.lock().unwrap();
        let group_leader = namespace.and_then(|ns| {
            let map = s.map.as_ref()?;
            let id = map.leaders.get(&map.group_of(ns)?)?.0?;
            s.ids.iter().position(|x| *x == Some(id))
        });
        (group_leader.or(s.leader)).unwrap_or(s.next % self.inner.nodes.len())
    }

    /// Node `i` failed a call: pass it over until the leader is learned again.
    fn passed_over(&self, i: usize) {
        let mut s = self.inner.state.lock().unwrap();
        if s.leader == Some(i) {
            s.leader = None;
        }
        if let (Some(id), Some(map)) = (s.ids[i], s.map.as_mut()) {
            for (leader, _) in map.leaders.values_mut() {
                if *leader == Some(id) {
                    *leader = None;
                }
            }
        }
        s.next = i + 1;
    }

    /// A call naming `namespace` was served by node `id` (forwarded there by the node it was
    /// sent to): that node leads the namespace's group now.
    fn served_by(&self, namespace: &str, id: u64) {
        let mut s = self.inner.state.lock().unwrap();
        if let Some(map) = s.map.as_mut() {
            if let Some(g) = map.group_of(namespace) {
                // Another leader than the one known: elected in a later term than that one.
                let entry = map.leaders.entry(g).or_insert((None, 0));
                if entry.0 != Some(id) {
                    *entry = (Some(id), entry.1 + 1);
                }
            }
        }
    }

    /// Runs `call` on a node's connection, retrying it under the client's policy if
    /// `idempotent`. The generic form of every typed call below (which also route by their
    /// namespace: [`Client::call_in`]).
    pub async fn call<T, F, Fut>(&self, idempotent: bool, call: F) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let call = |conn| {
            let answer = call(conn);
            async move { answer.await.map(tonic::Response::new) }
        };
        self.call_in(None, idempotent, call).await
    }

    /// [`Client::call`] of a call naming `namespace` (none: any group's), sent to the leader of
    /// its group when known; the answer's `x-timerdb-served-by` teaches where that is.
    pub async fn call_in<T, F, Fut>(
        &self,
        namespace: Option<&str>,
        idempotent: bool,
        call: F,
    ) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>>>,
    {
        let retry = self.inner.retry;
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            let i = self.pick(namespace);
            let conn = self.inner.nodes[i].conn.clone();
            let status = match tokio::time::timeout(self.inner.timeout, call(conn)).await {
                Ok(Ok(answer)) => {
                    let by = answer.metadata().get(SERVED_BY);
                    let by = by.and_then(|v| v.to_str().ok()?.parse().ok());
                    if let (Some(ns), Some(id)) = (namespace, by) {
                        self.served_by(ns, id);
                    }
                    return Ok(answer.into_inner());
                }
                Ok(Err(s)) => s,
                Err(_) => Status::deadline_exceeded(format!(
                    "no answer from {} within {:?}",
                    self.inner.nodes[i].addr, self.inner.timeout
                )),
            };
            attempt += 1;
            // A call that is not idempotent is sent again only when the node said it did
            // nothing (not proposed: no leader yet, a leader still catching up).
            let did_nothing = status.metadata().contains_key(NOT_APPLIED);
            if !transient(status.code()) {
                return Err(status);
            }
            // The node failed: the next call, sent again or not, goes elsewhere.
            self.passed_over(i);
            if !(idempotent || did_nothing) {
                return Err(status);
            }
            let pause = retry.backoff(attempt);
            if attempt >= retry.attempts || started.elapsed() + pause > retry.within {
                return Err(status);
            }
            tracing::debug!(attempt, code = ?status.code(), node = %self.inner.nodes[i].addr,
                "retrying: {}", status.message());
            tokio::time::sleep(pause).await;
            if attempt % 2 == 1 {
                self.refresh().await;
            }
        }
    }
}

/// A typed unary call: `$service::$method(req)`, retried when `$idempotent(&req)`, sent to
/// the leader of the group holding the namespace `$namespace(&req)` names (none: any).
macro_rules! unary {
    ($(#[$doc:meta])* $method:ident, $client:ident, $req:ty, $resp:ty, $idempotent:expr) => {
        unary!($(#[$doc])* $method, $client, $req, $resp, $idempotent, no_namespace);
    };
    ($(#[$doc:meta])* $method:ident, $client:ident, $req:ty, $resp:ty, $idempotent:expr,
     $namespace:expr) => {
        $(#[$doc])*
        pub async fn $method(&self, req: $req) -> Result<$resp> {
            let idempotent: fn(&$req) -> bool = $idempotent;
            let namespace: fn(&$req) -> Option<&str> = $namespace;
            self.call_in(namespace(&req), idempotent(&req), |conn| {
                let req = req.clone();
                async move { $client::new(conn).$method(req).await }
            })
            .await
        }
    };
}

fn no_namespace<T>(_: &T) -> Option<&str> {
    None
}

fn always<T>(_: &T) -> bool {
    true
}

fn never<T>(_: &T) -> bool {
    false
}

use crate::idempotent;

impl Client {
    unary!(
        /// Creates a timer (retried: idempotent on namespace and id).
        schedule, TimersClient, pb::ScheduleRequest, pb::ScheduleResponse, idempotent::schedule,
        |r| Some(r.namespace.as_str()));
    unary!(
        /// Creates many timers in one write, all or none (retried: idempotent).
        schedule_batch, TimersClient, pb::ScheduleBatchRequest, pb::ScheduleBatchResponse, always,
        |r| r.timers.first().map(|t| t.namespace.as_str()));
    unary!(
        /// Cancels a timer; definitive (retried unless conditional).
        cancel, TimersClient, pb::CancelRequest, pb::CancelResponse, idempotent::cancel,
        |r| Some(r.namespace.as_str()));
    unary!(
        /// Moves a timer (sent once: a repeat could shift it twice, or be refused after a fire).
        reschedule, TimersClient, pb::RescheduleRequest, pb::RescheduleResponse,
        idempotent::reschedule,
        |r| Some(r.namespace.as_str()));
    unary!(
        get,
        TimersClient,
        pb::GetRequest,
        pb::GetResponse,
        always,
        |r| Some(r.namespace.as_str())
    );
    unary!(
        list,
        TimersClient,
        pb::ListRequest,
        pb::ListResponse,
        always,
        |r| Some(r.namespace.as_str())
    );
    unary!(
        /// Acknowledges one delivery (retried: an ack of an acked timer succeeds again).
        ack, TimersClient, pb::AckRequest, pb::AckResponse, always,
        |r| Some(r.namespace.as_str()));
    unary!(
        ack_batch,
        TimersClient,
        pb::AckBatchRequest,
        pb::AckBatchResponse,
        always,
        |r| r.acks.first().map(|a| a.namespace.as_str())
    );
    unary!(
        /// Gives up on one delivery (sent once: a retry could meet the next attempt).
        nack, TimersClient, pb::NackRequest, pb::NackResponse, never,
        |r| Some(r.namespace.as_str()));
    unary!(
        /// Returns DEAD timers to PENDING (sent once: a repeat of a one-timer redrive is
        /// refused as "not DEAD" once it happened, one of a namespace would redrive timers
        /// that went DEAD since).
        redrive, TimersClient, pb::RedriveRequest, pb::RedriveResponse, never,
        |r| Some(r.namespace.as_str()));
    unary!(
        /// Pauses a recurring timer (sent once: a repeat could undo someone's Resume).
        pause,
        TimersClient,
        pb::PauseRequest,
        pb::PauseResponse,
        never,
        |r| Some(r.namespace.as_str()));
    unary!(
        /// Resumes a recurring timer (sent once: a repeat could undo someone's Pause).
        resume,
        TimersClient,
        pb::PauseRequest,
        pb::PauseResponse,
        never,
        |r| Some(r.namespace.as_str()));
    unary!(
        /// Sets a namespace's policy (sent once: a repeat could undo someone's later change).
        put_namespace,
        NamespacesClient,
        pb::PutNamespaceRequest,
        pb::PutNamespaceResponse,
        never
    );
    unary!(
        get_namespace,
        NamespacesClient,
        pb::GetNamespaceRequest,
        pb::GetNamespaceResponse,
        always
    );
    unary!(
        list_namespaces,
        NamespacesClient,
        pb::ListNamespacesRequest,
        pb::ListNamespacesResponse,
        always
    );
    unary!(
        /// Sent once: a repeat could undo someone's ResumeNamespace.
        pause_namespace,
        NamespacesClient,
        pb::PauseNamespaceRequest,
        pb::PauseNamespaceResponse,
        never
    );
    unary!(
        /// Sent once: a repeat could undo someone's PauseNamespace.
        resume_namespace,
        NamespacesClient,
        pb::PauseNamespaceRequest,
        pb::PauseNamespaceResponse,
        never
    );
    unary!(
        /// The Status of the node the call reaches (the leader when known).
        status, ClusterClient, pb::StatusRequest, pb::StatusResponse, always);
    unary!(
        who_am_i,
        AccessClient,
        pb::WhoAmIRequest,
        pb::WhoAmIResponse,
        always
    );

    /// The Status of the node at `addr` (one of those given), not retried.
    pub async fn status_of(&self, addr: &str) -> Result<pb::StatusResponse> {
        let node = self.inner.nodes.iter().find(|n| n.addr == addr);
        let conn = match node {
            Some(n) => n.conn.clone(),
            None => self.inner.connector.lazy(addr)?,
        };
        let mut req = tonic::Request::new(pb::StatusRequest {});
        req.set_timeout(Duration::from_secs(2));
        ClusterClient::new(conn)
            .status(req)
            .await
            .map(|r| r.into_inner())
    }

    /// The connections to every node given, in order, with their addresses.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, Conn)> {
        self.inner
            .nodes
            .iter()
            .map(|n| (n.addr.as_str(), n.conn.clone()))
    }

    /// True for the failures after which a call's outcome is unknown (it may have been
    /// applied): the caller of a call that is not retried must find out, e.g. with Get.
    pub fn outcome_unknown(status: &Status) -> bool {
        transient(status.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(epoch: u64, leaders: &[(u32, Option<u64>, u64)]) -> Map {
        Map {
            epoch,
            ranges: vec![(0, 1024, 1)],
            leaders: leaders.iter().map(|(g, l, t)| (*g, (*l, *t))).collect(),
        }
    }

    #[test]
    fn a_refresh_keeps_what_the_client_knows_of_a_later_term() {
        // Group 1's leader (node 2, term 5) failed a call; a node that has not seen the
        // election since names it again at term 5: it stays unknown. Term 6 names node 3.
        let known = map(1, &[(1, None, 5), (2, Some(1), 4)]);
        let merged = known.merge(map(1, &[(1, Some(2), 5), (2, Some(1), 4)]));
        assert_eq!(merged.leaders[&1], (None, 5));
        let merged = merged.merge(map(1, &[(1, Some(3), 6), (2, Some(1), 4)]));
        assert_eq!(merged.leaders[&1], (Some(3), 6));
        // An answer named node 3 (term unknown: later than 4); a lagging node's view of
        // term 4 does not bring node 1 back, a view of term 5 or later replaces it.
        let learned = map(1, &[(2, Some(3), 5)]);
        let merged = learned.merge(map(1, &[(2, Some(1), 4)]));
        assert_eq!(merged.leaders[&2], (Some(3), 5));
        let merged = merged.merge(map(1, &[(2, Some(2), 7)]));
        assert_eq!(merged.leaders[&2], (Some(2), 7));
    }
}
