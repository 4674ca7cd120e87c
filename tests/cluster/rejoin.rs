//! Snapshots at scale, on real `timerd` processes: a voter whose data dir is wiped rejoins
//! through a streamed snapshot of 1,000,000 timers and ends identical to the others; then a
//! backup of the million is saved through it and restored offline.
//!
//! The nodes read their snapshot policy and log format from a TOML `--config` file, as an
//! operator's would. Set `TIMERDB_TIMERD` to a release `timerd` (scripts/test.sh does): with a
//! debug build, whose RocksDB is compiled unoptimised, loading a million timers takes minutes.

use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use tempfile::TempDir;
use timerdb::api::pb::{self, cluster_client::ClusterClient, timers_client::TimersClient};
use tonic::Code;

use crate::harness::*;
use crate::process::*;

const TIMERS: u64 = 1_000_000;
const PER_BATCH: u64 = 10_000;
/// Payload bytes per timer (the snapshot is then ~140 MB). With larger payloads each
/// 10,000-timer entry is several MB, which this 2-core machine could not replicate within
/// openraft's 100 ms AppendEntries timeout (see `NodeConfig::openraft`).
const PAYLOAD: usize = 64;

fn payload(n: u64) -> Vec<u8> {
    let mut p = n.to_le_bytes().repeat(PAYLOAD / 8);
    p.truncate(PAYLOAD);
    p
}

