//! Membership and leadership, run on the leader: adding a node (a learner that catches up,
//! then a voter), removing one, and handing leadership to another voter.
//!
//! Membership changes are openraft's joint consensus: each is committed like any entry, so a
//! change survives failovers, and `change_membership` refuses a second change while one is in
//! progress. What timerdb adds is the order of the steps and answers an operator can act on.
//!
//! Leadership transfer is openraft 0.10's. One hand-over of a group runs at a time (another
//! is refused UNAVAILABLE). The leader first waits, writes still flowing, until the target
//! holds the log as it was when asked (3 s at most; a move by balancing, again just before
//! it closes its hold, 0.3 s at most): a target that cannot is refused before any write
//! waited for it; then it closes its hold (no proposals, no ReadIndex rounds),
//! waits until the target has every entry, and triggers openraft's
//! transfer, which stops its writes and heartbeats and tells every voter (`TransferLeader`):
//! each drops its leader lease, and the target, once it has flushed the log, stands at once
//! with a vote the others grant despite a lease (Raft thesis §3.10). No lease has to run out
//! first, so a hand-over takes about one election, not a lease plus one.
//!
//! If the target does not take over, the call fails UNAVAILABLE and the cluster elects a
//! leader (openraft's transferring leader sends no heartbeats again: this node may win that
//! election, it no longer just goes on leading as under openraft 0.9). Writes wait meanwhile,
//! in the hold, about one election.
//!
//! Before any of that, the unary acks this leader answered as queued are let apply
//! (`cluster::queued`); if they do not within `QUEUED_DRAIN_LIMIT`, the transfer fails and
//! leadership stays, since handing over would lose them. From the moment the transfer is
//! asked for, no ack is queued again in this term, whatever becomes of the call.
//!
//! A target of a build before `TransferLeader` (a rolling upgrade; it advertises no
//! `x-timerdb-peer-rpcs`, `cluster::level`) is handed leadership as those builds did: the
//! leader stops heartbeats, lets the lease run out on the followers and sends the target
//! `TimeoutNow`; if nobody took over, heartbeats resume and this node goes on leading.
//! (openraft's transfer would tell the other voters to drop their lease, and one of them, not
//! the target, would win the election that follows.)

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeSet;
use std::time::Duration;

use openraft::{BasicNode, ChangeMembers, ServerState};

use super::Node;
use crate::cluster::network;
use crate::raft_types::{NodeId, RaftMetrics};
use crate::{Error, Result};

/// One member of the cluster: (id, address, voter).
pub type Member = (NodeId, String, bool);

/// How long AddNode waits for a new learner to catch up before answering.
const CATCH_UP: Duration = Duration::from_secs(60);
/// How long a transfer waits for the target to have every entry.
const TARGET_CATCH_UP: Duration = Duration::from_secs(3);
/// How long a transfer waits, just before its hold closes, for the target to have the entries
/// written since it first caught up: a healthy target takes a round trip and an fsync.
const CLOSING_CATCH_UP: Duration = Duration::from_millis(300);
/// How long a transfer waits for the acks it answered as queued to apply before it gives up
/// (and keeps leading): a few rounds of the slowest fsync we plan for, within the stop's
/// hand-off limit (`server::HAND_OFF_LIMIT`).
const QUEUED_DRAIN_LIMIT: Duration = Duration::from_secs(5);

