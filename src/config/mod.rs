//! A node's configuration, with the defaults in code and every limit documented.

mod file;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Clock;
use crate::raft_types::NodeId;
use crate::{Error, Result};

pub use file::{LogFormat, RaftSettings, Settings, SnapshotSettings};

/// Limits on client input. Requests beyond them are refused with a clear status.
/// The most rows a Fire entry may pass (`--max-fires-per-entry`).
pub const MAX_FIRES_PER_ENTRY: u32 = 100_000;
/// The most data groups a cluster may have (`--groups`; docs/sharding.md §7 measures 64): a
/// group's number fits the byte of a fire_index it owns (§5).
pub const MAX_GROUPS: u16 = 255;

#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest namespace, in UTF-8 bytes.
    pub max_namespace_bytes: usize,
    /// Longest timer id, in UTF-8 bytes.
    pub max_id_bytes: usize,
    /// Largest payload, in bytes.
    pub max_payload_bytes: usize,
    /// Most timers in one ScheduleBatch.
    pub max_batch: usize,
    /// Largest List page a client may ask for.
    pub max_list_limit: usize,
    /// List page size when the client asks for 0.
    pub default_list_limit: usize,
    /// Longest relative delay, in ms (and the furthest absolute time ahead of now).
    pub max_delay_ms: i64,
}

/// Absolute fire times earlier than 2000-01-01 are refused: they are almost always seconds
/// sent where milliseconds were meant.
pub const MIN_FIRE_AT_MS: i64 = 946_684_800_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_namespace_bytes: 128,
            max_id_bytes: 256,
            max_payload_bytes: 64 * 1024,
            max_batch: 10_000,
            max_list_limit: 10_000,
            default_list_limit: 100,
            // 100 years.
            max_delay_ms: 100 * 365 * 24 * 3600 * 1000,
        }
    }
}

/// Raft timing, chosen for failover: timers due while a leader is dead fire late by about the
/// time it takes to replace it, and the target is under a second.
///
/// openraft 0.9 lets a follower stand for election only after the leader lease (which it sets
/// to `election_timeout_max`) *plus* its own election timeout (drawn once per node from
/// [min, max)) have passed without hearing from the leader, and it checks on a tick of 1.5
/// heartbeats. So a failover takes max + [min, max) + up to 1.5 heartbeats, plus the vote and
/// the new leader's first commit. At 100 / 400–800 ms that was 1.2–1.75 s (the chaos harness
/// measured p50 1.6 s); at 100 / 200–300 ms it is 0.5–0.75 s.
///
/// The heartbeat cannot go lower: openraft 0.9 also used it as the timeout of every
/// AppendEntries (0.10 asks the same; `cluster::network::append_ttl` gives more), and at 50 ms
/// a follower busy appending and fsyncing a large batch under load timed out, which sent
/// replication into a 500 ms backoff (measured: acks failed after 5 s at 20,000 fires/s). A
/// follower must hear nothing for 0.5 s (five heartbeats) before it stands.
#[derive(Debug, Clone)]
pub struct RaftTiming {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat_ms: 100,
            election_timeout_min_ms: 200,
            election_timeout_max_ms: 300,
        }
    }
}

/// How long a data group's leader must have seen nothing (no new entry, every member caught
/// up) before the group rests (`cluster::rest`): long enough that a group in use never does,
/// short enough that idle ones cost nothing within seconds.
pub const REST_AFTER: Duration = Duration::from_secs(2);
/// How often group 0's leader balances the data groups' leaders (docs/sharding.md §2).
pub const BALANCE_EVERY: Duration = Duration::from_secs(2);

/// Bytes per snapshot chunk: well under the peer RPC's message limit.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 << 20;

/// Least time a finished row is kept: longer than any call is sent again (the clients retry
/// idempotent calls for 30 s, the forwarder within its leader wait), so a create-only Schedule
/// or an unconditional Cancel sent again always meets its first attempt's row, never a new
/// timer that reused the id (DESIGN invariant 9: their repeat is the same as once only while
/// that row is there).
pub const PURGE_FLOOR: Duration = Duration::from_secs(60);