/// Schedules `TIMERS` timers due in an hour through `addr`, two batches in flight; a batch
/// refused as UNAVAILABLE (leadership moving on a busy machine) is retried with the same ids.
async fn load_million(addr: &str) {
    let base = now_ms() + 3_600_000;
    let client = TimersClient::new(channel(addr).await.unwrap())
        .max_encoding_message_size(64 << 20)
        .max_decoding_message_size(64 << 20);
    let started = Instant::now();
    stream::iter(0..TIMERS / PER_BATCH)
        .map(|b| {
            let mut client = client.clone();
            async move {
                let timers: Vec<_> = (0..PER_BATCH)
                    .map(|i| {
                        let n = b * PER_BATCH + i;
                        let mut r = schedule_req(&format!("m{n:07}"), base + (n % 600_000) as i64);
                        r.payload = payload(n);
                        r
                    })
                    .collect();
                let batch = pb::ScheduleBatchRequest { timers };
                for attempt in 1.. {
                    match client.schedule_batch(batch.clone()).await {
                        Ok(_) => break,
                        Err(e) if e.code() == Code::Unavailable && attempt < 20 => {
                            tokio::time::sleep(Duration::from_millis(500)).await
                        }
                        Err(e) => panic!("batch {b} refused: {e:?}"),
                    }
                }
            }
        })
        .buffer_unordered(2)
        .collect::<Vec<()>>()
        .await;
    eprintln!(
        "loaded {TIMERS} timers in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The peak resident set of process `pid`, in bytes (Linux: VmHWM).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Size of the current snapshot file in a node's data dir.
fn snapshot_bytes(data: &std::path::Path) -> u64 {
    std::fs::read_dir(data.join("snapshot"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
        .map(|e| e.metadata().unwrap().len())
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_voter_rejoins_through_a_snapshot_of_a_million_timers() {
    init_tracing();
    let tmp = TempDir::new().unwrap();
    // The log is compacted on the policy: a snapshot every 80 entries (the load is about 100),
    // none kept behind it, so what the wiped node needs exists only in a snapshot.
    let config = tmp.path().join("timerd.toml");
    std::fs::write(
        &config,
        "log_format = \"json\"\n[snapshot]\nevery_entries = 80\nkeep_log_entries = 0\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let (mut procs, _) = start_three_with(&tmp, &["--config", &config]);

    // Phase 1: a million timers; the leader snapshots and purges its log.
    let l = leader(&procs).await;
    load_million(&procs[l].addr).await;
    let l = leader(&procs).await;
    let before = wait_status(
        &procs[l].addr,
        Duration::from_secs(120),
        "the leader never purged its log",
        |s| s.purged_index > 60,
    )
    .await;
    assert_eq!(before.pending_timers, TIMERS);
    // Every node has applied the whole load before one loses its disk. (Losing the one
    // up-to-date follower while the other lags far behind stalls the cluster on this machine:
    // openraft 0.9 gives each AppendEntries one heartbeat, 100 ms, and a lagging follower
    // sent 8 entries of ~1.2 MB at a time under CPU contention never answered in time. See
    // the closing note of this stop; it needs its own fix.)
    for p in &procs {
        wait_status(
            &p.addr,
            Duration::from_secs(180),
            "a follower never caught up with the load",
            |s| s.applied_index >= before.last_log_index,
        )
        .await;
    }

    // Phase 2: a follower loses its disk. The operator's procedure (docs/operations.md):
    // remove the dead voter, start the empty node with --join, add it back.
    let w = (l + 1) % 3;
    let id = w as u64 + 1;
    procs[w].child.take().unwrap().kill().unwrap();
    std::fs::remove_dir_all(procs[w].dir.join("data")).unwrap();
    let l = leader(&procs).await;
    let mut admin = ClusterClient::new(channel(&procs[l].addr).await.unwrap());
    // As an operator would: retry while the two survivors settle on a leader.
    for attempt in 1.. {
        let mut remove = tonic::Request::new(pb::RemoveNodeRequest { node_id: id });
        remove.set_timeout(Duration::from_secs(60));
        match admin.remove_node(remove).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::Unavailable && attempt < 10 => {
                tokio::time::sleep(Duration::from_secs(1)).await
            }
            Err(e) => panic!("remove_node: {e:?}"),
        }
    }
    let own = format!("{id}={}", procs[w].addr);
    procs[w].child = Some(spawn_with(
        id,
        &procs[w],
        &own,
        &["--join", "--config", &config],
    ));
    let started = Instant::now();
    // AddNode is safe to retry, and an operator re-runs `member add` on UNAVAILABLE: on two
    // busy cores the leader can change while it streams the snapshot (seen once in CI).
    let added = loop {
        let mut add = tonic::Request::new(pb::AddNodeRequest {
            node_id: id,
            addr: procs[w].addr.clone(),
            learner: false,
        });
        add.set_timeout(Duration::from_secs(300));
        match admin.add_node(add).await {
            Ok(r) => break r.into_inner(),
            Err(e) if e.code() == Code::Unavailable && started.elapsed().as_secs() < 300 => {
                eprintln!(
                    "add_node after {:.1} s: {e:?}; retrying",
                    started.elapsed().as_secs_f64()
                );
                tokio::time::sleep(Duration::from_secs(1)).await
            }
            Err(e) => panic!("add_node: {e:?}"),
        }
    };
    assert!(
        added.members.iter().any(|m| m.node_id == id && m.voter),
        "{:?}",
        added.members
    );
    let rejoin_s = started.elapsed().as_secs_f64();

    // Phase 3: it was promoted only once caught up, it came back through a snapshot, not the
    // log, and it holds the very same state.
    let st = status(&procs[w].addr).await.unwrap();
    assert!(
        st.snapshots_installed >= 1 && st.snapshot_index > 60,
        "promoted before it installed the snapshot: {st:?}"
    );
    // It held the whole log as it was before the wipe (replicated, maybe not yet applied).
    assert!(
        st.last_log_index >= before.last_log_index,
        "promoted holding the log to {} before catching up with {}",
        st.last_log_index,
        before.last_log_index
    );
    let d = same_digests(&procs, Duration::from_secs(120)).await;
    let st = status(&procs[w].addr).await.unwrap_or(st);
    assert_eq!(st.pending_timers, TIMERS);
    let mut client = TimersClient::new(channel(&procs[w].addr).await.unwrap());
    let last = get(&mut client, "m0999999").await.unwrap();
    assert_eq!(last.payload, payload(999_999));

    // Reported, not asserted: a node's resident set is mostly RocksDB's budget (memtables
    // 128 MiB, block cache 64 MiB) whatever the snapshot's size.
    let snap = snapshot_bytes(&procs[w].dir.join("data"));
    let peak = peak_rss(procs[w].child.as_ref().unwrap().id());
    eprintln!(
        "node {id} rejoined as a voter in {rejoin_s:.1} s through a snapshot of {} MB \
         (index {}); its peak RSS {} MB; digests {d:?}",
        snap >> 20,
        st.snapshot_index,
        peak >> 20
    );
    assert!(snap > 100 << 20, "snapshot only {snap} bytes");

    // Its log is JSON, as the config file asked, and records the install.
    let log = std::fs::read_to_string(procs[w].dir.join(format!("timerd-{id}.log"))).unwrap();
    let installed = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "installed snapshot");
    assert!(installed.is_some(), "no JSON 'installed snapshot' line");

    // Phase 4: a backup of the million through the rejoined node, then restored offline.
    let file = tmp.path().join("million.tdb");
    let started = Instant::now();
    let save = ["--output", "json", "backup", "save"];
    let out = run_ok(
        std::process::Command::new(env!("CARGO_BIN_EXE_timerctl"))
            .args(["--endpoint", &procs[w].addr])
            .args(save)
            .arg(&file),
    );
    let save_s = started.elapsed().as_secs_f64();
    let saved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(saved["timers"], TIMERS);
    assert_eq!(saved["pending"], TIMERS);
    let started = Instant::now();
    run_ok(
        std::process::Command::new(timerd())
            .args([
                "--id",
                "9",
                "--listen",
                "127.0.0.1:1",
                "--peers",
                "9=127.0.0.1:1",
            ])
            .arg("--data-dir")
            .arg(tmp.path().join("restored"))
            .arg("--restore-from")
            .arg(&file),
    );
    eprintln!(
        "backup of {TIMERS} timers ({} MB) saved and checked in {save_s:.1} s; restored \
         offline in {:.1} s",
        saved["bytes"].as_u64().unwrap() >> 20,
        started.elapsed().as_secs_f64()
    );
}

/// Runs `cmd` to its end; it must succeed.
fn run_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?}: {err}");
    out
}
