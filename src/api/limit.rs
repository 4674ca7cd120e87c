//! A node-wide bound on client requests in progress: one tower layer, outermost but for the
//! metrics, so a flood of clients gets RESOURCE_EXHAUSTED at once instead of queueing without
//! end in front of the handlers (and their memory).
//!
//! A request holds its slot until its answer begins (a stream's slot frees once it is open).
//! The peer `Raft` service and health checks are never refused here: a cluster flooded by
//! clients must still replicate and elect. Per connection, HTTP/2 bounds the streams
//! (`MAX_STREAMS_PER_CONNECTION` in `server.rs`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::Status;

/// Most client requests a node works on at once.
pub const MAX_REQUESTS_IN_PROGRESS: usize = 8192;

/// Wraps the server's services in [`Limit`].
#[derive(Clone)]
pub struct LimitLayer {
    slots: Arc<Semaphore>,
    max: usize,
}

impl LimitLayer {
    pub fn new(max: usize) -> Self {
        LimitLayer {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

impl<S> tower::Layer<S> for LimitLayer {
    type Service = Limit<S>;
    fn layer(&self, inner: S) -> Limit<S> {
        Limit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`LimitLayer`] makes.
#[derive(Clone)]
pub struct Limit<S> {
    inner: S,
    layer: LimitLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Whether `path` is exempt: peers and health checks.
fn exempt(path: &str) -> bool {
    path.starts_with("/timerdb.v1.Raft/") || path.starts_with("/grpc.health.v1.")
}

impl<S> tower::Service<http::Request<Body>> for Limit<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        if exempt(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        let Ok(permit) = self.layer.slots.clone().try_acquire_owned() else {
            let max = self.layer.max;
            let status = Status::resource_exhausted(format!(
                "this node is working on {max} requests already; retry shortly or elsewhere"
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        };
        Box::pin(async move {
            let resp = inner.call(req).await;
            drop(permit);
            resp
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn beyond_the_bound_a_client_call_is_refused_and_a_peer_call_is_not() {
        let (release, wait) = tokio::sync::watch::channel(false);
        let slow = tower::service_fn(move |_req: http::Request<Body>| {
            let mut wait = wait.clone();
            async move {
                let _ = wait.wait_for(|go| *go).await;
                Ok::<_, Infallible>(http::Response::new(Body::empty()))
            }
        });
        let mut svc = LimitLayer::new(2).layer(slow);
        let req = |path: &str| {
            http::Request::builder()
                .uri(path)
                .body(Body::empty())
                .unwrap()
        };
        let a = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"));
        let b = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"));
        let refused = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"))
            .await
            .unwrap();
        let s = Status::from_header_map(refused.headers()).unwrap();
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        let peer = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Raft/Vote"));
        release.send(true).unwrap();
        for f in [a, b, peer] {
            let r = f.await.unwrap();
            assert!(Status::from_header_map(r.headers()).is_none());
        }
        // The slots came back.
        let again = svc
            .ready()
            .await
            .unwrap()
            .call(req("/timerdb.v1.Timers/Get"));
        assert!(Status::from_header_map(again.await.unwrap().headers()).is_none());
    }
}
