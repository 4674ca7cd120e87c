//! The delivery dispatcher: this node's subscriptions, and the leases that feed them.
//!
//! What it owns: the registry of this node's subscriptions (in memory; a subscription lives as
//! long as its stream), the planning of grants (which subscription asks for how many), and the
//! hand-out of what a granted lease holds. Every decision that matters is a committed entry:
//! the dispatcher only *asks* for room, the state machine decides which timers a lease takes,
//! and a delivery is sent only after its lease has applied, read back from the applied state,
//! so an attempt the consumer sees is always one the cluster counted.
//!
//! Grants ride on Fire entries (the fire driver plans them, so a timer is handed out by the
//! entry that fires it) and on the dispatch loop's own `Deliver` entries, proposed when a
//! subscription has room and its namespace has timers waiting (READY).
//!
//! Invariants:
//! - A subscription holds at most `max_in_flight` unsettled deliveries: room is reserved when a
//!   grant is planned and returned when the entry applies (then held by what was sent) or fails.
//!   A delivery leaves the count on Ack or Nack through this node ([`Dispatcher::settled`]) or
//!   when its ack deadline passes.
//! - Nothing is planned for a namespace without a live subscription with room, so no attempt is
//!   spent while nobody listens.
//! - Losing the send (the stream closed between plan and commit) loses nothing: the timer is in
//!   flight under its lease and is delivered again when the deadline passes (at-least-once).
//!
//! - A namespace's limits hold for all its subscriptions together: a grant's room is cut to
//!   what `max_concurrent_dispatches` leaves (unsettled and reserved deliveries of every
//!   subscription of the namespace) and to the tokens its dispatch bucket holds (`limits`);
//!   tokens a lease did not use are refunded. A paused namespace gets no grants. For an ack
//!   timeout after this node starts to lead, the deliveries a previous leader made and nobody
//!   settled count against the concurrency too (their receivers may still be at work).
//! - A namespace with a push target is granted only to the leader's pusher (a subscription made
//!   with `push`), one without only to streams: a lease goes to one subscription, so pull and
//!   push never take the same timer.
//!
//! Subscriptions are served only while this node leads; the API layer (`api::services::subscribe`) moves
//! a stream to the new leader when leadership changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use super::limits::Buckets;
use crate::clock::Clock;
use crate::command::{Grant, Granted, LeaseRef};
use crate::namespace::Policy;
use crate::storage::Store;
use crate::timer::{Timer, TimerKey};

/// One delivery to a subscriber: the timer as its lease handed it out, and the attempt.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub timer: Timer,
    pub attempt: u32,
    /// Its ack deadline: the lease's (after it, the delivery is made again with attempt + 1).
    pub deadline_ms: i64,
    /// The lease it came in, when the whole lease went to this subscription: acking every
    /// delivery of it can then be one write (`api::services::subscribe`).
    pub lease: Option<LeaseTag>,
}

/// A lease whose every delivery went to one subscription.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseTag {
    pub lease: LeaseRef,
    pub count: u32,
    pub deadline_ms: i64,
}

impl Sub {
    /// Frees the room of delivery `attempt` of `key` if this subscription holds it.
    fn settle(&mut self, key: &TimerKey, attempt: u32) -> bool {
        match self.in_flight.get(key) {
            Some((a, _)) if *a == attempt => self.in_flight.remove(key).is_some(),
            _ => false,
        }
    }
}

struct Sub {
    namespace: String,
    consumer: String,
    /// The leader's pusher, not a stream.
    push: bool,
    max_in_flight: usize,
    /// The most `max_in_flight` may become (the channel's size).
    capacity: usize,
    /// Unsettled deliveries: the attempt each timer was delivered as, and its ack deadline.
    in_flight: HashMap<TimerKey, (u32, i64)>,
    /// Room promised to grants not yet applied.
    reserved: usize,
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
pub struct Dispatcher {
    registry: Mutex<Registry>,
    wake: Notify,
    store: Store,
    /// Dispatch-rate buckets per namespace, taken when grants are planned.
    tokens: Buckets,
    /// The same rates, taken when a delivery goes out (`pace`).
    sends: Buckets,
}

/// What planning needs of a namespace, read once per plan.
#[derive(Debug, Clone, Copy)]
struct NsLimits {
    policy: Policy,
    push: bool,
    /// Deliveries unsettled or reserved, across its subscriptions.
    used: usize,
}

/// Why a grant was cut short or not made (a metric label).
fn throttled(namespace: &str, limit: &'static str) {
    metrics::counter!(crate::metrics::DISPATCH_THROTTLED, "namespace" => namespace.to_string(), "limit" => limit)
        .increment(1);
}

/// Grants planned for subscriptions: the grants, and for each the subscription and the room
/// it reserved.
#[derive(Debug, Default)]
pub struct Plan {
    pub grants: Vec<Grant>,
    subs: Vec<(u64, usize)>,
    /// The term it was planned in (its tokens came from that term's buckets).
    term: u64,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }
}

