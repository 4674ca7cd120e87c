//! A leader's quorum: whether this node leads without having heard from a quorum lately, so
//! that writes and reads fail at once (NoQuorum) instead of waiting out their timeouts on a
//! leader cut off from its followers. One task watches openraft's metrics ([`quorum_watch`]);
//! every write in flight waits on the one flag it keeps. The same task notes when this node
//! began to lead in each term ([`Tenure`]): the schedule-rate buckets fill from then.

use openraft::async_runtime::WatchReceiver as _;
use openraft::ServerState;

use super::Node;
use crate::cluster::rest::Silence;
use crate::cluster::Raft;
use crate::{Error, Result};

/// Watches openraft's metrics in one task and says when this leader loses (or regains) its
/// quorum. Every write in flight waits on this one flag: subscribed to the metrics instead,
/// each of them would be woken and would count the voters again at every metrics change —
/// several per entry — which cost a leader with 200 writes in flight ~2 % of its CPU.
pub fn quorum_watch(
    raft: &Raft,
    (clock, mut resting): (crate::clock::Clock, tokio::sync::watch::Receiver<Silence>),
    tenure: std::sync::Arc<Tenure>,
) -> tokio::sync::watch::Receiver<bool> {
    let mut metrics = raft.metrics();
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        // A group that never rests (group 0, a node of one group) may drop its sender: its
        // last word stands, and this watch goes on.
        let mut resting_open = true;
        loop {
            let silence = *resting.borrow_and_update();
            let (lost, leads) = {
                let m = metrics.borrow_and_update();
                let leads = m.state == ServerState::Leader;
                if leads {
                    tenure.began(m.current_term, || clock.now_ms());
                }
                (quorum_lost(&m, silence).is_some(), leads)
            };
            tx.send_if_modified(|was| std::mem::replace(was, lost) != lost);
            // The age of the last quorum ack grows while the metrics stay still (an isolated
            // leader publishes nothing new): a leader looks again at least every 100 ms. A
            // follower, or a leader whose group rests, has no such age to watch.
            let look_again = leads && silence != Silence::Resting;
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                changed = resting.changed(), if resting_open => resting_open = changed.is_ok(),
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)), if look_again => {}
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

/// When this node began to lead, in the latest term it led (as the quorum watch saw it
/// become leader, within a metrics change of its election).
#[derive(Default)]
pub struct Tenure(std::sync::Mutex<Option<(u64, i64)>>);

impl Tenure {
    /// Notes that this node leads in `term`: from `now_ms()` if that term is new to it.
    fn began(&self, term: u64, now_ms: impl FnOnce() -> i64) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_none_or(|(known, _)| known != term) {
            *t = Some((term, now_ms()));
        }
    }

    /// When this node began to lead in `term`, if it has.
    pub fn since(&self, term: u64) -> Option<i64> {
        let t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        t.filter(|(known, _)| *known == term)
            .map(|(_, since)| since)
    }
}

// Defined with the cluster (its proposer retries within it); named here as the node's rule.
pub use crate::cluster::QUORUM_LOST_AFTER;

/// A leader cut off from its quorum for `.0` ms.
pub(super) struct QuorumLost(u64);

impl QuorumLost {
    /// For a write that may already be in the log: its outcome is unknown.
    pub(super) fn unknown_outcome(self) -> Error {
        Error::OutcomeUnknown(format!(
            "this leader has heard from no quorum for {} ms; the write's outcome is unknown",
            self.0
        ))
    }
}

impl From<QuorumLost> for Error {
    fn from(q: QuorumLost) -> Error {
        Error::NoQuorum(format!(
            "this leader has heard from no quorum for {} ms (is it cut off?); try another node",
            q.0
        ))
    }
}