impl Node {
    /// The members as this node knows them, in id order.
    pub fn members(&self) -> Vec<Member> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone(), voters.contains(id)))
            .collect()
    }

    /// Adds node `id` at `addr`: as a learner, which catches up from the log or a snapshot,
    /// then (if `voter`) as a voter. Retrying after any failure is safe.
    pub async fn add_node(&self, id: NodeId, addr: String, voter: bool) -> Result<Vec<Member>> {
        check_new_member(id, &addr)?;
        match self.members().into_iter().find(|m| m.0 == id) {
            Some((_, known, _)) if known != addr => {
                return Err(Error::AlreadyExists(format!(
                    "node {id} is already a member at {known}; remove it first to add it at {addr}"
                )))
            }
            Some((_, _, true)) => return Ok(self.members()),
            // A learner (perhaps added by an AddNode that a leader change cut short, perhaps
            // wiped since): a Hello again, which a wiped one needs before it takes Raft calls
            // (`storage/admission.rs`); to promote it, it must first hold the log. (The leader's
            // record of what a wiped learner holds may predate the wipe — openraft 0.9 keeps
            // its `matching` on a conflict — so the wait can pass early: known, guarantees.md.)
            Some(_) => {
                {
                    let _gate = self.levels.gate.lock().await; // see `Levels::gate`
                    self.hello(id, &addr).await?;
                }
                if !voter {
                    return Ok(self.members());
                }
                self.wait_caught_up(id, &addr).await?
            }
            None => {
                // A node that cannot be one of us (another bucket width, an older build) is
                // refused before it is a member, with the reason; an empty one takes this
                // cluster's width here. The gate is held until the learner is in the
                // membership (the level raiser then counts it), not through its catch-up.
                {
                    let _gate = self.levels.gate.lock().await; // see `Levels::gate`
                    self.hello(id, &addr).await?;
                    self.add_learner(id, &addr).await?;
                }
                self.wait_caught_up(id, &addr).await?
            }
        }
        if voter {
            let ids = BTreeSet::from([id]);
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(ids), false)
                .await
                .map_err(membership_error)?;
            tracing::info!(id, addr, "node is now a voter");
        }
        Ok(self.members())
    }

    /// Says Hello to node `id` at `addr` as this leader, of this term. A node whose build
    /// reads fewer entry forms than the cluster committed to (`cluster/level.rs`) is refused:
    /// it could not apply the log it would be sent.
    async fn hello(&self, id: NodeId, addr: &str) -> Result<()> {
        let dial = self.config.dial_addr(id, addr);
        let term = self.raft.metrics().borrow_watched().current_term;
        let at = (id, dial.as_str());
        let level = network::hello(&self.config, at, &self.store, (term, &self.levels)).await?;
        let committed = self.store.committed_level();
        if level < committed {
            return Err(Error::FailedPrecondition(format!(
                "node {id} at {addr} runs an older build (feature level {level}) than the \
                 cluster has committed to (level {committed}): it could not read the log; \
                 upgrade it first (downgrades are not supported, docs/operations.md)"
            )));
        }
        Ok(())
    }

    async fn add_learner(&self, id: NodeId, addr: &str) -> Result<()> {
        let node = BasicNode {
            addr: addr.to_string(),
        };
        // Not openraft's blocking add: it calls a learner caught up within
        // `replication_lag_threshold` entries, and with entries of up to 10,000 timers a
        // learner that has nothing is "caught up" with a short log. Instead the caller waits
        // until it holds every entry the log had once it was added (a snapshot counts).
        self.raft
            .add_learner(id, node, false)
            .await
            .map_err(membership_error)?;
        Ok(())
    }

    /// Waits until learner `id` holds every entry the log has now.
    async fn wait_caught_up(&self, id: NodeId, addr: &str) -> Result<()> {
        let upto = self.raft.metrics().borrow_watched().last_log_index;
        match self.wait_matched(id, upto, CATCH_UP).await {
            Err(Error::Unavailable(_)) => Err(Error::Unavailable(format!(
                "node {id} joined as a learner but did not catch up within {CATCH_UP:?}: \
                 check that it runs (with --join) and is reachable at {addr}; AddNode again \
                 to promote it once it has"
            ))),
            Err(e) => Err(e),
            Ok(()) => {
                tracing::info!(id, addr, upto, "learner caught up");
                Ok(())
            }
        }
    }

    /// Removes node `id` from the cluster (voter or learner). Removing this node, the leader,
    /// first hands leadership over and then answers NotLeader, so the caller's retry runs on
    /// the new leader.
    pub async fn remove_node(&self, id: NodeId) -> Result<Vec<Member>> {
        let voter = self.check_removable(id)?;
        if id == self.id {
            self.transfer_leader(None).await?;
            return Err(Error::NotLeader);
        }
        let ids = BTreeSet::from([id]);
        let change = if voter {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(membership_error)?;
        tracing::info!(id, "node removed");
        Ok(self.members())
    }

    /// Whether node `id` may be removed (a member, not the only voter): whether it is a voter.
    pub fn check_removable(&self, id: NodeId) -> Result<bool> {
        let members = self.members();
        let Some((_, _, voter)) = members.iter().find(|m| m.0 == id).cloned() else {
            return Err(Error::NotFound(format!(
                "node {id} is not a member (members: {})",
                describe(&members)
            )));
        };
        if voter && members.iter().filter(|m| m.2).count() == 1 {
            return Err(Error::FailedPrecondition(format!(
                "node {id} is the only voter; add another voter before removing it"
            )));
        }
        Ok(voter)
    }

    /// On the leader: refused unless a majority of the voters other than `id` answered it
    /// lately, so removing `id` leaves the group a majority it can commit with (a removal
    /// while another voter is down would otherwise stall the group in its joint change).
    pub fn check_majority_without(&self, id: NodeId) -> Result<()> {
        // Heartbeats go every 100 ms: half a second of silence is a node down (or cut off).
        let heard = self.heard_from(Duration::from_millis(500));
        let rest: Vec<NodeId> = (self.members().into_iter())
            .filter(|m| m.2 && m.0 != id)
            .map(|m| m.0)
            .collect();
        let live = rest.iter().filter(|v| heard.contains(v)).count();
        if live < rest.len() / 2 + 1 {
            let down: Vec<String> = (rest.iter())
                .filter(|v| !heard.contains(v))
                .map(|v| v.to_string())
                .collect();
            return Err(Error::FailedPrecondition(format!(
                "removing node {id} now would leave {} voters of which {live} answer (node(s) \
                 {} do not): not a majority; bring them back first",
                rest.len(),
                down.join(", ")
            )));
        }
        Ok(())
    }

    /// The current term of this node's replica of the group.
    pub fn current_term(&self) -> u64 {
        self.raft.metrics().borrow_watched().current_term
    }

    /// Voters other than this node.
    pub fn other_voters(&self) -> usize {
        self.members()
            .iter()
            .filter(|m| m.2 && m.0 != self.id)
            .count()
    }

    /// Hands leadership to voter `to` (or to the most up-to-date other voter) and returns the
    /// leader afterwards. See the module notes for how.
    pub async fn transfer_leader(&self, to: Option<NodeId>) -> Result<NodeId> {
        self.transfer(to, None).await
    }

    /// A move nobody needs now (leader balancing, `node::balance`): as [`transfer_leader`],
    /// but refused unless the target still keeps up within [`CLOSING_CATCH_UP`] just before
    /// the hold closes, so the group's writes never wait longer than that for it. (An
    /// operator's transfer or a stop's hand-off is wanted: it goes on with a target that keeps
    /// up more slowly, and the writes wait as long as it lags.)
    ///
    /// [`transfer_leader`]: Node::transfer_leader
    pub async fn balance_to(&self, to: NodeId) -> Result<NodeId> {
        self.transfer(Some(to), Some(CLOSING_CATCH_UP)).await
    }

    async fn transfer(&self, to: Option<NodeId>, closing: Option<Duration>) -> Result<NodeId> {
        let members = self.members();
        let target = match to {
            Some(id) if id == self.id => return Ok(id),
            Some(id) => match members.iter().find(|m| m.0 == id) {
                Some((_, _, true)) => id,
                Some(_) => {
                    return Err(Error::FailedPrecondition(format!(
                        "node {id} is a learner; only a voter can lead (AddNode promotes it)"
                    )))
                }
                None => {
                    return Err(Error::NotFound(format!(
                        "node {id} is not a member (members: {})",
                        describe(&members)
                    )))
                }
            },
            None => self.best_successor()?,
        };
        let addr = members
            .iter()
            .find(|m| m.0 == target)
            .map(|m| self.config.dial_addr(target, &m.1))
            .unwrap_or_default();
        let _one = self.handing.try_lock().map_err(|_| {
            Error::Unavailable(format!(
                "a hand-over of group {} is under way on node {}; try again",
                self.group(),
                self.id
            ))
        })?;
        // The target first catches up with the log as it is now, with writes still flowing:
        // one that cannot (a slow disk, a cut link) is refused before the hold closes, so a
        // lagging target never stalls this group's writes (balancing review, M2).
        self.target_caught_up(target, TARGET_CATCH_UP).await?;
        // Acks answered as queued apply before the hand-over (`cluster::queued`): queuing
        // stops, those queued are proposed and answered, then the hold closes. If they do not
        // settle in time, leadership stays here: handing over would lose them.
        let draining = match self.acker.drain_queued(QUEUED_DRAIN_LIMIT).await {
            Ok(draining) => draining,
            Err(unsettled) => {
                return Err(Error::Unavailable(format!(
                    "{unsettled} acks answered as queued have not applied after \
                     {QUEUED_DRAIN_LIMIT:?}; leadership stays with node {} (try again)",
                    self.id
                )))
            }
        };
        // A move nobody needs now checks once more, just before the hold closes, briefly: a
        // target whose lag is steady (a disk a second slow) caught up with the first index in
        // time, but would keep the writes closed that long again (second review, MED 2).
        if let Some(within) = closing {
            self.target_caught_up(target, within).await?;
        }
        let closed = self.hold.close();
        let rpcs = self.levels.peer_rpcs(target);
        let result = if rpcs >= crate::cluster::level::TRANSFER_LEADER_RPCS {
            self.hand_over(target).await
        } else {
            // Queuing stays off while this runs (the guard), not for the rest of the term:
            // openraft is not asked to transfer, and if nobody takes over this node goes on
            // leading with writes allowed. Heartbeats come back even if the call is dropped.
            let _heartbeats = HeartbeatsOff::new(&self.raft);
            self.hand_over_by_timeout_now(target, &addr).await
        };
        // Queuing may resume (this guard) except in the term a transfer was asked for in: the
        // mark stays even if this future is dropped halfway (`Queued::hand_over_in`).
        drop((closed, draining));
        result
    }

    /// The voter other than this node with the most of the log.
    fn best_successor(&self) -> Result<NodeId> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let voters: Vec<NodeId> = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|id| *id != self.id)
            .collect();
        voters
            .iter()
            .max_by_key(|id| (matched(&m, **id), std::cmp::Reverse(**id)))
            .copied()
            .ok_or_else(|| {
                Error::FailedPrecondition("there is no other voter to hand leadership to".into())
            })
    }

    /// openraft's transfer (see the module notes).
    async fn hand_over(&self, target: NodeId) -> Result<NodeId> {
        self.wait_replicated(target).await?;
        let election = Duration::from_millis(self.config.raft.election_timeout_max_ms) * 3;
        // From here openraft refuses writes for the rest of this leadership: no ack is queued
        // in its term again. The term is read now, not before the drain (which can outlast a
        // re-election), and again after the trigger, in case one came between (review, MED).
        let view = self.leader_view();
        if !view.leads {
            return Err(Error::NotLeader);
        }
        self.acker.hand_over_in(view.term);
        let triggered = self.raft.trigger().transfer_leader(target).await;
        self.acker.hand_over_in(self.leader_view().term);
        triggered.map_err(|e| Error::Unavailable(format!("raft stopped: {e}")))?;
        match self.wait_other_leader(election).await {
            Some(leader) => {
                tracing::info!(from = self.id, to = leader, "leadership handed over");
                Ok(leader)
            }
            None => Err(Error::Unavailable(format!(
                "node {target} did not take over; the cluster elects a leader (node {} may \
                 win it)",
                self.id
            ))),
        }
    }

    /// The hand-over to a build before TransferLeader (see the module notes); heartbeats are
    /// off while it runs.
    async fn hand_over_by_timeout_now(&self, target: NodeId, addr: &str) -> Result<NodeId> {
        let term = self.raft.metrics().borrow_watched().current_term;
        self.wait_replicated(target).await?;
        // No AppendEntries go out now: once the lease has run out, the followers will vote.
        let lease = Duration::from_millis(self.config.raft.election_timeout_max_ms);
        let election = lease * 3;
        for attempt in 1..=2 {
            tokio::time::sleep(lease + Duration::from_millis(50)).await;
            if let Err(e) = network::timeout_now(&self.config.tls, (addr, self.group()), term).await
            {
                tracing::warn!(target, attempt, error = %e, "TimeoutNow failed");
            }
            if let Some(leader) = self.wait_other_leader(election).await {
                tracing::info!(
                    from = self.id,
                    to = leader,
                    "leadership handed over (TimeoutNow)"
                );
                return Ok(leader);
            }
        }
        Err(Error::Unavailable(format!(
            "node {target} did not take over; node {} goes on leading",
            self.id
        )))
    }

    /// Waits up to `within`, writes flowing, until `target` holds the log as it is now. Not in
    /// time, or leadership lost meanwhile: refused, with nothing done.
    async fn target_caught_up(&self, target: NodeId, within: Duration) -> Result<()> {
        let now = self.raft.metrics().borrow_watched().last_log_index;
        let stays = |why: String| {
            Error::Unavailable(format!(
                "{why}; leadership stays with node {} (writes went on meanwhile)",
                self.id
            ))
        };
        match self.wait_matched(target, now, within).await {
            Ok(()) => Ok(()),
            Err(Error::Unavailable(why)) => Err(stays(why)),
            Err(_) => Err(Error::Unavailable(format!(
                "node {} lost the leadership of group {} while node {target} caught up; \
                 nothing was done",
                self.id,
                self.group()
            ))),
        }
    }

    /// Waits until `target` has every entry this leader has.
    async fn wait_replicated(&self, target: NodeId) -> Result<()> {
        self.wait_matched(target, None, TARGET_CATCH_UP)
            .await
            .map_err(|e| match e {
                Error::Unavailable(why) => {
                    Error::Unavailable(format!("{why}; leadership stays with node {}", self.id))
                }
                other => other,
            })
    }

    /// Waits up to `within` until `target` holds the log up to `upto` (`None`: up to this
    /// leader's last entry, whenever it is checked). NotLeader if leadership is lost meanwhile,
    /// Unavailable on timeout.
    async fn wait_matched(
        &self,
        target: NodeId,
        upto: Option<u64>,
        within: Duration,
    ) -> Result<()> {
        let mut metrics = self.raft.metrics();
        let caught_up = async {
            let m = metrics.wait_until(|m| {
                m.state != ServerState::Leader || matched(m, target) >= upto.or(m.last_log_index)
            });
            m.await.map(|m| m.state == ServerState::Leader)
        };
        match tokio::time::timeout(within, caught_up).await {
            Ok(Ok(true)) => Ok(()),
            // The learner was added already: not "nothing happened".
            Ok(_) => Err(Error::OutcomeUnknown(format!(
                "leadership moved while node {target} caught up; read the members \
                 (Cluster.Status) before trying again"
            ))),
            Err(_) => Err(Error::Unavailable(format!(
                "node {target} is not caught up with the log after {within:?}"
            ))),
        }
    }

    /// Waits up to `within` for another node to lead; its id if one does.
    async fn wait_other_leader(&self, within: Duration) -> Option<NodeId> {
        let mut metrics = self.raft.metrics();
        let me = self.id;
        let moved = async {
            let m = metrics.wait_until(|m| m.current_leader.is_some_and(|l| l != me));
            m.await.ok().and_then(|m| m.current_leader)
        };
        tokio::time::timeout(within, moved).await.ok().flatten()
    }
}