/// Everything one node needs to start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: NodeId,
    /// Where the node keeps its RocksDB and snapshots.
    pub data_dir: PathBuf,
    /// Every voter's id and address (this node's included), as peers reach them.
    pub peers: BTreeMap<NodeId, String>,
    /// The wheel's bucket width in ms, for a new cluster (default 1 ms). It is the cluster's,
    /// fixed when it is created: a data dir keeps the width it was made with (a different one
    /// given here is refused), a node joining with an empty data dir takes the cluster's.
    pub bucket_ms: Option<u64>,
    /// Data groups (1..=groups) this node hosts a replica of beside group 0
    /// (docs/sharding.md §2); 0: one group. The cluster's: every node has the same.
    pub groups: u16,
    pub limits: Limits,
    pub raft: RaftTiming,
    /// How long a call waits for a leader before failing UNAVAILABLE.
    pub leader_wait: Duration,
    /// How long a write waits to be committed before failing UNAVAILABLE (outcome unknown).
    pub write_timeout: Duration,
    /// Most timers one Fire entry fires (keeps each apply short).
    pub max_fires_per_entry: u32,
    /// Build a snapshot (and purge the log behind it) after this many entries.
    pub snapshot_every_entries: u64,
    /// Log entries kept behind a snapshot, so a briefly slow follower catches up from the log.
    pub keep_log_entries: u64,
    /// Least time a finished timer's row is kept, whatever its namespace's retention
    /// ([`PURGE_FLOOR`]; the tests that purge within seconds lower it).
    pub purge_floor: Duration,
    /// How long a data group's leader must have seen nothing before the group rests
    /// (`cluster::rest`; [`REST_AFTER`]); zero: groups never rest.
    pub rest_after: Duration,
    /// How often group 0's leader looks whether a node leads more data groups than its share
    /// and moves one (`node::balance`); zero: leaders stay where they are elected or moved to.
    /// `timerd` balances unless told `--balance-leaders false` ([`BALANCE_EVERY`]); a
    /// configuration built in code (the in-process tests) does not unless it sets this, so a
    /// test that reads a group's leader and acts on it is not raced by a move.
    pub balance_every: Duration,
    /// The node's clock (skewable for tests).
    pub clock: Clock,
    /// Addresses to dial some peers at instead of their membership address: a proxy in front
    /// of them (the chaos harness puts a fault-injecting proxy on every peer link).
    pub dial: BTreeMap<NodeId, String>,
    /// Deliberate bugs, for proving that the chaos checker catches them. Never set in service.
    pub faults: Faults,
    /// The feature level this node advertises to its peers and the entry forms it takes
    /// (`cluster::level`): this build's; lower only in tests, to act as an older build.
    pub level: u32,
    /// Answer the peer RPCs PreVote and TransferLeader UNIMPLEMENTED, as builds before them
    /// do: only in tests, to act as such a build in a rolling upgrade.
    pub older_peer_rpcs: bool,
    /// The tzdb version this node advertises: this build's; another only in tests.
    pub tzdb: String,
    /// Join an existing cluster (through Cluster.AddNode) instead of forming one from `peers`:
    /// the node never initialises a cluster itself and waits to be added.
    pub join: bool,
    /// PEM file of extra CAs for push receivers' certificates (besides the web roots).
    pub push_ca: Option<PathBuf>,
    /// Push may reach loopback, private and link-local addresses (`push::guard`).
    pub push_allow_private: bool,
    /// File of this node's bootstrap admin token (`--auth-bootstrap-token-file`).
    pub auth_bootstrap_token_file: Option<PathBuf>,
    /// Transport security: the certificate files and what was loaded from them.
    pub tls: crate::tls::Tls,
}

/// Deliberate bugs, each breaking one guarantee, switched on only by the chaos harness's proof
/// runs (`TIMERDB_FAULT=ignore-cancel,ack-before-commit,fire-early`). All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Answer Cancel OK without proposing it: the timer still fires.
    pub ignore_cancel: bool,
    /// Answer Schedule OK as soon as it is proposed, before a quorum has it.
    pub ack_before_commit: bool,
    /// Stamp Fire entries this many ms ahead of the clock: timers fire early.
    pub fire_early_ms: i64,
    /// Answer every n-th committed client write UNAVAILABLE, outcome unknown, instead of its
    /// result, as a leader that lost its connection or leadership just after the commit would
    /// (0: never). Not a bug of timerdb's but of the world: it makes the unknown outcomes a
    /// forwarder or client must not resolve by sending a call again frequent.
    pub lose_reply_every: u64,
    /// Drop every TransferLeader message this node receives, as a lost message would be: a
    /// transfer to it never completes (a test's fault, not the simulator's).
    pub drop_transfer_leader: bool,
}

