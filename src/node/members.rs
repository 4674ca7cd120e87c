//! Adding and removing a node in a cluster of data groups (docs/sharding.md §6, the first
//! step of replica moves): every group's members are every node, so a node added joins group
//! 0 and every data group, and a node removed leaves them all.
//!
//! Group 0's leader (where `Cluster.AddNode` and `RemoveNode` run) drives it, one group at a
//! time, each step on that group's leader: itself, or by the peer call `Groups/Member`. Each
//! step is "make it so" — add a member that is one, or remove one that is not, and nothing
//! changes — so a step whose outcome is unknown is sent again (DESIGN 9), and an AddNode or
//! RemoveNode cut short (a leader change, a timeout) is finished by sending it again.
//!
//! The order keeps one fact true: **a node is a voter of group 0 only once it is a member of
//! every data group.**
//! - AddNode: group 0 first as a learner (it then holds the cluster's namespaces and keys),
//!   then each data group (learner, caught up, voter), then group 0's promotion last.
//! - RemoveNode: each data group first (a group the node leads is handed over first), group 0
//!   last, so a retry still finds it a member and finishes.
//!
//! A node restarted halfway never forms a data group of its own: one started with `--join`
//! never forms any (`server::form_data_groups` is not run), and one started without it forms
//! them only from group 0's voters, among which it is not until it is in every group.
//!
//! A data group's leader takes an Add only for a node its replica of group 0 knows as a
//! member, after catching up with group 0: a `Member` call cannot add a stranger.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::keys::{Group, GROUP_ZERO};
use crate::node::{Leader, Member, Nodes};
use crate::raft_types::NodeId;
use crate::{Error, Result};

/// One step of adding or removing a node, in one data group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberStep {
    /// Node `id` at `addr` is a member of the group: a learner holding the log, and a voter if
    /// `voter`.
    Add {
        id: NodeId,
        addr: String,
        voter: bool,
    },
    /// Node `id` is no member of the group (if it leads the group, it hands over first).
    Remove { id: NodeId },
}

/// How long group 0's leader keeps sending a step again after an attempt began (an election,
/// a hand-over of the node being removed).
const FIND_LEADER: Duration = Duration::from_secs(20);
/// Longest one step may take on this node (a learner's catch-up, 60 s at most, then its
/// promotion): as long as the peer call that carries one to another node.
const STEP_LIMIT: Duration = Duration::from_secs(75);
/// Longest a data group's leader takes to catch up with group 0 before it judges an Add.
const META_CATCH_UP: Duration = Duration::from_secs(2);

impl Nodes {
    /// Adds node `id` at `addr` to every group (see the module essay): the members of group 0
    /// afterwards. Sending it again after any failure is safe and finishes it.
    pub async fn add_member(&self, id: NodeId, addr: String, voter: bool) -> Result<Vec<Member>> {
        let meta = self.meta();
        if !self.sharded() {
            return meta.add_node(id, addr, voter).await;
        }
        let _walk = self.member_walk()?;
        let term = meta.leading_term().ok_or(Error::NotLeader)?;
        // Not a voter of group 0 yet, whatever `voter` says: that comes last.
        meta.add_node(id, addr.clone(), false).await?;
        for group in self.data_groups() {
            let step = MemberStep::Add {
                id,
                addr: addr.clone(),
                voter,
            };
            self.on_leader_of(group, step, term).await.map_err(|e| {
                halfway(
                    e,
                    format!("node {id} is added to the groups before {group}"),
                )
            })?;
        }
        match voter {
            true => meta.add_node(id, addr, true).await,
            false => Ok(meta.members()),
        }
    }

    /// Removes node `id` from every group (see the module essay): the members of group 0
    /// afterwards. NotLeader when this node, group 0's leader, is the one removed (it hands
    /// group 0 over first, as a single group's leader does): send it again. A node that only
    /// data groups still have (a walk cut short by a change of group 0's leader) is removed
    /// from them.
    pub async fn remove_member(&self, id: NodeId) -> Result<Vec<Member>> {
        let meta = self.meta();
        if !self.sharded() {
            return meta.remove_node(id).await;
        }
        let _walk = self.member_walk()?;
        let term = meta.leading_term().ok_or(Error::NotLeader)?;
        // Group 0's refusals first (the only voter, or no member anywhere), and no group left
        // without a majority it can hear, before any group changes.
        let in_group_0 = match meta.check_removable(id) {
            Ok(_) => true,
            Err(Error::NotFound(why)) if !self.in_some_data_group(id) => {
                return Err(Error::NotFound(why))
            }
            Err(Error::NotFound(_)) => false,
            Err(e) => return Err(e),
        };
        meta.check_majority_without(id)?;
        for group in self.data_groups() {
            self.on_leader_of(group, MemberStep::Remove { id }, term)
                .await
                .map_err(|e| halfway(e, format!("node {id} left the groups before {group}")))?;
        }
        match in_group_0 {
            true => meta.remove_node(id).await,
            false => Ok(meta.members()),
        }
    }

