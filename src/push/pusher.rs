//! One namespace's pusher: its queue, its lanes, and the outcome of every request.
//!
//! The namespace task receives what the dispatcher leased to the namespace's pusher
//! subscription, paces it (the dispatch rate, below), and queues it; **lanes** take deliveries
//! off the queue one at a time and send each (over HTTP on the lane's own connection, or over
//! the gRPC channel). A lane is started when a delivery waits and no lane is free, up to
//! [`MAX_PUSH_IN_FLIGHT`], and ends after [`LANE_IDLE`] without work, so a namespace holds as
//! many connections as its receiver's pace needs.
//!
//! **Lease room apart from concurrency.** The subscription may hold the lanes' requests plus a
//! queue as long as what the lanes answered in the last [`QUEUE_WINDOW`] (at most
//! [`MAX_QUEUE`]): a Fire entry can then lease everything it fires to a receiver that keeps up
//! (no Deliver entry of its own for what did not fit, and bigger leases acked whole), while a
//! receiver that stops answering gets no queue, so no timer waits leased with its deadline
//! running. A delivery whose lease would end before a request could be answered
//! (`now + timeout ≥ deadline`) is not sent: the deadline passes and it is delivered again.
//!
//! **Outcomes.** Successes are acked as a Consume stream's acks are: through the ack
//! coalescer, and a lease whose every request was answered 2xx as one lease ack (one write for
//! all its timers). The pusher holds a lease's acks up to [`PUSH_HOLD`] for its last answer.
//! A failure is a `Pushed` command carrying its exact outcome (status, timeout, connection
//! error, the first bytes of the body), which the timer's row records as it moves it to its
//! backoff.
//!
//! **Pacing.** A namespace's dispatch rate is applied twice: when the dispatcher plans a grant
//! (so leases do not run ahead) and here, before a delivery is queued (`Dispatcher::pace`, as
//! streams do before they send): what the receiver sees stays within `burst + rate` in any
//! one second although grants commit in clumps.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::http::{self, HttpSender};
use super::{Answer, GrpcSender, Message, MAX_PUSH_IN_FLIGHT};
use crate::cluster::acks::StreamAcks;
use crate::cluster::{Delivery, Subscription};
use crate::command::Command;
use crate::metrics::PushMetrics;
use crate::namespace::sign::Secret;
use crate::namespace::{Protocol, PushTarget};
use crate::node::Node;
use crate::timer::{AttemptRecord, Channel};

/// Most deliveries a namespace may have leased beyond its requests under way.
pub const MAX_QUEUE: usize = 4096;
/// The queue may hold what the lanes answered in this long.
const QUEUE_WINDOW: Duration = Duration::from_millis(100);
/// How often the lease room is resized, held acks are looked at, and the gauge is set.
const TICK: Duration = Duration::from_millis(25);
/// A lane with nothing to send for this long ends, closing its connection.
const LANE_IDLE: Duration = Duration::from_secs(30);
/// Longest the pusher holds the acks of a lease some of whose requests are unanswered.
const PUSH_HOLD: Duration = Duration::from_secs(1);

/// A push target as the requests use it (secrets decoded, URL parsed).
pub struct Target {
    /// The namespace's dispatch rate and burst, if it has one.
    pub rate: Option<(u32, u32)>,
    pub url: String,
    pub uri: ::http::Uri,
    pub protocol: Protocol,
    pub secrets: Vec<Secret>,
    pub timeout: Duration,
    pub dead_on_client_error: bool,
}

impl Target {
    /// `None` if a secret or the URL does not parse (both were validated when written).
    pub(super) fn from(t: &PushTarget, rate: Option<(u32, u32)>) -> Option<Target> {
        let secrets: Option<Vec<Secret>> =
            t.secrets.iter().map(|s| Secret::parse(s).ok()).collect();
        Some(Target {
            rate,
            url: t.url.clone(),
            uri: t.url.parse().ok()?,
            protocol: t.protocol(),
            secrets: secrets?,
            timeout: Duration::from_millis(t.timeout_ms),
            dead_on_client_error: t.dead_on_client_error,
        })
    }
}

/// What every namespace task needs of the node: the node, and the senders.
#[derive(Clone)]
pub struct Pusher {
    pub node: Arc<Node>,
    pub http: HttpSender,
    pub grpc: Arc<dyn GrpcSender>,
}

