//! Three real `timerd` processes on loopback, with a proxy on every peer link, and the levers
//! the faults pull: SIGKILL, SIGSTOP/SIGCONT, restart (optionally with a skewed clock), link
//! modes, and a full disk (node 3's data dir is a small tmpfs that can be filled).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use timerdb::api::pb::{self, cluster_client::ClusterClient, timers_client::TimersClient};
use tonic::transport::Channel;

use crate::proxy::{Link, Mode};
use crate::secure::{Conn, Credential, Secure};

pub const NODES: [u64; 3] = [1, 2, 3];
/// The node whose data dir is a tmpfs (the disk-full target).
pub const DISK_NODE: u64 = 3;
const TMPFS_SIZE: &str = "768m";

pub struct Node {
    pub addr: String,
    child: Option<Child>,
    pub paused: bool,
    pub skew_ms: i64,
    /// Started with `--join`: wiped and waiting to be added (`Cluster.AddNode`) again.
    pub join: bool,
}

/// A running 3-node cluster of `timerd` processes.
pub struct ProcCluster {
    pub dir: PathBuf,
    timerd: PathBuf,
    fault: String,
    pub nodes: BTreeMap<u64, Node>,
    /// (from, to) → the proxy `from` dials `to` through.
    links: BTreeMap<(u64, u64), Link>,
    tmpfs: bool,
    /// TLS and auth (`--secure`), if on.
    secure: Option<Secure>,
    /// What the workers' calls carry (a bearer token once auth is on).
    credential: Credential,
    /// More `timerd` flags, for every node.
    extra: Vec<String>,
    /// The `timerd` binary takes `--push-allow-private` (builds before it, run as a benchmark's
    /// reference, refuse flags they do not know).
    push_flag: bool,
}

/// The `timerd` binary to run: `given`, or the one built next to this executable.
pub fn timerd_path(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(std::env::current_exe()?
            .parent()
            .context("no parent dir")?
            .join("timerd")),
    }
}

