//! One chaos run: start the cluster, load it, inject the plan's faults, heal, wait for quiet,
//! collect the final state and digests, and check.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::secure::Conn;
use anyhow::{bail, Context};
use timerdb::api::pb::{self, namespaces_client::NamespacesClient, timers_client::TimersClient};
use tokio::sync::watch;

use crate::checker::{self, Findings, SkewWindow};
use crate::cluster::{ProcCluster, DISK_NODE, NODES};
use crate::plan::{self, Fault, Mix, Step, Target};
use crate::proxy::Mode;
use crate::push::{self, SharedPush, PUSH_NAMESPACE};
use crate::recurring;
use crate::secure::Secure;
use crate::workload::{self, now_ms, History, Shared, NAMESPACE};

pub struct RunConfig {
    pub seed: u64,
    pub length: Duration,
    pub timerd: PathBuf,
    pub dir: PathBuf,
    /// Deliberate bug passed to every node (proof runs); empty otherwise.
    pub fault: String,
    pub mix: Mix,
    pub workers: usize,
    pub tmpfs: bool,
    /// TLS, mTLS, peer mTLS and auth on (`--secure DIR`).
    pub secure: Option<Secure>,
}

/// A fault as it happened.
#[derive(Debug, Clone)]
pub struct Window {
    pub fault: Fault,
    pub node: u64,
    pub from_ms: i64,
    pub to_ms: i64,
    /// Time until another node led, for faults that hit the leader.
    pub failover: Option<Duration>,
}

pub struct RunReport {
    pub seed: u64,
    pub windows: Vec<Window>,
    pub history: History,
    pub timers: BTreeMap<String, pb::Timer>,
    pub findings: Findings,
    pub quiesce: Duration,
}

/// How long the healed cluster gets to fire, deliver and ack everything.
const QUIESCE_LIMIT: Duration = Duration::from_secs(120);

pub async fn run(cfg: &RunConfig) -> anyhow::Result<RunReport> {
    std::fs::create_dir_all(&cfg.dir)?;
    let secure = cfg.secure.clone();
    let mut cluster =
        ProcCluster::start(&cfg.dir, &cfg.timerd, &cfg.fault, cfg.tmpfs, true, secure).await?;
    cluster.wait_leader(Duration::from_secs(30)).await?;
    cluster.enable_auth().await?;
    let mut clients = Vec::new();
    for id in NODES {
        clients.push((id, cluster.timers(id).await?));
    }
    let pushed: SharedPush = Arc::default();
    let push_url = push::receiver(pushed.clone(), cfg.seed).await?;
    configure_namespace(&cluster, &push_url).await?;
    let series = recurring::plans(now_ms(), cfg.length);
    recurring::create(&clients, &series).await?;

    let history: Shared = Arc::new(Mutex::new(History::default()));
    let (stop_workers, workers_rx) = watch::channel(false);
    let (stop_consumers, consumers_rx) = watch::channel(false);
    let mut workers = Vec::new();
    for w in 0..cfg.workers {
        let (c, h, rx) = (clients.clone(), history.clone(), workers_rx.clone());
        workers.push(tokio::spawn(workload::worker(w, c, h, cfg.seed, rx)));
    }
    let (c, rx) = (clients.clone(), workers_rx.clone());
    workers.push(tokio::spawn(push::worker(c, pushed.clone(), cfg.seed, rx)));
    let mut consumers = Vec::new();
    // One consumer acks with unary calls, the other on its delivery stream.
    for (c, path) in [workload::AckPath::Unary, workload::AckPath::Stream]
        .into_iter()
        .enumerate()
    {
        let (cl, h, rx) = (clients.clone(), history.clone(), consumers_rx.clone());
        consumers.push(tokio::spawn(workload::consumer(c, path, cl, h, rx)));
    }

    let steps = plan::plan(cfg.seed, cfg.length, cfg.mix);
    let windows = inject_all(&mut cluster, &steps, cfg.length).await?;

    let _ = stop_workers.send(true);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(15), w).await;
    }
    cluster.heal()?;
    cluster.wait_leader(Duration::from_secs(60)).await?;
    let started = Instant::now();
    let quiet = quiesce(&clients).await;
    let quiesce = started.elapsed();
    let _ = stop_consumers.send(true);
    for c in consumers {
        let _ = tokio::time::timeout(Duration::from_secs(5), c).await;
    }
    let digests = converge(&cluster).await;
    let timers = list_all(&clients, NAMESPACE).await?;
    let series_views = recurring::views(&clients, &series).await;
    let push_timers = list_all(&clients, PUSH_NAMESPACE).await?;
    cluster.stop();

    let history = std::mem::take(&mut *history.lock().unwrap());
    let skews: Vec<SkewWindow> = windows
        .iter()
        .filter(|w| matches!(w.fault, Fault::Skew(..)))
        .map(|w| SkewWindow {
            from_ms: w.from_ms,
            to_ms: w.to_ms,
        })
        .collect();
    let mut findings = checker::check(&history, &timers, &digests, &skews);
    push::check(&mut findings, &pushed.lock().unwrap(), &push_timers, &skews);
    recurring::check(&mut findings, &series, &timers, &series_views);
    if let Err(e) = quiet {
        findings.violations.push(checker::Violation {
            kind: "not quiescent",
            detail: e.to_string(),
        });
    }
    Ok(RunReport {
        seed: cfg.seed,
        windows,
        history,
        timers,
        findings,
        quiesce,
    })
}

