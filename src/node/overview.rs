//! The cluster as its leader sees it, for dashboards (`Cluster.Overview`, the web console):
//! each member's replication progress from openraft's metrics, and each namespace's counts from
//! the applied state. Runs on group 0's leader (the forwarding layer sends it there); read from
//! local state without a round to the followers, so it is a recent view, not a linearizable
//! one. With data groups, a namespace's counts come from this node's replica of the group that
//! holds its timers, which may trail that group's leader by what it has not yet applied.

use super::*;

/// One member's progress as the leader knows it.
#[derive(Debug, Clone)]
pub struct MemberProgress {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    pub leader: bool,
    /// The last entry the leader knows the member holds (the leader: its last entry).
    pub matched_index: u64,
    /// Entries the member is behind the leader's last one.
    pub lag: u64,
}

/// One namespace's counts.
#[derive(Debug, Clone, Default)]
pub struct NamespaceCounts {
    pub name: String,
    pub pending: u64,
    pub stored: u64,
    pub configured: bool,
    pub paused: bool,
    /// The group holding its timers.
    pub group: crate::keys::Group,
    /// Timers by state, when asked for (`None`: not counted).
    pub by_state: Option<Vec<(crate::timer::TimerState, u64)>>,
    /// The by-state counts stopped at the overview's budget (the first timers by id only).
    pub by_state_partial: bool,
}

#[derive(Debug, Clone)]
pub struct Overview {
    pub leader_id: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub members: Vec<MemberProgress>,
    pub namespaces: Vec<NamespaceCounts>,
}

/// Most namespaces one overview lists.
const MAX_NAMESPACES: usize = 10_000;
/// Most timers one overview reads to count them by state, over all namespaces: a bounded
/// cost on the leader (about a second of one core at the most).
pub const COUNT_BUDGET: usize = 200_000;

impl Node {
    /// The overview; with `by_state`, each namespace's timers are also counted by state (up to
    /// [`COUNT_BUDGET`] timers in all; the namespaces past it are marked partial).
    /// Run on group 0's door: `nodes` are every group's, and the namespaces' timers are
    /// counted in the groups that hold them.
    pub fn overview(&self, by_state: bool, nodes: &Nodes) -> Result<Overview> {
        let m = self.raft.metrics().borrow_watched().clone();
        let last = m.last_log_index.unwrap_or(0);
        let replication = m.replication.clone().unwrap_or_default();
        let members = self
            .members()
            .into_iter()
            .map(|(id, addr, voter)| {
                let matched = match id == self.id {
                    true => last,
                    false => replication
                        .get(&id)
                        .copied()
                        .flatten()
                        .map_or(0, |l| l.index),
                };
                MemberProgress {
                    id,
                    addr,
                    voter,
                    leader: m.current_leader == Some(id),
                    matched_index: matched,
                    lag: last.saturating_sub(matched),
                }
            })
            .collect();
        // Each namespace's counts from the groups holding its timers (a namespace's data
        // group, or group 0 without data groups), as this node's replicas applied them.
        let groups: Vec<&Arc<Node>> = nodes.each().collect();
        let mut by_name: std::collections::BTreeMap<String, NamespaceCounts> = Default::default();
        let mut held: std::collections::BTreeMap<String, Vec<&Arc<Node>>> = Default::default();
        for node in &groups {
            for (name, pending, stored) in node.store.counts_by_namespace()? {
                let counts = by_name.entry(name.clone()).or_default();
                counts.name = name.clone();
                counts.group = node.group();
                counts.pending += pending;
                counts.stored += stored;
                held.entry(name).or_default().push(node);
            }
        }
        for ns in self.store.namespaces(None, MAX_NAMESPACES)? {
            let entry = by_name.entry(ns.name.clone()).or_default();
            if entry.name.is_empty() {
                entry.group = nodes.group_of(&ns.name);
            }
            entry.name = ns.name;
            entry.configured = ns.configured;
            entry.paused = ns.policy.paused;
        }
        let mut namespaces: Vec<NamespaceCounts> =
            by_name.into_values().take(MAX_NAMESPACES).collect();
        if by_state {
            let mut budget = COUNT_BUDGET;
            for ns in &mut namespaces {
                let mut counts: Vec<(crate::timer::TimerState, u64)> = Vec::new();
                for node in held.get(&ns.name).into_iter().flatten() {
                    let c = node.store.count_states(&ns.name, budget)?;
                    budget -= c.read;
                    for (state, n) in c.counts {
                        match counts.iter_mut().find(|(s, _)| *s == state) {
                            Some((_, sum)) => *sum += n,
                            None => counts.push((state, n)),
                        }
                    }
                    ns.by_state_partial |= c.partial;
                }
                ns.by_state = Some(counts);
            }
        }
        Ok(Overview {
            leader_id: m.current_leader,
            term: m.current_term,
            last_log_index: last,
            commit_index: self.committed.load(Ordering::Relaxed),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            members,
            namespaces,
        })
    }
}