/// The last log index the leader knows `id` to hold (`None`: nothing yet, or not leading).
fn matched(m: &RaftMetrics, id: NodeId) -> Option<u64> {
    let replication = m.replication.as_ref()?;
    replication.get(&id).cloned().flatten().map(|l| l.index)
}

fn check_new_member(id: NodeId, addr: &str) -> Result<()> {
    if id == 0 {
        return Err(Error::InvalidArgument("node ids start at 1".into()));
    }
    if addr.is_empty() || !addr.contains(':') {
        return Err(Error::InvalidArgument(format!(
            "address {addr:?} is not HOST:PORT"
        )));
    }
    Ok(())
}

fn describe(members: &[Member]) -> String {
    let parts: Vec<String> = members
        .iter()
        .map(|(id, addr, voter)| {
            let role = if *voter { "voter" } else { "learner" };
            format!("{id} at {addr} ({role})")
        })
        .collect();
    parts.join(", ")
}

type WriteError = openraft::error::RaftError<
    crate::raft_types::TypeConfig,
    openraft::error::ClientWriteError<crate::raft_types::TypeConfig>,
>;

fn membership_error(e: WriteError) -> Error {
    use openraft::error::{ClientWriteError, RaftError};
    match e {
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
            Error::FailedPrecondition(format!("membership change refused: {c}"))
        }
        // A change is two entries (joint, then uniform) and may have been waiting for a learner:
        // "not the leader" may come after part of it committed, so it is not "nothing happened"
        // (which would let a forwarder send it again).
        other => match crate::node::write_error(other) {
            // NoQuorum too: openraft refuses the second (uniform) step for a lapsed lease
            // after the first (joint) one committed (review 34b).
            Error::NotLeader | Error::Unavailable(_) | Error::NoQuorum(_) => Error::OutcomeUnknown(
                "leadership moved during the membership change, which may be done in part: \
                 read the members (Cluster.Status) before trying again"
                    .into(),
            ),
            e => e,
        },
    }
}

/// Heartbeats off while this lives (the hand-over by `TimeoutNow`): back on when it is dropped,
/// also if the hand-over's future is (a caller's deadline), so a leader is never left silent.
struct HeartbeatsOff<'a>(&'a crate::cluster::Raft);

impl<'a> HeartbeatsOff<'a> {
    fn new(raft: &'a crate::cluster::Raft) -> Self {
        raft.runtime_config().heartbeat(false);
        HeartbeatsOff(raft)
    }
}

impl Drop for HeartbeatsOff<'_> {
    fn drop(&mut self) {
        self.0.runtime_config().heartbeat(true);
    }
}
