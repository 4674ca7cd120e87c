//! The cluster as its leader sees it, for dashboards (`Cluster.Overview`, the web console):
//! each member's replication progress from openraft's metrics, and each namespace's counts from
//! the applied state. Runs on the leader (the forwarding layer sends it there); read from local
//! state without a round to the followers, so it is a recent view, not a linearizable one.

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
    pub fn overview(&self, by_state: bool) -> Result<Overview> {
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
        let mut by_name: std::collections::BTreeMap<String, NamespaceCounts> = self
            .store
            .counts_by_namespace()?
            .into_iter()
            .map(|(name, pending, stored)| {
                let counts = NamespaceCounts {
                    name: name.clone(),
                    pending,
                    stored,
                    ..Default::default()
                };
                (name, counts)
            })
            .collect();
        for ns in self.store.namespaces(None, MAX_NAMESPACES)? {
            let entry = by_name.entry(ns.name.clone()).or_default();
            entry.name = ns.name;
            entry.configured = ns.configured;
            entry.paused = ns.policy.paused;
        }
        let mut namespaces: Vec<NamespaceCounts> =
            by_name.into_values().take(MAX_NAMESPACES).collect();
        if by_state {
            let mut budget = COUNT_BUDGET;
            for ns in &mut namespaces {
                let c = self.store.count_states(&ns.name, budget)?;
                budget -= c.read;
                ns.by_state = Some(c.counts);
                ns.by_state_partial = c.partial;
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
