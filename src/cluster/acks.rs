//! The ack coalescer: acks that arrive on delivery streams (`Consume`), from every stream of
//! this node, go out together as shared `Acks` entries.
//!
//! A consumer that acks on its stream does not wait for the ack to commit: it sends it and reads
//! the next delivery. The coalescer takes whatever acks have queued up, proposes them as one
//! command through the proposer (which packs it with other client commands), and, while that
//! commits, queues the next ones; so a thousand acks a second cost a few entries, not a thousand.
//! A whole lease acked on one stream goes as one lease ack (one write for all its timers); if
//! that lease is no longer open (its deadline passed first), its deliveries are acked one by
//! one instead, which is what an ack of each would have done.
//!
//! Unary Acks answered once queued (the default; `node/ack.rs`) come here too, one lane per
//! namespace.
//!
//! Stream acks are at-least-once like deliveries: an ack lost with a failing leader leaves the
//! timer in flight, and it is delivered again after its deadline. A stream that finishes
//! cleanly waits for [`Acker::applied`], a barrier behind everything queued before it; a
//! consumer that needs to know one ack took effect uses `Ack` with `wait_for_commit`, or
//! `AckBatch`, which answer once applied.
//!
//! Stream nacks come here too (one `Nack` command each, proposed together: the proposer packs
//! them into one entry), not a task per nack. The queue is bounded ([`QUEUE`], [`PER_LANE`]
//! for each source): a stream whose acks come faster than they commit waits to hand in more,
//! stops reading its client's messages, and HTTP/2 flow control stops the client — memory
//! stays bounded however fast a client sends (issue 33 findings 5 and 12). Sources are taken
//! in turns (`lanes.rs`): one acking a backlog does not hold back another's acks.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::lanes::Lanes;
use super::queued::{Draining, Queued, Ticket};
use super::Proposer;
use crate::clock::Clock;
use crate::command::{Command, LeaseRef, Response};
use crate::timer::TimerKey;

/// Most acks in one command (a lease counts as one).
const MAX_ACKS: usize = 10_000;
/// Items the coalescer's queue holds; a stream hands in more only as they are taken.
pub const QUEUE: usize = 4 * MAX_ACKS;
/// Items one lane (a stream, a namespace's pusher) may have queued: a quarter of the
/// queue, so a flood from one leaves room for others.
const PER_LANE: usize = QUEUE / 4;
/// Ack commands outstanding at once.
const IN_FLIGHT: usize = 2;
/// How long one ack proposal may take before it counts as failed (its acks lost: their timers
/// come again after their deadline). Without a bound, two proposals that are never answered
/// would hold both slots, and no stream's or the pusher's ack would ever commit again.
const PROPOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `cmd` proposed, within [`PROPOSE_TIMEOUT`].
async fn bounded(proposer: &Proposer, cmd: Command) -> crate::Result<Response> {
    match tokio::time::timeout(PROPOSE_TIMEOUT, proposer.propose(cmd)).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(timeout = ?PROPOSE_TIMEOUT, "acks: a proposal was not answered in time");
            Err(crate::Error::OutcomeUnknown(format!(
                "an ack proposal was not answered within {PROPOSE_TIMEOUT:?}"
            )))
        }
    }
}

/// What a stream acked.
#[derive(Debug)]
pub enum AckItem {
    /// One delivery: (timer, attempt).
    One(TimerKey, u32),
    /// Every delivery of a lease; `deliveries` are acked one by one if the lease is not open.
    Lease {
        lease: LeaseRef,
        deliveries: Vec<(TimerKey, u32)>,
    },
    /// A nack of one delivery: (timer, attempt).
    Nack(TimerKey, u32),
    /// A unary ack answered before it applies (`node::ack`), proposed as `One`; its ticket
    /// settles when the item is dropped (`queued.rs`).
    Queued(TimerKey, u32, Ticket),
    /// Answered once every item queued before it was proposed and answered.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

impl PartialEq for AckItem {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (AckItem::One(k, a), AckItem::One(l, b)) => k == l && a == b,
            (AckItem::Nack(k, a), AckItem::Nack(l, b)) => k == l && a == b,
            (AckItem::Queued(k, a, _), AckItem::Queued(l, b, _)) => k == l && a == b,
            (
                AckItem::Lease { lease, deliveries },
                AckItem::Lease {
                    lease: l,
                    deliveries: d,
                },
            ) => lease == l && deliveries == d,
            _ => false,
        }
    }
}

