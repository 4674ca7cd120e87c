//! One group's replica on a node: opening it (its state machine, its region of the log
//! engine, its Raft, its door) and starting its workers; forming the data groups with group
//! 0's members (docs/sharding.md §2, §12 step 4).

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use openraft::error::{InitializeError, RaftError};
use openraft::BasicNode;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::purger::Purger;
use crate::cluster::{Acker, DispatchLoop, Dispatcher, FireDriver, Network, Proposer, Raft};
use crate::config::NodeConfig;
use crate::node::{Node, Parts};
use crate::storage::{self, FireSignal, Hold, LogEngine, StateMachine, Store};
use crate::{Error, Result};

/// One group's replica on this node: its door, its Raft, its state, its hand-over gate, and
/// what its workers need (started by [`GroupReplica::spawn_workers`]).
pub struct GroupReplica {
    pub node: Arc<Node>,
    pub raft: Raft,
    pub store: Store,
    pub hold: Hold,
    signal: Arc<FireSignal>,
    dispatcher: Arc<Dispatcher>,
    /// Set while this node leads the group resting (`cluster::rest`); its door reads it.
    pub(super) resting: crate::cluster::rest::Resting,
    /// The door's acker: which term a hand-over began in (`cluster::rest` reads it).
    pub(super) acker: Acker,
}

/// Opens `store`'s group on this node: its state machine, its log (the engine's region of
/// the group), its Raft, and its door.
pub(super) async fn open_group(
    config: &Arc<NodeConfig>,
    engine: &Arc<LogEngine>,
    store: Store,
    levels: &Arc<crate::cluster::Levels>,
    rx: &watch::Receiver<bool>,
) -> Result<GroupReplica> {
    let group = store.space().group;
    let signal = Arc::new(FireSignal::default());
    let sm = StateMachine::open(store.clone(), &config.data_dir, signal.clone())?;
    let log = engine.group(storage::GroupId::from(group));
    let committed = log.committed();
    let snapshots = sm.snapshots();
    let hold = Hold::default();
    let (resting, resting_rx) = watch::channel(crate::cluster::rest::Silence::Heard);
    let network = Network {
        config: config.clone(),
        store: store.clone(),
        levels: levels.clone(),
    };
    let raft = Raft::new(
        config.id,
        Arc::new(config.openraft()?),
        network,
        log.clone(),
        sm,
    )
    .await
    .map_err(|e| Error::Internal(format!("raft of group {group} failed to start: {e}")))?;
    let proposer = Proposer::start(raft.clone(), hold.clone(), crate::node::write_error);
    let dispatcher = Arc::new(Dispatcher::new(store.clone()));
    let acker = Acker::start(proposer.clone(), config.clock);
    let node = Arc::new(Node::new(Parts {
        raft: raft.clone(),
        store: store.clone(),
        acker: acker.clone(),
        config: config.clone(),
        dispatcher: dispatcher.clone(),
        shutdown: rx.clone(),
        proposer,
        hold: hold.clone(),
        committed,
        log,
        snapshots,
        levels: levels.clone(),
        resting: resting_rx,
    }));
    Ok(GroupReplica {
        node,
        raft,
        store,
        hold,
        signal,
        dispatcher,
        resting,
        acker,
    })
}

