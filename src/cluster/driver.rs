//! The fire driver: the leader's only worker that turns wall-clock time into log entries.
//!
//! When it runs: while this node is the leader (it watches openraft's metrics), one task per
//! node. What it does: look up when something next comes due (the earliest row after the fire
//! cursor, or the earliest lease deadline), sleep until then (or until the state machine
//! signals that something earlier was written), then propose `Fire { now_ms }` with the
//! leader's clock. Each Fire passes at most `max_fires_per_entry` rows; while more are due it
//! proposes back to back. Each Fire also carries the dispatcher's grants for the subscriptions
//! with room, so the entry that fires a timer hands it out too. Nothing is due ⇒ nothing is
//! proposed: an idle cluster writes no log entries (DESIGN 7).
//!
//! On becoming leader it first calls `ensure_linearizable`, so every entry of earlier terms is
//! applied before it reads the wheel; timers that came due during the election then fire at
//! once (deadlines are absolute, never reset).
//!
//! How it stops: when leadership is lost the leading future is dropped (all its awaits are
//! cancel-safe: a dropped proposal may still commit, which is harmless because the cursor only
//! moves forward and only due timers fire), and the whole task ends on shutdown.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use super::workers::while_leader;
use tokio::sync::watch;

use super::Raft;
use crate::clock::Clock;
use crate::command::{Command, Response};
use crate::raft_types::NodeId;
use crate::storage::{FireSignal, Store};

/// The leader's fire loop for one node.
pub struct FireDriver {
    pub id: NodeId,
    pub raft: Raft,
    pub store: Store,
    pub clock: Clock,
    pub signal: Arc<FireSignal>,
    /// Whose subscriptions each Fire entry grants leases to.
    pub dispatcher: Arc<super::Dispatcher>,
    pub max_fires_per_entry: u32,
    /// A deliberate bug for the chaos checker's proof (`Faults::fire_early_ms`); 0 in service.
    pub fire_early_ms: i64,
    /// Closed while leadership is handed over.
    pub hold: crate::storage::Hold,
    /// What the members read: Fire entries name this build's tzdb version
    /// (`FireWithZones`) once every member reads that form (`level.rs`) and runs this tzdb —
    /// then every replica moves series rows to these rules; while the members differ, bare
    /// `Fire`, whose rule is the row's (an upgraded replica of a changed zone stops there).
    pub levels: Arc<super::Levels>,
    pub config: Arc<crate::config::NodeConfig>,
}

/// Pause after an unexpected error before the driver tries again.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

impl FireDriver {
    /// Runs until `shutdown` turns true.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        while_leader(self.id, &self.raft, "fire driver", shutdown, || async {
            self.lead().await;
            // Leadership lost or an error: nobody sleeps on the wheel for now.
            self.signal.set_target(i64::MAX);
        })
        .await;
    }

    /// The leading loop; returns (to be restarted by `run`) after an error.
    async fn lead(&self) {
        loop {
            // Look with the target at MAX, so a schedule applied while we read wakes us.
            self.signal.set_target(i64::MAX);
            let next = match self.store.next_due() {
                Ok(next) => next,
                Err(e) => {
                    tracing::error!(error = %e, "fire driver: cannot read the wheel");
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            };
            let Some(due_ms) = next else {
                self.signal.scheduled_notified().await;
                continue;
            };
            let now_ms = self.clock.now_ms() + self.fire_early_ms;
            if now_ms < due_ms {
                self.signal.set_target(due_ms);
                tokio::select! {
                    _ = tokio::time::sleep(self.clock.until(due_ms - self.fire_early_ms)) => {}
                    _ = self.signal.scheduled_notified() => {}
                }
                continue;
            }
            if !self.fire(now_ms).await {
                tokio::time::sleep(ERROR_BACKOFF).await;
            }
        }
    }

    /// Proposes Fire entries until nothing more is due at `now_ms`; false on error.
    async fn fire(&self, now_ms: i64) -> bool {
        loop {
            self.hold.pass().await;
            let term = self.raft.metrics().borrow_watched().current_term;
            let plan = self.dispatcher.plan(now_ms, term, None);
            let (max, grants) = (self.max_fires_per_entry, plan.grants().to_vec());
            // One read of the membership for both questions (a Fire is proposed often).
            let members = super::level::members(&self.raft);
            let committed = self.store.committed_level();
            let level = (self.levels).proposable(
                committed,
                self.config.level,
                self.id,
                members.iter().copied(),
            );
            let named = level >= 1 && self.levels.same_tzdb(&self.config.tzdb, self.id, members);
            let cmd = match named {
                true => Command::FireWithZones {
                    tzdb: self.config.tzdb.clone(),
                    now_ms,
                    max,
                    grants,
                },
                false => Command::Fire {
                    now_ms,
                    max,
                    grants,
                },
            };
            match super::propose::client_write(&self.raft, cmd.into()).await {
                Ok(reply) => match reply.data {
                    Response::Fired {
                        count,
                        more,
                        leases,
                    } => {
                        let sent = plan.hand_out(&self.store, leases);
                        tracing::debug!(now_ms, count, more, sent, "fired");
                        if !more {
                            return true;
                        }
                    }
                    other => {
                        plan.release();
                        tracing::error!(?other, "fire driver: unexpected response");
                        return false;
                    }
                },
                Err(e) => {
                    plan.release();
                    tracing::warn!(error = %e, "fire driver: proposal failed");
                    return false;
                }
            }
        }
    }
}
