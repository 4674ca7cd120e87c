//! The levers of a [`ProcCluster`] the chaos plan pulls, and the operator's actions it takes
//! under load: kill and restart (with a skewed clock), pause, link modes, a full disk, heal;
//! a graceful restart, a wiped node started empty, and membership changes through the leader.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::Duration;

use anyhow::bail;
use timerdb::api::pb::{self, cluster_client::ClusterClient};

use super::cluster::{ProcCluster, DISK_NODE, NODES};
use crate::proxy::Mode;

impl ProcCluster {
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
            super::signal(child, if pause { "STOP" } else { "CONT" });
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
