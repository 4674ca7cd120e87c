//! The feature level: which entry forms a build can read, advertised on every peer call and
//! answer, so a leader proposes a new form only once every member can apply it.
//!
//! A build that meets an entry form it does not know cannot decode the entry: it refuses the
//! AppendEntries carrying it, and every one after. During a rolling upgrade that would stop a
//! cluster whose upgraded node leads at the first such entry (issue 33 review F1). So each form
//! added after the first release has a level ([`Command::level`]), each build serves up to its
//! own (`command::LEVEL`) and says so in [`LEVEL_HEADER`] on every peer request and answer, and a
//! leader proposes a form only if the lowest level it last heard from each member (itself
//! included) reaches it; until then it proposes the older form of the same change, which
//! every build applies (with the older form's known limits, docs/operations.md).
//!
//! Each call and answer also names the build's time-zone database ([`TZDB_HEADER`]): a
//! series in a time zone is computed by every replica with its own rules, and one whose
//! rules differ from the proposer's stops rather than diverge (`storage/apply.rs`). So while
//! members run different tzdb versions (during an upgrade) a leader refuses to create or
//! change a series in a time zone, instead of letting a client's call stop the older nodes.
//!
//! Once every member advertised a level, the leader commits it (`Command::RaiseLevel`, by
//! [`LevelRaiser`]): from then on every leader proposes that level's forms, including one that
//! never heard a member (down since the leader restarted), and a node of a lower level is
//! refused as a new member (`membership.rs`) — downgrades are not supported.
//!
//! Invariant: a leader proposes a form only if its level is at most the higher of the
//! committed level and the lowest it heard (a member never heard from counts as level 0, a
//! build before the header), and never above its own. What was heard is node-local: it
//! chooses which entry a leader proposes, never what a committed entry does (DESIGN 8).

use openraft::async_runtime::WatchReceiver as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::workers::while_leader;
use super::Raft;
use crate::command::Command;
use crate::config::NodeConfig;
use crate::raft_types::NodeId;
use crate::storage::Hold;
use crate::storage::Store;

/// The header every peer call and answer carries: the sender's level.
pub const LEVEL_HEADER: &str = "x-timerdb-level";

/// The header every peer call and answer carries: the sender's tzdb version.
pub const TZDB_HEADER: &str = "x-timerdb-tzdb";

/// The header every peer call and answer carries: which peer RPCs the sender serves beyond
/// the first release's, as a number ([`PEER_RPCS`]; absent: 0). The leader hands over through
/// openraft's TransferLeader only to a target that serves it (`membership.rs`).
pub const PEER_RPCS_HEADER: &str = "x-timerdb-peer-rpcs";

/// This build's peer RPCs: 1 added PreVote and TransferLeader (issue 34); 2: InstallSnapshot
/// carries files of storage format 6 (issue 36: `storage::migrate`).
pub const PEER_RPCS: u32 = 2;
/// The first [`PEER_RPCS`] serving PreVote and TransferLeader.
pub const TRANSFER_LEADER_RPCS: u32 = 1;
/// The first [`PEER_RPCS`] that reads a snapshot of this build's storage format: a leader never
/// sends one to a member below it (that build would refuse the file, and fail its install).
pub const SNAPSHOT_FORMAT_RPCS: u32 = 2;

/// How long what a peer advertised counts towards raising the committed level (several
/// heartbeats): a member not heard from since (down, perhaps being replaced by another build)
/// does not let the level rise. The leader's other choices (which Fire form, whether a zoned
/// series may be written) go by the last thing each member advertised, however old: a member
/// down for a moment must not turn a settled cluster back to the older forms (review 33e).
const FRESH: Duration = Duration::from_secs(3);

/// What one peer advertised, and when.
#[derive(Debug)]
struct Heard {
    level: u32,
    tzdb: Option<String>,
    /// Its [`PEER_RPCS_HEADER`].
    rpcs: u32,
    at: std::time::Instant,
    /// A call to it failed since: it does not count towards a raise until heard again.
    failed: bool,
}

