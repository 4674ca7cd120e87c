//! The HTTP/JSON API over TLS with client certificates (mTLS), HTTP/1.1 negotiated by ALPN as
//! a curl or Python client does: a certificate user is the caller over HTTP exactly as over
//! gRPC, on every node, and a client without a certificate is refused at the handshake.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use tempfile::TempDir;
use timerdb::tls::{Tls, TlsFiles};

use crate::certs::{Pair, TestCa};
use crate::harness::TestCluster;

/// A TLS client configuration trusting `ca`, presenting `identity` if given, offering only
/// HTTP/1.1 by ALPN as `curl --http1.1` and most HTTP/1.1 libraries do.
fn https(ca: &str, identity: Option<&Pair>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(p) => {
            let certs = CertificateDer::pem_slice_iter(p.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(p.key_pem.as_bytes()).unwrap();
            b.with_client_auth_cert(certs, key).unwrap()
        }
        None => b.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// One HTTP/1.1 request over a new TLS connection.
async fn call(
    tls: &Arc<rustls::ClientConfig>,
    addr: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> Result<(u16, Value), String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut b = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let body = body
        .map(|v| serde_json::to_vec(&v).unwrap())
        .unwrap_or_default();
    let resp = sender
        .send_request(b.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .map_err(|e| crate::harness::error_chain(&e))?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_client_certificates_is_authorised_like_grpc() {
    let dir = TempDir::new().unwrap();
    let cluster_ca = TestCa::new("timerdb test cluster CA");
    let clients = TestCa::new("timerdb test client CA");
    let node = cluster_ca.named("localhost", &["127.0.0.1"]);
    let client = clients.named("billing-service", &[]);
    cluster_ca.write(dir.path(), "cluster-ca.crt");
    clients.write(dir.path(), "client-ca.crt");
    node.write(dir.path(), "node");
    let p = |n: &str| Some(dir.path().join(n));
    let files = TlsFiles {
        peer_ca: p("cluster-ca.crt"),
        peer_cert: p("node.crt"),
        peer_key: p("node.key"),
        cert: p("node.crt"),
        key: p("node.key"),
        client_ca: p("client-ca.crt"),
        ..Default::default()
    };
    let c = TestCluster::start_with(3, move |cfg| cfg.tls = Tls::new(files.clone())).await;
    let ca = cluster_ca.pem();
    let follower = c.follower().await;
    let addr = c.peers[&follower].clone();

    // No certificate: refused at the handshake, before any HTTP.
    let e = call(
        &https(&ca, None),
        &addr,
        "GET",
        "/v1/access/whoami",
        None,
        None,
    )
    .await;
    assert!(e.is_err(), "served without a client certificate: {e:?}");

    // With one: an admin key, the certificate's own key, then auth on.
    let with_cert = https(&ca, Some(&client));
    let key = json!({"name": "ops", "roles": ["admin"]});
    let (s, admin) = call(
        &with_cert,
        &addr,
        "POST",
        "/v1/access/keys",
        Some(key),
        None,
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{admin}");
    let admin = admin["token"].as_str().unwrap().to_string();
    let key = json!({"name": "billing", "roles": ["schedule:billing*", "read:billing*"],
                     "cert_name": "billing-service", "no_secret": true});
    let (s, v) = call(
        &with_cert,
        &addr,
        "POST",
        "/v1/access/keys",
        Some(key),
        None,
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{v}");
    let on = json!({"enabled": true});
    let (s, v) = call(
        &with_cert,
        &addr,
        "PUT",
        "/v1/access/auth",
        Some(on),
        Some(&admin),
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{v}");
    c.converged().await;

    // The certificate alone is the caller, on every node (followers forward it).
    for id in c.running() {
        let addr = &c.peers[&id];
        let timer = json!({"id": format!("cert-{id}"), "delay_ms": 60000, "payload": ""});
        let (s, v) = call(
            &with_cert,
            addr,
            "POST",
            "/v1/namespaces/billing-eu/timers",
            Some(timer.clone()),
            None,
        )
        .await
        .unwrap();
        assert_eq!(s, 200, "node {id}: {v}");
        let (s, v) = call(
            &with_cert,
            addr,
            "POST",
            "/v1/namespaces/orders/timers",
            Some(timer),
            None,
        )
        .await
        .unwrap();
        assert_eq!(s, 403, "node {id}: {v}");
        assert_eq!(v["error"]["status"], json!("PERMISSION_DENIED"));
        let (s, v) = call(&with_cert, addr, "GET", "/v1/access/whoami", None, None)
            .await
            .unwrap();
        assert_eq!(s, 200);
        assert!(v["principal"].as_str().unwrap().contains("billing"), "{v}");
    }
    c.shutdown().await;
}