/// What a namespace task shares with its lanes.
pub struct Shared {
    namespace: String,
    pub target: RwLock<Arc<Target>>,
    /// `Store::namespaces_version` when `target` was read.
    read_at: AtomicU64,
    queue: Mutex<VecDeque<Delivery>>,
    wake: Notify,
    /// Lanes waiting for a delivery.
    idle: AtomicUsize,
    /// Requests under way.
    busy: AtomicUsize,
    /// Requests answered (or given up) so far.
    answered: AtomicU64,
    tracker: Mutex<StreamAcks>,
    metrics: PushMetrics,
}

impl Shared {
    /// A namespace's shared state, its `target` read from the state at `read_at`.
    pub fn new(ns: &str, target: Target, read_at: u64) -> Shared {
        Shared {
            namespace: ns.to_string(),
            target: RwLock::new(Arc::new(target)),
            read_at: AtomicU64::new(read_at),
            queue: Mutex::default(),
            wake: Notify::new(),
            idle: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            answered: AtomicU64::new(0),
            tracker: Mutex::new(StreamAcks::with_hold(ns, PUSH_HOLD)),
            metrics: PushMetrics::new(ns),
        }
    }

    pub fn set_target(&self, target: Target) {
        *self.target.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(target);
    }

    /// The target as the applied state has it now: read again from the store if an entry
    /// changed a namespace since it was read. A request that starts after a PutNamespace was
    /// acknowledged (applied on this leader first) uses what it set — both secrets during a
    /// rotation, the new URL, timeout and rate (issue 33 finding 10: up to 500 ms of requests
    /// went out with the old ones).
    fn current_target(&self, node: &Node) -> Arc<Target> {
        let now = node.namespaces_version();
        if self.read_at.load(Ordering::Acquire) != now {
            match node.applied_namespace(&self.namespace) {
                Ok(ns) => {
                    let rate = ns.policy.dispatch_limit();
                    if let Some(t) = ns.push.as_ref().and_then(|t| Target::from(t, rate)) {
                        self.set_target(t);
                    }
                    self.read_at.store(now, Ordering::Release);
                }
                Err(e) => tracing::warn!(error = %e, "pusher: cannot read the namespace"),
            }
        }
        self.target()
    }

    fn target(&self) -> Arc<Target> {
        self.target
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The next queued delivery, waiting up to `idle` for one.
    async fn next(&self, idle: Duration) -> Option<Delivery> {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(d) = lock(&self.queue).pop_front() {
                return Some(d);
            }
            self.idle.fetch_add(1, Ordering::AcqRel);
            let woken = tokio::time::timeout(idle, notified).await.is_ok();
            self.idle.fetch_sub(1, Ordering::AcqRel);
            if !woken {
                return lock(&self.queue).pop_front();
            }
        }
    }
}

