//! The prologue every workload shares ([`Target::scene`]): the leader it loads through, a
//! namespace of its own (created with a policy when the workload needs one), and consumers
//! given time to subscribe before the load starts.

use std::time::Duration;

use timerdb::api::pb::{self, namespaces_client::NamespacesClient};

use crate::consume::Consumers;
use crate::target::{now_ms, Target};
use crate::Opts;

/// Where a workload starts: the leader it loads through and a namespace of its own.
pub struct Scene {
    pub leader: u64,
    /// `<workload>-<ms>`: fresh for every measurement, so no run sees another's timers.
    pub ns: String,
}

impl Target {
    /// The prologue every workload shares: waits for a leader, names a fresh namespace for
    /// `workload` and, given a `policy`, creates the namespace with it through the leader.
    pub async fn scene(
        &self,
        workload: &str,
        policy: Option<pb::NamespacePolicy>,
    ) -> anyhow::Result<Scene> {
        let leader = self.wait_leader(Duration::from_secs(10)).await?;
        let ns = format!("{workload}-{}", now_ms());
        if let Some(policy) = policy {
            let req = pb::PutNamespaceRequest {
                name: ns.clone(),
                policy: Some(policy),
            };
            NamespacesClient::new(self.channel(leader)?)
                .put_namespace(req)
                .await?;
        }
        Ok(Scene { leader, ns })
    }
}

impl Scene {
    /// `opts.consumers` consumers of the namespace on `homes`, given 300 ms to subscribe
    /// before the load starts.
    pub async fn consumers_on(
        &self,
        target: &Target,
        opts: &Opts,
        homes: &[u64],
    ) -> anyhow::Result<Consumers> {
        let consumers = Consumers::start(target, &self.ns, homes, opts.consumer_ack).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(consumers)
    }

    /// [`Scene::consumers_on`] the leader, `opts.consumers` of them.
    pub async fn consumers(&self, target: &Target, opts: &Opts) -> anyhow::Result<Consumers> {
        let homes = vec![self.leader; opts.consumers];
        self.consumers_on(target, opts, &homes).await
    }
}
