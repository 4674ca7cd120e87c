//! Operations on in-process clusters: membership changes under load, leadership transfer,
//! health and reflection.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use timerdb::api::pb;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use crate::harness::*;

/// Schedules batches of 50 timers due 0.5–1.5 s ahead through `via` until `stop`; counts the
/// timers acknowledged. Calls that fail (UNAVAILABLE during a change) are retried: the ids are
/// the same, so a retry is idempotent.
fn load(
    client: pb::timers_client::TimersClient<tonic::transport::Channel>,
    stop: Arc<AtomicBool>,
) -> (JoinHandle<()>, Arc<AtomicU64>) {
    let acked = Arc::new(AtomicU64::new(0));
    let count = acked.clone();
    let task = tokio::spawn(async move {
        let mut client = client;
        let mut batch = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let base = now_ms() + 500;
            let timers = (0..50)
                .map(|i| schedule_req(&format!("l{batch}-{i}"), base + i * 20))
                .collect();
            if client
                .schedule_batch(pb::ScheduleBatchRequest { timers })
                .await
                .is_ok()
            {
                count.fetch_add(50, Ordering::Relaxed);
                batch += 1;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (task, acked)
}

fn ids(members: &[pb::Member]) -> Vec<(u64, bool)> {
    members.iter().map(|m| (m.node_id, m.voter)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn learner_added_under_load_is_promoted_and_a_voter_is_removed() {
    let mut c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let stop = Arc::new(AtomicBool::new(false));
    let (loader, acked) = load(c.client(follower).await, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Phase 1: node 4 starts with --join and is added as a learner through a follower; it
    // catches up while the load goes on.
    let addr = c.join(4).await;
    let mut admin = c.cluster(follower).await;
    let add = |learner| pb::AddNodeRequest {
        node_id: 4,
        addr: addr.clone(),
        learner,
    };
    let r = admin.add_node(add(true)).await.unwrap().into_inner();
    assert!(ids(&r.members).contains(&(4, false)), "{:?}", r.members);
    // Retrying is harmless; a different address for the same id is refused.
    admin.add_node(add(true)).await.unwrap();
    let moved = pb::AddNodeRequest {
        addr: "127.0.0.1:1".into(),
        ..add(false)
    };
    let e = admin.add_node(moved).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let bad = pb::AddNodeRequest {
        node_id: 0,
        ..add(false)
    };
    assert_eq!(
        admin.add_node(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    // Phase 2: promoted to voter, still under load.
    let r = admin.add_node(add(false)).await.unwrap().into_inner();
    assert!(ids(&r.members).contains(&(4, true)), "{:?}", r.members);

    // Phase 3: remove voter 3 (through node 4), refuse unknown ids, and stop node 3.
    let mut admin4 = c.cluster(4).await;
    let gone = pb::RemoveNodeRequest { node_id: 99 };
    let e = admin4.remove_node(gone).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let leader = c.leader().await;
    let victim = (1..=3).find(|id| *id != leader && *id != follower).unwrap();
    let r = admin4
        .remove_node(pb::RemoveNodeRequest { node_id: victim })
        .await
        .unwrap()
        .into_inner();
    assert!(!ids(&r.members).iter().any(|m| m.0 == victim));
    assert_eq!(r.members.len(), 3);
    c.stop(victim).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Phase 4: the load ran throughout; every acknowledged timer is on the new voter, and the
    // three members converge to the same state.
    stop.store(true, Ordering::Relaxed);
    loader.await.unwrap();
    let acked = acked.load(Ordering::Relaxed);
    assert!(acked >= 500, "load barely ran: {acked} timers");
    c.converged().await;
    let batches = acked / 50;
    for b in 0..batches {
        assert!(
            c.local_timer(4, &format!("l{b}-49")).is_some(),
            "acknowledged batch {b} missing on node 4"
        );
    }
    c.shutdown().await;
}

/// Finding 4 of issue 33: the bucket width was node-local configuration, so a node joined with
/// another `--bucket-ms` placed and fired timers on other keys, silently. It is the cluster's:
/// fixed when the cluster is created, taken by a node joining with an empty data dir, and a node
/// with another width is refused before it becomes a member, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_node_takes_the_clusters_bucket_width_and_one_with_another_is_refused() {
    let mut c = TestCluster::start_with(3, |n| n.bucket_ms = Some(2)).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    let at = now_ms() + 300;
    let timers = (0..20)
        .map(|i| schedule_req(&format!("w{i}"), at + i))
        .collect();
    client
        .schedule_batch(pb::ScheduleBatchRequest { timers })
        .await
        .unwrap();
    let mut admin = c.cluster(leader).await;

    let addr = c.join_with(4, |n| n.bucket_ms = Some(5)).await;
    let add = pb::AddNodeRequest {
        node_id: 4,
        addr,
        learner: false,
    };
    let e = admin.add_node(add).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("bucket width") && e.message().contains("--bucket-ms 2"),
        "the reason, and the fix: {e:?}"
    );
    let status = admin.status(pb::StatusRequest {}).await.unwrap();
    assert!(
        !ids(&status.into_inner().members).iter().any(|m| m.0 == 4),
        "never a member"
    );
    c.stop(4).await;

    // Started without a width on an empty data dir, a node takes the cluster's — from a peer
    // that sends it. A peer of an older build sends none: its entries are refused (the review
    // of issue 33: they were taken, and the first one applied stopped the node).
    let addr = c.join_with(5, |n| n.bucket_ms = None).await;
    let e = append(&addr, 0, None).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("bucket width"), "{e:?}");
    // It takes no entries before the Hello of a leader adding it (storage/admission.rs).
    let e = append(&addr, 1, Some(2)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    hello(&addr, 2, 1).await.unwrap();
    // Entries that do not follow their predecessor one by one (an assertion, a panic, in
    // openraft's core) are refused before openraft sees them.
    let e = append(&addr, 1, Some(2)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let add = pb::AddNodeRequest {
        node_id: 5,
        addr,
        learner: false,
    };
    admin.add_node(add).await.unwrap();
    assert_eq!(c.node(5).store.width_ms(), 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.converged().await;
    assert!(c.local_timer(5, "w19").is_some());
    c.shutdown().await;
}

/// A width given with `--bucket-ms` is the node's own: a second Hello with another does not
/// replace it (the review of issue 33's change: only a width an earlier Hello gave may be).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_nodes_own_bucket_width_is_never_replaced_by_a_hello() {
    let mut c = TestCluster::start_with(3, |n| n.bucket_ms = Some(2)).await;
    let addr = c.join_with(4, |n| n.bucket_ms = Some(2)).await;
    hello(&addr, 2, 1).await.unwrap();
    let e = hello(&addr, 7, 2).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(c.node(4).store.width_ms(), 2);
    c.shutdown().await;
}

/// A Hello to `addr` as a leader of `term` of a cluster of bucket width `width` sends it.
async fn hello(addr: &str, width: u64, term: u64) -> Result<(), tonic::Status> {
    use timerdb::api::pb::raft_client::RaftClient;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut msg = tonic::Request::new(pb::RaftMessage { data: vec![] });
    msg.metadata_mut()
        .insert("x-timerdb-bucket-ms", width.into());
    msg.metadata_mut().insert("x-timerdb-term", term.into());
    RaftClient::new(ch).hello(msg).await.map(|_| ())
}

/// An AppendEntries of one committed blank entry at `index` after none, with the bucket
/// width header if `width` (a leader of a build before that header sends none).
async fn append(addr: &str, index: u64, width: Option<u64>) -> Result<(), tonic::Status> {
    use openraft::EntryPayload;
    use timerdb::api::pb::raft_client::RaftClient;
    use timerdb::raft_types::{log_id, Entry, Vote};
    let log_id = log_id(1, 9, index);
    let append = openraft::raft::AppendEntriesRequest::<timerdb::raft_types::TypeConfig> {
        vote: Vote::new_committed(1, 9),
        prev_log_id: None,
        entries: vec![Entry {
            log_id,
            payload: EntryPayload::Blank,
        }],
        leader_commit: Some(log_id),
    };
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut msg = tonic::Request::new(pb::RaftMessage {
        data: timerdb::storage::encode(&append),
    });
    if let Some(w) = width {
        msg.metadata_mut().insert("x-timerdb-bucket-ms", w.into());
    }
    RaftClient::new(ch).append_entries(msg).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leadership_transfers_to_the_named_voter_and_writes_go_on() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let target = c.follower().await;
    let via = c.running().into_iter().find(|id| *id != leader).unwrap();
    let mut admin = c.cluster(via).await;

    let e = admin
        .transfer_leader(pb::TransferLeaderRequest {
            node_id: 99,
            group: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    let started = std::time::Instant::now();
    let r = admin
        .transfer_leader(pb::TransferLeaderRequest {
            node_id: target,
            group: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let took = started.elapsed();
    assert_eq!(r.leader_id, target);
    assert_eq!(c.leader().await, target);
    eprintln!("leadership {leader} -> {target} in {took:?}");

    // Writes through the old leader reach the new one.
    let mut client = c.client(leader).await;
    client
        .schedule(schedule_req("after-transfer", now_ms() + 200))
        .await
        .unwrap();
    wait_fired(&mut client, 1, Duration::from_secs(10)).await;
    c.shutdown().await;
}

/// A rolling upgrade: node 3 acts as a build before the TransferLeader and PreVote RPCs (it
/// answers them UNIMPLEMENTED and does not advertise them). A hand-over to it goes by
/// TimeoutNow, as under those builds, and names it (openraft's transfer would have let another
/// voter win);
/// and with one node down, the other two (one of each build) still elect: an UNIMPLEMENTED
/// pre-vote counts as a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leadership_moves_with_a_voter_of_a_build_before_transfer_leader() {
    let mut c = TestCluster::start_with(3, |cfg| cfg.older_peer_rpcs = cfg.id == 3).await;
    let mut leader = c.leader().await;
    if leader == 3 {
        let mut admin = c.cluster(3).await;
        admin
            .transfer_leader(pb::TransferLeaderRequest {
                node_id: 1,
                group: 0,
            })
            .await
            .unwrap();
        leader = 1;
    }
    let started = std::time::Instant::now();
    let r = (c.cluster(leader).await)
        .transfer_leader(pb::TransferLeaderRequest {
            node_id: 3,
            group: 0,
        })
        .await
        .unwrap()
        .into_inner();
    eprintln!(
        "leadership {leader} -> 3 (TimeoutNow) in {:?}",
        started.elapsed()
    );
    assert_eq!(r.leader_id, 3);
    assert_eq!(c.leader().await, 3);

    // 3 hands over to 2 (a current build: TransferLeader), then 2 goes away.
    let r = (c.cluster(3).await)
        .transfer_leader(pb::TransferLeaderRequest {
            node_id: 2,
            group: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.leader_id, 2);
    c.stop(2).await;
    let elected = c.leader().await;
    assert!(elected == 1 || elected == 3, "{elected}");
    let mut client = c.client(1).await;
    client
        .schedule(schedule_req("after-upgrade-election", now_ms() + 60_000))
        .await
        .expect("a write after 1 and 3 elected a leader");
    c.shutdown().await;
}

async fn connect(c: &TestCluster, id: u64) -> tonic::transport::Channel {
    let addr = format!("http://{}", c.peers[&id]);
    let endpoint = tonic::transport::Endpoint::from_shared(addr).unwrap();
    endpoint.connect().await.unwrap()
}

async fn health(c: &TestCluster, id: u64) -> ServingStatus {
    let channel = connect(c, id).await;
    let req = HealthCheckRequest {
        service: "timerdb.v1.Timers".into(),
    };
    let r = HealthClient::new(channel).check(req).await.unwrap();
    r.into_inner().status()
}

async fn wait_health(c: &TestCluster, id: u64, want: ServingStatus) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = health(c, id).await;
        if now == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node {id} health stayed {now:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_flips_when_cut_off_from_the_leader_and_reflection_lists_services() {
    let mut c = TestCluster::start(3).await;
    for id in 1..=3 {
        wait_health(&c, id, ServingStatus::Serving).await;
    }
    // Reflection: a generic tool can discover the services.
    let services = reflection_services(&c, 1).await;
    for want in [
        "timerdb.v1.Timers",
        "timerdb.v1.Cluster",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.iter().any(|s| s == want),
            "{want} not in {services:?}"
        );
    }

    // Cut node `lone` off: the other two stop. It has no leader: NOT_SERVING.
    let lone = c.follower().await;
    for id in c.running().into_iter().filter(|id| *id != lone) {
        c.stop(id).await;
    }
    wait_health(&c, lone, ServingStatus::NotServing).await;
    // A peer comes back: a leader again, and SERVING once it has applied what was committed.
    let back = if lone == 1 { 2 } else { 1 };
    c.restart(back).await;
    wait_health(&c, lone, ServingStatus::Serving).await;
    c.shutdown().await;
}

async fn reflection_services(c: &TestCluster, id: u64) -> Vec<String> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let channel = connect(c, id).await;
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = ServerReflectionClient::new(channel)
        .server_reflection_info(futures::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let reply = stream.message().await.unwrap().unwrap();
    match reply.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection reply {other:?}"),
    }
}

/// A leader cut off from both followers keeps believing it leads (openraft 0.9 has no
/// CheckQuorum), but refuses writes and reads within about a second instead of letting each
/// wait out the write timeout (10 s); a write already waiting is failed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_isolated_leader_answers_unavailable_within_about_a_second() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let mut client = c.client(leader).await;
    client
        .schedule(schedule_req("before", now_ms() + 60_000))
        .await
        .unwrap();
    for id in c.running().into_iter().filter(|id| *id != leader) {
        c.stop(id).await;
    }
    let started = std::time::Instant::now();
    let e = client
        .schedule(schedule_req("cut-off", now_ms() + 60_000))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("no quorum"), "{}", e.message());
    assert!(
        took < Duration::from_millis(2_000),
        "answered after {took:?}"
    );
    // Now that it knows, it refuses at once, reads too.
    let started = std::time::Instant::now();
    let e = get(&mut client, "before").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    eprintln!("isolated leader: the first write failed after {took:?}");
    c.shutdown().await;
}

/// A node with no quorum in reach does not campaign (its pre-votes find nobody to grant them),
/// so its term stays put while it waits, and once the others are back a leader stands. Without
/// Pre-Vote the lone node raises its term every election timeout and deposes the leader the
/// others restore (seen failing with `enable_pre_vote: Some(false)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_without_a_quorum_in_reach_does_not_campaign() {
    let mut c = TestCluster::start(3).await;
    for id in 1..=3 {
        c.stop(id).await;
    }
    c.restart(1).await;
    let term = |c: &TestCluster| c.node(1).raft.metrics().borrow_watched().current_term;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = term(&c);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(term(&c), before, "the lone node campaigned");
    c.restart(2).await;
    c.restart(3).await;
    c.leader().await;
    let mut client = c.client(1).await;
    client
        .schedule(schedule_req("after", now_ms() + 60_000))
        .await
        .expect("a write after the others came back");
    c.shutdown().await;
}

/// Review 34b: openraft 0.10's chunked receiver writes a chunk whatever its vote, so one from
/// a deposed leader would restart the live leader's transfer (and leave a partial file). It is
/// answered with the newer vote, unread, and no file is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_chunk_from_a_deposed_leader_is_answered_with_the_newer_vote() {
    use openraft::async_runtime::WatchReceiver as _;
    use openraft_legacy::network_v1::{
        InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, SnapshotMeta,
    };
    use timerdb::api::pb::raft_client::RaftClient;
    use timerdb::raft_types::{TypeConfig, Vote};
    let c = TestCluster::start(3).await;
    let follower = c.follower().await;
    let theirs = c.node(follower).raft.metrics().borrow_watched().vote;
    let stale = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(0, 9),
        meta: SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "stale".into(),
        },
        offset: 0,
        data: vec![7; 1000],
        done: false,
    };
    let ch = c.channel(follower).await;
    let mut msg = tonic::Request::new(pb::RaftMessage {
        data: timerdb::storage::encode(&stale),
    });
    msg.metadata_mut().insert("x-timerdb-bucket-ms", 1.into());
    let reply = RaftClient::new(ch).install_snapshot(msg).await.unwrap();
    type Answer = Result<
        InstallSnapshotResponse<TypeConfig>,
        openraft::error::RaftError<TypeConfig, InstallSnapshotError>,
    >;
    let answer: Answer = timerdb::storage::decode(&reply.into_inner().data).unwrap();
    assert_eq!(
        answer.unwrap().vote,
        theirs,
        "not answered with the newer vote"
    );
    let dir = c.config(follower).data_dir.join("snapshot");
    let partial: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect();
    assert!(partial.is_empty(), "a stale chunk left {partial:?}");
    c.shutdown().await;
}

/// A planned stop writes the memtables out, so the restart replays nothing from the WAL (the
/// replay of a full WAL took most of a 1.4-3.0 s restart after a large load). Without the
/// flush the reopened database holds the batches in its memtables again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_node_leaves_nothing_to_replay() {
    use timerdb::storage::quiet::{memtable_bytes, MIN_BYTES};
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let follower = c.follower().await;
    let mut client = c.client(leader).await;
    let base = now_ms() + 3_600_000;
    // Enough that the stop flushes (a node with less than MIN_BYTES in its memtables does not).
    for b in 0..4 {
        let timers = (0..10_000)
            .map(|i| {
                let mut r = schedule_req(&format!("s{b}-{i}"), base + i);
                r.payload = vec![b as u8; 300];
                r
            })
            .collect();
        client
            .schedule_batch(pb::ScheduleBatchRequest { timers })
            .await
            .unwrap();
    }
    c.converged().await;
    let held = memtable_bytes(c.node(follower).store.db());
    assert!(held >= MIN_BYTES, "only {held} bytes in the memtables");
    c.stop(follower).await;
    let db = timerdb::storage::open_db(
        &c.config(follower).data_dir,
        &timerdb::storage::IndexGc::new(),
    )
    .unwrap();
    for family in ["wheel", "index", "raft_log", "raft"] {
        let cf = db.cf_handle(family).unwrap();
        let property = "rocksdb.num-entries-active-mem-table";
        let entries = db.property_int_value_cf(cf, property).unwrap();
        assert_eq!(entries, Some(0), "{family}: {property}");
    }
    drop(db);
    c.restart(follower).await;
    c.converged().await;
    assert!(c.local_timer(follower, "s3-9999").is_some());
    c.shutdown().await;
}
