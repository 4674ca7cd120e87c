//! The leader's pusher: one task per namespace with a push target (`namespace`).
//!
//! While this node leads, [`PushLoop`] looks at the namespaces each time an applied entry
//! changed one (`Store::namespace_changes`, and every [`REFRESH`] besides): it starts a
//! namespace task for each new push target, hands changed URLs, secrets, timeouts and rates to
//! the running one, and stops the task of a target that was removed. A request also checks,
//! as it starts, that the target it uses is the applied one (`Shared::current_target`). When
//! leadership is lost every task is dropped (requests in flight are abandoned: their leases
//! expire on the new leader, which pushes them again).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::pusher::{Pusher, Shared, Target, MAX_QUEUE};
use super::MAX_PUSH_IN_FLIGHT;
use crate::namespace::PushTarget;

/// How often the namespaces are read for push targets without a change (a safety net: changes
/// wake the loop as they are applied).
const REFRESH: Duration = Duration::from_secs(5);
/// Namespaces read per page when looking for push targets.
const PAGE: usize = 1000;

/// A namespace's push target and its dispatch rate and burst, as the pusher reads them.
type PushConfig = (PushTarget, Option<(u32, u32)>);

/// A running namespace task; dropping it stops the task and abandons its requests.
struct Active {
    config: PushConfig,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The leader's pusher for one node.
pub struct PushLoop {
    pub pusher: Pusher,
}

impl PushLoop {
    /// Runs until `shutdown` turns true, pushing while this node leads.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        let node = self.pusher.node.clone();
        node.while_leader("pusher", shutdown, || self.lead()).await;
    }

    async fn lead(&self) {
        let mut active: HashMap<String, Active> = HashMap::new();
        let mut changes = self.pusher.node.namespace_changes();
        loop {
            let read_at = *changes.borrow_and_update();
            match self.targets() {
                Ok(targets) => self.update(&mut active, targets, read_at),
                Err(e) => tracing::warn!(error = %e, "pusher: cannot read the namespaces"),
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(REFRESH) => {}
            }
        }
    }

    /// Every namespace's push target, with its dispatch rate and burst.
    fn targets(&self) -> crate::Result<HashMap<String, PushConfig>> {
        let mut out = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .pusher
                .node
                .applied_namespaces(after.as_deref(), PAGE)?;
            let last = page.last().map(|ns| ns.name.clone());
            for ns in page {
                if let Some(push) = ns.push {
                    let rate = ns.policy.dispatch_limit();
                    out.insert(ns.name, (push, rate));
                }
            }
            match last {
                Some(name) => after = Some(name),
                None => return Ok(out),
            }
        }
    }

    fn update(
        &self,
        active: &mut HashMap<String, Active>,
        targets: HashMap<String, PushConfig>,
        read_at: u64,
    ) {
        active.retain(|ns, a| {
            let keep = targets.contains_key(ns);
            if !keep {
                tracing::info!(namespace = ns, url = a.config.0.url, "push target removed");
            }
            keep
        });
        for (ns, config) in targets {
            let Some(target) = Target::from(&config.0, config.1) else {
                tracing::error!(
                    namespace = ns,
                    "push target with an unreadable secret or URL"
                );
                continue;
            };
            match active.get_mut(&ns) {
                Some(a) if a.config == config => {}
                Some(a) => {
                    tracing::info!(namespace = ns, url = config.0.url, "push target changed");
                    a.shared.set_target(target);
                    a.config = config;
                }
                None => {
                    tracing::info!(namespace = ns, url = config.0.url, "pushing");
                    let shared = Arc::new(Shared::new(&ns, target, read_at));
                    // Made with room for the queue; the task sizes it to the receiver's pace.
                    let room = MAX_PUSH_IN_FLIGHT + MAX_QUEUE;
                    let sub = self.pusher.node.subscribe(&ns, "pusher", room, true);
                    let task = tokio::spawn(self.pusher.clone().namespace(shared.clone(), sub));
                    active.insert(
                        ns,
                        Active {
                            config,
                            shared,
                            task,
                        },
                    );
                }
            }
        }
    }
}
