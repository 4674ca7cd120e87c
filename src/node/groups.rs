//! Every group's door on this node (docs/sharding.md §2, §4): group 0's, which holds the
//! cluster's namespaces, keys and members, and one per data group, which hold the timers. The
//! slot map says which group a namespace's timers are in; the API layer asks it here before it
//! finds a call's leader.
//!
//! Credentials are group 0's. A call runs on its group's leader, which need not lead group 0,
//! and a group-0 follower may not yet have applied a revocation (or SetAuth on) that group 0
//! already acknowledged: judged from it, the revoked key would be honoured late (issue 33's
//! rule: never). So before such a node judges a call it runs, it takes group 0's read index
//! from group 0's leader and waits until its own replica of group 0 has applied it
//! ([`Nodes::meta_caught_up`]). The read indexes are coalesced, as the proposer batches writes:
//! one request in flight per node, and each caller waits for one sent after it arrived, so a
//! burst of calls costs one round trip, and no caller is answered from a request that left
//! before it came (which could miss a revocation acknowledged in between).

use openraft::async_runtime::WatchReceiver as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::keys::{Group, SlotMap};
use crate::node::{Leader, Node, NodeStatus};
use crate::{Error, Result};

/// Pause before asking again for a read index group 0 could not give (no leader known).
const RETRY_PAUSE: Duration = Duration::from_millis(25);
/// Longest one read index request may take: its callers wait at most about as long
/// (`auth::CATCH_UP`), and one that hangs (a paused leader) must not hold the next.
const ROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a node leading data groups may fail to catch up with group 0 (the read index its
/// data groups' calls need) before it hands them over: well past an election of group 0
/// (0.5–0.75 s), so a leader that died is replaced, and reached, first.
const CUT_OFF_AFTER: Duration = Duration::from_secs(3);
/// Least time a node leads a data group before it hands it over for being cut off: a member
/// that took it and is cut off too (a wider partition) keeps it that long, so two such
/// members do not pass it back and forth every second.
const LEAD_AT_LEAST: Duration = Duration::from_secs(6);
/// Longest one hand-over may take here (its own steps are bounded: draining queued acks, the
/// successor's catch-up, the election).
const HAND_OVER_LIMIT: Duration = Duration::from_secs(15);

/// One group as this node's replica knows it ([`Nodes::slots`]).
#[derive(Debug, Clone)]
pub struct GroupView {
    pub group: Group,
    /// The hash slots it owns, `[start, end)` (empty: none).
    pub owned: std::ops::Range<u32>,
    pub status: NodeStatus,
}

/// A caller waiting for group 0's read index.
type Waiter = oneshot::Sender<std::result::Result<u64, String>>;

/// Every group's [`Node`] on this node, and the slot map.
pub struct Nodes {
    /// Group g's door at index g.
    all: Vec<Arc<Node>>,
    map: SlotMap,
    /// Callers waiting for group 0's read index ([`Nodes::serve_read_indexes`]).
    reads: mpsc::UnboundedSender<Waiter>,
    /// Calls this node sent to another node's leader since it started (Status).
    forwarded: AtomicU64,
    /// Set when a planned stop begins ([`Nodes::begin_stop`]): the node takes no group's
    /// leadership from then on (`balance`).
    stopping: std::sync::atomic::AtomicBool,
    /// Balancing moves this node is taking now, as their target ([`Nodes::taking`]).
    taking: std::sync::atomic::AtomicUsize,
    /// Held by the one AddNode or RemoveNode walking the groups from this node
    /// ([`Nodes::member_walk`]).
    walking: tokio::sync::Mutex<()>,
}

/// One balancing move this node is taking, counted while it lasts ([`Nodes::taking`]).
pub struct Taking<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What [`Nodes::new`] returns besides the doors: the task that asks group 0's leader for read
/// indexes, to run with the node's other tasks (it ends when the node stops).
pub type ReadIndexTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl Nodes {
    /// The doors of groups 0..=G, in that order.
    pub fn new(all: Vec<Arc<Node>>) -> (Arc<Nodes>, ReadIndexTask) {
        assert!(!all.is_empty(), "group 0 is always there");
        let groups = Group::try_from(all.len() - 1).expect("at most 255 data groups");
        let (reads, rx) = mpsc::unbounded_channel();
        let meta = all[0].clone();
        let task = Box::pin(serve_read_indexes(meta.clone(), rx, meta.shutdown_watch()));
        let nodes = Nodes {
            all,
            map: SlotMap::new(groups),
            reads,
            forwarded: AtomicU64::new(0),
            stopping: Default::default(),
            taking: Default::default(),
            walking: Default::default(),
        };
        (Arc::new(nodes), task)
    }

    /// Group 0's door: namespaces, keys, members.
    pub fn meta(&self) -> &Arc<Node> {
        &self.all[0]
    }

    /// A planned stop begins (SIGTERM): from now on this node refuses to be handed a group's
    /// leadership, and balances nothing (`balance`), so what its hand-off gives away is not
    /// given back before it exits (balancing review, M1).
    pub fn begin_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether a planned stop began ([`Nodes::begin_stop`]).
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Counts a balancing move this node takes, as its target, until the guard drops: a stop's
    /// hand-off waits for none to be under way before it decides this node leads nothing
    /// (one that passed the stopping check would otherwise land after the hand-off).
    pub fn taking(&self) -> Taking<'_> {
        self.taking.fetch_add(1, Ordering::SeqCst);
        Taking(&self.taking)
    }

    /// The right to walk the groups adding or removing a node (`members`): one walk at a
    /// time on this node, and balancing pauses meanwhile. Unavailable while another runs.
    pub fn member_walk(&self) -> Result<tokio::sync::MutexGuard<'_, ()>> {
        self.walking.try_lock().map_err(|_| {
            Error::Unavailable(
                "another AddNode or RemoveNode is under way on this node; send it again once \
                 it is done"
                    .into(),
            )
        })
    }

    /// Whether an AddNode or RemoveNode walks the groups from this node now.
    pub fn members_changing(&self) -> bool {
        self.walking.try_lock().is_err()
    }

    /// How many balancing moves this node is taking now ([`Nodes::taking`]).
    pub fn moves_being_taken(&self) -> usize {
        self.taking.load(Ordering::SeqCst)
    }

    /// Whether the cluster has data groups.
    pub fn sharded(&self) -> bool {
        self.all.len() > 1
    }

    /// The slot map this node routes by.
    pub fn map(&self) -> SlotMap {
        self.map
    }

    /// Group `g`'s door, if this node hosts it.
    pub fn group(&self, g: Group) -> Option<&Arc<Node>> {
        self.all.get(usize::from(g))
    }

    /// The group holding `namespace`'s timers.
    pub fn group_of(&self, namespace: &str) -> Group {
        self.map.group_of(namespace)
    }

    /// The door of the group holding `namespace`'s timers. Every group the map names is
    /// hosted on every node until replicas move (§12 step 6); one that is not is never
    /// stood in for by another.
    pub fn of(&self, namespace: &str) -> Result<&Arc<Node>> {
        let g = self.group_of(namespace);
        self.group(g).ok_or_else(|| {
            Error::Internal(format!(
                "this node hosts no replica of group {g}, which holds namespace \
                 {namespace:?}'s timers"
            ))
        })
    }

    /// Runs `call`, a call this node sends to another node's leader, counting it (a client
    /// routing by the slot map makes few: `Status.calls_forwarded`,
    /// `timerdb_calls_forwarded_total`).
    pub async fn forward<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        crate::metrics::call_forwarded();
        call.await
    }

    /// Every group's door, group 0 first.
    pub fn each(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.all.iter()
    }

    /// This node's Status: group 0's role, leader, indexes and members, with the timer
    /// counts summed over every group it hosts (a namespace's timers are in its data group).
    pub fn status(&self) -> Result<NodeStatus> {
        let mut status = self.meta().status()?;
        for node in self.all.iter().skip(1) {
            status.add_counts(&node.status()?);
        }
        status.calls_forwarded = self.forwarded.load(Ordering::Relaxed);
        Ok(status)
    }

    /// Every group as this node's replica knows it, with the hash slots the map gives it: what
    /// `Cluster.Slots` answers (a router's hint, not a linearizable read).
    pub fn slots(&self) -> Result<Vec<GroupView>> {
        (self.all.iter())
            .map(|node| {
                Ok(GroupView {
                    group: node.group(),
                    owned: self.map.owned(node.group()),
                    status: node.status()?,
                })
            })
            .collect()
    }

    /// Waits until this node's replica of group 0 has applied every entry group 0 had
    /// committed when the call began (see the module essay): group 0's read index, coalesced,
    /// confirmed by a quorum even on group 0's leader (which may have been deposed without
    /// knowing it), then applied here. While group 0 has no leader, asks again until one is
    /// known. Not done `within`: a not-applied UNAVAILABLE (nothing was done; the call may be
    /// sent again).
    pub async fn meta_caught_up(&self, within: Duration) -> Result<()> {
        let meta = self.meta();
        let late = |why: String| {
            Error::NotYet(format!(
                "this node could not catch up with group 0's access state (keys, auth) to \
                 judge the call: {why}; send it again"
            ))
        };
        let deadline = tokio::time::Instant::now() + within;
        let index = loop {
            let (tx, rx) = oneshot::channel();
            self.reads
                .send(tx)
                .map_err(|_| late("the node is stopping".into()))?;
            match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(Ok(index))) => break index,
                Ok(Ok(Err(why))) if tokio::time::Instant::now() + RETRY_PAUSE < deadline => {
                    tracing::debug!(why, "group 0's read index; asking again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Ok(Err(why))) => return Err(late(why)),
                Ok(Err(_)) => return Err(late("the node is stopping".into())),
                Err(_) => return Err(late(format!("no read index within {within:?}"))),
            }
        };
        match meta.until_applied(index, deadline).await {
            true => Ok(()),
            false => Err(late(format!("index {index} not applied within {within:?}"))),
        }
    }
}

