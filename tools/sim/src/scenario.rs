//! One seed: a cluster, its load, its faults, the check.
//!
//! Everything a run does comes from the seed: the nodes' election timeouts, the clients'
//! operations (the chaos harness's workers and consumers, seeded), and the fault plan below.
//! The runtime's scheduler is seeded too, and its time is paused, so the same seed makes the
//! same history: its hash is part of every summary, and the runner compares two runs of some
//! seeds.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use timerdb::api::pb::{self, timers_client::TimersClient};
use timerdb::sim;
use timerdb_client::Conn;
use tokio::sync::watch;

use timerdb_harness::checker::{self, SkewWindow};
use timerdb_harness::simulated::{SimCluster, NODES};
use timerdb_harness::workload::{self, History, NAMESPACE};

use crate::faults::{heal, inject, Fault};
use crate::load::{configure, slow_consumer, sparse};

/// The simulated clock's start: 2027-01-01, plus a second per seed.
const EPOCH_MS: i64 = 1_798_761_600_000;
/// How long the healed cluster gets to fire, deliver and ack everything (simulated).
const QUIESCE_LIMIT: Duration = Duration::from_secs(120);

/// What every seed runs with.
pub struct Setup {
    pub load: Duration,
    pub plant: Option<Plant>,
}

/// A bug planted in the simulated cluster, to show that the simulator finds bugs of its kind:
/// the regressions of issue 33's findings 1 and 2 (`heads-pass`, `retry-unsafe`), three kinds
/// the chaos harness does not plant (`install-keeps-caches`, `apply-reads-clock`,
/// `retry-refires`; see `timerdb::sim::planted`), and the chaos harness's own
/// (`ignore-cancel`, `fire-early`: `timerd --fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plant(pub &'static str);

impl Plant {
    pub const KNOWN: [&'static str; 9] = [
        "heads-pass",
        "retry-unsafe",
        "install-keeps-caches",
        "apply-reads-clock",
        "retry-refires",
        "drop-stream-acks",
        "drop-queued-acks",
        "ignore-cancel",
        "fire-early",
    ];

    pub fn parse(s: &str) -> Result<Plant, String> {
        Self::KNOWN
            .iter()
            .find(|k| **k == s)
            .map(|k| Plant(k))
            .ok_or_else(|| format!("no planted bug {s:?} (known: {})", Self::KNOWN.join(", ")))
    }

    /// The node faults it needs, and plants it in the simulation.
    fn apply(self) -> timerdb::config::Faults {
        let mut f = timerdb::config::Faults::default();
        match self.0 {
            "ignore-cancel" => f.ignore_cancel = true,
            "fire-early" => f.fire_early_ms = 500,
            name => {
                sim::plant(name);
                // Unknown outcomes, often: what an unsafe retry needs to do harm.
                if name == "retry-unsafe" {
                    f.lose_reply_every = 3;
                }
            }
        }
        f
    }
}

/// What one seed gave.
#[derive(Debug, Default)]
pub struct SeedOutcome {
    pub violations: Vec<String>,
    /// A hash of everything the clients saw and the final digests.
    pub history_hash: u64,
    pub simulated: Duration,
    pub ops: usize,
    pub deliveries: usize,
    pub faults: Vec<String>,
}

impl SeedOutcome {
    pub fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    pub fn summary(&self, seed: u64) -> String {
        let mut s = format!(
            "seed {seed}: {} ({} ops, {} deliveries, {:.1} simulated s, faults [{}], history {:016x})",
            if self.failed() { "FAILED" } else { "ok" },
            self.ops,
            self.deliveries,
            self.simulated.as_secs_f64(),
            self.faults.join(", "),
            self.history_hash
        );
        for v in self.violations.iter().take(10) {
            s.push_str(&format!("\n  VIOLATION {v}"));
        }
        s
    }
}

