//! The `pending` workload: load N timers due in a month (so none fires), then report what they
//! cost (on-disk size and resident memory of each node: the most while loading, right after the
//! load and at rest) and
//! how long a restart takes, at rest: a follower killed and started again until it has caught
//! up and answers, then the whole cluster killed and started again until it takes a write. Last,
//! the whole cluster is killed right after loading a third as many again (every WAL as full as
//! its cap lets it get) and timed to its first write.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::report::Recorder;
use crate::target::{now_ms, schedule_req, Target};
use crate::write::load;
use crate::Opts;
use timerdb_harness::process::NODES;

const DAY_MS: i64 = 24 * 3600 * 1000;

pub async fn pending(
    target: &mut Target,
    opts: &Opts,
    count: u64,
    rec: &mut Recorder<'_>,
) -> anyhow::Result<()> {
    let procs = target.procs("pending")?;
    let pids: Vec<u32> = NODES.iter().filter_map(|id| procs.pid(*id)).collect();
    let ns = "pending";
    let base = now_ms() + DAY_MS;
    // Spread over 30 days, one ms apart cycling: many timers share each wheel bucket.
    let due = move |i: u64| base + (i as i64 * 7919) % (30 * DAY_MS);
    // The largest resident set of any node while the load runs, sampled 4 times a second.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sampler = tokio::spawn(async move {
        let mut most = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    most = pids.iter().map(|p| rss_bytes(*p)).fold(most, u64::max);
                }
                _ = &mut stopped => return most,
            }
        }
    });
    let secs = load(target, opts, ns, count, Arc::new(due), "pending: load").await?;
    let _ = stop.send(());
    let during = sampler.await.unwrap_or(0);
    rec.put("load rate", "timers/s", count as f64 / secs);
    rec.put("RSS during the load (max)", "MiB", during as f64 / MIB);
    let index = caught_up(target, None, Duration::from_secs(300)).await?;
    let (disk, rss) = footprint(target, "pending")?;
    rec.put("disk per node (max)", "MiB", disk / MIB);
    rec.put("RSS right after the load (max)", "MiB", rss / MIB);

    // At rest: nothing written for a while (a build that flushes quiet memtables has by now).
    tokio::time::sleep(REST).await;
    let (_, rss) = footprint(target, "pending")?;
    rec.put("RSS at rest (max)", "MiB", rss / MIB);

    // A follower at rest: SIGKILL, start, and time until it has applied everything and answers.
    let leader = target.wait_leader(Duration::from_secs(10)).await?;
    let follower = target.followers(leader)[0];
    let procs = target.procs("pending")?;
    procs.kill(follower);
    let started = Instant::now();
    procs.restart(follower, 0)?;
    caught_up(target, Some((follower, index)), Duration::from_secs(120)).await?;
    rec.put(
        "follower restart to caught up",
        "s",
        started.elapsed().as_secs_f64(),
    );
    let procs = target.procs("pending")?;
    let rss_after = procs.pid(follower).map_or(0, rss_bytes) as f64;
    rec.put("RSS after restart", "MiB", rss_after / MIB);

    // The whole cluster at rest: SIGKILL all three, start them, time until a write commits.
    rec.put(
        "cluster restart at rest to first write",
        "s",
        cluster_restart(target).await?,
    );

    // The whole cluster SIGKILLed right after a load (a third as many again, into another
    // namespace: enough to fill the WAL up to its cap), its WALs as full as they get.
    let more = (count / 3).max(1);
    let base = now_ms() + DAY_MS;
    let due = move |i: u64| base + (i as i64 * 7919) % (30 * DAY_MS);
    load(
        target,
        opts,
        "pending-more",
        more,
        Arc::new(due),
        "pending: load more",
    )
    .await?;
    caught_up(target, None, Duration::from_secs(120)).await?;
    rec.put(
        "cluster restart right after a load to first write",
        "s",
        cluster_restart(target).await?,
    );
    Ok(())
}

/// How long the workload leaves the cluster without writes before it measures "at rest".
pub(crate) const REST: Duration = Duration::from_secs(8);

/// The largest data dir and the largest resident set of the three nodes, in bytes.
pub(crate) fn footprint(target: &mut Target, workload: &str) -> anyhow::Result<(f64, f64)> {
    let procs = target.procs(workload)?;
    let mut disk = 0.0f64;
    let mut rss = 0.0f64;
    for id in NODES {
        disk = disk.max(dir_bytes(&procs.data_dir(id)) as f64);
        rss = rss.max(procs.pid(id).map_or(0, rss_bytes) as f64);
    }
    Ok((disk, rss))
}

/// SIGKILLs all three nodes, starts them again and returns the seconds until a write commits.
async fn cluster_restart(target: &mut Target) -> anyhow::Result<f64> {
    let procs = target.procs("pending")?;
    for id in NODES {
        procs.kill(id);
    }
    let started = Instant::now();
    for id in NODES {
        procs.restart(id, 0)?;
    }
    first_write(target, Duration::from_secs(120)).await?;
    Ok(started.elapsed().as_secs_f64())
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// Waits until `node` (or every node) answers Status with an applied index of at least `index`
/// (or, for every node, the leader's last log index). Returns that index.
pub(crate) async fn caught_up(
    target: &Target,
    node: Option<(u64, u64)>,
    within: Duration,
) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let want = match node {
            Some((_, index)) => index,
            None => match target.leader().await {
                Some(l) => target
                    .status(l)
                    .await
                    .map_or(u64::MAX, |s| s.last_log_index),
                None => u64::MAX,
            },
        };
        let mut ok = true;
        for id in target.addrs.keys() {
            if node.is_some_and(|(n, _)| n != *id) {
                continue;
            }
            let s = target.status(*id).await;
            ok &= s.is_some_and(|s| s.applied_index >= want && s.leader_id != 0);
        }
        if ok {
            return Ok(want);
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("nodes did not catch up within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until a Schedule through node 1 commits.
async fn first_write(target: &Target, within: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    let mut client = target.timers(NODES[0], 1)?.remove(0);
    loop {
        let req = schedule_req(
            "pending",
            format!("probe-{}", now_ms()),
            now_ms() + DAY_MS,
            0,
        );
        let mut req = tonic::Request::new(req);
        req.set_timeout(Duration::from_secs(2));
        if client.schedule(req).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("no write committed within {within:?} of the restart");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Resident set size of process `pid`, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}
