//! Leader balancing (docs/sharding.md §2). A sharded cluster's capacity is its leaders': each
//! data group's leader proposes the group's writes, fires its timers and delivers them. An
//! election puts a leader anywhere (at formation every group's often lands on one node; a
//! restart or a cut-off hand-over moves them and nothing moves them back), so group 0's
//! leader looks every `NodeConfig::balance_every`: when the node leading the most groups leads
//! at least two more than the one leading the fewest, it moves one data group from the first
//! to the second — by TransferLeader if it leads that group itself, else by asking its leader
//! (peer `Handover`), which hands over the same way. Group 0 counts (it costs its node a share)
//! but is never moved by balancing.
//!
//! Only nodes group 0's leader hears from (a heartbeat answered within [`HEARD_WITHIN`]) are
//! sources or targets. Hearing is one way, so a move is asked of its **target**
//! ([`Nodes::handover`], locally or by the peer call `Groups/Handover`), which takes it only
//! when it can serve it: it is not stopping (a SIGTERM's hand-off is not undone: the hand-off
//! waits for the moves it is taking), it catches up with group 0 now (`meta_caught_up`: it
//! can judge the group's calls, which a node that cannot call group 0's leader could not),
//! and it has seen no later term of group 0 than the move was planned in. It then asks the
//! group's leader, which hands over if the target keeps up with the log closely enough that
//! no write waits for it (`Node::balance_to`). A target that refused a move is passed over for
//! [`BACK_OFF`] (a refusal by the group's leader passes nobody over: the group settles). A
//! group moved stays where it went for [`SETTLE`], so rounds never pass one back and forth.
//! One move per round; the round after a move comes sooner, so a cluster formed with every
//! leader on one node is balanced within seconds.
//!
//! Decided from this node's replicas' view of who leads (each group's metrics), which is
//! node-local and may trail: that only delays a move, or sends one its receiver refuses (it no
//! longer leads the group). A move changes nothing but who leads, and is a planned hand-over
//! (queued acks apply first: docs/guarantees.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::keys::{Group, GROUP_ZERO};
use crate::node::{Leader, Node, Nodes};
use crate::raft_types::NodeId;
use crate::{Error, Result};

/// A node group 0's leader heard from this recently may take or give a group.
const HEARD_WITHIN: Duration = Duration::from_secs(1);
/// How long a group moved stays where it went before balancing may move it again.
const SETTLE: Duration = Duration::from_secs(10);
/// The pause after a move, before the next round (shorter than a round's period).
const AFTER_A_MOVE: Duration = Duration::from_millis(500);
/// How long a target that refused a move is passed over.
const BACK_OFF: Duration = Duration::from_secs(30);
/// Longest a target may take to show it catches up with group 0 before it takes a group.
const META_CATCH_UP: Duration = Duration::from_secs(1);
/// Longest the group's leader may take to answer the target (its hand-over's own steps are
/// bounded: `membership`); group 0's leader waits for the target a little longer.
const LEADER_ANSWER: Duration = Duration::from_secs(20);
const TARGET_ANSWER: Duration = Duration::from_secs(25);

/// Balances the data groups' leaders while this node leads group 0 (see the module essay).
/// Ends when the node stops; does nothing without data groups or with balancing off.
pub async fn balance_leaders(
    nodes: Arc<Nodes>,
    store: crate::storage::Store,
    mut shutdown: watch::Receiver<bool>,
) {
    let every = nodes.meta().config.balance_every;
    if !nodes.sharded() || every.is_zero() {
        return;
    }
    let mut moved: BTreeMap<Group, Instant> = BTreeMap::new();
    let mut avoid: BTreeMap<NodeId, Instant> = BTreeMap::new();
    let mut pause = every;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = every;
        let meta = nodes.meta();
        // The term read with the leadership, from one view: a move is planned in the term
        // this node led in.
        // Not while a node is added or removed (`members`): its groups would be moved under
        // the walk, or onto a node half in.
        let busy = nodes.stopping() || nodes.members_changing();
        let Some(term) = meta.leading_term().filter(|_| !busy) else {
            moved.clear();
            avoid.clear();
            continue;
        };
        moved.retain(|_, at| at.elapsed() < SETTLE);
        avoid.retain(|_, at| at.elapsed() < BACK_OFF);
        let settling = |g: Group| moved.contains_key(&g);
        let Some((group, from, to)) = plan(&nodes, settling, |id| !avoid.contains_key(&id)) else {
            continue;
        };
        tracing::info!(
            group,
            from,
            to,
            "balancing leaders: moving a data group's leader"
        );
        moved.insert(group, Instant::now());
        let done = match to == meta.id() {
            true => nodes.handover(group, to, term).await,
            false => ask(meta, &store, to, (group, to, term)).await,
        };
        match done {
            Ok(leader) => {
                tracing::info!(group, leader, "balancing leaders: moved");
                pause = AFTER_A_MOVE;
            }
            Err(Error::FailedPrecondition(why)) => {
                tracing::info!(
                    group,
                    to,
                    why,
                    "balancing leaders: the target refused; passed over for {BACK_OFF:?}"
                );
                avoid.insert(to, Instant::now());
            }
            Err(e) => tracing::warn!(group, from, to, error = %e, "balancing leaders: not moved"),
        }
    }
}

