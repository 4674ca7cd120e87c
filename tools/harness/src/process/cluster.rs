//! [`ProcCluster`]: three real `timerd` processes on loopback, as the tools run them — with
//! a proxy on every peer link (chaos) or none (benchmarks), node 3's data dir on a small tmpfs
//! that can be filled, and optionally TLS, mTLS and auth. Its levers (`faults.rs`) are what
//! the chaos plan pulls: SIGKILL, SIGSTOP/SIGCONT, restart with a skewed clock, link modes, a
//! full disk, a wiped node, membership changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::bail;
use timerdb::api::pb::{self, cluster_client::ClusterClient, timers_client::TimersClient};
use tonic::transport::Channel;

use super::{free_addr, takes_flag, Launch};
use crate::proxy::Link;
use crate::secure::{Conn, Credential, Secure};

pub const NODES: [u64; 3] = [1, 2, 3];
/// The node whose data dir is a tmpfs (the disk-full target).
pub const DISK_NODE: u64 = 3;

pub struct Node {
    pub addr: String,
    pub(super) child: Option<Child>,
    pub paused: bool,
    pub skew_ms: i64,
    /// Started with `--join`: wiped and waiting to be added (`Cluster.AddNode`) again.
    pub join: bool,
}

/// How a [`ProcCluster`] runs its nodes (the default: a benchmark's plain cluster).
#[derive(Default, Clone)]
pub struct Options {
    /// `--fault`, passed to every node: a deliberate bug (the checker's proof runs).
    pub fault: String,
    /// Node 3's data dir on a tmpfs (the disk-full fault; skipped where mounting is refused).
    pub tmpfs: bool,
    /// A fault proxy on every peer link; without them the nodes dial each other directly.
    pub proxies: bool,
    /// TLS, mTLS and peer mTLS (auth is turned on by `enable_auth`).
    pub secure: Option<Secure>,
    /// More `timerd` flags, for every node.
    pub extra: Vec<String>,
}

/// A running 3-node cluster of `timerd` processes.
pub struct ProcCluster {
    pub dir: PathBuf,
    timerd: PathBuf,
    options: Options,
    pub nodes: BTreeMap<u64, Node>,
    /// (from, to) → the proxy `from` dials `to` through.
    pub(super) links: BTreeMap<(u64, u64), Link>,
    pub(super) tmpfs: bool,
    /// What the workers' calls carry (a bearer token once auth is on).
    credential: Credential,
    /// The `timerd` binary takes `--push-allow-private` (builds before it, run as a benchmark's
    /// reference, refuse flags they do not know).
    push_flag: bool,
}

impl ProcCluster {
    /// Starts the proxies (if asked for) and the three nodes of `timerd` under `dir`.
    pub async fn start(dir: &Path, timerd: &Path, options: Options) -> anyhow::Result<Self> {
        let mut nodes = BTreeMap::new();
        for id in NODES {
            let node = Node {
                addr: free_addr(),
                child: None,
                paused: false,
                skew_ms: 0,
                join: false,
            };
            nodes.insert(id, node);
        }
        let mut links = BTreeMap::new();
        for from in NODES.into_iter().filter(|_| options.proxies) {
            for to in NODES.into_iter().filter(|t| *t != from) {
                links.insert((from, to), Link::start(nodes[&to].addr.clone()).await?);
            }
        }
        let tmpfs = options.tmpfs;
        let mut c = ProcCluster {
            dir: dir.to_path_buf(),
            timerd: timerd.to_path_buf(),
            options,
            nodes,
            links,
            tmpfs: false,
            credential: Credential::default(),
            push_flag: takes_flag(timerd, "--push-allow-private"),
        };
        if tmpfs {
            c.tmpfs = super::mount_tmpfs(&c.data_dir(DISK_NODE))?;
        }
        for id in NODES {
            c.spawn(id)?;
        }
        Ok(c)
    }