/// Hands over the data groups this node leads while it cannot catch up with group 0 for
/// [`CUT_OFF_AFTER`] (a cut of the link to group 0's leader, one way or both, or a link too
/// slow for a read index): none of their calls can be judged (`meta_caught_up`), so they
/// would all fail until it heals. Each group this node has led for [`LEAD_AT_LEAST`] goes,
/// all at once, to the member with the most of its log other than group 0's leader (which
/// this node cannot reach): one that reaches it, unless the partition is wider, when the
/// group stays at least that long with whoever took it. Looks once a second, with one read
/// index (coalesced with the calls'), while this node leads data groups and not group 0.
pub async fn hand_over_when_cut_off(nodes: Arc<Nodes>, mut shutdown: watch::Receiver<bool>) {
    if !nodes.sharded() {
        return;
    }
    let mut failing_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let meta = nodes.meta();
        let leading: Vec<&Arc<Node>> = (nodes.all.iter().skip(1))
            .filter(|n| n.leader() == Leader::Me)
            .collect();
        let cut = match meta.leader() {
            Leader::Other { id, .. } if !leading.is_empty() => id,
            _ => {
                failing_since = None; // it leads group 0, nobody does yet, or it leads nothing
                continue;
            }
        };
        if nodes.meta_caught_up(Duration::from_secs(1)).await.is_ok() {
            failing_since = None;
            continue;
        }
        let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() < CUT_OFF_AFTER {
            continue;
        }
        let now_ms = meta.config.clock.now_ms();
        let handovers = (leading.into_iter())
            .filter(|node| node.led_for(now_ms) >= LEAD_AT_LEAST)
            .filter_map(|node| Some((node, node.successor_other_than(cut)?)))
            .map(|(node, to)| async move {
                let group = node.group();
                tracing::warn!(
                    group,
                    to,
                    "this node has not caught up with group 0 (its leader is node {cut}) for \
                     {CUT_OFF_AFTER:?} and cannot judge its data groups' calls: it hands \
                     them over"
                );
                match tokio::time::timeout(HAND_OVER_LIMIT, node.transfer_leader(Some(to))).await {
                    Ok(Ok(to)) => tracing::info!(group, to, "data group handed over"),
                    Ok(Err(e)) => tracing::warn!(group, error = %e, "data group not handed over"),
                    Err(_) => tracing::warn!(group, "data group hand-over took too long"),
                }
            });
        futures::future::join_all(handovers).await;
    }
}

