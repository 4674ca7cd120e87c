//! Tests that need a wired node: a one-node cluster on a loopback port, started as `timerd`
//! starts one. They test the cluster's workers and peer client against a real Raft, which only
//! the server wires; they live here so that the layers below never reach up to it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use openraft::error::StreamingError;
use openraft::network::RPCOption;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::{start, RunningNode};
use crate::cluster::network::{PeerClient, SNAPSHOT_TRIES};
use crate::cluster::workers::while_leader;
use crate::config::NodeConfig;
use openraft::network::v2::RaftNetworkV2 as _;

/// A one-node cluster on a loopback port with its data in `dir`, for unit tests.
async fn single_node(dir: &std::path::Path) -> RunningNode {
    single_node_with(dir, |_| {}).await.unwrap()
}

/// [`single_node`], its configuration adjusted by `tune` first.
async fn single_node_with(
    dir: &std::path::Path,
    tune: impl FnOnce(&mut NodeConfig),
) -> crate::Result<RunningNode> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let peers = [(1, addr)].into_iter().collect();
    let mut config = NodeConfig::new(1, dir.to_path_buf(), peers);
    tune(&mut config);
    start(config, listener).await
}

/// Review of step 4b (HIGH 1): a node restarted without `--bucket-ms` keeps the width its data
/// dir records. (The default was taken before the record was read, and written over it: a
/// restored backup of 5 ms buckets ran at 1 ms, its timers up to five times early.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_a_width_keeps_the_recorded_one() {
    let dir = tempfile::TempDir::new().unwrap();
    let node = single_node_with(dir.path(), |c| c.bucket_ms = Some(5))
        .await
        .unwrap();
    assert_eq!(node.store.width_ms(), 5);
    node.shutdown().await;
    let node = single_node(dir.path()).await;
    assert_eq!(
        node.store.width_ms(),
        5,
        "the recorded width, not the default"
    );
    node.shutdown().await;
    let node = single_node_with(dir.path(), |c| c.bucket_ms = Some(5))
        .await
        .unwrap();
    node.shutdown().await;
    let refused = single_node_with(dir.path(), |c| c.bucket_ms = Some(1)).await;
    let refused = refused.err().expect("another width is refused");
    assert!(
        refused.to_string().contains("bucket width 5 ms"),
        "{refused}"
    );
}

/// Regression (found by the chaos harness's disk-full fault): when Raft stopped on a fatal
/// error, the leader workers restarted `lead()` in a hot loop. They must stop instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_stop_when_raft_stops() {
    let dir = tempfile::TempDir::new().unwrap();
    let node = single_node(dir.path()).await;
    let raft = node.raft.clone();
    let (_stop, shutdown) = watch::channel(false);
    let leads = Arc::new(AtomicU32::new(0));
    let counter = leads.clone();
    let worker = tokio::spawn(async move {
        while_leader(1, &raft, "test worker", shutdown, || {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>()
        })
        .await
    });
    while leads.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.raft.shutdown().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), worker)
        .await
        .expect("the worker kept running after Raft stopped")
        .unwrap();
    assert_eq!(leads.load(Ordering::SeqCst), 1, "lead() was restarted");
    node.shutdown().await;
}

