//! Real push receivers for the push tests: an HTTP server (hyper, on 127.0.0.1:0) and a gRPC
//! `timerdb.v1.Receiver` (tonic), both recording every request they get and answering as the
//! test tells them (a status per attempt, a hang, a delay), and counting how many requests they
//! hold at once. The HTTP one also counts the connections it accepted and can close them the
//! way real servers do (after every answer, or once idle for a while).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use timerdb::api::pb;
use tokio::net::TcpListener;

use crate::harness::now_ms;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Got {
    pub at_ms: i64,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Got {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
    pub fn id(&self) -> String {
        self.header("timerdb-id").to_string()
    }
    pub fn attempt(&self) -> u32 {
        self.header("timerdb-attempt").parse().unwrap()
    }
}

/// How the receiver answers a request for a timer, given its attempt.
pub type Behaviour = Arc<dyn Fn(&str, u32) -> Answer + Send + Sync>;

#[derive(Debug, Clone, Copy)]
pub enum Answer {
    Status(u16),
    /// This status with `Retry-After: <seconds>`.
    RetryAfter(u16, u64),
    /// Wait this long, then answer 200.
    Slow(Duration),
    /// Never answer.
    Hang,
}

/// How the HTTP receiver treats its connections.
#[derive(Debug, Clone, Copy, Default)]
pub enum Conns {
    /// Kept alive (hyper's default).
    #[default]
    KeepAlive,
    /// `connection: close` on every answer.
    CloseAfterEach,
    /// Closed by the receiver once idle this long (a keep-alive timeout, as nginx or Node have).
    CloseWhenIdle(Duration),
}

/// One request in progress at the receiver.
struct InProgress(Arc<AtomicUsize>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    pub got: Arc<Mutex<Vec<Got>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    now: Arc<AtomicUsize>,
    pub max_concurrent: Arc<AtomicUsize>,
    /// Connections accepted (HTTP).
    pub connections: Arc<AtomicUsize>,
    conns: Arc<Mutex<Conns>>,
    /// Answer successes with a body (`ok`), which a client must read to reuse the connection.
    success_body: Arc<AtomicBool>,
}

impl Receiver {
    pub fn set_conns(&self, c: Conns) {
        *self.conns.lock().unwrap() = c;
    }

    pub fn set_success_body(&self, on: bool) {
        self.success_body.store(on, Ordering::SeqCst);
    }

    pub fn set(&self, b: impl Fn(&str, u32) -> Answer + Send + Sync + 'static) {
        *self.behaviour.lock().unwrap() = Arc::new(b);
    }

    pub fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Records `g` and returns how to answer it, counting it as in progress until the guard
    /// drops (when the answer is sent, or when the handler is dropped because the caller went
    /// away: a leader that stopped leading abandons its requests).
    fn take(&self, g: Got) -> (Answer, InProgress) {
        let b = self.behaviour.lock().unwrap().clone();
        let answer = b(&g.id(), g.attempt());
        self.got.lock().unwrap().push(g);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_concurrent.fetch_max(now, Ordering::SeqCst);
        (answer, InProgress(self.now.clone()))
    }

    async fn answer(&self, (a, _in_progress): (Answer, InProgress)) -> u16 {
        match a {
            Answer::Status(s) | Answer::RetryAfter(s, _) => s,
            Answer::Slow(d) => {
                tokio::time::sleep(d).await;
                200
            }
            Answer::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                200
            }
        }
    }

    fn new(addr: SocketAddr) -> Receiver {
        Receiver {
            addr,
            got: Arc::default(),
            behaviour: Arc::new(Mutex::new(Arc::new(|_: &str, _: u32| Answer::Status(200)))),
            now: Arc::default(),
            max_concurrent: Arc::default(),
            connections: Arc::default(),
            conns: Arc::default(),
            success_body: Arc::default(),
        }
    }
}

/// An HTTP receiver answering 200 until told otherwise.
pub async fn http() -> Receiver {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = Receiver::new(listener.local_addr().unwrap());
    let server = r.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            server.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(server.clone(), stream));
        }
    });
    r
}