/// The level (and tzdb version) each peer last advertised to this node.
#[derive(Debug, Default)]
pub struct Levels {
    heard: Mutex<HashMap<NodeId, Heard>>,
    /// Held by the level raiser from its read of the members to its entry's commit, and by
    /// AddNode from its Hello to the learner's entry in the membership: a node of an older
    /// build is either refused by the committed level or counted by the raiser, never neither.
    pub gate: tokio::sync::Mutex<()>,
}

impl Levels {
    /// `node` answered (or called) with `metadata`.
    pub fn heard(&self, node: NodeId, metadata: &tonic::metadata::MetadataMap) {
        let tzdb = metadata.get(TZDB_HEADER).and_then(|v| v.to_str().ok());
        let rpcs = metadata.get(PEER_RPCS_HEADER).and_then(|v| v.to_str().ok());
        let seen = Heard {
            level: of(metadata),
            tzdb: tzdb.map(str::to_string),
            rpcs: rpcs.and_then(|v| v.parse().ok()).unwrap_or(0),
            at: std::time::Instant::now(),
            failed: false,
        };
        self.heard.lock().expect("levels").insert(node, seen);
    }

    /// Whether `node` called or answered this node within `within`.
    pub fn heard_within(&self, node: NodeId, within: Duration) -> bool {
        let heard = self.heard.lock().expect("levels");
        heard.get(&node).is_some_and(|h| h.at.elapsed() < within)
    }

    /// The peer RPCs `node` last advertised ([`PEER_RPCS`]; 0 if never heard).
    pub fn peer_rpcs(&self, node: NodeId) -> u32 {
        let heard = self.heard.lock().expect("levels");
        heard.get(&node).map_or(0, |h| h.rpcs)
    }

    /// A call to `node` failed: what it advertised does not count towards a raise until it
    /// answers again (it may be restarting as another build).
    pub fn forget(&self, node: NodeId) {
        if let Some(h) = self.heard.lock().expect("levels").get_mut(&node) {
            h.failed = true;
        }
    }

    /// The lowest level among `members` (0 for one never heard from) and `own`, this node's,
    /// by what each last advertised.
    pub fn lowest(&self, own: u32, me: NodeId, members: impl IntoIterator<Item = NodeId>) -> u32 {
        let heard = self.heard.lock().expect("levels");
        let others = members.into_iter().filter(|id| *id != me);
        others
            .map(|id| heard.get(&id).map_or(0, |h| h.level))
            .fold(own, u32::min)
    }

    /// [`Levels::lowest`], counting only members heard within [`FRESH`] with no failed call
    /// since (the others as 0): the level a raise may commit.
    pub fn lowest_fresh(
        &self,
        own: u32,
        me: NodeId,
        members: impl IntoIterator<Item = NodeId>,
    ) -> u32 {
        let heard = self.heard.lock().expect("levels");
        let others = members.into_iter().filter(|id| *id != me);
        others
            .map(|id| {
                heard
                    .get(&id)
                    .filter(|h| !h.failed && h.at.elapsed() < FRESH)
                    .map_or(0, |h| h.level)
            })
            .fold(own, u32::min)
    }

    /// Whether every member among `members` advertised `own` as its tzdb version, the last
    /// time it was heard (one never heard from, or of a build before the header, did not).
    pub fn same_tzdb(
        &self,
        own: &str,
        me: NodeId,
        members: impl IntoIterator<Item = NodeId>,
    ) -> bool {
        let heard = self.heard.lock().expect("levels");
        members
            .into_iter()
            .filter(|id| *id != me)
            .all(|id| heard.get(&id).and_then(|h| h.tzdb.as_deref()) == Some(own))
    }

    /// The newest entry forms node `me`, of level `own`, may propose among `members` when
    /// `committed` is the committed level: the higher of that and the lowest level heard
    /// lately ([`Levels::lowest_fresh`]: a member down may be coming back as an older build),
    /// never above its own.
    pub fn proposable(
        &self,
        committed: u32,
        own: u32,
        me: NodeId,
        members: impl IntoIterator<Item = NodeId>,
    ) -> u32 {
        self.lowest_fresh(own, me, members).max(committed).min(own)
    }

