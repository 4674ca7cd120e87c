//! `timerd`'s settings: one struct read from three places, most specific first.
//!
//! A setting comes from the command-line flag, else its `TIMERDB_*` environment variable (clap
//! reads both into the same field), else the TOML file given with `--config`, else the default
//! in [`NodeConfig::new`]. [`Settings`] derives both clap's `Args` and serde's `Deserialize`,
//! so a flag and its file key cannot drift apart: the file key is the flag's name with `_` for
//! `-`, and sections group the tuning knobs (`--heartbeat-ms` is `[raft] heartbeat_ms`,
//! `--snapshot-every-entries` is `[snapshot] every_entries`). Unknown keys in the file
//! are an error, so a misspelt setting is never silently ignored. docs/operations.md ("Configure
//! a node") explains them; `docs/timerd.example.toml` is a complete file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{parse_peers, NodeConfig};
use crate::{Error, Result};

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Every setting of a node. Each is optional here: absence means "ask the next source".
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// This node's id (a key of --peers).
    #[arg(long, env = "TIMERDB_ID")]
    pub id: Option<u64>,
    /// Address to listen on for clients and peers.
    #[arg(long, env = "TIMERDB_LISTEN")]
    pub listen: Option<String>,
    /// Directory for the node's RocksDB and snapshots (created if missing).
    #[arg(long, env = "TIMERDB_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Every voter as ID=ADDR, comma-separated, this node included.
    #[arg(long, env = "TIMERDB_PEERS")]
    pub peers: Option<String>,
    /// Join an existing cluster: wait to be added with `timerctl member add` (Cluster.AddNode)
    /// instead of forming one from --peers (which then only needs this node's entry).
    #[arg(long, env = "TIMERDB_JOIN", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub join: Option<bool>,
    /// Wheel bucket width in ms of a new cluster (default 1). The cluster's width is fixed when
    /// it is created; a node joining with an empty data dir takes it without this flag.
    #[arg(long, env = "TIMERDB_BUCKET_MS")]
    pub bucket_ms: Option<u64>,
    /// Data groups of a new cluster, besides group 0 (docs/sharding.md §2; default 0: one
    /// group). Every node of a cluster must be started with the same number.
    #[arg(long, env = "TIMERDB_GROUPS")]
    pub groups: Option<u16>,
    /// With data groups: group 0's leader spreads the data groups' leaders over the nodes
    /// (docs/sharding.md §2). On by default; `--balance-leaders false` leaves each leader where
    /// its election or an operator put it.
    #[arg(long, env = "TIMERDB_BALANCE_LEADERS")]
    pub balance_leaders: Option<bool>,
    /// Serve Prometheus metrics over HTTP at this address (e.g. 127.0.0.1:9101); off if unset.
    #[arg(long, env = "TIMERDB_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Log filter, e.g. `info` or `timerdb=debug,openraft=warn` (default info,openraft=warn).
    #[arg(long, env = "TIMERDB_LOG")]
    pub log: Option<String>,
    /// Log line format.
    #[arg(long, env = "TIMERDB_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// PEM file of CA certificates that push receivers' certificates (`https://`, `grpcs://`)
    /// may chain to, besides the public web roots: for receivers with private certificates.
    #[arg(long, env = "TIMERDB_PUSH_CA")]
    pub push_ca: Option<PathBuf>,
    /// Let push reach loopback, private (RFC 1918, unique local), link-local and CGNAT
    /// addresses: for receivers on a private network. Off, such targets are refused (the
    /// guard against request forgery by whoever may set a namespace's push URL).
    #[arg(long, env = "TIMERDB_PUSH_ALLOW_PRIVATE")]
    pub push_allow_private: Option<bool>,
    /// A file holding a token (16+ characters) that acts as an admin on this node whatever
    /// the replicated keys say: the break-glass credential for turning auth on or recovering.
    #[arg(long, env = "TIMERDB_AUTH_BOOTSTRAP_TOKEN_FILE")]
    pub auth_bootstrap_token_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(default)]
    pub raft: RaftSettings,
    #[command(flatten)]
    #[serde(default)]
    pub snapshot: SnapshotSettings,
    #[command(flatten)]
    #[serde(default)]
    pub tls: TlsSettings,
}