/// The queue into the coalescer task: one lane per stream (and per namespace's pusher),
/// taken in turns (`lanes.rs`).
#[derive(Clone)]
pub struct Acker {
    queue: Arc<Lanes<AckItem>>,
    /// Ack proposals that failed, ever.
    failed: Arc<std::sync::atomic::AtomicU64>,
    /// Acks the simulator's `drop-stream-acks` or `drop-queued-acks` plant has seen.
    planted_seen: Arc<std::sync::atomic::AtomicU64>,
    /// Unary acks answered as queued and not yet settled.
    queued: Arc<Queued>,
}

impl Acker {
    pub fn start(proposer: Proposer, clock: Clock) -> Acker {
        let (queue, wake) = Lanes::new(PER_LANE, QUEUE);
        let failed = Arc::<std::sync::atomic::AtomicU64>::default();
        tokio::spawn(run(
            proposer,
            clock,
            Arc::downgrade(&queue),
            wake,
            failed.clone(),
        ));
        Acker {
            queue,
            failed,
            planted_seen: Default::default(),
            queued: Default::default(),
        }
    }

    /// Queues a unary ack that the leader of `term` answers before it applies (`node::ack`, on
    /// a lane with the top bit set); false, and nothing queued, while a hand-over drains them
    /// ([`Acker::drain_queued`]), once one was started in `term`, or once the coalescer has
    /// stopped.
    pub async fn queue(&self, term: u64, lane: u64, key: TimerKey, attempt: u32) -> bool {
        let Some(ticket) = self.queued.enter(term) else {
            return false;
        };
        self.ack(lane, AckItem::Queued(key, attempt, ticket)).await
    }

    /// Stops queuing unary acks and waits, at most `within`, until every one queued was
    /// proposed and answered; queuing resumes once the guard is dropped. `Err`: how many were
    /// still unsettled after `within` (queuing has resumed).
    pub async fn drain_queued(&self, within: std::time::Duration) -> Result<Draining, u64> {
        self.queued.drain(within).await
    }

    /// No unary ack is queued again, in any term: the node is stopping.
    pub fn stop_queuing(&self) {
        self.queued.hand_over_in(u64::MAX);
    }

    /// No unary ack is queued in `term` again: a hand-over is about to ask openraft to
    /// transfer, after which it refuses writes for the rest of that leadership.
    pub fn hand_over_in(&self, term: u64) {
        self.queued.hand_over_in(term);
    }

    /// The latest term a hand-over was started in (0: none): from then on that leadership
    /// takes no write and sends no heartbeat (openraft's transfer), so its group must not rest
    /// (`cluster::rest`): if the successor never takes over, the members' elections must run.
    pub fn handed_over_in(&self) -> u64 {
        self.queued.handed_over_in()
    }

    /// Hands in `item` on `lane` (a [`StreamAcks::lane`]), waiting while it is full; false if
    /// the coalescer has stopped (the item is dropped: its timer comes again).
    pub async fn ack(&self, lane: u64, item: AckItem) -> bool {
        let ack = matches!(
            item,
            AckItem::One(..) | AckItem::Queued(..) | AckItem::Lease { .. }
        );
        // Unary acks answered once queued come on the lanes with the top bit set
        // (`node::ack`): each path has its own planted bug, so each is shown to be checked.
        let plant = match lane >> 63 {
            1 => "drop-queued-acks",
            _ => "drop-stream-acks",
        };
        if ack && crate::sim::planted(plant) {
            // The planted bug: every other ack vanishes (its timers come again).
            let n = (self.planted_seen).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n.is_multiple_of(2) {
                return true;
            }
        }
        self.queue.push(lane, item).await
    }