/// Whether `m` shows a leader of more than one voter that has not heard from a quorum for
/// longer than [`QUORUM_LOST_AFTER`] — counted, for a leader that rested (`cluster::rest`:
/// it sends no heartbeats, so hears nothing back), from when it woke at most; a write wakes
/// it, and fails NoQuorum within that second if no quorum answers.
fn quorum_lost(m: &crate::raft_types::RaftMetrics, silence: Silence) -> Option<QuorumLost> {
    let voters = m.membership_config.membership().voter_ids().count();
    // An absolute instant (openraft 0.10): the age is as of now, not of the last publication.
    let acked = openraft::Instant::elapsed(&*m.last_quorum_acked?);
    let since = match silence {
        Silence::Heard => acked,
        Silence::Resting => return None,
        Silence::WokeAt(woke) => acked.min(woke.elapsed()),
    }
    .as_millis() as u64;
    (m.state == ServerState::Leader && voters > 1 && since > QUORUM_LOST_AFTER.as_millis() as u64)
        .then_some(QuorumLost(since))
}

impl Node {
    /// Refuses at once when this node leads but has not heard from a quorum for
    /// [`QUORUM_LOST_AFTER`] (openraft 0.9 has no CheckQuorum: an isolated leader would keep
    /// taking proposals that can never commit, each waiting out the write timeout).
    pub(super) fn check_quorum(&self) -> Result<()> {
        let lost = quorum_lost(
            &self.raft.metrics().borrow_watched(),
            *self.resting.borrow(),
        );
        match lost {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Whether the task that watches this node's quorum still runs (while it does, writes in
    /// flight fail within [`QUORUM_LOST_AFTER`] of a lost quorum, not at their timeout).
    pub fn quorum_watch_runs(&self) -> bool {
        self.quorum_lost.has_changed().is_ok()
    }

    /// Resolves once this leader has gone [`QUORUM_LOST_AFTER`] without a quorum.
    pub(super) async fn quorum_lost(&self) -> QuorumLost {
        let mut flag = self.quorum_lost.clone();
        loop {
            if flag.wait_for(|lost| *lost).await.is_err() {
                // Raft stopped: other errors will say so.
                return std::future::pending().await;
            }
            let resting = *self.resting.borrow();
            if let Some(lost) = quorum_lost(&self.raft.metrics().borrow_watched(), resting) {
                return lost;
            }
            // Regained between the flag and this look: wait for the next loss.
            if flag.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A leader of three voters whose last quorum acknowledgement is `ago` old.
    fn leader_acked(ago: Duration) -> crate::raft_types::RaftMetrics {
        let mut m = crate::raft_types::RaftMetrics::new_initial(1);
        m.state = ServerState::Leader;
        let voters = [1, 2, 3].into_iter().collect();
        let nodes: std::collections::BTreeMap<u64, openraft::BasicNode> = [1, 2, 3]
            .map(|id| (id, openraft::BasicNode::new(format!("n{id}"))))
            .into();
        let membership = openraft::Membership::new(vec![voters], nodes).unwrap();
        m.membership_config =
            std::sync::Arc::new(openraft::StoredMembership::new(None, membership));
        let at = <openraft_rt_tokio::TokioInstant as openraft::Instant>::now() - ago;
        m.last_quorum_acked = Some(at.into());
        m
    }

    /// A leader that rested heard from nobody for as long as it rested, and that is no lost
    /// quorum; once it woke, silence counts from its waking (review of 4f, MED 2: a group
    /// woken by one late confirmation answered NO_QUORUM though its quorum was healthy).
    #[test]
    fn silence_while_a_group_rests_or_just_after_it_woke_is_no_lost_quorum() {
        let long = leader_acked(Duration::from_secs(60));
        assert!(quorum_lost(&long, Silence::Heard).is_some());
        assert!(quorum_lost(&long, Silence::Resting).is_none());
        let woke = tokio::time::Instant::now() - Duration::from_millis(200);
        assert!(quorum_lost(&long, Silence::WokeAt(woke)).is_none());
        let woke = tokio::time::Instant::now() - Duration::from_millis(1_500);
        assert!(quorum_lost(&long, Silence::WokeAt(woke)).is_some());
        let fresh = leader_acked(Duration::from_millis(100));
        assert!(quorum_lost(&fresh, Silence::Heard).is_none());
    }
}
