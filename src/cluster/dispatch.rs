//! The delivery dispatcher: the leader's worker that hands READY timers to subscribers.
//!
//! What it owns: the registry of this node's subscriptions (in memory; a subscription lives as
//! long as its stream) and, while this node leads, the loop that proposes `Deliver` entries.
//! Every decision that matters is a committed entry: the dispatcher only *proposes* which READY
//! timers go out, the state machine decides (a key that is no longer READY is skipped), and a
//! delivery is sent to its subscriber only after its Deliver entry has applied, so an attempt
//! the consumer sees is always one the cluster counted.
//!
//! Invariants:
//! - Nothing is proposed for a namespace without a live subscription with room, so no attempt
//!   is spent while nobody listens.
//! - A subscription holds at most `max_in_flight` unsettled deliveries: one leaves its count on
//!   Ack or Nack through this node ([`Dispatcher::settled`]) or when its ack deadline passes.
//! - One loop, one Deliver in flight at a time: a key is never planned twice concurrently. (Were
//!   it, apply would still deliver it once.)
//! - Losing the send (the stream closed between plan and commit) loses nothing: the timer is
//!   IN_FLIGHT with a deadline and is redelivered when it passes (at-least-once).
//!
//! Subscriptions are served only while this node leads; the API layer (`api::subscribe`) moves
//! a stream to the new leader when leadership changes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};

use super::driver::{while_leader, FireSignal};
use super::{Hold, NodeId, Raft};
use crate::clock::Clock;
use crate::storage::Store;
use crate::timer::{Command, Response, Timer, TimerKey};
use crate::Result;

/// Most timers one Deliver entry hands out.
const MAX_PER_ENTRY: usize = 4000;
/// How often the loop looks again without a signal: unsettled deliveries whose deadline passed
/// free their room by time alone.
const TICK: Duration = Duration::from_millis(100);
/// Pause after an error before trying again.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// One delivery to a subscriber: the timer as its Deliver entry left it, and the attempt.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub timer: Timer,
    pub attempt: u32,
}

struct Sub {
    namespace: String,
    consumer: String,
    max_in_flight: usize,
    /// Unsettled deliveries and their ack deadlines.
    in_flight: HashMap<TimerKey, i64>,
    tx: mpsc::Sender<Delivery>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    subs: BTreeMap<u64, Sub>,
    /// Rotates which subscription is served first, so competing consumers share.
    turn: usize,
}

/// This node's subscriptions and the wake-up for its dispatch loop.
#[derive(Default)]
pub struct Dispatcher {
    registry: Mutex<Registry>,
    wake: Notify,
}

/// A registered subscription; dropping it unregisters it.
pub struct Subscription {
    id: u64,
    rx: mpsc::Receiver<Delivery>,
    dispatcher: Arc<Dispatcher>,
}

impl Subscription {
    /// The next delivery; `None` never happens while the subscription is registered.
    pub async fn recv(&mut self) -> Option<Delivery> {
        self.rx.recv().await
    }

    /// A delivery already handed to this subscription, if any, without waiting.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut reg = self.dispatcher.lock();
        if let Some(sub) = reg.subs.remove(&self.id) {
            tracing::info!(
                namespace = sub.namespace,
                consumer = sub.consumer,
                unsettled = sub.in_flight.len(),
                "subscription ended"
            );
        }
    }
}

