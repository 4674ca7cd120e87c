//! The leader's pusher: one dispatcher subscription per namespace with a push target, one task
//! per request.
//!
//! While this node leads, [`PushLoop`] looks at the namespaces every [`REFRESH`]: it starts a
//! namespace task for each new push target, hands changed URLs, secrets and timeouts to the
//! running one, and stops the task of a target that was removed. A namespace task receives what
//! the dispatcher leased to its subscription and runs each request on a task of its own, so a
//! slow receiver holds only its namespace's room. When leadership is lost every task is dropped
//! (requests in flight are abandoned: their leases expire on the new leader, which pushes
//! them again).
//!
//! Successes are acked as a Consume stream's acks are: through the ack coalescer, and a lease
//! whose every request was answered 2xx as one lease ack (one write for all its timers, none
//! per timer), so the attempt log records them as `acked` (channel push). A failure is a
//! `Pushed` command carrying its exact outcome (status, timeout, connection error, the first
//! bytes of the body), which the timer's row records as it moves it to its backoff.
//!
//! A namespace's dispatch rate is applied twice: when the dispatcher plans a grant (so leases
//! do not run ahead) and here, when a request starts. The second one is what the receiver sees:
//! grants ride on entries whose commit time varies (a slow fsync holds several, then they apply
//! together), so leases arrive in clumps; pacing the requests themselves keeps any one-second
//! window at the receiver within `burst + rate` (its burst is smaller by 20 ms of the rate, a
//! margin for the jitter between sending and arriving). Like the dispatcher's, the bucket
//! starts empty when this node starts to lead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::http::HttpSender;
use super::sign::Secret;
use super::{Answer, GrpcSender, Message, MAX_PUSH_IN_FLIGHT};
use crate::cluster::acks::{StreamAcks, HOLD};
use crate::cluster::driver::while_leader;
use crate::cluster::limits::Bucket;
use crate::cluster::{Delivery, Subscription};
use crate::namespace::{Protocol, PushTarget};
use crate::node::Node;
use crate::timer::{AttemptRecord, Channel, Command};

/// How often the namespaces are read for push targets.
const REFRESH: Duration = Duration::from_millis(500);
/// Namespaces read per page when looking for push targets.
const PAGE: usize = 1000;

/// A push target as the requests use it (secrets decoded).
struct Target {
    /// The namespace's dispatch rate and burst, if it has one.
    rate: Option<(u32, u32)>,
    url: String,
    protocol: Protocol,
    secrets: Vec<Secret>,
    timeout: Duration,
    dead_on_client_error: bool,
}

impl Target {
    fn from(t: &PushTarget, rate: Option<(u32, u32)>) -> Option<Target> {
        let secrets: Option<Vec<Secret>> =
            t.secrets.iter().map(|s| Secret::parse(s).ok()).collect();
        Some(Target {
            rate,
            url: t.url.clone(),
            protocol: t.protocol(),
            secrets: secrets?,
            timeout: Duration::from_millis(t.timeout_ms),
            dead_on_client_error: t.dead_on_client_error,
        })
    }
}

/// A namespace's push target and its dispatch rate and burst, as the pusher reads them.
type PushConfig = (PushTarget, Option<(u32, u32)>);

/// A running namespace task; dropping it stops the task and abandons its requests.
struct Active {
    config: PushConfig,
    target: Arc<RwLock<Arc<Target>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The leader's pusher for one node.
#[derive(Clone)]
pub struct PushLoop {
    pub node: Arc<Node>,
    pub http: HttpSender,
    pub grpc: Arc<dyn GrpcSender>,
}

impl PushLoop {
    /// Runs until `shutdown` turns true, pushing while this node leads.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        let node = self.node.clone();
        while_leader(node.id, &node.raft, "pusher", shutdown, || self.lead()).await;
    }

    async fn lead(&self) {
        let since_ms = self.node.config.clock.now_ms();
        let mut active: HashMap<String, Active> = HashMap::new();
        loop {
            match self.targets() {
                Ok(targets) => self.update(&mut active, targets, since_ms),
                Err(e) => tracing::warn!(error = %e, "pusher: cannot read the namespaces"),
            }
            tokio::time::sleep(REFRESH).await;
        }
    }

