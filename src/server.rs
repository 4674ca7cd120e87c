//! Wires a node together and runs it: storage, Raft, the gRPC server, the fire driver, the
//! delivery dispatcher, the quiet flusher and the election gate.
//!
//! The listener, the clock (inside `NodeConfig`) and the shutdown signal are injected, so tests
//! bind `127.0.0.1:0`, run three nodes in one process and stop them cleanly (mini-redis style).
//!
//! Bootstrap is static, like etcd's `--initial-cluster`: a node whose storage is uninitialised
//! calls `initialize` with every peer from `--peers`. Several nodes doing so with identical
//! membership is safe (openraft); a node restarted on its data dir is already initialised and
//! simply rejoins.

use openraft::async_runtime::WatchReceiver as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::http::Transcode;
use crate::api::pb::access_server::AccessServer;
use crate::api::pb::namespaces_server::NamespacesServer;
use crate::api::pb::{
    cluster_server::ClusterServer, groups_server::GroupsServer, raft_server::RaftServer,
    timers_server::TimersServer,
};
use crate::api::services::access::AccessService;
use crate::api::services::cluster::ClusterService;
use crate::api::services::namespaces::NamespacesService;
use crate::api::services::peer::{PeerGroups, PeerService};
use crate::api::services::timers::TimersService;
use crate::api::stack::auth::Gate;
use crate::api::stack::layer::LayerOf;
use crate::api::stack::limit::{Bound, MAX_REQUESTS_IN_PROGRESS};
use crate::api::MAX_CLIENT_MESSAGE_BYTES;
use crate::cluster::Raft;
use crate::cluster::MAX_PEER_MESSAGE_BYTES;
use crate::config::NodeConfig;
use crate::listen::Listener;
use crate::node::Node;
use crate::storage::Hold;
use crate::storage::{self, LogEngine, Store};
use crate::tls::Port;
use crate::{Error, Result};
pub use groups::GroupReplica;
use groups::{form_data_groups, initialize, open_group};