/// Short timeouts and a long retention: redeliveries happen within the run, nothing is purged
/// before it is checked, and no timer goes DEAD. The push namespace pushes to `push_url`.
async fn configure_namespace(cluster: &ProcCluster, push_url: &str) -> anyhow::Result<()> {
    let policy = pb::NamespacePolicy {
        ack_timeout_ms: 3_000,
        max_attempts: 1_000,
        backoff_min_ms: 200,
        backoff_max_ms: 2_000,
        retention_ms: 24 * 3600 * 1000,
        ..Default::default()
    };
    let mut ns = NamespacesClient::new(cluster.channel(1).await?);
    let req = pb::PutNamespaceRequest {
        name: NAMESPACE.into(),
        policy: Some(policy),
    };
    ns.put_namespace(req)
        .await
        .context("configuring the namespace")?;
    let req = pb::PutNamespaceRequest {
        name: PUSH_NAMESPACE.into(),
        policy: Some(push::policy(push_url)),
    };
    ns.put_namespace(req)
        .await
        .context("configuring the push namespace")?;
    Ok(())
}

async fn inject_all(
    cluster: &mut ProcCluster,
    steps: &[Step],
    length: Duration,
) -> anyhow::Result<Vec<Window>> {
    let t0 = tokio::time::Instant::now();
    let mut windows = Vec::new();
    for step in steps {
        tokio::time::sleep_until(t0 + step.at).await;
        let leader = cluster.leader().await;
        let node = match target_of(step.fault) {
            Some(Target::Leader) => leader.unwrap_or(1),
            Some(Target::Follower) => NODES.into_iter().find(|n| Some(*n) != leader).unwrap_or(1),
            None => DISK_NODE,
        };
        if step.fault == Fault::DiskFull && !cluster.has_tmpfs() {
            continue;
        }
        let from_ms = now_ms();
        inject(cluster, step.fault, node)?;
        let failover = if step.fault.hits_leader() && leader == Some(node) {
            wait_new_leader(cluster, node, step.length).await
        } else {
            None
        };
        tokio::time::sleep_until(t0 + step.at + step.length).await;
        heal(cluster, step.fault, node)?;
        windows.push(Window {
            fault: step.fault,
            node,
            from_ms,
            to_ms: now_ms(),
            failover,
        });
    }
    tokio::time::sleep_until(t0 + length).await;
    Ok(windows)
}

fn target_of(fault: Fault) -> Option<Target> {
    match fault {
        Fault::Kill(t) | Fault::Pause(t) | Fault::Partition(t) | Fault::Skew(t, _) => Some(t),
        Fault::Delay(_) | Fault::Drop(_) | Fault::DiskFull => None,
    }
}

fn inject(cluster: &mut ProcCluster, fault: Fault, node: u64) -> anyhow::Result<()> {
    match fault {
        Fault::Kill(_) => cluster.kill(node),
        Fault::Pause(_) => cluster.signal_pause(node, true),
        Fault::Partition(_) => cluster.set_links(Some(node), Mode::Blackhole),
        Fault::Delay(ms) => cluster.set_links(None, Mode::Delay(ms)),
        Fault::Drop(p) => cluster.set_links(None, Mode::Flaky(p)),
        Fault::Skew(_, ms) => cluster.restart(node, ms)?,
        Fault::DiskFull => cluster.fill_disk(true)?,
    }
    Ok(())
}

