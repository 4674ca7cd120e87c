//! Subscribe and Consume: delivery streams that any node accepts and that follow the leader.
//!
//! Deliveries are decided on the leader of the group holding the namespace's timers
//! (`cluster::dispatch`; "the leader" below), so a stream is served there. Each
//! accepted stream gets one task that, for as long as the client keeps it open:
//! - on the leader, registers a subscription with the local dispatcher and forwards its
//!   deliveries, until leadership is lost;
//! - on a follower, opens the same stream on the leader (marked forwarded, so at most one hop)
//!   and relays it, until that stream breaks;
//! - then looks up the leader again and carries on. The client sees one stream across leader
//!   changes. Deliveries the old leader committed but had not sent yet are sent before the
//!   stream moves; those the client never received are redelivered when their ack deadline
//!   passes (an Ack of the old attempt is still accepted until then).
//!
//! Consume streams also carry acks from the client. On the leader they free the
//! subscription's room at once and go to the node's ack coalescer (`cluster::acks`), held
//! until a whole lease is acked where that makes one write of many; on a follower they are
//! relayed to the leader's stream. Acks that arrive while the stream is between leaders are
//! carried to the next one.
//!
//! A Consume client finishes by ending its side of the stream (half-close): the leader stops
//! handing it deliveries, applies every ack it received (waiting for the ack coalescer), and
//! then ends the stream with OK, so a consumer that read to the end knows its acks took effect.
//! A relaying follower passes the half-close on and ends the client's stream when the leader's
//! ends.
//!
//! A forwarded stream whose node stops leading ends with UNAVAILABLE, so the follower that
//! relays it re-subscribes at the new leader. The task ends when the client goes away or the
//! node shuts down.

use openraft::async_runtime::WatchReceiver as _;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use futures::Stream;
use openraft::ServerState;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::api::pb;
use crate::api::stack::auth::Credential;
use crate::api::stack::forward::{self, Router};
use crate::cluster::acks::{StreamAcks, HOLD};
use crate::cluster::{AckItem, Subscription};
use crate::node::{Leader, Node};
use crate::timer::TimerKey;
use crate::Error;

mod wire;
use wire::{to_pb, to_pb_acks};
pub use wire::{validate, validate_acks, StreamAck, DEFAULT_MAX_IN_FLIGHT, MAX_MAX_IN_FLIGHT};

/// Pause before looking for the leader again after a stream broke or while none is known.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(100);
/// Acks a stream keeps for the next leader while it has none; beyond, they are dropped (the
/// deliveries come again after their deadline).
const MAX_CARRIED_ACKS: usize = 100_000;

/// The stream a Subscribe or Consume returns.
pub type DeliveryStream = Pin<Box<dyn Stream<Item = Result<pb::Delivery, Status>> + Send>>;

type Sink = mpsc::Sender<Result<pb::Delivery, Status>>;

/// What a Consume stream's reader passes on: acks, or the reason the stream must end. Bounded
/// ([`INBOUND`] messages): while the stream cannot take more, the reader does not read, and
/// HTTP/2 flow control holds the client back.
pub type Inbound = mpsc::Receiver<Result<Vec<StreamAck>, Status>>;
/// Messages of acks waiting between a Consume stream's reader and its task.
pub const INBOUND: usize = 8;

/// Starts the task behind one Subscribe (`acks`: `None`) or Consume and returns its stream.
pub fn start(
    router: Arc<Router>,
    req: pb::SubscribeRequest,
    forwarded: bool,
    caller: Caller,
    acks: Option<Inbound>,
) -> Result<DeliveryStream, Status> {
    // The stream is served by the leader of the group holding the namespace's timers.
    let node = router.node_of(&req.namespace)?;
    if forwarded && node.leader() != Leader::Me {
        return Err(not_leader(node));
    }
    // Pull and push never share a namespace: the leader pushes this one's timers itself (the
    // dispatcher would grant this stream nothing; say so instead of staying silent).
    if let Some(push) = node.applied_namespace(&req.namespace)?.push {
        return Err(Error::FailedPrecondition(format!(
            "namespace {} is delivered by push to {}; remove its push target to subscribe",
            req.namespace, push.url
        ))
        .into());
    }
    let (tx, rx) = mpsc::channel(req.max_in_flight as usize);
    let stream = Pump {
        router,
        req,
        forwarded,
        caller,
        tx,
        acks,
        carried: Vec::new(),
        delivered: Delivered::new(4 * MAX_MAX_IN_FLIGHT as usize),
        half_closed: false,
    };
    tokio::spawn(stream.run());
    Ok(Box::pin(ReceiverStream::new(rx)))
}

