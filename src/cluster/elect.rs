//! Campaigning only with a quorum in reach: timerdb's stand-in for Raft's pre-vote.
//!
//! openraft 0.9 has no pre-vote. A node that cannot reach a quorum still times out, raises its
//! term and asks for votes it cannot get, again and again; once it reaches the others, its
//! higher term deposes their working leader and costs a whole election. Seen on every cluster
//! restart where one node opened its database well before the others: it campaigned while they
//! were still replaying their WALs, and the leader they restored stepped down into a new
//! election (0.4 s of a 2 s restart, docs/benchmarks.md). The same happens when a partitioned
//! node comes back with a term far ahead.
//!
//! So a node starts with elections switched off (`Config::enable_elect = false`) and this task
//! switches them on while a majority of the voters, itself included, is in reach, and off while
//! it is not. "In reach" means the peer answered a gRPC health check (any answer: a NOT_SERVING
//! peer is up and serves RPCs) within the last [`REACH_TTL`]; each peer is checked every
//! [`PROBE_EVERY`], through the same dial address Raft uses.
//!
//! What it does not change: with elections off a node still votes, follows and is replicated
//! to; only its own election timeout is ignored. A leader never campaigns, so it is unaffected.
//! It is not a full pre-vote: a node that reaches a quorum campaigns even with a stale log (its
//! vote requests are then refused on the log check). A node that is not a voter, or the only
//! one, keeps elections on.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Endpoint;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::{NodeId, Raft};
use crate::config::NodeConfig;

/// How often each peer is checked.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// How long one answer keeps a peer in reach; also each check's timeout.
pub const REACH_TTL: Duration = Duration::from_secs(1);

/// When each peer last answered.
type Seen = Arc<Mutex<HashMap<NodeId, Instant>>>;

/// Runs until `shutdown` turns true, switching `raft`'s elections on and off.
pub async fn run(config: Arc<NodeConfig>, raft: Raft, mut shutdown: watch::Receiver<bool>) {
    let seen: Seen = Arc::default();
    let mut probes: HashMap<NodeId, (String, JoinHandle<()>)> = HashMap::new();
    let mut enabled = None;
    let mut tick = tokio::time::interval(PROBE_EVERY / 2);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
        let voters: Vec<(NodeId, String)> = {
            let m = raft.metrics().borrow_watched().clone();
            let membership = m.membership_config.membership().clone();
            membership
                .voter_ids()
                .map(|id| {
                    let addr = membership.get_node(&id).map_or("", |n| n.addr.as_str());
                    (id, config.dial_addr(id, addr))
                })
                .collect()
        };
        // One probe task per peer voter, replaced when its address changes.
        probes.retain(|id, (addr, task)| {
            let keep = voters.iter().any(|(v, a)| v == id && a == addr);
            if !keep {
                task.abort();
            }
            keep
        });
        for (id, addr) in &voters {
            if *id != config.id && !probes.contains_key(id) {
                let task = tokio::spawn(probe(*id, addr.clone(), seen.clone(), config.tls.clone()));
                probes.insert(*id, (addr.clone(), task));
            }
        }
        let me = voters.iter().any(|(id, _)| *id == config.id);
        let reached = {
            let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            voters
                .iter()
                .filter(|(id, _)| {
                    *id == config.id || seen.get(id).is_some_and(|t| t.elapsed() < REACH_TTL)
                })
                .count()
        };
        let on = !me || voters.len() <= 1 || reached > voters.len() / 2;
        if enabled != Some(on) {
            raft.runtime_config().elect(on);
            tracing::info!(
                elections = on,
                reached,
                voters = voters.len(),
                "elections {}",
                if on {
                    "on: a quorum is in reach"
                } else {
                    "off: no quorum in reach"
                }
            );
            enabled = Some(on);
        }
    }
    for (_, (_, task)) in probes {
        task.abort();
    }
}

/// Checks peer `id` at `addr` every [`PROBE_EVERY`], noting in `seen` when it answered.
async fn probe(id: NodeId, addr: String, seen: Seen, tls: crate::tls::Tls) {
    let tuned = |e: Endpoint| e.connect_timeout(REACH_TTL).timeout(REACH_TTL);
    let Ok(channel) = tls.channel(&addr, tuned) else {
        tracing::warn!(id, addr, "elections: bad peer address; never in reach");
        return;
    };
    let mut client = HealthClient::new(channel);
    loop {
        let asked = Instant::now();
        let answered = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .is_ok();
        if answered {
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, Instant::now());
        }
        tokio::time::sleep(PROBE_EVERY.saturating_sub(asked.elapsed())).await;
    }
}
