//! `timerd`: one timerdb node.
//!
//! `timerd --id 1 --listen 127.0.0.1:7101 --data-dir DIR --peers 1=127.0.0.1:7101,2=…,3=…`
//! One port serves the client services and the peer Raft service. SIGTERM or SIGINT shuts the
//! node down cleanly (exit 0); on SIGTERM a leader first hands leadership to another voter.
//! A fatal storage error (say, a full disk) stops Raft; the node then shuts down and exits 1,
//! fail-stop, for its supervisor to restart once fixed.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use timerdb::clock::Clock;
use timerdb::config::{parse_peers, Faults, NodeConfig};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// A timerdb node.
#[derive(Parser, Debug)]
#[command(name = "timerd", version, about)]
struct Args {
    /// This node's id (a key of --peers).
    #[arg(long, env = "TIMERDB_ID")]
    id: u64,
    /// Address to listen on for clients and peers.
    #[arg(long, env = "TIMERDB_LISTEN")]
    listen: String,
    /// Directory for the node's RocksDB and snapshots (created if missing).
    #[arg(long, env = "TIMERDB_DATA_DIR")]
    data_dir: PathBuf,
    /// Every voter as ID=ADDR, comma-separated, this node included.
    #[arg(long, env = "TIMERDB_PEERS")]
    peers: String,
    /// Wheel bucket width in ms (fixed for the life of a data dir; all nodes must agree).
    #[arg(long, env = "TIMERDB_BUCKET_MS", default_value_t = timerdb::wheel::DEFAULT_BUCKET_MS)]
    bucket_ms: u64,
    /// Skew this node's clock by this many ms (testing only).
    #[arg(
        long,
        env = "TIMERDB_CLOCK_OFFSET_MS",
        default_value_t = 0,
        allow_hyphen_values = true
    )]
    clock_offset_ms: i64,
    /// Dial these peers at other addresses than --peers gives (e.g. through a proxy), as
    /// ID=ADDR, comma-separated. Used by the chaos harness to put faults on peer links.
    #[arg(long, env = "TIMERDB_DIAL", default_value = "")]
    dial: String,
    /// Deliberate bugs for proving the chaos checker (never in service): comma-separated
    /// ignore-cancel, ack-before-commit, fire-early.
    #[arg(long, env = "TIMERDB_FAULT", default_value = "")]
    fault: String,
    /// Join an existing cluster: wait to be added with `timerctl member add` (Cluster.AddNode)
    /// instead of forming a cluster from --peers (which then only needs this node's entry).
    #[arg(long, env = "TIMERDB_JOIN")]
    join: bool,
    /// Log filter, e.g. `info` or `timerdb=debug,openraft=warn`.
    #[arg(long, env = "TIMERDB_LOG", default_value = "info,openraft=warn")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log))
        .with_target(false)
        .init();
    let peers = parse_peers(&args.peers)?;
    let mut config = NodeConfig::new(args.id, args.data_dir.clone(), peers);
    config.bucket_ms = args.bucket_ms;
    config.clock = Clock::with_offset(args.clock_offset_ms);
    if !args.dial.is_empty() {
        config.dial = parse_peers(&args.dial)?;
    }
    config.faults = Faults::parse(&args.fault)?;
    config.join = args.join;
    if config.faults != Faults::default() {
        tracing::warn!(faults = ?config.faults, "DELIBERATE BUGS ARE ON (chaos checker proof)");
    }
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let node = timerdb::server::start(config, listener)
        .await
        .context("node failed to start")?;

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let failed = tokio::select! {
        _ = term.recv() => {
            tracing::info!("SIGTERM: shutting down");
            node.hand_off().await;
            false
        }
        _ = int.recv() => { tracing::info!("SIGINT: shutting down"); false }
        why = node.failed() => {
            tracing::error!(%why, "Raft stopped on a fatal error: exiting (restart the node once fixed)");
            true
        }
    };
    node.shutdown().await;
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