fn not_leader(node: &Node) -> Status {
    Status::unavailable(format!(
        "node {} is not the leader any more; subscribe again",
        node.id()
    ))
}

/// Who opened a stream: the credential it relays to the leader, and the principal this node's
/// gate found.
pub struct Caller {
    credential: Option<Credential>,
    principal: Option<crate::auth::Principal>,
}

impl Caller {
    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        Caller {
            credential: crate::api::stack::auth::credential(request),
            principal: request.extensions().get().cloned(),
        }
    }
}

/// Whether the leader refused a relayed stream's credential.
fn refused(status: &Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    )
}

/// Why one leg of a stream ended.
enum End {
    /// The client went away, sent a bad message, or the node is shutting down: it is over.
    Done,
    /// The leader changed or the relay broke: find the leader and go on.
    Moved,
}

/// One stream's task.
struct Pump {
    router: Arc<Router>,
    req: pb::SubscribeRequest,
    forwarded: bool,
    /// Who opened the stream: for the leader to authorize the relayed stream again, and for
    /// a data group's leader to judge it again before it serves a leg.
    caller: Caller,
    tx: Sink,
    /// The client's acks (Consume only).
    acks: Option<Inbound>,
    /// Acks received but not yet taken by a leader, for the next leg.
    carried: Vec<StreamAck>,
    /// What this stream handed its client, across legs (when the client talks to this node:
    /// its acks are judged against it, see [`Delivered`]).
    delivered: Delivered,
    /// The client ended its side of a Consume stream: finish once its acks are applied.
    half_closed: bool,
}

impl Pump {
    async fn run(mut self) {
        let node = match self.router.node_of(&self.req.namespace) {
            Ok(node) => node.clone(),
            Err(status) => {
                let _ = self.tx.send(Err(status)).await;
                return;
            }
        };
        let mut shutdown = node.shutdown_watch();
        loop {
            if self.tx.is_closed() || *shutdown.borrow() {
                return;
            }
            let end = match node.leader() {
                Leader::Me => self.serve_local(&node, &mut shutdown).await,
                _ if self.forwarded => {
                    let _ = self.tx.send(Err(not_leader(&node))).await;
                    return;
                }
                Leader::Other { addr, .. } => self.relay(&addr, &mut shutdown).await,
                Leader::Unknown => End::Moved,
            };
            if let End::Done = end {
                if *shutdown.borrow() {
                    let msg = format!("node {} is shutting down; subscribe again", node.id());
                    let _ = self.tx.try_send(Err(Status::unavailable(msg)));
                }
                return;
            }
            let tx = self.tx.clone();
            tokio::select! {
                _ = tokio::time::sleep(RESUBSCRIBE_PAUSE) => {}
                _ = tx.closed() => return,
            }
        }
    }

    /// The next acks from the client: `None` once a Consume client has ended its side (at
    /// once on later calls); pends for ever on a Subscribe. `Err` ends the stream (a bad
    /// message).
    async fn next_acks(&mut self) -> Option<Result<Vec<StreamAck>, Status>> {
        if self.half_closed {
            return None;
        }
        let Some(rx) = self.acks.as_mut() else {
            return std::future::pending().await;
        };
        let next = rx.recv().await;
        self.half_closed = next.is_none();
        next
    }

    fn carry(&mut self, acks: impl IntoIterator<Item = StreamAck>) {
        for a in acks {
            if self.carried.len() < MAX_CARRIED_ACKS {
                self.carried.push(a);
            }
        }
    }

    /// A data group's leg is served by that group's leader, which need not lead group 0 and
    /// may have judged the stream (or been elected) before its replica of group 0 applied a
    /// revocation group 0 acknowledged: before each leg it catches up with group 0 and the
    /// stream's principal must still hold (as `forward::judged_here` does for a call).
    async fn judged_again(&self, node: &Node) -> Result<(), Status> {
        if node.group() == crate::keys::GROUP_ZERO {
            return Ok(()); // judged by this node's gate, or it ends with its key (`revocable`)
        }
        let nodes = self.router.nodes();
        nodes.meta_caught_up(Duration::from_secs(1)).await?;
        let access = nodes.meta().access();
        crate::api::stack::auth::still_holds(self.caller.principal.as_ref(), &access)
    }

