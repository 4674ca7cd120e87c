//! `timerctl slots` and `timerctl group list|transfer`: the slot map and the Raft groups
//! (docs/sharding.md §4). Both read `Cluster.Slots` from the node asked (its view: a router's
//! hint, not a linearizable read); `group transfer` moves one group's leader, from any node.
//! Moving a group's replicas to other nodes comes with replica moves (issue 36, step 6).

use crate::Ch as Channel;
use clap::Subcommand;
use serde_json::json;
use timerdb::api::pb::{self, cluster_client::ClusterClient};

use crate::output::{self, status_err};

#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    /// Every Raft group: its hash slots, leader, term, members, pending timers.
    List,
    /// Hand a group's leadership to another voter (the most up-to-date one unless --to names
    /// one).
    Transfer {
        /// The group (0: the meta group).
        group: u32,
        #[arg(long)]
        to: Option<u64>,
    },
}

/// `timerctl slots`: which group owns which hash slots, and where its leader serves; with a
/// namespace, only the group holding its timers (the hash slot computed here, as a client
/// routing directly would: `timerdb_client::hash_slot`).
pub async fn slots(ch: Channel, namespace: Option<String>) -> anyhow::Result<()> {
    let map = read(ch).await?;
    if let Some(ns) = namespace {
        return of_namespace(&map, &ns);
    }
    if output::json() {
        output::doc(slots_json(&map));
        return Ok(());
    }
    println!(
        "slot map epoch {} ({} hash slots; as node {} knows it)",
        map.epoch, map.hash_slots, map.node_id
    );
    println!(
        "{:<12}  {:>5}  {:>6}  LEADER",
        "HASH SLOTS", "GROUP", "SLOTS"
    );
    let mut rows: Vec<(&pb::HashSlotRange, &pb::GroupInfo)> = (map.groups.iter())
        .flat_map(|g| g.hash_slots.iter().map(move |r| (r, g)))
        .collect();
    rows.sort_by_key(|(r, _)| r.start);
    for (range, g) in rows {
        let span = format!("{}-{}", range.start, range.end.saturating_sub(1));
        let count = range.end.saturating_sub(range.start);
        println!("{span:<12}  {:>5}  {count:>6}  {}", g.group, leader(g));
    }
    Ok(())
}

pub async fn group(ch: Channel, command: GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::List => list(read(ch).await?),
        GroupCommand::Transfer { group, to } => {
            let req = pb::TransferLeaderRequest {
                node_id: to.unwrap_or(0),
                group,
            };
            let r = ClusterClient::new(ch).transfer_leader(req).await;
            let r = r.map_err(status_err)?.into_inner();
            if r.group != group {
                anyhow::bail!(
                    "the node moved group {}'s leader, not group {group}'s: it is a build \
                     before groups, which cannot move a data group's",
                    r.group
                );
            }
            let leader = r.leader_id;
            match output::json() {
                true => output::doc(json!({ "group": group, "leader": leader })),
                false => println!("group {group}'s leader is now node {leader}"),
            }
        }
    }
    Ok(())
}

fn of_namespace(map: &pb::SlotsResponse, ns: &str) -> anyhow::Result<()> {
    use timerdb_client::hash_slot::{hash_slot, Placement};
    let h = u32::from(hash_slot(ns, Placement::Pinned, "").get());
    let g = (map.groups.iter())
        .find(|g| g.hash_slots.iter().any(|r| (r.start..r.end).contains(&h)))
        .ok_or_else(|| anyhow::anyhow!("no group owns hash slot {h} in the node's map"))?;
    match output::json() {
        true => output::doc(json!({
            "namespace": ns,
            "hash_slot": h,
            "group": g.group,
            "leader": g.leader_id,
            "leader_addr": g.leader_addr,
            "epoch": map.epoch,
        })),
        false => println!(
            "namespace {ns:?}: hash slot {h}, group {}, leader {}",
            g.group,
            leader(g)
        ),
    }
    Ok(())
}

async fn read(ch: Channel) -> anyhow::Result<pb::SlotsResponse> {
    let r = ClusterClient::new(ch).slots(pb::SlotsRequest {}).await;
    Ok(r.map_err(status_err)?.into_inner())
}

fn list(map: pb::SlotsResponse) {
    if output::json() {
        return output::doc(slots_json(&map));
    }
    println!(
        "{:>5}  {:<12}  {:<24}  {:>6}  {:<10}  {:>9}  {:>8}  MEMBERS",
        "GROUP", "HASH SLOTS", "LEADER", "TERM", "HERE", "APPLIED", "PENDING"
    );
    for g in &map.groups {
        let members: Vec<String> = (g.members.iter())
            .map(|m| match m.voter {
                true => m.node_id.to_string(),
                false => format!("{} (learner)", m.node_id),
            })
            .collect();
        println!(
            "{:>5}  {:<12}  {:<24}  {:>6}  {:<10}  {:>9}  {:>8}  {}",
            g.group,
            ranges(&g.hash_slots),
            leader(g),
            g.term,
            g.role,
            g.applied_index,
            g.pending_timers,
            members.join(",")
        );
    }
}

fn leader(g: &pb::GroupInfo) -> String {
    match g.leader_id {
        0 => "unknown".into(),
        id => format!("{id} {}", g.leader_addr),
    }
}

fn ranges(ranges: &[pb::HashSlotRange]) -> String {
    match ranges {
        [] => "none".into(),
        _ => (ranges.iter())
            .map(|r| format!("{}-{}", r.start, r.end.saturating_sub(1)))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn slots_json(map: &pb::SlotsResponse) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = (map.groups.iter())
        .map(|g| {
            json!({
                "group": g.group,
                "hash_slots": g.hash_slots.iter().map(|r| json!([r.start, r.end])).collect::<Vec<_>>(),
                "leader": g.leader_id,
                "leader_addr": g.leader_addr,
                "term": g.term,
                "role": g.role,
                "last_log_index": g.last_log_index,
                "applied_index": g.applied_index,
                "pending": g.pending_timers,
                "members": output::members_json(&g.members)["members"],
            })
        })
        .collect();
    json!({
        "node": map.node_id,
        "epoch": map.epoch,
        "hash_slots": map.hash_slots,
        "groups": groups,
    })
}