/// An HTTPS receiver (`https://localhost:PORT/hook`) presenting `tls`'s certificate, answering
/// 200 until told otherwise. A connection whose TLS handshake fails is counted and dropped.
pub async fn https(tls: std::sync::Arc<rustls::ServerConfig>) -> (Receiver, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = Receiver::new(listener.local_addr().unwrap());
    let refused = Arc::new(AtomicUsize::new(0));
    let (server, failed) = (r.clone(), refused.clone());
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            server.connections.fetch_add(1, Ordering::SeqCst);
            let (server, failed, acceptor) = (server.clone(), failed.clone(), acceptor.clone());
            tokio::spawn(async move {
                match acceptor.accept(stream).await {
                    Ok(tls) => serve(server, tls).await,
                    Err(_) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (r, refused)
}

/// Serves one connection as `r` is set to.
async fn serve<S>(r: Receiver, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mode = *r.conns.lock().unwrap();
    // When the connection last finished an answer, and how many it is working on.
    let activity = Arc::new(Mutex::new((std::time::Instant::now(), 0usize)));
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (r, act) = (r.clone(), act.clone());
        async move {
            act.lock().unwrap().1 += 1;
            let at_ms = now_ms();
            let headers = req
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                .collect();
            let body = req.into_body().collect().await?.to_bytes().to_vec();
            let a = r.take(Got {
                at_ms,
                headers,
                body,
            });
            let retry_after = match a.0 {
                Answer::RetryAfter(_, secs) => Some(secs),
                _ => None,
            };
            let code = r.answer(a).await;
            let body = if code >= 300 {
                format!("receiver says {code}")
            } else if r.success_body.load(Ordering::SeqCst) {
                "ok".to_string()
            } else {
                String::new()
            };
            let mut resp = hyper::Response::builder().status(code);
            if let Conns::CloseAfterEach = mode {
                resp = resp.header("connection", "close");
            }
            if let Some(secs) = retry_after {
                resp = resp.header("retry-after", secs.to_string());
            }
            {
                let mut a = act.lock().unwrap();
                *a = (std::time::Instant::now(), a.1 - 1);
            }
            Ok::<_, hyper::Error>(resp.body(Full::new(Bytes::from(body))).unwrap())
        }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, svc);
    tokio::pin!(conn);
    let Conns::CloseWhenIdle(idle) = mode else {
        let _ = conn.await;
        return;
    };
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep(idle / 4), if !closing => {
                let (since, busy) = *activity.lock().unwrap();
                if busy == 0 && since.elapsed() >= idle {
                    // Closes the connection at once when no request is being read or answered.
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

struct GrpcReceiver(Receiver);

#[tonic::async_trait]
impl pb::receiver_server::Receiver for GrpcReceiver {
    async fn receive(
        &self,
        request: tonic::Request<pb::Delivery>,
    ) -> Result<tonic::Response<pb::ReceiveResponse>, tonic::Status> {
        let mut headers: HashMap<String, String> = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.to_string(), v.to_str().unwrap_or("").to_string()))
                }
                _ => None,
            })
            .collect();
        let d = request.into_inner();
        let t = d.timer.unwrap_or_default();
        headers.insert("timerdb-id".into(), t.id.clone());
        headers.insert("timerdb-attempt".into(), d.attempt.to_string());
        let a = self.0.take(Got {
            at_ms: now_ms(),
            headers,
            body: t.payload,
        });
        match self.0.answer(a).await {
            200 => Ok(tonic::Response::new(pb::ReceiveResponse {})),
            _ => Err(tonic::Status::unavailable("receiver busy")),
        }
    }
}

/// A gRPC receiver answering OK until told otherwise (any non-200 status: UNAVAILABLE).
pub async fn grpc() -> Receiver {
    grpc_with(None).await
}

/// A gRPC receiver over TLS presenting `(cert_pem, key_pem)` (`grpcs://localhost:PORT`).
pub async fn grpcs(cert_pem: &str, key_pem: &str) -> Receiver {
    grpc_with(Some(tonic::transport::Identity::from_pem(
        cert_pem, key_pem,
    )))
    .await
}

async fn grpc_with(tls: Option<tonic::transport::Identity>) -> Receiver {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = Receiver::new(listener.local_addr().unwrap());
    let svc = pb::receiver_server::ReceiverServer::new(GrpcReceiver(r.clone()));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let mut server = tonic::transport::Server::builder();
    if let Some(identity) = tls {
        let config = tonic::transport::ServerTlsConfig::new().identity(identity);
        server = server.tls_config(config).unwrap();
    }
    tokio::spawn(server.add_service(svc).serve_with_incoming(incoming));
    r
}