    /// Serves the stream from this node's dispatcher while it leads.
    async fn serve_local(&mut self, node: &Arc<Node>, shutdown: &mut watch::Receiver<bool>) -> End {
        if let Err(refused) = self.judged_again(node).await {
            if refused.code() == tonic::Code::Unavailable {
                return End::Moved; // not caught up with group 0 yet: the next leg tries again
            }
            let _ = self.tx.send(Err(refused)).await;
            return End::Done;
        }
        let max = self.req.max_in_flight as usize;
        let mut sub = node.subscribe(&self.req.namespace, &self.req.consumer, max, false);
        let mut metrics = node.role_watch();
        let mut tracker = StreamAcks::new(&self.req.namespace);
        let carried = std::mem::take(&mut self.carried);
        let mut budget = Budget::new(max, carried.len());
        let ns = self.req.namespace.clone();
        let mut edge = Edge::of(self.forwarded, &mut budget);
        take_acks(node, &sub, (&ns, &mut tracker, &mut edge), carried).await;
        let mut flush = tokio::time::interval(HOLD / 2);
        let tx = self.tx.clone();
        // The namespace's dispatch rate, read again when an applied entry changed a
        // namespace (a policy may change).
        let mut rate_read = node.namespaces_version();
        let mut rate = node.dispatch_rate(&ns);
        let end = loop {
            tokio::select! {
                delivery = sub.recv() => match delivery {
                    Some(d) => {
                        tracker.sent(&d);
                        self.delivered.record(&d.timer.key.id, d.attempt);
                        if node.namespaces_version() != rate_read {
                            rate_read = node.namespaces_version();
                            rate = node.dispatch_rate(&ns);
                        }
                        // Paced as they go out, whatever clumps the grants came in.
                        if let Some(limit) = rate {
                            node.pace(&ns, limit).await;
                        }
                        if tx.send(Ok(to_pb(d))).await.is_err() {
                            break End::Done;
                        }
                    }
                    None => break End::Moved,
                },
                acks = self.next_acks() => match acks {
                    Some(Ok(acks)) => {
                        let acks = self.delivered.admit(acks, self.forwarded);
                        take_acks(node, &sub, (&ns, &mut tracker, &mut edge), acks).await
                    }
                    Some(Err(status)) => {
                        let _ = tx.send(Err(status)).await;
                        break End::Done;
                    }
                    None => break End::Done, // half-closed: finish below
                },
                _ = flush.tick() => {
                    let now_ms = node.now_ms();
                    for item in tracker.flush_due(Instant::now(), now_ms) {
                        node.hand_in(tracker.lane(), item).await;
                    }
                }
                _ = lost_leadership(&mut metrics) => {
                    // The held acks go to the next leader with the stream.
                    let held = tracker.drain();
                    self.carry(held.into_iter().map(|(k, attempt)| StreamAck {
                        id: k.id,
                        attempt,
                        nack: false,
                    }));
                    return hand_over(sub, &tx).await;
                }
                _ = tx.closed() => break End::Done,
                _ = stopping(shutdown) => break End::Done,
            }
        };
        drop(sub); // no more deliveries for this stream
        for (key, attempt) in tracker.drain() {
            node.hand_in(tracker.lane(), AckItem::One(key, attempt))
                .await;
        }
        if self.half_closed && !node.handed_in_applied(tracker.lane()).await {
            let msg = "leadership moved while the acks of this stream were being applied; \
                       some may not have been (their deliveries come again after their ack \
                       timeout)";
            let _ = tx.send(Err(Status::unavailable(msg))).await;
        }
        end
    }

