//! Transport security on real clusters (docs/security.md): TLS on the client port, mTLS and
//! certificate users, the peer service closed to anyone without the cluster's peer
//! certificate (a huge-term Vote and a TimeoutNow included), the peers on their own port, and
//! certificates rotated under load.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use timerdb::api::pb::{
    self, access_client::AccessClient, raft_client::RaftClient, timers_client::TimersClient,
};
use timerdb::config::NodeConfig;
use timerdb::node::Leader;
use timerdb::server::{self, RunningNode};
use timerdb::tls::{Tls, TlsFiles};
use tokio::net::TcpListener;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

use crate::certs::{Pair, TestCa};
use crate::harness::{self, error_chain, now_ms, schedule_req, status_text, tried, TestCluster};

/// A cluster CA, the peer certificate of every node (for localhost and 127.0.0.1), a client
/// CA with one client certificate, and their files.
pub(crate) struct Pki {
    dir: TempDir,
    pub(crate) cluster: TestCa,
    clients: TestCa,
    node: Pair,
    pub(crate) client: Pair,
}

impl Pki {
    pub(crate) fn new() -> Pki {
        let cluster = TestCa::new("timerdb test cluster CA");
        let clients = TestCa::new("timerdb test client CA");
        let node = cluster.named("localhost", &["127.0.0.1"]);
        let client = clients.named("billing-service", &[]);
        let pki = Pki {
            dir: TempDir::new().unwrap(),
            cluster,
            clients,
            node,
            client,
        };
        pki.cluster.write(pki.dir.path(), "cluster-ca.crt");
        pki.clients.write(pki.dir.path(), "client-ca.crt");
        pki.node.write(pki.dir.path(), "node");
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Peer TLS on the shared port; with `mtls`, also a client port certificate and clients
    /// required to present one from the client CA.
    pub(crate) fn files(&self, mtls: bool) -> TlsFiles {
        TlsFiles {
            peer_ca: Some(self.path("cluster-ca.crt")),
            peer_cert: Some(self.path("node.crt")),
            peer_key: Some(self.path("node.key")),
            cert: mtls.then(|| self.path("node.crt")),
            key: mtls.then(|| self.path("node.key")),
            client_ca: mtls.then(|| self.path("client-ca.crt")),
            ..Default::default()
        }
    }
}

/// A client channel to `addr` over TLS trusting `ca`, presenting `identity` if given.
pub(crate) async fn tls_channel(
    addr: &str,
    ca: &str,
    identity: Option<&Pair>,
) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(p) = identity {
        tls = tls.identity(Identity::from_pem(&p.cert_pem, &p.key_pem));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| error_chain(&e))
}

/// Whether a call over `ch` gets any gRPC answer (a refused handshake gets none).
async fn answers(ch: Channel) -> Result<(), tonic::Status> {
    let mut t = TimersClient::new(ch);
    let get = pb::GetRequest {
        namespace: "x".into(),
        id: "y".into(),
        ..Default::default()
    };
    match t.get(get).await {
        Err(s) if s.code() == Code::NotFound => Ok(()),
        Err(s) => Err(s),
        Ok(_) => Ok(()),
    }
}

async fn plain_channel(addr: &str) -> Result<Channel, String> {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| error_chain(&e))
}

#[tokio::test]
async fn a_tls_cluster_serves_only_clients_that_speak_tls_and_trust_its_ca() {
    let pki = Arc::new(Pki::new());
    let p = pki.clone();
    let c = TestCluster::start_with(3, move |cfg| cfg.tls = Tls::new(p.files(false))).await;
    let follower = c.follower().await;
    let addr = c.peers[&follower].clone();
    let ca = pki.cluster.pem();

    // Plain text: no gRPC answer at all.
    let got = match plain_channel(&addr).await {
        Err(e) => e,
        Ok(ch) => status_text(&answers(ch).await.expect_err("plain text was served")),
    };
    tried("plain text to a TLS node", &got);
    // TLS trusting another CA: the handshake fails.
    let other = TestCa::new("somebody else").pem();
    let got = match tls_channel(&addr, &other, None).await {
        Err(e) => e,
        Ok(ch) => status_text(
            &answers(ch)
                .await
                .expect_err("an unknown server was trusted"),
        ),
    };
    tried(
        "a client trusting another CA (a spoofed server's view)",
        &got,
    );
    // TLS trusting the cluster CA: served, and a write through a follower is forwarded to
    // the leader over the peers' TLS.
    let ch = tls_channel(&addr, &ca, None).await.unwrap();
    let mut t = TimersClient::new(ch);
    let r = t
        .schedule(schedule_req("over-tls", now_ms() + 60_000))
        .await
        .unwrap();
    assert!(r.into_inner().created);
    c.converged().await;
    c.shutdown().await;
}

