//! [`Client`]: typed calls to a cluster, sent to the leader when it is known, retried when
//! that is safe.
//!
//! The client holds a lazy connection to every node it was given and learns, from their
//! `Cluster.Status`, each one's id and which one leads. Calls go to the leader (any node would
//! do: a follower forwards, but that is one more hop); when a call to a node fails with a
//! transient status the node is passed over, the next call goes to the next node, and the
//! leader is looked up again. Only nodes the caller named are used (a member's advertised
//! address may be its peer port, closed to clients).

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
        &self.inner.nodes[self.pick()].addr
    }

    /// The id of the node believed to lead, if known.
    pub fn leader_id(&self) -> Option<u64> {
        let s = self.inner.state.lock().unwrap();
        s.leader.and_then(|i| s.ids[i])
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
        let mut s = self.inner.state.lock().unwrap();
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

    fn pick(&self) -> usize {
        let s = self.inner.state.lock().unwrap();
        s.leader.unwrap_or(s.next % self.inner.nodes.len())
    }

    /// Node `i` failed a call: pass it over until the leader is learned again.
    fn passed_over(&self, i: usize) {
        let mut s = self.inner.state.lock().unwrap();
        if s.leader == Some(i) {
            s.leader = None;
        }
        s.next = i + 1;
    }

    /// Runs `call` on a node's connection, retrying it under the client's policy if
    /// `idempotent`. The generic form of every typed call below.
    pub async fn call<T, F, Fut>(&self, idempotent: bool, call: F) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let retry = self.inner.retry;
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            let i = self.pick();
            let conn = self.inner.nodes[i].conn.clone();
            let status = match tokio::time::timeout(self.inner.timeout, call(conn)).await {
                Ok(Ok(v)) => return Ok(v),
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
            if !transient(status.code()) || !(idempotent || did_nothing) {
                return Err(status);
            }
            self.passed_over(i);
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

/// A typed unary call: `$service::$method(req)`, retried when `$idempotent(&req)`.
macro_rules! unary {
    ($(#[$doc:meta])* $method:ident, $client:ident, $req:ty, $resp:ty, $idempotent:expr) => {
        $(#[$doc])*
        pub async fn $method(&self, req: $req) -> Result<$resp> {
            let idempotent: fn(&$req) -> bool = $idempotent;
            self.call(idempotent(&req), |conn| {
                let req = req.clone();
                async move { $client::new(conn).$method(req).await.map(|r| r.into_inner()) }
            })
            .await
        }
    };
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
        schedule, TimersClient, pb::ScheduleRequest, pb::ScheduleResponse, idempotent::schedule);
    unary!(
        /// Creates many timers in one write, all or none (retried: idempotent).
        schedule_batch, TimersClient, pb::ScheduleBatchRequest, pb::ScheduleBatchResponse, always);
    unary!(
        /// Cancels a timer; definitive (retried unless conditional).
        cancel, TimersClient, pb::CancelRequest, pb::CancelResponse, idempotent::cancel);
    unary!(
        /// Moves a timer (sent once: a repeat could shift it twice, or be refused after a fire).
        reschedule, TimersClient, pb::RescheduleRequest, pb::RescheduleResponse,
        idempotent::reschedule);
    unary!(get, TimersClient, pb::GetRequest, pb::GetResponse, always);
    unary!(
        list,
        TimersClient,
        pb::ListRequest,
        pb::ListResponse,
        always
    );
    unary!(
        /// Acknowledges one delivery (retried: an ack of an acked timer succeeds again).
        ack, TimersClient, pb::AckRequest, pb::AckResponse, always);
    unary!(
        ack_batch,
        TimersClient,
        pb::AckBatchRequest,
        pb::AckBatchResponse,
        always
    );
    unary!(
        /// Gives up on one delivery (sent once: a retry could meet the next attempt).
        nack, TimersClient, pb::NackRequest, pb::NackResponse, never);
    unary!(
        /// Returns DEAD timers to PENDING (sent once: a repeat of a one-timer redrive is
        /// refused as "not DEAD" once it happened, one of a namespace would redrive timers
        /// that went DEAD since).
        redrive, TimersClient, pb::RedriveRequest, pb::RedriveResponse, never);
    unary!(
        /// Pauses a recurring timer (sent once: a repeat could undo someone's Resume).
        pause,
        TimersClient,
        pb::PauseRequest,
        pb::PauseResponse,
        never
    );
    unary!(
        /// Resumes a recurring timer (sent once: a repeat could undo someone's Pause).
        resume,
        TimersClient,
        pb::PauseRequest,
        pb::PauseResponse,
        never
    );
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
