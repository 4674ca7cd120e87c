//! A node's operations on namespaces, in domain terms: their policy and push target go through
//! the log like every change (a push target's signing secret is generated here, on the leader,
//! so the log carries it); reads follow the read barrier.

use super::{unexpected, Node};
use crate::command::{Command, Response};
use crate::namespace::{Namespace, Policy, PushTarget};
use crate::Result;

impl Node {
    /// Replicates a namespace's policy and push target (already validated). The paused flag
    /// is kept (pause and resume have their own command); a push target given without secrets
    /// keeps the namespace's current ones, or gets a new one generated here, on the leader, so
    /// the log carries it and every replica stores the same.
    pub async fn put_namespace(
        &self,
        name: String,
        policy: Policy,
        push: Option<PushTarget>,
    ) -> Result<Namespace> {
        let cmd = self.namespace_entry(name, policy, push)?;
        match self.write(cmd).await? {
            Response::Namespace(ns) => Ok(ns),
            other => Err(unexpected(other)),
        }
    }

    /// The entry [`Node::put_namespace`] proposes. It reads nothing of this node's state:
    /// what the call keeps (the paused flag; the secrets, when none are given) is resolved as
    /// the entry applies, so a Pause or a rotation committed meanwhile is not undone. (While
    /// a member's build predates that form, the older one, which reads them here.)
    pub fn namespace_entry(
        &self,
        name: String,
        mut policy: Policy,
        mut push: Option<PushTarget>,
    ) -> Result<Command> {
        if self.cluster_level() < 1 {
            let current = self.store.namespace(&name)?;
            policy.paused = current.policy.paused;
            if let Some(target) = push.as_mut().filter(|t| t.secrets.is_empty()) {
                target.secrets = match current.push {
                    Some(old) => old.secrets,
                    None => vec![crate::namespace::sign::Secret::generate()],
                };
            }
            if let Some(target) = &push {
                target.validate(&policy)?;
            }
            let misfire = policy.misfire;
            return Ok(Command::SetNamespace {
                name,
                policy,
                push,
                misfire,
            });
        }
        let mut keep_secrets = false;
        if let Some(target) = push.as_mut() {
            if target.secrets.is_empty() {
                keep_secrets = true;
                target.secrets = vec![crate::namespace::sign::Secret::generate()];
            }
            target.validate(&policy)?;
        }
        Ok(Command::ConfigureNamespace {
            name,
            misfire: policy.misfire,
            policy,
            push,
            keep_secrets,
        })
    }

    /// Pauses (or resumes) the dispatching of a namespace's fired timers.
    pub async fn pause_namespace(&self, name: String, paused: bool) -> Result<Namespace> {
        match self.write(Command::PauseNamespace { name, paused }).await? {
            Response::Namespace(ns) => Ok(ns),
            other => Err(unexpected(other)),
        }
    }

    /// Linearizable read of a namespace (the default policy if never configured).
    pub async fn namespace(&self, name: &str) -> Result<Namespace> {
        self.read_barrier().await?;
        self.store.namespace(name)
    }

    /// Linearizable page of configured namespaces.
    pub async fn namespaces(&self, after: Option<&str>, limit: usize) -> Result<Vec<Namespace>> {
        self.read_barrier().await?;
        self.store.namespaces(after, limit)
    }
}
