//! Push over the wire on real clusters. Connections: the leader keeps its connections to a
//! receiver alive (one per lane, also when the receiver answers with a body), and a receiver
//! that closes connections (after each answer, or once they were idle for a while, as nginx or
//! Node do) costs no failed attempt: the request goes on a new connection. A receiver's
//! `Retry-After` holds the timer's next attempt back. `https://` and `grpcs://` receivers with
//! a private certificate are reached through the operator's `--push-ca`; one the CA did not
//! sign is refused. Without `--push-allow-private`, push refuses private destinations: at
//! PutNamespace, and on every connection (a target set while they were allowed).
//! (docs/push.md)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use timerdb::api::pb;

use crate::certs::TestCa;
use crate::delivery::{ids, schedule_many, wait_count};
use crate::harness::*;
use crate::push::{check_received, push_policy, put, SECRET_A};
use crate::receiver::{self, Answer, Conns};

/// Every timer of `ns` ACKED at its first attempt, with no failed attempt in its log.
async fn acked_first_time(c: &TestCluster, via: u64, ns: &str, n: usize) -> Vec<pb::Timer> {
    let acked = wait_count(
        c,
        via,
        ns,
        pb::TimerState::Acked,
        n,
        Duration::from_secs(30),
    )
    .await;
    for t in &acked {
        assert_eq!(
            t.attempts, 1,
            "{}: {} attempts: {:?}",
            t.id, t.attempts, t.attempt_log
        );
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn push_connections_are_kept_alive_and_replaced_when_the_receiver_closes_them() {
    let c = TestCluster::start(3).await;
    let via = c.follower().await;

    // Phase 1: a receiver that answers 200 with a body; the namespace allows 4 requests at
    // once. 400 timers go over at most 4 connections (plus one, should a connection end).
    let r = receiver::http().await;
    r.set_success_body(true);
    let mut policy = push_policy(&r.url(), 5);
    policy.max_concurrent_dispatches = Some(4);
    put(&c, via, "kept", policy).await;
    schedule_many(&c, via, "kept", &ids("k", 400), now_ms() + 300, 2).await;
    let acked = acked_first_time(&c, via, "kept", 400).await;
    check_received(&acked, &r.got(), &[SECRET_A]);
    let conns = r.connections.load(Ordering::SeqCst);
    assert!(conns <= 5, "400 requests took {conns} connections");

    // Phase 2: a receiver that closes every connection after its answer.
    let r = receiver::http().await;
    r.set_conns(Conns::CloseAfterEach);
    put(&c, via, "closing", push_policy(&r.url(), 5)).await;
    schedule_many(&c, via, "closing", &ids("c", 200), now_ms() + 300, 5).await;
    let acked = acked_first_time(&c, via, "closing", 200).await;
    check_received(&acked, &r.got(), &[SECRET_A]);
    assert_eq!(r.got().len(), 200, "each timer received once");
    assert!(r.connections.load(Ordering::SeqCst) >= 200);

    // Phase 3: a receiver that closes connections idle for 100 ms; timers come due 250 ms
    // apart, so each request finds the connection of the one before closed.
    let r = receiver::http().await;
    r.set_conns(Conns::CloseWhenIdle(Duration::from_millis(100)));
    put(&c, via, "idle", push_policy(&r.url(), 5)).await;
    schedule_many(&c, via, "idle", &ids("i", 20), now_ms() + 300, 250).await;
    let acked = acked_first_time(&c, via, "idle", 20).await;
    check_received(&acked, &r.got(), &[SECRET_A]);
    assert_eq!(r.got().len(), 20, "each timer received once");
    let conns = r.connections.load(Ordering::SeqCst);
    assert!(
        conns >= 15,
        "idle connections were not closed ({conns} for 20 requests)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receivers_retry_after_holds_the_next_attempt_back() {
    let c = TestCluster::start(3).await;
    let via = c.follower().await;
    // Backoff 200 ms; the receiver answers the first attempt 429 with Retry-After: 2, then 200.
    let r = receiver::http().await;
    r.set(|_, attempt| match attempt {
        1 => Answer::RetryAfter(429, 2),
        _ => Answer::Status(200),
    });
    let mut policy = push_policy(&r.url(), 5);
    policy.ack_timeout_ms = 5_000;
    put(&c, via, "later", policy).await;
    schedule_many(&c, via, "later", &ids("l", 5), now_ms() + 300, 0).await;
    let acked = wait_count(
        &c,
        via,
        "later",
        pb::TimerState::Acked,
        5,
        Duration::from_secs(30),
    )
    .await;
    let got = r.got();
    for t in &acked {
        let seen: Vec<_> = got.iter().filter(|g| g.id() == t.id).collect();
        assert_eq!(seen.len(), 2, "{}: {} requests", t.id, seen.len());
        let waited = seen[1].at_ms - seen[0].at_ms;
        assert!(
            waited >= 2_000,
            "{}: attempt 2 came {waited} ms after a Retry-After of 2 s",
            t.id
        );
        assert_eq!(t.attempt_log[0].http_status, 429, "{:?}", t.attempt_log);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn https_receivers_with_a_private_ca_are_trusted_through_push_ca() {
    let ca = TestCa::new("receivers' CA");
    let dir = tempfile::TempDir::new().unwrap();
    let ca_file = ca.write(dir.path(), "ca.pem");
    let c = TestCluster::start_with(3, move |cfg| cfg.push_ca = Some(ca_file.clone())).await;
    let via = c.follower().await;

    // Phase 1: a receiver whose certificate the CA signed: every timer over real TLS, signed.
    let pair = ca.server(&["localhost", "127.0.0.1"]);
    let (r, refused) = receiver::https(pair.server_config()).await;
    let url = format!("https://localhost:{}/hook", r.addr.port());
    put(&c, via, "tls", push_policy(&url, 5)).await;
    schedule_many(&c, via, "tls", &ids("t", 100), now_ms() + 300, 5).await;
    let acked = acked_first_time(&c, via, "tls", 100).await;
    check_received(&acked, &r.got(), &[SECRET_A]);
    assert_eq!(refused.load(Ordering::SeqCst), 0);

    // Phase 2: one whose certificate another CA signed: the handshake fails, every attempt is a
    // connection error naming the certificate, and nothing reaches the receiver.
    let stranger = TestCa::new("someone else's CA").server(&["localhost"]);
    let (r, refused) = receiver::https(stranger.server_config()).await;
    let url = format!("https://localhost:{}/hook", r.addr.port());
    put(&c, via, "untrusted", push_policy(&url, 2)).await;
    schedule_many(&c, via, "untrusted", &ids("u", 3), now_ms() + 300, 5).await;
    let dead = wait_count(
        &c,
        via,
        "untrusted",
        pb::TimerState::Dead,
        3,
        Duration::from_secs(30),
    )
    .await;
    for t in &dead {
        for a in &t.attempt_log {
            assert_eq!(a.outcome, "connection_error", "{:?}", t.attempt_log);
            assert!(a.detail.contains("certificate"), "{:?}", a.detail);
        }
    }
    assert!(r.got().is_empty());
    assert!(
        refused.load(Ordering::SeqCst) >= 6,
        "handshakes refused: {refused:?}"
    );

    // Phase 3: a gRPC receiver over TLS with a certificate of the private CA.
    let r = receiver::grpcs(&pair.cert_pem, &pair.key_pem).await;
    let url = format!("grpcs://localhost:{}", r.addr.port());
    put(&c, via, "grpcs", push_policy(&url, 5)).await;
    schedule_many(&c, via, "grpcs", &ids("g", 50), now_ms() + 300, 5).await;
    acked_first_time(&c, via, "grpcs", 50).await;
    assert_eq!(r.got().len(), 50);
}

#[tokio::test]
async fn push_refuses_private_addresses_unless_allowed() {
    let allow = Arc::new(AtomicBool::new(true));
    let a = allow.clone();
    let mut c = TestCluster::start_with(3, move |cfg| {
        cfg.push_allow_private = a.load(Ordering::SeqCst)
    })
    .await;
    let r = receiver::http().await;
    let leader = c.leader().await;
    // Allowed while the nodes run with --push-allow-private.
    put(&c, leader, "guarded", push_policy(&r.url(), 1_000)).await;

    // An operator turns the guard on: every node restarts without --push-allow-private.
    allow.store(false, Ordering::SeqCst);
    for id in c.running() {
        c.stop(id).await;
        c.restart(id).await;
    }
    let via = c.follower().await;
    // PutNamespace refuses a private target at once, saying how to allow it.
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "grpc://[::1]:9",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/hook",
        "http://[::ffff:127.0.0.1]:9/hook",
    ] {
        let e = c
            .namespaces(via)
            .await
            .put_namespace(pb::PutNamespaceRequest {
                name: "elsewhere".into(),
                policy: Some(push_policy(url, 5)),
            })
            .await
            .expect_err(url);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{url}: {e:?}");
        assert!(e.message().contains("--push-allow-private"), "{e:?}");
        tried(&format!("PutNamespace pushing to {url}"), &status_text(&e));
    }
    // The namespace set before still names the loopback receiver: the guard refuses each
    // connection, the receiver hears nothing, and the attempt log says why.
    let mut req = schedule_req("g1", now_ms());
    req.namespace = "guarded".into();
    c.client(via).await.schedule(req).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let t = c
            .client(via)
            .await
            .get(pb::GetRequest {
                namespace: "guarded".into(),
                id: "g1".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .timer
            .unwrap();
        // An attempt in progress shows as "in_flight" until its outcome is recorded.
        if let Some(a) = t.attempt_log.first().filter(|a| a.outcome != "in_flight") {
            break a.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no attempt: {t:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(refused.outcome, "connection_error", "{refused:?}");
    assert!(
        refused.detail.contains("--push-allow-private"),
        "{refused:?}"
    );
    tried(
        "push to a loopback receiver set before the guard",
        &refused.detail,
    );
    assert!(r.got().is_empty(), "the receiver was reached");
    c.shutdown().await;
}