    /// Relays the leader's stream to the client (and the client's acks to it) until it breaks.
    async fn relay(&mut self, addr: &str, shutdown: &mut watch::Receiver<bool>) -> End {
        let Ok(channel) = self.router.channel(addr) else {
            return End::Moved;
        };
        let mut client = forward::timers(channel);
        let (mut up, up_rx) = mpsc::channel(INBOUND);
        let opened = if self.acks.is_some() {
            let first = pb::ConsumeRequest {
                subscribe: Some(self.req.clone()),
                acks: to_pb_acks(std::mem::take(&mut self.carried)),
            };
            let _ = up.try_send(first);
            if self.half_closed {
                drop(std::mem::replace(&mut up, mpsc::channel(1).0));
            }
            let outbound = ReceiverStream::new(up_rx);
            let req = forward::stream_request(outbound, self.caller.credential.clone());
            client.consume(req).await
        } else {
            let req = forward::stream_request(self.req.clone(), self.caller.credential.clone());
            client.subscribe(req).await
        };
        let mut upstream = match opened {
            Ok(s) => s.into_inner(),
            // The leader's own access state refuses the client (revoked meanwhile): say so.
            Err(status) if refused(&status) => {
                let _ = self.tx.send(Err(status)).await;
                return End::Done;
            }
            Err(status) => {
                tracing::debug!(addr, %status, "subscribe at the leader failed; retrying");
                return End::Moved;
            }
        };
        let tx = self.tx.clone();
        loop {
            tokio::select! {
                msg = upstream.message() => match msg {
                    Ok(Some(d)) => {
                        if let Some(t) = &d.timer {
                            self.delivered.record(&t.id, d.attempt);
                        }
                        if tx.send(Ok(d)).await.is_err() {
                            return End::Done;
                        }
                    }
                    Ok(None) if self.half_closed => return End::Done,
                    Ok(None) | Err(_) => return End::Moved,
                },
                acks = self.next_acks(), if !self.half_closed => match acks {
                    Some(Ok(acks)) => {
                        // Judged here, where the client is: only what it was handed goes up.
                        let acks = self.delivered.admit(acks, self.forwarded);
                        let msg = pb::ConsumeRequest { subscribe: None, acks: to_pb_acks(acks.clone()) };
                        if up.send(msg).await.is_err() {
                            self.carry(acks);
                            return End::Moved;
                        }
                    }
                    Some(Err(status)) => {
                        let _ = tx.send(Err(status)).await;
                        return End::Done;
                    }
                    // Half-closed: pass it on; the leader ends its stream once the acks are
                    // applied, and then this one ends.
                    None => drop(std::mem::replace(&mut up, mpsc::channel(1).0)),
                },
                _ = tx.closed() => return End::Done,
                _ = stopping(shutdown) => return End::Done,
            }
        }
    }
}