/// The move a round makes, `(group, from, to)`, or none: the cluster is balanced, or every
/// group the busiest node leads was moved lately (`settling`), or no node that may take one
/// (`may_take`, and a voter of the group) leads two fewer. A group whose leader is not known
/// (an election runs) counts nowhere this round.
fn plan(
    nodes: &Nodes,
    settling: impl Fn(Group) -> bool,
    may_take: impl Fn(NodeId) -> bool,
) -> Option<(Group, NodeId, NodeId)> {
    let meta = nodes.meta();
    let mut led: BTreeMap<NodeId, Vec<Group>> = (meta.heard_from(HEARD_WITHIN).into_iter())
        .map(|id| (id, Vec::new()))
        .collect();
    for node in nodes.each() {
        let leader = match node.leader() {
            Leader::Me => meta.id(),
            Leader::Other { id, .. } => id,
            Leader::Unknown => continue, // an election runs: counts nowhere this round
        };
        // A group led by a node not heard from counts nowhere, and is not asked of it.
        if let Some(groups) = led.get_mut(&leader) {
            groups.push(node.group());
        }
    }
    let voter = |g: Group, to: NodeId| {
        (nodes
            .group(g)
            .map(|n| n.members())
            .unwrap_or_default()
            .iter())
        .any(|m| m.0 == to && m.2)
    };
    choose(&led, |g, to| !settling(g) && may_take(to) && voter(g, to))
}

/// From each node's groups: the busiest node (most groups; the lowest id of equals), and the
/// idlest node (fewest; the lowest id) leading two or more fewer to which one of the
/// busiest's data groups may go (`may_take`: the highest such group).
fn choose(
    led: &BTreeMap<NodeId, Vec<Group>>,
    may_take: impl Fn(Group, NodeId) -> bool,
) -> Option<(Group, NodeId, NodeId)> {
    let (from, busiest) = led
        .iter()
        .max_by_key(|(id, groups)| (groups.len(), std::cmp::Reverse(**id)))?;
    let mut targets: Vec<(&NodeId, &Vec<Group>)> = led.iter().filter(|t| t.0 != from).collect();
    targets.sort_by_key(|(id, groups)| (groups.len(), **id));
    for (to, groups) in targets {
        if busiest.len() < groups.len() + 2 {
            return None; // this one and every later target are within one
        }
        let group = (busiest.iter().copied())
            .filter(|g| *g != GROUP_ZERO && may_take(*g, *to))
            .max();
        if let Some(group) = group {
            return Some((group, *from, *to));
        }
    }
    None
}

/// Asks node `to` to take `group` (peer `Handover`): the leader afterwards. A move is rare
/// (one per round at most), so each has its own connection.
async fn ask(
    meta: &Node,
    store: &crate::storage::Store,
    at: NodeId,
    request: (Group, NodeId, u64),
) -> Result<NodeId> {
    let addr = (meta.members().into_iter())
        .find(|m| m.0 == at)
        .map(|m| meta.config.dial_addr(at, &m.1))
        .ok_or_else(|| Error::NotFound(format!("node {at} is not a member")))?;
    let channel = (meta.config.tls)
        .channel(&addr, |e| e.connect_timeout(Duration::from_secs(1)))
        .map_err(|e| Error::Unavailable(format!("node {at} at {addr}: {e}")))?;
    let to = (&addr[..], channel);
    crate::cluster::network::handover(&meta.config, to, store, (request, TARGET_ANSWER)).await
}

impl Nodes {
    /// A balancing move of data group `group` to node `to`, planned by group 0's leader in
    /// group 0's `term` (peer `Handover`, or called by that leader itself): the leader of the
    /// group afterwards. On the target (`to` is this node) it checks that this node can serve
    /// the group (see the module essay) and asks the group's leader; on the group's leader it
    /// hands over (`Node::balance_to`). Refused, with nothing done, otherwise: a refusal of the
    /// target's own is FAILED_PRECONDITION, anything from the group's leader UNAVAILABLE.
    pub async fn handover(&self, group: Group, to: NodeId, term: u64) -> Result<NodeId> {
        let node = (self.group(group).filter(|_| group != GROUP_ZERO)).ok_or_else(|| {
            Error::InvalidArgument(format!("a handover of group {group}: no such data group"))
        })?;
        let me = self.meta().id();
        let stale = |now: u64| {
            Error::FailedPrecondition(format!(
                "a handover planned in group 0's term {term}; node {me} is in term {now}"
            ))
        };
        let meta_term = || self.meta().raft.metrics().borrow_watched().current_term;
        if to != me {
            if node.leader() != Leader::Me {
                return Err(Error::Unavailable(format!(
                    "node {me} does not lead group {group}"
                )));
            }
            if meta_term() > term {
                return Err(Error::Unavailable(stale(meta_term()).to_string()));
            }
            return node.balance_to(to).await;
        }
        // Counted before the stop is looked at, and the stop's hand-off waits for the count:
        // one of the two sees the other (both sequentially consistent).
        let _taking = self.taking();
        if self.stopping() {
            return Err(Error::FailedPrecondition(format!(
                "node {me} is stopping: it takes no group"
            )));
        }
        // It must be able to judge the group's calls: group 0's leader hearing from it says
        // nothing of whether it can call group 0's leader (review, H1).
        if let Err(e) = self.meta_caught_up(META_CATCH_UP).await {
            return Err(Error::FailedPrecondition(e.to_string()));
        }
        if meta_term() > term {
            return Err(stale(meta_term()));
        }
        let (leader, addr) = match node.leader() {
            Leader::Me => return Ok(me),
            Leader::Other { id, addr } => (id, addr),
            Leader::Unknown => {
                return Err(Error::Unavailable(format!(
                    "group {group} has no leader node {me} knows of"
                )))
            }
        };
        let meta = self.meta();
        let channel = (meta.config.tls)
            .channel(&addr, |e| e.connect_timeout(Duration::from_secs(1)))
            .map_err(|e| Error::Unavailable(format!("node {leader} at {addr}: {e}")))?;
        let request = ((group, to, term), LEADER_ANSWER);
        crate::cluster::network::handover(&meta.config, (&addr, channel), &meta.store, request)
            .await
            .map_err(|e| Error::Unavailable(format!("group {group}'s leader, node {leader}: {e}")))
    }
}