/// `[tls]`: transport security of the client and peer ports (docs/security.md). Files are
/// PEM; every one is read again on SIGHUP.
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The client port's certificate (chain): the port then speaks TLS only.
    #[arg(long = "tls-cert", env = "TIMERDB_TLS_CERT")]
    pub cert: Option<PathBuf>,
    /// The private key of --tls-cert.
    #[arg(long = "tls-key", env = "TIMERDB_TLS_KEY")]
    pub key: Option<PathBuf>,
    /// CA certificates a client certificate must chain to: every client then needs one (mTLS).
    #[arg(long = "client-ca", env = "TIMERDB_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// The cluster CA: peers must present a certificate it signed, and are trusted through it.
    #[arg(long = "peer-ca", env = "TIMERDB_PEER_CA")]
    pub peer_ca: Option<PathBuf>,
    /// This node's peer certificate (presented to the other nodes, and on the peer port).
    #[arg(long = "peer-cert", env = "TIMERDB_PEER_CERT")]
    pub peer_cert: Option<PathBuf>,
    /// The private key of --peer-cert.
    #[arg(long = "peer-key", env = "TIMERDB_PEER_KEY")]
    pub peer_key: Option<PathBuf>,
    /// Accept peer calls only from a certificate naming (DNS or IP SAN, or CN) a member's host.
    #[arg(long = "peer-require-member", env = "TIMERDB_PEER_REQUIRE_MEMBER")]
    pub peer_require_member: Option<bool>,
    /// Serve the peers on their own address (HOST:PORT); --peers then lists these addresses.
    #[arg(long = "peer-listen", env = "TIMERDB_PEER_LISTEN")]
    pub peer_listen: Option<String>,
}

/// `[raft]`: timing. All nodes should agree; see `RaftTiming` for why the defaults are what
/// they are.
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct RaftSettings {
    /// Leader heartbeat interval in ms (also each AppendEntries' timeout).
    #[arg(long = "heartbeat-ms", env = "TIMERDB_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Shortest election timeout in ms.
    #[arg(
        long = "election-timeout-min-ms",
        env = "TIMERDB_ELECTION_TIMEOUT_MIN_MS"
    )]
    pub election_timeout_min_ms: Option<u64>,
    /// Longest election timeout in ms.
    #[arg(
        long = "election-timeout-max-ms",
        env = "TIMERDB_ELECTION_TIMEOUT_MAX_MS"
    )]
    pub election_timeout_max_ms: Option<u64>,
    /// How long a write waits to be committed before failing UNAVAILABLE, in ms.
    #[arg(long = "write-timeout-ms", env = "TIMERDB_WRITE_TIMEOUT_MS")]
    pub write_timeout_ms: Option<u64>,
}

/// `[snapshot]`: the log compaction policy.
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSettings {
    /// Build a snapshot, and purge the log behind it, every this many entries.
    #[arg(
        long = "snapshot-every-entries",
        env = "TIMERDB_SNAPSHOT_EVERY_ENTRIES"
    )]
    pub every_entries: Option<u64>,
    /// Log entries kept behind a snapshot, so a briefly slow follower catches up from the log
    /// rather than by a snapshot.
    #[arg(long = "keep-log-entries", env = "TIMERDB_KEEP_LOG_ENTRIES")]
    pub keep_log_entries: Option<u64>,
}

