//! Process level: three real `timerd` binaries; SIGKILL the leader under due timers, restart
//! it on its data dir, and check every timer fired and every node converged.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{self, cluster_client::ClusterClient, timers_client::TimersClient};
use tonic::transport::Channel;

use crate::harness::*;

pub(crate) struct Proc {
    pub addr: String,
    pub dir: std::path::PathBuf,
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

pub(crate) fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

pub(crate) fn spawn(id: u64, p: &Proc, peers: &str) -> Child {
    spawn_with(id, p, peers, &[])
}

/// The `timerd` binary: `TIMERDB_TIMERD` if set (the test script points it at the release
/// build, which the million-timer test needs to finish in minutes), else this build's.
pub(crate) fn timerd() -> String {
    std::env::var("TIMERDB_TIMERD").unwrap_or_else(|_| env!("CARGO_BIN_EXE_timerd").to_string())
}

/// Starts `timerd` for node `id` with `extra` arguments; its output goes to a log in its dir
/// (appended, so a restart keeps the earlier lines).
pub(crate) fn spawn_with(id: u64, p: &Proc, peers: &str, extra: &[&str]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p.dir.join(format!("timerd-{id}.log")))
        .unwrap();
    Command::new(timerd())
        .args([
            "--id",
            &id.to_string(),
            "--listen",
            &p.addr,
            "--peers",
            peers,
        ])
        .arg("--data-dir")
        .arg(p.dir.join("data"))
        // The tests' push receivers listen on loopback.
        .arg("--push-allow-private=true")
        .args(extra)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn timerd")
}

/// Starts three `timerd` processes under `tmp`; returns them and their `--peers`.
pub(crate) fn start_three(tmp: &TempDir) -> (Vec<Proc>, String) {
    start_three_with(tmp, &[])
}

/// Starts three `timerd` processes, each with `extra` arguments.
pub(crate) fn start_three_with(tmp: &TempDir, extra: &[&str]) -> (Vec<Proc>, String) {
    let (mut procs, peers) = three_procs(tmp, "n");
    for (i, p) in procs.iter_mut().enumerate() {
        p.child = Some(spawn_with(i as u64 + 1, p, &peers, extra));
    }
    (procs, peers)
}

