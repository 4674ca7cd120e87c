//! What a leader owes the rest of the cluster: its predecessors' entries applied before it
//! answers from its applied state alone, and to its members entries they can read.
//!
//! openraft 0.9 elects a leader whose log holds every committed entry, but it applies them only
//! after the leader's own first (blank) entry commits. Until then a new leader's applied state
//! may lack what its predecessor acknowledged — an API key whose creation was answered OK, for
//! one. So a leader that has not yet applied an entry of its own term waits for it before it
//! refuses on the grounds of its applied state (`api/stack/auth.rs`: an unknown key), and answers
//! from it once that entry has applied: everything acknowledged before the election is there.
//!
//! And a leader proposes an entry form only if every member advertised a feature level that
//! reads it (`cluster/level.rs`); until then the older form of the same change.

use openraft::async_runtime::WatchReceiver as _;
use std::time::Duration;

use super::Node;
use crate::command::{Command, RecurringChange};
use crate::recurring::RuleSpec;
use crate::{Error, Result};

impl Node {
    /// Whether this node has applied an entry of its current term (on a leader: every entry
    /// acknowledged before it was elected is applied).
    pub fn applied_own_term(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        caught_up(&m)
    }

    /// The newest entry forms this node may propose: the committed feature level, or the
    /// lowest every member advertised if that is higher, never above this node's own.
    pub fn cluster_level(&self) -> u32 {
        let members = crate::cluster::level::members(&self.raft);
        let committed = self.store.committed_level();
        (self.levels).proposable(committed, self.config.level, self.id, members)
    }

    /// A series change as the members can read it: stamped with this build's zone rules
    /// (`ZoneRules`) once all can, bare before. Refused for a series in a time zone while a
    /// member advertises another tzdb version: its replica would stop at the entry (its
    /// rules may differ) — a client's call must not stop a node mid-upgrade.
    pub(super) fn recurring_entry(&self, change: RecurringChange) -> Result<Command> {
        if let Some(zone) = self.zone_of(&change)? {
            let members = crate::cluster::level::members(&self.raft);
            let own = &self.config.tzdb;
            if let Some((node, theirs)) = self.levels.other_tzdb(own, self.id, members.clone()) {
                return Err(Error::FailedPrecondition(format!(
                    "the members run different time-zone databases (tzdb {own} here, {theirs} \
                     on node {node}): a series in {zone} can be created, changed or resumed \
                     once every node runs one build (docs/recurrence.md)"
                )));
            }
            if !self.levels.same_tzdb(own, self.id, members) {
                // A member not heard from yet (just elected), or of a build before the
                // header: its rules are unknown. Nothing was proposed.
                return Err(Error::NotYet(format!(
                    "this leader does not know every member's time-zone database yet: a \
                     series in {zone} waits until it does (an older build's never tells: \
                     upgrade it first)"
                )));
            }
        }
        Ok(match self.cluster_level() >= 1 {
            true => Command::with_zone_rules(change),
            false => change.into_command(),
        })
    }

    /// The time zone whose rules `change` computes with, if any: its spec's, or for a resume
    /// the stored series' (read here only to refuse early; apply decides from its own state).
    fn zone_of(&self, change: &RecurringChange) -> Result<Option<String>> {
        let rule = match change {
            RecurringChange::Pause {
                key, paused: false, ..
            } => match self.store.recurring(key, 0)? {
                Some(view) => view.recurring.spec.recurrence.rule,
                None => return Ok(None),
            },
            RecurringChange::Pause { .. } => return Ok(None),
            _ => match change.spec() {
                Some(spec) => spec.recurrence.rule.clone(),
                None => return Ok(None),
            },
        };
        Ok(match rule {
            RuleSpec::Cron { zone, .. } => Some(zone),
            RuleSpec::Every { .. } => None,
        })
    }

    /// Whether this node leads, whether it applied an entry of its term, and the term (one
    /// borrow of the metrics: asked on every call).
    pub fn leader_view(&self) -> LeaderView {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        LeaderView {
            leads: m.current_leader == Some(self.id) && m.state == openraft::ServerState::Leader,
            caught_up: caught_up(&m),
            term: m.current_term,
        }
    }

    /// Waits until [`Node::applied_own_term`] holds, for `within` at most; whether it does.
    pub async fn until_applied_own_term(&self, within: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        let waited = tokio::time::timeout(within, metrics.wait_until(caught_up)).await;
        matches!(waited, Ok(Ok(_)))
    }
}

/// What [`Node::leader_view`] saw.
#[derive(Debug, Clone, Copy)]
pub struct LeaderView {
    pub leads: bool,
    pub caught_up: bool,
    pub term: u64,
}

impl LeaderView {
    /// The term, if this node was its leader and had applied an entry of it.
    pub fn judging_term(&self) -> Option<u64> {
        (self.leads && self.caught_up).then_some(self.term)
    }
}

fn caught_up(m: &crate::raft_types::RaftMetrics) -> bool {
    m.last_applied
        .is_some_and(|applied| applied.leader_id.term >= m.current_term)
}
