//! The cluster a benchmark runs against: three `timerd` processes this tool started (the
//! default, so it can kill and restart them), or an existing cluster given by address
//! (`--connect`, for the workloads that need no process control). Also the small pieces every
//! workload shares: clients, the wall clock in microseconds, histograms.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use timerdb::api::pb::{self, cluster_client::ClusterClient, timers_client::TimersClient};
use timerdb_client::Connector;
use tonic::transport::Channel;

use timerdb_harness::process::{Options, ProcCluster, NODES};
use timerdb_harness::secure::Secure;

pub struct Target {
    /// Node id → client address.
    pub addrs: BTreeMap<u64, String>,
    /// The processes, when this tool started them.
    pub procs: Option<ProcCluster>,
    /// TLS, mTLS, peer mTLS and auth on (`--secure`): clients present the harness's
    /// certificate, an admin certificate user.
    secure: Option<Secure>,
}

impl Target {
    /// Starts a fresh local cluster in `dir` (no proxies: peers dial each other directly),
    /// with every security feature on when `secure` is given.
    pub async fn start(
        dir: &Path,
        timerd: &Path,
        secure: Option<Secure>,
    ) -> anyhow::Result<Target> {
        std::fs::create_dir_all(dir)?;
        let options = Options {
            secure: secure.clone(),
            ..Options::default()
        };
        let procs = ProcCluster::start(dir, timerd, options).await?;
        let addrs = NODES
            .iter()
            .map(|id| (*id, procs.nodes[id].addr.clone()))
            .collect();
        let mut target = Target {
            addrs,
            procs: Some(procs),
            secure,
        };
        target.wait_leader(Duration::from_secs(30)).await?;
        if let Some(procs) = target.procs.as_mut() {
            procs.enable_auth().await?;
        }
        Ok(target)
    }

    /// An existing cluster; node ids are learned from each node's Status.
    pub async fn connect(addrs: &[String]) -> anyhow::Result<Target> {
        let mut by_id = BTreeMap::new();
        for addr in addrs {
            let s = status(&channel(addr)?)
                .await
                .with_context(|| format!("no answer from {addr}"))?;
            by_id.insert(s.node_id, addr.clone());
        }
        Ok(Target {
            addrs: by_id,
            procs: None,
            secure: None,
        })
    }

    /// The local processes, for workloads that kill and restart nodes.
    pub fn procs(&mut self, workload: &str) -> anyhow::Result<&mut ProcCluster> {
        match self.procs.as_mut() {
            Some(p) => Ok(p),
            None => bail!(
                "the {workload} workload kills nodes: it needs the local cluster (no --connect)"
            ),
        }
    }

    pub fn channel(&self, id: u64) -> anyhow::Result<Channel> {
        let addr = &self.addrs[&id];
        match &self.secure {
            Some(s) => {
                let connector = s.connector(false)?;
                let connector = connector.connect_timeout(Duration::from_millis(500));
                Ok(connector.endpoint(addr)?.connect_lazy())
            }
            None => channel(addr),
        }
    }

    /// `n` separate connections to node `id` (one HTTP/2 connection serialises on one task).
    pub fn timers(&self, id: u64, n: usize) -> anyhow::Result<Vec<TimersClient<Channel>>> {
        (0..n.max(1))
            .map(|_| Ok(TimersClient::new(self.channel(id)?)))
            .collect()
    }

    /// Node `id`'s Status, if it answers quickly.
    pub async fn status(&self, id: u64) -> Option<pb::StatusResponse> {
        status(&self.channel(id).ok()?).await
    }

    /// The node every live node names as leader, if they agree.
    pub async fn leader(&self) -> Option<u64> {
        let mut named = Vec::new();
        for id in self.addrs.keys() {
            if let Some(s) = self.status(*id).await {
                named.push(if s.role == "leader" {
                    s.node_id
                } else {
                    s.leader_id
                });
            }
        }
        let first = *named.first()?;
        (first != 0 && named.len() >= 2 && named.iter().all(|l| *l == first)).then_some(first)
    }

    pub async fn wait_leader(&self, within: Duration) -> anyhow::Result<u64> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the cluster has no leader after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The nodes other than the leader.
    pub fn followers(&self, leader: u64) -> Vec<u64> {
        self.addrs
            .keys()
            .copied()
            .filter(|id| *id != leader)
            .collect()
    }
}

fn channel(addr: &str) -> anyhow::Result<Channel> {
    let connector = Connector::new().connect_timeout(Duration::from_millis(500));
    Ok(connector.endpoint(addr)?.connect_lazy())
}

async fn status(channel: &Channel) -> Option<pb::StatusResponse> {
    let mut req = tonic::Request::new(pb::StatusRequest {});
    req.set_timeout(Duration::from_millis(500));
    let reply = ClusterClient::new(channel.clone()).status(req).await;
    reply.ok().map(|r| r.into_inner())
}

/// Wall-clock microseconds since the epoch (the benchmark's only clock for lateness; it runs
/// on the same machine as the nodes, so their clocks agree).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

pub fn now_ms() -> i64 {
    now_us() / 1000
}

/// A histogram of microseconds up to an hour, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Percentile `q` (0–100) of `h` in milliseconds.
pub fn ms_at(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q / 100.0) as f64 / 1000.0
}

/// A schedule request for `id`, due at `fire_at_ms`, with a payload of `payload` bytes.
pub fn schedule_req(ns: &str, id: String, fire_at_ms: i64, payload: usize) -> pb::ScheduleRequest {
    pb::ScheduleRequest {
        namespace: ns.into(),
        id,
        when: Some(pb::schedule_request::When::FireAtMs(fire_at_ms)),
        payload: vec![b'x'; payload],
        ..Default::default()
    }
}