impl Faults {
    /// Parses a comma-separated list of fault names; an empty string is no fault.
    pub fn parse(s: &str) -> Result<Faults> {
        let mut f = Faults::default();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "ignore-cancel" => f.ignore_cancel = true,
                "ack-before-commit" => f.ack_before_commit = true,
                "fire-early" => f.fire_early_ms = 500,
                "lose-reply" => f.lose_reply_every = 2,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "unknown fault {other:?} (known: ignore-cancel, ack-before-commit, \
                         fire-early, lose-reply)"
                    )))
                }
            }
        }
        Ok(f)
    }
}

impl NodeConfig {
    /// A configuration with defaults for everything but identity and placement.
    pub fn new(id: NodeId, data_dir: PathBuf, peers: BTreeMap<NodeId, String>) -> Self {
        NodeConfig {
            id,
            data_dir,
            peers,
            bucket_ms: None,
            groups: 0,
            limits: Limits::default(),
            raft: RaftTiming::default(),
            leader_wait: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            max_fires_per_entry: 10_000,
            snapshot_every_entries: 50_000,
            keep_log_entries: 10_000,
            purge_floor: PURGE_FLOOR,
            rest_after: REST_AFTER,
            balance_every: Duration::ZERO,
            clock: Clock::system(),
            dial: BTreeMap::new(),
            faults: Faults::default(),
            level: crate::command::LEVEL,
            older_peer_rpcs: false,
            tzdb: crate::recurring::tzdb_version().to_string(),
            join: false,
            push_ca: None,
            push_allow_private: false,
            auth_bootstrap_token_file: None,
            tls: Default::default(),
        }
    }

    /// The address to reach peer `id` at: its dial override, or `addr` from the membership.
    pub fn dial_addr(&self, id: NodeId, addr: &str) -> String {
        self.dial
            .get(&id)
            .cloned()
            .unwrap_or_else(|| addr.to_string())
    }