    /// Every namespace's push target, with its dispatch rate and burst.
    fn targets(&self) -> crate::Result<HashMap<String, PushConfig>> {
        let mut out = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.node.store.namespaces(after.as_deref(), PAGE)?;
            let last = page.last().map(|ns| ns.name.clone());
            for ns in page {
                if let Some(push) = ns.push {
                    let p = ns.policy;
                    let rate = p.max_dispatches_per_second.map(|r| (r, p.max_burst));
                    out.insert(ns.name, (push, rate));
                }
            }
            match last {
                Some(name) => after = Some(name),
                None => return Ok(out),
            }
        }
    }

    fn update(
        &self,
        active: &mut HashMap<String, Active>,
        targets: HashMap<String, PushConfig>,
        since_ms: i64,
    ) {
        active.retain(|ns, a| {
            let keep = targets.contains_key(ns);
            if !keep {
                tracing::info!(namespace = ns, url = a.config.0.url, "push target removed");
            }
            keep
        });
        for (ns, config) in targets {
            let Some(target) = Target::from(&config.0, config.1) else {
                tracing::error!(namespace = ns, "push target with an unreadable secret");
                continue;
            };
            match active.get_mut(&ns) {
                Some(a) if a.config == config => {}
                Some(a) => {
                    tracing::info!(namespace = ns, url = config.0.url, "push target changed");
                    *a.target.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(target);
                    a.config = config;
                }
                None => {
                    tracing::info!(namespace = ns, url = config.0.url, "pushing");
                    let target = Arc::new(RwLock::new(Arc::new(target)));
                    let sub =
                        self.node
                            .dispatcher
                            .subscribe(&ns, "pusher", MAX_PUSH_IN_FLIGHT, true);
                    let task = tokio::spawn(self.clone().namespace(
                        ns.clone(),
                        target.clone(),
                        sub,
                        since_ms,
                    ));
                    active.insert(
                        ns,
                        Active {
                            config,
                            target,
                            task,
                        },
                    );
                }
            }
        }
    }

    /// Pushes what the dispatcher leases to `sub`, each delivery on its own task.
    async fn namespace(
        self,
        ns: String,
        target: Arc<RwLock<Arc<Target>>>,
        mut sub: Subscription,
        since_ms: i64,
    ) {
        let clock = self.node.config.clock;
        let mut running = JoinSet::new();
        let mut bucket: Option<Bucket> = None;
        let tracker = Arc::new(Mutex::new(StreamAcks::new(&ns)));
        let mut flush = tokio::time::interval(HOLD / 2);
        loop {
            tokio::select! {
                _ = flush.tick() => {
                    let due = lock(&tracker).flush_due(Instant::now(), clock.now_ms());
                    for item in due {
                        self.node.acker.ack(item);
                    }
                }
                d = sub.recv() => {
                    let Some(d) = d else { return };
                    lock(&tracker).sent(&d);
                    let t = target.read().unwrap_or_else(|p| p.into_inner()).clone();
                    if let Some((rate, burst)) = t.rate {
                        // 20 ms of the rate held back from the burst: requests reach the
                        // receiver with some jitter (a busy leader, the network), and the
                        // receiver's window must still hold no more than burst + rate.
                        let burst = burst.saturating_sub(rate / 50).max(1);
                        let b = bucket.get_or_insert_with(|| {
                            Bucket::empty_since(rate, burst, since_ms, clock.now_ms())
                        });
                        b.refill_with(rate, burst, clock.now_ms());
                        while let Err(wait) = b.take_all(1) {
                            let ms = wait.unwrap_or(1000).max(1);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            b.refill_with(rate, burst, clock.now_ms());
                        }
                    }
                    running.spawn(self.clone().push(t, d, tracker.clone()));
                }
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
            crate::metrics::push_in_flight(&ns, running.len());
        }
    }

    /// One request, and its outcome committed (an ack through `tracker`, or a `Pushed` nack).
    async fn push(self, target: Arc<Target>, d: Delivery, tracker: Arc<Mutex<StreamAcks>>) {
        let clock = self.node.config.clock;
        let key = d.timer.key.clone();
        let attempt = d.attempt;
        let msg = Message::new(
            d.timer,
            attempt,
            &target.secrets,
            clock.now_ms().div_euclid(1000),
        );
        let started = Instant::now();
        let answer: Answer = match target.protocol {
            Protocol::Http => self.http.send(&target.url, &msg, target.timeout).await,
            Protocol::Grpc => self.grpc.send(&target.url, msg, target.timeout).await,
        };
        let elapsed = started.elapsed();
        crate::metrics::pushed(&key.namespace, answer.label(), elapsed);
        let ok = answer.ok();
        let dead = !ok && target.dead_on_client_error && answer.client_error();
        let now_ms = clock.now_ms();
        let record = AttemptRecord {
            at_ms: now_ms,
            attempt,
            channel: Channel::Push,
            outcome: answer.outcome,
            latency_ms: elapsed.as_millis().min(u32::MAX as u128) as u32,
            detail: answer.detail,
        }
        .bounded();
        if !ok {
            tracing::debug!(timer = %key, attempt, outcome = ?record.outcome, "push failed");
        }
        // The receiver is done with it: its concurrency slot is free now, not once the outcome
        // commits (tens of ms that would cap a namespace at ~MAX_PUSH_IN_FLIGHT / commit time).
        // The timer cannot be leased again meanwhile: its lease is open until the outcome
        // applies or the deadline passes.
        self.node.dispatcher.settled(&key);
        if ok {
            let items = lock(&tracker).acked(&key.id, attempt, Instant::now());
            for item in items {
                self.node.acker.ack(item);
            }
            return;
        }
        // What was held of its lease goes one by one; the failure goes with its record.
        for item in lock(&tracker).nacked(&key.id, attempt) {
            self.node.acker.ack(item);
        }
        let cmd = Command::Pushed {
            now_ms,
            key: key.clone(),
            attempt,
            ok,
            dead,
            record,
        };
        if let Err(e) = self.node.write(cmd).await {
            // Its lease expires and it is pushed again: at least once.
            tracing::debug!(timer = %key, attempt, error = %e, "push outcome not recorded");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
