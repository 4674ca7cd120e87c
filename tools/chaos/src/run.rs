//! One chaos run: start the cluster, load it, inject the plan's faults, heal, wait for quiet,
//! collect the final state and digests, and check.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use timerdb::api::pb::{self, namespaces_client::NamespacesClient, timers_client::TimersClient};
use timerdb_harness::secure::Conn;
use tokio::sync::watch;

use crate::plan::{self, Fault, Mix, Step, Target};
use crate::push::{self, SharedPush, PUSH_NAMESPACE};
use crate::recurring;
use timerdb_harness::checker::{self, Findings, SkewWindow};
use timerdb_harness::process::{Options, ProcCluster, DISK_NODE, NODES};
use timerdb_harness::proxy::Mode;
use timerdb_harness::secure::Secure;
use timerdb_harness::workload::{self, now_ms, History, Shared, NAMESPACE};

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
    // Snapshots every 1,000 entries, 200 kept behind: a node wiped or left behind catches up
    // through a snapshot install, not only from the log.
    let extra = ["--snapshot-every-entries=1000", "--keep-log-entries=200"].map(String::from);
    let options = Options {
        fault: cfg.fault.clone(),
        tmpfs: cfg.tmpfs,
        proxies: true,
        secure,
        extra: extra.to_vec(),
    };
    let mut cluster = ProcCluster::start(&cfg.dir, &cfg.timerd, options).await?;
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
    // One consumer acks with unary calls answered once applied, one with unary calls answered
    // once queued, one on its delivery stream.
    let paths = [
        workload::AckPath::Unary,
        workload::AckPath::Queued,
        workload::AckPath::Stream,
    ];
    for (c, path) in paths.into_iter().enumerate() {
        let (cl, h, rx) = (clients.clone(), history.clone(), consumers_rx.clone());
        consumers.push(tokio::spawn(workload::consumer(c, path, cl, h, rx)));
    }

    let steps = plan::plan(cfg.seed, cfg.length, cfg.mix);
    let (windows, trouble) = inject_all(&mut cluster, &steps, cfg.length).await?;

    let _ = stop_workers.send(true);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(15), w).await;
    }
    cluster.heal()?;
    cluster.wait_leader(Duration::from_secs(60)).await?;
    let healed_ms = now_ms();
    let started = Instant::now();
    let quiet = quiesce(&clients).await;
    let quiesce = started.elapsed();
    let _ = stop_consumers.send(true);
    for c in consumers {
        let _ = tokio::time::timeout(Duration::from_secs(5), c).await;
    }
    let digests = converge(&cluster).await;
    let timers = list_all(&clients, NAMESPACE).await?;
    let recurring_views = recurring::views(&clients, &series).await;
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
    let mut findings = checker::check(&history, &timers, &digests, &skews, healed_ms);
    push::check(&mut findings, &pushed.lock().unwrap(), &push_timers, &skews);
    recurring::check(&mut findings, &series, &timers, &recurring_views);
    findings.violations.extend(trouble);
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

/// The faults as they happened, and the violations the faults themselves met (a node that
/// could not be removed or did not come back).
async fn inject_all(
    cluster: &mut ProcCluster,
    steps: &[Step],
    length: Duration,
) -> anyhow::Result<(Vec<Window>, Vec<checker::Violation>)> {
    let t0 = tokio::time::Instant::now();
    let mut windows = Vec::new();
    let mut trouble = Vec::new();
    for step in steps {
        tokio::time::sleep_until(t0 + step.at).await;
        let leader = cluster.leader().await;
        let node = match target_of(step.fault) {
            Some(Target::Leader) => leader.unwrap_or(1),
            Some(Target::Follower) => NODES.into_iter().find(|n| Some(*n) != leader).unwrap_or(1),
            None => DISK_NODE,
        };
        let disk = matches!(step.fault, Fault::DiskFull | Fault::InstallDiskFull);
        if disk && !cluster.has_tmpfs() {
            continue;
        }
        let from_ms = now_ms();
        let injected = inject(cluster, step.fault, node, step.length).await;
        let failover = if step.fault.hits_leader() && leader == Some(node) {
            wait_new_leader(cluster, node, step.length).await
        } else {
            None
        };
        tokio::time::sleep_until(t0 + step.at + step.length).await;
        let healed = heal(cluster, step.fault, node).await;
        for r in [injected, healed] {
            if let Err(e) = r {
                trouble.push(checker::Violation {
                    kind: "membership or restart failed",
                    detail: format!("{} on node {node}: {e:#}", step.fault.kind()),
                });
            }
        }
        windows.push(Window {
            fault: step.fault,
            node,
            from_ms,
            to_ms: now_ms(),
            failover,
        });
    }
    tokio::time::sleep_until(t0 + length).await;
    Ok((windows, trouble))
}

