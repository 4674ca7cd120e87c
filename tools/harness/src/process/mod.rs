//! Real `timerd` processes: the one way the harness starts one ([`Launch`]), the signals it
//! sends them, and what tests ask of a process cluster by address.
//!
//! Two ways to hold a process cluster, both starting nodes through [`Launch`]:
//! - [`Proc`]s and the free functions below: a test's hand on each process (start three, kill
//!   one, start it with other flags, wait for its exit status). They assert: a test stops at
//!   the first surprise.
//! - [`ProcCluster`] (`cluster.rs`): the tools' cluster, with a fault proxy on every peer link,
//!   a tmpfs to fill, TLS and auth, membership changes. Its calls return errors: a tool reports
//!   and goes on.
//!
//! Every node's output goes to a log file, appended, so a restart keeps the earlier lines and
//! a failure can show the tail.

mod cluster;
mod faults;

pub use cluster::{Options, ProcCluster, DISK_NODE, NODES};

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tempfile::TempDir;
use timerdb::api::pb::{self, cluster_client::ClusterClient};
use tonic::transport::Channel;

/// The `timerd` a tool runs: `given` (`--timerd`), else the one built beside the tool — the
/// binary the script that built the tool built with it. Deliberately not `TIMERDB_TIMERD`:
/// a variable left in the shell would make the gate compare its reference with itself, or a
/// chaos run test another build than the one it just made.
pub fn timerd_path(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(std::env::current_exe()?
            .parent()
            .context("no parent dir")?
            .join("timerd")),
    }
}

/// The `timerd` a test runs: `TIMERDB_TIMERD` if set (the test script points it at the
/// release build, which the million-timer test needs to finish in minutes), else the package's
/// own build, one directory above the test binary (`target/<profile>/deps/`).
pub fn timerd() -> PathBuf {
    if let Ok(p) = std::env::var("TIMERDB_TIMERD") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let built = deps.parent().expect("the profile directory").join("timerd");
    assert!(
        built.exists(),
        "no timerd at {} (cargo test builds it; else set TIMERDB_TIMERD)",
        built.display()
    );
    built
}

/// Whether `timerd --help` names `flag` (a reference build may predate it).
pub fn takes_flag(timerd: &Path, flag: &str) -> bool {
    let help = Command::new(timerd).arg("--help").output();
    help.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

/// A loopback address nobody listens on now.
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("a bound address").to_string()
}

/// One start of `timerd`: the flags every node gets, then the caller's.
pub struct Launch<'a> {
    pub timerd: &'a Path,
    pub id: u64,
    /// Where it serves clients and peers.
    pub listen: &'a str,
    pub data_dir: PathBuf,
    /// `--peers`: `1=addr,2=addr,…`.
    pub peers: &'a str,
    /// Its stdout and stderr, appended.
    pub log: PathBuf,
    /// `--push-allow-private=true`: the harnesses' push receivers listen on loopback (false
    /// for a reference build that predates the flag).
    pub push_allow_private: bool,
}

impl Launch<'_> {
    pub fn spawn<I, S>(&self, extra: I) -> anyhow::Result<Child>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        Command::new(self.timerd)
            .arg("--id")
            .arg(self.id.to_string())
            .arg("--listen")
            .arg(self.listen)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--peers")
            .arg(self.peers)
            .args(
                self.push_allow_private
                    .then_some("--push-allow-private=true"),
            )
            .args(extra)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", self.timerd.display()))
    }
}

/// Sends `signal` (`"TERM"`, `"STOP"`, `"CONT"`) to `child`.
pub fn signal(child: &Child, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status();
}

pub fn send_sigterm(child: &Child) {
    signal(child, "TERM");
}

