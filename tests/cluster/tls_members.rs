//! `--peer-require-member` on a real cluster: a certificate of the peer CA that names no
//! member's host is refused every peer RPC, and a node that knows no members yet (started with
//! `--join`, as a wiped node comes back) still lets the leader add it; only a member may mark a
//! call forwarded.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use timerdb::timer::{TimerKey, TimerSpec, When};
use timerdb::tls::Tls;
use tonic::Code;

use crate::harness::{now_ms, TestCluster, NS};
use crate::tls::{peer_attack, settled_leader_and_term, tls_channel, Pki};

/// Each peer RPC from `stranger` to `addr` is refused as not naming a member.
async fn refused_as_stranger(pki: &Pki, stranger: &crate::certs::Pair, addr: &str, term: u64) {
    let ca = pki.cluster.pem();
    let ch = tls_channel(addr, &ca, Some(stranger)).await.unwrap();
    for (rpc, r) in peer_attack(ch, term).await {
        let e = r.expect_err(rpc);
        assert_eq!(e.code(), Code::Unauthenticated, "{rpc} to {addr}: {e:?}");
        assert!(e.message().contains("no member's host"), "{rpc}: {e:?}");
    }
}

/// Three nodes with peer mTLS and `--peer-require-member`, and their PKI.
async fn members_only() -> (Arc<Pki>, TestCluster) {
    let pki = Arc::new(Pki::new());
    let p = pki.clone();
    let c = TestCluster::start_with(3, move |cfg| {
        let mut files = p.files(true);
        files.peer_require_member = true;
        cfg.tls = Tls::new(files);
    })
    .await;
    (pki, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_require_member_a_stranger_is_refused_and_a_joining_node_is_added() {
    let (pki, mut c) = members_only().await;
    let (leader, term) = settled_leader_and_term(&c).await;
    // Signed by the peer CA, but for a host that is no member's (every member is 127.0.0.1).
    let stranger = pki.cluster.named("stranger.example", &[]);
    refused_as_stranger(&pki, &stranger, &c.peers[&leader].clone(), term).await;

    // State for the joiner to catch up on.
    let leader_node = c.node(leader).node.clone();
    let spec = TimerSpec {
        key: TimerKey::new(NS, "before-join"),
        when: When::At(now_ms() + 600_000),
        payload: b"x".to_vec(),
        content_type: String::new(),
    };
    leader_node
        .schedule(spec, Default::default())
        .await
        .unwrap();

    // Node 4 starts with --join: it knows no members, so no certificate names one. The
    // leader's Hello and entries must get through all the same.
    let addr = c.join(4).await;
    let added = tokio::time::timeout(
        Duration::from_secs(30),
        leader_node.add_node(4, addr.clone(), true),
    )
    .await
    .expect("AddNode of a joining node under --peer-require-member did not finish in 30 s")
    .expect("AddNode of a joining node under --peer-require-member");
    assert!(added.iter().any(|m| m.0 == 4 && m.2), "{added:?}");
    c.converged().await;
    assert!(c.local_timer(4, "before-join").is_some());

    // Now it knows its members: the stranger is refused by it too.
    let term = c.node(4).raft.metrics().borrow_watched().current_term;
    refused_as_stranger(&pki, &stranger, &addr, term).await;
    c.shutdown().await;
}

/// Review of issue 33: a client could mark its own call forwarded (`x-timerdb-forwarded`),
/// and a stream marked so skips the ack filter at the client's edge. Under peer TLS only a
/// member may: a client's certificate with the header is refused, without it served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_a_member_may_mark_a_call_forwarded() {
    use timerdb::api::pb::{self, timers_client::TimersClient};
    let pki = Arc::new(Pki::new());
    let p = pki.clone();
    let c = TestCluster::start_with(3, move |cfg| cfg.tls = Tls::new(p.files(true))).await;
    let (leader, _) = settled_leader_and_term(&c).await;
    let ca = pki.cluster.pem();
    let subscribe = |forwarded: bool| {
        let mut r = tonic::Request::new(pb::SubscribeRequest {
            namespace: "claimed".into(),
            ..Default::default()
        });
        if forwarded {
            r.metadata_mut()
                .insert("x-timerdb-forwarded", "1".parse().unwrap());
        }
        r
    };
    let ch = tls_channel(&c.peers[&leader], &ca, Some(&pki.client))
        .await
        .unwrap();
    let e = TimersClient::new(ch.clone())
        .subscribe(subscribe(true))
        .await
        .expect_err("a client's call marked forwarded");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("no member"), "{e:?}");
    TimersClient::new(ch)
        .subscribe(subscribe(false))
        .await
        .expect("the same client's own call");
    c.shutdown().await;
}

