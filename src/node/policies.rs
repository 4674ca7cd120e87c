//! Namespaces' configurations in the data groups' logs (docs/sharding.md §2, §12 step 4d).
//!
//! PutNamespace, PauseNamespace and ResumeNamespace commit in group 0, which versions each
//! namespace's configuration by the index of the entry that last changed it
//! (`storage/namespaces.rs`). A data group's apply may not read group 0's state (on each node
//! group 0 applies at its own pace: DESIGN 8), so each data group keeps its own copy, carried
//! by its own log: while this node leads a data group, [`Node::copy_policies`] proposes a
//! `Policy` entry for every namespace the group owns whose configuration in this node's
//! replica of group 0 is newer than the group's copy — at once when group 0 applies a change,
//! and every few seconds besides (a proposal lost to a leader change, a replica of group 0
//! that was behind). A copy is applied only if newer than the group's, so proposing one twice,
//! or two leaders proposing out of order, leaves the newest.
//!
//! The change is acknowledged only once the owning group has it ([`Nodes::namespace_applied`],
//! on the node that committed it in group 0): a Schedule acknowledged after a PutNamespace was
//! acknowledged is applied under its policy.

use std::time::Duration;

use super::{Node, Nodes};
use crate::command::Command;
use crate::keys::{SlotMap, GROUP_ZERO};
use crate::namespace::Namespace;
use crate::storage::Store;
use crate::{Error, Result};

/// How often a data group's leader compares its copies with group 0's without being woken.
const RECHECK: Duration = Duration::from_secs(5);
/// Namespaces read per page of group 0's.
const PAGE: usize = 1000;
/// Copies proposed at once (the proposer batches them into shared entries).
const IN_FLIGHT: usize = 64;

impl Node {
    /// While this node leads its (data) group: keeps the group's copies of its namespaces'
    /// configurations up with `meta`, this node's replica of group 0 (see the module essay).
    pub async fn copy_policies(&self, meta: &Store, map: SlotMap) {
        let mut changes = meta.namespace_changes();
        loop {
            changes.borrow_and_update();
            if let Err(e) = self.copy_once(meta, map).await {
                tracing::warn!(group = self.group(), error = %e, "copying namespace policies");
            }
            let _ = tokio::time::timeout(RECHECK, changes.changed()).await;
        }
    }

    /// One pass over group 0's namespaces: proposes every copy this group lacks.
    async fn copy_once(&self, meta: &Store, map: SlotMap) -> Result<()> {
        if self.cluster_level() < 2 {
            return Ok(()); // a member cannot read `Policy` yet: the level raiser comes first
        }
        let mut after: Option<String> = None;
        loop {
            let page = meta.versioned_namespaces(after.as_deref(), PAGE)?;
            let Some((last, _)) = page.last() else {
                return Ok(());
            };
            after = Some(last.name.clone());
            let mut stale = Vec::new();
            for (ns, version) in page {
                let ours = map.group_of(&ns.name) == self.group();
                if ours && version > self.store.policy_version(&ns.name)? {
                    stale.push((ns, version));
                }
            }
            for chunk in stale.chunks(IN_FLIGHT) {
                let writes = chunk.iter().map(|(ns, v)| self.write(copy_of(ns, *v)));
                for written in futures::future::join_all(writes).await {
                    written?;
                }
            }
        }
    }
}

/// The `Policy` entry carrying `ns` at `version`.
fn copy_of(ns: &Namespace, version: u64) -> Command {
    Command::Policy {
        name: ns.name.clone(),
        version,
        policy: ns.policy,
        push: ns.push.clone(),
        misfire: ns.policy.misfire,
    }
}

impl Nodes {
    /// Waits until the group owning `name`'s timers has, on this node, a copy of `name`'s
    /// configuration at least as new as group 0's here (which holds the change this node just
    /// committed, or a later one). A cluster of one group: at once. Not within the write
    /// timeout: an unknown outcome for the caller (the change is committed in group 0 and
    /// reaches the group when it can: Get shows it; the call may be sent again).
    pub async fn namespace_applied(&self, name: &str) -> Result<()> {
        let group = self.group_of(name);
        if group == GROUP_ZERO {
            return Ok(());
        }
        let meta = self.meta();
        let want = meta.store.policy_version(name)?;
        let node = self.of(name)?;
        let mut changes = node.store.namespace_changes();
        let deadline = tokio::time::Instant::now() + meta.config().write_timeout;
        loop {
            changes.borrow_and_update();
            if node.store.policy_version(name)? >= want {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Err(Error::OutcomeUnknown(format!(
                    "namespace {name:?}'s change is committed, and group {group}, which holds \
                     its timers, did not apply it within {:?}: it will (GetNamespace shows the \
                     change); until then that group's timers follow the namespace's previous \
                     configuration",
                    meta.config().write_timeout
                )));
            }
        }
    }
}