    /// Checks the configuration is coherent.
    /// The bootstrap admin token from `auth_bootstrap_token_file`, if set: read when the node
    /// starts; too short or unreadable is an error (a typo must not leave auth without it).
    pub fn auth_bootstrap_token(&self) -> Result<Option<String>> {
        let Some(path) = &self.auth_bootstrap_token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::InvalidArgument(format!(
                "--auth-bootstrap-token-file {}: {e}",
                path.display()
            ))
        })?;
        let token = text.trim();
        if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::InvalidArgument(format!(
                "--auth-bootstrap-token-file {}: the token must be 16 or more characters \
                 without spaces",
                path.display()
            )));
        }
        Ok(Some(token.to_string()))
    }

    pub fn validate(&self) -> Result<()> {
        if !self.peers.contains_key(&self.id) {
            return Err(Error::InvalidArgument(format!(
                "--peers must include this node's own id {}",
                self.id
            )));
        }
        if self.bucket_ms == Some(0) {
            return Err(Error::InvalidArgument(
                "bucket width must be at least 1 ms".into(),
            ));
        }
        if self.groups > MAX_GROUPS {
            return Err(Error::InvalidArgument(format!(
                "--groups {} is more than {MAX_GROUPS} (a node hosts at most that many data \
                 groups)",
                self.groups
            )));
        }
        // A Fire entry places at most about twice its rows (expired leases' retries, series'
        // next occurrences): bounded far below what one entry can place (DESIGN 10).
        if self.max_fires_per_entry == 0 || self.max_fires_per_entry > MAX_FIRES_PER_ENTRY {
            return Err(Error::InvalidArgument(format!(
                "max fires per entry must be between 1 and {MAX_FIRES_PER_ENTRY}"
            )));
        }
        Ok(())
    }

    /// openraft's configuration for this node.
    pub fn openraft(&self) -> Result<openraft::Config> {
        let config = openraft::Config {
            cluster_name: "timerdb".into(),
            heartbeat_interval: self.raft.heartbeat_ms,
            election_timeout_min: self.raft.election_timeout_min_ms,
            election_timeout_max: self.raft.election_timeout_max_ms,
            // Entries per AppendEntries. openraft re-sends the same range when one is not
            // answered in time (`cluster::network::append_ttl`; 0.9 gave it 100 ms). Entries are
            // already batches (a Multi or ScheduleBatch entry holds up to ~10,000 timers, about
            // 1 MB), so a large count makes a payload a follower cannot append in time, again
            // and again: at 256 a follower that fell behind under load never caught up (every
            // call timed out, measured at 100,000 fires/s), and at 16 loading 10,000,000 timers
            // in batches of 10,000 stalled commits for 10 s. 8 keeps a payload near 8 MB at the
            // very worst and a few hundred KB in steady state, where each call carries what
            // queued up since the last one. (openraft 0.9 has no bound in bytes.)
            max_payload_entries: 8,
            // Snapshot and purge periodically so the log does not grow without bound, keeping a
            // generous tail so a briefly slow follower catches up from the log, not a snapshot.
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.keep_log_entries,
            // Snapshots stream from a file in chunks of this size (one peer RPC each).
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            // The timeout of each chunk's RPC. The last chunk's answer waits for the receiver
            // to install the whole snapshot (about 10 s for 1,000,000 timers on this machine);
            // a timeout sends the snapshot again from the start, so it must cover that.
            install_snapshot_timeout: 60_000,
            // A node campaigns only after a quorum of voters said they would vote for it: their
            // leader's lease ran out and its log is as up to date as theirs. A node cut off from
            // the others (or up before them on a cluster restart, while they replay their
            // WALs) therefore never raises its term, and never deposes the leader they have or
            // restore once it reaches them (`cluster::network`'s `pre_vote`: an unreachable
            // peer grants nothing).
            enable_pre_vote: Some(true),
            // A restarted leader stands for election like any node instead of resuming its
            // term. Resuming, it would serve reads at the commit point it last stored, which is
            // not fsynced (`save_committed`, like the state machine's writes): after every node
            // lost power at once that point can lie below writes already answered, and a
            // ReadIndex read (or the auth layer's view of the access state) would miss them.
            // An election's own first entry sits above every committed one. The cost: a
            // restarted cluster waits for an election, 0.2-0.3 s here (review of issue 34, MED 3;
            // openraft documents exactly these conditions on `enable_leader_restore`).
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        config
            .validate()
            .map_err(|e| Error::InvalidArgument(format!("raft config: {e}")))
    }
}

/// Parses `1=127.0.0.1:7101,2=…` into a peer map.
pub fn parse_peers(s: &str) -> Result<BTreeMap<NodeId, String>> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| Error::InvalidArgument(format!("peer '{part}' is not ID=ADDR")))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("peer id '{id}' is not a number")))?;
        if id == 0 {
            return Err(Error::InvalidArgument("node ids start at 1".into()));
        }
        if peers.insert(id, addr.trim().to_string()).is_some() {
            return Err(Error::InvalidArgument(format!("peer id {id} given twice")));
        }
    }
    if peers.is_empty() {
        return Err(Error::InvalidArgument("--peers lists no node".into()));
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_peers() {
        let p = parse_peers("1=127.0.0.1:7101, 2=127.0.0.1:7102,3=h:1").unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[&2], "127.0.0.1:7102");
        assert!(parse_peers("1=a,1=b").is_err());
        assert!(parse_peers("x=a").is_err());
        assert!(parse_peers("0=a").is_err());
        assert!(parse_peers("").is_err());
        assert!(parse_peers("1:a").is_err());
    }

    #[test]
    fn parses_faults() {
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
        let f = Faults::parse("ignore-cancel, fire-early").unwrap();
        assert!(f.ignore_cancel && !f.ack_before_commit && f.fire_early_ms > 0);
        assert!(Faults::parse("skip-everything").is_err());
    }

    #[test]
    fn default_config_is_valid() {
        let c = NodeConfig::new(1, "/tmp/x".into(), parse_peers("1=a:1").unwrap());
        c.validate().unwrap();
        c.openraft().unwrap();
        let bad = NodeConfig::new(2, "/tmp/x".into(), parse_peers("1=a:1").unwrap());
        assert!(bad.validate().is_err());
    }
}