    /// Resolves once every ack `lane` queued before the call was proposed and answered: true
    /// if no ack proposal failed meanwhile (then they all applied), false if one did (then
    /// some may be lost: possibly others', the answer errs on the safe side).
    pub async fn applied(&self, lane: u64) -> bool {
        use std::sync::atomic::Ordering;
        let failed = self.failed.load(Ordering::Acquire);
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.queue.push(lane, AckItem::Barrier(tx)).await || rx.await.is_err() {
            return false;
        }
        self.failed.load(Ordering::Acquire) == failed
    }
}

/// The coalescer: takes what the lanes hold (in turns, up to [`MAX_ACKS`]) and proposes it,
/// [`IN_FLIGHT`] proposals at once; ends once the queue is gone (its node stopped).
async fn run(
    proposer: Proposer,
    clock: Clock,
    queue: std::sync::Weak<Lanes<AckItem>>,
    wake: Arc<tokio::sync::Notify>,
    failed: Arc<std::sync::atomic::AtomicU64>,
) {
    // However this task ends (a panic included), nobody waits on its queue any more.
    struct Closes<T>(std::sync::Weak<Lanes<T>>);
    impl<T> Drop for Closes<T> {
        fn drop(&mut self) {
            if let Some(lanes) = self.0.upgrade() {
                // Only a panic ends this task while its node runs: a bug, said loudly.
                tracing::error!(
                    "the ack coalescer stopped while its node runs: stream and push acks are \
                     dropped (their timers are delivered again) until the node restarts"
                );
                lanes.close();
            }
        }
    }
    let _closes = Closes(queue.clone());
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(lanes) = queue.upgrade() else {
            return;
        };
        let mut items = lanes.take(MAX_ACKS, |i| matches!(i, AckItem::Barrier(_)));
        drop(lanes);
        let barrier = match items.last() {
            Some(AckItem::Barrier(_)) => match items.pop() {
                Some(AckItem::Barrier(done)) => Some(done),
                _ => None,
            },
            _ => None,
        };
        if items.is_empty() {
            drop(slot);
        } else {
            let (proposer, failed) = (proposer.clone(), failed.clone());
            tokio::spawn(async move {
                if !propose(&proposer, &clock, items).await {
                    failed.fetch_add(1, std::sync::atomic::Ordering::Release);
                }
                drop(slot);
            });
        }
        match barrier {
            // Every proposal spawned before it (its lane's earlier items among them) has
            // finished once all slots are free again.
            Some(done) => {
                if let Ok(all) = slots.acquire_many(IN_FLIGHT as u32).await {
                    drop(all);
                }
                let _ = done.send(());
            }
            None => {
                if !queue.upgrade().is_some_and(|q| q.has_items()) {
                    wake.notified().await;
                }
            }
        }
    }
}

