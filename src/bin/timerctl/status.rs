//! `timerctl status`: the whole cluster as one table.
//!
//! The node at `--endpoint` names the members; each member is then asked for its own status
//! (concurrently, 2 s each), so the table shows what every node says of itself, and a node
//! that does not answer shows as `unreachable` rather than hiding the rest. LAG is how many
//! entries a node has yet to apply behind the leader's log (or its own commit index when no
//! leader answers).

use std::time::Duration;

use crate::Ch as Channel;
use futures::future::join_all;
use serde_json::{json, Value};
use timerdb::api::pb::{self, cluster_client::ClusterClient};

use crate::output::{self, status_err};

/// One member and what it answered.
struct Row {
    member: pb::Member,
    status: Result<pb::StatusResponse, String>,
}

/// Asks the member at `addr` with the same TLS settings and credential as the first node.
async fn ask(addr: &str) -> Result<pb::StatusResponse, String> {
    let limit = Duration::from_secs(2);
    let ch = tokio::time::timeout(limit, crate::channel(addr))
        .await
        .map_err(|_| "no connection within 2 s".to_string())?
        .map_err(|e| format!("{e:#}"))?;
    let mut req = tonic::Request::new(pb::StatusRequest {});
    req.set_timeout(limit);
    let reply = ClusterClient::new(ch).status(req).await;
    reply
        .map(|r| r.into_inner())
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

pub async fn status(ch: Channel) -> anyhow::Result<()> {
    let first = ClusterClient::new(ch)
        .status(pb::StatusRequest {})
        .await
        .map_err(status_err)?
        .into_inner();
    let mut members = first.members.clone();
    if members.is_empty() {
        // A node waiting to join knows no members yet: show it alone.
        members.push(pb::Member {
            node_id: first.node_id,
            addr: "(asked)".into(),
            voter: false,
        });
    }
    let rows: Vec<Row> = join_all(members.into_iter().map(|member| async {
        let status = if member.node_id == first.node_id {
            Ok(first.clone())
        } else {
            ask(&member.addr).await
        };
        Row { member, status }
    }))
    .await;
    let leader = rows
        .iter()
        .filter_map(|r| r.status.as_ref().ok())
        .find(|s| s.role == "leader");
    if output::json() {
        output::doc(to_json(&rows, leader));
    } else {
        print_table(&rows, leader);
    }
    Ok(())
}

fn lag(s: &pb::StatusResponse, leader: Option<&pb::StatusResponse>) -> u64 {
    let head = leader.map_or(s.commit_index, |l| l.last_log_index);
    head.saturating_sub(s.applied_index)
}

fn to_json(rows: &[Row], leader: Option<&pb::StatusResponse>) -> Value {
    let nodes: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut v =
                json!({"id": r.member.node_id, "addr": r.member.addr, "voter": r.member.voter});
            match &r.status {
                Ok(s) => {
                    v["role"] = s.role.clone().into();
                    v["term"] = s.term.into();
                    v["leader_id"] = s.leader_id.into();
                    v["last_log_index"] = s.last_log_index.into();
                    v["commit_index"] = s.commit_index.into();
                    v["applied_index"] = s.applied_index.into();
                    v["lag"] = lag(s, leader).into();
                    v["pending"] = s.pending_timers.into();
                    v["snapshot_index"] = s.snapshot_index.into();
                    v["purged_index"] = s.purged_index.into();
                }
                Err(e) => {
                    v["role"] = "unreachable".into();
                    v["error"] = e.clone().into();
                }
            }
            v
        })
        .collect();
    json!({"leader": leader.map(|l| l.node_id), "nodes": nodes})
}

fn print_table(rows: &[Row], leader: Option<&pb::StatusResponse>) {
    println!(
        "{:>4}  {:<22}  {:<11}  {:<7}  {:>5}  {:>9}  {:>6}  {:>9}  {:>9}",
        "ID", "ADDRESS", "ROLE", "MEMBER", "TERM", "APPLIED", "LAG", "PENDING", "SNAPSHOT"
    );
    for r in rows {
        let member = if r.member.voter { "voter" } else { "learner" };
        let (id, addr) = (r.member.node_id, &r.member.addr);
        match &r.status {
            Ok(s) => println!(
                "{id:>4}  {addr:<22}  {:<11}  {member:<7}  {:>5}  {:>9}  {:>6}  {:>9}  {:>9}",
                s.role,
                s.term,
                s.applied_index,
                lag(s, leader),
                s.pending_timers,
                s.snapshot_index
            ),
            Err(e) => println!(
                "{id:>4}  {addr:<22}  {:<11}  {member:<7}  {e}",
                "unreachable"
            ),
        }
    }
    match leader {
        Some(l) => println!("leader: node {} (term {})", l.node_id, l.term),
        None => println!(
            "no leader answers: writes and reads wait until a majority of voters is up and elects one"
        ),
    }
}
