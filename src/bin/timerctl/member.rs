//! `timerctl member add|remove|list` and `timerctl leader transfer`: membership and leadership.
//!
//! Every command may be sent to any node; the node forwards it to the leader.

use crate::Ch as Channel;
use clap::Subcommand;
use timerdb::api::pb::{self, cluster_client::ClusterClient};

use crate::output::{self, status_err};

#[derive(Subcommand, Debug)]
pub enum MemberCommand {
    /// Add a node (started with `timerd --join`): it catches up as a learner, then votes.
    Add {
        /// The new node's id (unique in the cluster, never reused while it is a member).
        id: u64,
        /// HOST:PORT the new node serves on.
        addr: String,
        /// Stop once it has caught up as a learner (no vote); `member add` again to promote.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a voter or learner. Removing the leader hands leadership over first.
    Remove { id: u64 },
    /// List the members as the node asked knows them.
    List,
}

#[derive(Subcommand, Debug)]
pub enum LeaderCommand {
    /// Hand leadership to another voter (the most up-to-date one unless --to names one).
    Transfer {
        #[arg(long)]
        to: Option<u64>,
        /// The Raft group whose leader hands over (0, the default: the meta group, the only
        /// one without data groups; `timerctl group list` shows them).
        #[arg(long, default_value_t = 0)]
        group: u32,
    },
}

pub async fn member(ch: Channel, command: MemberCommand) -> anyhow::Result<()> {
    let mut client = ClusterClient::new(ch);
    let members = match command {
        MemberCommand::Add { id, addr, learner } => {
            let req = pb::AddNodeRequest {
                node_id: id,
                addr,
                learner,
            };
            let r = client.add_node(req).await.map_err(status_err)?;
            r.into_inner().members
        }
        MemberCommand::Remove { id } => {
            let req = pb::RemoveNodeRequest { node_id: id };
            let r = client.remove_node(req).await.map_err(status_err)?;
            r.into_inner().members
        }
        MemberCommand::List => {
            let r = client.status(pb::StatusRequest {}).await;
            r.map_err(status_err)?.into_inner().members
        }
    };
    print_members(&members);
    Ok(())
}

pub async fn leader(ch: Channel, command: LeaderCommand) -> anyhow::Result<()> {
    let LeaderCommand::Transfer { to, group } = command;
    if group != 0 {
        let command = crate::groups::GroupCommand::Transfer { group, to };
        return crate::groups::group(ch, command).await;
    }
    let req = pb::TransferLeaderRequest {
        node_id: to.unwrap_or(0),
        group,
    };
    let r = ClusterClient::new(ch).transfer_leader(req).await;
    let leader = r.map_err(status_err)?.into_inner().leader_id;
    if output::json() {
        output::doc(serde_json::json!({ "leader": leader }));
    } else {
        println!("leader is now node {leader}");
    }
    Ok(())
}

fn print_members(members: &[pb::Member]) {
    if output::json() {
        return output::doc(output::members_json(members));
    }
    println!("{:>4}  {:<24}  ROLE", "ID", "ADDRESS");
    for m in members {
        let role = if m.voter { "voter" } else { "learner" };
        println!("{:>4}  {:<24}  {role}", m.node_id, m.addr);
    }
}