fn target_of(fault: Fault) -> Option<Target> {
    match fault {
        Fault::Kill(t)
        | Fault::Pause(t)
        | Fault::Partition(t)
        | Fault::Skew(t, _)
        | Fault::Rejoin(t) => Some(t),
        Fault::Delay(_)
        | Fault::Drop(_)
        | Fault::DiskFull
        | Fault::RollingRestart
        | Fault::InstallDiskFull => None,
    }
}

/// How long a membership change or a node's catching up may take before it counts as failed.
const MEMBERSHIP_LIMIT: Duration = Duration::from_secs(60);

async fn inject(
    cluster: &mut ProcCluster,
    fault: Fault,
    node: u64,
    length: Duration,
) -> anyhow::Result<()> {
    match fault {
        Fault::Kill(_) => cluster.kill(node),
        Fault::Pause(_) => cluster.signal_pause(node, true),
        Fault::Partition(_) => cluster.set_links(Some(node), Mode::Blackhole),
        Fault::Delay(ms) => cluster.set_links(None, Mode::Delay(ms)),
        Fault::Drop(p) => cluster.set_links(None, Mode::Flaky(p)),
        Fault::Skew(_, ms) => cluster.restart(node, ms)?,
        Fault::DiskFull => cluster.fill_disk(true)?,
        Fault::Rejoin(_) => {
            cluster.remove_member(node, MEMBERSHIP_LIMIT).await?;
            cluster.wipe(node)?;
        }
        Fault::RollingRestart => {
            let leader = cluster.leader().await;
            let mut order: Vec<u64> = NODES.into_iter().filter(|n| Some(*n) != leader).collect();
            order.extend(leader);
            for n in order {
                cluster.restart_gracefully(n)?;
                cluster.wait_caught_up(n, MEMBERSHIP_LIMIT).await?;
            }
        }
        Fault::InstallDiskFull => install_disk_full(cluster, node, length).await?,
    }
    Ok(())
}

/// Removes, wipes and restarts `node` empty, asks for it to be added back, and fills its disk
/// the moment a snapshot starts to arrive (or when `length` ends without one).
async fn install_disk_full(
    cluster: &mut ProcCluster,
    node: u64,
    length: Duration,
) -> anyhow::Result<()> {
    cluster.remove_member(node, MEMBERSHIP_LIMIT).await?;
    cluster.wipe(node)?;
    cluster.start_empty(node)?;
    // Room for the empty node's RocksDB, not for the snapshot: filling the rest is then fast
    // enough to land while the snapshot arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.fill_disk_but(48 << 20)?;
    let cluster = &*cluster;
    // The AddNode cannot finish while the disk is full: it gives up at the window's end.
    let add = async {
        let _ = tokio::time::timeout(length, cluster.add_member(node, length)).await;
    };
    let fill = async {
        let started = tokio::time::Instant::now();
        while !cluster.receiving_snapshot(node) && started.elapsed() < length {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let during = cluster.receiving_snapshot(node);
        cluster.fill_disk(true).map(|()| during)
    };
    let ((), during) = tokio::join!(add, fill);
    println!(
        "  disk full in install: node {node}'s disk filled {}",
        if during? {
            "while it received a snapshot"
        } else {
            "with no snapshot arriving"
        }
    );
    Ok(())
}

async fn heal(cluster: &mut ProcCluster, fault: Fault, node: u64) -> anyhow::Result<()> {
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
        Fault::Rejoin(_) => {
            cluster.start_empty(node)?;
            cluster.add_member(node, MEMBERSHIP_LIMIT).await?;
        }
        Fault::RollingRestart => {}
        Fault::InstallDiskFull => {
            cluster.fill_disk(false)?;
            // Restarted on whatever the failed install left: it must start and catch up.
            cluster.restart(node, 0)?;
            cluster.add_member(node, MEMBERSHIP_LIMIT).await?;
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