impl Dispatcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a subscription to `namespace` holding at most `max_in_flight` unsettled.
    pub fn subscribe(
        self: &Arc<Self>,
        namespace: &str,
        consumer: &str,
        max_in_flight: usize,
    ) -> Subscription {
        let (tx, rx) = mpsc::channel(max_in_flight.max(1));
        let id = {
            let mut reg = self.lock();
            reg.next_id += 1;
            let id = reg.next_id;
            let sub = Sub {
                namespace: namespace.to_string(),
                consumer: consumer.to_string(),
                max_in_flight,
                in_flight: HashMap::new(),
                tx,
            };
            reg.subs.insert(id, sub);
            id
        };
        tracing::info!(namespace, consumer, max_in_flight, "subscription started");
        self.wake.notify_one();
        Subscription {
            id,
            rx,
            dispatcher: self.clone(),
        }
    }

    /// An Ack or Nack of `key` applied through this node: its subscription has room again.
    pub fn settled(&self, key: &TimerKey) {
        let mut reg = self.lock();
        let freed = reg
            .subs
            .values_mut()
            .any(|s| s.in_flight.remove(key).is_some());
        drop(reg);
        if freed {
            self.wake.notify_one();
        }
    }

    /// Chooses READY timers for subscriptions with room: (subscription, key) pairs.
    fn plan(&self, store: &Store, now_ms: i64) -> Result<Vec<(u64, TimerKey)>> {
        let mut reg = self.lock();
        let ids: Vec<u64> = reg.subs.keys().copied().collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        reg.turn = reg.turn.wrapping_add(1);
        let first = reg.turn % ids.len();
        let (mut plan, mut claimed) = (Vec::new(), HashSet::new());
        for id in ids[first..].iter().chain(&ids[..first]) {
            let Some(sub) = reg.subs.get_mut(id) else {
                continue;
            };
            sub.in_flight.retain(|_, deadline| *deadline > now_ms);
            let room = sub.max_in_flight.saturating_sub(sub.in_flight.len());
            let room = room.min(MAX_PER_ENTRY - plan.len());
            if room == 0 || sub.tx.is_closed() {
                continue;
            }
            for key in store.ready(&sub.namespace, room, &claimed)? {
                claimed.insert(key.clone());
                plan.push((*id, key));
            }
        }
        Ok(plan)
    }

    /// Sends what a Deliver entry delivered to the subscriptions it was planned for.
    fn hand_out(&self, plan: Vec<(u64, TimerKey)>, delivered: Vec<Option<Timer>>) -> usize {
        let mut reg = self.lock();
        let mut sent = 0;
        for ((id, key), timer) in plan.into_iter().zip(delivered) {
            let (Some(timer), Some(sub)) = (timer, reg.subs.get_mut(&id)) else {
                continue;
            };
            sub.in_flight.insert(key, timer.wake_at_ms);
            let attempt = timer.attempts;
            if sub.tx.try_send(Delivery { timer, attempt }).is_ok() {
                sent += 1;
            }
        }
        sent
    }
}

/// The leader's dispatch loop for one node.
pub struct DispatchLoop {
    pub id: NodeId,
    pub raft: Raft,
    pub store: Store,
    pub clock: Clock,
    pub signal: Arc<FireSignal>,
    pub dispatcher: Arc<Dispatcher>,
    /// Closed while leadership is handed over.
    pub hold: Hold,
}

impl DispatchLoop {
    /// Runs until `shutdown` turns true, dispatching while this node leads.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        while_leader(self.id, &self.raft, "dispatcher", shutdown, || self.lead()).await;
    }

    async fn lead(&self) {
        loop {
            match self.round().await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "dispatcher: round failed");
                    tokio::time::sleep(ERROR_BACKOFF).await;
                }
            }
            tokio::select! {
                _ = self.signal.ready_notified() => {}
                _ = self.dispatcher.wake.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }

    /// One Deliver entry; true if it delivered anything (so more may be waiting).
    async fn round(&self) -> Result<bool> {
        let now_ms = self.clock.now_ms();
        let plan = self.dispatcher.plan(&self.store, now_ms)?;
        if plan.is_empty() {
            return Ok(false);
        }
        let keys = plan.iter().map(|(_, k)| k.clone()).collect();
        self.hold.pass().await;
        let reply = self
            .raft
            .client_write(Command::Deliver { now_ms, keys })
            .await
            .map_err(|e| crate::Error::Unavailable(e.to_string()))?;
        match reply.data {
            Response::Delivered(delivered) => {
                let sent = self.dispatcher.hand_out(plan, delivered);
                tracing::debug!(sent, "delivered");
                Ok(sent > 0)
            }
            other => Err(crate::Error::Internal(format!(
                "unexpected Deliver response {other:?}"
            ))),
        }
    }
}
