//! Subscribe: a delivery stream that any node accepts and that follows the leader.
//!
//! Deliveries are decided on the leader (`cluster::dispatch`), so a stream is served there. Each
//! accepted Subscribe gets one task that, for as long as the client keeps the stream open:
//! - on the leader, registers a subscription with the local dispatcher and forwards its
//!   deliveries, until leadership is lost;
//! - on a follower, opens the same Subscribe on the leader (marked forwarded, so at most one
//!   hop) and relays it, until that stream breaks;
//! - then looks up the leader again and carries on. The client sees one stream across leader
//!   changes. Deliveries the old leader committed but had not sent yet are sent before the
//!   stream moves; those the client never received are redelivered when their ack deadline
//!   passes (an Ack of the old attempt is still accepted until then).
//!
//! A forwarded stream whose node stops leading ends with UNAVAILABLE, so the follower that
//! relays it re-subscribes at the new leader. The task ends when the client goes away or the
//! node shuts down.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use openraft::ServerState;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::convert::check_name;
use super::forward::{self, Router};
use super::pb;
use crate::cluster::{Delivery, Subscription};
use crate::config::Limits;
use crate::node::{Leader, Node};
use crate::Error;

/// Unacked deliveries a stream may hold when the client asks for 0.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 100;
/// The most a client may ask for.
pub const MAX_MAX_IN_FLIGHT: u32 = 10_000;
/// Pause before looking for the leader again after a stream broke or while none is known.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(100);

/// The stream a Subscribe returns.
pub type DeliveryStream = Pin<Box<dyn Stream<Item = Result<pb::Delivery, Status>> + Send>>;

type Sink = mpsc::Sender<Result<pb::Delivery, Status>>;

/// Validates a Subscribe and fills in the defaults.
pub fn validate(
    mut req: pb::SubscribeRequest,
    limits: &Limits,
) -> Result<pb::SubscribeRequest, Error> {
    check_name("namespace", &req.namespace, limits.max_namespace_bytes)?;
    if req.consumer.len() > limits.max_id_bytes {
        return Err(Error::InvalidArgument(format!(
            "consumer name is {} bytes; the limit is {}",
            req.consumer.len(),
            limits.max_id_bytes
        )));
    }
    if req.max_in_flight > MAX_MAX_IN_FLIGHT {
        return Err(Error::InvalidArgument(format!(
            "max_in_flight {} is over the limit of {MAX_MAX_IN_FLIGHT}",
            req.max_in_flight
        )));
    }
    if req.max_in_flight == 0 {
        req.max_in_flight = DEFAULT_MAX_IN_FLIGHT;
    }
    Ok(req)
}

/// Starts the task behind one Subscribe and returns its stream.
pub fn start(
    router: Arc<Router>,
    req: pb::SubscribeRequest,
    forwarded: bool,
) -> Result<DeliveryStream, Status> {
    if forwarded && router.node().leader() != Leader::Me {
        return Err(not_leader(router.node()));
    }
    let (tx, rx) = mpsc::channel(req.max_in_flight as usize);
    tokio::spawn(pump(router, req, forwarded, tx));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

fn not_leader(node: &Node) -> Status {
    Status::unavailable(format!(
        "node {} is not the leader any more; subscribe again",
        node.id
    ))
}

/// Why one leg of a stream ended.
enum End {
    /// The client went away or the node is shutting down: the stream is over.
    Done,
    /// The leader changed or the relay broke: find the leader and go on.
    Moved,
}

async fn pump(router: Arc<Router>, req: pb::SubscribeRequest, forwarded: bool, tx: Sink) {
    let node = router.node().clone();
    let mut shutdown = node.shutdown.clone();
    loop {
        if tx.is_closed() || *shutdown.borrow() {
            return;
        }
        let end = match node.leader() {
            Leader::Me => serve_local(&node, &req, &tx, &mut shutdown).await,
            _ if forwarded => {
                let _ = tx.send(Err(not_leader(&node))).await;
                return;
            }
            Leader::Other { addr, .. } => relay(&router, &addr, &req, &tx, &mut shutdown).await,
            Leader::Unknown => End::Moved,
        };
        if let End::Done = end {
            if *shutdown.borrow() {
                let msg = format!("node {} is shutting down; subscribe again", node.id);
                let _ = tx.try_send(Err(Status::unavailable(msg)));
            }
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(RESUBSCRIBE_PAUSE) => {}
            _ = tx.closed() => return,
        }
    }
}

/// Serves the stream from this node's dispatcher while it leads.
async fn serve_local(
    node: &Node,
    req: &pb::SubscribeRequest,
    tx: &Sink,
    shutdown: &mut watch::Receiver<bool>,
) -> End {
    let max = req.max_in_flight as usize;
    let mut sub = node
        .dispatcher
        .subscribe(&req.namespace, &req.consumer, max);
    let mut metrics = node.raft.metrics();
    loop {
        tokio::select! {
            delivery = sub.recv() => match delivery {
                Some(d) => {
                    if tx.send(Ok(to_pb(d))).await.is_err() {
                        return End::Done;
                    }
                }
                None => return End::Moved,
            },
            _ = lost_leadership(&mut metrics) => return hand_over(sub, tx).await,
            _ = tx.closed() => return End::Done,
            _ = stopping(shutdown) => return End::Done,
        }
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

/// Relays the leader's stream to the client until it breaks.
async fn relay(
    router: &Router,
    addr: &str,
    req: &pb::SubscribeRequest,
    tx: &Sink,
    shutdown: &mut watch::Receiver<bool>,
) -> End {
    let Ok(channel) = router.channel(addr) else {
        return End::Moved;
    };
    let opened = forward::timers(channel)
        .subscribe(forward::stream_request(req.clone()))
        .await;
    let mut upstream = match opened {
        Ok(s) => s.into_inner(),
        Err(status) => {
            tracing::debug!(addr, %status, "subscribe at the leader failed; retrying");
            return End::Moved;
        }
    };
    loop {
        tokio::select! {
            msg = upstream.message() => match msg {
                Ok(Some(d)) => {
                    if tx.send(Ok(d)).await.is_err() {
                        return End::Done;
                    }
                }
                Ok(None) | Err(_) => return End::Moved,
            },
            _ = tx.closed() => return End::Done,
            _ = stopping(shutdown) => return End::Done,
        }
    }
}

// These two drop the watch guards before returning, so the futures stay `Send`.
async fn lost_leadership(
    metrics: &mut watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
) {
    let _ = metrics.wait_for(|m| m.state != ServerState::Leader).await;
}

/// Resolves once the node is shutting down.
pub(super) async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn to_pb(d: Delivery) -> pb::Delivery {
    pb::Delivery {
        attempt: d.attempt,
        timer: Some(d.timer.into()),
    }
}