impl Pusher {
    /// Pushes what the dispatcher leases to `sub` until the task is dropped.
    pub(super) async fn namespace(self, shared: Arc<Shared>, mut sub: Subscription) {
        let clock = self.node.config().clock;
        let mut lanes = JoinSet::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // (when, answered so far), over the last QUEUE_WINDOW.
        let mut answered: VecDeque<(Instant, u64)> = VecDeque::new();
        sub.set_max_in_flight(MAX_PUSH_IN_FLIGHT);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = Instant::now();
                    self.hand_in(&shared, |t| t.flush_due(now, clock.now_ms())).await;
                    answered.push_back((now, shared.answered.load(Ordering::Acquire)));
                    while answered.front().is_some_and(|(t, _)| now - *t > QUEUE_WINDOW) {
                        answered.pop_front();
                    }
                    let recent = answered.back().map_or(0, |b| b.1) - answered.front().map_or(0, |f| f.1);
                    sub.set_max_in_flight(MAX_PUSH_IN_FLIGHT + (recent as usize).min(MAX_QUEUE));
                    shared.metrics.in_flight(shared.busy.load(Ordering::Acquire));
                }
                d = sub.recv() => {
                    let Some(d) = d else { return };
                    lock(&shared.tracker).sent(&d);
                    if let Some(limit) = shared.current_target(&self.node).rate {
                        self.node.pace(&d.timer.key.namespace, limit).await;
                    }
                    lock(&shared.queue).push_back(d);
                    shared.wake.notify_one();
                    if shared.idle.load(Ordering::Acquire) == 0 && lanes.len() < MAX_PUSH_IN_FLIGHT {
                        lanes.spawn(self.clone().lane(shared.clone()));
                    }
                }
                Some(_) = lanes.join_next(), if !lanes.is_empty() => {}
            }
        }
    }

    /// One lane: sends queued deliveries one at a time until none came for [`LANE_IDLE`].
    async fn lane(self, shared: Arc<Shared>) {
        let mut conn = http::Lane::default();
        while let Some(d) = shared.next(LANE_IDLE).await {
            shared.busy.fetch_add(1, Ordering::AcqRel);
            self.push(&shared, &mut conn, d).await;
            shared.busy.fetch_sub(1, Ordering::AcqRel);
            shared.answered.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// One request, and its outcome committed (an ack through the tracker, or a `Pushed` nack).
    /// Hands what `take` makes of the tracker to the ack coalescer, on this namespace's lane.
    async fn hand_in(
        &self,
        shared: &Shared,
        take: impl FnOnce(&mut StreamAcks) -> Vec<crate::cluster::AckItem>,
    ) {
        let (lane, items) = {
            let mut tracker = lock(&shared.tracker);
            (tracker.lane(), take(&mut tracker))
        };
        for item in items {
            self.node.hand_in(lane, item).await;
        }
    }

    async fn push(&self, shared: &Shared, conn: &mut http::Lane, d: Delivery) {
        let clock = self.node.config().clock;
        let target = shared.current_target(&self.node);
        let key = d.timer.key.clone();
        let attempt = d.attempt;
        if clock.now_ms() + target.timeout.as_millis() as i64 >= d.deadline_ms {
            // Its lease ends before an answer could come: sent now, it could reach the
            // receiver after it was delivered again. Left to the deadline instead.
            tracing::debug!(timer = %key, attempt, "push not sent: its lease ends too soon");
            self.hand_in(shared, |t| t.nacked(&key.id, attempt)).await;
            self.node.settled(&key, attempt);
            return;
        }
        let now_s = clock.now_ms().div_euclid(1000);
        let msg = Message::new(d.timer, attempt, &target.secrets, now_s);
        let started = Instant::now();
        let answer: Answer = match target.protocol {
            Protocol::Http => {
                conn.send(&self.http, &target.uri, msg, target.timeout)
                    .await
            }
            Protocol::Grpc => self.grpc.send(&target.url, msg, target.timeout).await,
        };
        let elapsed = started.elapsed();
        shared.metrics.pushed(answer.label(), elapsed);
        let ok = answer.ok();
        // The receiver is done with it: its concurrency slot is free now, not once the outcome
        // commits (tens of ms that would cap a namespace at ~MAX_PUSH_IN_FLIGHT / commit time).
        // The timer cannot be leased again meanwhile: its lease is open until the outcome
        // applies or the deadline passes.
        self.node.settled(&key, attempt);
        if ok {
            self.hand_in(shared, |t| t.acked(&key.id, attempt, Instant::now()))
                .await;
            return;
        }
        let dead = target.dead_on_client_error && answer.client_error();
        let now_ms = clock.now_ms();
        let retry_after_ms = answer.retry_after.map_or(0, |r| r.wait_ms(now_ms));
        let record = AttemptRecord {
            at_ms: now_ms,
            attempt,
            channel: Channel::Push,
            outcome: answer.outcome,
            latency_ms: elapsed.as_millis().min(u32::MAX as u128) as u32,
            detail: answer.detail,
        }
        .bounded();
        tracing::debug!(timer = %key, attempt, outcome = ?record.outcome, "push failed");
        // What was held of its lease goes one by one; the failure goes with its record.
        self.hand_in(shared, |t| t.nacked(&key.id, attempt)).await;
        let cmd = Command::Pushed {
            now_ms,
            key: key.clone(),
            attempt,
            ok,
            dead,
            retry_after_ms,
            record,
        };
        // Committed apart, so that the lane is free for the next delivery meanwhile.
        let node = self.node.clone();
        tokio::spawn(async move {
            if let Err(e) = node.write(cmd).await {
                // Its lease expires and it is pushed again: at least once.
                tracing::debug!(timer = %key, attempt, error = %e, "push outcome not recorded");
            }
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