/// Runs `seed` on a runtime of its own on this thread.
pub fn run_seed(seed: u64, base: &Path, setup: &Setup, verbose: bool) -> SeedOutcome {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = base.join(format!("seed-{seed}-{run}"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(std::env::var_os("TIMERDB_SIM_REALTIME").is_none())
        .rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()))
        .build()
        .expect("a runtime");
    let out = rt.block_on(async {
        sim::install(EPOCH_MS + (seed % 1_000_000) as i64 * 1000, seed);
        let started = tokio::time::Instant::now();
        let mut out = match scenario(seed, &dir, setup, verbose).await {
            Ok(out) => out,
            Err(e) => SeedOutcome {
                violations: vec![format!("the run failed: {e:#}")],
                ..SeedOutcome::default()
            },
        };
        out.simulated = started.elapsed();
        out
    });
    drop(rt);
    sim::uninstall();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn scenario(
    seed: u64,
    dir: &Path,
    setup: &Setup,
    verbose: bool,
) -> anyhow::Result<SeedOutcome> {
    let mut rng = StdRng::seed_from_u64(seed);
    let election = NODES
        .iter()
        .map(|n| (*n, rng.random_range(200..300)))
        .collect();
    let faults = setup.plant.map(Plant::apply).unwrap_or_default();
    let mut c = SimCluster::start(dir, election, faults).await?;
    let Some(_) = c.wait_leader(Duration::from_secs(30)).await else {
        anyhow::bail!("no leader within 30 s");
    };
    let clients: Vec<(u64, TimersClient<Conn>)> =
        NODES.iter().map(|n| (*n, c.client(*n))).collect();
    configure(&c).await?;

    let history: workload::Shared = Arc::new(Mutex::new(History::default()));
    let (stop_workers, workers_rx) = watch::channel(false);
    let (stop_consumers, consumers_rx) = watch::channel(false);
    let mut workers = Vec::new();
    for w in 0..2 {
        let (cl, h, rx) = (clients.clone(), history.clone(), workers_rx.clone());
        workers.push(tokio::spawn(workload::worker(w, cl, h, seed, rx)));
    }
    workers.push(tokio::spawn(sparse(
        clients.clone(),
        seed,
        workers_rx.clone(),
    )));
    let slow = tokio::spawn(slow_consumer(clients.clone(), seed, consumers_rx.clone()));

    let mut consumers = Vec::new();
    let paths = [
        workload::AckPath::Unary,
        workload::AckPath::Queued,
        workload::AckPath::Stream,
    ];
    for (i, path) in paths.into_iter().enumerate() {
        let (cl, h, rx) = (clients.clone(), history.clone(), consumers_rx.clone());
        consumers.push(tokio::spawn(workload::consumer(i, path, cl, h, rx)));
    }

    // Faults, one at a time, with calm between.
    let mut faults = Vec::new();
    let mut skews = Vec::new();
    let until = tokio::time::Instant::now() + setup.load;
    while tokio::time::Instant::now() < until {
        let calm =
            tokio::time::Instant::now() + Duration::from_millis(rng.random_range(500..2_000));
        // Meanwhile, now and then, one node's caches become as stale as their contracts
        // allow (every head early): a cache may make apply faster, never make it write
        // something else (DESIGN 8), so the digests must still agree (a restarted node's
        // caches are exact: the two states differ most).
        loop {
            let step = Duration::from_millis(rng.random_range(50..400));
            if tokio::time::Instant::now() + step >= calm {
                tokio::time::sleep_until(calm).await;
                break;
            }
            tokio::time::sleep(step).await;
            let n = NODES[rng.random_range(0..NODES.len())];
            if let Some(node) = c.node(n) {
                let _ = node.store.stale_heads();
            }
        }
        let fault = match rng.random_range(0..7) {
            0 => Fault::CrashLeader,
            1 => Fault::CrashFollower,
            2 => Fault::IsolateLeader,
            3 => Fault::IsolateFollower,
            4 => Fault::SlowLinks(rng.random_range(20..150)),
            5 => Fault::LossyLinks(rng.random_range(2..30)),
            _ => Fault::SkewLeader(rng.random_range(-2_000..2_000)),
        };
        let span = Duration::from_millis(rng.random_range(500..5_000));
        let from_ms = timerdb_harness::workload::now_ms();
        let target = inject(&mut c, fault, span).await?;
        faults.push(format!("{fault:?}@{target}"));
        if let Fault::SkewLeader(_) = fault {
            skews.push(SkewWindow {
                from_ms,
                to_ms: timerdb_harness::workload::now_ms() + 3_000,
            });
        }
    }
    let _ = stop_workers.send(true);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(15), w).await;
    }
    heal(&mut c).await?;
    c.wait_leader(Duration::from_secs(60))
        .await
        .ok_or_else(|| anyhow::anyhow!("no leader after healing"))?;
    let healed_ms = timerdb_harness::workload::now_ms();
    let quiet = quiesce(&clients).await;
    let _ = stop_consumers.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), slow).await;
    for cons in consumers {
        let _ = tokio::time::timeout(Duration::from_secs(5), cons).await;
    }
    let digests = converge(&c).await;
    let timers = list_all(&clients).await?;
    c.shutdown().await;

    let history = std::mem::take(&mut *history.lock().unwrap());
    let mut findings = checker::check(&history, &timers, &digests, &skews, healed_ms);
    if let Err(e) = quiet {
        findings.violate("not quiescent", e.to_string());
    }
    if let Some(v) = trail_divergence() {
        findings.violate("replicas diverge on the way", v);
    }
    if verbose {
        print_history(&history, &timers, &digests);
    }
    let history_hash = hash_history(&history, &timers, &digests);
    Ok(SeedOutcome {
        violations: findings
            .violations
            .iter()
            .map(|v| format!("{}: {}", v.kind, v.detail))
            .collect(),
        history_hash,
        simulated: Duration::ZERO,
        ops: history.ops.len(),
        deliveries: history.deliveries.len(),
        faults,
    })
}