impl Settings {
    /// Reads a TOML settings file.
    pub fn load(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::InvalidArgument(format!("cannot read config {}: {e}", path.display()))
        })?;
        toml::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("config {}: {e}", path.display())))
    }

    /// These settings, with gaps filled from `lower` (the less specific source).
    pub fn or(self, lower: Settings) -> Settings {
        Settings {
            id: self.id.or(lower.id),
            listen: self.listen.or(lower.listen),
            data_dir: self.data_dir.or(lower.data_dir),
            peers: self.peers.or(lower.peers),
            join: self.join.or(lower.join),
            bucket_ms: self.bucket_ms.or(lower.bucket_ms),
            groups: self.groups.or(lower.groups),
            balance_leaders: self.balance_leaders.or(lower.balance_leaders),
            metrics_listen: self.metrics_listen.or(lower.metrics_listen),
            log: self.log.or(lower.log),
            log_format: self.log_format.or(lower.log_format),
            push_ca: self.push_ca.or(lower.push_ca),
            push_allow_private: self.push_allow_private.or(lower.push_allow_private),
            auth_bootstrap_token_file: (self.auth_bootstrap_token_file)
                .or(lower.auth_bootstrap_token_file),
            raft: RaftSettings {
                heartbeat_ms: self.raft.heartbeat_ms.or(lower.raft.heartbeat_ms),
                election_timeout_min_ms: (self.raft.election_timeout_min_ms)
                    .or(lower.raft.election_timeout_min_ms),
                election_timeout_max_ms: (self.raft.election_timeout_max_ms)
                    .or(lower.raft.election_timeout_max_ms),
                write_timeout_ms: self.raft.write_timeout_ms.or(lower.raft.write_timeout_ms),
            },
            snapshot: SnapshotSettings {
                every_entries: self.snapshot.every_entries.or(lower.snapshot.every_entries),
                keep_log_entries: (self.snapshot.keep_log_entries)
                    .or(lower.snapshot.keep_log_entries),
            },
            tls: TlsSettings {
                cert: self.tls.cert.or(lower.tls.cert),
                key: self.tls.key.or(lower.tls.key),
                client_ca: self.tls.client_ca.or(lower.tls.client_ca),
                peer_ca: self.tls.peer_ca.or(lower.tls.peer_ca),
                peer_cert: self.tls.peer_cert.or(lower.tls.peer_cert),
                peer_key: self.tls.peer_key.or(lower.tls.peer_key),
                peer_require_member: (self.tls.peer_require_member)
                    .or(lower.tls.peer_require_member),
                peer_listen: self.tls.peer_listen.or(lower.tls.peer_listen),
            },
        }
    }

    /// The listen address; required.
    pub fn listen(&self) -> Result<&str> {
        self.listen
            .as_deref()
            .ok_or_else(|| missing("listen", "TIMERDB_LISTEN"))
    }

    /// The node configuration these settings describe, defaults filling the rest.
    pub fn node_config(&self) -> Result<NodeConfig> {
        let id = self.id.ok_or_else(|| missing("id", "TIMERDB_ID"))?;
        let data_dir =
            (self.data_dir.clone()).ok_or_else(|| missing("data-dir", "TIMERDB_DATA_DIR"))?;
        let peers = self
            .peers
            .as_deref()
            .ok_or_else(|| missing("peers", "TIMERDB_PEERS"))?;
        let mut c = NodeConfig::new(id, data_dir, parse_peers(peers)?);
        c.join = self.join.unwrap_or(false);
        c.push_ca = self.push_ca.clone();
        c.push_allow_private = self.push_allow_private.unwrap_or(false);
        c.auth_bootstrap_token_file = self.auth_bootstrap_token_file.clone();
        c.tls = crate::tls::Tls::new(crate::tls::TlsFiles {
            cert: self.tls.cert.clone(),
            key: self.tls.key.clone(),
            client_ca: self.tls.client_ca.clone(),
            peer_ca: self.tls.peer_ca.clone(),
            peer_cert: self.tls.peer_cert.clone(),
            peer_key: self.tls.peer_key.clone(),
            peer_require_member: self.tls.peer_require_member.unwrap_or(false),
            peer_listen: self.tls.peer_listen.clone(),
        });
        if self.bucket_ms.is_some() {
            c.bucket_ms = self.bucket_ms;
        }
        c.groups = self.groups.unwrap_or(0);
        if self.balance_leaders.unwrap_or(true) {
            c.balance_every = super::BALANCE_EVERY;
        }
        set(&mut c.raft.heartbeat_ms, self.raft.heartbeat_ms);
        set(
            &mut c.raft.election_timeout_min_ms,
            self.raft.election_timeout_min_ms,
        );
        set(
            &mut c.raft.election_timeout_max_ms,
            self.raft.election_timeout_max_ms,
        );
        if let Some(ms) = self.raft.write_timeout_ms {
            c.write_timeout = Duration::from_millis(ms);
        }
        set(&mut c.snapshot_every_entries, self.snapshot.every_entries);
        set(&mut c.keep_log_entries, self.snapshot.keep_log_entries);
        c.validate()?;
        c.openraft()?;
        Ok(c)
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

fn missing(flag: &str, env: &str) -> Error {
    Error::InvalidArgument(format!(
        "no {flag}: give --{flag}, set {env}, or put `{}` in the --config file",
        flag.replace('-', "_")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_the_file_overrides_defaults() {
        let file: Settings = toml::from_str(
            r#"
            id = 2
            listen = "127.0.0.1:7102"
            data_dir = "/var/lib/timerdb"
            peers = "1=a:1,2=b:2,3=c:3"
            log_format = "json"
            [raft]
            heartbeat_ms = 150
            election_timeout_min_ms = 400
            election_timeout_max_ms = 600
            [snapshot]
            every_entries = 1000
            "#,
        )
        .unwrap();
        let flags = Settings {
            listen: Some("0.0.0.0:9000".into()),
            raft: RaftSettings {
                heartbeat_ms: Some(120),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = flags.or(file);
        assert_eq!(s.listen().unwrap(), "0.0.0.0:9000");
        assert_eq!(s.log_format, Some(LogFormat::Json));
        let c = s.node_config().unwrap();
        assert_eq!((c.id, c.raft.heartbeat_ms), (2, 120));
        assert_eq!(c.raft.election_timeout_min_ms, 400);
        assert_eq!(c.snapshot_every_entries, 1000);
        assert_eq!(
            c.keep_log_entries,
            NodeConfig::new(1, "x".into(), c.peers.clone()).keep_log_entries
        );
    }

    #[test]
    fn timerd_balances_leaders_unless_told_not_to() {
        let base = "id = 1\nlisten = \"127.0.0.1:7101\"\ndata_dir = \"/d\"\npeers = \"1=a:1\"\n";
        let config = |extra: &str| {
            let s: Settings = toml::from_str(&format!("{base}{extra}")).unwrap();
            s.node_config().unwrap().balance_every
        };
        assert_eq!(config(""), super::super::BALANCE_EVERY);
        assert_eq!(
            config("balance_leaders = true\n"),
            super::super::BALANCE_EVERY
        );
        assert_eq!(config("balance_leaders = false\n"), Duration::ZERO);
    }

    #[test]
    fn the_documented_example_is_valid_and_holds_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/timerd.example.toml");
        let s = Settings::load(&path).unwrap();
        let c = s.node_config().unwrap();
        let d = NodeConfig::new(1, "x".into(), c.peers.clone());
        assert_eq!(s.listen().unwrap(), "127.0.0.1:7101");
        assert_eq!(c.bucket_ms, d.bucket_ms);
        assert_eq!(c.raft.heartbeat_ms, d.raft.heartbeat_ms);
        assert_eq!(
            c.raft.election_timeout_min_ms,
            d.raft.election_timeout_min_ms
        );
        assert_eq!(
            c.raft.election_timeout_max_ms,
            d.raft.election_timeout_max_ms
        );
        assert_eq!(c.write_timeout, d.write_timeout);
        assert_eq!(c.snapshot_every_entries, d.snapshot_every_entries);
        assert_eq!(c.keep_log_entries, d.keep_log_entries);
    }

    #[test]
    fn mistakes_are_named() {
        let typo = toml::from_str::<Settings>("heartbeat_ms = 100").unwrap_err();
        assert!(
            typo.to_string().contains("unknown field `heartbeat_ms`"),
            "{typo}"
        );
        let none = Settings::default().node_config().unwrap_err();
        assert!(none.to_string().contains("--id"), "{none}");
        let bad = Settings {
            id: Some(1),
            data_dir: Some("x".into()),
            peers: Some("1=a:1".into()),
            raft: RaftSettings {
                election_timeout_min_ms: Some(50),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(
            bad.node_config().is_err(),
            "heartbeat 100 ≥ election timeout 50 accepted"
        );
    }
}
