//! The server side of the peer network: the internal `timerdb.v1.Raft` service.
//!
//! Decodes openraft's request, hands it to the local Raft, and returns the bincode of the whole
//! `Result`, so the caller ([`crate::cluster::network`]) gets remote Raft errors typed. A body
//! that does not decode is INVALID_ARGUMENT: only another timerdb node of this build calls here.
//! A call from a node of another bucket width is FAILED_PRECONDITION, before anything is
//! decoded or appended (`Store::adopt_width`).
//!
//! Every call is for one Raft group: group 0's come to the `Raft` service (naming no group, as
//! builds before groups send them), a data group's to `Groups`, naming it in `x-timerdb-group`
//! (`wire.rs`); each goes to this node's replica of that group ([`PeerGroups`]).
//! A call for a group this node hosts no replica of is NOT_FOUND, before its body is decoded
//! (log-engine.md point 6: a peer's bytes never reach a group they were not meant for).

use openraft::async_runtime::WatchReceiver as _;
use openraft::error::RaftError;
use openraft::raft::AppendEntriesRequest;
use openraft_legacy::network_v1::{
    ChunkedSnapshotReceiver, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse,
};
use tonic::{Request, Response, Status};

use crate::api::pb::RaftMessage;
use crate::cluster::network::{BUCKET_MS_HEADER, GROUP_HEADER, TERM_HEADER};
use crate::cluster::Raft;
use crate::keys::{Group, GROUP_ZERO};
use crate::raft_types::TypeConfig;
use crate::storage::Store;
use crate::storage::{decode, encode};

/// Serves Raft RPCs from peers. Made by the wiring from the node's parts (it is the Raft
/// transport's far end, not a client of the node's verbs).
#[derive(Clone)]
pub struct PeerService {
    /// This node's replica of each group it hosts.
    groups: std::sync::Arc<PeerGroups>,
    /// The feature level this node advertises in every answer (with its tzdb version), and
    /// the newest entry forms it takes (`cluster::level`); `join`: while it knows no members
    /// it admits (`storage/admission.rs`).
    config: std::sync::Arc<crate::config::NodeConfig>,
    /// What each peer advertised and when: an AppendEntries notes its leader here, which is
    /// how this node knows it still hears from one (health, `api/services/health.rs`).
    levels: std::sync::Arc<crate::cluster::Levels>,
    /// Which data groups rest here, as leader and as follower (`cluster/rest.rs`): `Ping`.
    rest: std::sync::Arc<crate::cluster::rest::Rest>,
    /// Every group's door: `Handover` hands a group over through it, as TransferLeader does.
    nodes: std::sync::Arc<crate::node::Nodes>,
}

/// The group replicas a node hosts, by group: where each peer call goes.
#[derive(Default)]
pub struct PeerGroups(std::sync::RwLock<std::collections::BTreeMap<Group, Replica>>);

mod checks;
mod wire;

use checks::{check_entries, check_snapshot};

/// The peer service a call came to: `Raft` (group 0's) or `Groups` (the data groups').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Raft,
    Groups,
}

/// One group's replica: its Raft and its state machine's store.
#[derive(Clone)]
struct Replica {
    raft: Raft,
    store: Store,
}

impl PeerGroups {
    /// Peer calls for `store`'s group go to `raft` from now on.
    pub fn add(&self, raft: Raft, store: Store) {
        let group = store.space().group;
        let mut groups = self.0.write().unwrap_or_else(|p| p.into_inner());
        groups.insert(group, Replica { raft, store });
    }

    fn get(&self, group: Group) -> Option<Replica> {
        let groups = self.0.read().unwrap_or_else(|p| p.into_inner());
        groups.get(&group).cloned()
    }
}

impl PeerService {
    pub fn new(
        groups: std::sync::Arc<PeerGroups>,
        config: std::sync::Arc<crate::config::NodeConfig>,
        levels: std::sync::Arc<crate::cluster::Levels>,
        rest: std::sync::Arc<crate::cluster::rest::Rest>,
        nodes: std::sync::Arc<crate::node::Nodes>,
    ) -> Self {
        PeerService {
            groups,
            config,
            levels,
            rest,
            nodes,
        }
    }

