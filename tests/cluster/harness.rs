//! Test harness: real timerdb nodes (RocksDB in tempdirs, openraft, tonic on 127.0.0.1
//! ephemeral ports) in this test process, plus gRPC clients to them.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{
    self, cluster_client::ClusterClient, namespaces_client::NamespacesClient,
    timers_client::TimersClient,
};
use timerdb::config::NodeConfig;
use timerdb::node::Leader;
use timerdb::server::{self, RunningNode};
use tokio::net::TcpListener;
use tonic::transport::Channel;

pub const NS: &str = "test";

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,openraft=error".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Prints what an attack got back, one line each (`grep '^attack |'` on a `--nocapture` run
/// collects them; docs/security.md's table of attacks came from there).
pub fn tried(attack: &str, got: &str) {
    println!("attack | {attack} | {got}");
}

/// A status as `tried` prints it: the code and the message a person reads (and, for a
/// transport failure, its causes).
pub fn status_text(s: &tonic::Status) -> String {
    let mut out = format!("{:?}: {}", s.code(), s.message());
    if let Some(cause) = std::error::Error::source(s) {
        out.push_str(" (");
        out.push_str(&error_chain(cause));
        out.push(')');
    }
    out
}

/// An error and its sources, for `tried` (a refused handshake says why only in its sources).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

pub fn now_ms() -> i64 {
    timerdb::clock::Clock::system().now_ms()
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

    /// Waits until every running node applied the same index with the same state digest.
    pub async fn converged(&self) -> (u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let digests: Vec<(u64, u64)> = self
                .running()
                .iter()
                .map(|id| self.node(*id).store.digest().unwrap())
                .collect();
            if digests.windows(2).all(|w| w[0] == w[1]) {
                return digests[0];
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

pub fn at(t: i64) -> Option<pb::schedule_request::When> {
    Some(pb::schedule_request::When::FireAtMs(t))
}

pub fn schedule_req(id: &str, fire_at_ms: i64) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: NS.into(),
        id: id.into(),
        when: at(fire_at_ms),
        payload: id.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub async fn get(c: &mut TimersClient<Channel>, id: &str) -> Result<pb::Timer, tonic::Status> {
    let r = c
        .get(pb::GetRequest {
            namespace: NS.into(),
            id: id.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().timer.unwrap())
}

/// Every timer of the namespace, through List paging.
pub async fn list_all(c: &mut TimersClient<Channel>, state: pb::TimerState) -> Vec<pb::Timer> {
    list_in(c, NS, state).await
}

/// Every timer of `namespace` in `state` (UNSPECIFIED: all), through List paging.
pub async fn list_in(
    c: &mut TimersClient<Channel>,
    namespace: &str,
    state: pb::TimerState,
) -> Vec<pb::Timer> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let req = pb::ListRequest {
            namespace: namespace.into(),
            state: state as i32,
            limit: 1000,
            page_token: token,
            ..Default::default()
        };
        // A loaded leader may answer UNAVAILABLE for a moment (a stalled fsync, "no quorum"
        // for ~1 s); the read is safe to retry.
        let mut tries = 0;
        let page = loop {
            match c.list(req.clone()).await {
                Err(s) if s.code() == tonic::Code::Unavailable && tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                r => break r.unwrap().into_inner(),
            }
        };
        out.extend(page.timers);
        token = page.next_page_token;
        if token.is_empty() {
            return out;
        }
    }
}

/// Polls until `n` timers of the namespace are FIRED (through any node), or panics.
///
/// Also the observer's never-early check: `fired_at_ms` is the state machine's own claim, so it
/// cannot reveal an early fire; the client's clock can. A timer seen FIRED in a response that
/// arrived before its `fire_at_ms` (same machine, same clock) fired early.
pub async fn wait_fired(
    c: &mut TimersClient<Channel>,
    n: usize,
    within: Duration,
) -> Vec<pb::Timer> {
    let deadline = Instant::now() + within;
    loop {
        let fired = list_all(c, pb::TimerState::Fired).await;
        let seen_at = now_ms();
        assert_not_early(&fired, seen_at);
        if fired.len() >= n {
            return fired;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} timers fired within {within:?}",
            fired.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Panics if any of `fired` is due after `seen_at`, the client time its FIRED state was known by.
pub fn assert_not_early(fired: &[pb::Timer], seen_at: i64) {
    for t in fired {
        assert!(
            t.fire_at_ms <= seen_at,
            "{} observed FIRED at {seen_at}, {} ms before its fire time {}",
            t.id,
            t.fire_at_ms - seen_at,
            t.fire_at_ms
        );
        assert!(
            t.fired_at_ms >= t.fire_at_ms,
            "{} claims fired_at {} < fire_at {}",
            t.id,
            t.fired_at_ms,
            t.fire_at_ms
        );
    }
}

/// Polls one timer until it reaches `state`, checking it is never seen fired early.
pub async fn wait_state(
    c: &mut TimersClient<Channel>,
    id: &str,
    state: pb::TimerState,
    within: Duration,
) -> pb::Timer {
    let deadline = Instant::now() + within;
    loop {
        let t = get(c, id).await.unwrap();
        if t.state == pb::TimerState::Fired as i32 {
            assert_not_early(std::slice::from_ref(&t), now_ms());
        }
        if t.state == state as i32 {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{id} did not reach {state:?} within {within:?}: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