/// Hands a client's acks to this (leading) node. An ack of a delivery this stream's
/// subscription holds frees its room at once (only that subscription's, only that attempt:
/// issue 33 finding 8); nacks and acks go to the coalescer (acks held by lease where they can
/// be one). Acks of deliveries this leg of the stream never sent (carried from an earlier leg,
/// or made up) pass within a budget ([`Budget`]) and are dropped beyond it: made-up acks would
/// otherwise all become log entries every replica applies (issue 33 findings 5 and 12).
async fn take_acks(
    node: &Arc<Node>,
    sub: &Subscription,
    (ns, tracker, edge): (&str, &mut StreamAcks, &mut Edge<'_>),
    acks: Vec<StreamAck>,
) {
    let now = Instant::now();
    for a in acks {
        let key = TimerKey::new(ns, a.id.clone());
        let held = tracker.holds(&a.id, a.attempt);
        if !held && !edge.admits_unsent() {
            continue;
        }
        if held {
            sub.settled(&key, a.attempt);
        }
        let items = if a.nack {
            let mut items = tracker.nacked(&a.id, a.attempt);
            items.push(AckItem::Nack(key, a.attempt));
            items
        } else {
            tracker.acked(&a.id, a.attempt, now)
        };
        for item in items {
            node.hand_in(tracker.lane(), item).await;
        }
    }
}

/// How a stream leg judges acks of deliveries it did not send itself.
enum Edge<'a> {
    /// The client talks to this node: [`Delivered`] already let through only what it was
    /// handed (in any leg), so every ack that reaches here is one.
    Client,
    /// A relayed stream (another node is the client's edge, or says it is): within a budget.
    Relayed(&'a mut Budget),
}

impl<'a> Edge<'a> {
    fn of(forwarded: bool, budget: &'a mut Budget) -> Self {
        match forwarded {
            true => Edge::Relayed(budget),
            false => Edge::Client,
        }
    }

    fn admits_unsent(&mut self) -> bool {
        match self {
            Edge::Client => true,
            Edge::Relayed(b) => b.take(),
        }
    }
}

/// What a stream handed its client (timer id → attempt), the latest `cap` deliveries: at the
/// node the client talks to, an ack or nack of anything else is dropped, since it could only
/// be a mistake or made up, and would become a log entry every replica applies (issue 33
/// findings 5 and 12). The cap bounds memory for a client that never acks; a delivery pushed
/// out by it is delivered again after its deadline, at worst.
struct Delivered {
    by_id: std::collections::HashMap<String, u32>,
    order: std::collections::VecDeque<(String, u32)>,
    cap: usize,
    dropped: u64,
}

impl Delivered {
    fn new(cap: usize) -> Self {
        Delivered {
            by_id: Default::default(),
            order: Default::default(),
            cap,
            dropped: 0,
        }
    }

    fn record(&mut self, id: &str, attempt: u32) {
        self.by_id.insert(id.to_string(), attempt);
        self.order.push_back((id.to_string(), attempt));
        while self.order.len() > self.cap {
            let (old, a) = self.order.pop_front().expect("non-empty");
            if self.by_id.get(&old) == Some(&a) {
                self.by_id.remove(&old);
            }
        }
    }

    /// The acks of deliveries the client was handed (each once); all of them on a relayed
    /// stream (`forwarded`: not the client's edge, see [`Edge`]).
    fn admit(&mut self, acks: Vec<StreamAck>, forwarded: bool) -> Vec<StreamAck> {
        if forwarded {
            return acks;
        }
        let before = acks.len();
        let kept: Vec<StreamAck> = acks
            .into_iter()
            .filter(|a| {
                let handed = self.by_id.get(&a.id) == Some(&a.attempt);
                if handed {
                    self.by_id.remove(&a.id);
                }
                handed
            })
            .collect();
        let dropped = (before - kept.len()) as u64;
        if dropped > 0 {
            let was = self.dropped;
            self.dropped += dropped;
            if was == 0 || (self.dropped.ilog2() > was.max(1).ilog2()) {
                tracing::warn!(
                    dropped = self.dropped,
                    "acks of deliveries this stream never handed its client: dropped"
                );
            }
            for _ in 0..dropped {
                crate::metrics::acks_dropped();
            }
        }
        kept
    }
}

/// How many acks of deliveries a stream leg did not send it passes on: those it carries from
/// an earlier leg (at most what one subscription holds at once, plus the carried acks it
/// started with) — anything beyond is not an ack of a delivery it could have had.
pub struct Budget {
    left: usize,
    dropped: u64,
}

impl Budget {
    pub fn new(max_in_flight: usize, carried: usize) -> Budget {
        Budget {
            left: 2 * max_in_flight + carried,
            dropped: 0,
        }
    }

    fn take(&mut self) -> bool {
        if self.left == 0 {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                tracing::warn!(
                    dropped = self.dropped,
                    "acks of deliveries this stream never had: dropped"
                );
            }
            crate::metrics::acks_dropped();
            return false;
        }
        self.left -= 1;
        true
    }
}

/// Leadership moved: the deliveries this node's dispatcher already handed to the subscription
/// were committed, so they go to the client before the stream follows the new leader. Dropped,
/// they would wait out their ack deadline to be delivered again.
async fn hand_over(mut sub: Subscription, tx: &Sink) -> End {
    let mut handed = 0;
    while let Some(d) = sub.try_recv() {
        if tx.send(Ok(to_pb(d))).await.is_err() {
            return End::Done;
        }
        handed += 1;
    }
    if handed > 0 {
        tracing::info!(
            handed,
            "leadership moved; handed buffered deliveries to the stream"
        );
    }
    End::Moved
}

// These two drop the watch guards before returning, so the futures stay `Send`.
async fn lost_leadership(metrics: &mut crate::raft_types::ServerMetricsRx) {
    let _ = metrics.wait_until(|m| m.state != ServerState::Leader).await;
}

/// Resolves once the node is shutting down.
pub(super) async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
