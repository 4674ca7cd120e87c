//! Bytes that are not what they claim, sent to every RPC of every service (listed from server
//! reflection, the peer `Raft` service included, on a cluster without peer TLS so they reach
//! its decoder): garbage messages, truncated ones, ones claiming more than the limit, a
//! message with a length prefix claiming a terabyte inside. Each gets a gRPC status with a
//! message; afterwards every node is alive and serving and memory stayed bounded.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use timerdb::api::pb;
use tonic::{Code, Status};

use crate::harness::{tried, TestCluster};

/// Sends one HTTP/2 gRPC request with `body` as it is; the status it got.
async fn raw(addr: &str, path: &str, body: Vec<u8>) -> Result<Status, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(10), send.send_request(req))
        .await
        .map_err(|_| "no answer in 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    if let Some(s) = Status::from_header_map(resp.headers()) {
        return Ok(s);
    }
    let body = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        resp.into_body().collect(),
    )
    .await
    .map_err(|_| "no end in 10 s".to_string())?
    .map_err(|e| e.to_string())?;
    let trailers = body.trailers().cloned().unwrap_or_default();
    Status::from_header_map(&trailers).ok_or_else(|| "no grpc-status".to_string())
}

fn frame(len: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test]
async fn garbage_truncated_and_oversized_bodies_get_a_status_on_every_rpc() {
    let c = TestCluster::start(3).await;
    let methods = crate::auth::reflected_methods(&c, 1).await;
    assert!(methods.len() >= 30);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    // A RaftMessage holding an InstallSnapshot whose snapshot id's length prefix claims 2^40
    // bytes (a real request, encoded, with the id's prefix swapped for the claim).
    let terabyte = {
        let marker = "marker-marker-marker";
        use openraft_legacy::network_v1::{InstallSnapshotRequest, SnapshotMeta};
        let req = InstallSnapshotRequest::<timerdb::raft_types::TypeConfig> {
            vote: openraft::Vote::new_committed(1, 1),
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
                snapshot_id: marker.into(),
            },
            offset: 0,
            data: vec![1, 2, 3],
            done: false,
        };
        let bytes = timerdb::storage::encode(&req);
        let mut id = vec![marker.len() as u8];
        id.extend_from_slice(marker.as_bytes());
        let at = bytes
            .windows(id.len())
            .position(|w| w == id)
            .expect("the id in the encoding");
        let mut claim = bytes[..at].to_vec();
        claim.push(253);
        claim.extend_from_slice(&(1u64 << 40).to_le_bytes());
        prost::Message::encode_to_vec(&pb::RaftMessage { data: claim })
    };
    let before = rss();
    let mut answered = 0;
    // (kind of body, peer or client RPC) → code → (how many, the first message).
    let mut seen = std::collections::BTreeMap::new();
    for path in &methods {
        let leader = c.leader().await;
        for node in [leader, c.follower().await] {
            let addr = c.peers[&node].clone();
            let garbage = noise(3000);
            let bodies: Vec<(&str, Vec<u8>)> = vec![
                ("garbage message", frame(garbage.len() as u32, &garbage)),
                ("unframed noise", noise(64)),
                ("truncated", frame(1000, &noise(10))),
                ("oversized claim", frame(u32::MAX, &noise(100))),
                ("a terabyte inside", frame(terabyte.len() as u32, &terabyte)),
                ("empty body", Vec::new()),
            ];
            for (what, body) in bodies {
                let status = raw(&addr, path, body)
                    .await
                    .unwrap_or_else(|e| panic!("{path} on {node}, {what}: {e}"));
                // An empty message is valid protobuf: some RPCs may serve it.
                if status.code() != Code::Ok {
                    answered += 1;
                }
                assert!(
                    status.code() == Code::Ok || !status.message().is_empty(),
                    "{path} on {node}, {what}: {status:?} says nothing"
                );
                let service = path.rsplit_once('/').map_or("", |(s, _)| s);
                let service = if service.ends_with("Raft") || service.ends_with("Groups") {
                    "peer"
                } else {
                    "client"
                };
                seen.entry((what, service))
                    .or_insert_with(std::collections::BTreeMap::new)
                    .entry(format!("{:?}", status.code()))
                    .or_insert_with(|| (0, status.message().to_string()))
                    .0 += 1;
                // tonic's reflection service ends its stream quietly (OK) on a message it
                // cannot decode; the terabyte claim is valid protobuf (an unknown field) to
                // every message but the peers' RaftMessage. Everything else must be refused.
                let may_pass = path.starts_with("/grpc.reflection.")
                    || (what == "a terabyte inside"
                        && !path.starts_with("/timerdb.v1.Raft/")
                        && !path.starts_with("/timerdb.v1.Groups/"));
                if !may_pass {
                    assert_ne!(
                        status.code(),
                        Code::Ok,
                        "{path} on {node}: {what} was accepted"
                    );
                }
            }
        }
        // Every node still serves (a panic would have dropped the connection, an abort the
        // process).
        for node in c.running() {
            let mut cl = c.cluster(node).await;
            cl.status(pb::StatusRequest {}).await.unwrap();
        }
    }
    for ((what, service), codes) in &seen {
        for (code, (n, message)) in codes {
            let attack = format!("{what} to every {service} RPC");
            tried(&attack, &format!("{n}× {code}, e.g. {message}"));
        }
    }
    let grown = rss().saturating_sub(before);
    println!(
        "{answered} bad requests answered; RSS grew {} MiB",
        grown >> 20
    );
    assert!(answered >= methods.len() * 2 * 4);
    assert!(grown < 1 << 30, "memory grew by {} MiB", grown >> 20);
    c.shutdown().await;
}