    /// A member among `members` whose advertised tzdb version is not `own`, and its version
    /// (members that advertised none — older builds, or not heard from — are not counted).
    pub fn other_tzdb(
        &self,
        own: &str,
        me: NodeId,
        members: impl IntoIterator<Item = NodeId>,
    ) -> Option<(NodeId, String)> {
        let heard = self.heard.lock().expect("levels");
        members.into_iter().filter(|id| *id != me).find_map(|id| {
            let tzdb = heard.get(&id)?.tzdb.as_ref()?;
            (tzdb != own).then(|| (id, tzdb.clone()))
        })
    }
}

/// The leader's worker that commits the level every member advertised, once a second: a
/// proposal only when the lowest level heard is above the committed one, so a cluster whose
/// level is settled writes nothing.
pub struct LevelRaiser {
    pub id: NodeId,
    pub raft: Raft,
    pub store: Store,
    pub hold: Hold,
    pub levels: Arc<Levels>,
    /// This build's level (`NodeConfig::level`).
    pub own: u32,
}

/// How often the raiser looks.
const RAISE_PERIOD: Duration = Duration::from_millis(250);
/// How often it looks once the committed level is this build's own.
const SETTLED_PERIOD: Duration = Duration::from_secs(5);

impl LevelRaiser {
    /// Runs until `shutdown` turns true, raising the level while this node leads.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        while_leader(self.id, &self.raft, "level raiser", shutdown, || {
            self.lead()
        })
        .await;
    }

    async fn lead(&self) {
        loop {
            self.raise().await;
            // At this build's own level nothing is left to raise (no member can advertise
            // more than this leader's build commits): look seldom (an idle data group's
            // wake-ups, docs/sharding.md §7).
            let settled = self.store.committed_level() >= self.own;
            tokio::time::sleep(if settled {
                SETTLED_PERIOD
            } else {
                RAISE_PERIOD
            })
            .await;
        }
    }

    /// Commits the lowest level every member advertised, if above the committed one. The
    /// members and what they advertised are read after the hold (a leadership transfer may
    /// keep it closed for seconds) and under the gate AddNode also takes.
    async fn raise(&self) {
        if (self.levels).lowest_fresh(self.own, self.id, members(&self.raft))
            <= self.store.committed_level()
        {
            return; // the usual case: nothing to do, nothing locked
        }
        self.hold.pass().await;
        let _gate = self.levels.gate.lock().await;
        let heard = (self.levels).lowest_fresh(self.own, self.id, members(&self.raft));
        if heard <= self.store.committed_level() {
            return;
        }
        let cmd = Command::RaiseLevel { level: heard };
        match super::propose::client_write(&self.raft, cmd.into()).await {
            Ok(_) => tracing::info!(level = heard, "every member reads level: committed"),
            Err(e) => tracing::warn!(error = %e, "level raiser: not committed"),
        }
    }
}

/// The ids of `raft`'s members (voters and learners).
pub fn members(raft: &super::Raft) -> Vec<NodeId> {
    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    let ids = m.membership_config.membership().nodes().map(|(id, _)| *id);
    ids.collect()
}