fn heal(cluster: &mut ProcCluster, fault: Fault, node: u64) -> anyhow::Result<()> {
    match fault {
        Fault::Kill(_) | Fault::Skew(..) => cluster.restart(node, 0)?,
        Fault::Pause(_) => cluster.signal_pause(node, false),
        Fault::Partition(_) | Fault::Delay(_) | Fault::Drop(_) => {
            cluster.set_links(None, Mode::Pass)
        }
        Fault::DiskFull => {
            cluster.fill_disk(false)?;
            // A node that hit ENOSPC stopped its Raft (a storage error is fatal): restart it.
            cluster.restart(DISK_NODE, 0)?;
        }
    }
    Ok(())
}

/// How long until a node other than `old` is the agreed leader, within `limit` (+2 s).
async fn wait_new_leader(cluster: &ProcCluster, old: u64, limit: Duration) -> Option<Duration> {
    let started = tokio::time::Instant::now();
    while started.elapsed() < limit + Duration::from_secs(2) {
        if cluster.leader().await.is_some_and(|l| l != old) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Waits until every timer due has fired and every fired timer is acked, in both namespaces.
async fn quiesce(clients: &[(u64, TimersClient<Conn>)]) -> anyhow::Result<()> {
    let deadline = Instant::now() + QUIESCE_LIMIT;
    loop {
        let both = match list_all(clients, NAMESPACE).await {
            Ok(mut timers) => list_all(clients, PUSH_NAMESPACE).await.map(|push| {
                timers.extend(push.into_iter().map(|(id, t)| (format!("push/{id}"), t)));
                timers
            }),
            Err(e) => Err(e),
        };
        let (pending, fired) = match both {
            Ok(timers) => {
                let now = now_ms();
                let pending = timers
                    .values()
                    .filter(|t| t.state == pb::TimerState::Pending as i32 && t.fire_at_ms <= now)
                    .count();
                let future = timers
                    .values()
                    .filter(|t| t.state == pb::TimerState::Pending as i32 && t.fire_at_ms > now)
                    .count();
                let fired = timers
                    .values()
                    .filter(|t| t.state == pb::TimerState::Fired as i32)
                    .count();
                if pending + future + fired == 0 {
                    return Ok(());
                }
                (pending + future, fired)
            }
            Err(_) => (usize::MAX, usize::MAX),
        };
        if Instant::now() >= deadline {
            bail!("after {QUIESCE_LIMIT:?}: {pending} timers PENDING, {fired} FIRED but not ACKED");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every node's (id, applied index, digest) once they agree, or as they are after 30 s.
async fn converge(cluster: &ProcCluster) -> Vec<(u64, u64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut digests = Vec::new();
        for id in NODES {
            if let Some(d) = cluster.digest(id).await {
                digests.push((d.node_id, d.applied_index, d.digest));
            }
        }
        let agree = digests.len() == NODES.len()
            && digests
                .windows(2)
                .all(|w| (w[0].1, w[0].2) == (w[1].1, w[1].2));
        if agree || Instant::now() >= deadline {
            return digests;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `namespace`'s timers by id, through List paging on any node that answers.
async fn list_all(
    clients: &[(u64, TimersClient<Conn>)],
    namespace: &str,
) -> anyhow::Result<BTreeMap<String, pb::Timer>> {
    let mut last = None;
    for (_, client) in clients {
        match list_via(&mut client.clone(), namespace).await {
            Ok(t) => return Ok(t),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no node")))
}

async fn list_via(
    client: &mut TimersClient<Conn>,
    namespace: &str,
) -> anyhow::Result<BTreeMap<String, pb::Timer>> {
    let mut out = BTreeMap::new();
    let mut token = String::new();
    loop {
        let req = pb::ListRequest {
            namespace: namespace.into(),
            limit: 10_000,
            page_token: token,
            ..Default::default()
        };
        let mut req = tonic::Request::new(req);
        req.set_timeout(Duration::from_secs(10));
        let page = client.list(req).await?.into_inner();
        out.extend(page.timers.into_iter().map(|t| (t.id.clone(), t)));
        token = page.next_page_token;
        if token.is_empty() {
            return Ok(out);
        }
    }
}
