//! A running node's operations, in domain terms: what the API layer calls once it has decided
//! that this node is the leader (or that a local read will do).
//!
//! Writes become commands stamped with this node's clock and are proposed to Raft; reads of
//! timers are linearizable (a ReadIndex round through `ensure_linearizable`, then the local
//! state machine). An apply-time `Rejected` becomes the matching error here, so callers see one
//! error type. Nothing here knows about protobuf or forwarding.
//!
//! `Node` is the only door (mini-redis's `Db` is the model): its parts are private, and the
//! API layer and the pusher call its verbs. Every `impl Node` is under `node/`, one file per
//! concern: this file the struct, the write and read paths and the timers' plain verbs;
//! [`admit`] the payload and rate checks before a new timer is proposed; [`recurring`]
//! recurring timers;
//! [`namespaces`] namespace policies; [`ack`] the unary Ack; [`delivery`] what the delivery
//! channels (streams, pusher) ask of it; [`local`] local reads (access state, digest,
//! Status); [`health`] whether it serves; [`membership`] adding, removing and handing over to
//! members; [`backup`] online backups; [`overview`] the leader's view for dashboards;
//! [`leading`] what a new leader owes before it answers; [`quorum`] refusing at once without
//! a quorum, and when this node began to lead; [`sample`] the once-a-second gauges;
//! [`groups`] every group's door on the node ([`Nodes`]: which group a namespace's calls go
//! to, and catching up with group 0 before judging credentials); [`policies`] the data
//! groups' copies of namespaces' configurations.
//!
//! The wiring (`server`) builds it from its [`Parts`] and keeps the parts tests look inside
//! (`RunningNode`).

use openraft::async_runtime::WatchReceiver as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use openraft::error::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::ServerState;

use crate::cluster::{Acker, Dispatcher, Proposer, Raft};
use crate::command::{Command, Cond, Options, Rejection, Response, Shift};
use crate::config::NodeConfig;
use crate::raft_types::{NodeId, TypeConfig};
use crate::recurring::{RecurringView, TimerOrRecurring};
use crate::storage::Hold;
use crate::storage::{ListFilter, ListQuery, Page, Store};
use crate::timer::{Specs, Timer, TimerKey, TimerSpec, TimerState};
use crate::{Error, Result};
pub use ack::Acked;
pub use balance::balance_leaders;
pub use groups::{hand_over_when_cut_off, GroupView, Nodes, ReadIndexTask};
pub use health::LEADER_SILENT;
pub use local::NodeStatus;
pub use members::MemberStep;
pub use membership::Member;
pub use quorum::{quorum_watch, QUORUM_LOST_AFTER};

/// Who leads, as this node knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leader {
    Me,
    Other { id: NodeId, addr: String },
    Unknown,
}

/// One timerdb node: the door through which the API layer and the pusher reach everything
/// (mini-redis's `Db` is the model). Its parts are private: callers use its verbs, which say
/// in domain terms what they need ([`delivery`] for the streams and the pusher).
pub struct Node {
    id: NodeId,
    raft: Raft,
    store: Store,
    config: Arc<NodeConfig>,
    /// This node's subscriptions (served while it leads).
    dispatcher: Arc<Dispatcher>,
    /// Turns true when the node shuts down; long-lived streams end then.
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// Batches concurrent client writes into shared log entries.
    proposer: Proposer,
    /// Coalesces the acks that arrive on delivery streams into shared entries.
    acker: Acker,
    /// Closed while this node hands its leadership over (see `membership`).
    hold: Hold,
    /// The feature level each peer last advertised: which entry forms this node, leading,
    /// may propose (`cluster::level`).
    levels: Arc<crate::cluster::Levels>,
    /// The commit index as this node knows it (see `LogStore::committed`).
    committed: Arc<std::sync::atomic::AtomicU64>,
    /// This node's log (group 0's handle on the log engine): its size on disk, for metrics.
    log: crate::storage::LogStore,
    /// The snapshot directory (its counters, for status and metrics).
    snapshots: Arc<crate::storage::Snapshots>,
    /// Schedule-rate buckets per namespace (used while this node leads).
    schedule_tokens: crate::cluster::limits::ScheduleLimits,
    /// Client writes this node committed (the `lose-reply` fault counts them).
    writes: std::sync::atomic::AtomicU64,
    /// Whether this node leads without having heard from a quorum lately ([`quorum_watch`]).
    quorum_lost: tokio::sync::watch::Receiver<bool>,
    /// True while this node leads the group resting (`cluster::rest`).
    resting: tokio::sync::watch::Receiver<crate::cluster::rest::Silence>,
    /// When this node began to lead, per term ([`quorum_watch`] notes it): the schedule-rate
    /// buckets fill from then.
    tenure: Arc<quorum::Tenure>,
    /// Held by the one hand-over of this group under way here (`membership`): balancing, an
    /// operator's TransferLeader and a stop do not overlap on one group's hold and acker.
    handing: tokio::sync::Mutex<()>,
}