/// Whether `timerd --help` names `flag` (a reference build may predate it).
fn takes_flag(timerd: &Path, flag: &str) -> bool {
    let help = Command::new(timerd).arg("--help").output();
    help.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl ProcCluster {
    /// Starts the proxies (when `proxies`) and the three nodes; `fault` is passed to every node
    /// (proof runs). Without proxies the nodes dial each other directly (benchmarks). With
    /// `secure` the nodes run TLS, mTLS and peer mTLS (auth is turned on by `enable_auth`).
    /// `extra` flags go to every node.
    pub async fn start(
        dir: &Path,
        timerd: &Path,
        fault: &str,
        tmpfs: bool,
        proxies: bool,
        secure: Option<Secure>,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let mut nodes = BTreeMap::new();
        for id in NODES {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let node = Node {
                addr,
                child: None,
                paused: false,
                skew_ms: 0,
                join: false,
            };
            nodes.insert(id, node);
        }
        let mut links = BTreeMap::new();
        for from in NODES.into_iter().filter(|_| proxies) {
            for to in NODES.into_iter().filter(|t| *t != from) {
                links.insert((from, to), Link::start(nodes[&to].addr.clone()).await?);
            }
        }
        let mut c = ProcCluster {
            dir: dir.to_path_buf(),
            timerd: timerd.to_path_buf(),
            fault: fault.to_string(),
            nodes,
            links,
            tmpfs: false,
            secure,
            credential: Credential::default(),
            extra: extra.to_vec(),
            push_flag: takes_flag(timerd, "--push-allow-private"),
        };
        if tmpfs {
            c.tmpfs = mount_tmpfs(&c.data_dir(DISK_NODE))?;
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

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
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
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("n{id}.log")))?;
        let node = self.nodes.get_mut(&id).expect("known node");
        let child = Command::new(&self.timerd)
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&node.addr)
            .arg("--data-dir")
            .arg(self.dir.join(format!("n{id}")))
            .arg("--peers")
            .arg(peers.join(","))
            .arg("--dial")
            .arg(dial.join(","))
            .arg(format!("--clock-offset-ms={}", node.skew_ms))
            // The push receiver listens on loopback.
            .args(self.push_flag.then_some("--push-allow-private=true"))
            .arg("--fault")
            .arg(&self.fault)
            .args(self.secure.iter().flat_map(|s| s.node_args(id)))
            .args(node.join.then_some("--join"))
            .args(&self.extra)
            .arg("--log")
            .arg(std::env::var("TIMERDB_CHAOS_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", self.timerd.display()))?;
        node.child = Some(child);
        node.paused = false;
        Ok(())
    }

    /// The process id of node `id`, while it runs.
    #[allow(dead_code)] // used by the benchmark, which shares this module
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.nodes[&id].child.as_ref().map(Child::id)
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[&id].child.is_some()
    }

    /// SIGKILL: the process is gone at once, with whatever it had not written.
    pub fn kill(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        node.paused = false;
    }

    /// Starts a killed node again on its data dir, its clock skewed by `skew_ms`.
    pub fn restart(&mut self, id: u64, skew_ms: i64) -> anyhow::Result<()> {
        self.kill(id);
        self.nodes.get_mut(&id).expect("known node").skew_ms = skew_ms;
        self.spawn(id)
    }

    /// SIGSTOP (`pause`) or SIGCONT.
    pub fn signal_pause(&mut self, id: u64, pause: bool) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if let Some(child) = &node.child {
            let sig = if pause { "-STOP" } else { "-CONT" };
            let _ = Command::new("kill")
                .arg(sig)
                .arg(child.id().to_string())
                .status();
            node.paused = pause;
        }
    }

    /// Sets every link to and from `id` (or every link, for `None`) to `mode`.
    pub fn set_links(&self, id: Option<u64>, mode: Mode) {
        for ((from, to), link) in &self.links {
            if id.is_none_or(|n| n == *from || n == *to) {
                link.set(mode);
            }
        }
    }

    /// Fills node `DISK_NODE`'s tmpfs (`full`) or frees it again.
    pub fn fill_disk(&self, full: bool) -> anyhow::Result<()> {
        let filler = self.data_dir(DISK_NODE).join("FILLER");
        if !full {
            let _ = std::fs::remove_file(&filler);
            return Ok(());
        }
        let mut f = OpenOptions::new().create(true).append(true).open(&filler)?;
        let block = vec![0u8; 1 << 20];
        // Write until the file system says it is full.
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
        Ok(())
    }

    /// Fills node `DISK_NODE`'s tmpfs but for `room` bytes, so that filling it the rest of the
    /// way (`fill_disk`) later takes milliseconds.
    pub fn fill_disk_but(&self, room: u64) -> anyhow::Result<()> {
        self.fill_disk(true)?;
        let filler = self.data_dir(DISK_NODE).join("FILLER");
        let f = OpenOptions::new().write(true).open(&filler)?;
        let len = f.metadata()?.len();
        f.set_len(len.saturating_sub(room))?;
        Ok(())
    }

    /// Heals everything: links pass, paused nodes continue, the disk has room, every node runs
    /// with an unskewed clock.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        self.set_links(None, Mode::Pass);
        for id in NODES {
            if self.nodes[&id].paused {
                self.signal_pause(id, false);
            }
        }
        self.fill_disk(false)?;
        for id in NODES {
            let node = &self.nodes[&id];
            if node.child.is_none() || node.skew_ms != 0 {
                self.restart(id, 0)?;
            }
        }
        Ok(())
    }

    /// A channel to node `id` with no token: the harness's certificate user when secure.
    pub async fn channel(&self, id: u64) -> anyhow::Result<Channel> {
        let addr = &self.nodes[&id].addr;
        let connector = match &self.secure {
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
        let Some(secure) = self.secure.clone() else {
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
            let _ = Command::new("umount")
                .arg(self.data_dir(DISK_NODE))
                .status();
            self.tmpfs = false;
        }
    }

    /// SIGCONT if paused, then SIGTERM.
    fn ask_to_stop(&mut self, id: u64) {
        if self.nodes[&id].paused {
            self.signal_pause(id, false);
        }
        if let Some(child) = &self.nodes[&id].child {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
        }
    }

    /// Waits up to 10 s for node `id` to exit, then SIGKILL.
    fn reap(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if let Some(mut child) = node.child.take() {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// An operator's restart: SIGTERM, the exit awaited, started again on its data dir.
    pub fn restart_gracefully(&mut self, id: u64) -> anyhow::Result<()> {
        self.ask_to_stop(id);
        self.reap(id);
        self.spawn(id)
    }

    /// A machine replaced: node `id` killed and its data dir emptied (a tmpfs stays mounted).
    /// From now on it starts with `--join`: empty, it waits to be added again.
    pub fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill(id);
        for entry in std::fs::read_dir(self.data_dir(id))? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        self.nodes.get_mut(&id).expect("known node").join = true;
        Ok(())
    }

    /// Starts a wiped node (empty, `--join`).
    pub fn start_empty(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill(id);
        self.spawn(id)
    }

    /// `Cluster.RemoveNode` of `id` through the leader, until the leader no longer counts it a
    /// member. RemoveNode is not safe to retry blindly (a second one answers NOT_FOUND), so
    /// every attempt first looks at the membership; removing the leader hands leadership over
    /// first and answers "not the leader", and the next attempt goes to the new one.
    pub async fn remove_member(&self, id: u64, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = String::from("no leader");
        loop {
            if let Some(l) = self.leader().await {
                match self.status(l).await {
                    Some(s) if !s.members.iter().any(|m| m.node_id == id) => return Ok(()),
                    Some(_) => {
                        let mut c = ClusterClient::new(self.channel(l).await?);
                        let mut req = tonic::Request::new(pb::RemoveNodeRequest { node_id: id });
                        req.set_timeout(Duration::from_secs(10));
                        if let Err(e) = c.remove_node(req).await {
                            last = e.message().to_string();
                        }
                    }
                    None => {}
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("node {id} is still a member after {within:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Cluster.AddNode` of `id` at its address (safe to retry), until the leader counts it a
    /// voter.
    pub async fn add_member(&self, id: u64, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = String::from("no leader");
        loop {
            if let Some(l) = self.leader().await {
                match self.status(l).await {
                    Some(s) if s.members.iter().any(|m| m.node_id == id && m.voter) => {
                        return Ok(())
                    }
                    Some(_) => {
                        let mut c = ClusterClient::new(self.channel(l).await?);
                        let mut req = tonic::Request::new(pb::AddNodeRequest {
                            node_id: id,
                            addr: self.nodes[&id].addr.clone(),
                            learner: false,
                        });
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        req.set_timeout(left.max(Duration::from_secs(1)));
                        if let Err(e) = c.add_node(req).await {
                            last = e.message().to_string();
                        }
                    }
                    None => {}
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("node {id} is not a voter after {within:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until node `id` has applied every entry the leader had committed when the wait
    /// began.
    pub async fn wait_caught_up(&self, id: u64, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        let mut target = None;
        loop {
            if target.is_none() {
                if let Some(l) = self.leader().await {
                    target = self.status(l).await.map(|s| s.commit_index);
                }
            }
            if let (Some(t), Some(s)) = (target, self.status(id).await) {
                if s.applied_index >= t {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("node {id} did not catch up within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Snapshot files node `id` is receiving now (`incoming-*.part`).
    pub fn receiving_snapshot(&self, id: u64) -> bool {
        let dir = self.data_dir(id).join("snapshot");
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("incoming-") && name.ends_with(".part")
            })
        })
    }
}

impl Drop for ProcCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Mounts a small tmpfs at `dir`; false (with a note) where mounting is not allowed.
fn mount_tmpfs(dir: &Path) -> anyhow::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_SIZE}"), "tmpfs"])
        .arg(dir)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("note: cannot mount a tmpfs (not root?): the disk-full fault is skipped");
    }
    Ok(ok)
}