/// A plan out for proposal: handed out when its entry applied, released when it failed — and
/// released when dropped before either. The worker proposing it can be cancelled at any await
/// (`while_leader` drops the leader's workers when leadership moves), and a reservation left
/// behind would shrink its subscription's room for the subscription's whole life (to nothing,
/// if it reserved all of it).
pub struct Planned<'a> {
    dispatcher: &'a Dispatcher,
    plan: Option<Plan>,
}

impl Planned<'_> {
    pub fn grants(&self) -> &[Grant] {
        self.plan.as_ref().map_or(&[], |p| &p.grants)
    }

    pub fn is_empty(&self) -> bool {
        self.plan.as_ref().is_none_or(Plan::is_empty)
    }

    /// The entry carrying the plan applied with `leases`: sends what each holds (see
    /// [`Dispatcher::hand_out`]); how many were sent.
    pub fn hand_out(mut self, store: &Store, leases: Vec<Option<Granted>>) -> usize {
        match self.plan.take() {
            Some(plan) => self.dispatcher.hand_out(store, plan, leases),
            None => 0,
        }
    }

    /// The entry carrying the plan failed: its room and tokens are free again.
    pub fn release(mut self) {
        if let Some(plan) = self.plan.take() {
            self.dispatcher.release(plan);
        }
    }
}