    /// The replica a call is for (see the module essay); looked at before the body is. Group
    /// 0's calls come to `Raft`, the data groups' to `Groups`, each naming its group.
    fn replica<T>(&self, service: Service, req: &Request<T>) -> Result<Replica, Status> {
        let named: Option<Group> =
            match req.metadata().get(GROUP_HEADER) {
                None => None,
                Some(v) => Some((v.to_str().ok().and_then(|v| v.parse().ok())).ok_or_else(
                    || Status::invalid_argument(format!("bad {GROUP_HEADER} header")),
                )?),
            };
        let group = match (service, named) {
            (Service::Raft, None | Some(GROUP_ZERO)) => GROUP_ZERO,
            (Service::Groups, Some(g)) if g != GROUP_ZERO => g,
            (Service::Raft, Some(g)) => {
                return Err(Status::invalid_argument(format!(
                    "group {g}'s calls go to timerdb.v1.Groups, not Raft"
                )))
            }
            (Service::Groups, _) => {
                return Err(Status::invalid_argument(format!(
                    "a timerdb.v1.Groups call names a data group (1 and up) in {GROUP_HEADER}"
                )))
            }
        };
        self.groups.get(group).ok_or_else(|| {
            Status::not_found(format!("this node hosts no replica of group {group}"))
        })
    }

    /// Group 0's replica: the node's own calls (`Hello`) go to it.
    fn group_zero(&self) -> Result<Replica, Status> {
        (self.groups.get(GROUP_ZERO)).ok_or_else(|| Status::unavailable("this node is starting"))
    }

    /// `value` as the answer, with this node's level.
    fn reply<T: serde::Serialize>(&self, value: &T) -> Result<Response<RaftMessage>, Status> {
        let mut answer = Response::new(RaftMessage {
            data: encode(value),
        });
        crate::cluster::level::advertise_node(answer.metadata_mut(), &self.config);
        Ok(answer)
    }