/// The exit status, or `None` if the process was still running after `within` (then killed).
pub fn wait_exit(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A test's `timerd` process: its address, its directory (data in `data/`, output in
/// `timerd-<id>.log`) and, while it runs, the child.
pub struct Proc {
    pub addr: String,
    pub dir: PathBuf,
    pub child: Option<Child>,
}

/// A failing assertion must not leave timerd processes behind.
impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn spawn(id: u64, p: &Proc, peers: &str) -> Child {
    spawn_with(id, p, peers, &[])
}

/// Starts `timerd` for node `id` with `extra` arguments.
pub fn spawn_with(id: u64, p: &Proc, peers: &str, extra: &[&str]) -> Child {
    let timerd = timerd();
    let launch = Launch {
        timerd: &timerd,
        id,
        listen: &p.addr,
        data_dir: p.dir.join("data"),
        peers,
        log: p.dir.join(format!("timerd-{id}.log")),
        push_allow_private: true,
    };
    launch.spawn(extra).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Starts three `timerd` processes under `tmp`; returns them and their `--peers`.
pub fn start_three(tmp: &TempDir) -> (Vec<Proc>, String) {
    start_three_with(tmp, &[])
}

/// Starts three `timerd` processes, each with `extra` arguments.
pub fn start_three_with(tmp: &TempDir, extra: &[&str]) -> (Vec<Proc>, String) {
    let (mut procs, peers) = three_procs(tmp, "n");
    for (i, p) in procs.iter_mut().enumerate() {
        p.child = Some(spawn_with(i as u64 + 1, p, &peers, extra));
    }
    (procs, peers)
}

/// Three nodes, not started: directories `tmp/<prefix>1..3`, fresh addresses, their `--peers`.
pub fn three_procs(tmp: &TempDir, prefix: &str) -> (Vec<Proc>, String) {
    let procs: Vec<Proc> = (1..=3)
        .map(|id| {
            let dir = tmp.path().join(format!("{prefix}{id}"));
            std::fs::create_dir_all(&dir).expect("a node directory");
            Proc {
                addr: free_addr(),
                dir,
                child: None,
            }
        })
        .collect();
    let peers = procs
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}={}", i + 1, p.addr))
        .collect::<Vec<_>>()
        .join(",");
    (procs, peers)
}

pub async fn channel(addr: &str) -> Option<Channel> {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect()
        .await
        .ok()
}

pub async fn status(addr: &str) -> Option<pb::StatusResponse> {
    let mut c = ClusterClient::new(channel(addr).await?);
    Some(c.status(pb::StatusRequest {}).await.ok()?.into_inner())
}

/// Waits until one node reports itself leader; returns its index in `procs`.
pub async fn leader(procs: &[Proc]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (i, p) in procs.iter().enumerate() {
            if p.child.is_some() && status(&p.addr).await.is_some_and(|s| s.role == "leader") {
                return i;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader among the timerd processes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `addr`'s status until `ok` holds, for at most `within`.
pub async fn wait_status(
    addr: &str,
    within: Duration,
    what: &str,
    ok: impl Fn(&pb::StatusResponse) -> bool,
) -> pb::StatusResponse {
    let deadline = Instant::now() + within;
    loop {
        let s = status(addr).await;
        if let Some(s) = s.as_ref().filter(|s| ok(s)) {
            return s.clone();
        }
        assert!(Instant::now() < deadline, "{what}: last status {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every node's (applied index, state digest).
pub async fn digests(procs: &[Proc]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for p in procs {
        let mut c = ClusterClient::new(channel(&p.addr).await.expect("a channel"));
        let d = c
            .digest(pb::DigestRequest {})
            .await
            .expect("a digest")
            .into_inner();
        out.push((d.applied_index, d.digest));
    }
    out
}

/// Waits until every node reports the same applied index and digest; returns it.
pub async fn same_digests(procs: &[Proc], within: Duration) -> (u64, u64) {
    let deadline = Instant::now() + within;
    let mut d = digests(procs).await;
    while !d.windows(2).all(|w| w[0] == w[1]) {
        assert!(Instant::now() < deadline, "replicas differ: {d:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        d = digests(procs).await;
    }
    d[0]
}

/// The size of the tmpfs a [`ProcCluster`] fills (the disk-full fault).
const TMPFS_SIZE: &str = "768m";

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

fn unmount(dir: &Path) {
    let _ = Command::new("umount").arg(dir).status();
}