/// A one-node cluster and a snapshot of it (a backup), once it can make one.
async fn with_a_snapshot(dir: &std::path::Path) -> (RunningNode, crate::storage::Snapshot) {
    let node = single_node(dir).await;
    loop {
        match node.node.backup().await {
            Ok(s) => return (node, s),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A peer client's levels, with peer 2 heard advertising `md`.
fn heard_as(
    node: &RunningNode,
    md: &tonic::metadata::MetadataMap,
) -> (Arc<crate::cluster::Levels>, Arc<NodeConfig>) {
    let heard = Arc::new(crate::cluster::Levels::default());
    heard.heard(2, md);
    (heard, node.node.config().clone())
}

/// Review 34b: openraft-legacy's sender tried a failed chunk again after 1 ms without end
/// (a leader read and encoded 4 MiB chunks in a loop while a follower was down). This one
/// pauses between tries and gives up after a few.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_for_an_unreachable_peer_is_given_up_after_a_few_paced_tries() {
    let dir = tempfile::TempDir::new().unwrap();
    let (node, snapshot) = with_a_snapshot(dir.path()).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    // A peer of this build (one of an older build is not sent the snapshot at all: below).
    let mut md = tonic::metadata::MetadataMap::new();
    crate::cluster::level::advertise_node(&mut md, node.node.config());
    let levels = heard_as(&node, &md);
    let mut client = PeerClient::new(2, &dead_addr, node.store.clone(), levels);
    let vote = node.raft.metrics().borrow_watched().vote;
    let started = tokio::time::Instant::now();
    let option = RPCOption::new(Duration::from_millis(100));
    let sent = client.full_snapshot(vote, snapshot, std::future::pending(), option);
    let outcome = tokio::time::timeout(Duration::from_secs(20), sent)
        .await
        .expect("the transfer never gave up");
    assert!(
        matches!(outcome, Err(StreamingError::Unreachable(_))),
        "{outcome:?}"
    );
    let took = started.elapsed();
    let paced = Duration::from_millis(500) * (SNAPSHOT_TRIES - 1);
    assert!(
        took >= paced,
        "{SNAPSHOT_TRIES} tries in {took:?}: not paced"
    );
    node.shutdown().await;
}

/// Review of step 3 of issue 36 (MED 4): a member whose build cannot read this build's
/// snapshot format (it advertised peer RPCs below `SNAPSHOT_FORMAT_RPCS`, or nothing) is never
/// sent one: it would refuse the file and fail its install. It stays behind until upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_not_sent_to_a_build_that_cannot_read_its_format() {
    let dir = tempfile::TempDir::new().unwrap();
    let (node, snapshot) = with_a_snapshot(dir.path()).await;
    let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = peer.local_addr().unwrap().to_string();
    let mut md = tonic::metadata::MetadataMap::new();
    md.insert(crate::cluster::level::PEER_RPCS_HEADER, 1.into());
    let levels = heard_as(&node, &md);
    let mut client = PeerClient::new(2, &addr, node.store.clone(), levels);
    let vote = node.raft.metrics().borrow_watched().vote;
    let option = RPCOption::new(Duration::from_millis(100));
    let sent = client.full_snapshot(vote, snapshot, std::future::pending(), option);
    let outcome = tokio::time::timeout(Duration::from_secs(5), sent)
        .await
        .expect("refused at once");
    let Err(StreamingError::Unreachable(e)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        e.to_string()
            .contains("cannot read a snapshot of storage format"),
        "{e}"
    );
    peer.set_nonblocking(true).unwrap();
    assert!(peer.accept().is_err(), "nothing was sent to it");
    node.shutdown().await;
}

/// Step 4 of issue 36: a peer call names its group; one for a group this node hosts no
/// replica of is refused NOT_FOUND before its body is read (garbage or not), and one for a
/// group it hosts reaches that group's Raft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_call_for_a_group_this_node_does_not_host_is_refused_unread() {
    let dir = tempfile::TempDir::new().unwrap();
    let node = single_node(dir.path()).await;
    let addr = node.addr.to_string();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = timerdb_proto::pb::raft_client::RaftClient::new(channel.clone());
    let mut groups = timerdb_proto::pb::groups_client::GroupsClient::new(channel);
    let call = |group: Option<&str>, data: Vec<u8>| {
        let mut request = tonic::Request::new(timerdb_proto::pb::RaftMessage { data });
        if let Some(g) = group {
            let g = tonic::metadata::MetadataValue::try_from(g).unwrap();
            request
                .metadata_mut()
                .insert(crate::cluster::network::GROUP_HEADER, g);
        }
        request
    };
    let garbage = vec![0xff; 64];
    // Group 0's calls come to `Raft` (naming no group, or 0); a data group's to `Groups`.
    for (group, code) in [
        (Some("5"), tonic::Code::InvalidArgument),
        (Some("x"), tonic::Code::InvalidArgument),
        // Group 0 (named or not) is hosted: its garbage is read, and refused as garbage.
        (Some("0"), tonic::Code::InvalidArgument),
        (None, tonic::Code::InvalidArgument),
    ] {
        let refused = raw.vote(call(group, garbage.clone())).await.unwrap_err();
        assert_eq!(refused.code(), code, "Raft {group:?}: {refused:?}");
    }
    let refused = raw
        .vote(call(Some("5"), garbage.clone()))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains("go to timerdb.v1.Groups"),
        "{refused:?}"
    );
    for (group, code) in [
        (Some("5"), tonic::Code::NotFound),
        (Some("0"), tonic::Code::InvalidArgument),
        (None, tonic::Code::InvalidArgument),
    ] {
        let refused = groups.vote(call(group, garbage.clone())).await.unwrap_err();
        assert_eq!(refused.code(), code, "Groups {group:?}: {refused:?}");
    }
    let refused = groups
        .vote(call(Some("5"), garbage.clone()))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains("no replica of group 5"),
        "{refused:?}"
    );
    // A peer of a cluster with another number of data groups is refused, whichever group.
    let mut other_cluster = call(None, garbage);
    let groups = tonic::metadata::MetadataValue::from(8u16);
    let header = crate::cluster::level::GROUPS_HEADER;
    other_cluster.metadata_mut().insert(header, groups);
    let refused = raw.vote(other_cluster).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("has 8"), "{refused:?}");

    // Through the peer client: a group's store names its group in every call.
    let levels = heard_as(&node, &tonic::metadata::MetadataMap::new());
    let vote = node.raft.metrics().borrow_watched().vote;
    let rpc = openraft::raft::VoteRequest::new(vote, None);
    let option = RPCOption::new(Duration::from_millis(1000));
    let mut other = PeerClient::new(2, &addr, node.store.group(5), levels.clone());
    let e = other.vote(rpc.clone(), option.clone()).await.unwrap_err();
    assert!(e.to_string().contains("no replica of group 5"), "{e}");
    let mut own = PeerClient::new(2, &addr, node.store.clone(), levels);
    own.vote(rpc, option).await.expect("group 0's Raft answers");
    node.shutdown().await;
}

