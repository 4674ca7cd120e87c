//! The delivery door: what a leader's delivery channels — the Subscribe/Consume streams
//! (`api/subscribe`) and the pusher (`push/`) — ask of the node, and nothing else.
//!
//! A channel subscribes to a namespace and receives the deliveries the dispatcher leases it;
//! paces each before it goes out (the namespace's dispatch rate, read from the applied
//! policy); says when a delivery was settled (its room is free again); and hands its acks and
//! nacks to the ack coalescer on its lane, which turns them into shared entries. The channels
//! never hold the dispatcher, the coalescer or the store themselves, so a new channel is one
//! more caller of these verbs (docs/delivery.md).
//!
//! Reads here are of this node's applied state, not linearizable: a channel runs on the leader
//! and acts on what it applied (a policy changed a moment ago takes effect at the next read).

use std::time::Duration;

use super::Node;
use crate::cluster::{AckItem, Subscription};
use crate::namespace::Namespace;
use crate::raft_types::ServerMetricsRx;
use crate::timer::TimerKey;
use crate::Result;

impl Node {
    /// Registers a delivery channel for `namespace`, holding at most `max_in_flight`
    /// deliveries unsettled (`push`: the leader's pusher).
    pub fn subscribe(
        &self,
        namespace: &str,
        consumer: &str,
        max_in_flight: usize,
        push: bool,
    ) -> Subscription {
        (self.dispatcher).subscribe(namespace, consumer, max_in_flight, push)
    }

    /// Waits until one delivery of `namespace` may go out at `limit` (rate, burst).
    pub async fn pace(&self, namespace: &str, limit: (u32, u32)) {
        self.dispatcher
            .paced(namespace, limit, &self.config.clock)
            .await
    }

    /// Delivery `attempt` of `key` was settled (answered, or given up): its room is free.
    pub fn settled(&self, key: &TimerKey, attempt: u32) {
        self.dispatcher.settled(key, attempt)
    }

    /// Hands a channel's ack or nack to the coalescer on `lane`; false if it has stopped (the
    /// item is dropped: its timer comes again).
    pub async fn hand_in(&self, lane: u64, item: AckItem) -> bool {
        self.acker.ack(lane, item).await
    }

    /// Resolves once every ack `lane` handed in before the call applied (false: some may not
    /// have, see `Acker::applied`).
    pub async fn handed_in_applied(&self, lane: u64) -> bool {
        self.acker.applied(lane).await
    }

    /// `namespace` as this node applied it (the default policy if never configured).
    pub fn applied_namespace(&self, namespace: &str) -> Result<Namespace> {
        self.store.namespace(namespace)
    }

    /// A page of the configured namespaces as this node applied them.
    pub fn applied_namespaces(&self, after: Option<&str>, limit: usize) -> Result<Vec<Namespace>> {
        self.store.namespaces(after, limit)
    }

    /// `namespace`'s dispatch rate and burst, if it has one (none if its policy cannot be
    /// read: the grants are limited anyway).
    pub fn dispatch_rate(&self, namespace: &str) -> Option<(u32, u32)> {
        self.store
            .namespace(namespace)
            .ok()?
            .policy
            .dispatch_limit()
    }

    /// Counts the applied entries that changed a namespace: a reader of a policy reads it again
    /// when this moves.
    pub fn namespaces_version(&self) -> u64 {
        self.store.namespaces_version()
    }

    /// [`Node::namespaces_version`], as a watch.
    pub fn namespace_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.store.namespace_changes()
    }

    /// This node's role as openraft reports it (a channel ends when it stops leading).
    pub fn role_watch(&self) -> ServerMetricsRx {
        self.raft.server_metrics()
    }

    /// Runs `lead` while this node leads, until `shutdown` (`cluster::workers`).
    pub async fn while_leader<F: std::future::Future<Output = ()>>(
        &self,
        what: &str,
        shutdown: tokio::sync::watch::Receiver<bool>,
        lead: impl FnMut() -> F,
    ) {
        crate::cluster::workers::while_leader(self.id, &self.raft, what, shutdown, lead).await
    }

    /// At a planned stop: no more acks are answered as queued; those queued are proposed, up
    /// to `within` (`Err`: how many did not settle).
    pub async fn drain_queued_acks(&self, within: Duration) -> std::result::Result<(), u64> {
        self.acker.stop_queuing();
        self.acker.drain_queued(within).await.map(|_| ())
    }
}