    /// Group `group`'s leader takes one step of adding or removing a node (peer `Member`, or
    /// called by group 0's leader itself), planned in group 0's `term`: the group's members
    /// afterwards. NotLeader from a node that does not lead the group.
    pub async fn member_step(
        &self,
        group: Group,
        step: MemberStep,
        term: u64,
    ) -> Result<Vec<Member>> {
        let node = (self.group(group).filter(|_| group != GROUP_ZERO)).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a member step for group {group}: no such data group"
            ))
        })?;
        let stale = || {
            let now = self.meta().current_term();
            (now > term).then(|| {
                Error::FailedPrecondition(format!(
                    "a member step planned in group 0's term {term}; this node is in term {now}"
                ))
            })
        };
        if let Some(e) = stale() {
            return Err(e);
        }
        if node.leader() != Leader::Me {
            return Err(Error::NotLeader);
        }
        match step {
            MemberStep::Add { id, addr, voter } => {
                // Judged against group 0 as it is now: the node is its member, at this address,
                // and the walk's leader still leads it (a deposed one's step is refused).
                self.meta_caught_up(META_CATCH_UP).await?;
                if let Some(e) = stale() {
                    return Err(e);
                }
                let members = self.meta().members();
                match members.iter().find(|m| m.0 == id) {
                    Some(m) if m.1 == addr => node.add_node(id, addr, voter).await,
                    Some(m) => Err(Error::AlreadyExists(format!(
                        "node {id} is a member of group 0 at {}, not {addr}",
                        m.1
                    ))),
                    None => Err(Error::FailedPrecondition(format!(
                        "node {id} is not a member of group 0: add it with Cluster.AddNode"
                    ))),
                }
            }
            MemberStep::Remove { id } => match node.remove_node(id).await {
                Err(Error::NotFound(_)) => Ok(node.members()), // gone already: done
                other => other,
            },
        }
    }

    /// The data groups, in order.
    fn data_groups(&self) -> impl Iterator<Item = Group> + '_ {
        self.each().skip(1).map(|n| n.group())
    }

    /// Whether node `id` is a member of a data group, as this node's replicas know.
    fn in_some_data_group(&self, id: NodeId) -> bool {
        (self.each().skip(1)).any(|n| n.members().iter().any(|m| m.0 == id))
    }

    /// Runs `step` on group `group`'s leader, wherever it is, while this node leads group 0 in
    /// `term`; sent again while the group has no leader, its leader changes (NotLeader: the
    /// node removed handed it over) or the outcome is unknown, for up to [`FIND_LEADER`] after
    /// the last attempt began.
    async fn on_leader_of(&self, group: Group, step: MemberStep, term: u64) -> Result<Vec<Member>> {
        let meta = self.meta();
        loop {
            // A deposed leader of group 0 stops walking (the new one may be removing the node).
            if meta.leading_term() != Some(term) {
                return Err(Error::NotLeader);
            }
            let deadline = tokio::time::Instant::now() + FIND_LEADER;
            let node = self.group(group).ok_or_else(|| {
                Error::Internal(format!("this node hosts no replica of group {group}"))
            })?;
            let outcome = match node.leader() {
                Leader::Me => {
                    let step = self.member_step(group, step.clone(), term);
                    // As long as the peer call's own bound (`network::member`): a membership
                    // change that cannot commit (a voter lost meanwhile) does not hold the walk.
                    match tokio::time::timeout(STEP_LIMIT, step).await {
                        Ok(outcome) => outcome,
                        Err(_) => Err(Error::OutcomeUnknown(format!(
                            "group {group}'s step did not finish within {STEP_LIMIT:?}"
                        ))),
                    }
                }
                Leader::Other { id, addr } => {
                    let channel = (meta.config.tls)
                        .channel(&addr, |e| e.connect_timeout(Duration::from_secs(1)))
                        .map_err(|e| Error::Unavailable(format!("node {id} at {addr}: {e}")))?;
                    let request = (group, step.clone(), term);
                    let to = (&addr[..], channel);
                    let network = crate::cluster::network::member::<Result<Vec<Member>>>;
                    network(&meta.config, to, &meta.store, &request)
                        .await
                        .and_then(|r| r)
                }
                Leader::Unknown => Err(Error::Unavailable(format!(
                    "group {group} has no leader this node knows of"
                ))),
            };
            match outcome {
                Err(e @ (Error::NotLeader | Error::Unavailable(_) | Error::OutcomeUnknown(_)))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tracing::debug!(group, error = %e, "member step: sending it again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other,
            }
        }
    }
}

/// An error of a step halfway through AddNode or RemoveNode, saying how far it got. Never
/// "nothing was done" (NotYet): groups before it changed. The walk is finished by sending
/// the call again, except after a refusal of the call itself.
fn halfway(e: Error, done: String) -> Error {
    let again = |why: String| format!("{why} ({done}; send the call again to finish)");
    let said = |why: String| format!("{why} ({done})");
    match e {
        Error::InvalidArgument(why) => Error::InvalidArgument(said(why)),
        Error::FailedPrecondition(why) => Error::FailedPrecondition(said(why)),
        Error::AlreadyExists(why) => Error::AlreadyExists(said(why)),
        Error::NotFound(why) => Error::NotFound(said(why)),
        Error::OutcomeUnknown(why) => Error::OutcomeUnknown(again(why)),
        Error::NotLeader => Error::Unavailable(again("group 0's leader changed".into())),
        other => Error::Unavailable(again(other.to_string())),
    }
}
