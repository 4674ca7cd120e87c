//! The purger: the leader's worker that deletes finished timers once their retention passed.
//!
//! When it runs: while this node leads, once a second. What it does: lets delivery cursors
//! pass finished rows no Fire entry will pass (`Store::passable`), asks the store, per
//! namespace, how far the leases from the purge floor have all settled a retention ago, and
//! proposes `Purge { namespace, through }` for each such range (at most [`MAX_ROWS`] timers per
//! entry, so one apply stays short). Apply checks the rule again; the purger only reads, so an
//! idle cluster with nothing to purge writes nothing. Its awaits are cancel-safe: a proposal
//! dropped when leadership moves may still commit, and a second purge of the same range finds
//! nothing to do.

use std::time::Duration;

use tokio::sync::watch;

use super::workers::while_leader;
use super::Raft;
use crate::clock::Clock;
use crate::command::{Command, Response};
use crate::raft_types::NodeId;
use crate::storage::Hold;
use crate::storage::Store;

impl Purger {
    /// Lets the delivery cursors pass finished rows that no Fire entry passes (their namespace
    /// fires nothing more): one Deliver of room-0 grants, applied like a Fire's pass leases.
    /// Without it such rows (a retry acked late, a timer expired by its misfire policy) would
    /// wait for the namespace's next fire to be purged, and their ids to be free again.
    async fn pass(&self) -> crate::Result<()> {
        let passable = self.store.passable()?;
        if passable.is_empty() {
            return Ok(());
        }
        let grants = passable
            .into_iter()
            .map(|namespace| crate::command::Grant {
                namespace,
                room: 0,
                push: false,
            })
            .collect();
        self.hold.pass().await;
        let cmd = Command::Deliver {
            now_ms: self.clock.now_ms(),
            grants,
        };
        super::propose::client_write(&self.raft, cmd.into())
            .await
            .map_err(|e| crate::Error::Unavailable(e.to_string()))?;
        Ok(())
    }
}

/// How often the purger looks.
const PERIOD: Duration = Duration::from_secs(1);
/// Most timers one Purge entry deletes.
pub const MAX_ROWS: u64 = 20_000;

pub struct Purger {
    pub id: NodeId,
    pub raft: Raft,
    pub store: Store,
    pub clock: Clock,
    pub hold: Hold,
    /// Least age of a finished row it deletes (`NodeConfig::purge_floor`).
    pub floor: Duration,
}

impl Purger {
    /// Runs until `shutdown` turns true, purging while this node leads.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        while_leader(self.id, &self.raft, "purger", shutdown, || self.lead()).await;
    }

    async fn lead(&self) {
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "purger: round failed");
            }
            tokio::time::sleep(PERIOD).await;
        }
    }

    async fn round(&self) -> crate::Result<()> {
        self.pass().await?;
        loop {
            let now_ms = self.clock.now_ms();
            let due = self.store.purgeable(now_ms, self.floor, MAX_ROWS)?;
            if due.is_empty() {
                return Ok(());
            }
            for (namespace, through, _) in due {
                self.hold.pass().await;
                let cmd = Command::Purge {
                    now_ms,
                    namespace: namespace.clone(),
                    through,
                };
                let reply = super::propose::client_write(&self.raft, cmd.into())
                    .await
                    .map_err(|e| crate::Error::Unavailable(e.to_string()))?;
                match reply.data {
                    Response::Purged(0) => return Ok(()), // not allowed after all: next round
                    Response::Purged(n) => tracing::debug!(namespace, n, "purged"),
                    other => {
                        return Err(crate::Error::Internal(format!(
                            "unexpected Purge response {other:?}"
                        )))
                    }
                }
            }
        }
    }
}