    /// Entries of a form newer than this node's level are refused as a build before the form
    /// refuses them (it cannot decode them); a leader that heard this node's level never sends
    /// them. (Only a node whose level a test lowered meets them: a real older build fails to
    /// decode first.)
    fn check_level(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> Result<(), Status> {
        let newest = rpc.entries.iter().filter_map(|e| match &e.payload {
            openraft::EntryPayload::Normal(cmd) => Some(cmd.level()),
            _ => None,
        });
        match newest.max() {
            Some(level) if level > self.config.level => Err(Status::invalid_argument(format!(
                "undecodable: an entry of feature level {level}, and this node reads up to {}",
                self.config.level
            ))),
            _ => Ok(()),
        }
    }

    /// Whether this node holds nothing yet: started with `--join` and no membership known
    /// (`storage/admission.rs` says what it takes from whom then).
    fn admitting(&self, r: &Replica) -> bool {
        self.config.join
            && (r.raft.metrics().borrow_watched())
                .membership_config
                .membership()
                .nodes()
                .next()
                .is_none()
    }

    /// The sender's bucket width must be this node's. A call without the header comes from a
    /// build before it, which checked nothing: taken by a node that knows its width, refused
    /// by one that does not (a joining node), which could apply none of its entries. A node
    /// that waits to be added takes the width only from a `Hello` ([`PeerService::hello`]).
    fn check_width<T>(&self, r: &Replica, req: &Request<T>) -> Result<(), Status> {
        self.check_groups(req)?;
        let mine = r.store.width_ms();
        let Some(theirs) = width_of(req)? else {
            if mine == 0 {
                return Err(Status::failed_precondition(format!(
                    "this node joins without a bucket width and the peer sent none (a build \
                     before {BUCKET_MS_HEADER}): start it with --bucket-ms set to the cluster's"
                )));
            }
            return Ok(());
        };
        if mine == 0 {
            return Err(not_added());
        }
        // This node knows its width (not 0): nothing is adopted here, only compared.
        r.store.adopt_width(theirs, &sender(req)).map_err(|e| {
            tracing::error!("refused a peer: {e}");
            Status::failed_precondition(e.to_string())
        })
    }

    /// The sender's cluster must have this node's number of data groups (see
    /// `level::check_groups`).
    fn check_groups<T>(&self, req: &Request<T>) -> Result<(), Status> {
        crate::cluster::level::check_groups(req.metadata(), self.config.groups, &sender(req))
    }

    /// A test's stand-in for a build before PreVote and TransferLeader
    /// (`NodeConfig::older_peer_rpcs`): what such a build answers.
    fn check_newer_rpcs(&self) -> Result<(), Status> {
        match self.config.older_peer_rpcs {
            true => Err(Status::unimplemented("a build before this RPC")),
            false => Ok(()),
        }
    }

    /// A Vote's or PreVote's request, if this node may answer it at all.
    fn vote_request(
        &self,
        r: &Replica,
        req: Request<RaftMessage>,
    ) -> Result<openraft::raft::VoteRequest<TypeConfig>, Status> {
        self.check_width(r, &req)?;
        let rpc: openraft::raft::VoteRequest<TypeConfig> = body(req)?;
        self.check_admitted(r, rpc.vote.leader_id().term)?;
        if self.admitting(r) {
            // A Hello came, entries not yet: this node becomes a learner first, which needs no
            // vote, and a vote it persisted for a removed voter still campaigning (its term
            // climbing past the Hello's) would depose the leader adding it. Nor may a wiped
            // voter vote, or grant a pre-vote: it lost what it promised.
            return Err(Status::unavailable(
                "this node waits for its first entries from the leader adding it and votes \
                 for nobody until then",
            ));
        }
        Ok(rpc)
    }

    /// A vote or pre-vote in a resting data group is refused while the group's leader's node
    /// is heard from (`cluster/rest.rs`, `Rest::refuses_vote`): no grant, as from a peer out
    /// of reach.
    fn check_rest(
        &self,
        r: &Replica,
        rpc: &openraft::raft::VoteRequest<TypeConfig>,
    ) -> Result<(), Status> {
        let candidate = (rpc.vote.leader_id().node_id, rpc.leadership_transfer);
        let now = tokio::time::Instant::now();
        match self
            .rest
            .refuses_vote(r.store.space().group, candidate, now)
        {
            Some(why) => Err(Status::unavailable(why)),
            None => Ok(()),
        }
    }

    /// While this node waits to be added: a Raft call only after a `Hello`, and only from a
    /// leader (or candidate) of the `Hello`'s term or later.
    fn check_admitted(&self, r: &Replica, term: u64) -> Result<(), Status> {
        if !self.admitting(r) {
            return Ok(());
        }
        match r.store.admitted() {
            Err(e) => Err(Status::internal(e.to_string())),
            Ok(None) => Err(not_added()),
            Ok(Some(admitted)) if term < admitted => {
                let why = format!(
                    "a call of term {term}, older than the term {admitted} of the leader adding \
                     this node: from a removed leader still running, or another cluster?"
                );
                tracing::error!("refused a peer: {why}");
                Err(Status::failed_precondition(why))
            }
            Ok(Some(_)) => Ok(()),
        }
    }
}

/// The refusal of a Raft call to a node that waits to be added and took no `Hello` yet.
fn not_added() -> Status {
    Status::unavailable(
        "this node waits to be added: it takes Raft calls only after the Hello of the leader \
         adding it (Cluster.AddNode)",
    )
}

/// The bucket width a peer call names (None: no header).
fn width_of<T>(req: &Request<T>) -> Result<Option<u64>, Status> {
    let Some(value) = req.metadata().get(BUCKET_MS_HEADER) else {
        return Ok(None);
    };
    let width = value.to_str().ok().and_then(|v| v.parse().ok());
    width
        .map(Some)
        .ok_or_else(|| Status::invalid_argument(format!("bad {BUCKET_MS_HEADER} header")))
}

/// Who sent `req`, for messages.
fn sender<T>(req: &Request<T>) -> String {
    req.remote_addr()
        .map_or_else(|| "the peer".to_string(), |a| format!("the peer at {a}"))
}

fn body<T: serde::de::DeserializeOwned>(req: Request<RaftMessage>) -> Result<T, Status> {
    decode(&req.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

/// The calls of both peer services (`wire.rs` serves them), for the group each names.
impl PeerService {
    pub(super) async fn append_entries(
        &self,
        service: Service,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let r = self.replica(service, &req)?;
        self.check_width(&r, &req)?;
        // The headers stay here (no copy per call: this is every heartbeat and append).
        let (metadata, _, msg) = req.into_parts();
        let rpc: AppendEntriesRequest<TypeConfig> = body(Request::new(msg))?;
        self.check_admitted(&r, rpc.vote.leader_id().term)?;
        check_entries(&rpc)?;
        self.check_level(&rpc)?;
        let leader = rpc.vote.leader_id().node_id;
        let answer = r.raft.append_entries(rpc).await;
        self.levels.heard(leader, &metadata);
        self.reply(&answer)
    }

    pub(super) async fn vote(
        &self,
        service: Service,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let r = self.replica(service, &req)?;
        let rpc = self.vote_request(&r, req)?;
        self.check_rest(&r, &rpc)?;
        self.reply(&r.raft.vote(rpc).await)
    }

    pub(super) async fn pre_vote(
        &self,
        service: Service,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_newer_rpcs()?;
        let r = self.replica(service, &req)?;
        let rpc = self.vote_request(&r, req)?;
        self.check_rest(&r, &rpc)?;
        self.reply(&r.raft.pre_vote(rpc).await)
    }

    /// The call `AddNode` makes before it adds this node: may it join (its bucket width)?
    /// A node that waits to be added takes the width and the caller's term from it.
    pub(super) async fn hello(
        &self,
        service: Service,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        if !req.get_ref().data.is_empty() {
            return Err(Status::invalid_argument("a Hello carries no body"));
        }
        self.check_groups(&req)?;
        let r = match service {
            Service::Raft => self.group_zero()?,
            Service::Groups => self.replica(service, &req)?,
        };
        if self.admitting(&r) {
            let width = width_of(&req)?.unwrap_or(0);
            let term = req
                .metadata()
                .get(TERM_HEADER)
                .map(|v| v.to_str().ok().and_then(|v| v.parse().ok()))
                .map(|t| t.ok_or_else(|| Status::invalid_argument(format!("bad {TERM_HEADER}"))))
                .transpose()?
                .unwrap_or(0);
            if width == 0 && r.store.width_ms() == 0 {
                self.check_width(&r, &req)?;
            }
            // The width is the node's, every group's: only group 0's Hello gives it. A data
            // group's comes after (`node/members.rs`) and may only agree with it, or a
            // stranger's Hello for a group still empty would change it under the others.
            let group_0s = matches!(service, Service::Raft);
            if !group_0s && r.store.width_ms() == 0 {
                return Err(Status::failed_precondition(
                    "a data group's Hello before group 0's: this node is added to group 0 first",
                ));
            }
            let pinned = self.config.bucket_ms.is_some() || !group_0s;
            r.store
                .admit(width, term, &sender(&req), pinned)
                .map_err(|e| Status::failed_precondition(e.to_string()))?;
        } else {
            self.check_width(&r, &req)?;
        }
        let mut answer = Response::new(RaftMessage { data: Vec::new() });
        crate::cluster::level::advertise_node(answer.metadata_mut(), &self.config);
        Ok(answer)
    }

    /// Group 0's read index, for a node that judges credentials without leading group 0
    /// (`node/groups.rs`): given only by group 0's leader, once it confirmed it still leads.
    pub(super) async fn read_index(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        if !req.get_ref().data.is_empty() {
            return Err(Status::invalid_argument("a ReadIndex carries no body"));
        }
        self.check_groups(&req)?;
        let r = self.group_zero()?;
        let read = r
            .raft
            .get_read_log_id(openraft::raft::ReadPolicy::ReadIndex);
        let index = match tokio::time::timeout(self.config.write_timeout, read).await {
            Ok(Ok((read, _))) => read.index(),
            Ok(Err(e)) => {
                return Err(Status::unavailable(format!(
                    "no read index from this node: {e}"
                )))
            }
            Err(_) => {
                return Err(Status::unavailable(
                    "this node could not confirm it leads group 0 in time",
                ))
            }
        };
        self.reply(&index)
    }

    /// A member's ping (`cluster/rest.rs`): holds the groups it asks to rest that this node
    /// follows it in; the answer names them. It names no group, and at most every data group.
    pub(super) async fn ping(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_groups(&req)?;
        let ping: crate::cluster::rest::Ping = body(req)?;
        if ping.resting.len() > usize::from(self.config.groups) {
            return Err(Status::invalid_argument(format!(
                "a ping names {} groups; this cluster has {}",
                ping.resting.len(),
                self.config.groups
            )));
        }
        let pong = self.rest.on_ping(&ping, tokio::time::Instant::now());
        self.reply(&pong)
    }

    /// A balancing move (`node/balance.rs`): `(group, to, group 0's term)`, to the target or to
    /// the group's leader ([`crate::node::Nodes::handover`]). The answer is the leader afterwards.
    pub(super) async fn handover(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_groups(&req)?;
        let (group, to, term): (Group, crate::raft_types::NodeId, u64) = body(req)?;
        let leader = self.nodes.handover(group, to, term).await?;
        self.reply(&leader)
    }

    /// Group 0's leader adding or removing a node, to a data group's leader: `(group, step,
    /// group 0's term)` ([`crate::node::Nodes::member_step`]); the body of the answer is the
    /// step's outcome: the group's members afterwards, or its error.
    pub(super) async fn member(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_groups(&req)?;
        let (group, step, term): (Group, crate::node::MemberStep, u64) = body(req)?;
        // The step's own outcome in the body, its kind kept (the coordinator acts on it).
        let outcome = self.nodes.member_step(group, step, term).await;
        self.reply(&outcome)
    }

    pub(super) async fn transfer_leader(
        &self,
        service: Service,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_newer_rpcs()?;
        if self.config.faults.drop_transfer_leader {
            return Err(Status::unavailable("fault: TransferLeader dropped"));
        }
        let r = self.replica(service, &req)?;
        self.check_width(&r, &req)?;
        let rpc: openraft::raft::TransferLeaderRequest<TypeConfig> = body(req)?;
        if self.admitting(&r) {
            // Not a voter yet: it has nobody's lease to drop and may not stand.
            return Err(not_added());
        }
        // openraft acts only on a transfer from the leader this node follows (the same vote).
        let answer: Result<_, RaftError<TypeConfig>> =
            (r.raft.handle_transfer_leader(rpc).await).map_err(RaftError::Fatal);
        self.reply(&answer)
    }

    pub(super) async fn timeout_now(
        &self,
        service: Service,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let r = self.replica(service, &req)?;
        let term: u64 = body(req)?;
        let current = {
            let m = r.raft.metrics();
            let m = m.borrow_watched();
            (m.current_term, m.state)
        };
        // Only a follower of the leader's term stands: a stale request changes nothing.
        let stand = current == (term, openraft::ServerState::Follower);
        if stand {
            tracing::info!(term, "TimeoutNow: standing for election");
            r.raft
                .trigger()
                .elect(false)
                .await
                .map_err(|e| Status::unavailable(format!("raft stopped: {e}")))?;
        }
        self.reply(&stand)
    }

    pub(super) async fn install_snapshot(
        &self,
        service: Service,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let r = self.replica(service, &req)?;
        self.check_width(&r, &req)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = body(req)?;
        self.check_admitted(&r, rpc.vote.leader_id().term)?;
        let (mine, committed) = {
            let m = r.raft.metrics();
            let m = m.borrow_watched();
            (m.vote, m.local_committed)
        };
        // A chunk from a deposed leader is answered with the newer vote, unread, as openraft
        // 0.9 did (its 0.10 receiver would take it, and restart the live leader's transfer).
        if rpc.vote < mine {
            let stale: Result<_, RaftError<TypeConfig, InstallSnapshotError>> =
                Ok(InstallSnapshotResponse::<TypeConfig> { vote: mine });
            return self.reply(&stale);
        }
        check_snapshot(&rpc, committed)?;
        self.reply(&r.raft.install_snapshot(rpc).await)
    }
}

#[cfg(test)]
mod decode_tests {
    use super::*;
    use crate::command::Command;
    use crate::raft_types::{log_id, Entry, Vote};
    use crate::timer::{TimerKey, TimerSpec, When};
    use openraft::EntryPayload;

    /// Issue 34 part 5: a follower decodes an AppendEntries of ScheduleBatch entries with a few
    /// allocations per entry, none per timer (it made three per timer before: namespace, id,
    /// payload).
    #[test]
    fn an_append_of_batches_decodes_without_an_allocation_per_timer() {
        let batch = |e: usize| Command::ScheduleBatch {
            now_ms: 7,
            specs: (0..1_000)
                .map(|i| TimerSpec {
                    key: TimerKey::new("orders", format!("{e}-{i}")),
                    when: When::After(i),
                    payload: vec![7; 40],
                    content_type: String::new(),
                })
                .collect(),
        };
        let request: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
            vote: Vote::new_committed(5, 1),
            prev_log_id: Some(log_id(5, 1, 9)),
            entries: (0..4)
                .map(|e| Entry {
                    log_id: log_id(5, 1, 10 + e as u64),
                    payload: EntryPayload::Normal(batch(e).into()),
                })
                .collect(),
            leader_commit: Some(log_id(5, 1, 9)),
        };
        let bytes = encode(&request);
        let (decoded, allocations) = crate::alloc_count::allocations(|| {
            decode::<AppendEntriesRequest<TypeConfig>>(&bytes).unwrap()
        });
        assert_eq!(decoded.entries, request.entries);
        // Per entry: the command's Box then Arc, the specs' three buffers and a growth or two
        // (25 today); then the vector of entries. Not 4,000 timers' worth (12,101 before).
        assert!(allocations <= 4 * 8 + 4, "{allocations} allocations");
    }
}