    pub fn has_tmpfs(&self) -> bool {
        self.tmpfs
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("n{id}"))
    }

    pub(super) fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let peers: Vec<String> = NODES
            .iter()
            .map(|n| format!("{n}={}", self.nodes[n].addr))
            .collect();
        let dial: Vec<String> = NODES
            .iter()
            .filter_map(|n| {
                let link = self.links.get(&(id, *n))?;
                Some(format!("{n}={}", link.addr))
            })
            .collect();
        let node = &self.nodes[&id];
        let launch = Launch {
            timerd: &self.timerd,
            id,
            listen: &node.addr,
            data_dir: self.data_dir(id),
            peers: &peers.join(","),
            log: self.dir.join(format!("n{id}.log")),
            push_allow_private: self.push_flag,
        };
        let o = &self.options;
        let mut args = vec![
            "--dial".to_string(),
            dial.join(","),
            format!("--clock-offset-ms={}", node.skew_ms),
            "--fault".to_string(),
            o.fault.clone(),
        ];
        args.extend(o.secure.iter().flat_map(|s| s.node_args(id)));
        args.extend(node.join.then(|| "--join".to_string()));
        args.extend(o.extra.iter().cloned());
        let log =
            std::env::var("TIMERDB_CHAOS_LOG").unwrap_or_else(|_| "info,openraft=warn".into());
        args.extend(["--log".to_string(), log]);
        let child = launch.spawn(&args)?;
        let node = self.nodes.get_mut(&id).expect("known node");
        node.child = Some(child);
        node.paused = false;
        Ok(())
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.nodes[&id].child.as_ref().map(Child::id)
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[&id].child.is_some()
    }

    /// A channel to node `id` with no token: the harness's certificate user when secure.
    pub async fn channel(&self, id: u64) -> anyhow::Result<Channel> {
        let addr = &self.nodes[&id].addr;
        let connector = match &self.options.secure {
            Some(s) => s.connector(false)?,
            None => timerdb_client::Connector::new(),
        };
        let connector = connector.connect_timeout(Duration::from_millis(500));
        Ok(connector.endpoint(addr)?.connect_lazy())
    }

    /// A Timers client for the workers and consumers, with their credential.
    pub async fn timers(&self, id: u64) -> anyhow::Result<TimersClient<Conn>> {
        let channel = self.channel(id).await?;
        Ok(TimersClient::with_interceptor(
            channel,
            self.credential.clone(),
        ))
    }

    /// When secure: creates the keys, turns auth on, and checks on every node that calls
    /// without the right credential are refused; the workers' clients made after this carry
    /// their key. Nothing without `--secure`.
    pub async fn enable_auth(&mut self) -> anyhow::Result<()> {
        let Some(secure) = self.options.secure.clone() else {
            return Ok(());
        };
        self.credential = crate::secure::enable_auth(self.channel(1).await?).await?;
        for id in NODES {
            crate::secure::verify(&secure, &self.nodes[&id].addr, &self.credential).await?;
        }
        Ok(())
    }

    /// Node `id`'s Status, if it answers within a short time.
    pub async fn status(&self, id: u64) -> Option<pb::StatusResponse> {
        let mut c = ClusterClient::new(self.channel(id).await.ok()?);
        let mut req = tonic::Request::new(pb::StatusRequest {});
        req.set_timeout(Duration::from_millis(300));
        c.status(req).await.ok().map(|r| r.into_inner())
    }

    /// Node `id`'s state digest.
    pub async fn digest(&self, id: u64) -> Option<pb::DigestResponse> {
        let mut c = ClusterClient::new(self.channel(id).await.ok()?);
        let mut req = tonic::Request::new(pb::DigestRequest {});
        req.set_timeout(Duration::from_secs(5));
        c.digest(req).await.ok().map(|r| r.into_inner())
    }

    /// The node that says it leads and that the other live nodes agree on, if any.
    pub async fn leader(&self) -> Option<u64> {
        let mut votes = BTreeMap::new();
        for id in NODES {
            if !self.is_up(id) || self.nodes[&id].paused {
                continue;
            }
            if let Some(s) = self.status(id).await {
                if s.role == "leader" {
                    *votes.entry(s.node_id).or_insert(0) += 2;
                } else if s.leader_id != 0 {
                    *votes.entry(s.leader_id).or_insert(0) += 1;
                }
            }
        }
        votes.into_iter().find(|(_, v)| *v >= 3).map(|(id, _)| id)
    }

    /// Waits up to `within` for an agreed leader.
    pub async fn wait_leader(&self, within: Duration) -> anyhow::Result<u64> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("no leader within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every node (SIGCONT first, then SIGTERM, then SIGKILL after a grace period) and
    /// unmounts the tmpfs.
    pub fn stop(&mut self) {
        for id in NODES {
            self.ask_to_stop(id);
        }
        for id in NODES {
            self.reap(id);
        }
        if self.tmpfs {
            super::unmount(&self.data_dir(DISK_NODE));
            self.tmpfs = false;
        }
    }

    /// SIGCONT if paused, then SIGTERM.
    pub(super) fn ask_to_stop(&mut self, id: u64) {
        if self.nodes[&id].paused {
            self.signal_pause(id, false);
        }
        if let Some(child) = &self.nodes[&id].child {
            super::send_sigterm(child);
        }
    }

    /// Waits up to 10 s for node `id` to exit, then SIGKILL.
    pub(super) fn reap(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if let Some(mut child) = node.child.take() {
            super::wait_exit(&mut child, Duration::from_secs(10));
        }
    }
}

impl Drop for ProcCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