impl Node {
    /// How long this node has led its group, in its current term, by its clock at `now_ms`.
    fn led_for(&self, now_ms: i64) -> Duration {
        let term = self.raft.metrics().borrow_watched().current_term;
        let since = self.tenure.since(term).unwrap_or(now_ms);
        Duration::from_millis(now_ms.saturating_sub(since).max(0) as u64)
    }

    /// The voter of this group other than this node and `not` with the most of the log.
    fn successor_other_than(
        &self,
        not: crate::raft_types::NodeId,
    ) -> Option<crate::raft_types::NodeId> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let matched = |id: &crate::raft_types::NodeId| {
            let r = m
                .replication
                .as_ref()
                .and_then(|r| r.get(id).cloned().flatten());
            r.map(|l| l.index)
        };
        let voters = m.membership_config.membership().voter_ids();
        voters
            .filter(|id| *id != self.id && *id != not)
            .max_by_key(|id| (matched(id), std::cmp::Reverse(*id)))
    }
}

/// Answers the callers waiting for group 0's read index: takes every caller waiting (one
/// that gave up is dropped), asks once, answers them all; the callers that come meanwhile
/// wait for the next request. Keeps one connection to group 0's leader.
async fn serve_read_indexes(
    meta: Arc<Node>,
    mut rx: mpsc::UnboundedReceiver<Waiter>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut channel: Option<(String, tonic::transport::Channel)> = None;
    loop {
        let first = tokio::select! {
            w = rx.recv() => match w {
                Some(w) => w,
                None => return,
            },
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let mut waiters = vec![first];
        while let Ok(w) = rx.try_recv() {
            waiters.push(w);
        }
        waiters.retain(|w| !w.is_closed());
        if waiters.is_empty() {
            continue;
        }
        let round = meta.group_read_index(&mut channel);
        let answer = match tokio::time::timeout(ROUND_TIMEOUT, round).await {
            Ok(answer) => answer.map_err(|e| e.to_string()),
            Err(_) => {
                channel = None; // a leader that does not answer: dial afresh next time
                Err(format!(
                    "group 0's leader did not answer within {ROUND_TIMEOUT:?}"
                ))
            }
        };
        for w in waiters {
            let _ = w.send(answer.clone());
        }
    }
}

impl Node {
    /// This group's read index, from its leader: the log index every read that begins now
    /// must wait for (its leader confirmed it still leads after the call began). `channel`
    /// keeps the connection to the leader between calls.
    async fn group_read_index(
        &self,
        channel: &mut Option<(String, tonic::transport::Channel)>,
    ) -> Result<u64> {
        match self.leader() {
            Leader::Me => self.local_read_index().await,
            Leader::Other { addr, .. } => {
                let ch = match channel.take() {
                    Some((at, ch)) if at == addr => ch,
                    _ => (self.config.tls)
                        .channel(&addr, |e| e.connect_timeout(Duration::from_secs(1)))
                        .map_err(|e| {
                            Error::Unavailable(format!("group 0's leader at {addr}: {e}"))
                        })?,
                };
                *channel = Some((addr.clone(), ch.clone()));
                crate::cluster::network::read_index(&self.config, (&addr, ch), &self.store).await
            }
            Leader::Unknown => Err(Error::Unavailable(format!(
                "group {} knows no leader",
                self.group()
            ))),
        }
    }

    /// The read index this node, leading, confirms with a quorum.
    async fn local_read_index(&self) -> Result<u64> {
        let read = self
            .raft
            .get_read_log_id(openraft::raft::ReadPolicy::ReadIndex);
        match tokio::time::timeout(ROUND_TIMEOUT, read).await {
            Ok(Ok((read, _))) => Ok(read.index()),
            Ok(Err(e)) => Err(Error::Unavailable(format!(
                "group {} could not confirm its leader: {e}",
                self.group()
            ))),
            Err(_) => Err(Error::Unavailable(format!(
                "group {} could not confirm its leader in time",
                self.group()
            ))),
        }
    }

    /// Waits until this replica has applied `index`, up to `deadline`: whether it did.
    pub async fn until_applied(&self, index: u64, deadline: tokio::time::Instant) -> bool {
        let mut metrics = self.raft.metrics();
        let applied = |m: &crate::raft_types::RaftMetrics| {
            m.last_applied.as_ref().is_some_and(|l| l.index() >= index)
        };
        let waited = tokio::time::timeout_at(deadline, metrics.wait_until(applied)).await;
        matches!(waited, Ok(Ok(_)))
    }
}