/// Waits until no timer is PENDING or FIRED (everything fired and acked).
async fn quiesce(clients: &[(u64, TimersClient<Conn>)]) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + QUIESCE_LIMIT;
    loop {
        let left = match list_all(clients).await {
            Ok(timers) => timers
                .values()
                .filter(|t| {
                    t.state == pb::TimerState::Pending as i32
                        || t.state == pb::TimerState::Fired as i32
                })
                .count(),
            Err(_) => usize::MAX,
        };
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("after {QUIESCE_LIMIT:?}: {left} timers PENDING or FIRED");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The first entry after which two replicas' digests differed (`sim::TRAIL_EVERY`).
fn trail_divergence() -> Option<String> {
    let node = |dir: &str| {
        let name = Path::new(dir)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        name.unwrap_or_default()
    };
    let trails = sim::trails();
    let ((group, index), at) = trails
        .iter()
        .find(|(_, at)| at.windows(2).any(|w| w[0].1 != w[1].1))?;
    let digests: Vec<String> = at
        .iter()
        .map(|(dir, d)| format!("{} {d:016x}", node(dir)))
        .collect();
    Some(format!(
        "after entry {index} of group {group}: {}",
        digests.join(", ")
    ))
}

/// Every node's (id, applied index, digest) once they agree, or after 30 s.
async fn converge(c: &SimCluster) -> Vec<(u64, u64, u64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let digests = c.digests();
        let agree = digests.len() == NODES.len()
            && digests
                .windows(2)
                .all(|w| (w[0].1, w[0].2) == (w[1].1, w[1].2));
        if agree || tokio::time::Instant::now() >= deadline {
            return digests;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn list_all(
    clients: &[(u64, TimersClient<Conn>)],
) -> anyhow::Result<BTreeMap<String, pb::Timer>> {
    let mut last = None;
    for (_, client) in clients {
        let mut client = client.clone();
        let mut out = BTreeMap::new();
        let mut token = String::new();
        let listed: anyhow::Result<()> = async {
            loop {
                let req = pb::ListRequest {
                    namespace: NAMESPACE.into(),
                    limit: 10_000,
                    page_token: token.clone(),
                    ..Default::default()
                };
                let page = client.list(req).await?.into_inner();
                out.extend(page.timers.into_iter().map(|t| (t.id.clone(), t)));
                token = page.next_page_token;
                if token.is_empty() {
                    return Ok(());
                }
            }
        }
        .await;
        match listed {
            Ok(()) => return Ok(out),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no node")))
}

fn hash_history(
    h: &History,
    timers: &BTreeMap<String, pb::Timer>,
    digests: &[(u64, u64, u64)],
) -> u64 {
    let mut s = std::collections::hash_map::DefaultHasher::new();
    for op in &h.ops {
        format!("{op:?}").hash(&mut s);
    }
    for d in &h.deliveries {
        format!("{d:?}").hash(&mut s);
    }
    for a in &h.acks {
        format!("{a:?}").hash(&mut s);
    }
    for t in timers.values() {
        format!("{t:?}").hash(&mut s);
    }
    digests.hash(&mut s);
    s.finish()
}

fn print_history(h: &History, timers: &BTreeMap<String, pb::Timer>, digests: &[(u64, u64, u64)]) {
    for op in &h.ops {
        println!(
            "op {:?} {:?} via {} at {}..{} -> {:?}",
            op.kind, op.ids, op.node, op.invoke_ms, op.complete_ms, op.outcome
        );
    }
    for d in &h.deliveries {
        println!(
            "delivered {} attempt {} at {} ({:?})",
            d.id, d.attempt, d.received_ms, d.path
        );
    }
    for (id, attempt, o) in &h.acks {
        println!("acked {id} attempt {attempt}: {o:?}");
    }
    for t in timers.values() {
        let done = [
            pb::TimerState::Acked,
            pb::TimerState::Cancelled,
            pb::TimerState::Dead,
        ];
        if !done.iter().any(|s| *s as i32 == t.state) {
            println!(
                "unfinished {} state {} attempts {} fire_at {} fired_at {} wake_at {}",
                t.id, t.state, t.attempts, t.fire_at_ms, t.fired_at_ms, t.wake_at_ms
            );
        }
    }
    println!("final: {} timers; digests {digests:?}", timers.len());
}