/// Review of issue 33 (F2): a node waiting to be added knows no members, so any certificate of
/// the peer CA reaches it — a node of another cluster that still has its address among its
/// members, a removed leader still running. Their calls came first and decided: a width of
/// theirs, a vote far ahead, and the real leader could not add the node (or lost its
/// leadership to the vote). Now such a node takes Raft calls only after the Hello of the
/// leader adding it, and none of an older term than that Hello's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_that_reach_a_joining_node_before_its_leader_do_not_keep_it_out() {
    use timerdb::api::pb::{self, raft_client::RaftClient};
    let (pki, mut c) = members_only().await;
    let (leader, term) = settled_leader_and_term(&c).await;
    let stranger = pki.cluster.named("stranger.example", &[]);
    let addr = c.join(4).await;
    let ca = pki.cluster.pem();
    let mut raft = RaftClient::new(tls_channel(&addr, &ca, Some(&stranger)).await.unwrap());
    let with_width = |data: Vec<u8>| {
        let mut r = tonic::Request::new(pb::RaftMessage { data });
        r.metadata_mut()
            .insert("x-timerdb-bucket-ms", "7".parse().unwrap());
        r
    };
    let ahead = term + 1_000;
    let vote = openraft::raft::VoteRequest::<timerdb::raft_types::TypeConfig>::new(
        openraft::Vote::new(ahead, 9),
        None,
    );
    let append = openraft::raft::AppendEntriesRequest::<timerdb::raft_types::TypeConfig> {
        vote: openraft::Vote::new_committed(ahead, 9),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let enc =
        timerdb::storage::encode::<openraft::raft::VoteRequest<timerdb::raft_types::TypeConfig>>;
    let e = raft.vote(with_width(enc(&vote))).await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::Unavailable,
        "a Vote before any Hello: {e:?}"
    );
    let bytes = timerdb::storage::encode(&append);
    let e = raft.append_entries(with_width(bytes)).await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::Unavailable,
        "entries before any Hello: {e:?}"
    );

    // Another cluster's leader says Hello (its width, 7), and its predecessor, removed but
    // still running, calls at the term before: refused as older than the Hello.
    let mut hello = with_width(vec![]);
    hello
        .metadata_mut()
        .insert("x-timerdb-term", term.to_string().parse().unwrap());
    raft.hello(hello).await.unwrap();
    let zombie = openraft::raft::AppendEntriesRequest::<timerdb::raft_types::TypeConfig> {
        vote: openraft::Vote::new_committed(term - 1, 8),
        ..append
    };
    let bytes = timerdb::storage::encode(&zombie);
    let e = raft.append_entries(with_width(bytes)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("older than the term"), "{e:?}");
    // A removed voter that missed its removal campaigns on, its term soon above the Hello's:
    // a node waiting for its first entries votes for nobody (it is a learner to be), or the
    // vote it persisted would depose the leader adding it (review 33c, LOW 8).
    let campaign = timerdb::storage::encode(&vote);
    let e = raft.vote(with_width(campaign)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("votes for nobody"), "{e:?}");

    // The real leader's Hello comes last and wins.
    let leader_node = c.node(leader).node.clone();
    let added = tokio::time::timeout(
        Duration::from_secs(30),
        leader_node.add_node(4, addr.clone(), true),
    )
    .await
    .expect("AddNode did not finish in 30 s")
    .expect("AddNode after a stranger's calls");
    assert!(added.iter().any(|m| m.0 == 4 && m.2), "{added:?}");
    c.converged().await;
    assert_eq!(
        settled_leader_and_term(&c).await,
        (leader, term),
        "the stranger's calls moved the cluster's leader or term"
    );
    assert_eq!(c.node(4).store.width_ms(), c.node(leader).store.width_ms());
    c.shutdown().await;
}
