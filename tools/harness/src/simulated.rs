//! Three real timerdb nodes in this process, on the simulated network and clock (`timerdb::sim`):
//! started, crashed, restarted on their data directories (RocksDB on tmpfs), restarted with a
//! skewed clock; and the links between them cut, slowed and healed.
//!
//! Addresses: clients reach node `n` at `10.0.0.n:7100` (its advertised address); node `i`
//! dials node `j` at `10.i.0.j:7100` (its `--dial` map), so each directed link is an address of
//! its own and a fault can cut `i → j` alone.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use timerdb::api::pb::timers_client::TimersClient;
use timerdb::config::NodeConfig;
use timerdb::server::{self, RunningNode};
use timerdb::sim::{self, Host, Link};
use timerdb_client::connect::Bearer;
use timerdb_client::Conn;
use tonic::service::interceptor::InterceptedService;

pub const NODES: [Host; 3] = [1, 2, 3];

pub fn client_addr(n: Host) -> String {
    format!("10.0.0.{n}:7100")
}

fn peer_addr(from: Host, to: Host) -> String {
    format!("10.{from}.0.{to}:7100")
}

/// One simulated cluster.
pub struct SimCluster {
    pub dir: PathBuf,
    pub nodes: BTreeMap<Host, Option<RunningNode>>,
    /// Each node's election timeout (ms), drawn from the seed: openraft draws it once per
    /// start from an unseeded generator, so the simulator fixes it (a range of one).
    pub election_ms: BTreeMap<Host, u64>,
    pub skew_ms: BTreeMap<Host, i64>,
    /// Deliberate bugs every node runs with (a planted bug's, see `scenario::Plant`).
    pub faults: timerdb::config::Faults,
}

impl SimCluster {
    /// Routes every address and starts the three nodes (a new cluster).
    pub async fn start(
        dir: &Path,
        election_ms: BTreeMap<Host, u64>,
        faults: timerdb::config::Faults,
    ) -> anyhow::Result<Self> {
        for to in NODES {
            sim::route(&client_addr(to), 0, to);
            for from in NODES {
                if from != to {
                    sim::route(&peer_addr(from, to), from, to);
                }
            }
        }
        let mut c = SimCluster {
            dir: dir.to_path_buf(),
            nodes: BTreeMap::new(),
            election_ms,
            skew_ms: NODES.iter().map(|n| (*n, 0)).collect(),
            faults,
        };
        for n in NODES {
            c.start_node(n).await?;
        }
        Ok(c)
    }

    fn config(&self, n: Host) -> NodeConfig {
        let peers = NODES.iter().map(|p| (*p, client_addr(*p))).collect();
        let mut c = NodeConfig::new(n, self.dir.join(format!("n{n}")), peers);
        c.dial = NODES
            .iter()
            .filter(|p| **p != n)
            .map(|p| (*p, peer_addr(n, *p)))
            .collect();
        let t = self.election_ms[&n];
        c.raft.election_timeout_min_ms = t;
        c.raft.election_timeout_max_ms = t + 1;
        c.clock = timerdb::clock::Clock::with_offset(self.skew_ms[&n]);
        c.leader_wait = Duration::from_secs(5);
        c.write_timeout = Duration::from_secs(5);
        c.faults = self.faults;
        // Snapshots often, so that a node back from a crash installs one now and then.
        c.snapshot_every_entries = 200;
        c.keep_log_entries = 50;
        // Purges within a seed's ~25 s (the sparse namespace keeps rows 2 s): the rows a
        // purge deletes, and the ids it frees, are among the states the seeds must reach.
        c.purge_floor = Duration::ZERO;
        c
    }

    pub async fn start_node(&mut self, n: Host) -> anyhow::Result<()> {
        let config = self.config(n);
        let listener = sim::Listener::bind(n, client_addr(n).parse()?);
        let node = server::start(config, timerdb::listen::Listener::Sim(listener)).await?;
        self.nodes.insert(n, Some(node));
        Ok(())
    }

    /// Node `n` crashes: no connection reaches it from now on, and it stops.
    pub async fn crash(&mut self, n: Host) {
        sim::stop(n);
        if let Some(node) = self.nodes.get_mut(&n).and_then(Option::take) {
            node.shutdown().await;
        }
    }

    pub async fn restart(&mut self, n: Host) -> anyhow::Result<()> {
        if self.nodes.get(&n).is_some_and(Option::is_some) {
            self.crash(n).await;
        }
        self.start_node(n).await
    }

    pub fn running(&self) -> Vec<Host> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn node(&self, n: Host) -> Option<&RunningNode> {
        self.nodes.get(&n).and_then(Option::as_ref)
    }

    /// The leader a majority of running nodes agree on, if any.
    pub fn leader(&self) -> Option<Host> {
        let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
        for n in self.running() {
            let m = self.node(n)?.raft.metrics().borrow_watched().clone();
            if let Some(l) = m.current_leader {
                *votes.entry(l).or_default() += 1;
            }
        }
        let (leader, count) = votes.into_iter().max_by_key(|(_, c)| *c)?;
        (count >= 2 && self.node(leader).is_some()).then_some(leader)
    }

    pub async fn wait_leader(&self, within: Duration) -> Option<Host> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Cuts (or heals) every link between `n` and the others, both ways.
    pub fn isolate(&self, n: Host, cut: bool) {
        for other in NODES.iter().chain([0].iter()) {
            if *other != n {
                let link = Link {
                    cut,
                    ..Link::default()
                };
                sim::set_link(n, *other, link);
                sim::set_link(*other, n, link);
            }
        }
    }

    /// Every link (clients' too), both ways, set to `link` (`Link::default()`: healthy).
    pub fn set_all(&self, link: Link) {
        for from in [0, 1, 2, 3] {
            for to in NODES {
                if from != to {
                    sim::set_link(from, to, link);
                    sim::set_link(to, from, link);
                }
            }
        }
    }

    /// A connection to node `n` over the simulated network, as a client makes it.
    pub fn conn(&self, n: Host) -> Conn {
        let channel = timerdb::tls::Tls::default()
            .channel(&client_addr(n), |e| {
                e.connect_timeout(Duration::from_secs(1))
                    .timeout(Duration::from_secs(8))
            })
            .expect("a simulated channel");
        InterceptedService::new(channel, Bearer::default())
    }

    /// A Timers client of node `n`.
    pub fn client(&self, n: Host) -> TimersClient<Conn> {
        TimersClient::new(self.conn(n))
    }

    /// (node, applied index, digest) of every running node.
    pub fn digests(&self) -> Vec<(u64, u64, u64)> {
        self.running()
            .into_iter()
            .filter_map(|n| {
                let (applied, digest) = self.node(n)?.store.digest().ok()?;
                Some((n, applied, digest))
            })
            .collect()
    }

    pub async fn shutdown(mut self) {
        for n in NODES {
            self.crash(n).await;
        }
    }
}
