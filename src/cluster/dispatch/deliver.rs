//! The leader's Deliver entries: while this node leads, a loop that plans grants for the
//! subscriptions with room (timers waiting since before they subscribed, redeliveries, room
//! freed by acks) when no Fire entry carries them, proposes them and hands the leases out.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Dispatcher;
use crate::clock::Clock;
use crate::cluster::workers::while_leader;
use crate::cluster::Raft;
use crate::command::{Command, Response};
use crate::raft_types::NodeId;
use crate::storage::{FireSignal, Hold, Store};
use crate::Result;

/// How often the loop looks again without a signal: unsettled deliveries whose deadline passed
/// free their room by time alone.
const TICK: Duration = Duration::from_millis(100);
/// Pause after an error before trying again.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The leader's dispatch loop for one node: Deliver entries for subscriptions with room while
/// no Fire entry carries their grants (timers waiting since before they subscribed, redeliveries,
/// room freed by acks).
pub struct DispatchLoop {
    pub id: NodeId,
    pub raft: Raft,
    pub store: Store,
    pub clock: Clock,
    pub signal: Arc<FireSignal>,
    pub dispatcher: Arc<Dispatcher>,
    /// Closed while leadership is handed over.
    pub hold: Hold,
}

impl DispatchLoop {
    /// Runs until `shutdown` turns true, dispatching while this node leads.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        while_leader(self.id, &self.raft, "dispatcher", shutdown, || self.lead()).await;
    }

    async fn lead(&self) {
        loop {
            match self.round().await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "dispatcher: round failed");
                    tokio::time::sleep(ERROR_BACKOFF).await;
                }
            }
            // Time alone frees room only for a subscription: with none (an idle data group,
            // docs/sharding.md §7), a new one wakes the loop (`Dispatcher::subscribe`).
            let ticks = self.dispatcher.has_subscriptions();
            tokio::select! {
                _ = self.signal.ready_notified() => {}
                _ = self.dispatcher.wake.notified() => {}
                _ = tokio::time::sleep(TICK), if ticks => {}
            }
        }
    }

    /// One Deliver entry; true if it delivered anything (so more may be waiting).
    async fn round(&self) -> Result<bool> {
        let now_ms = self.clock.now_ms();
        let waiting = |ns: &str| self.store.has_ready(ns).unwrap_or(false);
        let term = self.raft.metrics().borrow_watched().current_term;
        let plan = self.dispatcher.plan(now_ms, term, Some(&waiting));
        if plan.is_empty() {
            return Ok(false);
        }
        self.hold.pass().await;
        let cmd = Command::Deliver {
            now_ms,
            grants: plan.grants().to_vec(),
        };
        let reply = match crate::cluster::propose::client_write(&self.raft, cmd.into()).await {
            Ok(reply) => reply,
            Err(e) => {
                plan.release();
                return Err(crate::Error::Unavailable(e.to_string()));
            }
        };
        match reply.data {
            Response::Delivered(leases) => {
                let sent = plan.hand_out(&self.store, leases);
                tracing::debug!(sent, "delivered");
                Ok(sent > 0)
            }
            other => {
                plan.release();
                Err(crate::Error::Internal(format!(
                    "unexpected Deliver response {other:?}"
                )))
            }
        }
    }
}
