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
//! sources or targets: a group is not moved onto a node cut off from group 0's leader (whose
//! calls could not be judged, and which `hand_over_when_cut_off` would hand back), nor asked of
//! a node that cannot answer. A group moved stays where it went for [`SETTLE`], so rounds never
//! pass one back and forth. One move per round; the round after a move comes sooner, so a
//! cluster formed with every leader on one node is balanced within seconds.
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
use crate::Result;

/// A node group 0's leader heard from this recently may take or give a group.
const HEARD_WITHIN: Duration = Duration::from_secs(1);
/// How long a group moved stays where it went before balancing may move it again.
const SETTLE: Duration = Duration::from_secs(10);
/// The pause after a move, before the next round (shorter than a round's period).
const AFTER_A_MOVE: Duration = Duration::from_millis(500);

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
    let mut channel: Option<(String, tonic::transport::Channel)> = None;
    let mut pause = every;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = every;
        let meta = nodes.meta();
        if meta.leader() != Leader::Me {
            moved.clear();
            continue;
        }
        moved.retain(|_, at| at.elapsed() < SETTLE);
        let Some((group, from, to)) = plan(&nodes, |g| moved.contains_key(&g)) else {
            continue;
        };
        tracing::info!(
            group,
            from,
            to,
            "balancing leaders: moving a data group's leader"
        );
        moved.insert(group, Instant::now());
        let done = match from == meta.id() {
            true => match nodes.group(group) {
                Some(node) => node.transfer_leader(Some(to)).await,
                None => continue,
            },
            false => ask(meta, &store, &mut channel, from, (group, to)).await,
        };
        match done {
            Ok(leader) => {
                tracing::info!(group, leader, "balancing leaders: moved");
                pause = AFTER_A_MOVE;
            }
            Err(e) => tracing::warn!(group, from, to, error = %e, "balancing leaders: not moved"),
        }
    }
}

/// The move a round makes, `(group, from, to)`, or none: the cluster is balanced, or every
/// group the busiest node leads was moved lately (`settling`). A group whose leader is not
/// known (an election runs) counts nowhere this round.
fn plan(nodes: &Nodes, settling: impl Fn(Group) -> bool) -> Option<(Group, NodeId, NodeId)> {
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
    let (group, from, to) = choose(&led, settling)?;
    let voter = (nodes.group(group)?.members().iter()).any(|m| m.0 == to && m.2);
    voter.then_some((group, from, to))
}

/// From each node's groups: the busiest node (most groups; the lowest id of equals), the
/// idlest (fewest; the lowest id), and a data group of the first not `settling` (the highest),
/// when the two differ by two or more.
fn choose(
    led: &BTreeMap<NodeId, Vec<Group>>,
    settling: impl Fn(Group) -> bool,
) -> Option<(Group, NodeId, NodeId)> {
    let (from, busiest) = led
        .iter()
        .max_by_key(|(id, groups)| (groups.len(), std::cmp::Reverse(**id)))?;
    let (to, idlest) = led.iter().min_by_key(|(id, groups)| (groups.len(), **id))?;
    if busiest.len() < idlest.len() + 2 {
        return None;
    }
    let group = (busiest.iter().copied())
        .filter(|g| *g != GROUP_ZERO && !settling(*g))
        .max()?;
    Some((group, *from, *to))
}

/// Asks node `from` (which leads `group`) to hand it to `to`, over a kept channel.
async fn ask(
    meta: &Node,
    store: &crate::storage::Store,
    channel: &mut Option<(String, tonic::transport::Channel)>,
    from: NodeId,
    (group, to): (Group, NodeId),
) -> Result<NodeId> {
    let addr = (meta.members().into_iter())
        .find(|m| m.0 == from)
        .map(|m| meta.config.dial_addr(from, &m.1))
        .ok_or_else(|| crate::Error::NotFound(format!("node {from} is not a member")))?;
    let ch = match channel.take() {
        Some((at, ch)) if at == addr => ch,
        _ => (meta.config.tls)
            .channel(&addr, |e| e.connect_timeout(Duration::from_secs(1)))
            .map_err(|e| crate::Error::Unavailable(format!("node {from} at {addr}: {e}")))?,
    };
    *channel = Some((addr.clone(), ch.clone()));
    crate::cluster::network::handover(&meta.config, (&addr, ch), store, (group, to)).await
}

impl Node {
    /// This node and the members it, leading, heard from within `within` (a heartbeat or an
    /// append answered); none but itself when it does not lead.
    fn heard_from(&self, within: Duration) -> Vec<NodeId> {
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
        assert_eq!(choose(&all_on_one, |_| false), Some((4, 1, 2)));
        // Balanced within one: nothing moves.
        let balanced = led(&[(1, &[0, 1]), (2, &[2, 3]), (3, &[4])]);
        assert_eq!(choose(&balanced, |_| false), None);
        // Group 0 is never moved, and a group moved lately stays.
        let only_zero = led(&[(1, &[0, 1, 2]), (2, &[]), (3, &[3, 4])]);
        assert_eq!(choose(&only_zero, |g| g == 2), Some((1, 1, 2)));
        assert_eq!(choose(&only_zero, |g| g != 0), None);
        let zero_only = led(&[(1, &[0]), (2, &[])]);
        assert_eq!(choose(&zero_only, |_| false), None);
    }

    #[test]
    fn repeated_moves_end_balanced() {
        // Every leader on one node (a formation's usual outcome), 8 data groups: each move
        // as the rounds make it, until none is left.
        let mut state = led(&[(1, &[0, 1, 2, 3, 4, 5, 6, 7, 8]), (2, &[]), (3, &[])]);
        let mut moves = 0;
        while let Some((g, from, to)) = choose(&state, |_| false) {
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