/// The level `metadata` advertises: 0 without the header (a build before it) or with a bad one.
pub fn of(metadata: &tonic::metadata::MetadataMap) -> u32 {
    metadata
        .get(LEVEL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The header every peer call carries: the number of data groups of the sender's cluster
/// (docs/sharding.md §2); absent: 0, as builds before groups send.
pub const GROUPS_HEADER: &str = "x-timerdb-groups";

/// Whether the peer whose call or answer carries `metadata` (from `who`) belongs to a cluster
/// of this node's number of data groups (no header: 0, a build before groups). A node takes
/// no call from, and counts no answer of, a peer placed by another slot map: on the wire both
/// ways, since a build before groups checks nothing itself.
pub fn check_groups(
    metadata: &tonic::metadata::MetadataMap,
    mine: u16,
    who: &str,
) -> Result<(), tonic::Status> {
    let theirs: u16 = match metadata.get(GROUPS_HEADER) {
        None => 0,
        Some(v) => (v.to_str().ok().and_then(|v| v.parse().ok())).ok_or_else(|| {
            tonic::Status::invalid_argument(format!("bad {GROUPS_HEADER} header"))
        })?,
    };
    if theirs == mine {
        return Ok(());
    }
    let why = format!(
        "this node's cluster has {mine} data groups and {who}'s has {theirs}: one cluster has \
         one number of groups (start every node with the same --groups)"
    );
    tracing::error!("refused a peer: {why}");
    Err(tonic::Status::failed_precondition(why))
}

/// Puts what `config`'s node advertises into `metadata`: its level, tzdb version and peer RPCs
/// (none beyond the first release's when it plays an older build, `older_peer_rpcs`).
pub fn advertise_node(metadata: &mut tonic::metadata::MetadataMap, config: &NodeConfig) {
    advertise(metadata, config.level, &config.tzdb);
    let rpcs = if config.older_peer_rpcs { 0 } else { PEER_RPCS };
    metadata.insert(PEER_RPCS_HEADER, tonic::metadata::MetadataValue::from(rpcs));
    // The cluster's number of data groups (none: 0, as a build before groups sends), which
    // the other side checks, whichever way the call goes ([`check_groups`]).
    if config.groups > 0 {
        let groups = tonic::metadata::MetadataValue::from(config.groups);
        metadata.insert(GROUPS_HEADER, groups);
    }
}

/// Puts `level` and `tzdb` (the build's tzdb version) into `metadata`.
pub fn advertise(metadata: &mut tonic::metadata::MetadataMap, level: u32, tzdb: &str) {
    metadata.insert(LEVEL_HEADER, tonic::metadata::MetadataValue::from(level));
    if let Ok(v) = tzdb.parse() {
        metadata.insert(TZDB_HEADER, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_never_heard_from_counts_as_the_oldest() {
        let levels = Levels::default();
        let mut md = tonic::metadata::MetadataMap::new();
        advertise(&mut md, 1, "2025b");
        levels.heard(2, &md);
        assert_eq!(levels.lowest(1, 1, [1, 2]), 1);
        assert_eq!(levels.lowest(1, 1, [1, 2, 3]), 0, "3 was never heard from");
        assert_eq!(
            levels.proposable(1, 1, 1, [1, 2, 3]),
            1,
            "level 1 is committed"
        );
        assert_eq!(levels.proposable(1, 0, 1, [1, 2]), 0, "never above its own");
        assert_eq!(levels.proposable(0, 1, 1, [1, 2]), 1, "all heard at 1");
        levels.heard(3, &tonic::metadata::MetadataMap::new());
        assert_eq!(levels.lowest(1, 1, [1, 2, 3]), 0, "3 sent no header");
        levels.heard(3, &md);
        assert_eq!(levels.lowest(1, 1, [1, 2, 3]), 1);
        assert_eq!(
            levels.lowest(0, 1, [1, 2, 3]),
            0,
            "this node's own level counts"
        );
        assert_eq!(levels.other_tzdb("2025b", 1, [1, 2, 3]), None);
        let mut older = tonic::metadata::MetadataMap::new();
        advertise(&mut older, 1, "2024a");
        levels.heard(3, &older);
        assert_eq!(
            levels.other_tzdb("2025b", 1, [1, 2, 3]),
            Some((3, "2024a".into()))
        );
        assert_eq!(
            levels.other_tzdb("2024a", 3, [1, 2, 3]),
            Some((2, "2025b".into()))
        );
        assert!(!levels.same_tzdb("2025b", 1, [1, 2, 3]));
        assert!(levels.same_tzdb("2025b", 1, [1, 2]));
        assert!(
            !levels.same_tzdb("2025b", 1, [1, 2, 4]),
            "4 was never heard from"
        );
        levels.heard(3, &md);
        assert!(levels.same_tzdb("2025b", 1, [1, 2, 3]));
        assert_eq!(levels.lowest_fresh(1, 1, [1, 2, 3]), 1);
        levels.forget(3);
        assert_eq!(
            levels.lowest_fresh(1, 1, [1, 2, 3]),
            0,
            "a failed call: no raise until heard again"
        );
        assert_eq!(levels.lowest(1, 1, [1, 2, 3]), 1, "but the forms stay");
        assert!(
            levels.same_tzdb("2025b", 1, [1, 2, 3]),
            "and so does the Fire form"
        );
        levels.heard(3, &md);
        assert_eq!(levels.lowest_fresh(1, 1, [1, 2, 3]), 1);
    }
}