/// Proposes `items` as one Acks command; the deliveries of leases that were not open any more
/// are then acked one by one, in a second command, before this returns. False if a proposal
/// failed.
async fn propose(proposer: &Proposer, clock: &Clock, items: Vec<AckItem>) -> bool {
    let (mut leases, mut fallbacks, mut acks) = (Vec::new(), Vec::new(), Vec::new());
    let mut nacks = Vec::new();
    // Dropped when this returns: the queued acks among `items` are settled then, answered.
    let mut tickets = Vec::new();
    for item in items {
        match item {
            AckItem::One(key, attempt) => acks.push((key, attempt)),
            AckItem::Queued(key, attempt, ticket) => {
                acks.push((key, attempt));
                tickets.push(ticket);
            }
            AckItem::Lease { lease, deliveries } => {
                leases.push(lease);
                fallbacks.push(deliveries);
            }
            AckItem::Nack(key, attempt) => nacks.push((key, attempt)),
            AckItem::Barrier(_) => unreachable!("barriers are not proposed"),
        }
    }
    // Each nack is judged alone (a refused one, stale or of a DEAD timer, changes nothing);
    // proposed together, the proposer packs them into one entry.
    let now_ms = clock.now_ms();
    let nacked = nacks.into_iter().map(|(key, attempt)| {
        bounded(
            proposer,
            Command::Nack {
                now_ms,
                key,
                attempt,
            },
        )
    });
    let nacked = futures::future::join_all(nacked).await;
    let mut ok = true;
    for r in nacked {
        match r {
            Ok(_) => {}
            Err(e) if e.is_retryable() => ok = false,
            Err(e) => tracing::debug!(error = %e, "stream nack refused"),
        }
    }
    if leases.is_empty() && acks.is_empty() {
        return ok;
    }
    let cmd = Command::Acks {
        now_ms: clock.now_ms(),
        leases,
        acks,
    };
    let one_by_one: Vec<(TimerKey, u32)> = match bounded(proposer, cmd).await {
        Ok(Response::Acked { leases, .. }) => leases
            .into_iter()
            .zip(fallbacks)
            .filter(|(whole, _)| !whole)
            .flat_map(|(_, deliveries)| deliveries)
            .collect(),
        Ok(other) => {
            tracing::warn!(?other, "acks: unexpected response");
            return false;
        }
        // Not the leader any more, or no quorum: these acks are lost; their timers are
        // delivered again after their deadline (at-least-once).
        Err(e) => {
            tracing::debug!(error = %e, "acks: proposal failed");
            return false;
        }
    };
    if !one_by_one.is_empty() {
        let cmd = Command::Acks {
            now_ms: clock.now_ms(),
            leases: Vec::new(),
            acks: one_by_one,
        };
        if let Err(e) = bounded(proposer, cmd).await {
            tracing::debug!(error = %e, "acks: proposal failed");
            return false;
        }
    }
    ok
}

/// How long a stream holds the acks of a lease it has not heard every ack of, before it sends
/// them one by one (and no later than this before the lease's deadline).
pub const HOLD: std::time::Duration = std::time::Duration::from_millis(100);

/// What one stream has sent and heard back: acks of a lease are held until every delivery of
/// it was acked (then one lease ack goes out) or until [`HOLD`] has passed (then they go one by
/// one). Deliveries that did not come in a whole lease are acked one by one at once.
pub struct StreamAcks {
    namespace: String,
    /// This source's lane in the coalescer's queue ([`Acker::ack`]).
    lane: u64,
    /// How long acks of an incomplete lease are held ([`HOLD`] for a stream).
    hold: std::time::Duration,
    /// Id → (attempt, lease, deadline) of each delivery sent and not yet acked; forgotten
    /// once its deadline passed (it is delivered again then, with another attempt).
    sent: std::collections::HashMap<String, (u32, Option<super::LeaseTag>, i64)>,
    held: std::collections::HashMap<LeaseRef, Held>,
}

struct Held {
    deadline_ms: i64,
    remaining: u32,
    acked: Vec<(TimerKey, u32)>,
    /// When the first ack was held; `None` while none is.
    since: Option<tokio::time::Instant>,
    /// A delivery of it was nacked, or its acks were sent one by one: no lease ack any more.
    broken: bool,
}

impl StreamAcks {
    pub fn new(namespace: &str) -> Self {
        Self::with_hold(namespace, HOLD)
    }

    /// Holding acks of an incomplete lease for `hold` instead of [`HOLD`]: the pusher's, whose
    /// every delivery is answered within its request timeout, so that a lease waits for its
    /// last answer and is acked whole.
    pub fn with_hold(namespace: &str, hold: std::time::Duration) -> Self {
        static LANES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        StreamAcks {
            namespace: namespace.to_string(),
            lane: LANES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            hold,
            sent: Default::default(),
            held: Default::default(),
        }
    }

