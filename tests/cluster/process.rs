//! Process level: three real `timerd` binaries; SIGKILL the leader under due timers, restart
//! it on its data dir, and check every timer fired and every node converged.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{self, cluster_client::ClusterClient, timers_client::TimersClient};
use tonic::transport::Channel;

use crate::harness::*;

struct Proc {
    addr: String,
    dir: std::path::PathBuf,
    child: Option<Child>,
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

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn spawn(id: u64, p: &Proc, peers: &str) -> Child {
    let log = std::fs::File::create(p.dir.join(format!("timerd-{id}.log"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_timerd"))
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
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn timerd")
}

async fn channel(addr: &str) -> Option<Channel> {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect()
        .await
        .ok()
}

async fn status(addr: &str) -> Option<pb::StatusResponse> {
    let mut c = ClusterClient::new(channel(addr).await?);
    Some(c.status(pb::StatusRequest {}).await.ok()?.into_inner())
}

/// Waits until one node reports itself leader; returns its index in `procs`.
async fn leader(procs: &[Proc]) -> usize {
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
    let mut procs: Vec<Proc> = (1..=3)
        .map(|id| {
            let dir = tmp.path().join(format!("n{id}"));
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
    for (i, p) in procs.iter_mut().enumerate() {
        p.child = Some(spawn(i as u64 + 1, p, &peers));
    }

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

fn send_sigterm(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

/// The exit status, or `None` if the process was still running after `within` (then killed).
fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
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