impl GroupReplica {
    /// Starts the group's workers, which act while this node leads it: the delivery
    /// dispatcher, the purger, the pusher, the level raiser and the fire driver.
    pub(super) fn spawn_workers(
        &self,
        config: &Arc<NodeConfig>,
        levels: &Arc<crate::cluster::Levels>,
        trust: &crate::push::trust::Trust,
        rx: &watch::Receiver<bool>,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Result<()> {
        let dispatch = DispatchLoop {
            id: config.id,
            raft: self.raft.clone(),
            store: self.store.clone(),
            clock: config.clock,
            signal: self.signal.clone(),
            dispatcher: self.dispatcher.clone(),
            hold: self.hold.clone(),
        };
        tasks.push(tokio::spawn(dispatch.run(rx.clone())));
        let purger = Purger {
            id: config.id,
            raft: self.raft.clone(),
            store: self.store.clone(),
            clock: config.clock,
            hold: self.hold.clone(),
            floor: config.purge_floor,
        };
        tasks.push(tokio::spawn(purger.run(rx.clone())));
        let guard = crate::push::guard::Guard::of(config);
        let pusher = crate::push::worker::PushLoop {
            pusher: crate::push::pusher::Pusher {
                node: self.node.clone(),
                http: crate::push::http::HttpSender::new(trust, guard)?,
                grpc: crate::api::services::receiver::grpc_sender(trust.clone(), guard),
            },
        };
        tasks.push(tokio::spawn(pusher.run(rx.clone())));
        let raiser = crate::cluster::level::LevelRaiser {
            id: config.id,
            raft: self.raft.clone(),
            store: self.store.clone(),
            hold: self.hold.clone(),
            levels: levels.clone(),
            own: config.level,
        };
        tasks.push(tokio::spawn(raiser.run(rx.clone())));
        let driver = FireDriver {
            id: config.id,
            raft: self.raft.clone(),
            store: self.store.clone(),
            clock: config.clock,
            signal: self.signal.clone(),
            dispatcher: self.dispatcher.clone(),
            max_fires_per_entry: config.max_fires_per_entry,
            fire_early_ms: config.faults.fire_early_ms,
            hold: self.hold.clone(),
            levels: levels.clone(),
            config: config.clone(),
        };
        tasks.push(tokio::spawn(driver.run(rx.clone())));
        Ok(())
    }
}

impl GroupReplica {
    /// Starts a data group's policy copier, which acts while this node leads the group: it
    /// keeps the group's copies of its namespaces' configurations up with `meta`, this node's
    /// replica of group 0 (`node/policies.rs`).
    pub(super) fn spawn_policy_copier(
        &self,
        config: &Arc<NodeConfig>,
        (meta, map): (&Store, crate::keys::SlotMap),
        rx: &watch::Receiver<bool>,
        tasks: &mut Vec<JoinHandle<()>>,
    ) {
        let (id, raft, node, meta) = (
            config.id,
            self.raft.clone(),
            self.node.clone(),
            meta.clone(),
        );
        let rx = rx.clone();
        tasks.push(tokio::spawn(async move {
            crate::cluster::workers::while_leader(id, &raft, "policy copier", rx, || {
                node.copy_policies(&meta, map)
            })
            .await
        }));
    }
}

/// Forms `raft`'s group of `members`, unless it was formed already (by this node, or by a
/// member that reached it first).
pub(super) async fn initialize(
    raft: &Raft,
    members: std::collections::BTreeMap<u64, BasicNode>,
) -> Result<()> {
    if raft
        .is_initialized()
        .await
        .map_err(|e| Error::Internal(e.to_string()))?
    {
        return Ok(());
    }
    match raft.initialize(members).await {
        Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(Error::Internal(format!("initialize: {e}"))),
    }
}

/// Forms every data group of `rafts` with group 0's voters, once group 0 knows them (a
/// group already formed is left as it is). Logged, not fatal: a data group that is not formed
/// here is formed by a member that reaches it first.
pub(super) async fn form_data_groups(zero: Raft, rafts: Vec<Raft>) {
    let members = members_of(&zero).await;
    for raft in rafts {
        if let Err(e) = initialize(&raft, members.clone()).await {
            tracing::error!(error = %e, "forming a data group");
        }
    }
}

/// The voters of `raft`'s group, once it knows some.
async fn members_of(raft: &Raft) -> std::collections::BTreeMap<u64, BasicNode> {
    let mut metrics = raft.metrics();
    loop {
        let known = {
            let m = metrics.borrow_watched();
            let membership = m.membership_config.membership();
            (membership.voter_ids())
                .filter_map(|id| membership.get_node(&id).map(|node| (id, node.clone())))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        if !known.is_empty() {
            return known;
        }
        tracing::info!("the data groups wait for group 0 to know its members");
        let wait = tokio::time::timeout(Duration::from_secs(10), metrics.changed());
        if let Ok(Err(_)) = wait.await {
            return known; // raft stopped: nothing to form
        }
    }
}
