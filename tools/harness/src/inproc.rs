//! [`TestCluster`]: real timerdb nodes in this process — RocksDB in a tempdir, openraft, tonic
//! on loopback ephemeral ports — with a hand inside each (its `RunningNode`: the Raft handle,
//! the store) that a process cluster cannot offer. Nodes stop as a crashed process would (the
//! others see them gone) and restart on their data dir and address.
//!
//! Its calls assert: a test stops at the first surprise.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{
    cluster_client::ClusterClient, namespaces_client::NamespacesClient, timers_client::TimersClient,
};
use timerdb::config::NodeConfig;
use timerdb::node::Leader;
use timerdb::server::{self, RunningNode};
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::calls::NS;

/// Logs at `warn` (or `RUST_LOG`) into the test's captured output; once per process.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,openraft=error".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A cluster of in-process nodes.
pub struct TestCluster {
    pub dir: TempDir,
    pub peers: BTreeMap<u64, String>,
    pub nodes: BTreeMap<u64, Option<RunningNode>>,
    tune: Tune,
}

/// How a test adjusts each node's configuration.
pub type Tune = std::sync::Arc<dyn Fn(&mut NodeConfig) + Send + Sync>;

impl TestCluster {
    /// Starts `n` nodes with the default configuration and waits for a leader.
    pub async fn start(n: u64) -> TestCluster {
        Self::start_with(n, |_| {}).await
    }

    /// Starts `n` nodes, each configuration adjusted by `tune`, and waits for a leader.
    pub async fn start_with(
        n: u64,
        tune: impl Fn(&mut NodeConfig) + Send + Sync + 'static,
    ) -> TestCluster {
        let tune: Tune = std::sync::Arc::new(tune);
        init_tracing();
        let dir = TempDir::new().unwrap();
        let mut listeners = BTreeMap::new();
        for id in 1..=n {
            listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let peers: BTreeMap<u64, String> = listeners
            .iter()
            .map(|(id, l)| (*id, l.local_addr().unwrap().to_string()))
            .collect();
        let mut cluster = TestCluster {
            dir,
            peers,
            nodes: BTreeMap::new(),
            tune,
        };
        for (id, listener) in listeners {
            let node = server::start(cluster.config(id), listener).await.unwrap();
            cluster.nodes.insert(id, Some(node));
        }
        cluster.leader().await;
        cluster.settle_level().await;
        cluster
    }

    /// When every node runs this build's feature level, waits until the leader committed it
    /// (its `RaiseLevel` entry, `cluster/level.rs`), so a test that counts log entries from
    /// here does not count that one.
    async fn settle_level(&self) {
        let level = timerdb::command::LEVEL;
        let ids = self.running();
        if ids
            .iter()
            .any(|id| self.node(*id).node.config().level < level)
        {
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while ids
            .iter()
            .any(|id| self.node(*id).store.committed_level() < level)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the feature level was never committed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn config(&self, id: u64) -> NodeConfig {
        let mut c = NodeConfig::new(
            id,
            self.dir.path().join(format!("n{id}")),
            self.peers.clone(),
        );
        // Generous: a busy CI machine can take seconds to settle an election.
        c.leader_wait = Duration::from_secs(10);
        c.write_timeout = Duration::from_secs(5);
        // The tests' push receivers listen on loopback.
        c.push_allow_private = true;
        (self.tune)(&mut c);
        c
    }

    pub fn node(&self, id: u64) -> &RunningNode {
        self.nodes[&id].as_ref().expect("node is stopped")
    }

    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Waits until a running node leads and every running node agrees; returns its id.
    pub async fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let running = self.running();
            let leaders: Vec<u64> = running
                .iter()
                .copied()
                .filter(|id| self.node(*id).node.leader() == Leader::Me)
                .collect();
            if let [leader] = leaders[..] {
                let agreed = running.iter().all(|id| {
                    self.node(*id)
                        .raft
                        .metrics()
                        .borrow_watched()
                        .current_leader
                        == Some(leader)
                });
                if agreed {
                    return leader;
                }
            }
            assert!(Instant::now() < deadline, "no leader elected within 20 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A running node that is not the leader.
    pub async fn follower(&self) -> u64 {
        let leader = self.leader().await;
        *self
            .running()
            .iter()
            .find(|id| **id != leader)
            .expect("no follower running")
    }

    pub async fn channel(&self, id: u64) -> Channel {
        let addr = format!("http://{}", self.peers[&id]);
        tonic::transport::Endpoint::from_shared(addr)
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn client(&self, id: u64) -> TimersClient<Channel> {
        TimersClient::new(self.channel(id).await)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
    }

    pub async fn namespaces(&self, id: u64) -> NamespacesClient<Channel> {
        NamespacesClient::new(self.channel(id).await)
    }

    /// Stops a node (its process would be gone: the others see it as dead).
    pub async fn stop(&mut self, id: u64) {
        let node = self
            .nodes
            .get_mut(&id)
            .unwrap()
            .take()
            .expect("already stopped");
        node.shutdown().await;
    }

    /// Restarts a stopped node on its data dir and address.
    pub async fn restart(&mut self, id: u64) {
        let listener = bind_retrying(&self.peers[&id]).await;
        let node = server::start(self.config(id), listener).await.unwrap();
        self.nodes.insert(id, Some(node));
    }

    /// Starts node `id` on a fresh address with `--join`: it waits to be added (AddNode).
    /// Returns its address.
    pub async fn join(&mut self, id: u64) -> String {
        self.join_with(id, |_| {}).await
    }

    /// [`TestCluster::join`], the node's configuration adjusted by `tune` first.
    pub async fn join_with(&mut self, id: u64, tune: impl FnOnce(&mut NodeConfig)) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        self.peers.insert(id, addr.clone());
        let mut config = self.config(id);
        config.peers = BTreeMap::from([(id, addr.clone())]);
        config.join = true;
        tune(&mut config);
        let node = server::start(config, listener).await.unwrap();
        self.nodes.insert(id, Some(node));
        addr
    }

    pub async fn cluster(&self, id: u64) -> ClusterClient<Channel> {
        ClusterClient::new(self.channel(id).await)
    }

    /// Waits until every running node applied the same index with the same state digest, in
    /// every group (group 0 and the data groups); returns group 0's.
    pub async fn converged(&self) -> (u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let digests: Vec<Vec<(u64, u64)>> = self
                .running()
                .iter()
                .map(|id| {
                    let node = self.node(*id);
                    let stores =
                        std::iter::once(&node.store).chain(node.groups.iter().map(|g| &g.store));
                    stores.map(|s| s.digest().unwrap()).collect()
                })
                .collect();
            if digests.windows(2).all(|w| w[0] == w[1]) {
                return digests[0][0];
            }
            assert!(
                Instant::now() < deadline,
                "replicas did not converge: {digests:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reads a timer straight from one node's state machine (no Raft round).
    pub fn local_timer(&self, id: u64, tid: &str) -> Option<timerdb::timer::Timer> {
        let key = timerdb::timer::TimerKey::new(NS, tid);
        self.node(id).store.get(&key).unwrap()
    }

    pub async fn shutdown(mut self) {
        for id in self.running() {
            self.stop(id).await;
        }
    }
}

async fn bind_retrying(addr: &str) -> TcpListener {
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot bind {addr} again");
}