#[tokio::test]
async fn with_mtls_a_client_needs_a_certificate_and_its_name_can_be_a_key() {
    let pki = Arc::new(Pki::new());
    let p = pki.clone();
    let c = TestCluster::start_with(3, move |cfg| cfg.tls = Tls::new(p.files(true))).await;
    let follower = c.follower().await;
    let addr = c.peers[&follower].clone();
    let ca = pki.cluster.pem();

    // No client certificate: refused at the handshake.
    let got = match tls_channel(&addr, &ca, None).await {
        Err(e) => e,
        Ok(ch) => status_text(&answers(ch).await.expect_err("served without a client cert")),
    };
    tried("no client certificate, mTLS required", &got);
    // A certificate from a CA the cluster does not know: refused too.
    let stranger = TestCa::new("stranger").named("billing-service", &[]);
    let got = match tls_channel(&addr, &ca, Some(&stranger)).await {
        Err(e) => e,
        Ok(ch) => status_text(&answers(ch).await.expect_err("served a stranger's cert")),
    };
    tried("a client certificate from an unknown CA", &got);
    // The client CA's certificate: served.
    let ch = tls_channel(&addr, &ca, Some(&pki.client)).await.unwrap();
    answers(ch.clone()).await.unwrap();

    // The certificate's name stands for a key: with auth on, the client needs no token.
    let mut access = AccessClient::new(ch.clone());
    let admin = access
        .create_key(pb::CreateKeyRequest {
            name: "ops".into(),
            roles: vec!["admin".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    access
        .create_key(pb::CreateKeyRequest {
            name: "billing".into(),
            roles: vec!["schedule:billing*".into(), "read:billing*".into()],
            cert_name: "billing-service".into(),
            no_secret: true,
        })
        .await
        .unwrap();
    let mut on = pb::SetAuthRequest { enabled: true }.into_request_with(&admin);
    on.set_timeout(Duration::from_secs(5));
    access.set_auth(on).await.unwrap();
    c.converged().await;
    for node in c.running() {
        let ch = tls_channel(&c.peers[&node], &ca, Some(&pki.client))
            .await
            .unwrap();
        let mut t = TimersClient::new(ch.clone());
        let mut req = schedule_req(&format!("cert-{node}"), now_ms() + 60_000);
        req.namespace = "billing-eu".into();
        // Through a follower, the leader learns the user from the follower (a peer).
        t.schedule(req).await.unwrap();
        let mut other = schedule_req("x", now_ms() + 60_000);
        other.namespace = "orders".into();
        let e = t.schedule(other).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("billing"), "{e:?}");
        let me = AccessClient::new(ch)
            .who_am_i(pb::WhoAmIRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(me.principal.contains("billing"), "{me:?}");
    }
    c.shutdown().await;
}

/// Adds `authorization: Bearer` to a request.
trait WithToken: Sized {
    fn into_request_with(self, token: &str) -> tonic::Request<Self>;
}

impl<T> WithToken for T {
    fn into_request_with(self, token: &str) -> tonic::Request<T> {
        let mut r = tonic::Request::new(self);
        let v = format!("Bearer {token}").parse().unwrap();
        r.metadata_mut().insert("authorization", v);
        r
    }
}

/// Every peer RPC, called over `ch` as an outsider would: a Vote with a huge term, a
/// TimeoutNow for the current term, an AppendEntries and an InstallSnapshot. Their codes.
pub(crate) async fn peer_attack(
    ch: Channel,
    term: u64,
) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    use openraft::Vote;
    let mut raft = RaftClient::new(ch.clone());
    let mut groups = timerdb::api::pb::groups_client::GroupsClient::new(ch);
    let msg = |data: Vec<u8>| pb::RaftMessage { data };
    let vote = openraft::raft::VoteRequest::<timerdb::raft_types::TypeConfig>::new(
        Vote::new(term + 1_000_000, 9),
        None,
    );
    let append = openraft::raft::AppendEntriesRequest::<timerdb::raft_types::TypeConfig> {
        vote: Vote::new_committed(term + 1_000_000, 9),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
        timerdb::storage::encode(v)
    }
    let ok = |r: Result<tonic::Response<pb::RaftMessage>, tonic::Status>| r.map(|_| ());
    vec![
        ("Vote", ok(raft.vote(msg(enc(&vote))).await)),
        ("TimeoutNow", ok(raft.timeout_now(msg(enc(&term))).await)),
        (
            "AppendEntries",
            ok(raft.append_entries(msg(enc(&append))).await),
        ),
        (
            "InstallSnapshot",
            ok(raft
                .install_snapshot(msg(vec![0xde, 0xad, 0xbe, 0xef]))
                .await),
        ),
        // The data groups' peer service is guarded alike (a data group's vote, named).
        (
            "Groups/Vote",
            ok(groups.vote(group_one(msg(enc(&vote)))).await),
        ),
    ]
}

/// `msg` naming data group 1.
fn group_one(msg: pb::RaftMessage) -> tonic::Request<pb::RaftMessage> {
    let mut request = tonic::Request::new(msg);
    let one = tonic::metadata::MetadataValue::from(1u16);
    request.metadata_mut().insert("x-timerdb-group", one);
    request
}

/// Waits until every running node sees the same leader and term (a start may take two
/// elections), then returns them.
pub(crate) async fn settled_leader_and_term(c: &TestCluster) -> (u64, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen = views(c);
        if seen[0].0.is_some() && seen.windows(2).all(|w| w[0] == w[1]) {
            return (seen[0].0.unwrap(), seen[0].1);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no settled leader: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (leader, term) as each running node sees them.
fn views(c: &TestCluster) -> Vec<(Option<u64>, u64)> {
    c.running()
        .iter()
        .map(|id| {
            let m = c.node(*id).raft.metrics().borrow_watched().clone();
            (m.current_leader, m.current_term)
        })
        .collect()
}

/// The leader and term every running node sees (asserting they agree).
fn leader_and_term(c: &TestCluster) -> (u64, u64) {
    let seen = views(c);
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    (seen[0].0.expect("a leader"), seen[0].1)
}

#[tokio::test]
async fn a_process_without_the_peer_certificate_cannot_move_the_cluster() {
    let pki = Arc::new(Pki::new());
    let p = pki.clone();
    let c = TestCluster::start_with(3, move |cfg| cfg.tls = Tls::new(p.files(true))).await;
    let (leader, term) = settled_leader_and_term(&c).await;
    let ca = pki.cluster.pem();
    let mut tried = 0;
    for node in c.running() {
        let addr = c.peers[&node].clone();
        // A client's certificate (valid for the client port): not a peer.
        let ch = tls_channel(&addr, &ca, Some(&pki.client)).await.unwrap();
        for (rpc, r) in peer_attack(ch, term).await {
            let e = r.expect_err(rpc);
            assert_eq!(e.code(), Code::Unauthenticated, "{rpc} on {node}: {e:?}");
            assert!(e.message().contains("members only"), "{rpc}: {e:?}");
            if node == leader {
                let what = format!("peer {rpc} with a client certificate, to the leader");
                harness::tried(&what, &status_text(&e));
            }
            tried += 1;
        }
        // A node certificate from another CA: the handshake refuses it.
        let forged = TestCa::new("forged cluster").named("localhost", &["127.0.0.1"]);
        match tls_channel(&addr, &ca, Some(&forged)).await {
            Ok(ch) => {
                for (rpc, r) in peer_attack(ch, term).await {
                    let e = r.expect_err("a forged cert got through");
                    if node == leader {
                        let what = format!("peer {rpc} with a forged node certificate");
                        harness::tried(&what, &status_text(&e));
                    }
                    tried += 1;
                }
            }
            Err(e) if node == leader => {
                harness::tried("a forged node certificate (another CA)", &e);
            }
            Err(_) => {}
        }
    }
    assert!(tried >= 12);
    // Well past an election timeout: nobody stepped down, no new term.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(leader_and_term(&c), (leader, term));
    harness::tried(
        "all of the above (a Vote at term + 1,000,000, a TimeoutNow)",
        &format!("leader {leader} and term {term} unchanged 2 s later"),
    );
    assert_eq!(c.node(leader).node.leader(), Leader::Me);
    c.shutdown().await;
}

/// Three nodes whose peers talk on their own port: (client addresses, nodes).
async fn start_split(pki: &Pki, dir: &Path) -> (BTreeMap<u64, String>, BTreeMap<u64, RunningNode>) {
    let mut clients = BTreeMap::new();
    let mut peers = BTreeMap::new();
    let mut listeners = BTreeMap::new();
    for id in 1..=3u64 {
        let cl = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pl = TcpListener::bind("127.0.0.1:0").await.unwrap();
        clients.insert(id, cl.local_addr().unwrap().to_string());
        peers.insert(id, pl.local_addr().unwrap().to_string());
        listeners.insert(id, (cl, pl));
    }
    let mut nodes = BTreeMap::new();
    for (id, (cl, pl)) in listeners {
        let mut cfg = NodeConfig::new(id, dir.join(format!("n{id}")), peers.clone());
        cfg.leader_wait = Duration::from_secs(10);
        let mut files = pki.files(true);
        files.peer_listen = Some(peers[&id].clone());
        files.peer_require_member = true;
        cfg.tls = Tls::new(files);
        nodes.insert(id, server::start_with(cfg, cl, Some(pl)).await.unwrap());
    }
    (clients, nodes)
}

#[tokio::test]
async fn with_a_peer_port_the_client_port_refuses_raft_even_to_a_member() {
    let pki = Pki::new();
    let dir = TempDir::new().unwrap();
    let (clients, nodes) = start_split(&pki, dir.path()).await;
    let leader = loop {
        if let Some((id, _)) = nodes.iter().find(|(_, n)| n.node.leader() == Leader::Me) {
            break *id;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let term = nodes[&leader].raft.metrics().borrow_watched().current_term;
    let ca = pki.cluster.pem();
    // On the client port: a member's own peer certificate is not even a client's (the
    // handshake refuses it), and a client's certificate does not reach Raft.
    let as_member = tls_channel(&clients[&follower], &ca, Some(&pki.node)).await;
    if let Ok(ch) = as_member {
        for (rpc, r) in peer_attack(ch, term).await {
            assert!(r.is_err(), "{rpc} on the client port with a peer cert");
        }
    }
    let ch = tls_channel(&clients[&follower], &ca, Some(&pki.client))
        .await
        .unwrap();
    for (rpc, r) in peer_attack(ch, term).await {
        let e = r.expect_err(rpc);
        assert_eq!(e.code(), Code::Unauthenticated, "{rpc}: {e:?}");
        assert!(e.message().contains("peer port only"), "{rpc}: {e:?}");
    }
    // Clients are served on the client port, and a follower forwards to the leader's peer
    // port with its peer identity.
    let ch = tls_channel(&clients[&follower], &ca, Some(&pki.client))
        .await
        .unwrap();
    let r = TimersClient::new(ch)
        .schedule(schedule_req("split", now_ms() + 60_000))
        .await
        .unwrap();
    assert!(r.into_inner().created);
    assert_eq!(
        nodes[&leader].raft.metrics().borrow_watched().current_term,
        term
    );
    for (_, n) in nodes {
        n.shutdown().await;
    }
}

#[tokio::test]
async fn certificates_rotate_under_load_without_losing_a_call() {
    let pki = Arc::new(Pki::new());
    let p = pki.clone();
    let c = TestCluster::start_with(3, move |cfg| cfg.tls = Tls::new(p.files(false))).await;
    let ca = pki.cluster.pem();
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for node in c.running() {
        let addr = c.peers[&node].clone();
        let (ca, stop, done, failed) = (ca.clone(), stop.clone(), done.clone(), failed.clone());
        load.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                // A new connection every 20 calls, so handshakes happen across the rotation.
                let ch = tls_channel(&addr, &ca, None).await.unwrap();
                let mut t = TimersClient::new(ch);
                for _ in 0..20 {
                    i += 1;
                    let req = schedule_req(&format!("rot-{node}-{i}"), now_ms() + 600_000);
                    match t.schedule(req).await {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("call failed: {e:?}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // New leaf certificates from the same CA, written over the old files, then reloaded (what
    // SIGHUP does); then a broken file, which must leave the new ones in use.
    let fresh = pki.cluster.named("localhost", &["127.0.0.1"]);
    fresh.write(pki.dir.path(), "node");
    for id in c.running() {
        c.node(id).node.config().tls.reload().unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(pki.path("node.key"), "not a key").unwrap();
    for id in c.running() {
        let e = c.node(id).node.config().tls.reload().unwrap_err();
        assert!(e.to_string().contains("--peer-key"), "{e}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let (done, failed) = (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("{done} calls across the rotation, {failed} failed");
    assert_eq!(failed, 0);
    assert!(done > 60, "only {done} calls");
    // A new handshake now sees the new certificate.
    let served = served_cert(&c.peers[&1], &ca).await;
    let want = {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateDer::from_pem_slice(fresh.cert_pem.as_bytes()).unwrap()
    };
    assert_eq!(served, want, "the old certificate is still served");
    c.shutdown().await;
}

/// The certificate `addr` presents in a new TLS handshake.
async fn served_cert(addr: &str, ca: &str) -> rustls_pki_types::CertificateDer<'static> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

/// Finding 12 of issue 33: 256 TCP connections that never send a ClientHello held every
/// handshake place for 10 s each, and a new client could not connect for as long as they were
/// held. Now a new connection takes the oldest handshake's place: clients are served through
/// 300 silent connections, renewed as fast as they are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_connections_do_not_lock_tls_clients_out() {
    let pki = Arc::new(Pki::new());
    let p = pki.clone();
    let c = TestCluster::start_with(3, move |cfg| cfg.tls = Tls::new(p.files(false))).await;
    let node = c.follower().await;
    let addr = c.peers[&node].clone();
    let ca = pki.cluster.pem();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let connected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // 300 silent connections, each opened again as soon as the node drops it.
    let mut holders = Vec::new();
    for _ in 0..300 {
        let (addr, stop, connected) = (addr.clone(), stop.clone(), connected.clone());
        holders.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                connected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut buf = [0u8; 64];
                // Says nothing; waits until the node closes it.
                let _ = tokio::time::timeout(
                    Duration::from_secs(30),
                    tokio::io::AsyncReadExt::read(&mut s, &mut buf),
                )
                .await;
            }
        }));
    }
    // Until all 300 are connected (the node then holds or has dropped every one).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while connected.load(std::sync::atomic::Ordering::Relaxed) < 300 {
        assert!(
            std::time::Instant::now() < deadline,
            "the silent connections were not made"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for round in 0..5 {
        let started = std::time::Instant::now();
        let served = tokio::time::timeout(Duration::from_secs(5), async {
            let ch = tls_channel(&addr, &ca, None).await?;
            answers(ch).await.map_err(|s| status_text(&s))
        })
        .await;
        assert!(
            matches!(served, Ok(Ok(()))),
            "round {round}: a TLS client was not served beside 300 silent connections: {served:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "round {round}: {:?}",
            started.elapsed()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in holders {
        h.abort();
    }
    c.shutdown().await;
}
