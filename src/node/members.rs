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

/// How long group 0's leader keeps looking for a data group's leader that takes a step (an
/// election, a hand-over of the node being removed).
const FIND_LEADER: Duration = Duration::from_secs(20);
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
        // Not a voter of group 0 yet, whatever `voter` says: that comes last.
        meta.add_node(id, addr.clone(), false).await?;
        for group in self.data_groups() {
            let step = MemberStep::Add {
                id,
                addr: addr.clone(),
                voter,
            };
            self.on_leader_of(group, step).await.map_err(|e| {
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
    /// group 0 over first, as a single group's leader does): send it again.
    pub async fn remove_member(&self, id: NodeId) -> Result<Vec<Member>> {
        let meta = self.meta();
        if !self.sharded() {
            return meta.remove_node(id).await;
        }
        // Group 0's refusals first (not a member, the only voter), before any group changes.
        meta.check_removable(id)?;
        for group in self.data_groups() {
            self.on_leader_of(group, MemberStep::Remove { id })
                .await
                .map_err(|e| halfway(e, format!("node {id} left the groups before {group}")))?;
        }
        meta.remove_node(id).await
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
        let meta_term = self.meta().current_term();
        if meta_term > term {
            return Err(Error::FailedPrecondition(format!(
                "a member step planned in group 0's term {term}; this node is in term \
                 {meta_term}"
            )));
        }
        if node.leader() != Leader::Me {
            return Err(Error::NotLeader);
        }
        match step {
            MemberStep::Add { id, addr, voter } => {
                self.meta_caught_up(META_CATCH_UP).await?;
                if !self.meta().members().iter().any(|m| m.0 == id) {
                    return Err(Error::FailedPrecondition(format!(
                        "node {id} is not a member of group 0: add it with Cluster.AddNode"
                    )));
                }
                node.add_node(id, addr, voter).await
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

    /// Runs `step` on group `group`'s leader, wherever it is, sent again while the group has no
    /// leader, its leader changes (NotLeader: the node removed handed it over) or the outcome
    /// is unknown, for up to [`FIND_LEADER`].
    async fn on_leader_of(&self, group: Group, step: MemberStep) -> Result<Vec<Member>> {
        let meta = self.meta();
        let term = meta.current_term();
        let deadline = tokio::time::Instant::now() + FIND_LEADER;
        loop {
            let node = self.group(group).ok_or_else(|| {
                Error::Internal(format!("this node hosts no replica of group {group}"))
            })?;
            let outcome = match node.leader() {
                Leader::Me => self.member_step(group, step.clone(), term).await,
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

/// An error of a step halfway through AddNode or RemoveNode, saying how far it got: sending
/// the call again finishes it.
fn halfway(e: Error, done: String) -> Error {
    let say = |why: String| format!("{why} ({done}; send the call again to finish)");
    match e {
        Error::InvalidArgument(why) => Error::InvalidArgument(say(why)),
        Error::FailedPrecondition(why) => Error::FailedPrecondition(say(why)),
        Error::NotFound(why) => Error::NotFound(say(why)),
        Error::OutcomeUnknown(why) => Error::OutcomeUnknown(say(why)),
        Error::NotYet(why) => Error::NotYet(say(why)),
        Error::NotLeader => Error::Unavailable(say("group 0's leader changed".into())),
        other => Error::Unavailable(say(other.to_string())),
    }
}
