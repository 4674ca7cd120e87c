//! Real push receivers for the push tests: an HTTP server (hyper, on 127.0.0.1:0) and a gRPC
//! `timerdb.v1.Receiver` (tonic), both recording every request they get and answering as the
//! test tells them (a status per attempt, a hang, a delay), and counting how many requests they
//! hold at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Wait this long, then answer 200.
    Slow(Duration),
    /// Never answer.
    Hang,
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
}

impl Receiver {
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
            Answer::Status(s) => s,
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
            let r = server.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let r = r.clone();
                        async move {
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
                            let code = r.answer(a).await;
                            let body = if code >= 300 {
                                format!("receiver says {code}")
                            } else {
                                String::new()
                            };
                            Ok::<_, hyper::Error>(
                                hyper::Response::builder()
                                    .status(code)
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    r
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
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = Receiver::new(listener.local_addr().unwrap());
    let svc = pb::receiver_server::ReceiverServer::new(GrpcReceiver(r.clone()));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(incoming),
    );
    r
}