/// What the wiring (`server`) made a node of: the parts [`Node::new`] takes.
pub struct Parts {
    pub raft: Raft,
    pub store: Store,
    pub config: Arc<NodeConfig>,
    pub dispatcher: Arc<Dispatcher>,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    pub proposer: Proposer,
    pub acker: Acker,
    pub hold: Hold,
    pub levels: Arc<crate::cluster::Levels>,
    pub committed: Arc<std::sync::atomic::AtomicU64>,
    pub log: crate::storage::LogStore,
    pub snapshots: Arc<crate::storage::Snapshots>,
    /// True while this node leads the group resting (`cluster::rest`): silence from the
    /// followers is then no lost quorum.
    pub resting: tokio::sync::watch::Receiver<crate::cluster::rest::Silence>,
}

/// Most timers one Redrive entry returns to PENDING when a whole namespace is redriven.
const REDRIVE_CHUNK: usize = 1000;

impl Node {
    /// A node of `parts`; starts the task that watches its quorum.
    pub fn new(parts: Parts) -> Node {
        let tenure = Arc::new(quorum::Tenure::default());
        let quorum_lost = quorum_watch(
            &parts.raft,
            (parts.config.clock, parts.resting.clone()),
            tenure.clone(),
        );
        Node {
            id: parts.config.id,
            raft: parts.raft,
            store: parts.store,
            config: parts.config,
            dispatcher: parts.dispatcher,
            shutdown: parts.shutdown,
            proposer: parts.proposer,
            acker: parts.acker,
            hold: parts.hold,
            levels: parts.levels,
            committed: parts.committed,
            log: parts.log,
            snapshots: parts.snapshots,
            schedule_tokens: Default::default(),
            writes: Default::default(),
            quorum_lost,
            tenure,
            resting: parts.resting,
            handing: tokio::sync::Mutex::new(()),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The Raft group this is the node's replica of.
    pub fn group(&self) -> crate::keys::Group {
        self.store.space().group
    }

    /// This node's settings (read-only).
    pub fn config(&self) -> &Arc<NodeConfig> {
        &self.config
    }

    /// Turns true when the node shuts down: long-lived streams end then.
    pub fn shutdown_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// Who leads now, from openraft's metrics.
    pub fn leader(&self) -> Leader {
        // Called on every request: borrow the metrics, copy out only the leader's address.
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        match m.current_leader {
            Some(id) if id == self.id && m.state == ServerState::Leader => Leader::Me,
            Some(id) if id != self.id => match m.membership_config.membership().get_node(&id) {
                Some(node) => Leader::Other {
                    id,
                    addr: self.config.dial_addr(id, &node.addr),
                },
                None => Leader::Unknown,
            },
            _ => Leader::Unknown,
        }
    }

    /// Proposes `cmd` on this node (which must lead) and waits for it to apply.
    pub async fn write(&self, cmd: Command) -> Result<Response> {
        self.check_quorum()?;
        let proposal = self.proposer.propose(cmd);
        let reply = tokio::select! {
            r = tokio::time::timeout(self.config.write_timeout, proposal) => r.map_err(|_| {
                Error::OutcomeUnknown(
                    "the write was not committed in time (no quorum?); its outcome is unknown"
                        .into(),
                )
            })??,
            e = self.quorum_lost() => return Err(e.unknown_outcome()),
        };
        if faults::lose_reply(self) {
            return Err(Error::OutcomeUnknown(
                "fault lose-reply: the write committed and its answer was lost".into(),
            ));
        }
        match reply {
            Response::Rejected(r) => Err(r.into_error()),
            other => Ok(other),
        }
    }

    /// Waits until this node (the leader) has applied everything committed before the call.
    pub async fn read_barrier(&self) -> Result<()> {
        self.hold.pass().await;
        self.check_quorum()?;
        let barrier = self
            .raft
            .ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex);
        tokio::select! {
            r = tokio::time::timeout(self.config.write_timeout, barrier) => {
                r.map_err(|_| Error::Unavailable("could not confirm leadership in time".into()))?
                    .map_err(read_error)?;
            }
            e = self.quorum_lost() => return Err(e.into()),
        }
        Ok(())
    }

    /// Now, by this node's clock (the one place the wall clock is read: `clock`).
    pub fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }

    /// Creates a timer (`Options::default()`: create-only, a repeat answered with
    /// created = false), or with a mode changes the PENDING one that has its key if the
    /// condition holds; returns the timer and whether it was created. One command either way,
    /// decided in apply (`storage/change.rs`), so callers racing on one timer are ordered.
    pub async fn schedule(&self, spec: TimerSpec, with: Options) -> Result<(Timer, bool)> {
        self.admit([(spec.key.as_ref(), spec.payload.len())])?;
        let cmd = Command::Schedule {
            now_ms: self.now_ms(),
            spec,
            with,
        };
        if self.config.faults.ack_before_commit && with.is_plain() {
            return Ok(faults::ack_before_commit(&self.raft, cmd));
        }
        match self.write(cmd).await? {
            Response::Timer { timer, created } => Ok((timer, created)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn schedule_batch(&self, specs: Specs) -> Result<Vec<(Timer, bool)>> {
        self.admit(specs.iter().map(|s| (s.key, s.payload.len())))?;
        let cmd = Command::ScheduleBatch {
            now_ms: self.now_ms(),
            specs,
        };
        match self.write(cmd).await? {
            Response::Batch(answer) => answer.results(),
            other => Err(unexpected(other)),
        }
    }

    /// Cancels the timer at `key`, or the recurring timer there when no timer has it, if
    /// `cond` holds (unset: always).
    pub async fn cancel(&self, key: TimerKey, cond: Cond) -> Result<TimerOrRecurring> {
        if self.config.faults.ignore_cancel && !cond.is_set() {
            return faults::ignore_cancel(&self.store, key).map(TimerOrRecurring::Timer);
        }
        let cmd = Command::Cancel {
            now_ms: self.now_ms(),
            key,
            cond,
        };
        self.write_found(cmd).await
    }

    /// Moves the PENDING timer at `key` (to a time, or by a shift of its stored time) if
    /// `cond` holds (unset: always).
    pub async fn reschedule(&self, key: TimerKey, shift: Shift, cond: Cond) -> Result<Timer> {
        let cmd = Command::Reschedule {
            now_ms: self.now_ms(),
            key,
            shift,
            cond,
        };
        self.write_timer(cmd).await
    }

    /// Acks many deliveries in one command, each judged and answered alone. A failure of the
    /// write (leadership lost) fails the whole call, so that the caller retries it where a
    /// leader is: acks are idempotent.
    pub async fn ack_batch(&self, acks: Vec<(TimerKey, u32)>) -> Result<Vec<Result<Timer>>> {
        let keys: Vec<(TimerKey, u32)> = acks.clone();
        let cmd = Command::Acks {
            now_ms: self.now_ms(),
            leases: Vec::new(),
            acks,
        };
        let Response::Acked { acks: answers, .. } = self.write(cmd).await? else {
            return Err(Error::Internal("unexpected Acks response".into()));
        };
        let mut out = Vec::with_capacity(answers.len());
        for ((key, attempt), answer) in keys.iter().zip(answers) {
            out.push(match answer {
                Response::Timer { timer, .. } => {
                    self.dispatcher.settled(key, *attempt);
                    Ok(timer)
                }
                Response::Rejected(r) => Err(r.into_error()),
                other => Err(unexpected(other)),
            });
        }
        Ok(out)
    }

    /// Nacks delivery `attempt` of `key`: redelivered after backoff, or DEAD at the limit.
    pub async fn nack(&self, key: TimerKey, attempt: u32) -> Result<Timer> {
        let now_ms = self.now_ms();
        let cmd = Command::Nack {
            now_ms,
            key: key.clone(),
            attempt,
        };
        self.settle(cmd, &key, attempt).await
    }

    /// Applies an Ack or Nack of `key`'s delivery `attempt`, then frees its room in the
    /// subscription that holds that delivery.
    async fn settle(&self, cmd: Command, key: &TimerKey, attempt: u32) -> Result<Timer> {
        let timer = self.write_timer(cmd).await?;
        self.dispatcher.settled(key, attempt);
        Ok(timer)
    }

    /// Returns one DEAD timer to PENDING.
    pub async fn redrive(&self, key: TimerKey) -> Result<Timer> {
        let (mut timers, skipped) = self.redrive_keys(vec![key.clone()]).await?;
        match (timers.pop(), skipped.into_iter().next()) {
            (Some(timer), _) => Ok(timer),
            (None, Some((_, Some(state)))) => Err(Error::FailedPrecondition(format!(
                "timer {key} is {} (only DEAD timers can be redriven)",
                state.name()
            ))),
            _ => Err(Rejection::NotFound(key).into_error()),
        }
    }

    /// Returns every DEAD timer of `namespace` to PENDING, a chunk per entry; how many.
    pub async fn redrive_all(&self, namespace: &str) -> Result<u64> {
        let mut query = ListQuery {
            namespace: namespace.to_string(),
            filter: ListFilter {
                state: Some(TimerState::Dead),
                ..ListFilter::default()
            },
            after: None,
            limit: REDRIVE_CHUNK,
        };
        let mut count = 0;
        loop {
            let chunk = async {
                let page = self.list(&query).await?;
                let keys: Vec<TimerKey> = page.timers.into_iter().map(|t| t.key).collect();
                if !keys.is_empty() {
                    count += self.redrive_keys(keys).await?.0.len() as u64;
                }
                Ok::<_, Error>(page.next_after)
            };
            match chunk.await {
                Ok(Some(after)) => query.after = Some(after),
                Ok(None) => return Ok(count),
                // Once a chunk applied, a failure is not "nothing happened": the call is not
                // one to repeat blindly (review 33e, LOW-MED 4).
                Err(e) if count > 0 => {
                    return Err(Error::OutcomeUnknown(format!(
                        "{count} timers were redriven, then: {e}"
                    )))
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn redrive_keys(&self, keys: Vec<TimerKey>) -> Result<(Vec<Timer>, RedriveSkips)> {
        let cmd = Command::Redrive {
            now_ms: self.now_ms(),
            keys,
        };
        match self.write(cmd).await? {
            Response::Redriven { timers, skipped } => Ok((timers, skipped)),
            other => Err(unexpected(other)),
        }
    }

    async fn write_timer(&self, cmd: Command) -> Result<Timer> {
        match self.write(cmd).await? {
            Response::Timer { timer, .. } => Ok(timer),
            other => Err(unexpected(other)),
        }
    }

    /// Replicates a change of a key that may name a timer or a recurring timer.
    async fn write_found(&self, cmd: Command) -> Result<TimerOrRecurring> {
        match self.write(cmd).await? {
            Response::Timer { timer, .. } => Ok(TimerOrRecurring::Timer(timer)),
            Response::Recurring { recurring, .. } => Ok(TimerOrRecurring::Recurring(*recurring)),
            other => Err(unexpected(other)),
        }
    }

    /// Replicates a change of a recurring timer.
    async fn write_recurring(&self, cmd: Command) -> Result<(RecurringView, bool)> {
        match self.write(cmd).await? {
            Response::Recurring { recurring, created } => Ok((*recurring, created)),
            other => Err(unexpected(other)),
        }
    }

    /// Linearizable read of one timer.
    pub async fn get(&self, key: &TimerKey) -> Result<Timer> {
        self.read_barrier().await?;
        self.store
            .get(key)?
            .ok_or_else(|| Error::NotFound(format!("timer {key} not found")))
    }

    /// Linearizable page of a namespace's timers.
    pub async fn list(&self, query: &ListQuery) -> Result<Page> {
        self.read_barrier().await?;
        self.store.list(query)
    }
}

/// The deliberate bugs of `config::Faults`, kept apart so that the real paths stay plain.
mod ack;
mod admit;
mod backup;
mod balance;
mod delivery;
mod groups;
mod health;
mod leading;
mod local;
mod members;
mod membership;
mod namespaces;
pub mod overview;
mod policies;
mod quorum;
mod recurring;
pub mod sample;

mod faults {
    use super::*;

    /// Proposes `cmd` in the background and answers at once, as if it had committed.
    pub fn ack_before_commit(raft: &Raft, cmd: Command) -> (Timer, bool) {
        let Command::Schedule { now_ms, spec, .. } = cmd.clone() else {
            unreachable!("only Schedule is acknowledged early");
        };
        let raft = raft.clone();
        tokio::spawn(async move { crate::cluster::propose::client_write(&raft, cmd.into()).await });
        (Timer::pending(spec, now_ms), true)
    }

    /// Whether the answer to the write just committed is to be lost (every n-th).
    pub fn lose_reply(node: &Node) -> bool {
        let every = node.config.faults.lose_reply_every;
        let n = node
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        every > 0 && n.is_multiple_of(every)
    }

    /// Answers a Cancel with the timer marked CANCELLED, without proposing anything.
    pub fn ignore_cancel(store: &Store, key: TimerKey) -> Result<Timer> {
        let mut timer = store
            .get(&key)?
            .ok_or_else(|| Rejection::NotFound(key).into_error())?;
        timer.state = TimerState::Cancelled;
        Ok(timer)
    }
}

/// Keys a Redrive skipped, with their state (`None`: no such timer).
type RedriveSkips = Vec<(TimerKey, Option<TimerState>)>;

pub(super) fn unexpected(r: Response) -> Error {
    Error::Internal(format!("unexpected response {r:?}"))
}

/// A failed proposal as the caller sees it.
pub fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Error {
    match e {
        // Refused before it was appended: this leader's quorum lease lapsed (and stayed so for
        // the second `cluster::propose::client_write` tries for).
        RaftError::APIError(ClientWriteError::ForwardToLeader(f))
            if f.reason == openraft::error::ForwardReason::LeaseExpired =>
        {
            Error::NoQuorum(format!(
                "this leader has heard from no quorum for {} ms (is it cut off?); try another \
                 node",
                QUORUM_LOST_AFTER.as_millis()
            ))
        }
        // Refused before it was appended (openraft 0.10 checks the transfer first): this
        // leader is handing over, the call goes to the next one.
        RaftError::APIError(ClientWriteError::ForwardToLeader(f))
            if f.reason == openraft::error::ForwardReason::LeadershipTransfer =>
        {
            Error::NotLeader
        }
        // openraft 0.9 answered ForwardToLeader both for a write it refused (never appended)
        // and for one it had appended and then truncated when leadership moved — which a node
        // that holds it may still commit (with five voters or more, or across a joint
        // configuration); so not "not applied": the forwarder sends it again only if it is safe
        // to repeat (review 33e, MED 3). openraft 0.10 answers LogEntryDiscarded for the second
        // case; until chaos has confirmed that ForwardToLeader now always means "never
        // appended", both keep that reading (docs/openraft-0.10.md, C2).
        RaftError::APIError(
            ClientWriteError::ForwardToLeader(_) | ClientWriteError::LogEntryDiscarded(_),
        ) => Error::Unavailable(
            "leadership moved while the call was being proposed: it may or may not apply".into(),
        ),
        RaftError::APIError(ClientWriteError::PreconditionFailed(e)) => {
            Error::Internal(e.to_string())
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            Error::Internal(e.to_string())
        }
        RaftError::Fatal(f) => Error::OutcomeUnknown(format!("raft stopped: {f}")),
    }
}

fn read_error(e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> Error {
    match e {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(_)) => Error::NotLeader,
        RaftError::APIError(LinearizableReadError::QuorumNotEnough(q)) => {
            Error::Unavailable(format!("cannot reach a quorum: {q}"))
        }
        RaftError::Fatal(f) => Error::Unavailable(format!("raft stopped: {f}")),
    }
}