impl Node {
    /// The term this node leads in, read with the leadership from one view; none when it
    /// does not lead.
    pub(super) fn leading_term(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let leads = m.state == openraft::ServerState::Leader && m.current_leader == Some(self.id);
        leads.then_some(m.current_term)
    }

    /// This node and the members it, leading, heard from within `within` (a heartbeat or an
    /// append answered); none but itself when it does not lead.
    pub(super) fn heard_from(&self, within: Duration) -> Vec<NodeId> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let heard = (m.heartbeat.iter().flatten())
            .filter(|(_, at)| {
                (at.as_ref()).is_some_and(|at| openraft::Instant::elapsed(&**at) < within)
            })
            .map(|(id, _)| *id);
        std::iter::once(self.id).chain(heard).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(counts: &[(NodeId, &[Group])]) -> BTreeMap<NodeId, Vec<Group>> {
        counts.iter().map(|(id, g)| (*id, g.to_vec())).collect()
    }

    #[test]
    fn the_busiest_node_gives_its_highest_data_group_to_the_idlest() {
        let all_on_one = led(&[(1, &[0, 1, 2, 3, 4]), (2, &[]), (3, &[])]);
        assert_eq!(choose(&all_on_one, |_, _| true), Some((4, 1, 2)));
        // Balanced within one: nothing moves.
        let balanced = led(&[(1, &[0, 1]), (2, &[2, 3]), (3, &[4])]);
        assert_eq!(choose(&balanced, |_, _| true), None);
        // Group 0 is never moved, and a group moved lately stays.
        let only_zero = led(&[(1, &[0, 1, 2]), (2, &[]), (3, &[3, 4])]);
        assert_eq!(choose(&only_zero, |g, _| g != 2), Some((1, 1, 2)));
        assert_eq!(choose(&only_zero, |g, _| g == 0), None);
        let zero_only = led(&[(1, &[0]), (2, &[])]);
        assert_eq!(choose(&zero_only, |_, _| true), None);
    }

    #[test]
    fn a_node_that_may_not_take_a_group_is_passed_over_for_the_next_idlest() {
        let state = led(&[(1, &[0, 1, 2, 3, 4]), (2, &[]), (3, &[5])]);
        // Node 2 backed off (or stopping, or cut off): node 3 leads two fewer, it takes one.
        assert_eq!(choose(&state, |_, to| to != 2), Some((4, 1, 3)));
        // Node 2 is a voter of group 2 only (a learner of the rest): it takes group 2.
        assert_eq!(choose(&state, |g, to| to != 2 || g == 2), Some((2, 1, 2)));
        // Nobody may take anything: no move, however unbalanced.
        assert_eq!(choose(&state, |_, _| false), None);
        // Node 3 leads one fewer only: with node 2 passed over, nothing moves.
        let near = led(&[(1, &[0, 1, 2]), (2, &[]), (3, &[3, 4])]);
        assert_eq!(choose(&near, |_, to| to != 2), None);
    }

    #[test]
    fn repeated_moves_end_balanced() {
        // Every leader on one node (a formation's usual outcome), 8 data groups: each move
        // as the rounds make it, until none is left.
        let mut state = led(&[(1, &[0, 1, 2, 3, 4, 5, 6, 7, 8]), (2, &[]), (3, &[])]);
        let mut moves = 0;
        while let Some((g, from, to)) = choose(&state, |_, _| true) {
            state.get_mut(&from).unwrap().retain(|x| *x != g);
            state.get_mut(&to).unwrap().push(g);
            moves += 1;
            assert!(moves < 20, "{state:?}");
        }
        let counts: Vec<usize> = state.values().map(Vec::len).collect();
        assert_eq!(counts, [3, 3, 3], "{state:?}");
        assert_eq!(moves, 6);
    }
}