/// A started node; call [`RunningNode::shutdown`] to stop it.
pub struct RunningNode {
    /// The node's door: what the API layer calls.
    pub node: Arc<Node>,
    /// The node's Raft handle and state machine reader, for tests and tools that look inside
    /// (the wiring holds every part; nothing serving a request reaches them but through `node`).
    pub raft: Raft,
    pub store: Store,
    /// The hand-over gate and what each peer advertised (tests close the one, read the other).
    pub hold: Hold,
    pub levels: Arc<crate::cluster::Levels>,
    /// Every group's door on this node (group 0's is `node`).
    pub nodes: Arc<crate::node::Nodes>,
    /// This node's replicas of the data groups (1..=`--groups`; docs/sharding.md §2). Group
    /// 0's are the fields above.
    pub groups: Vec<GroupReplica>,
    /// Which of them rest here, as leader or follower (`cluster::rest`).
    pub rest: Arc<crate::cluster::rest::Rest>,
    /// The address the gRPC server listens on.
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// One reference to the database, so shutdown can close it itself (see `shutdown`).
    db: Arc<rocksdb::DB>,
    /// Extra ms every log fsync of this node takes (`LogStore::fsync_delay_ms`): for tests.
    pub fsync_delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

/// Opens storage, starts Raft, serves gRPC on `listener` and starts the fire driver.
pub async fn start(config: NodeConfig, listener: impl Into<Listener>) -> Result<RunningNode> {
    start_with(config, listener, None).await
}

/// [`start`], with the peers' own listener when `--peer-listen` is set (required then).
pub async fn start_with(
    config: NodeConfig,
    listener: impl Into<Listener>,
    peer_listener: Option<TcpListener>,
) -> Result<RunningNode> {
    let listener = listener.into();
    let peer_listener = peer_listener.map(Listener::from);
    config.validate()?;
    config.tls.load()?;
    if config.tls.files.peer_listen.is_some() != peer_listener.is_some() {
        return Err(Error::InvalidArgument(
            "--peer-listen and the peer listener go together".into(),
        ));
    }
    let config = Arc::new(config);
    let addr = listener.local_addr()?;
    let gc = storage::IndexGc::new();
    let db = open_db_retrying(&config.data_dir, &gc).await?;
    let store = Store::with_width(db.clone(), config.bucket_ms, gc);
    // The width the data dir records comes first (a restart without --bucket-ms keeps it;
    // one with another is refused). Then a new node of a new cluster (no width recorded, none
    // given) takes the default; a joining one takes the cluster's from its first peer
    // (`Store::adopt_width`).
    store.settle_width()?;
    if store.width_ms() == 0 && !config.join {
        store.adopt_width(crate::wheel::DEFAULT_BUCKET_MS, "the default")?;
    }
    store.settle_groups(config.groups)?;
    let db_owner = db.clone();
    // The node's one log engine: every group's log (`storage/log_engine.rs`).
    let engine = LogEngine::open(db)?;
    let levels = Arc::new(crate::cluster::Levels::default());
    let (shutdown, rx) = watch::channel(false);
    let peers = Arc::new(PeerGroups::default());
    // Group 0, then the data groups (docs/sharding.md §2): each its own Raft over the shared
    // log engine and state database.
    let mut replicas = Vec::new();
    for group in 0..=config.groups {
        let store = store.group(group);
        let replica = open_group(&config, &engine, store, &levels, &rx).await?;
        peers.add(replica.raft.clone(), replica.store.clone());
        replicas.push(replica);
    }
    let zero = replicas.remove(0);
    let fsync_delay_ms = engine.fsync_delay_ms();
    let node = zero.node.clone();
    // Which data groups rest (docs/sharding.md §7): group 0 never does.
    let rest = Arc::new(crate::cluster::rest::Rest::new(
        config.id,
        config.rest_after,
        (replicas.iter()).map(|r| {
            let group = r.store.space().group;
            (group, r.raft.clone(), r.resting.clone(), r.acker.clone())
        }),
    ));
    let doors = std::iter::once(&zero).chain(&replicas);
    let (nodes, read_indexes) = crate::node::Nodes::new(doors.map(|r| r.node.clone()).collect());
    let peer = PeerService::new(
        peers,
        config.clone(),
        levels.clone(),
        rest.clone(),
        nodes.clone(),
    );

    let bootstrap_token = config.auth_bootstrap_token()?;
    let mut tasks = vec![tokio::spawn(read_indexes)];
    let mut listeners = vec![(Port::Client, listener)];
    listeners.extend(peer_listener.map(|l| (Port::Peer, l)));
    for (port, listener) in listeners {
        let gate = Gate::new(nodes.clone(), bootstrap_token.as_deref(), port);
        let tls = config.tls.clone();
        let incoming = crate::listen::incoming(listener, tls, port, rx.clone());
        tasks.push(tokio::spawn(serve(
            nodes.clone(),
            peer.clone(),
            gate,
            port,
            incoming,
            rx.clone(),
        )));
    }
    bootstrap(&config, &zero.raft).await?;
    if !replicas.is_empty() && !config.join {
        // A joining node forms none: each data group's leader adds it (`node/members.rs`).
        // The data groups start with group 0's voters (the same `--peers`, unless group 0
        // was formed earlier: then its own), once group 0 knows them: a node that holds a
        // vote and no entries yet learns them from its leader, maybe much later.
        let rafts: Vec<Raft> = replicas.iter().map(|r| r.raft.clone()).collect();
        tasks.push(tokio::spawn(form_data_groups(zero.raft.clone(), rafts)));
    }
    let trust = crate::push::trust::Trust::load(config.push_ca.as_deref())?;
    for replica in std::iter::once(&zero).chain(&replicas) {
        replica.spawn_workers(&config, &levels, &trust, &rx, &mut tasks)?;
    }
    for replica in &replicas {
        replica.spawn_policy_copier(&config, (&zero.store, nodes.map()), &rx, &mut tasks);
    }
    tasks.push(tokio::spawn(crate::node::hand_over_when_cut_off(
        nodes.clone(),
        rx.clone(),
    )));
    tasks.push(tokio::spawn(crate::node::balance_leaders(
        nodes.clone(),
        zero.store.clone(),
        rx.clone(),
    )));
    tasks.push(tokio::spawn(crate::cluster::rest::run(
        rest.clone(),
        (zero.raft.clone(), zero.store.clone()),
        config.clone(),
        rx.clone(),
    )));
    tasks.push(tokio::spawn(storage::quiet::run(
        db_owner.clone(),
        rx.clone(),
    )));
    tasks.push(tokio::spawn(crate::node::sample::sample_loop(
        node.clone(),
        rx.clone(),
    )));
    tracing::info!(id = config.id, %addr, "node started");
    Ok(RunningNode {
        node,
        raft: zero.raft,
        store: zero.store,
        hold: zero.hold,
        levels,
        nodes,
        groups: replicas,
        rest,
        addr,
        shutdown,
        tasks,
        db: db_owner,
        fsync_delay_ms,
    })
}

/// RocksDB's lock outlives a stopped node for a moment (its syncer thread lets go last), so a
/// node restarted in the same process retries briefly.
async fn open_db_retrying(
    dir: &std::path::Path,
    gc: &Arc<storage::IndexGc>,
) -> Result<Arc<rocksdb::DB>> {
    let mut attempts = 0;
    loop {
        match storage::open_db(dir, gc) {
            Err(Error::Storage(m)) if m.contains("lock") && attempts < 100 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

async fn bootstrap(config: &NodeConfig, raft: &Raft) -> Result<()> {
    if config.join {
        tracing::info!(
            id = config.id,
            "joining: waiting to be added (Cluster.AddNode)"
        );
        return Ok(());
    }
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
    if initialized {
        return Ok(());
    }
    let members: std::collections::BTreeMap<u64, BasicNode> = config
        .peers
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    initialize(raft, members).await
}

async fn serve(
    nodes: Arc<crate::node::Nodes>,
    peer: PeerService,
    gate: Gate,
    port: Port,
    incoming: impl tokio_stream::Stream<Item = std::io::Result<crate::listen::Conn>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let node = nodes.meta().clone();
    let router = Arc::new(crate::api::stack::forward::Router::new(nodes.clone()));
    let timers = TimersServer::new(TimersService::new(router.clone()))
        .max_decoding_message_size(MAX_CLIENT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_CLIENT_MESSAGE_BYTES);
    let groups = GroupsServer::new(peer.clone())
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
    let peer = RaftServer::new(peer)
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let health_task = tokio::spawn(crate::api::services::health::report(node.clone(), reporter));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::api::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1();
    let reflection = match reflection {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!(error = %e, "server reflection unavailable");
            None
        }
    };
    let small = crate::api::MAX_SMALL_MESSAGE_BYTES;
    let result = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        // The HTTP/JSON API (docs/http.md) also speaks HTTP/1.1, on the client port only.
        .accept_http1(port == Port::Client)
        // Outermost: an HTTP/JSON call becomes the gRPC call it names and goes down the rest.
        .layer(LayerOf(Transcode))
        .layer(crate::api::stack::observe::ObserveLayer)
        // The layers are each an `api::stack::layer::Around`: the request bound, auth, the
        // call's group (read from its message only once auth let it on), then forwarding to
        // the group's leader.
        .layer(LayerOf(Bound::new(MAX_REQUESTS_IN_PROGRESS)))
        .layer(LayerOf(Arc::new(gate)))
        .layer(LayerOf(crate::api::stack::group::Grouping(nodes.clone())))
        .layer(LayerOf(router))
        .add_service(health)
        .add_optional_service(reflection)
        .add_service(timers)
        .add_service(
            NamespacesServer::new(NamespacesService::new(nodes.clone()))
                .max_decoding_message_size(small),
        )
        .add_service(
            ClusterServer::new(ClusterService::new(nodes.clone())).max_decoding_message_size(small),
        )
        .add_service(
            AccessServer::new(AccessService::new(node.clone())).max_decoding_message_size(small),
        )
        .add_service(peer)
        .add_service(groups)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    health_task.abort();
    if let Err(e) = result {
        tracing::error!(error = %e, "gRPC server failed");
    }
}

impl RunningNode {
    /// Before a planned stop: hands every group this node leads to another voter, so the
    /// cluster does not wait out an election timeout for the stop. From the start this node
    /// takes no leadership (`Nodes::begin_stop`), and it repeats until it leads nothing and
    /// takes no balancing move that began before (a group handed to it meanwhile, or a
    /// hand-over refused because another was under way), all within [`HAND_OFF_LIMIT`]. On failure the stop goes on (the others elect a leader
    /// as after a crash).
    pub async fn hand_off(&self) {
        self.nodes.begin_stop();
        let deadline = tokio::time::Instant::now() + HAND_OFF_LIMIT;
        loop {
            let nodes = std::iter::once(&self.node).chain(self.groups.iter().map(|g| &g.node));
            let leading: Vec<&Arc<Node>> = nodes
                .filter(|n| n.leader() == crate::node::Leader::Me && n.other_voters() > 0)
                .collect();
            let taking = self.nodes.moves_being_taken();
            if (leading.is_empty() && taking == 0) || tokio::time::Instant::now() >= deadline {
                return;
            }
            let handed = leading.into_iter().map(|node| async move {
                let group = node.group();
                let transfer = node.transfer_leader(None);
                match tokio::time::timeout_at(deadline, transfer).await {
                    Ok(Ok(to)) => tracing::info!(group, to, "stopping: leadership handed over"),
                    Ok(Err(e)) => {
                        tracing::warn!(group, error = %e, "stopping: leadership not handed over")
                    }
                    Err(_) => tracing::warn!(group, "stopping: leadership hand-off took too long"),
                }
            });
            futures::future::join_all(handed).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Resolves when Raft stops by itself on a fatal error (a full disk, a failed apply): the
    /// node can make no more progress. `timerd` then exits non-zero so a supervisor restarts it.
    pub async fn failed(&self) -> String {
        let rafts = std::iter::once(&self.raft).chain(self.groups.iter().map(|g| &g.raft));
        let watches = rafts.map(|raft| {
            let mut metrics = raft.metrics();
            Box::pin(async move {
                let why = match metrics.wait_until(|m| m.running_state.is_err()).await {
                    Ok(m) => m.running_state.clone().err().map(|e| e.to_string()),
                    Err(_) => None,
                };
                why.unwrap_or_else(|| "raft stopped".into())
            })
        });
        futures::future::select_all(watches).await.0
    }

    /// Stops serving, stops the fire driver and Raft, waits for them, flushes the memtables
    /// (`flush_for_restart`) and waits until the database is closed: the drain and three more
    /// `SHUTDOWN_STEP`s, then the flush if begun within [`FLUSH_DEADLINE`], whatever peers and
    /// clients do (stragglers are aborted).
    ///
    /// Closing the database before returning matters: a process that exits while RocksDB is
    /// still open runs RocksDB's static destructors under its live threads and aborts
    /// ("pthread lock: Invalid argument", SIGABRT) instead of exiting 0.
    pub async fn shutdown(self) {
        let started = std::time::Instant::now();
        let RunningNode {
            node,
            raft,
            store,
            hold,
            levels,
            groups,
            nodes: doors,
            shutdown,
            tasks,
            db,
            ..
        } = self;
        let id = node.id();
        let nodes: Vec<Arc<Node>> = std::iter::once(node.clone())
            .chain(groups.iter().map(|g| g.node.clone()))
            .collect();
        // Acks answered as queued apply first, leading or not, handed over or not (a stop is
        // no failure): queuing stops, the queued ones are proposed, then everything stops.
        let drains = nodes.iter().map(|n| n.drain_queued_acks(SHUTDOWN_STEP));
        for (n, drained) in nodes.iter().zip(futures::future::join_all(drains).await) {
            if let Err(unsettled) = drained {
                tracing::warn!(
                    group = n.group(),
                    unsettled,
                    "stopping with acks answered as queued not yet applied (their deliveries \
                     come again)"
                );
            }
        }
        let _ = shutdown.send(true);
        let rafts = std::iter::once(&raft).chain(groups.iter().map(|g| &g.raft));
        let stops = rafts.map(|r| tokio::time::timeout(SHUTDOWN_STEP, r.shutdown()));
        for stopped in futures::future::join_all(stops).await {
            match stopped {
                Ok(Err(e)) => tracing::warn!(error = %e, "raft shutdown"),
                Err(_) => tracing::warn!("raft did not stop within {SHUTDOWN_STEP:?}"),
                Ok(Ok(())) => {}
            }
        }
        let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
        if tokio::time::timeout(SHUTDOWN_STEP, futures::future::join_all(tasks))
            .await
            .is_err()
        {
            tracing::warn!("server tasks did not stop within {SHUTDOWN_STEP:?}; aborting them");
            aborts.iter().for_each(|a| a.abort());
        }
        drop((nodes, doors, node, raft, store, hold, levels, groups));
        if wait_sole_owner(&db, SHUTDOWN_STEP).await {
            flush_for_restart(id, &db, started.elapsed());
            // The last reference: RocksDB closes here, on this thread, before we return.
            drop(db);
        } else {
            tracing::warn!(
                id,
                "the database is still referenced after {SHUTDOWN_STEP:?}"
            );
        }
        tracing::info!(id, elapsed = ?started.elapsed(), "node stopped");
    }
}

/// Writes the memtables out at a planned stop, so the next start has no WAL to replay: right
/// after a 10,000,000-timer load each node's replay took ~1.9 s of a 2.3 s cluster restart,
/// and this flush 0.4-0.8 s. Skipped where it buys little or the stop is already late:
/// memtables under `quiet::MIN_BYTES` (a quiet node; the quiet flusher's own threshold, so a
/// test's or the simulator's small node still replays its WAL at a restart, as after a
/// crash), or a stop that has used [`FLUSH_DEADLINE`]: RocksDB cannot cancel a flush begun
/// (one SST, its directory and the manifest fsynced per family with data), so it is begun
/// only where the rest of the stop's grace can take it. Nothing acknowledged depends on it:
/// a stop cut short by SIGKILL mid-flush restarts from the WAL, as after a crash.
fn flush_for_restart(id: u64, db: &rocksdb::DB, elapsed: Duration) {
    let bytes = storage::quiet::memtable_bytes(db);
    if bytes < storage::quiet::MIN_BYTES {
        return;
    }
    if elapsed > FLUSH_DEADLINE {
        tracing::warn!(
            id,
            bytes,
            ?elapsed,
            "stopping without flushing: the stop is late"
        );
        return;
    }
    let flushing = std::time::Instant::now();
    match storage::quiet::flush_all(db) {
        Ok(()) => tracing::info!(id, bytes, elapsed = ?flushing.elapsed(), "memtables flushed"),
        Err(e) => tracing::warn!(id, error = %e, "flushing the memtables at stop"),
    }
}

/// How much of a stop may have passed for its memtables still to be flushed (see
/// [`flush_for_restart`]); the steps before it are bounded by 30 s in all.
const FLUSH_DEADLINE: Duration = Duration::from_secs(15);

/// Waits until `db` is the only reference left (Raft's storage, the syncer thread and the
/// services have let go).
async fn wait_sole_owner(db: &Arc<rocksdb::DB>, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while Arc::strong_count(db) > 1 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Streams one client connection may have open at once (HTTP/2 refuses more).
const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// Largest header block a request may send.
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;

/// Bound on the leadership hand-off before a planned stop: the queued acks' drain
/// (`membership::QUEUED_DRAIN_LIMIT`) and a hand-over.
const HAND_OFF_LIMIT: Duration = Duration::from_secs(10);

/// Bound on each shutdown step (Raft, then the server and driver tasks).
const SHUTDOWN_STEP: Duration = Duration::from_secs(5);

mod groups;
#[cfg(test)]
mod tests;
