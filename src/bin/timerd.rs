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
use timerdb::config::{parse_peers, Faults, LogFormat, Settings};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// jemalloc, for Rust's allocations and, unprefixed, for RocksDB's `malloc` and `new` too.
/// It replaced glibc's malloc (which timerd had tuned: two arenas, a fixed 1 MiB mmap
/// threshold, a trim past 4 MiB free). Side by side against that (issue 34, 2026-11-27):
/// ScheduleBatch 1000 × 4 ×1.06 and the burst's load ×1.16 (5 alternating runs each);
/// 10,000,000 pending (one run each), RSS right after the load 275 -> 216 MiB, during it
/// 319 -> 302, at rest 142 -> 148, load 92,922 -> 101,465 timers/s, restart to first write
/// right after the load 2.20 -> 1.36 s.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read before `main` (the `MALLOC_CONF` variable overrides them). Its
/// defaults keep freed pages until the next allocation of that arena decays them: RSS at rest
/// after a 10,000,000-timer load stayed at 275 MiB (glibc's: 142). A background thread returns
/// pages a quarter of a second after they are freed; two arenas (this machine's cores)
/// fragment less than the default four per core. A node on many cores may want more:
/// `MALLOC_CONF=narenas:N`. The quarter second against a whole one, 10,000,000 pending, one
/// run each: RSS during the load 279 -> 259 MiB, right after it 227 -> 176; at 0 ms, 257
/// during but a load 25 % slower (every free returned at once).
#[export_name = "malloc_conf"]
static MALLOC_CONF: &[u8; 69] =
    b"background_thread:true,narenas:2,dirty_decay_ms:250,muzzy_decay_ms:0\0";

/// A timerdb node. Settings come from flags, else TIMERDB_* variables, else --config.
#[derive(Parser, Debug)]
#[command(name = "timerd", version, about)]
struct Args {
    /// A TOML settings file (docs/timerd.example.toml); flags and TIMERDB_* variables override it.
    #[arg(long, env = "TIMERDB_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
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
    /// Restore a backup (`timerctl backup save`) into the empty --data-dir as a member of a new
    /// cluster of --peers, then exit; start the node again without this flag. Run it on every
    /// node of the new cluster with the same file and the same --peers.
    #[arg(long, value_name = "FILE")]
    restore_from: Option<PathBuf>,
}

const DEFAULT_LOG: &str = "info,openraft=warn";

fn init_logging(filter: &str, format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_target(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// `--restore-from`: builds the node's data dir from a backup, offline.
fn restore(backup: &std::path::Path, config: &timerdb::config::NodeConfig) -> anyhow::Result<()> {
    if config.join {
        anyhow::bail!(
            "--restore-from starts a new cluster; a --join node gets its state from the cluster"
        );
    }
    let voters = config
        .peers
        .iter()
        .map(|(id, addr)| (*id, openraft::BasicNode::new(addr)))
        .collect();
    let s = timerdb::storage::restore::restore(backup, &config.data_dir, voters, config.bucket_ms)
        .with_context(|| format!("cannot restore {}", backup.display()))?;
    tracing::info!(
        index = s.index,
        timers = s.timers,
        pending = s.pending,
        namespaces = s.namespaces,
        bytes = s.bytes,
        data_dir = %config.data_dir.display(),
        voters = ?config.peers.keys().collect::<Vec<_>>(),
        "restored: start timerd again without --restore-from"
    );
    Ok(())
}

/// Reads the certificate files again on each SIGHUP (rotation without a restart); a file that
/// does not load leaves the ones in use in place.
async fn reload_on_sighup(tls: timerdb::tls::Tls) {
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("SIGHUP cannot be caught: certificates reload only on restart");
        return;
    };
    while hup.recv().await.is_some() {
        match tls.reload() {
            Ok(()) => tracing::info!("SIGHUP: certificates reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: certificates not reloaded; the old ones stay")
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let file = match &args.config {
        Some(path) => Settings::load(path)?,
        None => Settings::default(),
    };
    let settings = args.settings.clone().or(file);
    init_logging(
        settings.log.as_deref().unwrap_or(DEFAULT_LOG),
        settings.log_format.unwrap_or_default(),
    );
    let mut config = settings.node_config()?;
    config.clock = Clock::with_offset(args.clock_offset_ms);
    if !args.dial.is_empty() {
        config.dial = parse_peers(&args.dial)?;
    }
    config.faults = Faults::parse(&args.fault)?;
    if let Some(backup) = &args.restore_from {
        return restore(backup, &config);
    }
    if config.faults != Faults::default() {
        tracing::warn!(faults = ?config.faults, "DELIBERATE BUGS ARE ON (chaos checker proof)");
    }
    tracing::info!(
        id = config.id,
        data_dir = %config.data_dir.display(),
        snapshot_every_entries = config.snapshot_every_entries,
        keep_log_entries = config.keep_log_entries,
        "starting"
    );
    let listen = settings.listen()?.to_string();
    if let Some(addr) = &settings.metrics_listen {
        let addr = addr
            .parse()
            .with_context(|| format!("--metrics-listen {addr} is not HOST:PORT"))?;
        timerdb::metrics::serve(addr)?;
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    }
    let listener = TcpListener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let peer_listener = match &config.tls.files.peer_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on --peer-listen {addr}"))?,
        ),
        None => None,
    };
    let tls = config.tls.clone();
    let node = timerdb::server::start_with(config, listener, peer_listener)
        .await
        .context("node failed to start")?;
    tokio::spawn(reload_on_sighup(tls));

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