/// Three nodes, not started: directories `tmp/<prefix>1..3`, fresh addresses, their `--peers`.
pub(crate) fn three_procs(tmp: &TempDir, prefix: &str) -> (Vec<Proc>, String) {
    let procs: Vec<Proc> = (1..=3)
        .map(|id| {
            let dir = tmp.path().join(format!("{prefix}{id}"));
            std::fs::create_dir_all(&dir).unwrap();
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

pub(crate) async fn channel(addr: &str) -> Option<Channel> {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect()
        .await
        .ok()
}

pub(crate) async fn status(addr: &str) -> Option<pb::StatusResponse> {
    let mut c = ClusterClient::new(channel(addr).await?);
    Some(c.status(pb::StatusRequest {}).await.ok()?.into_inner())
}

/// Waits until one node reports itself leader; returns its index in `procs`.
pub(crate) async fn leader(procs: &[Proc]) -> usize {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_the_leader_process_and_restart_it() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (mut procs, peers) = start_three(&tmp);

    // Phase 1: 1,000 timers due over the next ~2 s, scheduled through a follower.
    let l = leader(&procs).await;
    let f = (l + 1) % 3;
    let mut client = TimersClient::new(channel(&procs[f].addr).await.unwrap());
    let base = now_ms() + 800;
    let timers = (0..1000)
        .map(|i| schedule_req(&format!("p{i}"), base + i * 2))
        .collect();
    client
        .schedule_batch(pb::ScheduleBatchRequest { timers })
        .await
        .unwrap();

    // Phase 2: SIGKILL the leader while they come due.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    procs[l].child.take().unwrap().kill().unwrap();
    let l2 = leader(&procs).await;
    assert_ne!(l2, l);

    // Phase 3: all fire.
    let fired = wait_fired(&mut client, 1000, Duration::from_secs(20)).await;
    assert!(
        fired.iter().all(|t| t.fired_at_ms >= t.fire_at_ms),
        "a timer fired early"
    );

    // Phase 4: restart the killed node; every node converges with nothing pending.
    let restarted = spawn(l as u64 + 1, &procs[l], &peers);
    procs[l].child = Some(restarted);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut st = Vec::new();
        for p in &procs {
            st.push(status(&p.addr).await);
        }
        let done = st
            .iter()
            .all(|s| s.as_ref().is_some_and(|s| s.pending_timers == 0))
            && st.windows(2).all(|w| {
                w[0].as_ref().map(|s| s.applied_index) == w[1].as_ref().map(|s| s.applied_index)
            });
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "nodes did not converge: {st:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, p) in procs.iter_mut().enumerate() {
        let mut child = p.child.take().unwrap();
        // SIGTERM: a clean shutdown, exit status 0.
        send_sigterm(&child);
        let outcome = wait_exit(&mut child, Duration::from_secs(15));
        let log = std::fs::read_to_string(p.dir.join(format!("timerd-{}.log", i + 1)))
            .unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        assert!(
            matches!(outcome, Some(s) if s.success()),
            "timerd {} on SIGTERM: {outcome:?} (None: still running after 15 s); log tail, newest first:\n{}",
            i + 1,
            tail.join("\n")
        );
    }
}

/// Polls `addr`'s status until `ok` holds, for at most `within`.
pub(crate) async fn wait_status(
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
pub(crate) async fn digests(procs: &[Proc]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for p in procs {
        let mut c = ClusterClient::new(channel(&p.addr).await.unwrap());
        let d = c.digest(pb::DigestRequest {}).await.unwrap().into_inner();
        out.push((d.applied_index, d.digest));
    }
    out
}

/// Waits until every node reports the same applied index and digest; returns it.
pub(crate) async fn same_digests(procs: &[Proc], within: Duration) -> (u64, u64) {
    let deadline = Instant::now() + within;
    let mut d = digests(procs).await;
    while !d.windows(2).all(|w| w[0] == w[1]) {
        assert!(Instant::now() < deadline, "replicas differ: {d:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        d = digests(procs).await;
    }
    d[0]
}

pub(crate) fn send_sigterm(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

/// The exit status, or `None` if the process was still running after `within` (then killed).
pub(crate) fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}

/// Schedules batches of 50 timers (due ~1 s ahead) until `stop`, each through the next node
/// that answers; a failed batch is retried with the same ids (idempotent) until acknowledged.
/// Returns the acknowledged ids.
async fn rolling_load(
    addrs: Vec<String>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<String> {
    let mut acked = Vec::new();
    let mut turn = 0usize;
    let mut batch = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let ids: Vec<String> = (0..50).map(|i| format!("r{batch}-{i}")).collect();
        let base = now_ms() + 1_000;
        loop {
            turn += 1;
            let Some(ch) = channel(&addrs[turn % addrs.len()]).await else {
                continue;
            };
            let timers = ids
                .iter()
                .enumerate()
                .map(|(i, id)| schedule_req(id, base + i as i64 * 10))
                .collect();
            let req = pb::ScheduleBatchRequest { timers };
            if TimersClient::new(ch).schedule_batch(req).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        acked.extend(ids);
        batch += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_loses_nothing_and_fires_nothing_twice() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    let (mut procs, peers) = start_three(&tmp);
    leader(&procs).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addrs = procs.iter().map(|p| p.addr.clone()).collect();
    let loader = tokio::spawn(rolling_load(addrs, stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Phase 1: restart each node in turn with SIGTERM, the leader included, under load.
    let mut handed_over = 0;
    for i in 0..3 {
        let was_leader = status(&procs[i].addr)
            .await
            .is_some_and(|s| s.role == "leader");
        let mut child = procs[i].child.take().unwrap();
        send_sigterm(&child);
        let outcome = wait_exit(&mut child, Duration::from_secs(15));
        assert!(
            matches!(outcome, Some(s) if s.success()),
            "node {}: {outcome:?}",
            i + 1
        );
        let log = std::fs::read_to_string(procs[i].dir.join(format!("timerd-{}.log", i + 1)))
            .unwrap_or_default();
        if was_leader {
            assert!(
                log.contains("leadership handed over"),
                "leader {} stopped without handing over; log:\n{log}",
                i + 1
            );
            handed_over += 1;
        }
        leader(&procs).await;
        procs[i].child = Some(spawn(i as u64 + 1, &procs[i], &peers));
        // Caught up: it applied at least what the leader had when it came back.
        let l = leader(&procs).await;
        let target = status(&procs[l].addr).await.unwrap().applied_index;
        let deadline = Instant::now() + Duration::from_secs(30);
        while status(&procs[i].addr)
            .await
            .is_none_or(|s| s.applied_index < target)
        {
            assert!(Instant::now() < deadline, "node {} did not catch up", i + 1);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(handed_over >= 1, "the leader was never among the restarted");

    // Phase 2: every acknowledged timer fired, once, never early, and the replicas agree.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = loader.await.unwrap();
    assert!(acked.len() >= 1_000, "load barely ran: {}", acked.len());
    let l = leader(&procs).await;
    let mut client = TimersClient::new(channel(&procs[l].addr).await.unwrap());
    let fired = wait_fired(&mut client, acked.len(), Duration::from_secs(60)).await;
    let mut by_id = std::collections::HashMap::new();
    for t in &fired {
        assert!(t.fire_index > 0, "{} has no fire index", t.id);
        assert!(
            by_id.insert(t.id.clone(), t.fire_index).is_none(),
            "{} listed twice",
            t.id
        );
    }
    for id in &acked {
        assert!(
            by_id.contains_key(id),
            "acknowledged timer {id} did not fire"
        );
    }
    assert_eq!(
        fired.len(),
        acked.len(),
        "timers fired that were never acknowledged"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut digests = Vec::new();
        for p in &procs {
            let mut c = ClusterClient::new(channel(&p.addr).await.unwrap());
            let d = c.digest(pb::DigestRequest {}).await.unwrap().into_inner();
            digests.push((d.applied_index, d.digest));
        }
        if digests.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        assert!(Instant::now() < deadline, "replicas differ: {digests:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