    /// This source's lane in the coalescer's queue: what it hands in is taken in turns with
    /// other sources'.
    pub fn lane(&self) -> u64 {
        self.lane
    }

    /// A delivery went out on the stream.
    pub fn sent(&mut self, d: &super::Delivery) {
        if let Some(tag) = &d.lease {
            self.held.entry(tag.lease.clone()).or_insert(Held {
                deadline_ms: tag.deadline_ms,
                remaining: tag.count,
                acked: Vec::new(),
                since: None,
                broken: false,
            });
        }
        self.sent.insert(
            d.timer.key.id.clone(),
            (d.attempt, d.lease.clone(), d.deadline_ms),
        );
    }

    /// Whether this stream sent delivery `attempt` of `id` and has not heard of it since.
    pub fn holds(&self, id: &str, attempt: u32) -> bool {
        self.sent.get(id).is_some_and(|(a, ..)| *a == attempt)
    }

    /// The consumer acked `(id, attempt)`: what to submit now.
    pub fn acked(&mut self, id: &str, attempt: u32, now: tokio::time::Instant) -> Vec<AckItem> {
        let key = TimerKey::new(self.namespace.clone(), id);
        let lease = match self.sent.get(id) {
            Some((a, Some(tag), _)) if *a == attempt => Some(tag.lease.clone()),
            _ => None,
        };
        if self.holds(id, attempt) {
            self.sent.remove(id);
        }
        let Some(held) = lease.as_ref().and_then(|l| self.held.get_mut(l)) else {
            return vec![AckItem::One(key, attempt)];
        };
        if held.broken {
            return vec![AckItem::One(key, attempt)];
        }
        held.acked.push((key, attempt));
        held.since.get_or_insert(now);
        held.remaining = held.remaining.saturating_sub(1);
        if held.remaining > 0 {
            return Vec::new();
        }
        let lease = lease.expect("held");
        let held = self.held.remove(&lease).expect("held");
        vec![AckItem::Lease {
            lease,
            deliveries: held.acked,
        }]
    }

    /// The consumer nacked `(id, attempt)`: its lease cannot be acked whole any more, so what
    /// is held of it goes one by one. (The caller proposes the nack itself.)
    pub fn nacked(&mut self, id: &str, attempt: u32) -> Vec<AckItem> {
        let lease = match self.sent.remove(id) {
            Some((a, Some(tag), _)) if a == attempt => tag.lease,
            _ => return Vec::new(),
        };
        match self.held.get_mut(&lease) {
            Some(held) => release(held),
            None => Vec::new(),
        }
    }

    /// Held acks that waited the hold (or whose lease's deadline is near): one by one now.
    pub fn flush_due(&mut self, now: tokio::time::Instant, now_ms: i64) -> Vec<AckItem> {
        let mut out = Vec::new();
        let hold = self.hold;
        self.held.retain(|_, held| {
            let waited = held.since.is_some_and(|s| now.duration_since(s) >= hold);
            let near_deadline = now_ms + HOLD.as_millis() as i64 >= held.deadline_ms;
            if waited || (near_deadline && !held.acked.is_empty()) {
                out.extend(release(held));
            }
            // A lease past its deadline will never be acked whole: forget it.
            now_ms <= held.deadline_ms
        });
        self.sent.retain(|_, (_, _, deadline)| now_ms <= *deadline);
        out
    }

    /// Everything held, as single acks (the stream ended or moves to another leader).
    pub fn drain(&mut self) -> Vec<(TimerKey, u32)> {
        self.sent.clear();
        let held = std::mem::take(&mut self.held);
        held.into_values().flat_map(|h| h.acked).collect()
    }
}

/// Sends what `held` holds one by one, and marks it broken.
fn release(held: &mut Held) -> Vec<AckItem> {
    held.broken = true;
    held.since = None;
    std::mem::take(&mut held.acked)
        .into_iter()
        .map(|(k, a)| AckItem::One(k, a))
        .collect()
}

#[cfg(test)]
mod tests;
