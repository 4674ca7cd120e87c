//! Backups, taken online: the leader's snapshot of a state that holds every acknowledged write.
//!
//! A backup is the file of a snapshot (see `storage::snapshot_file`), so taking one costs what a
//! scheduled snapshot costs and nothing new has to be kept consistent. What a backup adds is a
//! promise about *which* state it holds: every write acknowledged before `Cluster.Backup` was
//! called. The leader gets it with a ReadIndex round (`read_barrier`: it still leads, and has
//! applied everything committed), notes its applied index, and then serves the current
//! snapshot once that snapshot covers the index, asking openraft for a new one if it does not.
//!
//! The file handle is opened before it is streamed, so a newer snapshot replacing it meanwhile
//! (which unlinks the old file) cannot cut a backup short. Restoring is offline:
//! `storage::restore`.

use std::time::Duration;
use tokio::time::Instant;

use openraft::async_runtime::WatchReceiver as _;

use super::Node;
use crate::storage::Snapshot;
use crate::{Error, Result};

/// How long a backup waits for a snapshot that covers it to be built.
const BUILD_WAIT: Duration = Duration::from_secs(600);
/// How often the wait asks openraft again (a request made while a build runs is dropped).
const RETRIGGER: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

impl Node {
    /// A snapshot holding every write acknowledged before the call; this node must lead.
    pub async fn backup(&self) -> Result<Snapshot> {
        if self.config.groups > 0 {
            // A backup is one group's snapshot: it would hold none of the data groups' state,
            // and a restore refuses it.
            return Err(Error::FailedPrecondition(format!(
                "cannot back up a cluster of {} data groups: a backup holds one group's state \
                 (backups of every group: docs/sharding.md §12)",
                self.config.groups
            )));
        }
        self.read_barrier().await?;
        let need = self
            .raft
            .metrics()
            .borrow_watched()
            .last_applied
            .map_or(0, |l| l.index);
        let deadline = Instant::now() + BUILD_WAIT;
        let mut asked: Option<Instant> = None;
        loop {
            if let Some(snap) = self.snapshots.current().await? {
                if snap.meta.last_log_id.map_or(0, |l| l.index) >= need {
                    return Ok(snap);
                }
            }
            if asked.is_none_or(|t| t.elapsed() >= RETRIGGER) {
                self.raft
                    .trigger()
                    .snapshot()
                    .await
                    .map_err(|e| Error::Unavailable(format!("cannot start a snapshot: {e}")))?;
                asked = Some(Instant::now());
            }
            if Instant::now() >= deadline {
                return Err(Error::Unavailable(format!(
                    "no snapshot up to index {need} was built within {BUILD_WAIT:?}"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