/// Review of step 4b (HIGH 2): a build before groups ignores the group header, so a data
/// group's call sent to its `Raft` service would reach its group 0. Data groups' calls go to
/// `Groups`, which such a build does not have: it answers UNIMPLEMENTED, which is no vote, no
/// pre-vote grant (as it is for group 0, where it means a build before PreVote) and no append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_group_call_to_a_build_before_groups_reaches_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    let node = single_node(dir.path()).await;
    // A stand-in for the older build: this node's group 0 behind the `Raft` service alone.
    let hosted = Arc::new(crate::api::services::peer::PeerGroups::default());
    hosted.add(node.raft.clone(), node.store.clone());
    let levels = Arc::new(crate::cluster::Levels::default());
    let config = node.node.config().clone();
    let rest = Arc::new(crate::cluster::rest::Rest::new(1, Duration::ZERO, []));
    let (nodes, _) = crate::node::Nodes::new(vec![node.node.clone()]);
    let old = crate::api::services::peer::PeerService::new(hosted, config, levels, rest, nodes);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let old_addr = listener.local_addr().unwrap().to_string();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tonic::transport::Server::builder()
        .add_service(timerdb_proto::pb::raft_server::RaftServer::new(old))
        .serve_with_incoming(incoming);
    let server = tokio::spawn(server);

    let heard = heard_as(&node, &tonic::metadata::MetadataMap::new());
    let vote = node.raft.metrics().borrow_watched().vote;
    let rpc = openraft::raft::VoteRequest::new(vote, None);
    let option = RPCOption::new(Duration::from_millis(1000));
    let mut data = PeerClient::new(2, &old_addr, node.store.group(1), heard.clone());
    let pre = data.pre_vote(rpc.clone(), option.clone()).await;
    assert!(
        pre.is_err(),
        "UNIMPLEMENTED is no grant for a data group: {pre:?}"
    );
    let e = data.vote(rpc.clone(), option.clone()).await.unwrap_err();
    assert!(e.to_string().contains("Unimplemented"), "{e}");
    // Group 0's calls still reach it.
    let mut zero = PeerClient::new(2, &old_addr, node.store.clone(), heard);
    zero.vote(rpc, option)
        .await
        .expect("group 0's Raft answers");
    server.abort();
    node.shutdown().await;
}

/// A `Ping` (`cluster/rest.rs`) is bytes from the network like any peer call: garbage, or a
/// ping naming more groups than the cluster has, is refused INVALID_ARGUMENT and holds
/// nothing; a well-formed one is answered with the groups held (none here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_a_node_cannot_take_is_refused_and_holds_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    let node = single_node(dir.path()).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut groups = timerdb_proto::pb::groups_client::GroupsClient::new(channel);
    let call = |data: Vec<u8>| tonic::Request::new(timerdb_proto::pb::RaftMessage { data });
    let refused = groups.ping(call(vec![0xff; 64])).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    let too_many = crate::cluster::rest::Ping {
        from: 2,
        resting: vec![(1, 5)],
    };
    let refused = groups
        .ping(call(crate::storage::encode(&too_many)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("names 1 groups"), "{refused:?}");
    let empty = crate::cluster::rest::Ping {
        from: 2,
        resting: vec![],
    };
    let answer = groups.ping(call(crate::storage::encode(&empty))).await;
    let pong: crate::cluster::rest::Pong =
        crate::storage::decode(&answer.unwrap().into_inner().data).unwrap();
    assert!(pong.held.is_empty(), "{pong:?}");
    node.shutdown().await;
}

/// Review of 4f (HIGH 1): every group's quorum watch outlives the start. Group 0 never rests
/// and its resting sender was dropped when the node started, which ended its watch: writes in
/// flight on a leader cut off then waited out their timeout instead of failing within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_group_watches_its_quorum_after_the_node_started() {
    let dir = tempfile::TempDir::new().unwrap();
    let node = single_node_with(dir.path(), |c| c.groups = 2)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(node.node.quorum_watch_runs(), "group 0's watch stopped");
    for (g, replica) in node.groups.iter().enumerate() {
        assert!(
            replica.node.quorum_watch_runs(),
            "group {}'s watch stopped",
            g + 1
        );
    }
    node.shutdown().await;
}