impl Drop for Planned<'_> {
    fn drop(&mut self) {
        if let Some(plan) = self.plan.take() {
            self.dispatcher.release(plan);
        }
    }
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

    /// The consumer of this subscription acked or nacked delivery `attempt` of `key` on its
    /// stream: its room is free again (judged before the state machine does, so that a
    /// consumer reading on is not held up by the commit) — only if this subscription holds
    /// that very delivery. An ack of another stream's delivery, or of an older attempt, frees
    /// nothing here.
    pub fn settled(&self, key: &TimerKey, attempt: u32) {
        let mut reg = self.dispatcher.lock();
        let freed = reg
            .subs
            .get_mut(&self.id)
            .is_some_and(|s| s.settle(key, attempt));
        drop(reg);
        if freed {
            self.dispatcher.wake.notify_one();
        }
    }

    /// Changes how many unsettled deliveries it may hold (at most what it was made with).
    /// Deliveries it holds beyond a lowered limit stay; it is granted nothing until below.
    pub fn set_max_in_flight(&self, max_in_flight: usize) {
        let mut reg = self.dispatcher.lock();
        let Some(sub) = reg.subs.get_mut(&self.id) else {
            return;
        };
        let max_in_flight = max_in_flight.clamp(1, sub.capacity);
        let grew = max_in_flight > sub.max_in_flight;
        sub.max_in_flight = max_in_flight;
        drop(reg);
        if grew {
            self.dispatcher.wake.notify_one();
        }
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
    pub fn new(store: Store) -> Dispatcher {
        Dispatcher {
            registry: Mutex::default(),
            wake: Notify::new(),
            store,
            tokens: Buckets::default(),
            sends: Buckets::default(),
        }
    }

    /// Whether one more delivery of `namespace`, whose dispatch rate and burst are `limit`, may
    /// go out at `now_ms` (on a stream or as a push request); `Err(ms)`: not for that long.
    ///
    /// The rate is applied here a second time, after the grants: grants ride on entries whose
    /// commit time varies (a slow fsync holds several, then they apply together), so leases
    /// arrive in clumps. Paced as they go out, deliveries keep any one-second window at the
    /// consumers within `burst + rate`; the burst is smaller here by 20 ms of the rate, a margin
    /// for the jitter between going out and arriving. Shared by every subscription of the
    /// namespace, and empty when this node starts to lead, like the grants' buckets.
    pub fn pace(&self, namespace: &str, (rate, burst): (u32, u32), now_ms: i64) -> Result<(), u64> {
        let leading = self.tokens.current();
        let burst = burst.saturating_sub(rate / 50).max(1);
        self.sends
            .with(leading, now_ms, namespace, (rate, burst), |b| b.take_all(1))
            .map_err(|wait| wait.unwrap_or(1000).max(1))
    }

    /// Waits until [`Dispatcher::pace`] lets one delivery of `namespace` go out.
    pub async fn paced(&self, namespace: &str, limit: (u32, u32), clock: &Clock) {
        while let Err(ms) = self.pace(namespace, limit, clock.now_ms()) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a subscription to `namespace` holding at most `max_in_flight` unsettled
    /// (`push`: the leader's pusher).
    pub fn subscribe(
        self: &Arc<Self>,
        namespace: &str,
        consumer: &str,
        max_in_flight: usize,
        push: bool,
    ) -> Subscription {
        let (tx, rx) = mpsc::channel(max_in_flight.max(1));
        let id = {
            let mut reg = self.lock();
            reg.next_id += 1;
            let id = reg.next_id;
            let sub = Sub {
                namespace: namespace.to_string(),
                consumer: consumer.to_string(),
                push,
                max_in_flight,
                capacity: max_in_flight.max(1),
                in_flight: HashMap::new(),
                reserved: 0,
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

    /// Whether any subscription is open here (else the dispatch loop waits for one).
    pub fn has_subscriptions(&self) -> bool {
        !self.lock().subs.is_empty()
    }

    /// Delivery `attempt` of `key` was settled (an Ack or Nack the state machine accepted, a
    /// push answered): the subscription holding that very delivery has room again. Only that
    /// attempt: an ack of an older one (a stale ack, the delivery made again elsewhere since)
    /// frees nothing, or a subscription's room would exceed its `max_in_flight` (issue 33
    /// finding 8).
    pub fn settled(&self, key: &TimerKey, attempt: u32) {
        let mut reg = self.lock();
        let freed = reg.subs.values_mut().any(|s| s.settle(key, attempt));
        drop(reg);
        if freed {
            self.wake.notify_one();
        }
    }

    /// Plans a grant for every subscription with room, reserving it, in rotating order. With
    /// `waiting`, only for namespaces it says have timers waiting (a Deliver entry of its own
    /// is worth proposing only then; a Fire entry grants to everyone, for what it fires).
    ///
    /// `term` is this leader's: the rate buckets start empty in a new one (see `limits`).
    pub fn plan(
        &self,
        now_ms: i64,
        term: u64,
        waiting: Option<&dyn Fn(&str) -> bool>,
    ) -> Planned<'_> {
        Planned {
            dispatcher: self,
            plan: Some(self.plan_grants(now_ms, term, waiting)),
        }
    }

    fn plan_grants(&self, now_ms: i64, term: u64, waiting: Option<&dyn Fn(&str) -> bool>) -> Plan {
        self.tokens.lead(term, now_ms);
        let mut reg = self.lock();
        let ids: Vec<u64> = reg.subs.keys().copied().collect();
        let mut plan = Plan {
            term,
            ..Plan::default()
        };
        if ids.is_empty() {
            return plan;
        }
        reg.turn = reg.turn.wrapping_add(1);
        let first = reg.turn % ids.len();
        let mut has_waiting: HashMap<String, bool> = HashMap::new();
        let mut limits: HashMap<String, NsLimits> = HashMap::new();
        for sub in reg.subs.values_mut() {
            sub.in_flight.retain(|_, (_, deadline)| *deadline > now_ms);
            let used = sub.in_flight.len() + sub.reserved;
            if let Some(l) = limits.get_mut(&sub.namespace) {
                l.used += used;
                continue;
            }
            let (policy, push) = match self.store.namespace(&sub.namespace) {
                Ok(ns) => (ns.policy, ns.push.is_some()),
                Err(e) => {
                    tracing::warn!(error = %e, "dispatcher: cannot read a namespace");
                    continue;
                }
            };
            limits.insert(sub.namespace.clone(), NsLimits { policy, push, used });
        }
        // A new leader's predecessor may still have deliveries out (requests a receiver is
        // working on): until their deadline they count against the namespace's concurrency.
        let since = self.tokens.since(term).unwrap_or(now_ms);
        for (name, ns) in limits.iter_mut() {
            let fresh = now_ms < since.saturating_add(ns.policy.ack_timeout_ms as i64);
            if ns.policy.max_concurrent_dispatches.is_some() && fresh {
                match self.store.in_flight_before(name, since, now_ms) {
                    Ok(n) => ns.used += n as usize,
                    Err(e) => tracing::warn!(error = %e, "dispatcher: cannot read leases"),
                }
            }
        }
        for id in ids[first..].iter().chain(&ids[..first]) {
            let Some(sub) = reg.subs.get_mut(id) else {
                continue;
            };
            let Some(ns) = limits.get_mut(&sub.namespace) else {
                continue;
            };
            let mut room = sub
                .max_in_flight
                .saturating_sub(sub.in_flight.len() + sub.reserved);
            if room == 0 || sub.tx.is_closed() || ns.push != sub.push || ns.policy.paused {
                continue;
            }
            if let Some(waiting) = waiting {
                let name = sub.namespace.clone();
                if !*has_waiting.entry(name).or_insert_with_key(|n| waiting(n)) {
                    continue;
                }
            }
            if let Some(max) = ns.policy.max_concurrent_dispatches {
                let left = (max as usize).saturating_sub(ns.used);
                if left < room {
                    throttled(&sub.namespace, "concurrency");
                    room = left;
                }
            }
            if let (Some(rate), true) = (ns.policy.max_dispatches_per_second, room > 0) {
                let limit = (rate, ns.policy.max_burst);
                let want = room as u32;
                let got = self
                    .tokens
                    .with((term, now_ms), now_ms, &sub.namespace, limit, |b| {
                        b.take_up_to(want)
                    });
                if got < want {
                    throttled(&sub.namespace, "rate");
                }
                room = got as usize;
            }
            if room == 0 {
                continue;
            }
            ns.used += room;
            sub.reserved += room;
            plan.grants.push(Grant {
                namespace: sub.namespace.clone(),
                room: room as u32,
                push: sub.push,
            });
            plan.subs.push((*id, room));
        }
        plan
    }

    /// Gives back the tokens of `grant` that `used` did not take (a rate-limited namespace's).
    fn refund(&self, plan_term: u64, grant: &Grant, used: u32) {
        let unused = grant.room.saturating_sub(used);
        if unused == 0 {
            return;
        }
        let Ok(ns) = self.store.namespace(&grant.namespace) else {
            return;
        };
        if ns.policy.max_dispatches_per_second.is_some() {
            self.tokens.refund(plan_term, &grant.namespace, unused);
        }
    }

    /// The entry carrying `plan` failed: its room is free again.
    fn release(&self, plan: Plan) {
        for g in &plan.grants {
            self.refund(plan.term, g, 0);
        }
        let mut reg = self.lock();
        for (id, room) in plan.subs {
            if let Some(sub) = reg.subs.get_mut(&id) {
                sub.reserved = sub.reserved.saturating_sub(room);
            }
        }
    }

    /// The entry carrying `plan` applied: sends what each lease holds (read back from the
    /// applied state) to the subscription it was granted for. Returns how many were sent.
    fn hand_out(&self, store: &Store, plan: Plan, leases: Vec<Option<Granted>>) -> usize {
        for (g, lease) in plan.grants.iter().zip(&leases) {
            self.refund(plan.term, g, lease.as_ref().map_or(0, |l| l.count));
        }
        let mut read = Vec::with_capacity(leases.len());
        for lease in leases {
            let timers = match &lease {
                Some(g) => store.leased(g).unwrap_or_else(|e| {
                    // They are in flight under the lease: delivered again after its deadline.
                    tracing::warn!(error = %e, "dispatcher: cannot read a lease back");
                    Vec::new()
                }),
                None => Vec::new(),
            };
            read.push((lease, timers));
        }
        let mut reg = self.lock();
        let mut sent = 0;
        for ((id, room), (lease, timers)) in plan.subs.into_iter().zip(read) {
            let Some(sub) = reg.subs.get_mut(&id) else {
                continue;
            };
            sub.reserved = sub.reserved.saturating_sub(room);
            let Some(g) = lease else {
                continue;
            };
            let tag = (timers.len() == g.count as usize).then(|| LeaseTag {
                lease: LeaseRef {
                    namespace: g.namespace.clone(),
                    to: g.to,
                },
                count: g.count,
                deadline_ms: g.deadline_ms,
            });
            for timer in timers {
                let attempt = timer.attempts;
                sub.in_flight
                    .insert(timer.key.clone(), (attempt, g.deadline_ms));
                let lease = tag.clone();
                if sub
                    .tx
                    .try_send(Delivery {
                        timer,
                        attempt,
                        deadline_ms: g.deadline_ms,
                        lease,
                    })
                    .is_ok()
                {
                    sent += 1;
                }
            }
        }
        sent
    }
}

mod deliver;
pub use deliver::DispatchLoop;

#[cfg(test)]
mod tests;
