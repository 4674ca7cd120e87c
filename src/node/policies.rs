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

/// How often a data group's leader compares its copies with group 0's without being woken
/// (only if the last pass failed: a copy it proposed may not have applied).
const RECHECK: Duration = Duration::from_secs(5);
/// How often it looks again while the group cannot take `Policy` yet (level below 2): the
/// level raiser commits it a moment after every member is heard.
const LEVEL_RECHECK: Duration = Duration::from_millis(250);
/// Namespaces read per page of group 0's.
const PAGE: usize = 1000;
/// Copies proposed at once (the proposer batches them into shared entries).
const IN_FLIGHT: usize = 64;

impl Node {
    /// While this node leads its (data) group: keeps the group's copies of its namespaces'
    /// configurations up with `meta`, this node's replica of group 0 (see the module essay).
    pub async fn copy_policies(&self, meta: &Store, map: SlotMap) {
        let mut changes = meta.namespace_changes();
        // Whether the last pass copied everything group 0 held then: within one leadership
        // the group's copies change only through this leader, so until group 0 changes
        // again there is nothing to read.
        let mut done = false;
        let mut changed = true;
        loop {
            changes.borrow_and_update();
            if changed || !done {
                done = match self.copy_once(meta, map).await {
                    Ok(done) => done,
                    Err(e) => {
                        let group = self.group();
                        tracing::warn!(group, error = %e, "copying namespace policies");
                        false
                    }
                };
            }
            let wait = match self.cluster_level() < 2 {
                true => LEVEL_RECHECK,
                false => RECHECK,
            };
            changed = match tokio::time::timeout(wait, changes.changed()).await {
                Ok(Ok(())) => true,
                Err(_) => false,
                Ok(Err(_)) => {
                    // The store is gone (the node is stopping): no wake-ups any more.
                    tokio::time::sleep(wait).await;
                    true
                }
            };
        }
    }

    /// One pass over group 0's namespaces: proposes every copy this group lacks. Whether it
    /// could (false: the group cannot take `Policy` yet).
    async fn copy_once(&self, meta: &Store, map: SlotMap) -> Result<bool> {
        if self.cluster_level() < 2 {
            return Ok(false); // a member cannot read `Policy` yet: the level raiser comes first
        }
        let mut after: Option<String> = None;
        loop {
            let page = meta.versioned_namespaces(after.as_deref(), PAGE)?;
            let Some((last, _)) = page.last() else {
                return Ok(true);
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

/// The `Policy` entry carrying `ns` at `version` (its misfire policy in its own field:
/// `Policy`'s encoding leaves it out, so the entry is as its followers decode it).
fn copy_of(ns: &Namespace, version: u64) -> Command {
    let mut policy = ns.policy;
    policy.misfire = Default::default();
    Command::Policy {
        name: ns.name.clone(),
        version,
        policy,
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
                let why = match node.store.committed_level() < 2 {
                    true => {
                        "a member has not shown it reads a data group's copy of a \
                             namespace (feature level 2: a build before it, or a member not \
                             heard from)"
                    }
                    false => {
                        "its leader has not copied it there yet (it copies what its \
                              replica of group 0 holds)"
                    }
                };
                return Err(Error::OutcomeUnknown(format!(
                    "namespace {name:?}'s change is committed in group 0 (GetNamespace shows \
                     it), and this node's replica of group {group}, which holds its timers, \
                     did not have it within {:?}: {why}. Until group {group} has it, its \
                     timers follow the namespace's previous configuration; send the call \
                     again to wait for it",
                    meta.config().write_timeout
                )));
            }
        }
    }
}
