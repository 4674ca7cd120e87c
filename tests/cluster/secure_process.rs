//! Process level with security on: three real `timerd` binaries with client TLS, peer mTLS
//! and auth (the break-glass token makes the first admin key, then keys only). SIGKILL the
//! leader under due timers: every timer fires, none early, through TLS and keys; SIGHUP
//! reloads the certificates of a running process; SIGTERM ends each cleanly.

use std::time::{Duration, Instant};

use tempfile::TempDir;
use timerdb::api::pb::{
    self, access_client::AccessClient, cluster_client::ClusterClient, timers_client::TimersClient,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Request;

use crate::certs::TestCa;
use crate::harness::{assert_not_early, now_ms, schedule_req};
use crate::process::{send_sigterm, start_three_with, wait_exit, Proc};

struct Client {
    ca: String,
}

impl Client {
    async fn channel(&self, addr: &str) -> Option<Channel> {
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
        Endpoint::from_shared(format!("https://{addr}"))
            .ok()?
            .tls_config(tls)
            .ok()?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .ok()
    }

    async fn status(&self, addr: &str, token: &str) -> Option<pb::StatusResponse> {
        let mut c = ClusterClient::new(self.channel(addr).await?);
        let r = c.status(with(pb::StatusRequest {}, token)).await.ok()?;
        Some(r.into_inner())
    }

    async fn leader(&self, procs: &[Proc], token: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for (i, p) in procs.iter().enumerate() {
                if p.child.is_some()
                    && (self.status(&p.addr, token).await).is_some_and(|s| s.role == "leader")
                {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no leader among the processes");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn with<T>(msg: T, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    let v = format!("Bearer {token}").parse().unwrap();
    r.metadata_mut().insert("authorization", v);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_and_keys_a_killed_leader_loses_no_timer() {
    crate::harness::init_tracing();
    let tmp = TempDir::new().unwrap();
    let ca = TestCa::new("process test cluster CA");
    let ca_path = ca.write(tmp.path(), "ca.crt");
    let (cert, key) = ca
        .named("localhost", &["127.0.0.1"])
        .write(tmp.path(), "node");
    let boot_path = tmp.path().join("bootstrap");
    let boot = "break-glass-process-test-token";
    std::fs::write(&boot_path, boot).unwrap();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let args = [
        "--tls-cert".to_string(),
        s(&cert),
        "--tls-key".into(),
        s(&key),
        "--peer-ca".into(),
        s(&ca_path),
        "--peer-cert".into(),
        s(&cert),
        "--peer-key".into(),
        s(&key),
        "--auth-bootstrap-token-file".into(),
        s(&boot_path),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut procs, _peers) = start_three_with(&tmp, &args);
    let client = Client { ca: ca.pem() };

    // Phase 1: the bootstrap token makes an admin key and switches auth on; an app key.
    let l = client.leader(&procs, boot).await;
    let f = (l + 1) % 3;
    let ch = client.channel(&procs[f].addr).await.unwrap();
    let mut access = AccessClient::new(ch.clone());
    let create = |name: &str, roles: &[&str]| pb::CreateKeyRequest {
        name: name.into(),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        ..Default::default()
    };
    let admin = access
        .create_key(with(create("ops", &["admin"]), boot))
        .await
        .unwrap()
        .into_inner()
        .token;
    let on = pb::SetAuthRequest { enabled: true };
    access.set_auth(with(on, &admin)).await.unwrap();
    let app = access
        .create_key(with(create("app", &["schedule:test", "read:test"]), &admin))
        .await
        .unwrap()
        .into_inner()
        .token;
    // Without a key: refused; over plain text: nothing answers.
    let mut t = TimersClient::new(ch.clone());
    let e = t.schedule(schedule_req("x", now_ms())).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(crate::process::status(&procs[f].addr).await.is_none());

    // Phase 2: 1,000 timers due over ~2 s through a follower, then SIGKILL the leader.
    let base = now_ms() + 800;
    let timers = (0..1000)
        .map(|i| schedule_req(&format!("s{i}"), base + i * 2))
        .collect();
    t.schedule_batch(with(pb::ScheduleBatchRequest { timers }, &app))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    procs[l].child.take().unwrap().kill().unwrap();
    let l2 = client.leader(&procs, &app).await;
    assert_ne!(l2, l);

    // Phase 3: every timer fires, none early (read with the app key through TLS).
    let deadline = Instant::now() + Duration::from_secs(30);
    let fired = loop {
        let list = pb::ListRequest {
            namespace: "test".into(),
            state: pb::TimerState::Fired as i32,
            limit: 10_000,
            ..Default::default()
        };
        let page = t
            .list(with(list, &app))
            .await
            .map(|r| r.into_inner().timers);
        // Read after the answer: every timer seen FIRED was due by then (by this clock).
        let seen_at = now_ms();
        if let Ok(timers) = page {
            assert_not_early(&timers, seen_at);
            if timers.len() == 1000 {
                break timers;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not every timer fired within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_not_early(&fired, now_ms());

    // Phase 4: SIGHUP reloads the certificates of a running process, which keeps serving.
    let survivor = procs[l2].child.as_ref().unwrap();
    let pid = survivor.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(client.status(&procs[l2].addr, &app).await.is_some());
    let log = std::fs::read_to_string(procs[l2].dir.join(format!("timerd-{}.log", l2 + 1)))
        .unwrap_or_default();
    assert!(
        log.contains("certificates reloaded"),
        "no reload in the log"
    );

    // Phase 5: SIGTERM, a clean exit for every running process.
    for p in procs.iter_mut() {
        if let Some(mut child) = p.child.take() {
            send_sigterm(&child);
            let outcome = wait_exit(&mut child, Duration::from_secs(15));
            assert!(matches!(outcome, Some(s) if s.success()), "{outcome:?}");
        }
    }
}
